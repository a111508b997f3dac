"""Baselines: RDP (an upper bound, never below the truth) and the GDP CLT (an estimate only)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

import pldlib
from pldlib import Gaussian, Laplace
from pldlib.methods.clt import account_clt
from pldlib.methods.rdp import RDP_ORDERS, account_rdp, rdp_single_step
from pldlib.profiles.base import GaussianProfile

DPSGD = [  # (sigma, q, steps)
    (0.6, 0.01, 500),
    (1.0, 0.01, 1000),
    (2.0, 0.1, 200),
    (0.8, 0.001, 3000),
    (4.0, 0.05, 2000),
]


@pytest.mark.parametrize("sigma,q,k", DPSGD)
def test_rdp_is_never_below_the_truth(sigma, q, k):
    mech = Gaussian(sigma=sigma, q=q, sampling="poisson", relation="add_remove")
    deltas = np.array([1e-3, 1e-6, 1e-10])
    r = account_rdp(mech, k).epsilon(deltas)
    assert np.all(np.isnan(r.lower)) and np.all(r.upper == r.estimate)
    # the certified PLD upper end is >= the truth, so rdp >= it is a (stronger) check of rdp >= truth
    p = pldlib.account(mech, k).epsilon(deltas)
    assert np.all(r.upper >= p.upper), (r.upper, p.upper)
    d = account_rdp(mech, k).delta(np.asarray(p.lower))
    assert np.all(d.upper >= pldlib.account(mech, k).delta(np.asarray(p.lower)).lower)


def test_rdp_matches_dp_accounting_and_closed_form():
    from dp_accounting import dp_event  # a test dependency (extra "test"): never skipped
    from dp_accounting.rdp import rdp_privacy_accountant as rpa
    orders = np.arange(2, 161, dtype=float)  # a shorter list keeps dp_accounting quick
    for sigma, q, k in [(1.0, 0.01, 1000), (0.7, 0.2, 50), (3.0, 0.001, 10_000)]:
        ours = account_rdp(Gaussian(sigma=sigma, q=q, sampling="poisson"), k, orders=orders)
        ref = rpa.RdpAccountant(orders=[float(a) for a in orders])
        ref.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), k)
        for d in (1e-5, 1e-10):
            assert ours.epsilon(d).upper == pytest.approx(ref.get_epsilon(d), rel=1e-10)
    # q = 1: RDP(alpha) = k alpha / (2 sigma^2) exactly
    np.testing.assert_allclose(rdp_single_step(2.0, 1.0), RDP_ORDERS / 8.0, rtol=1e-15)
    a = account_rdp(Gaussian(sigma=2.0), 10)
    e = a.epsilon(1e-6).upper

    def manual(al):
        return np.min(10 * al / 8 + np.log1p(-1 / al) - (math.log(1e-6) + np.log(al)) / (al - 1))

    # (unsampled Gaussians: the conversion also at real orders, MATH 8.1; never above integers alone)
    from pldlib.methods.rdp import FRACTIONAL_ORDERS

    assert e == pytest.approx(manual(np.concatenate([FRACTIONAL_ORDERS, RDP_ORDERS])), rel=1e-13)
    assert e <= manual(RDP_ORDERS)
    # and it is above the exact Gaussian curve
    gp = GaussianProfile.from_r(math.sqrt(10) / 2.0)
    assert gp.delta(e) <= 1e-6
    # the subsampled formula at q -> 1 approaches the plain one
    np.testing.assert_allclose(rdp_single_step(2.0, 1 - 1e-12, [2, 3, 10]), np.array([2, 3, 10]) / 8.0, rtol=1e-9)


def test_rdp_delta_epsilon_consistency_and_grid():
    mech = Gaussian(sigma=1.1, q=0.02, sampling="poisson", relation="remove")
    acc = account_rdp(mech, 800)
    deltas = np.array([1e-4, 1e-8])
    e = acc.epsilon(deltas).upper
    d = acc.delta(e).upper
    assert np.all(d <= deltas * (1 + 1e-9))
    lo, est, up = acc.epsilon_grid([400, 800], deltas)
    np.testing.assert_allclose(up[1], e, rtol=1e-13)
    assert np.all(np.isnan(lo)) and np.all(up[1] > up[0])
    s = acc.epsilon(1e-4)
    assert isinstance(s.upper, float) and math.isnan(s.lower)


def test_heterogeneous_and_wor():
    seq = [(Gaussian(sigma=1.0, q=0.01, sampling="poisson"), 500), (Gaussian(sigma=2.0, q=0.02, sampling="poisson"), 300)]
    r = account_rdp(seq)
    r1 = account_rdp(seq[0][0], 500).rdp + account_rdp(seq[1][0], 300).rdp
    np.testing.assert_allclose(r.rdp, r1, rtol=1e-14)
    c = account_clt(seq)
    assert c.mu == pytest.approx(math.sqrt(500 * 1e-4 * math.expm1(1.0) + 300 * 4e-4 * math.expm1(0.25)))
    # WOR add/remove: the Poisson pair at sensitivity 2 (sigma / 2); still >= the certified PLD answer
    wor = Gaussian(sigma=2.0, q=0.02, sampling="wor", relation="add_remove")
    assert account_rdp(wor, 300).epsilon(1e-6).upper >= pldlib.account(wor, 300).epsilon(1e-6).upper


def test_clt_is_labelled_an_estimate_and_exact_only_without_sampling():
    mech = Gaussian(sigma=1.0, q=0.01, sampling="poisson", relation="add_remove")
    c = account_clt(mech, 1000)
    e = c.epsilon(np.array([1e-5, 1e-10]))
    assert np.all(np.isnan(e.lower)) and np.all(np.isnan(e.upper)) and np.all(np.isfinite(e.estimate))
    d = c.delta(1.0)
    assert math.isnan(d.lower) and math.isnan(d.upper) and 0 < d.estimate < 1
    # it under-reports DP-SGD here: below the certified lower end of the truth
    p = pldlib.account(mech, 1000).epsilon(np.array([1e-5, 1e-10]))
    assert np.all(e.estimate < p.lower)
    # q = 1: mu = sqrt(k)/sigma, the exact Gaussian curve
    g = account_clt(Gaussian(sigma=2.0), 16)
    r = math.sqrt(16) / 2.0
    gp = GaussianProfile.from_r(r)
    te = brentq(lambda x: gp.log_delta(x) - math.log(1e-6), 0, 50, xtol=1e-14)
    assert g.epsilon(1e-6).estimate == pytest.approx(te, rel=1e-10)
    assert g.delta(te).estimate == pytest.approx(1e-6, rel=1e-9)
    lo, est, up = c.epsilon_grid([1000, 2000], [1e-5, 1e-10])
    np.testing.assert_allclose(est[0], e.estimate, rtol=1e-12)
    assert np.all(np.isnan(lo)) and np.all(np.isnan(up))


@pytest.mark.parametrize("mech", [
    Laplace(scale=1.0, q=0.1, sampling="poisson"),
    Gaussian(sigma=1.0, q=0.1, sampling="poisson", relation="substitution"),
    Gaussian(sigma=1.0, q=0.1, sampling="wor", relation="substitution"),
], ids=["laplace", "poisson-substitution", "wor-substitution"])
def test_unsupported_mechanisms_raise_clearly(mech):
    with pytest.raises(NotImplementedError, match="PLD or SPA"):
        account_rdp(mech, 10)
    with pytest.raises(NotImplementedError, match="PLD or SPA"):
        account_clt(mech, 10)
