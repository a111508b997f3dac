"""The accountant on the Gaussian mechanism without subsampling, against the closed form.

k-fold composition of the Gaussian pair with noise multiplier sigma is one Gaussian
pair with r = sqrt(k) / sigma (docs/MATH.md section 1):
    delta(eps) = Phi(-eps/r + r/2) - e^eps Phi(-eps/r - r/2).
The truth is evaluated with mpmath at 40 digits and eps(delta) found by bisection
in mpmath, so it is independent of the log_ndtr evaluation inside the library.
"""
from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import pldlib

DPS = 40


def exact_delta(r, eps):
    with mp.workdps(DPS):
        r, eps = mp.mpf(r), mp.mpf(eps)
        return mp.ncdf(-eps / r + r / 2) - mp.exp(eps) * mp.ncdf(-eps / r - r / 2)


def exact_eps(r, delta):
    """Root of delta(eps) = delta by bisection (delta(eps) is strictly decreasing)."""
    with mp.workdps(DPS):
        r, delta = mp.mpf(r), mp.mpf(delta)
        f = lambda e: exact_delta(r, e) - delta
        hi = mp.mpf(1)
        while f(hi) > 0:
            hi *= 2
        lo, step = mp.mpf(0), mp.mpf(1)
        while f(lo) <= 0:
            lo -= step
            step *= 2
        while hi - lo > mp.mpf(10) ** -16 * max(1, abs(hi)):
            mid = (lo + hi) / 2
            if f(mid) > 0:
                lo = mid
            else:
                hi = mid
        return float((lo + hi) / 2)


def r_of(sigma, k):
    return mp.sqrt(k) / mp.mpf(sigma)


def check_eps_interval(iv, truths, deltas, context):
    lo, up = np.atleast_1d(iv.lower), np.atleast_1d(iv.upper)
    for d, t, l, u in zip(deltas, truths, lo, up):
        # the truth is good to ~1e-16 relative; no slack is given to the library
        assert l <= t <= u, (context, d, l, t, u)
        if t >= 0.1:
            # default accuracy: relative width at most 1%
            assert (u - l) / t <= 0.01, (context, d, l, t, u, (u - l) / t)


# ----------------------------------------------------------------------------
# item 1: eps(delta) brackets the truth, relative width <= 1% at default accuracy
# ----------------------------------------------------------------------------
DELTAS = [1e-10, 1e-8, 1e-6, 1e-4, 1e-2]


@pytest.mark.parametrize("k", [1, 7, 100, 3000, 100000])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.7, 20.0])
def test_epsilon_brackets_closed_form(sigma, k):
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma), steps=k)
    iv = acc.epsilon(DELTAS)
    r = r_of(sigma, k)
    truths = [exact_eps(r, d) for d in DELTAS]
    check_eps_interval(iv, truths, DELTAS, (sigma, k))


@settings(max_examples=15, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(
    sigma=st.floats(math.log(0.5), math.log(20.0)).map(math.exp),
    k=st.floats(0.0, math.log(1e5)).map(lambda x: max(1, int(round(math.exp(x))))),
    deltas=st.lists(st.floats(math.log(1e-10), math.log(1e-2)).map(math.exp), min_size=1, max_size=4),
)
def test_epsilon_brackets_closed_form_property(sigma, k, deltas):
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma), steps=k)
    iv = acc.epsilon(deltas)
    r = r_of(sigma, k)
    truths = [exact_eps(r, d) for d in deltas]
    check_eps_interval(iv, truths, deltas, (sigma, k))


def test_scalar_and_vector_answers_agree():
    acc = pldlib.account(pldlib.Gaussian(sigma=1.3), steps=50)
    iv = acc.epsilon([1e-7, 1e-3])
    one = acc.epsilon(1e-3)
    assert isinstance(one.lower, float) and isinstance(one.upper, float)
    assert one.lower <= iv.upper[1] and iv.lower[1] <= one.upper
    t = exact_eps(r_of(1.3, 50), 1e-3)
    assert one.lower <= t <= one.upper
    # upper bounds decrease as delta grows (post-processing monotonicity)
    many = acc.epsilon(np.geomspace(1e-9, 1e-1, 9))
    assert np.all(np.diff(many.upper) < 0) and np.all(many.lower <= many.upper)


@pytest.mark.parametrize("sigma,delta", [(5.0, 0.5), (20.0, 0.3), (2.0, 0.9), (1.0, 0.5)])
def test_epsilon_can_be_negative(sigma, delta):
    """For delta above delta(0) the answer is a negative eps; it must still be bracketed."""
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma), steps=1)
    t = exact_eps(r_of(sigma, 1), delta)
    assert t < 0
    iv = acc.epsilon(delta)
    assert iv.lower <= t <= iv.upper


# ----------------------------------------------------------------------------
# delta(eps), negative eps included
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("sigma,k", [(0.5, 1), (1.0, 10), (3.0, 1000), (20.0, 100000), (0.8, 2)])
def test_delta_brackets_closed_form(sigma, k):
    r = float(r_of(sigma, k))
    mu = r * r / 2  # mean of the composed loss under P; sd r
    eps = np.concatenate([mu + r * np.array([-8.0, -3.0, -1.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0]),
                          [-2.0, -0.5, -0.01, 0.0, 0.01, 0.5]])
    iv = pldlib.account(pldlib.Gaussian(sigma=sigma), steps=k).delta(eps)
    for e, lo, up in zip(eps, iv.lower, iv.upper):
        t = exact_delta(r, e)
        assert lo <= t <= up, (sigma, k, e, lo, t, up)
        assert 0 <= lo <= up <= 1
    # scalar call returns floats
    one = pldlib.account(pldlib.Gaussian(sigma=sigma), steps=k).delta(0.0)
    assert isinstance(one.lower, float)
    assert iv.lower[np.where(eps == 0.0)[0][0]] <= one.upper


def test_negative_eps_reaches_one_minus_alpha():
    """delta(eps) -> 1 - e^eps as eps -> -inf (h(alpha) >= 1 - alpha, equality near 0)."""
    acc = pldlib.account(pldlib.Gaussian(sigma=1.0), steps=4)
    eps = np.array([-40.0, -20.0, -10.0])
    iv = acc.delta(eps)
    for e, lo, up in zip(eps, iv.lower, iv.upper):
        t = exact_delta(2.0, e)
        assert lo <= t <= up
        # the optimistic side subtracts a certified round-off bound from every mass
        # (about 1e-12 each here), which costs ~1e-8 absolute at delta ~ 1
        assert up - lo <= 1e-7


# ----------------------------------------------------------------------------
# parametrisation of the mechanism: sensitivity, substitution, heterogeneous lists
# ----------------------------------------------------------------------------
def test_sensitivity_does_not_change_the_answer():
    """sigma is the noise multiplier (std = sigma * sensitivity): r = sqrt(k)/sigma."""
    acc = pldlib.account(pldlib.Gaussian(sigma=2.0, sensitivity=7.0), steps=30)
    iv = acc.epsilon([1e-8, 1e-3])
    check_eps_interval(iv, [exact_eps(r_of(2.0, 30), d) for d in [1e-8, 1e-3]], [1e-8, 1e-3], "sens")


def test_substitution_doubles_the_sensitivity():
    """Without sampling, substitution is the pair (B_0, B_2D): r = 2 sqrt(k) / sigma."""
    acc = pldlib.account(pldlib.Gaussian(sigma=3.0, relation="substitution"), steps=20)
    deltas = [1e-9, 1e-5, 1e-2]
    iv = acc.epsilon(deltas)
    check_eps_interval(iv, [exact_eps(2 * r_of(3.0, 20), d) for d in deltas], deltas, "substitution")


@pytest.mark.parametrize("relation", ["add", "remove", "add_remove"])
def test_add_remove_relations_coincide_without_sampling(relation):
    acc = pldlib.account(pldlib.Gaussian(sigma=1.5, relation=relation), steps=12)
    deltas = [1e-7, 1e-3]
    iv = acc.epsilon(deltas)
    check_eps_interval(iv, [exact_eps(r_of(1.5, 12), d) for d in deltas], deltas, relation)


def test_heterogeneous_gaussians_compose_to_one_gaussian():
    """(sigma_1, k_1) then (sigma_2, k_2): r^2 = k_1/sigma_1^2 + k_2/sigma_2^2."""
    acc = pldlib.account([(pldlib.Gaussian(sigma=1.0), 5), (pldlib.Gaussian(sigma=4.0), 200)])
    r = mp.sqrt(mp.mpf(5) / 1 + mp.mpf(200) / 16)
    deltas = [1e-9, 1e-6, 1e-3]
    check_eps_interval(acc.epsilon(deltas), [exact_eps(r, d) for d in deltas], deltas, "hetero")
    eps = np.array([-1.0, 0.0, 2.0, 6.0])
    iv = acc.delta(eps)
    for e, lo, up in zip(eps, iv.lower, iv.upper):
        assert lo <= exact_delta(r, e) <= up


def test_explicit_interval_trades_accuracy():
    """A coarser interval still certifies; a finer one is at least as tight."""
    r = r_of(1.0, 100)
    t = exact_eps(r, 1e-6)
    widths = []
    for h in [0.2, 0.05, 0.01]:
        iv = pldlib.account(pldlib.Gaussian(sigma=1.0), steps=100, spacing=h).epsilon(1e-6)
        assert iv.lower <= t <= iv.upper, (h, iv, t)
        widths.append(iv.upper - iv.lower)
    assert widths[0] >= widths[1] >= widths[2]


# ----------------------------------------------------------------------------
# item 6: small deltas are certified; absurd ones bracket or refuse, never lie
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("sigma,k", [(0.5, 1), (1.0, 10), (5.0, 1000), (20.0, 100000), (2.0, 1)])
def test_small_delta_is_certified(sigma, k):
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma), steps=k)
    deltas = [1e-10, 1e-12, 1e-15]
    iv = acc.epsilon(deltas)
    r = r_of(sigma, k)
    for d, lo, up in zip(deltas, iv.lower, iv.upper):
        t = exact_eps(r, d)
        assert lo <= t <= up, (sigma, k, d, lo, t, up)
        if d == 1e-10:
            assert (up - lo) / t <= 0.01


@pytest.mark.parametrize("sigma,k", [(1.0, 10), (0.5, 1), (20.0, 100000)])
@pytest.mark.parametrize("delta", [1e-20, 1e-50, 1e-100, 1e-300, 5e-324])
def test_absurdly_small_delta_brackets_or_refuses(sigma, k, delta):
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma), steps=k)
    try:
        iv = acc.epsilon(delta)
    except pldlib.PrecisionLimitError as exc:
        assert str(exc)  # a refusal that says why
        return
    t = exact_eps(r_of(sigma, k), delta)
    assert iv.lower <= t <= iv.upper, (sigma, k, delta, iv, t)


@pytest.mark.parametrize("sigma,k", [(1.0, 10), (0.5, 1), (5.0, 1000)])
def test_delta_far_in_the_tail_never_understates(sigma, k):
    """delta(eps) where the truth is 1e-20 .. 1e-300: the upper curve must stay above it."""
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma), steps=k)
    r = float(r_of(sigma, k))
    eps = r * r / 2 + r * np.array([6.0, 10.0, 15.0, 25.0, 35.0])
    iv = acc.delta(eps)
    for e, lo, up in zip(eps, iv.lower, iv.upper):
        t = exact_delta(r, e)
        assert lo <= t <= up, (sigma, k, e, lo, t, up)
