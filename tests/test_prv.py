"""PRV accountant (seed 003, docs/MATH.md section 5): certified (lower, estimate, upper).

Truths used here are independent of the PRV code:
* the Gaussian closed form (k-fold Gaussian = one Gaussian with r = sqrt(k) / sigma;
  heterogeneous Gaussians: r^2 = sum k_m / sigma_m^2), evaluated in mpmath at 40 digits
  and inverted by bisection;
* exact enumeration of the composed loss distribution of finite pairs (randomized
  response, an (eps0, delta0)-DP pair with its +inf atom, a lattice noise under Poisson
  subsampling with its +inf atom);
* the PLD accountant's certified intervals (a different discretisation and error
  analysis): the two certified intervals must intersect.

Tolerances: none.  Soundness checks compare bounds with the truth exactly
(``lower <= truth <= upper``); the truth is computed to ~1e-30 relative, far
below any gap that could matter.
"""
from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib import Interval, PrecisionLimitError
from pldlib.pld.compose import GridTooLargeError
from pldlib.methods.prv import PRVAccountant, account_prv, discretise_prv, mesh_for

mp.mp.dps = 40


# ---------------------------------------------------------------------------- truths

def gauss_delta(eps: float, r: float) -> mp.mpf:
    """delta(eps) of the Gaussian pair with parameter r (docs/MATH.md section 1), in mpmath."""
    e, r = mp.mpf(eps), mp.mpf(r)
    return mp.ncdf(-e / r + r / 2) - mp.exp(e) * mp.ncdf(-e / r - r / 2)


def gauss_eps(delta: float, r: float) -> float:
    """eps(delta) by bisection on the closed form (delta is decreasing in eps)."""
    lo, hi = mp.mpf(-60), mp.mpf(400)
    d = mp.mpf(delta)
    for _ in range(120):
        mid = (lo + hi) / 2
        if gauss_delta(mid, r) > d:
            lo = mid
        else:
            hi = mid
    return float((lo + hi) / 2)


def finite_truth(profiles_counts):
    """Exact delta(.) of the composition of finite pairs, by enumerating the loss sums.

    ``profiles_counts``: list of (FiniteProfile, k).  Losses are merged on a 1e-9 lattice
    only to keep the dictionary small (the pairs used here have exactly representable sums
    to that precision).
    """
    dist = {0.0: 1.0}
    log_fin = 0.0
    for prof, k in profiles_counts:
        for _ in range(k):
            nd = {}
            for l0, p0 in dist.items():
                for l, p in zip(prof.losses, prof.p_masses):
                    key = round(l0 + float(l), 9)
                    nd[key] = nd.get(key, 0.0) + p0 * float(p)
            dist = nd
            log_fin += math.log1p(-prof.p_inf)
    ls = np.array(list(dist.keys()))
    ps = np.array(list(dist.values()))
    p_inf = -math.expm1(log_fin)

    def delta(e):
        return p_inf + float(np.sum(ps * np.maximum(0.0, -np.expm1(np.minimum(e - ls, 700.0)))))

    def eps(d):
        if delta(1e3) > d:
            return math.inf
        lo, hi = -50.0, 1e3
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if delta(mid) > d:
                lo = mid
            else:
                hi = mid
        return hi

    return delta, eps


def brackets(est: Interval, truth) -> bool:
    return bool(np.all(np.asarray(est.lower) <= truth) and np.all(truth <= np.asarray(est.upper)))


# ---------------------------------------------------------------------------- Gaussian

GAUSS_GRID = [
    # (sigma, steps, eps_error, delta_error)
    (1.0, 1, 0.05, 1e-6),
    (1.0, 1, 0.01, 1e-12),
    (3.0, 10, 0.01, 1e-10),
    (3.0, 10, 0.002, 1e-8),
    (20.0, 300, 0.05, 1e-12),
    (20.0, 300, 0.01, 1e-9),
    (60.0, 3000, 0.01, 1e-12),
]


@pytest.mark.parametrize("sigma,steps,eps_error,delta_error", GAUSS_GRID)
def test_gaussian_bounds_bracket_the_closed_form(sigma, steps, eps_error, delta_error):
    acc = account_prv(pldlib.Gaussian(sigma), steps, eps_error=eps_error, delta_error=delta_error)
    r = math.sqrt(steps) / sigma
    deltas = np.array([1e-2, 1e-4, 1e-6, 1e-9])
    deltas = deltas[deltas > 100 * delta_error]
    E = acc.epsilon(deltas)
    truth = np.array([gauss_eps(d, r) for d in deltas])
    assert brackets(E, truth), (E, truth)
    assert np.all(E.lower <= E.estimate) and np.all(E.estimate <= E.upper)
    # the widening is what the mesh was designed for: eps_error on each side at the design
    # point, plus the (small) eps-effect of the delta-error terms
    assert np.all(E.upper - E.lower <= 2.2 * eps_error)
    assert np.all(np.abs(E.estimate - truth) <= eps_error)
    # delta(eps) at eps around the answers and at negative eps
    eps = np.concatenate([truth, [-0.5, 0.0]])
    D = acc.delta(eps)
    dtruth = np.array([float(gauss_delta(e, r)) for e in eps])
    assert brackets(D, dtruth), (D, dtruth)


def test_gaussian_tiny_delta_with_tilting():
    """delta = 1e-12 is read from a tilted composition and stays certified and tight."""
    sigma, steps = 2.0, 100
    acc = account_prv(pldlib.Gaussian(sigma), steps, eps_error=0.01, delta_error=1e-15)
    r = math.sqrt(steps) / sigma
    E = acc.epsilon(1e-12)
    t = gauss_eps(1e-12, r)
    assert E.lower <= t <= E.upper
    assert E.upper - E.lower <= 0.022
    D = acc.delta(t)
    assert D.lower <= float(gauss_delta(t, r)) <= D.upper


def test_tiny_delta_single_step():
    """delta = 1e-16 at k = 1: the float-dominance correction stays relative (no 1e-14 floor)."""
    acc = account_prv(pldlib.Gaussian(1.0), 1, eps_error=0.01, delta_error=1e-20)
    E = acc.epsilon(1e-16)
    t = gauss_eps(1e-16, 1.0)
    assert E.lower <= t <= E.upper and E.upper - E.lower <= 0.025


def test_small_delta_subsampled_matches_pld():
    """delta = 1e-10 after many subsampled steps: tight, and consistent with the PLD interval."""
    mech = pldlib.Gaussian(0.8, q=0.001, sampling="poisson", relation="remove")
    acc = account_prv(mech, 1000, eps_error=0.01, delta_error=1e-13)
    E = acc.epsilon(1e-10)
    I = pldlib.account(mech, 1000).epsilon(1e-10)
    assert _overlap(E.lower, E.upper, I.lower, I.upper), (E, I)
    assert E.upper - E.lower <= 0.022 and abs(E.estimate - 0.5 * (I.lower + I.upper)) < 0.01


def test_heterogeneous_gaussians_match_closed_form():
    """sum of Gaussians with counts k_m and sigma_m = one Gaussian with r^2 = sum k_m / sigma_m^2."""
    comps = [(pldlib.Gaussian(4.0), 30), (pldlib.Gaussian(10.0), 200), (pldlib.Gaussian(2.5), 3)]
    r = math.sqrt(sum(k / m.sigma**2 for m, k in comps))
    acc = account_prv(comps, eps_error=0.01, delta_error=1e-10)
    deltas = np.array([1e-3, 1e-5, 1e-7])
    E = acc.epsilon(deltas)
    truth = np.array([gauss_eps(d, r) for d in deltas])
    assert brackets(E, truth), (E, truth)
    assert np.all(E.upper - E.lower <= 0.022)
    D = acc.delta(np.array([0.5, 1.5]))
    assert brackets(D, np.array([float(gauss_delta(e, r)) for e in (0.5, 1.5)]))


# ---------------------------------------------------------------------------- finite pairs

def test_randomized_response_exact():
    m, k = pldlib.RandomizedResponse(1.0), 20
    delta, eps = finite_truth([(m.branches()[0].upper, k)])
    acc = account_prv(m, k, eps_error=0.01)
    for d in (1e-1, 1e-3, 1e-6):
        assert brackets(acc.epsilon(d), eps(d))
    for e in (-1.0, 0.0, 1.0, 3.0, 19.5):
        assert brackets(acc.delta(e), delta(e))


def test_approx_dp_carries_the_inf_atom_exactly():
    """delta(eps) >= 1 - (1 - delta0)^k for every eps; eps(delta) = inf below that."""
    m, k = pldlib.ApproxDP(0.5, 1e-4), 10
    delta, eps = finite_truth([(m.branches()[0].upper, k)])
    acc = account_prv(m, k, eps_error=0.01)
    p_inf = -math.expm1(10 * math.log1p(-1e-4))
    D = acc.delta(np.array([0.0, 2.0, 4.9, 6.0, 50.0]))
    assert brackets(D, np.array([delta(e) for e in (0.0, 2.0, 4.9, 6.0, 50.0)]))
    assert D.lower[-1] == pytest.approx(p_inf, rel=1e-12) and D.upper[-1] == pytest.approx(p_inf, rel=1e-9)
    E = acc.epsilon(np.array([1e-2, 2e-3, 1e-4]))
    truth = np.array([eps(d) for d in (1e-2, 2e-3, 1e-4)])
    assert brackets(E, truth)
    assert np.isinf(E.lower[-1]) and np.isinf(E.upper[-1])


def test_lattice_noise_poisson_add_remove_exact():
    """Both directions (max after composing), Poisson sampling, an +inf atom in one branch."""
    m = pldlib.LatticeNoise(pmf=(0.1, 0.2, 0.4, 0.2, 0.1), shift=1, q=0.3, sampling="poisson",
                            relation="add_remove")
    k = 6
    truths = [finite_truth([(b.upper, k)]) for b in m.branches()]
    acc = account_prv(m, k, eps_error=0.01)
    for e in (0.0, 0.5, 1.0, 2.0):
        assert brackets(acc.delta(e), max(t[0](e) for t in truths))


# ---------------------------------------------------------------------------- vs the PLD accountant

SUBSAMPLED = [
    pldlib.Gaussian(1.0, q=0.02, sampling="poisson", relation="remove"),
    pldlib.Gaussian(1.0, q=0.02, sampling="poisson", relation="add"),
    pldlib.Gaussian(1.0, q=0.02, sampling="poisson", relation="add_remove"),
    pldlib.Gaussian(1.0, q=0.02, sampling="poisson", relation="substitution"),
    pldlib.Gaussian(2.0, q=0.02, sampling="wor", relation="add_remove"),
    pldlib.Gaussian(2.0, q=0.02, sampling="wor", relation="substitution"),
    pldlib.Laplace(1.0, q=0.05, sampling="poisson", relation="add_remove"),
]


def _overlap(a_lo, a_up, b_lo, b_up):
    return bool(np.all(np.asarray(a_lo) <= np.asarray(b_up)) and np.all(np.asarray(b_lo) <= np.asarray(a_up)))


@pytest.mark.parametrize("mech", SUBSAMPLED, ids=lambda m: f"{type(m).__name__}-{m.sampling}-{m.relation}")
def test_prv_and_pld_intervals_intersect(mech):
    steps = 300
    acc = account_prv(mech, steps, eps_error=0.01)
    pld = pldlib.account(mech, steps)
    deltas = np.array([1e-3, 1e-6])
    E = acc.epsilon(deltas)
    I = pld.epsilon(deltas)
    assert _overlap(E.lower, E.upper, I.lower, I.upper), (E, I)
    eps = np.array([0.5, 1.5, 3.0])
    D = acc.delta(eps)
    J = pld.delta(eps)
    assert _overlap(D.lower, D.upper * (1 + 1e-12), J.lower, J.upper * (1 + 1e-12)), (D, J)


def test_heterogeneous_subsampled_matches_pld():
    comps = [(pldlib.Gaussian(1.0, q=0.01, sampling="poisson", relation="add_remove"), 1000),
             (pldlib.Gaussian(3.0, relation="add_remove"), 10)]
    acc = account_prv(comps, eps_error=0.01)
    pld = pldlib.account(comps)
    E, I = acc.epsilon(1e-5), pld.epsilon(1e-5)
    assert _overlap(E.lower, E.upper, I.lower, I.upper), (E, I)


# ---------------------------------------------------------------------------- accuracy knob

def test_width_shrinks_with_eps_error():
    mech = pldlib.Gaussian(1.0, q=0.01, sampling="poisson", relation="add_remove")
    widths = []
    for ee in (0.05, 0.01, 0.002):
        E = account_prv(mech, 1000, eps_error=ee).epsilon(1e-5)
        widths.append(E.upper - E.lower)
        assert E.upper - E.lower <= 2 * ee
    assert widths[0] > widths[1] > widths[2]


def test_mesh_follows_the_theorem():
    """h ~ eps_error / sqrt(K ln(2/delta_error) / 2): halves with eps_error, / sqrt(4) with 4x steps."""
    h1 = mesh_for(0.01, 1e-10, 1000)
    assert mesh_for(0.005, 1e-10, 1000) == pytest.approx(h1 / 2, rel=1e-3)
    assert mesh_for(0.01, 1e-10, 4000) == pytest.approx(h1 / 2, rel=1e-3)
    assert h1 == pytest.approx(0.01 / math.sqrt(1000 * math.log(2e10) / 2), rel=1e-3)


def test_discretisation_terms_are_small_and_mean_is_kept():
    prof = pldlib.Gaussian(1.0, q=0.01, sampling="poisson", relation="remove").branches()[0].upper
    h = 1e-4
    d = discretise_prv(prof, h, 1e-14)
    assert abs(float(d.pmf.sum()) - 1.0) < 1e-12  # normalised, plus the tiny dominance terms
    assert abs(d.shift) <= h / 2
    assert d.beta <= h * h / 8  # the mean bracket is about h^2/8 wide
    # kappa covers the sf values' relative error, which grows in the tails (value_error: ~6e-14
    # at the 1e-14 truncation, where ndtr is off by up to ~30 ulp), hence ~4x that
    assert d.tau <= 3e-14 and d.kappa < 1e-12 and all(m < 1e-13 for m, _ in d.extra)
    assert d.mass_lo <= float(d.pmf.sum()) <= d.mass_hi
    # the shifted discrete mean is the truncated PRV mean (the KL divergence, up to the
    # 1e-14 truncated tail) to within beta: 0 < KL <= ln E_P[e^L] = ln(1 + q^2 (e^{1/sigma^2} - 1))
    grid = (d.start + np.arange(d.pmf.size)) * h + d.shift
    q, sigma = 0.01, 1.0
    jensen = math.log1p(q * q * math.expm1(1.0 / sigma**2))
    mean = float(np.dot(d.pmf, grid))
    assert 0 < mean <= jensen + d.beta + 1e-12


# ---------------------------------------------------------------------------- API

def test_vectorised_and_scalar_outputs():
    acc = account_prv(pldlib.Gaussian(5.0), 20, eps_error=0.02)
    assert isinstance(acc, PRVAccountant) and acc.method == "prv"
    E = acc.epsilon(1e-5)
    assert isinstance(E, Interval) and all(isinstance(v, float) for v in (*E, E.estimate))
    E2 = acc.epsilon([1e-5, 1e-6])
    assert all(isinstance(v, np.ndarray) and v.shape == (2,) for v in E2)
    assert E2.lower[0] == pytest.approx(E.lower, abs=1e-6) and E2.upper[0] == pytest.approx(E.upper, abs=1e-6)
    D = acc.delta(np.array([0.1, 1.0, 2.0]))
    assert D.lower.shape == (3,) and np.all(np.diff(D.upper) < 0)
    assert isinstance(acc.delta(1.0).upper, float)
    budget = acc.error_budget()
    assert budget and budget[0]["eps_widening_t"] <= 0.02


@pytest.mark.parametrize("kwargs,match", [
    ({"eps_error": 0.0}, "eps_error"),
    ({"eps_error": -1.0}, "eps_error"),
    ({"eps_error": float("nan")}, "eps_error"),
    ({"delta_error": 0.0}, "delta_error"),
    ({"delta_error": 1.5}, "delta_error"),
    ({"max_bins": 3}, "max_bins"),
    ({"max_bins": 1e6}, "max_bins"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        account_prv(pldlib.Gaussian(1.0), 10, **kwargs)


def test_bad_queries_and_mechanisms():
    with pytest.raises((ValueError, TypeError), match="eps_error"):
        account_prv(pldlib.Gaussian(1.0), 10, eps_error=True)
    with pytest.raises(ValueError, match="steps"):
        account_prv(pldlib.Gaussian(1.0), 0)
    with pytest.raises(TypeError, match="mechanism"):
        account_prv("gaussian")
    with pytest.raises(ValueError, match="relation"):
        account_prv([(pldlib.Gaussian(1.0, relation="add"), 3), (pldlib.Gaussian(1.0, relation="remove"), 3)])
    acc = account_prv(pldlib.Gaussian(2.0), 5, eps_error=0.05)
    with pytest.raises(ValueError, match="delta"):
        acc.epsilon(0.0)
    with pytest.raises(ValueError, match="delta"):
        acc.epsilon([1e-5, 1.0])
    with pytest.raises(ValueError, match="epsilon"):
        acc.delta(float("nan"))


def test_precision_limits_are_refused_with_the_limit_named():
    # the truncation budget (delta_error / 4) exceeds the queried delta: not certifiable
    acc = account_prv(pldlib.Gaussian(2.0), 10, eps_error=0.05, delta_error=0.2)
    with pytest.raises(PrecisionLimitError, match="delta_error"):
        acc.epsilon(1e-4)
    # a mesh too fine for the bin cap
    with pytest.raises(GridTooLargeError, match="eps_error"):
        account_prv(pldlib.Gaussian(1.0), 100, eps_error=1e-4, max_bins=10_000)
