"""Exact paths (pldlib/exact.py, docs/MATH.md section 12) against independent truths."""
import math
import warnings

import mpmath
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib.methods.pld import AccuracyLimitedWarning, PLDAccountant


# -- truths written independently (mpmath, 60 digits) -------------------------------
def _gauss_delta_mp(mu, eps):
    mu, eps = mpmath.mpf(mu), mpmath.mpf(eps)
    return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


def _gauss_eps_mp(mu, delta):
    """eps with delta(eps) = delta by bisection at 60 digits (delta decreasing in eps)."""
    with mpmath.workdps(60):
        mu_ = mpmath.mpf(mu)
        d = mpmath.mpf(delta)
        a = mu_ * mu_ / 2 - 60 * mu_ - 60
        b = mu_ * mu_ / 2 + 60 * mu_ + 60
        for _ in range(400):
            m = (a + b) / 2
            if _gauss_delta_mp(mu_, m) > d:
                a = m
            else:
                b = m
            if b - a < mpmath.mpf(10) ** -40 * max(1, abs(m)):
                break
        return (a + b) / 2


def _rr_delta_mp(eps0, k, eps, delta0=0.0):
    """Exact enumeration of k-fold (eps0, delta0)-DP: 1 - (1-delta0)^k (1 - sum_j ...)."""
    with mpmath.workdps(60):
        e0 = mpmath.mpf(eps0)
        p = mpmath.exp(e0) / (1 + mpmath.exp(e0))
        s = mpmath.mpf(0)
        for j in range(k + 1):
            l = (2 * j - k) * e0
            if l > eps:
                s += mpmath.binomial(k, j) * p**j * (1 - p) ** (k - j) * (1 - mpmath.exp(eps - l))
        keep = (1 - mpmath.mpf(delta0)) ** k
        return 1 - keep * (1 - s)


def _points(n=50, seed=22):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sigma = float(10 ** rng.uniform(math.log10(0.05), math.log10(500)))
        k = int(10 ** rng.uniform(0, 12)) if i % 5 else 10**12
        delta = float(10 ** rng.uniform(-30, math.log10(0.5)))
        out.append((sigma, k, delta))
    return out


@pytest.mark.parametrize("relation", ["add_remove", "substitution"])
def test_kfold_gaussian_matches_50_digit_truth(relation):
    c = 2.0 if relation == "substitution" else 1.0
    pts = _points(50 if relation == "add_remove" else 10)
    for sigma, k, delta in pts:
        acc = PLDAccountant(relation).compose(E.GaussianEvent(sigma), k)
        lo, up = acc.epsilon(delta)
        mu = c * math.sqrt(k) / sigma
        truth = _gauss_eps_mp(mu, delta)
        assert mpmath.mpf(lo) <= truth <= mpmath.mpf(up), (sigma, k, delta, lo, up, truth)
        scale = max(abs(float(truth)), 1e-3)
        assert (up - lo) / scale < 1e-9, (sigma, k, delta, lo, up)
        assert abs(0.5 * (lo + up) - float(truth)) / scale < 1e-9


def test_gaussian_delta_interval_contains_truth():
    rng = np.random.default_rng(5)
    for _ in range(20):
        sigma = float(10 ** rng.uniform(-1.3, 2.7))
        k = int(10 ** rng.uniform(0, 9))
        mu = math.sqrt(k) / sigma
        eps = float(mu * mu / 2 + rng.uniform(-3, 8) * mu)
        lo, up = PLDAccountant().compose(E.GaussianEvent(sigma), k).delta(eps)
        with mpmath.workdps(60):
            t = _gauss_delta_mp(mu, eps)
        assert mpmath.mpf(lo) <= t <= mpmath.mpf(up)
        if t > 1e-300:
            assert up - lo <= 1e-6 * float(t) + 1e-300


def test_issue_examples_gaussian():
    # sigma 200, 1e7 steps, delta 1e-30: truth about 305.51 (the issue); 0.05, 1e7, eps 1: about 1
    lo, up = pldlib.account(pldlib.Gaussian(sigma=200.0), steps=10**7).epsilon(1e-30)
    t = float(_gauss_eps_mp(math.sqrt(1e7) / 200, 1e-30))
    assert lo <= t <= up and (up - lo) / t < 1e-9 and abs(t - 305.51) < 0.01
    lo, up = pldlib.account(pldlib.Gaussian(sigma=0.05), steps=10**7).delta(1.0)
    assert lo > 0.9999999 and up == 1.0


@pytest.mark.parametrize("eps0,delta0,k", [(0.5, 0.0, 60), (1.0, 1e-6, 25), (0.1, 1e-5, 200), (2.0, 0.0, 7)])
def test_composed_approxdp_and_rr_match_enumeration(eps0, delta0, k):
    ev = E.ApproxDPEvent(eps0, delta0) if delta0 or k % 2 else E.RandomizedResponseEvent(eps0)
    acc = PLDAccountant().compose(ev, k)
    for eps in (0.0, 0.3 * k * eps0 ** 2, 2.0, 0.5 * k * eps0):
        lo, up = acc.delta(eps)
        t = _rr_delta_mp(eps0, k, eps, delta0)
        assert mpmath.mpf(lo) <= t <= mpmath.mpf(up), (eps, lo, up, t)
        assert up - lo <= 1e-9 * float(t) + 1e-300
    for d in (1e-3, 1e-6, 1e-9):
        lo, up = acc.epsilon(d)
        if math.isfinite(up):
            assert _rr_delta_mp(eps0, k, up, delta0) <= d * (1 + 1e-12)
            assert up - lo <= 1e-9 * max(abs(up), 1.0)


@pytest.mark.parametrize("k", [10, 1000])
def test_approxdp_eps0_zero_composed(k):
    acc = PLDAccountant().compose(E.ApproxDPEvent(0.0, 1e-6), k)
    D = -math.expm1(k * math.log1p(-1e-6))
    for d in (1e-2, 0.5):
        lo, up = acc.epsilon(d)
        t = math.log1p(-(d - D) / (1 - D))  # identity pair: eps(t) = ln(1 - t)
        assert lo <= t * (1 - 1e-12) + 1e-300 or lo <= t
        assert lo - 1e-15 <= t <= up + 1e-15 and up - lo < 1e-12
    lo, up = acc.epsilon(D / 2)  # below the +inf mass: infinite
    assert lo == up == math.inf
    lo, up = acc.delta(0.0)
    assert lo <= D <= up and up - lo < 1e-15


def test_heterogeneous_same_interval_as_by_hand():
    sub = E.Sampled(E.GaussianEvent(1.0), 0.01)
    auto = PLDAccountant().compose(E.GaussianEvent(1.0), 100).compose(E.GaussianEvent(2.0), 50).compose(sub, 300)
    sigma = 1.0 / math.sqrt(100 / 1.0**2 + 50 / 2.0**2)
    hand = PLDAccountant().compose(E.GaussianEvent(sigma), 1).compose(sub, 300)
    for d in (1e-5, 1e-8):
        assert auto.epsilon(d) == hand.epsilon(d)
    assert auto.delta(5.0) == hand.delta(5.0)
    # and the whole-Gaussian lists agree exactly with the combined Gaussian
    a = PLDAccountant().compose(E.GaussianEvent(1.0), 100).compose(E.GaussianEvent(2.0), 50)
    b = PLDAccountant().compose(E.GaussianEvent(sigma), 1)
    assert a.epsilon(1e-6) == b.epsilon(1e-6)


def test_memory_budget_gives_flagged_certified_interval():
    mech = pldlib.Gaussian(sigma=1.0, q=0.05, sampling="poisson")
    ref = pldlib.account(mech, steps=200)
    with pytest.warns(AccuracyLimitedWarning):
        small = PLDAccountant("add_remove", memory_budget=2**17).compose(mech.event, 200)
        lo, up = small.epsilon(1e-5)
    assert small.accuracy_limited and not ref.accuracy_limited
    rl, ru = ref.epsilon(1e-5)
    assert lo <= ru and rl <= up and lo <= up
    with pytest.raises(pldlib.GridTooLargeError):
        pldlib.account(mech, steps=200, spacing=1e-7, max_bins=1000)


@pytest.mark.parametrize("eps0,K", [(0.01, 10**5), (0.3, 10**6), (1.0, 10**7)])
def test_large_rr_matches_binomial_sum(eps0, K):
    # independent: delta(eps) = sum_{j > j*} Bin(K, p)(j) (1 - e^{eps - (2j-K) eps0}), with
    # scipy's pmf (boost; relative error ~1e-9 at these K, hence the 1e-8 tolerance)
    from scipy import stats

    p = 1 / (1 + math.exp(-eps0))
    acc = PLDAccountant().compose(E.RandomizedResponseEvent(eps0), K)
    sd = math.sqrt(K * p * (1 - p))
    for z in (1.0, 3.0, 6.0):
        jstar = int(K * p + z * sd)
        eps = (2 * jstar - K) * eps0 + 0.5 * eps0  # between two losses
        jj = np.arange(jstar + 1, min(K, jstar + int(60 * sd) + 60) + 1)
        t = float(np.sum(stats.binom.pmf(jj, K, p) * -np.expm1(eps - (2 * jj - K) * eps0)))
        lo, up = acc.delta(eps)
        assert lo <= t * (1 + 1e-8) and t * (1 - 1e-8) <= up, (z, lo, up, t)
        assert (up - lo) <= 1e-7 * t


def test_binomial_logpmf_against_mpmath():
    from pldlib.exact import binom_logpmf

    for K, e0 in ((10**6, 0.3), (10**12, 0.01), (37, 2.0)):
        p, q = 1 / (1 + math.exp(-e0)), 1 / (1 + math.exp(e0))
        sd = math.sqrt(K * p * q)
        js = sorted({max(0, min(K, round(K * p + z * sd))) for z in (-8, -2, 0, 1, 5, 30)})
        got, err = binom_logpmf(np.array(js, dtype=float), K, p, q)
        with mpmath.workdps(50):
            P = 1 / (1 + mpmath.exp(-mpmath.mpf(e0)))
            for j, g, e in zip(js, got, err):
                t = mpmath.loggamma(K + 1) - mpmath.loggamma(j + 1) - mpmath.loggamma(K - j + 1) \
                    + j * mpmath.log(P) + (K - j) * mpmath.log(1 - P)
                assert abs(g - t) <= e, (K, j, g, float(t), e)
