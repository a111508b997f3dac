"""The discrete Laplace mechanism, added through the seams (event, profile module, sugar).

Truths are brute-force sums over the integers (|x| <= 150 at scale 2: the
neglected tail is below 1e-30), independent of the clamped finite pairs the
library builds.
"""
import math

import numpy as np
import pytest

import pldlib
from pldlib import DiscreteLaplace, DiscreteLaplaceEvent, PLDAccountant, Sampled

T, N = 2.0, 150
X = np.arange(-N, N + 1)


def pmf(x, t=T):
    a = math.exp(-1.0 / t)
    return (1 - a) / (1 + a) * a ** np.abs(x)


def hockey(P, Q, eps):
    return float(np.maximum(P - math.exp(eps) * Q, 0.0).sum())


def pair(kind, q, D):
    b0, bp, bm = pmf(X), pmf(X - D), pmf(X + D)
    if kind == "remove":
        return (1 - q) * b0 + q * bp, b0
    if kind == "add":
        return b0, (1 - q) * b0 + q * bp
    return (1 - q) * b0 + q * bp, (1 - q) * b0 + q * bm  # substitution


def test_tail_probabilities_match_direct_sums():
    from pldlib.profiles.discrete_laplace import DiscreteLaplaceNoise

    noise = DiscreteLaplaceNoise(T, 1)
    for k in (-7, -1, 0, 1, 5):
        direct = pmf(X[X <= k]).sum()
        assert math.exp(float(noise._log_le(np.array([k]))[0])) == pytest.approx(direct, rel=1e-13)


@pytest.mark.parametrize("sampling", ["none", "poisson", "wor"])
@pytest.mark.parametrize("relation", ["remove", "add", "add_remove", "substitution"])
def test_one_step_brackets_brute_force(sampling, relation):
    q = 1.0 if sampling == "none" else 0.3
    D = 2 if sampling == "wor" else 1  # WOR: the Poisson pairs at sensitivity 2
    acc = pldlib.account(DiscreteLaplace(scale=T, q=q, sampling=sampling, relation=relation), steps=1)
    for eps in (0.0, 0.2, 0.45):
        if sampling == "wor" and relation == "substitution":
            rem, add = hockey(*pair("remove", q, D), eps), hockey(*pair("add", q, D), eps)
            iv = acc.delta(eps)
            assert iv.lower - 1e-12 <= rem  # the remove pair at 2D is realised
            assert max(rem, add) <= iv.upper + 1e-12  # the upper curve is the max of both
            continue
        if sampling == "none" and relation == "substitution":
            truth = hockey(pmf(X - 2), pmf(X), eps)
        elif relation == "add_remove":
            truth = max(hockey(*pair("remove", q, D), eps), hockey(*pair("add", q, D), eps))
        else:
            truth = hockey(*pair(relation, q, D), eps)
        iv = acc.delta(eps)
        assert iv.lower - 1e-12 <= truth <= iv.upper + 1e-12
        # finite atoms: connect-the-dots is exact up to round-off, the hull side within 10%
        assert iv.upper - truth <= 1e-9 * truth + 1e-12
        assert truth - iv.lower <= 0.1 * truth + 1e-12


def test_two_steps_poisson_add_remove_brackets_brute_force():
    q, eps = 0.4, 0.3
    acc = PLDAccountant("add_remove").compose(Sampled(DiscreteLaplaceEvent(T), q, "poisson"), 2)
    truths = []
    for kind in ("remove", "add"):
        P, Q = pair(kind, q, 1)
        truths.append(hockey(np.outer(P, P).ravel(), np.outer(Q, Q).ravel(), eps))
    iv = acc.delta(eps)
    assert iv.lower - 1e-12 <= max(truths) <= iv.upper + 1e-12
    assert iv.upper - iv.lower < 1e-3


def test_every_method_sees_the_new_mechanism():
    event = Sampled(DiscreteLaplaceEvent(T), 0.1, "poisson")
    pld = PLDAccountant().compose(event, 50).epsilon(1e-6)
    prv = pldlib.PRVAccountant().compose(event, 50).epsilon(1e-6)
    spa = pldlib.SPAAccountant().compose(event, 50).epsilon(1e-6)
    for other in (prv, spa):  # certified intervals of the same truth overlap
        assert other.lower <= pld.upper and pld.lower <= other.upper
    assert not pldlib.RDPAccountant().supports(event)  # a Gaussian-only formula says so


def test_bad_parameters_name_the_argument():
    with pytest.raises(ValueError, match="scale"):
        DiscreteLaplaceEvent(0.0)
    with pytest.raises((TypeError, ValueError), match="sensitivity"):
        DiscreteLaplace(scale=1.0, sensitivity=1.5)
