"""Exact enumeration paths at their atoms (issue 39, items 3 and 5; docs/MATH.md 12.3).

Every truth here is written independently of pldlib: binomial sums over the exact losses
(2j - K) eps0 of the double eps0 (compared with eps as exact rationals), at 60 digits.
"""
import math
import warnings
from fractions import Fraction

import mpmath
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib.methods.pld import PLDAccountant


# -- truths (60 digits; atoms placed by exact rational comparison) -------------------------
def _terms(eps0, K):
    """[(exact loss as Fraction, P-mass as mpf)] of K-fold eps0-randomized response."""
    e0 = mpmath.mpf(eps0)
    p = 1 / (1 + mpmath.exp(-e0))
    q = mpmath.exp(-e0) / (1 + mpmath.exp(-e0))
    return [(Fraction(2 * j - K) * Fraction(eps0), mpmath.binomial(K, j) * p**j * q ** (K - j))
            for j in range(K + 1)]


def rr_delta_mp(eps0, K, eps, delta0=0.0):
    """delta(eps) = 1 - (1 - delta0)^K (1 - sum_j b_j (1 - e^{eps - l_j})_+)."""
    with mpmath.workdps(60):
        fe = Fraction(eps)
        s = mpmath.mpf(0)
        for l, b in _terms(eps0, K):
            if l > fe:  # exact: atoms at or below eps contribute nothing
                s += b * -mpmath.expm1(mpmath.mpf(eps) - mpmath.mpf(l.numerator) / l.denominator)
        return 1 - (1 - mpmath.mpf(delta0)) ** K * (1 - s)


def gauss_rr_delta_mp(mu, eps0, K, eps):
    """sum_j b_j delta_G(eps - l_j), delta_G the Gaussian pair's curve at mu."""
    with mpmath.workdps(60):
        mu = mpmath.mpf(mu)
        s = mpmath.mpf(0)
        for l, b in _terms(eps0, K):
            x = mpmath.mpf(eps) - mpmath.mpf(l.numerator) / l.denominator
            s += b * (mpmath.ncdf(-x / mu + mu / 2) - mpmath.exp(x) * mpmath.ncdf(-x / mu - mu / 2))
        return s


def _inside(lo, up, truth):
    """lo <= truth <= up, the 60-digit truth taken to relative 1e-50 (far below any double's
    rounding, so a bound off by one unit of double round-off still fails)."""
    slack = abs(truth) * mpmath.mpf(10) ** -50
    return mpmath.mpf(float(lo)) <= truth + slack and truth - slack <= mpmath.mpf(float(up))


def _check_eps(acc, deltas, truth_fn):
    """eps(delta) bounds: truth(delta)(upper) <= delta <= truth(delta)(lower) certifies
    lower <= eps(delta) <= upper (delta strictly decreasing where positive)."""
    lo, up = acc.epsilon(np.asarray(deltas))
    for d, a, b in zip(deltas, np.atleast_1d(lo), np.atleast_1d(up)):
        assert a <= b
        if math.isfinite(b):
            assert _inside(0.0, d, truth_fn(float(b))), (d, a, b)
        if math.isfinite(a):
            assert _inside(d, 1.0, truth_fn(float(a))), (d, a, b)


# -- item 3: atoms rounded outward ----------------------------------------------------------
@pytest.mark.parametrize("eps0, K, eps", [(0.1, 10, 1.0), (60.1, 10, 601.0)])
def test_issue39_item3_atom_just_above_eps(eps0, K, eps):
    # 10 x fl(0.1) = 1.0000000000000000555 > 1 and 10 x fl(60.1) > 601 in exact arithmetic
    truth = rr_delta_mp(eps0, K, eps)
    assert truth > 0
    r = pldlib.account(pldlib.RandomizedResponse(eps0=eps0), steps=K).delta(eps)
    assert _inside(r.lower, r.upper, truth), (r, truth)
    assert r.upper > 0
    # eps(delta) for a delta below delta(eps): the atom sits just above eps, so must the upper end
    acc = pldlib.account(pldlib.RandomizedResponse(eps0=eps0), steps=K)
    _check_eps(acc, [float(truth) * 0.5], lambda e: rr_delta_mp(eps0, K, e))
    assert acc.epsilon(float(truth) * 0.5).upper > eps


def _atom_eps(eps0, K, rng, n):
    """eps at rounded atoms (2j - K) eps0 and their neighbours, plus random ones."""
    out = []
    for j in rng.integers(0, K + 1, n):
        a = (2 * int(j) - K) * eps0
        out += [a, np.nextafter(a, -np.inf), np.nextafter(a, np.inf)]
    out += list(rng.uniform(-K * eps0 - 1, K * eps0 + 1, 2))
    return np.array(out)


def test_rr_delta_and_epsilon_contain_truth_random_sweep():
    rng = np.random.default_rng(39)
    for case in range(120):
        eps0 = float(10 ** rng.uniform(-3, math.log10(700)))
        if case % 6 == 0:  # "decimal" doubles such as 0.1, 60.1 (losses rarely representable)
            eps0 = round(eps0, 1) or 0.1
        K = int(rng.integers(1, 31))
        acc = pldlib.account(pldlib.RandomizedResponse(eps0=eps0), steps=K)
        eps = _atom_eps(eps0, K, rng, 2)
        r = acc.delta(eps)
        for e, a, b in zip(eps, r.lower, r.upper):
            assert _inside(a, b, rr_delta_mp(eps0, K, float(e))), (eps0, K, e, a, b)
        deltas = [float(10 ** rng.uniform(-300, -0.3))]
        _check_eps(acc, deltas, lambda e: rr_delta_mp(eps0, K, e))


def test_rr_large_k_near_the_top_atoms():
    # few terms above eps even for large K: eps at the atom j = K - i, exact truth
    rng = np.random.default_rng(7)
    for _ in range(6):
        eps0 = float(10 ** rng.uniform(0, 2.5))
        K = int(10 ** rng.uniform(2, 5))
        acc = pldlib.account(pldlib.RandomizedResponse(eps0=eps0), steps=K)
        for i in (0, 1, 3):
            e = (K - 2 * i) * eps0  # rounded loss of j = K - i
            with mpmath.workdps(60):
                e0 = mpmath.mpf(eps0)
                p, q = 1 / (1 + mpmath.exp(-e0)), mpmath.exp(-e0) / (1 + mpmath.exp(-e0))
                t = mpmath.mpf(0)
                for jj in range(K - i, K + 1):
                    l = Fraction(2 * jj - K) * Fraction(eps0)
                    if l > Fraction(e):
                        t += mpmath.binomial(K, jj) * p**jj * q ** (K - jj) * -mpmath.expm1(
                            mpmath.mpf(e) - mpmath.mpf(l.numerator) / l.denominator)
            r = acc.delta(e)
            assert _inside(r.lower, r.upper, t), (eps0, K, i, r, t)


def test_approx_dp_atoms_contain_truth():
    # (eps0, delta0)-DP: the +inf mass wraps the binomial enumeration (PinfWrapped)
    rng = np.random.default_rng(11)
    for _ in range(25):
        eps0 = float(10 ** rng.uniform(-3, math.log10(700)))
        delta0 = float(10 ** rng.uniform(-12, -2))
        K = int(rng.integers(1, 16))
        acc = PLDAccountant().compose(E.ApproxDPEvent(eps0, delta0), K)
        eps = _atom_eps(eps0, K, rng, 1)
        lo, up = acc.delta(eps)
        for e, a, b in zip(eps, lo, up):
            assert _inside(a, b, rr_delta_mp(eps0, K, float(e), delta0)), (eps0, delta0, K, e, a, b)
        d = float(10 ** rng.uniform(-1, 0)) * (1 - (1 - delta0) ** K) + 10 ** rng.uniform(-6, -0.5)
        _check_eps(acc, [min(d, 0.9)], lambda e: rr_delta_mp(eps0, K, e, delta0))


def test_gauss_rr_contains_truth_at_atoms():
    # unsampled Gaussian composed with RR (GaussRRExact): delta_G(eps - l_j) at eps on atoms
    rng = np.random.default_rng(3)
    for _ in range(8):
        sigma = float(10 ** rng.uniform(-0.5, 1.5))
        eps0 = float(10 ** rng.uniform(-2, 1.5))
        K = int(rng.integers(1, 7))
        acc = PLDAccountant("add_remove").compose(E.GaussianEvent(sigma), 1).compose(
            E.RandomizedResponseEvent(eps0), K)
        eps = _atom_eps(eps0, K, rng, 1)[:3]
        lo, up = acc.delta(eps)
        for e, a, b in zip(eps, lo, up):
            assert _inside(a, b, gauss_rr_delta_mp(1 / sigma, eps0, K, float(e))), (sigma, eps0, K, e, a, b)
        _check_eps(acc, [1e-6], lambda e: gauss_rr_delta_mp(1 / sigma, eps0, K, e))


# -- item 5: randomized response for every eps0 ------------------------------------------------
def test_rr_profile_masses_every_tenth_up_to_700():
    # 1 - p = e^-eps0 / (1 + e^-eps0) to relative 1e-14 for eps0 = 0.1, 0.2, ..., 700 (the
    # old 1 - p lost every digit near eps0 = 37 and made Q's mass exceed 1)
    e0s = np.arange(1, 7001) / 10
    with mpmath.workdps(30):
        for e0 in e0s:
            prof = pldlib.randomized_response_profile(float(e0))
            w = mpmath.exp(-mpmath.mpf(float(e0)))
            pm, pp = w / (1 + w), 1 / (1 + w)
            assert abs(prof.p_masses[0] - pm) <= 1e-14 * pm
            assert abs(prof.p_masses[1] - pp) <= 1e-14 * pp
            assert prof.q_masses.sum() <= 1 + 1e-14


def test_rr_account_crash_band():
    # the band where the reproducer crashed (10.2 .. 37.4), every 0.1, through the accountant
    for i in range(100, 381):
        eps0 = i / 10
        r = pldlib.account(pldlib.RandomizedResponse(eps0=eps0), steps=1).delta(1.0)
        truth = rr_delta_mp(eps0, 1, 1.0)
        assert _inside(r.lower, r.upper, truth), (eps0, r, truth)
    r = pldlib.account(pldlib.RandomizedResponse(eps0=30.0), steps=1).delta(1.0)
    assert r.upper - r.lower < 1e-12
    prof = pldlib.approx_dp_profile(30.0, 1e-6)  # same cancellation in the (eps0, delta0) pair
    assert prof.q_masses.sum() <= 1 + 1e-14


def test_rr_beyond_supported_eps0_is_a_clear_error():
    r = pldlib.account(pldlib.RandomizedResponse(eps0=705.0), steps=2).delta(1.0)
    assert _inside(r.lower, r.upper, rr_delta_mp(705.0, 2, 1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(pldlib.PrecisionLimitError, match="eps0"):
            pldlib.account(pldlib.RandomizedResponse(eps0=750.0), steps=2).delta(1.0)


def test_outward_product_brackets_exact_product():
    from pldlib.exact import _outward_product

    rng = np.random.default_rng(1)
    for x in list(10 ** rng.uniform(-300, 12, 300)) + [0.1, 60.1, 0.5, 3.0, 1e-260]:
        n = rng.integers(-(2**40), 2**40, 8).astype(float)
        lo, hi = _outward_product(n, float(x))
        for a, b, k in zip(lo, hi, n):
            t = Fraction(int(k)) * Fraction(float(x))
            assert Fraction(a) <= t <= Fraction(b)
            assert np.nextafter(a, np.inf) >= b or (x < 1e-250 and np.nextafter(np.nextafter(a, np.inf), np.inf) >= b)
            if Fraction(float(k * x)) == t:  # exact products are not widened
                assert x < 1e-250 or a == b


def test_gaussian_upper_never_underflows_below_a_positive_truth():
    """delta(eps) of N(0,1) vs N(mu,1) is positive for every finite eps; far in the tail
    (ln delta < -745) the certified upper bound must stay above 0, not underflow to it."""
    import mpmath

    from pldlib.exact import GaussianExact

    mpmath.mp.dps = 40
    for mu, eps in [(1.0, 40.0), (1.0, 1000.0), (0.5, 200.0)]:
        m, e = mpmath.mpf(mu), mpmath.mpf(eps)
        truth = mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)
        assert truth > 0
        lo, up = GaussianExact(mu).delta_bounds(eps)
        assert up > 0 and mpmath.mpf(float(up)) >= truth
        assert mpmath.mpf(float(lo)) <= truth
