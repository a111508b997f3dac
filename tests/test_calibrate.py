"""Certified calibration: the returned sigma meets the target, and a sigma just below
it provably does not (so the answer is within tol of the true optimum)."""
from __future__ import annotations

import pytest

import pldlib
from pldlib.calibrate import calibrate, get_noise_multiplier


@pytest.mark.parametrize("eps,delta,q,steps,sampling,relation", [
    (1.0, 1e-5, 1.0, 1, "poisson", "add_remove"),
    (2.0, 1e-6, 1.0, 100, "poisson", "substitution"),
    (3.0, 1e-5, 0.02, 500, "poisson", "add_remove"),
    (4.0, 1e-5, 0.05, 200, "wor", "add_remove"),
])
def test_calibrated_sigma_is_certified_and_tight(eps, delta, q, steps, sampling, relation):
    tol = 2e-3
    r = calibrate(eps, delta, q, steps, sampling=sampling, relation=relation, tol=tol)
    samp = "none" if q == 1.0 else sampling
    mech = lambda s: pldlib.Gaussian(sigma=s, q=q, sampling=samp, relation=relation)
    # independent re-check at a finer accuracy than the search used
    up = pldlib.account(mech(r.sigma), steps=steps, spacing=r.spacing / 2).epsilon(delta)
    assert up.upper <= eps
    assert r.sigma_lower is not None and r.sigma / r.sigma_lower <= 1 + tol + 1e-12
    lo = pldlib.account(mech(r.sigma_lower), steps=steps, spacing=r.spacing / 2).epsilon(delta)
    assert lo.lower > eps  # the true optimum lies in (sigma_lower, sigma]


def test_opacus_style_helper():
    s1 = get_noise_multiplier(target_epsilon=3.0, target_delta=1e-5, sample_rate=0.02, steps=500)
    s2 = get_noise_multiplier(target_epsilon=3.0, target_delta=1e-5, sample_rate=0.02, epochs=10)
    assert s1 == pytest.approx(s2, rel=1e-12)


@pytest.mark.parametrize("kwargs,name", [
    (dict(epsilon=0.0, delta=1e-5, steps=10), "epsilon"),
    (dict(epsilon=-1.0, delta=1e-5, steps=10), "epsilon"),
    (dict(epsilon=1.0, delta=0.0, steps=10), "delta"),
    (dict(epsilon=1.0, delta=1.0, steps=10), "delta"),
    (dict(epsilon=1.0, delta=1e-5, q=1.5, steps=10), "q"),
    (dict(epsilon=1.0, delta=1e-5, steps=0), "steps"),
    (dict(epsilon=1.0, delta=1e-5, steps=10, relation="sideways"), "relation"),
])
def test_bad_queries(kwargs, name):
    with pytest.raises(ValueError, match=name):
        calibrate(**kwargs)


def _bisect_to_convergence(eps, delta, q, steps, sampling, relation, h, lo, hi, iters=14):
    """Plain bisection on 'certified upper <= target' at a fixed grid spacing h."""
    samp = "none" if q == 1.0 else sampling
    ok = lambda s: pldlib.account(pldlib.Gaussian(sigma=s, q=q, sampling=samp, relation=relation),
                                  steps=steps, spacing=h).epsilon(delta).upper <= eps
    assert ok(hi) and not ok(lo)
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


@pytest.mark.parametrize("eps,delta,q,steps,sampling,relation", [
    (3.0, 1e-5, 0.02, 500, "poisson", "add_remove"),
    (2.0, 1e-6, 0.05, 100, "poisson", "substitution"),
    (4.0, 1e-5, 0.05, 200, "wor", "add_remove"),
    (4.0, 1e-5, 0.02, 100, "wor", "substitution"),
    (4.0, 1e-6, 2e-4, 10_000, "poisson", "add_remove"),  # tiny q: upper-bound grid rule
])
def test_calibrated_sigma_matches_bisection_to_convergence(eps, delta, q, steps, sampling, relation):
    tol = 2e-3
    r = calibrate(eps, delta, q, steps, sampling=sampling, relation=relation, tol=tol)
    h = r.spacing
    s_b = _bisect_to_convergence(eps, delta, q, steps, sampling, relation, h, r.sigma / 1.2, r.sigma * 1.05)
    # the calibrated sigma is certified at h, so it cannot be below the bisection root at h
    assert r.sigma >= s_b * (1 - 1e-4)
    assert r.sigma <= s_b * (1 + tol)


@pytest.mark.parametrize("sampling,relation", [("poisson", "add_remove"), ("wor", "substitution")])
def test_without_infeasibility_certificate(sampling, relation):
    """certify_lower=False steers with upper-only evaluations: the sigma is still certified
    (independent full re-check), the reported interval is a valid certified interval at that
    sigma, and the sigma lies within tol of the root of the upper curve at the search's h."""
    eps, delta, q, steps, tol = 3.0, 1e-5, 0.02, 500, 1e-4
    r = calibrate(eps, delta, q, steps, sampling=sampling, relation=relation, tol=tol, certify_lower=False)
    mech = lambda s: pldlib.Gaussian(sigma=s, q=q, sampling=sampling, relation=relation)
    full = pldlib.account(mech(r.sigma), steps=steps, spacing=r.spacing).epsilon(delta)
    assert full.upper <= eps and r.epsilon.upper <= eps
    # same h: the same connect-the-dots curve, composed on two windows (an upper-only composition
    # starts its window near the answer, docs/MATH.md 4.3): equal up to round-off, and never below
    # the certified lower bound
    assert r.epsilon.upper == pytest.approx(full.upper, rel=1e-9)
    assert r.epsilon.upper >= full.lower
    assert -1e300 < r.epsilon.lower <= full.upper
    assert r.epsilon.lower <= pldlib.account(mech(r.sigma), steps=steps, spacing=r.spacing / 2).epsilon(delta).upper
    s_b = _bisect_to_convergence(eps, delta, q, steps, sampling, relation, r.spacing, r.sigma / 1.05,
                                 r.sigma * 1.01, iters=20)
    assert s_b * (1 - 1e-9) <= r.sigma <= s_b * (1 + tol)


def test_upper_only_accountant_matches_the_full_upper_bound():
    mech = pldlib.Gaussian(sigma=1.2, q=0.03, sampling="poisson", relation="add_remove")
    full = pldlib.account(mech, steps=300, spacing=2e-3)
    up = pldlib.account(mech, steps=300, spacing=2e-3, lower_bound=False)
    d = [1e-3, 1e-6, 1e-9]
    assert list(up.epsilon(d).upper) == list(full.epsilon(d).upper)
    assert all(x == -float("inf") for x in up.epsilon(d).lower)
    e = [0.5, 1.0, 2.0]
    assert list(up.delta(e).upper) == pytest.approx(list(full.delta(e).upper), rel=1e-12)
    assert all(x == 0.0 for x in up.delta(e).lower)
    with pytest.raises(ValueError, match="lower_bound=False needs an explicit spacing"):
        pldlib.account(mech, steps=300, lower_bound=False)
    with pytest.raises(TypeError, match="lower_bound"):
        pldlib.account(mech, steps=300, spacing=2e-3, lower_bound="no")


def test_opacus_helper_tolerance_accountant_and_certificate():
    kw = dict(target_epsilon=3.0, target_delta=1e-5, sample_rate=0.02, steps=500)
    s = get_noise_multiplier(**kw)
    mech = pldlib.Gaussian(sigma=s, q=0.02, sampling="poisson", relation="add_remove")
    assert pldlib.account(mech, steps=500, spacing=1e-4).epsilon(1e-5).upper <= 3.0
    # a looser epsilon tolerance gives a sigma at least as large (coarser search), never below
    # the certified optimum bracket of the tight one
    s_loose = get_noise_multiplier(**kw, epsilon_tolerance=0.3)  # tol 0.05 -> capped at 1e-3
    assert s_loose == pytest.approx(s, rel=2.1e-3)
    with pytest.raises(ValueError, match="accountant"):
        get_noise_multiplier(**kw, accountant="rdp")
    with pytest.raises(ValueError, match="epsilon_tolerance"):
        get_noise_multiplier(**kw, epsilon_tolerance=0.0)
    with pytest.raises(ValueError, match="steps/epochs"):
        get_noise_multiplier(3.0, 1e-5, 0.02)
