"""Random allocation over t = 2 steps: the epoch's exact pair (docs/MATH.md 13.13).

The pair (N(e1) + N(e2)) / 2 against N(0) factorises into a Gaussian pair and the symmetric mixture
(N(b) + N(-b)) / 2 against N(0).  Pinned here against independent truths: mpmath closed forms of the
mixture's loss law, the 1-D mpmath quadrature of the whole epoch (robust_truths.allocation_delta,
which never forms the mixture pair), and a Monte Carlo of the 2-D release with a Hoeffding band.
"""
from __future__ import annotations

import functools
import math

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib.methods.prv import PRVAccountant
from pldlib.profiles.base import value_error
from pldlib.profiles.mixtures import SymmetricGaussianMixtureProfile
from pldlib.sampling.allocation import two_step_epoch_pieces
from pldlib.testing import robust_truths as T

#: one xdist worker for the module (make test: --dist loadgroup): its tests share the cached quadrature
#: truths (:func:`_truth`), computed once instead of once per worker
pytestmark = pytest.mark.xdist_group("test_allocation_two_steps")


@functools.lru_cache(maxsize=None)
def _direction_truth(sigma, eps, direction):
    return T.allocation_delta(sigma, 2, eps, direction)


def _truth(sigma, eps, relation):
    """T.allocation_delta(sigma, 2, eps, relation) (an mpmath interval (lo, hi)), each direction's
    quadrature computed once for the module: add_remove is the larger of the add and remove truths,
    end by end, exactly as robust_truths forms it, so the PLD tests of the three relations and the
    PRV tests at the same (sigma, eps) share two quadratures instead of running up to seven."""
    if relation == "add_remove":
        r, a = _direction_truth(sigma, eps, "remove"), _direction_truth(sigma, eps, "add")
        return (max(r[0], a[0]), max(r[1], a[1]))
    return _direction_truth(sigma, eps, relation)


def _mp_values(b, eps):
    """(sf_p, cdf_p, sf_q, cdf_q) of the mixture pair at the double eps, 50 digits."""
    with mp.workdps(50):
        b, e = mp.mpf(b), mp.mpf(eps)
        u = e + b * b / 2
        z = mp.acosh(mp.exp(u)) / b if u > 0 else mp.mpf(0)
        return (mp.ncdf(b - z) + mp.ncdf(-b - z), mp.ncdf(z - b) - mp.ncdf(-z - b),
                mp.erfc(z / mp.sqrt(2)), mp.erf(z / mp.sqrt(2)))


@pytest.mark.parametrize("b", [1e-6, 1e-3, 0.05, 0.3, 1 / math.sqrt(2), 2.5, 7.0, 20.0, 35.0])
def test_mixture_profile_values_against_mpmath(b):
    p = SymmetricGaussianMixtureProfile(b)
    lo, hi = p.eps_bounds(1e-14)
    m = -0.5 * b * b
    pts = list(np.linspace(lo, hi, 41)) + [m - 1.0, m, float(np.nextafter(m, 1.0)), m + 1e-15 * b * b,
                                           m + 1e-9 * b * b, m + 1e-3 * b * b]
    for eps in pts:
        got = (p.sf_p(eps), p.cdf_p(eps), p.sf_q(eps), p.cdf_q(eps))
        for g, t in zip(got, _mp_values(b, eps)):
            t = float(t)
            assert abs(g - t) <= value_error(t), (b, eps, g, t)


def test_mixture_profile_vectorised_and_tails():
    p = SymmetricGaussianMixtureProfile(0.8)
    eps = np.array([-np.inf, -5.0, -0.32, 0.0, 0.5, 3.0, np.inf])
    sf = p.sf_p(eps)
    assert sf.shape == eps.shape and sf[0] == 1.0 and sf[-1] == 0.0
    assert np.all(np.diff(sf) <= 0) and np.all(np.diff(p.sf_q(eps)) <= 0)
    np.testing.assert_allclose(p.sf_p(eps) + p.cdf_p(eps), 1.0, rtol=0, atol=4e-16)
    np.testing.assert_allclose(p.sf_q(eps) + p.cdf_q(eps), 1.0, rtol=0, atol=4e-16)
    assert p.sf_p(0.5) == pytest.approx(float(_mp_values(0.8, 0.5)[0]), rel=1e-14)


@pytest.mark.parametrize("b", [1e-3, 0.3, 2.0, 20.0])
@pytest.mark.parametrize("tail", [1e-6, 1e-14])
def test_mixture_eps_bounds_hold_their_tails(b, tail):
    lo, hi = SymmetricGaussianMixtureProfile(b).eps_bounds(tail)
    assert float(_mp_values(b, lo)[1]) <= tail  # P(L <= lo)
    assert float(_mp_values(b, hi)[0]) <= tail  # P(L > hi)
    assert lo >= -0.5 * b * b * (1 + 1e-15)


def test_mixture_profile_refuses_bad_shifts():
    for b in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="b"):
            SymmetricGaussianMixtureProfile(b)
    with pytest.raises(pldlib.PrecisionLimitError):
        SymmetricGaussianMixtureProfile(60.0)  # loss b^2/2 = 1800 beyond floating point


def test_pieces_only_where_exact():
    g = E.GaussianEvent(1.0)
    assert two_step_epoch_pieces(g, 0.5, "remove") is not None
    assert two_step_epoch_pieces(g, 0.5, "add_remove") is not None
    assert two_step_epoch_pieces(g, 1 / 3, "remove") is None
    assert two_step_epoch_pieces(g, 0.5, "substitution") is None
    assert two_step_epoch_pieces(E.LaplaceEvent(1.0), 0.5, "remove") is None


def _alloc(sigma, scheme="random_allocation"):
    return E.Sampled(E.GaussianEvent(sigma), 0.5, scheme)


CASES = [(0.4, 0.5), (0.7, 2.0), (1.0, 0.1), (1.0, 3.0), (2.0, 1.0), (3.0, 0.2)]


@pytest.mark.parametrize("relation", ["add", "remove", "add_remove"])
@pytest.mark.parametrize("sigma,eps", CASES)
def test_pld_one_epoch_against_quadrature(sigma, eps, relation):
    """The certified PLD interval holds the 1-D quadrature of the whole epoch and is narrow (the old
    bounds, amplified lattice above and dominated lattice below, were apart by 10% or more)."""
    iv = pldlib.PLDAccountant(relation).compose(_alloc(sigma), 2).delta(eps)
    lo_t, hi_t = (float(v) for v in _truth(sigma, eps, relation))
    assert iv.lower <= hi_t * (1 + 1e-12) and iv.upper >= lo_t * (1 - 1e-12)
    assert iv.upper - iv.lower <= 0.01 * lo_t


@pytest.mark.parametrize("relation", ["remove", "add_remove"])
def test_prv_one_epoch_against_quadrature(relation):
    for sigma, eps in CASES[1:4]:
        iv = PRVAccountant(relation).compose(_alloc(sigma), 2).delta(eps)
        lo_t, hi_t = (float(v) for v in _truth(sigma, eps, relation))  # (the PLD tests' truths)
        assert iv.lower <= hi_t * (1 + 1e-12) and iv.upper >= lo_t * (1 - 1e-12)
        assert iv.upper - iv.lower <= 0.02 * lo_t


def test_epsilon_answers_bracket_the_truth():
    sigma, delta = 0.9, 1e-5
    iv = pldlib.PLDAccountant("add_remove").compose(_alloc(sigma), 2).epsilon(delta)
    d_lo = float(T.allocation_delta(sigma, 2, iv.lower, "add_remove")[0])
    d_up = float(T.allocation_delta(sigma, 2, iv.upper, "add_remove")[1])
    assert d_lo >= delta >= d_up
    assert iv.upper - iv.lower <= 0.01 * iv.upper


def _mc_delta(sigma, epochs, eps, n, rng, direction):
    """Monte Carlo of E[(1 - e^{eps - L})_+] under P (remove) or of E[(1 - e^{eps + L})_+] under Q
    (add: the reversed pair's loss is -L under Q) for ``epochs`` epochs of the 2-D release, with a
    Hoeffding half-width at 1 - 1e-6 (the summand lies in [0, 1])."""
    s2 = sigma * sigma
    tot = np.zeros(n)
    for _ in range(epochs):
        y = rng.normal(0.0, sigma, size=(n, 2))
        if direction == "remove":
            y[np.arange(n), rng.integers(0, 2, size=n)] += 1.0
        # L(y) = ln((e^{(2 y1 - 1)/2s^2} + e^{(2 y2 - 1)/2s^2}) / 2)
        tot += np.logaddexp((2 * y[:, 0] - 1) / (2 * s2), (2 * y[:, 1] - 1) / (2 * s2)) - math.log(2.0)
    loss = tot if direction == "remove" else -tot
    with np.errstate(over="ignore"):
        v = np.clip(1.0 - np.exp(eps - loss), 0.0, 1.0)
    return v.mean(), math.sqrt(math.log(2 / 1e-6) / (2 * n))


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_three_epochs_against_monte_carlo(direction):
    """Three epochs of the 2-D release sampled directly (no factorisation): the mean lies within its
    Hoeffding band of the certified interval of both accountants."""
    rng = np.random.default_rng(20261129)
    sigma, eps = 1.1, 0.6
    m, hw = _mc_delta(sigma, 3, eps, 400_000, rng, direction)
    for acc in (pldlib.PLDAccountant(direction), PRVAccountant(direction)):
        iv = acc.compose(_alloc(sigma), 6).delta(eps)
        assert iv.lower - hw <= m <= iv.upper + hw
        assert iv.upper - iv.lower <= 0.01 * iv.upper


def test_shuffle_keeps_its_unamplified_upper_and_gains_the_exact_lower():
    sigma, eps = 1.0, 1.0
    sh = pldlib.PLDAccountant("remove").compose(_alloc(sigma, "shuffle"), 2).delta(eps)
    ra = pldlib.PLDAccountant("remove").compose(_alloc(sigma), 2).delta(eps)
    gauss = pldlib.PLDAccountant("remove").compose(E.GaussianEvent(sigma), 1).delta(eps)
    truth = float(T.allocation_delta(sigma, 2, eps, "remove")[0])
    assert 0.99 * truth <= sh.lower <= truth * (1 + 1e-12)  # the zero dataset's epoch (MATH 13.4)
    assert ra.lower <= truth * (1 + 1e-12) <= ra.upper * (1 + 2e-12)
    assert sh.upper >= gauss.lower  # no amplification above


def test_many_epochs_tighter_than_before_and_consistent():
    """100 epochs: the interval is narrow and lies inside the unamplified / epoch-sum bounds."""
    sigma, delta = 2.0, 1e-6
    iv = pldlib.PLDAccountant("add_remove").compose(_alloc(sigma), 200).epsilon(delta)
    up = pldlib.PLDAccountant("add_remove").compose(E.GaussianEvent(sigma), 100).epsilon(delta)
    lo = pldlib.PLDAccountant("add_remove").compose(E.GaussianEvent(sigma * math.sqrt(2)), 100).epsilon(delta)
    assert lo.lower <= iv.lower <= iv.upper <= up.upper
    assert iv.upper - iv.lower <= 0.01 * iv.upper


@pytest.mark.parametrize("sigma,relation,eps", [(0.78, "add", 7.05), (3.5, "remove", 2.56)])
def test_tiny_deltas_are_sharpened(sigma, relation, eps):
    """Deltas of 1e-13 and 1e-31: the exact pairs are sharpened on finer grids like any analytic
    pair (the lattice bounds of larger t are not), to well under 1% of the quadrature's value."""
    iv = pldlib.PLDAccountant(relation).compose(_alloc(sigma), 2).delta(eps)
    lo_t, hi_t = (float(v) for v in T.allocation_delta(sigma, 2, eps, relation))
    assert lo_t < 1e-12
    assert iv.lower <= hi_t * (1 + 1e-12) and iv.upper >= lo_t * (1 - 1e-12)
    assert iv.upper - iv.lower <= 0.005 * lo_t
