"""One step composed once: the PRV and saddle-point accountants read its own curve (docs/MATH.md 0.8).

Truths: the mpmath closed forms of robust_truths (one Poisson-subsampled Gaussian step, randomized
response, the Neyman-Pearson power), independent of the profiles' double-precision code.
"""
from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib.methods import single_step as SS
from pldlib.methods.prv import PRVAccountant
from pldlib.methods.spa import SPAAccountant
from pldlib.testing import robust_truths as T


def _branches(event, relation, count=1):
    return SS.single_step_branches(pldlib.PLDAccountant(relation).compose(event, count).components)


@pytest.mark.parametrize("relation", ["add", "remove", "add_remove"])
@pytest.mark.parametrize("sigma,q", [(0.5, 0.01), (1.0, 0.2), (3.0, 0.9)])
def test_delta_bounds_hold_the_closed_form(sigma, q, relation):
    br = _branches(E.Sampled(E.GaussianEvent(sigma), q, "poisson"), relation)
    eps = np.array([-0.5, 0.0, 0.3, 1.0, 2.5, 6.0])
    lo, up = SS.delta_bounds(br, eps)
    for e, l_, u in zip(eps, lo, up):
        d = [float(v) for v in T.poisson_gauss_delta1(sigma, q, e, relation)]
        assert l_ <= d[1] * (1 + 1e-15) and u >= d[0] * (1 - 1e-15)
        if d[0] > 1e-200:
            assert u - l_ <= 1e-9 * d[0] + 1e-300


@pytest.mark.parametrize("relation", ["add", "remove", "add_remove"])
def test_pld_accountant_reads_one_step_off_its_own_curve_below_the_grid_floor(relation):
    """One step composed once: the PLD accountant's wide answers are intersected with the step's
    own curve, as the PRV and saddle-point accountants' are.  delta(0.05) of sigma 5.49, q 6.3e-4
    is about 1e-133, far below the grid's floor (the grid alone answered [0, 9e-31])."""
    sigma, q = 5.486870232452013, 0.000634493088848515
    acc = pldlib.PLDAccountant(relation).compose(E.Sampled(E.GaussianEvent(sigma), q, "poisson"), 1)
    eps = np.array([-0.3, 0.01, 0.03, 0.05])
    iv = acc.delta(eps)
    for j, e in enumerate(eps):
        d = float(T.poisson_gauss_delta1(sigma, q, e, relation)[0])
        assert iv.lower[j] <= d * (1 + 1e-12) and iv.upper[j] >= d * (1 - 1e-12), (e, d, iv)
        if d > 1e-290:  # (narrow: the grid alone left every answer below 1e-30 as [0, floor])
            assert iv.upper[j] - iv.lower[j] <= 1e-6 * d, (e, d, iv)
    # eps at a tiny delta: both ends checked through the closed form of delta
    for delta in (1e-60, 1e-120):
        e_iv = acc.epsilon(delta)
        assert e_iv.upper - e_iv.lower <= 1e-3 * abs(e_iv.upper), e_iv
        assert float(T.poisson_gauss_delta1(sigma, q, e_iv.upper, relation)[0]) <= delta * (1 + 1e-9)
        assert float(T.poisson_gauss_delta1(sigma, q, e_iv.lower, relation)[0]) >= delta * (1 - 1e-9)


def test_pld_sharpening_of_one_step_reads_the_curve_the_answer_is_about():
    """The one-step reading inside the PLD's sharpening reads delta bounds for delta answers and eps
    bounds for eps answers (a delta answer intersected with eps values would be unsound).  Driven
    directly on answers made wide on purpose, the finer grids off (an accuracy-limited accountant)."""
    import time

    sigma, q = 1.0, 0.2
    acc = pldlib.PLDAccountant("remove").compose(E.Sampled(E.GaussianEvent(sigma), q, "poisson"), 1)
    acc.delta(0.5)  # (built)
    acc.accuracy_limited = True
    eps = np.array([0.05, 0.1, 0.2])
    lo, up = acc._sharpen("delta", eps, np.zeros(3), np.ones(3), time.perf_counter())
    for j, e in enumerate(eps):
        d = float(T.poisson_gauss_delta1(sigma, q, e, "remove")[0])
        assert lo[j] <= d * (1 + 1e-12) and up[j] >= d * (1 - 1e-12) and up[j] - lo[j] <= 1e-9 * d, (e, d, lo, up)
    deltas = np.array([1e-2, 1e-4])
    lo, up = acc._sharpen("eps", deltas, np.full(2, -1.0), np.full(2, 5.0), time.perf_counter())
    for j, d in enumerate(deltas):
        assert float(T.poisson_gauss_delta1(sigma, q, up[j], "remove")[0]) <= d * (1 + 1e-9)
        assert float(T.poisson_gauss_delta1(sigma, q, lo[j], "remove")[0]) >= d * (1 - 1e-9)
        assert up[j] - lo[j] <= 1e-6 * up[j]


@pytest.mark.parametrize("relation", ["remove", "add_remove"])
def test_an_explicit_spacing_one_step_epsilon_is_read_off_its_own_curve(relation):
    """With an explicit spacing no finer grid is asked (the spacing is the user's accuracy), but one
    step composed once is still intersected with its own curve, as its delta answers were: eps(3e-5)
    of sigma 2.07, q 1.7e-4 at spacing 7.4e-4 was [-3.0e-5, 4.8e-5] off the grid alone."""
    sigma, q = 2.067245017024012, 0.00016592500698598369
    acc = pldlib.PLDAccountant(relation, spacing=0.0007356987625755577).compose(
        E.Sampled(E.GaussianEvent(sigma), q, "poisson"), 1)
    iv = acc.epsilon(2.9639363240424876e-05)
    assert acc.spacing == 0.0007356987625755577
    assert iv.upper - iv.lower <= 1e-6 * max(abs(iv.upper), 1e-3), iv
    d = 2.9639363240424876e-05
    assert float(T.poisson_gauss_delta1(sigma, q, iv.upper, relation)[0]) <= d * (1 + 1e-9)
    assert float(T.poisson_gauss_delta1(sigma, q, iv.lower, relation)[0]) >= d * (1 - 1e-9)


@pytest.mark.parametrize("delta", [0.3, 1e-3, 1e-8, 1e-14])
def test_epsilon_bounds_bracket_the_truth(delta):
    sigma, q = 0.8, 0.1
    br = _branches(E.Sampled(E.GaussianEvent(sigma), q, "poisson"), "add_remove")
    lo, up = SS.epsilon_bounds(br, np.array([delta]))
    d_at_lo = float(T.poisson_gauss_delta1(sigma, q, lo[0], "add_remove")[0])
    d_at_up = float(T.poisson_gauss_delta1(sigma, q, up[0], "add_remove")[1])
    assert d_at_lo >= delta >= d_at_up
    assert up[0] - lo[0] <= 1e-9 * max(abs(up[0]), 1.0)


def test_randomized_response_exact():
    br = _branches(E.RandomizedResponseEvent(1.3), "add_remove")
    eps = np.array([0.0, 0.5, 1.2])
    lo, up = SS.delta_bounds(br, eps)
    for e, l_, u in zip(eps, lo, up):
        d = float(T.rr_delta(1.3, 1, e)[0])
        assert l_ <= d <= u and u - l_ <= 1e-14


def test_only_for_one_step_composed_once():
    ev = E.Sampled(E.GaussianEvent(1.0), 0.1, "poisson")
    assert _branches(ev, "remove", 2) is None
    acc = PRVAccountant("remove").compose(ev, 1).compose(E.GaussianEvent(3.0), 1)
    assert SS.of_accountant(acc) is None
    assert SS.of_accountant(PRVAccountant("remove").compose(ev, 1)) is not None


@pytest.mark.parametrize("cls", [PRVAccountant, SPAAccountant])
@pytest.mark.parametrize("relation", ["remove", "add_remove"])
def test_accountants_answer_single_steps_to_float_accuracy(cls, relation):
    sigma, q = 0.9, 0.05
    acc = cls(relation).compose(E.Sampled(E.GaussianEvent(sigma), q, "poisson"), 1)
    d = acc.delta(1.0)
    t = [float(v) for v in T.poisson_gauss_delta1(sigma, q, 1.0, relation)]
    assert d.lower <= t[1] and d.upper >= t[0] and d.upper - d.lower <= 1e-9 * t[0]
    e = acc.epsilon(1e-6)
    assert float(T.poisson_gauss_delta1(sigma, q, e.lower, relation)[0]) >= 1e-6
    assert float(T.poisson_gauss_delta1(sigma, q, e.upper, relation)[1]) <= 1e-6
    assert e.upper - e.lower <= 1e-9 * e.upper


@pytest.mark.parametrize("cls", [PRVAccountant, SPAAccountant])
@pytest.mark.parametrize("relation", ["add", "remove", "add_remove", "substitution"])
def test_single_step_power_within_one_percent(cls, relation):
    sigma, q, alpha = 1.2, 0.2, 0.01
    iv = cls(relation).compose(E.Sampled(E.GaussianEvent(sigma), q, "poisson"), 1).max_tpr(alpha)
    t_lo, t_up = (float(v) for v in T.np_power(sigma, q, alpha, relation))
    assert iv.lower <= t_up * (1 + 1e-12) and iv.upper >= t_lo * (1 - 1e-12)
    assert iv.upper - iv.lower <= 0.01 * t_lo


def test_max_profile_upper_is_the_larger_curve():
    """WOR substitution's upper pair is the larger of two curves: the bounds hold the PLD
    accountant's certified interval of the same step."""
    ev = E.Sampled(E.GaussianEvent(1.2), 0.3, "wor")
    br = _branches(ev, "substitution")
    eps = np.array([0.0, 1.0, 3.0])
    lo, up = SS.delta_bounds(br, eps)
    ref = pldlib.PLDAccountant("substitution").compose(ev, 1).delta(eps)
    assert np.all(lo <= ref.upper * (1 + 1e-9)) and np.all(up >= ref.lower * (1 - 1e-9))
    assert np.all(up <= ref.upper * (1 + 1e-9))
    assert math.isfinite(float(up[0]))


def _random_event(rng):
    kind = rng.integers(0, 6)
    if kind == 0:
        return E.Sampled(E.GaussianEvent(float(np.exp(rng.uniform(np.log(0.3), np.log(20))))),
                         float(np.exp(rng.uniform(np.log(1e-4), 0.0))), str(rng.choice(["poisson", "wor"])))
    if kind == 1:
        return E.Sampled(E.LaplaceEvent(float(np.exp(rng.uniform(np.log(0.3), np.log(10))))),
                         float(np.exp(rng.uniform(np.log(1e-3), 0.0))), "poisson")
    if kind == 2:
        return E.LaplaceEvent(float(np.exp(rng.uniform(np.log(0.2), np.log(10)))))
    if kind == 3:
        return E.RandomizedResponseEvent(float(rng.uniform(0.01, 5.0)))
    if kind == 4:
        return E.ApproxDPEvent(float(rng.uniform(0.0, 2.0)), float(np.exp(rng.uniform(np.log(1e-9), np.log(1e-2)))))
    return E.DiscreteLaplaceEvent(float(np.exp(rng.uniform(np.log(0.3), np.log(10)))))


def test_random_single_steps_meet_the_pld_interval():
    """Both are certified intervals of the same number, so they must meet: 16 seeded random single
    steps (every noise, sampling and relation) at 5 eps each, and eps at 3 deltas."""
    rng = np.random.default_rng(7)
    eps = np.array([-0.3, 0.05, 0.5, 2.0, 6.0])
    deltas = np.array([0.1, 1e-5, 1e-10])
    n = 0
    while n < 16:
        ev = _random_event(rng)
        rel = str(rng.choice(["add", "remove", "add_remove", "substitution"]))
        try:
            acc = pldlib.PLDAccountant(rel).compose(ev, 1)
            ref = acc.delta(eps)
            ref_e = acc.epsilon(deltas)
        except (NotImplementedError, pldlib.PrecisionLimitError, ValueError):
            continue  # (an event / relation the PLD accountant does not take, or beyond float)
        n += 1
        br = SS.single_step_branches(acc.components)
        lo, up = SS.delta_bounds(br, eps)
        tol = 1e-9 * np.maximum(ref.upper, 1e-300)
        assert np.all(lo <= ref.upper + tol) and np.all(up >= ref.lower - tol), (ev, rel)
        el, eu = SS.epsilon_bounds(br, deltas)
        ok = np.isfinite(eu)
        assert np.all(el[ok] <= ref_e.upper[ok] + 1e-9) and np.all(eu[ok] >= ref_e.lower[ok] - 1e-9), (ev, rel)


# -- a whole composition with a closed form (pldlib.exact.whole_exact) ------------------------------
@pytest.mark.parametrize("cls", [PRVAccountant, SPAAccountant])
@pytest.mark.parametrize("eps0,k", [(0.05, 2000), (0.7, 40), (3.0, 7)])
def test_randomized_response_compositions_are_read_off_their_binomial_sums(cls, eps0, k):
    # the 60-digit binomial sum (robust_truths.rr_delta) inside both ends, and the interval tight:
    # Berry-Esseen on this lattice loss certified 1-20% before
    acc = cls("add_remove").compose(E.RandomizedResponseEvent(eps0), k)
    eps = np.array([0.0, 0.5 * eps0 * math.sqrt(k), 1.5 * eps0 * math.sqrt(k)])
    iv = acc.delta(eps)
    for j, e in enumerate(eps):
        truth = float(T.rr_delta(eps0, k, float(e))[0])
        assert iv.lower[j] <= truth * (1 + 1e-12) and truth * (1 - 1e-12) <= iv.upper[j], (e, truth, iv)
        if truth > 1e-12:
            assert iv.upper[j] - iv.lower[j] <= 1e-6 * truth, (e, truth, iv)
    d = 1e-6
    ie = acc.epsilon(d)
    assert float(T.rr_delta(eps0, k, ie.upper)[0]) <= d * (1 + 1e-9)  # the upper end is certified
    if ie.lower > -math.inf and ie.lower < ie.upper:
        assert float(T.rr_delta(eps0, k, ie.lower)[0]) >= d * (1 - 1e-9)


@pytest.mark.parametrize("cls", [PRVAccountant, SPAAccountant])
def test_unsampled_gaussians_are_read_off_the_closed_form(cls):
    # 30 steps of sigma 5 under substitution: one Gaussian pair, mu = 2 sqrt(30) / 5 (MATH 12)
    import mpmath as mp

    mu = 2 * math.sqrt(30) / 5
    acc = cls("substitution").compose(E.GaussianEvent(5.0), 30)
    for e in (0.5, 3.0, 8.0):
        with mp.workdps(40):
            m, ee = mp.mpf(mu), mp.mpf(e)
            truth = float(mp.ncdf(m / 2 - ee / m) - mp.exp(ee) * mp.ncdf(-m / 2 - ee / m))
        iv = acc.delta(e)
        assert iv.lower <= truth * (1 + 1e-12) and truth * (1 - 1e-12) <= iv.upper
        assert iv.upper - iv.lower <= 1e-9 * truth, (e, truth, iv)


def test_bracket_epsilon_against_the_gaussian_closed_form():
    # certified delta bounds of the Gaussian pair (exact.GaussianExact) at any eps: the bracket
    # keeps the true eps(delta) (mpmath bisection on the closed form) and narrows [lo, up] about
    # (2 / 33)^3 times; a refusing reader leaves the bracket as it was
    from pldlib.exact import GaussianExact

    mu = 1.3
    g = GaussianExact(mu)
    deltas = np.array([1e-6, 1e-3, 0.1])
    lo, up = np.full(3, -1.0), np.full(3, 8.0)
    l2, u2 = SS.bracket_epsilon(lambda e: g.delta_bounds(e), deltas, lo, up)
    for d, a, b in zip(deltas, l2, u2):
        with mp.workdps(40):
            m = mp.mpf(mu)

            def f(e):
                return mp.ncdf(m / 2 - e / m) - mp.exp(e) * mp.ncdf(-m / 2 - e / m) - mp.mpf(d)
            a_, b_ = mp.mpf(-1), mp.mpf(8)  # (f decreases: bisection)
            for _ in range(150):
                c_ = (a_ + b_) / 2
                a_, b_ = (c_, b_) if f(c_) > 0 else (a_, c_)
            truth = a_
        assert mp.mpf(a) <= truth <= mp.mpf(b), (d, a, b, truth)
        assert b - a <= 9.0 * (2 / 33) ** 3 * 1.001
    same = SS.bracket_epsilon(lambda e: None, deltas, lo, up)
    assert np.array_equal(same[0], lo) and np.array_equal(same[1], up)
