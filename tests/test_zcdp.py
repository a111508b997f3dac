"""zCDP guarantees (ZCDPEvent; dp_accounting's ZCDpEvent) through the RDP accountant (docs/MATH.md 8.1).

Independent references: the RDP-to-(eps, delta) conversion minimised over real orders by scipy
(bounded scalar minimisation of the closed form), and dp_accounting's own RdpAccountant.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

import pldlib
from pldlib import GaussianEvent, Sampled, ZCDPEvent
from pldlib.methods import make_accountant


def _continuous_eps(curve, delta: float) -> float:
    """min over real alpha > 1 of curve(alpha) + ln(1 - 1/alpha) - (ln delta + ln alpha) / (alpha - 1)."""
    def f(a):
        return curve(a) + math.log1p(-1.0 / a) - (math.log(delta) + math.log(a)) / (a - 1.0)

    best = min((minimize_scalar(f, bounds=(lo, hi), method="bounded") for lo, hi in
                ((1.0 + 1e-6, 1.5), (1.5, 4.0), (4.0, 40.0), (40.0, 1024.0))), key=lambda r: r.fun)
    return float(best.fun)


@pytest.mark.parametrize("rho,xi,count,delta", [(0.5, 0.0, 1, 1e-5), (0.01, 0.0, 100, 1e-6), (0.05, 0.1, 10, 1e-5),
                                                (2.0, 0.0, 3, 1e-9), (1e-4, 0.0, 1000, 1e-5)])
def test_a_zcdp_guarantee_converts_at_the_continuous_minimum(rho, xi, count, delta):
    acc = make_accountant("rdp").compose(ZCDPEvent(rho, xi), count)
    got = acc.epsilon(delta)
    assert got.kind == "upper" and math.isnan(got.lower)
    ref = _continuous_eps(lambda a: count * (xi + rho * a), delta)
    assert ref * (1 - 1e-12) <= got.upper <= ref * (1 + 1e-3) + 1e-12, (got.upper, ref)
    # delta(eps) at that epsilon is back at delta (the same conversion, read the other way)
    assert acc.delta(got.upper).upper <= delta * (1 + 1e-6)


def test_composed_with_gaussians_and_against_dp_accounting():
    from dp_accounting import dp_event as D
    from dp_accounting.rdp import rdp_privacy_accountant as R

    acc = make_accountant("rdp").compose(ZCDPEvent(0.05), 10).compose(GaussianEvent(3.0), 100)
    got = acc.epsilon(1e-5).upper
    ref = _continuous_eps(lambda a: 10 * 0.05 * a + 100 * a / (2 * 9.0), 1e-5)
    assert ref <= got <= ref * (1 + 1e-3)
    theirs = R.RdpAccountant()
    theirs.compose(D.ZCDpEvent(0.05), 10)
    theirs.compose(D.GaussianDpEvent(3.0), 100)
    assert abs(got / theirs.get_epsilon(1e-5) - 1) < 0.01
    # with a subsampled Gaussian the integer orders are kept (its curve is known at integers only)
    mixed = make_accountant("rdp").compose(ZCDPEvent(0.05), 10).compose(Sampled(GaussianEvent(1.0), 0.01), 1000)
    alone = make_accountant("rdp").compose(Sampled(GaussianEvent(1.0), 0.01), 1000)
    assert mixed.epsilon(1e-5).upper > alone.epsilon(1e-5).upper
    theirs = R.RdpAccountant()
    theirs.compose(D.ZCDpEvent(0.05), 10)
    theirs.compose(D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(1.0)), 1000)
    assert abs(mixed.epsilon(1e-5).upper / theirs.get_epsilon(1e-5) - 1) < 0.02


def test_refusals_name_the_reason():
    with pytest.raises(pldlib.UnsupportedEventError, match="method='rdp'"):
        make_accountant("pld").compose(ZCDPEvent(0.1), 1).epsilon(1e-5)
    with pytest.raises(pldlib.UnsupportedEventError, match="subsampling or grouping"):
        make_accountant("rdp").compose(Sampled(ZCDPEvent(0.1), 0.01), 1)
    with pytest.raises(ValueError, match="rho"):
        ZCDPEvent(-1.0)
    with pytest.raises(ValueError, match="xi"):
        ZCDPEvent(0.1, float("nan"))


def test_the_dp_accounting_drop_in():
    from dp_accounting import dp_event as D

    from pldlib.interop.dp_accounting import PldlibAccountant

    ours = PldlibAccountant(method="rdp")
    ours.compose(D.ZCDpEvent(0.05, 0.01), 4)
    ref = _continuous_eps(lambda a: 4 * (0.01 + 0.05 * a), 1e-6)
    assert ref <= ours.get_epsilon(1e-6) <= ref * (1 + 1e-3)
    pld = PldlibAccountant()
    assert not pld.supports(D.ZCDpEvent(0.05))
    with pytest.raises(Exception, match="method='rdp'"):
        pld.compose(D.ZCDpEvent(0.05))
    assert np.isfinite(ours.get_delta(1.0))
