"""Truncated Poisson batches (TruncatedPoissonGaussianEvent; dp_accounting's
TruncatedSubsampledGaussianDpEvent): the dominating pair of docs/MATH.md 2.6.

Independent reference: the exact hockey-stick curve of one step on the scalar data set x = +1, the
other n - 1 records -1 (every batch sum is an integer in [-B, 1]: both output laws are finite
mixtures of Gaussians, integrated numerically on a fine grid), in both directions; a certified
upper bound over all data sets must lie above it.  Also: no truncation possible (t = 0) is the
Poisson subsampled Gaussian exactly, and dp_accounting's value beside ours.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import pldlib
from pldlib import GaussianEvent, PLDAccountant, Sampled
from pldlib.events import TruncatedPoissonGaussianEvent


def _exact(sigma, q, n, B, eps):
    """(remove, add) delta(eps) of one step on the scalar data set (module docstring)."""
    S = np.arange(-B, 2)
    with_x, without = np.zeros(S.size), np.zeros(S.size)
    for m, w in zip(range(n), stats.binom.pmf(np.arange(n), n - 1, q)):
        base = -min(m, B) + B  # index of the others' (cut) sum
        without[base] += w
        with_x[base] += w * (1 - q)
        if m <= B - 1:
            with_x[1 - m + B] += w * q  # x joins an uncut batch
        else:
            keep = B / (m + 1)
            with_x[2 - B + B] += w * q * keep  # x kept, B - 1 others
            with_x[0] += w * q * (1 - keep)  # x cut: B others
    y = np.linspace(-B - 14 * sigma, 1 + 14 * sigma, 600_001)
    pdf = stats.norm.pdf(y[None, :], S[:, None], sigma)
    p, r = with_x @ pdf, without @ pdf
    rem = np.array([np.trapezoid(np.maximum(p - math.exp(e) * r, 0.0), y) for e in eps])
    add = np.array([np.trapezoid(np.maximum(r - math.exp(e) * p, 0.0), y) for e in eps])
    return rem, add


@pytest.mark.parametrize("sigma,q,n,B", [(1.0, 0.1, 50, 5), (0.8, 0.3, 20, 4), (2.0, 0.5, 10, 3),
                                         (1.0, 0.05, 200, 8), (0.5, 0.5, 6, 2)])
def test_one_step_lies_above_the_exact_curve_of_a_data_set(sigma, q, n, B):
    ev = TruncatedPoissonGaussianEvent(sigma, q, n, B)
    assert ev.truncation_probability > 0.5  # (the cut case matters in every shape here)
    eps = np.array([-0.5, 0.0, 0.25, 0.5, 1.0, 2.0])
    rem, add = _exact(sigma, q, n, B, eps)
    for relation, truth in (("remove", rem), ("add", add)):
        iv = PLDAccountant(relation).compose(ev, 1).delta(eps)
        assert np.all(iv.upper >= truth - 1e-9), (relation, iv.upper, truth)
    both = PLDAccountant("add_remove").compose(ev, 1).delta(eps)
    assert np.all(both.upper >= np.maximum(rem, add) - 1e-9)


def test_no_cut_possible_is_the_poisson_gaussian_exactly():
    ref = PLDAccountant().compose(Sampled(GaussianEvent(1.0), 0.01), 1000).epsilon(1e-5)
    never = TruncatedPoissonGaussianEvent(1.0, 0.01, 10_000, 10_000)  # (a batch never exceeds the data)
    assert never.truncation_probability == 0.0
    ours = PLDAccountant().compose(never, 1000).epsilon(1e-5)
    assert (ours.lower, ours.upper) == (ref.lower, ref.upper)
    # a cut of probability < 1e-100: the same answer up to the grid it is read on
    rare = TruncatedPoissonGaussianEvent(1.0, 0.01, 10_000, 400)
    assert 0.0 < rare.truncation_probability < 1e-100
    iv = PLDAccountant().compose(rare, 1000).epsilon(1e-5)
    assert iv.lower <= ref.upper and ref.lower <= iv.upper and iv.upper == pytest.approx(ref.upper, rel=1e-4)


def test_a_cut_costs_privacy_and_dp_accounting_beside_it():
    from dp_accounting import dp_event as D
    from dp_accounting.pld import pld_privacy_accountant as P

    from pldlib.interop.dp_accounting import PldlibAccountant

    ev = D.TruncatedSubsampledGaussianDpEvent(10_000, 0.01, 120, 1.0)
    ours = PldlibAccountant()
    ours.compose(ev, 1000)
    iv = ours.epsilon_interval(1e-5)
    plain = PLDAccountant().compose(Sampled(GaussianEvent(1.0), 0.01), 1000).epsilon(1e-5)
    assert iv.lower > plain.upper  # (the cut batches are worse than Poisson's: a real cost)
    theirs = P.PLDAccountant()
    theirs.compose(ev, 1000)
    assert abs(iv.upper / theirs.get_epsilon(1e-5) - 1) < 0.05
    with pytest.raises(Exception, match="ADD_OR_REMOVE_ONE only"):
        PldlibAccountant(pldlib.interop.dp_accounting.NR.REPLACE_ONE).compose(ev)
    assert PldlibAccountant().compose(D.TruncatedSubsampledGaussianDpEvent(10_000, 0.01, 120, 0.0)) \
        .get_epsilon(1e-5) == math.inf


def test_bad_arguments_and_substitution():
    for kw, name in [({"sigma": 0.0}, "sigma"), ({"q": 1.5}, "q"), ({"dataset_size": 0}, "dataset_size"),
                     ({"batch_size": 2.5}, "batch_size")]:
        with pytest.raises((TypeError, ValueError), match=name):
            TruncatedPoissonGaussianEvent(**{"sigma": 1.0, "q": 0.1, "dataset_size": 100, "batch_size": 5, **kw})
    with pytest.raises(pldlib.UnsupportedEventError, match="substitution"):
        PLDAccountant("substitution").compose(TruncatedPoissonGaussianEvent(1.0, 0.1, 100, 5), 1).epsilon(1e-5)
