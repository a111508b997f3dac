"""SPA edges (issue 39): lattice losses (randomized response, (eps0, delta0)-DP) whose tilted law
degenerates at large tilts, k * ess sup L as a rounded number, and the cost of max_tpr.

Truths are written here: exact binomial sums of randomized response at 50 digits (mpmath), and
the Neyman-Pearson power of one subsampled-Gaussian step by mpmath root finding.
"""
import math
import time

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib._validate import PrecisionLimitError


def rr_delta(eps0, k, eps):
    """delta(eps) of k-fold randomized response (the double eps0), exact at 50 digits:
    sum_j C(k,j) p^j (1-p)^(k-j) (1 - e^(eps - l_j))_+, l_j = (2j - k) eps0, p = e^eps0/(1+e^eps0)."""
    with mp.workdps(50):
        e0, e = mp.mpf(eps0), mp.mpf(eps)
        p = 1 / (1 + mp.exp(-e0))
        tot = mp.mpf(0)
        for j in range(k + 1):
            lj = (2 * j - k) * e0
            if lj > e:
                tot += mp.binomial(k, j) * p**j * (1 - p) ** (k - j) * -mp.expm1(e - lj)
        return tot


def assert_delta_interval(lo, up, truth):
    assert math.isfinite(lo) and math.isfinite(up), (lo, up)
    assert lo <= truth * (1 + 1e-9) + 1e-300, (lo, truth)
    assert up >= truth * (1 - 1e-9), (up, truth)


def assert_eps_interval(eps0, k, delta, lo, up):
    """lo <= eps(delta) <= up  <=>  delta(up) <= delta <= delta(lo) (delta decreasing)."""
    assert not (math.isnan(lo) or math.isnan(up)), (lo, up)
    assert lo <= up
    if math.isfinite(up):
        assert rr_delta(eps0, k, up) <= delta * (1 + 1e-9), (up, delta)
    if math.isfinite(lo):
        assert rr_delta(eps0, k, lo) >= delta * (1 - 1e-9), (lo, delta)


@pytest.mark.parametrize("relation,eps0,k,delta", [
    ("add_remove", 4.677288257964045, 2, 0.000283180261310645),
    ("substitution", 2.3, 221, 6.557347211533989e-12),
])
def test_rr_epsilon_reproducers_not_nan(relation, eps0, k, delta):
    acc = pldlib.make_accountant("spa", relation).compose(E.RandomizedResponseEvent(eps0), k)
    try:
        r = acc.epsilon(delta)
    except PrecisionLimitError:
        r, _ = acc.epsilon(delta, return_flags=True)
    else:
        assert not math.isnan(r.estimate)
    assert_eps_interval(eps0, k, delta, r.lower, r.upper)
    # the upper end is the Chernoff bound: informative, not the trivial k * eps0
    assert r.upper < k * eps0


@pytest.mark.parametrize("eps0", [1e-3, 0.05, 1.0, 4.677288257964045, 30.0, 50.0])
@pytest.mark.parametrize("k", [1, 2, 10, 221])
def test_rr_grid_sound_and_never_nan(eps0, k):
    acc = pldlib.make_accountant("spa", "add_remove").compose(E.RandomizedResponseEvent(eps0), k)
    eps = np.array([0.0, 0.5 * eps0, eps0, 1.0, k * eps0])  # k * eps0: the (rounded) loss supremum
    r, _ = acc.delta(eps, return_flags=True)
    for i, e in enumerate(eps):
        assert_delta_interval(r.lower[i], r.upper[i], rr_delta(eps0, k, e))
    deltas = np.array([0.5, 1e-3, 1e-6, 6.557347211533989e-12, 1e-30])
    r, _ = acc.epsilon(deltas, return_flags=True)
    for i, d in enumerate(deltas):
        assert_eps_interval(eps0, k, d, r.lower[i], r.upper[i])
    # the default path either answers with numbers or refuses with the documented error
    for call, x in ((acc.delta, 1.0), (acc.epsilon, 1e-6)):
        try:
            v = call(x)
        except PrecisionLimitError as err:
            assert "certified bounds" in str(err)
        else:
            assert not any(math.isnan(z) for z in v)


def test_rr_single_step_at_the_top_atom_was_nan():
    # eps just below the single atom eps0 = 30: the tilted variance underflows to 0 at large t
    r, _ = pldlib.make_accountant("spa", "add_remove").compose(E.RandomizedResponseEvent(30.0), 1).delta(
        29.97, return_flags=True)
    assert_delta_interval(r.lower, r.upper, rr_delta(30.0, 1, 29.97))


def test_rounded_loss_supremum_is_not_a_zero_delta():
    # 10 * 0.05 rounds to 0.5 below the true supremum 10 * (double 0.05): delta(0.5) > 0 there,
    # so eps(1e-30) must not be reported as <= 0.5
    eps0, k = 0.05, 10
    assert rr_delta(eps0, k, k * eps0) > 1e-25
    acc = pldlib.make_accountant("spa", "add_remove").compose(E.RandomizedResponseEvent(eps0), k)
    r, _ = acc.epsilon(1e-30, return_flags=True)
    assert_eps_interval(eps0, k, 1e-30, r.lower, r.upper)
    r, _ = acc.delta(k * eps0, return_flags=True)
    assert_delta_interval(r.lower, r.upper, rr_delta(eps0, k, k * eps0))


@pytest.mark.parametrize("eps0,delta0,k", [(1.0, 1e-6, 5), (4.6, 1e-3, 2), (20.0, 1e-8, 3)])
def test_approx_dp_composed(eps0, delta0, k):
    # (eps0, delta0) worst-case pair: delta_k(eps) = 1 - (1 - delta0)^k (1 - delta_RR,k(eps))
    acc = pldlib.make_accountant("spa", "add_remove").compose(E.ApproxDPEvent(eps0, delta0), k)
    for e in (0.0, 0.5 * eps0, eps0, 2.5 * eps0):
        r, _ = acc.delta(e, return_flags=True)
        with mp.workdps(50):
            keep = (1 - mp.mpf(delta0)) ** k
            truth = 1 - keep + keep * rr_delta(eps0, k, e)
        assert_delta_interval(r.lower, r.upper, truth)


@pytest.mark.parametrize("scale", [0.02, 0.5, 30.0])
def test_laplace_single_step(scale):
    # Laplace(b), sensitivity 1, a = 1/b: delta(eps) = 1 - e^((eps - a)/2) on [0, a], 0 beyond
    a = 1.0 / scale
    acc = pldlib.make_accountant("spa", "add_remove").compose(E.LaplaceEvent(scale), 1)
    eps = np.array([0.0, 0.3 * a, 0.999 * a, a])
    r, _ = acc.delta(eps, return_flags=True)
    for i, e in enumerate(eps):
        with mp.workdps(50):
            truth = -mp.expm1((mp.mpf(e) - 1 / mp.mpf(scale)) / 2) if e < a else mp.mpf(0)
        assert_delta_interval(r.lower[i], r.upper[i], truth)


def test_degenerate_tilted_moments_certify_nothing():
    from pldlib.methods.spa import SPAAccountant, _Table, C_BE_IID

    t = np.array([1.0, 2.0, 3.0])
    cum = np.zeros((7, 3))
    cum[2] = [1.0, 0.0, 1e-300]  # K2: fine, underflowed, subnormal-ish
    cum[5] = [1.0, 0.0, 1e-320]  # rho
    tab = _Table(t, cum, 0.0, math.inf, C_BE_IID, 0.0)
    err = SPAAccountant()._be_log_err(tab, np.ones(1), np.array([[0, 1, 2]]))
    assert np.isfinite(err[0, 0]) and err[0, 1] == np.inf and err[0, 2] == np.inf


def wor_add_power(sigma, q, alpha):
    """Exact power of one WOR-subsampled Gaussian step, add relation: the Poisson add pair at
    s = sigma / 2, P = N(0, s^2), Q = (1-q) N(0, s^2) + q N(1, s^2); reject x < c with
    Q(x < c) = alpha, power P(x < c) (Neyman-Pearson, L decreasing in x)."""
    with mp.workdps(40):
        s, q, a = mp.mpf(sigma) / 2, mp.mpf(q), mp.mpf(alpha)
        c = mp.findroot(lambda c: (1 - q) * mp.ncdf(c / s) + q * mp.ncdf((c - 1) / s) - a,
                        s * mp.sqrt(2) * mp.erfinv(2 * a - 1))
        return mp.ncdf(c / s)


def test_max_tpr_wor_add_is_fast_and_sound():
    sigma, q, alpha = 0.3956771500736161, 0.0025674597402584477, 0.021994013332259272
    ev = pldlib.Sampled(pldlib.GaussianEvent(sigma=sigma), q=q, sampling="wor")
    t0 = time.perf_counter()
    r = pldlib.make_accountant("spa", "add").compose(ev, 1).max_tpr(alpha)
    took = time.perf_counter() - t0
    truth = wor_add_power(sigma, q, alpha)
    assert r.lower <= truth * (1 + 1e-12) and r.upper >= truth * (1 - 1e-12), (r, truth)
    assert r.upper - r.lower < 1e-3
    assert took < 15.0  # was 11-37 s idle (minutes under load); ~2.5 s now


def test_upper_bound_below_double_range_is_not_claimed_zero():
    """RR(eps0) x k at eps just below k * eps0: the exact delta (60-digit binomial tail, here
    ~1e-349) is positive but below the smallest double; the certified upper end must then be
    the smallest positive double, not 0 (0 only at or beyond the support edge)."""
    import mpmath

    import pldlib
    from pldlib import events as E

    e0, k, eps = 0.15312744789794808, 1527, 224.11887912690787
    mpmath.mp.dps = 60
    E0 = mpmath.mpf(e0)
    p = mpmath.e**E0 / (1 + mpmath.e**E0)
    truth = mpmath.mpf(0)
    for j in range(k, -1, -1):
        loss = (2 * j - k) * E0
        if loss <= eps:
            break
        truth += mpmath.binomial(k, j) * p**j * (1 - p)**(k - j) * (1 - mpmath.e**(eps - loss))
    assert 0 < truth < mpmath.mpf("1e-330")
    acc = pldlib.make_accountant("spa", "add_remove").compose(E.RandomizedResponseEvent(e0), k)
    r = acc.delta(eps)
    assert r.upper > 0 and r.lower <= 5e-324
    edge = float(mpmath.nstr(k * E0, 30)) * (1 + 1e-12)  # beyond the support: exactly 0
    assert acc.delta(edge).upper == 0.0


def test_refinement_stops_within_its_time_and_the_bounds_stay_certified():
    """The CGF grid's refinement is cut where its next level would end after ``refine_seconds``:
    what it did not check is marked unresolved, and the certified ends (nodes only) still meet the
    PLD accountant's interval."""
    from pldlib.methods.spa import SPAAccountant

    ev = E.Sampled(E.GaussianEvent(0.4), 0.05, "poisson")
    full = SPAAccountant("remove", on_edge="flag").compose(ev, 50)
    cut = SPAAccountant("remove", on_edge="flag").compose(ev, 50)
    cut.refine_seconds = 0.0
    full._ensure_built()
    cut._ensure_built()
    assert cut.tgrid.size < full.tgrid.size and cut.unresolved.all()
    ref = pldlib.PLDAccountant("remove").compose(ev, 50).delta([0.5, 2.0, 5.0])
    for acc in (full, cut):
        iv = acc.delta([0.5, 2.0, 5.0])
        assert (iv.lower <= ref.upper * (1 + 1e-9)).all() and (iv.upper >= ref.lower * (1 - 1e-9)).all()
