"""The accountant against brute-force enumeration of every output sequence (docs/MATH.md section 8).

For a pair on finitely many outputs, the k-fold composition is the product pair
and its curve is delta(eps) = sum over output sequences o of (P(o) - e^eps Q(o))_+.
With rational P, Q and rational alpha = e^eps this is an exact rational
(fractions.Fraction), and eps(delta) is exact per linear piece in alpha.  Nothing
here is computed by pldlib.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st

import pldlib
from pldlib.profiles.base import FiniteProfile


# ----------------------------------------------------------------------------
# exact enumeration
# ----------------------------------------------------------------------------
def product_pair(P, Q, k):
    """Every one of the len(P)^k output sequences of the k-fold product pair, as exact
    (P(o), Q(o)) Fractions."""
    P, Q = list(P), list(Q)
    out = []
    for seq in itertools.product(range(len(P)), repeat=k):
        out.append((math.prod((P[j] for j in seq), start=Fraction(1)),
                    math.prod((Q[j] for j in seq), start=Fraction(1))))
    return out


def exact_delta(pairs, alpha: Fraction) -> Fraction:
    return sum((max(Fraction(0), p - alpha * q) for p, q in pairs), start=Fraction(0))


def exact_eps(pairs, delta: Fraction) -> float:
    """inf{eps : delta(eps) <= delta}; delta(alpha) is piecewise linear in alpha with kinks
    at the likelihood ratios P(o)/Q(o): solve exactly on the right piece."""
    ratios = sorted({p / q for p, q in pairs if q > 0 and p > 0})
    p_inf = sum((p for p, q in pairs if q == 0), start=Fraction(0))
    if p_inf > delta:
        return math.inf
    # walk the kinks from the largest ratio down; the first kink r with delta(r) > delta
    # brackets the answer in [r, next kink), where delta(alpha) = A - alpha B sums over the
    # outputs of ratio > r
    for r in reversed(ratios):
        if exact_delta(pairs, r) > delta:
            A = p_inf + sum((p for p, q in pairs if q > 0 and p / q > r), start=Fraction(0))
            B = sum((q for p, q in pairs if q > 0 and p / q > r), start=Fraction(0))
            return math.log(A - delta) - math.log(B)
    # delta(alpha) <= delta already at the smallest ratio: solve on [0, r_min)
    A = p_inf + sum((p for p, q in pairs if q > 0 and p > 0), start=Fraction(0))
    B = sum((q for p, q in pairs if q > 0 and p > 0), start=Fraction(0))
    if A <= delta:
        return -math.inf
    return math.log(A - delta) - math.log(B)


def finite_profile(P, Q) -> FiniteProfile:
    """The library's description of the pair (floats of the exact rationals)."""
    keep = [(p, q) for p, q in zip(P, Q) if p > 0 and q > 0]
    losses = [math.log(p / q) for p, q in keep]
    masses = [float(p) for p, _ in keep]
    p_inf = float(sum((p for p, q in zip(P, Q) if q == 0), start=Fraction(0)))
    return FiniteProfile(losses, masses, p_inf=p_inf)


# ----------------------------------------------------------------------------
# binary randomized response, eps0 = ln 3 (p = 3/4)
# ----------------------------------------------------------------------------
RR_P = [Fraction(3, 4), Fraction(1, 4)]
RR_Q = [Fraction(1, 4), Fraction(3, 4)]
RR_ALPHAS = [Fraction(1, 3), Fraction(1, 2), Fraction(2, 3), Fraction(1), Fraction(3, 2), Fraction(2),
             Fraction(3), Fraction(5), Fraction(9), Fraction(27)]


def test_enumerator_reproduces_the_rr_closed_form():
    """k = 1: (e^eps0 - alpha)_+ / (1 + e^eps0) with e^eps0 = 3 (docs/MATH.md section 1)."""
    pairs = product_pair(RR_P, RR_Q, 1)
    for a in RR_ALPHAS:
        if a >= 1:
            assert exact_delta(pairs, a) == max(Fraction(0), 3 - a) / 4


@pytest.mark.parametrize("k", range(1, 7))
def test_randomized_response_matches_enumeration_on_grid(k):
    """h = ln 3 puts every composed atom on the grid: both curves must be exact."""
    pairs = product_pair(RR_P, RR_Q, k)
    acc = pldlib.account(pldlib.RandomizedResponse(eps0=math.log(3)), steps=k, spacing=math.log(3))
    iv = acc.delta([math.log(a) for a in RR_ALPHAS])
    for a, lo, up in zip(RR_ALPHAS, iv.lower, iv.upper):
        exact = float(exact_delta(pairs, a))
        assert abs(up - exact) <= 1e-12, (k, a, up, exact)
        assert abs(lo - exact) <= 1e-12, (k, a, lo, exact)
        assert lo <= exact + 1e-15 and up >= exact - 1e-15


@pytest.mark.parametrize("N", [2, 3])
@pytest.mark.parametrize("k", range(1, 7))
def test_randomized_response_matches_enumeration_on_finer_grids(N, k):
    """h = ln 3 / N: atoms are still on the grid.  The lower curve must be exact to 1e-12;
    the upper curve carries the certified FFT round-off term, which grows with the
    number of bins (~k N), so it is allowed 1e-11 above the truth (never below)."""
    pairs = product_pair(RR_P, RR_Q, k)
    acc = pldlib.account(pldlib.RandomizedResponse(eps0=math.log(3)), steps=k, spacing=math.log(3) / N)
    iv = acc.delta([math.log(a) for a in RR_ALPHAS])
    for a, lo, up in zip(RR_ALPHAS, iv.lower, iv.upper):
        exact = float(exact_delta(pairs, a))
        assert exact - 1e-15 <= up <= exact + 1e-11, (k, N, a, up, exact)
        assert abs(lo - exact) <= 1e-12, (k, N, a, lo, exact)


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_randomized_response_epsilon_matches_enumeration(k):
    pairs = product_pair(RR_P, RR_Q, k)
    acc = pldlib.account(pldlib.RandomizedResponse(eps0=math.log(3)), steps=k, spacing=math.log(3))
    deltas = [0.5, 0.2, 0.1, 0.03, 1e-3]
    iv = acc.epsilon(deltas)
    for d, lo, up in zip(deltas, iv.lower, iv.upper):
        exact = exact_eps(pairs, Fraction(d))
        if math.isinf(exact):  # delta below every finite value: +inf, certified
            assert lo == up == math.inf
            continue
        assert lo <= exact + 1e-9 and exact <= up + 1e-9, (k, d, lo, exact, up)
        assert up - lo <= 1e-8 * max(1.0, abs(exact)), (k, d, lo, up)


# ----------------------------------------------------------------------------
# seed 002 section 5: add and remove cross after composition (docs/MATH.md section 8)
# ----------------------------------------------------------------------------
SEED_A = [Fraction(3, 4), Fraction(1, 4)]  # all-zeros dataset: outputs 0 w.p. 3/4
SEED_B = [Fraction(1, 2), Fraction(1, 2)]  # one record added, sampled w.p. 1/2


def test_enumerator_reproduces_the_seed_rationals():
    ab = product_pair(SEED_A, SEED_B, 2)
    ba = product_pair(SEED_B, SEED_A, 2)
    assert exact_delta(ab, Fraction(4, 3)) == Fraction(11, 48)
    assert exact_delta(ba, Fraction(4, 3)) == Fraction(1, 6)
    assert exact_delta(ab, Fraction(2)) == Fraction(1, 16)
    assert exact_delta(ba, Fraction(2)) == Fraction(1, 8)


def test_accountant_brackets_and_certifies_the_crossing():
    ab = pldlib.account(pldlib.Custom(profile=finite_profile(SEED_A, SEED_B)), steps=2)
    ba = pldlib.account(pldlib.Custom(profile=finite_profile(SEED_B, SEED_A)), steps=2)
    eps = [math.log(4 / 3), math.log(2)]
    iab, iba = ab.delta(eps), ba.delta(eps)
    for iv, truths in [(iab, [11 / 48, 1 / 16]), (iba, [1 / 6, 1 / 8])]:
        for lo, up, t in zip(iv.lower, iv.upper, truths):
            assert lo <= t + 1e-12 and t <= up + 1e-12, (lo, t, up)
    # the curves cross: A||B is worse at alpha = 4/3, B||A at alpha = 2 -- certified
    assert iab.lower[0] > iba.upper[0]
    assert iab.upper[1] < iba.lower[1]


# ----------------------------------------------------------------------------
# (eps0, delta0)-DP pair, eps0 = ln 3: outputs (delta0, 0), (3/4 (1-d0), 1/4 (1-d0)), ..., (0, delta0)
# ----------------------------------------------------------------------------
def adp_pair(d0: Fraction):
    return ([d0, Fraction(3, 4) * (1 - d0), Fraction(1, 4) * (1 - d0), Fraction(0)],
            [Fraction(0), Fraction(1, 4) * (1 - d0), Fraction(3, 4) * (1 - d0), d0])


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("d0", [Fraction(1, 100), Fraction(1, 4)])
def test_approx_dp_matches_enumeration(k, d0):
    P, Q = adp_pair(d0)
    pairs = product_pair(P, Q, k)
    # float(1/100) differs from 1/100 by ~2e-19: far below the tolerance
    acc = pldlib.account(pldlib.ApproxDP(eps0=math.log(3), delta0=float(d0)), steps=k, spacing=math.log(3) / 2)
    iv = acc.delta([math.log(a) for a in RR_ALPHAS])
    for a, lo, up in zip(RR_ALPHAS, iv.lower, iv.upper):
        exact = float(exact_delta(pairs, a))
        assert lo <= exact + 1e-12 and exact <= up + 1e-12, (k, a, lo, exact, up)
        assert up - lo <= 1e-10, (k, a, lo, up)


@pytest.mark.parametrize("interval", [0.12, 0.3, 0.02])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_approx_dp_small_eps0_coarse_grid(k, interval):
    """eps0 = ln(21/20) (p = 21/41), delta0 = 1/8: with an interval wider than eps0 all atoms
    sit inside the cells next to eps = 0; the interval must still contain the truth."""
    d0 = Fraction(1, 8)
    p = Fraction(21, 41)
    P = [d0, p * (1 - d0), (1 - p) * (1 - d0), Fraction(0)]
    Q = [Fraction(0), (1 - p) * (1 - d0), p * (1 - d0), d0]
    pairs = product_pair(P, Q, k)
    acc = pldlib.account(pldlib.ApproxDP(eps0=math.log(21 / 20), delta0=0.125), steps=k, spacing=interval)
    alphas = [Fraction(9, 10), Fraction(1), Fraction(41, 40), Fraction(21, 20), Fraction(11, 10), Fraction(6, 5)]
    iv = acc.delta([math.log(a) for a in alphas])
    for a, lo, up in zip(alphas, iv.lower, iv.upper):
        exact = float(exact_delta(pairs, a))
        assert lo <= exact + 1e-12 and exact <= up + 1e-12, (k, interval, a, lo, exact, up)


@pytest.mark.parametrize("k", [1, 3])
def test_approx_dp_with_eps0_zero(k):
    """eps0 = 0: P = (d0 at +inf, 1 - d0 at L = 0).  Composed: p_inf = 1 - (1 - d0)^k and
    delta(eps) = 1 - (1 - d0)^k e^eps for eps <= 0, p_inf above.  eps(delta) for
    p_inf < delta < 1 is ln((1 - delta) / (1 - d0)^k) < 0."""
    d0 = 0.1
    acc = pldlib.account(pldlib.ApproxDP(eps0=0.0, delta0=d0), steps=k)
    keep = (1 - d0) ** k
    eps = np.array([-2.0, -0.5, -0.1, 0.0, 0.3, 2.0])
    truth = np.where(eps <= 0, 1 - keep * np.exp(eps), 1 - keep)
    iv = acc.delta(eps)
    assert np.all(iv.lower <= truth + 1e-12) and np.all(truth <= iv.upper + 1e-12)
    for d in [0.5, 0.9, (1 - keep) + 0.05]:
        exact = math.log((1 - d) / keep)
        e = acc.epsilon(d)
        assert e.lower <= exact + 1e-9 and exact <= e.upper + 1e-9, (k, d, e, exact)


# ----------------------------------------------------------------------------
# random finite pairs
# ----------------------------------------------------------------------------
weights = st.lists(st.integers(0, 12), min_size=2, max_size=4)


@st.composite
def rational_pairs(draw):
    P = draw(weights)
    Q = draw(st.lists(st.integers(0, 12), min_size=len(P), max_size=len(P)))
    assume(sum(P) > 0 and sum(Q) > 0)
    finite = [(p, q) for p, q in zip(P, Q) if p > 0 and q > 0]
    assume(len({Fraction(p, q) for p, q in finite}) >= 2)  # at least two distinct finite losses
    return [Fraction(p, sum(P)) for p in P], [Fraction(q, sum(Q)) for q in Q]


@settings(max_examples=25, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pair=rational_pairs(), k=st.integers(1, 3), h=st.sampled_from([None, 0.05, 0.01]),
       alphas=st.lists(st.fractions(Fraction(1, 20), Fraction(20)), min_size=1, max_size=6))
@example(pair=([Fraction(6, 13), Fraction(0), Fraction(7, 13), Fraction(0)],
               [Fraction(9, 22), Fraction(3, 22), Fraction(5, 11), Fraction(0)]),
         k=3, h=0.05, alphas=[Fraction(1, 2)])  # refused when the grid is built
def test_random_finite_pairs_bracket_the_enumeration(pair, k, h, alphas):
    """The certified interval contains the exact curve of every enumerated product pair."""
    P, Q = pair
    pairs = product_pair(P, Q, k)
    prof = finite_profile(P, Q)
    try:  # (the refusal may come when the grid is built or at the first query)
        acc = pldlib.account(pldlib.Custom(profile=prof), steps=k, spacing=h)
        iv = acc.delta([math.log(a) for a in alphas])
    except ValueError as e:
        # refused as meaningless (issue 18): only when h exceeds half the whole loss range
        assert "is wider than half the whole single-step privacy-loss range" in str(e)
        losses = [math.log(p / q) for p, q in zip(P, Q) if p > 0 and q > 0]
        assert h > (max(losses) - min(losses)) / 2
        return
    for a, lo, up in zip(alphas, np.atleast_1d(iv.lower), np.atleast_1d(iv.upper)):
        exact = float(exact_delta(pairs, a))
        # slack: the profile holds float copies of the rationals (relative ~1e-16)
        assert lo <= exact + 1e-12, (P, Q, k, a, lo, exact)
        assert exact <= up + 1e-12, (P, Q, k, a, exact, up)
    for d in [0.3, 0.05]:
        exact = exact_eps(pairs, Fraction(d))
        try:
            e = acc.epsilon(d)
        except pldlib.PrecisionLimitError:
            # only acceptable where the truth is +inf (delta below the +inf mass)
            assert math.isinf(exact), (P, Q, k, d, exact)
            continue
        assert e.lower <= exact + 1e-9 and exact <= e.upper + 1e-9, (P, Q, k, d, e, exact)


def test_answers_do_not_depend_on_query_history():
    """A query must not be spoiled by compositions cached for earlier queries."""
    P, Q = [Fraction(1, 3), Fraction(2, 3)], [Fraction(4, 11), Fraction(7, 11)]
    pairs = product_pair(P, Q, 1)
    prof = finite_profile(P, Q)
    exact = exact_eps(pairs, Fraction(3, 10))
    fresh = pldlib.account(pldlib.Custom(profile=prof), steps=1).epsilon(0.3)
    assert fresh.lower <= exact <= fresh.upper
    acc = pldlib.account(pldlib.Custom(profile=prof), steps=1)
    acc.delta(math.log(2))  # beyond the support of the loss: delta = 0 there
    acc.delta([-1.0, 0.0])
    later = acc.epsilon(0.3)
    assert later.lower <= exact <= later.upper
    assert later.upper - later.lower <= 1e-6


@pytest.mark.parametrize("method", ["pld", "prv", "spa"])
@pytest.mark.parametrize("relation", ["add_remove", "remove"])
def test_user_pair_at_negative_eps_is_not_read_off_its_reverse(method, relation):
    """A user-supplied pair is composed as given for every relation, so its curve at eps < 0 is its
    own, not 1 - e^eps + e^eps times its curve at -eps (MATH 0.5 needs a relation closed under
    reversing pairs).  An asymmetric pair's exact curve (enumerated) stays inside both ends."""
    from pldlib.methods import make_accountant

    P, Q = [Fraction(6, 17), Fraction(11, 17)], [Fraction(10, 17), Fraction(7, 17)]
    kw = {"on_edge": "flag"} if method == "spa" else ({"spacing": 0.05} if method == "pld" else {})
    for k in (1, 2):
        pairs = product_pair(P, Q, k)
        acc = make_accountant(method, relation, **kw).compose(pldlib.Custom(profile=finite_profile(P, Q)).event, k)
        eps = np.array([-0.3, -0.1])
        iv = acc.delta(eps)
        for e, lo, up in zip(eps, iv.lower, iv.upper):
            exact = float(exact_delta(pairs, Fraction(math.exp(e))))
            assert lo <= exact + 1e-12 and exact <= up + 1e-12, (k, e, lo, exact, up)
        for d in (0.3, 0.5):  # (eps(0.3) = -0.17096 at k = 1: a PLD answer once bracketed on the reverse)
            exact = exact_eps(pairs, Fraction(d))
            iv = acc.epsilon(d)
            assert iv.lower <= exact + 1e-9 and exact <= iv.upper + 1e-9, (k, d, iv, exact)
