"""Exact zeros where the composed privacy loss is bounded (docs/MATH.md 0.6, "Bounded losses").

Independent references: the loss bounds in closed form (Laplace: D/b; Poisson remove:
ln(1 + q(e^a - 1)); substitution: the difference of two such logs) and, for randomized response,
exact enumeration of the composed loss law with rationals (mpmath at 40 digits).
"""
from __future__ import annotations

import math
from itertools import product

import mpmath as mp
import numpy as np
import pytest

import pldlib


def _rr_truth(eps0: float, q: float, k: int, eps: float) -> mp.mpf:
    """delta(eps) of k Poisson-subsampled randomized-response steps (remove direction), by
    enumerating the composed P-law of the loss at 40 digits."""
    mp.mp.dps = 40
    e0 = mp.e ** mp.mpf(eps0)
    p = e0 / (1 + e0)
    # remove: P = (1-q) B0 + q B1 over the outputs {0, 1}, Q = B0 (B0, B1: the two RR laws)
    b0, b1 = (p, 1 - p), (1 - p, p)
    P = [(1 - q) * b0[y] + q * b1[y] for y in (0, 1)]
    Q = [b0[y] for y in (0, 1)]
    total = mp.mpf(0)
    for ys in product((0, 1), repeat=k):
        pp = mp.fprod(P[y] for y in ys)
        qq = mp.fprod(Q[y] for y in ys)
        total += max(mp.mpf(0), pp - mp.e ** mp.mpf(eps) * qq)
    return total


def test_poisson_laplace_delta_is_exactly_zero_above_the_composed_loss_bound():
    q, k = 0.01, 100
    S = k * math.log1p(q * math.expm1(1.0))  # the largest composed loss, in closed form (remove)
    acc = pldlib.account(pldlib.Laplace(scale=1.0, q=q, sampling="poisson"), steps=k)
    d = acc.delta(np.array([S * (1 + 1e-9), 1.8, 5.0, 50.0]))
    assert np.all(d.lower == 0.0) and np.all(d.upper == 0.0)
    below = acc.delta(S * 0.9)  # (the truth is positive there: only the grid answers)
    assert below.upper > 0.0
    # epsilon(delta) never exceeds the bound, at any delta
    e = acc.epsilon(np.array([1e-5, 1e-20, 1e-28]))
    assert np.all(e.upper <= S * (1 + 1e-9)) and np.all(e.lower <= e.upper)


def test_substitution_uses_its_own_bound():
    q, k, a = 0.05, 40, 0.5
    # substitution: L <= ln(1 - q + q e^a) - ln(1 - q + q e^-a) per step
    s = math.log1p(q * math.expm1(a)) - math.log1p(q * math.expm1(-a))
    acc = pldlib.account(pldlib.Laplace(scale=1 / a, q=q, sampling="poisson", relation="substitution"), steps=k)
    assert acc.delta(k * s * (1 + 1e-9)).upper == 0.0
    assert acc.delta(k * s * 0.95).upper > 0.0
    assert acc.epsilon(1e-30).upper <= k * s * (1 + 1e-9)


@pytest.mark.parametrize("eps0,q,k", [(1.0, 0.3, 8), (0.5, 0.1, 10)])
def test_a_finite_pair_matches_enumeration_and_is_zero_beyond_the_bound(eps0, q, k):
    # the remove pair of Poisson-subsampled randomized response as a finite profile
    p = math.exp(eps0) / (1 + math.exp(eps0))
    P = [(1 - q) * p + q * (1 - p), (1 - q) * (1 - p) + q * p]
    Q = [p, 1 - p]
    prof = pldlib.FiniteProfile([math.log(P[0] / Q[0]), math.log(P[1] / Q[1])], P, q_masses=Q)
    acc = pldlib.PLDAccountant("remove").compose(pldlib.ProfileEvent(prof), k)
    s = math.log1p(q * math.expm1(eps0))  # the largest single-step loss
    assert prof.loss_sup() == pytest.approx(s, rel=1e-14)
    for eps in (0.5 * k * s, 0.9 * k * s, k * s * (1 + 1e-9), 2 * k * s):
        truth = _rr_truth(eps0, q, k, eps)
        iv = acc.delta(eps)
        assert iv.lower <= truth <= iv.upper * (1 + 1e-12) + 1e-300, (eps, iv, truth)
        if eps >= k * s * (1 + 1e-10):
            assert truth == 0 and iv.upper == 0.0 and iv.lower == 0.0


def test_unbounded_losses_claim_nothing():
    # the Gaussian's loss is unbounded: no ceiling, the grid's answers stand
    acc = pldlib.account(pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson"), steps=100)
    assert acc._loss_ceiling() == math.inf
    assert acc.delta(3.0).upper > 0.0
    # an (eps0, delta0) step has a +inf atom: delta(eps) >= its mass at every eps
    mixed = pldlib.account([(pldlib.Laplace(scale=1.0), 3), (pldlib.ApproxDP(eps0=0.1, delta0=1e-8), 1)])
    assert mixed.delta(10.0).lower > 0.0


def test_the_profiles_bounds_are_upper_bounds_of_their_losses():
    # each profile's loss_sup against its own curve: delta(loss_sup) == 0, and a hair below it > 0
    # where the top atom has mass (Laplace: P(L = a) = 1/2)
    lap = pldlib.LaplaceProfile(scale=2.0)
    assert lap.loss_sup() == 0.5 and float(lap.delta(0.5)) == 0.0 and float(lap.delta(0.5 - 1e-9)) > 0.0
    fin = pldlib.FiniteProfile([-1.0, 0.0, 2.0], [0.1, 0.3, 0.6])
    assert fin.loss_sup() == 2.0 and float(fin.delta(2.0)) == 0.0
    assert pldlib.FiniteProfile([0.0, 1.0], [0.5, 0.4], p_inf=0.1).loss_sup() == math.inf
    assert pldlib.GaussianProfile(1.0).loss_sup() == math.inf
