"""CGFs of single-step privacy losses (pldlib.cgf) against independent computations.

* the plain Gaussian closed form, and the output-space quadrature engine fed the
  same pair as a one-component "mixture";
* direct scipy quadrature of E_P[L^m e^{tL}] written from the densities (a
  different formula and a different integrator) for subsampled Gaussian and
  Laplace, every relation;
* finite differences of K, K', K'', K''';
* the identity K(-1) = ln E_P[e^{-L}] = ln Q(L > -inf) = 0;
* the WOR-substitution max-profile against integration by parts over its own
  survival function (the generic route through sf/cdf);
* finite pairs in closed form, composition by summation.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from pldlib import ApproxDP, Gaussian, Laplace, RandomizedResponse
from pldlib.methods.cgf import (
    ComposedCGF,
    chernoff_lower_delta,
    FiniteCGF,
    GaussianCGF,
    MaxProfileCGF,
    MixtureCGF,
    _MixSpec,
    mechanism_cgfs,
    profile_cgf,
)
from pldlib.profiles.base import GaussianProfile

T_VALUES = np.array([1e-3, 0.2, 1.0, 3.0, 10.0, 40.0])

# scipy.quad sometimes reports round-off at epsrel=1e-13 on the reference side; the comparisons decide
pytestmark = pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")


def _direct_moments(mech, t, order=4):
    """E_P[L^m e^{tL}] / E_P[e^{tL}] and ln E_P[e^{tL}] by scipy.quad from the densities.

    Independent of pldlib.cgf: the pair is rebuilt here from docs/MATH.md section 2
    (densities written out by hand, loss = ln p - ln q with logaddexp).
    """
    s_or_b = mech.sigma if isinstance(mech, Gaussian) else mech.scale
    D = (2.0 if mech.sampling == "wor" else 1.0) * (1.0 if isinstance(mech, Gaussian) else mech.sensitivity)
    q = mech.q
    gauss = isinstance(mech, Gaussian)

    def logpdf(x, c):
        if gauss:
            return -0.5 * ((x - c) / s_or_b) ** 2 - math.log(s_or_b * math.sqrt(2 * math.pi))
        return -abs(x - c) / s_or_b - math.log(2 * s_or_b)

    def mix(x, comps):
        vals = [math.log(w) + logpdf(x, c) for w, c in comps if w > 0]
        m = max(vals)
        return m + math.log(sum(math.exp(v - m) for v in vals))

    rel = mech.relation
    rem_p, rem_q = [(1 - q, 0.0), (q, D)], [(1.0, 0.0)]
    if rel == "remove":
        P, Q = rem_p, rem_q
    elif rel == "add":
        P, Q = rem_q, rem_p
    else:  # Poisson substitution
        P, Q = [(1 - q, 0.0), (q, D)], [(1 - q, 0.0), (q, -D)]

    def loss(x):
        return mix(x, P) - mix(x, Q)

    # locate the bulk of the tilted integrand to give quad its breakpoints
    xs = np.linspace(-40 * s_or_b - 2 * t * D, 40 * s_or_b + 2 * t * D, 20001)
    f = np.array([mix(x, P) + t * loss(x) for x in xs])
    top = f.max()
    keep = xs[f > top - 80]
    a, b = keep[0] - s_or_b, keep[-1] + s_or_b
    pts = sorted({a, b, *[c for _, c in P + Q if a < c < b], *np.linspace(a, b, 30)[1:-1]})

    def integ(fn):
        tot = 0.0
        for lo, hi in zip(pts[:-1], pts[1:]):
            tot += integrate.quad(fn, lo, hi, epsabs=0, epsrel=1e-13, limit=200)[0]
        return tot

    m0 = integ(lambda x: math.exp(mix(x, P) + t * loss(x) - top))
    mean = integ(lambda x: loss(x) * math.exp(mix(x, P) + t * loss(x) - top)) / m0
    cm = [integ(lambda x, k=k: (loss(x) - mean) ** k * math.exp(mix(x, P) + t * loss(x) - top)) / m0
          for k in (2, 3, 4)]
    return np.array([top + math.log(m0), mean, cm[0], cm[1], cm[2] - 3 * cm[0] ** 2])


def test_gaussian_closed_form_and_quadrature_engine_agree():
    sigma = 0.7
    exact = GaussianCGF(1 / sigma).cumulants(T_VALUES)
    r2 = 1 / sigma**2
    np.testing.assert_allclose(exact[0], r2 * T_VALUES * (T_VALUES + 1) / 2, rtol=1e-15)
    # the quadrature engine on the same pair: P = N(1, s^2), Q = N(0, s^2)
    quad = MixtureCGF(spec=_MixSpec("gauss", sigma, [1.0], [1.0], [1.0], [0.0])).cumulants(T_VALUES)
    np.testing.assert_allclose(quad[0], exact[0], rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(quad[1], exact[1], rtol=1e-12)
    np.testing.assert_allclose(quad[2], exact[2], rtol=1e-10)
    np.testing.assert_allclose(quad[3] / exact[2] ** 1.5, 0.0, atol=1e-10)
    np.testing.assert_allclose(quad[4] / exact[2] ** 2, 0.0, atol=1e-9)
    np.testing.assert_allclose(quad[5], exact[5], rtol=1e-6)  # |d|^3 has a kink: slower convergence
    assert exact[5][0] == pytest.approx(2 * math.sqrt(2 / math.pi) / sigma**3)


def test_plain_laplace_closed_form():
    a = 1.3
    cgf = mechanism_cgfs(Laplace(scale=1 / a))[0][1]
    t = np.array([1e-3, 0.5, 2.0, 20.0])
    # atoms e^{ta}/2 at a, e^{-a(1+t)}/2 at -a, density e^{(l-a)/2}/4 on (-a, a)
    M = (np.exp(t * a) / 2 + np.exp(-a * (1 + t)) / 2
         + np.exp(-a / 2) / (4 * (t + 0.5)) * (np.exp((t + 0.5) * a) - np.exp(-(t + 0.5) * a)))
    np.testing.assert_allclose(cgf.K(t), np.log(M), rtol=1e-11)
    assert cgf.loss_sup == pytest.approx(a)


MIXTURES = [
    Gaussian(sigma=0.8, q=0.01, sampling="poisson", relation="remove"),
    Gaussian(sigma=0.8, q=0.01, sampling="poisson", relation="add"),
    Gaussian(sigma=1.5, q=0.2, sampling="poisson", relation="substitution"),
    Gaussian(sigma=1.0, q=0.05, sampling="wor", relation="remove"),
    Laplace(scale=1.0, q=0.1, sampling="poisson", relation="remove"),
    Laplace(scale=0.5, q=0.1, sampling="poisson", relation="add"),
    Laplace(scale=2.0, q=0.3, sampling="poisson", relation="substitution"),
]


@pytest.mark.parametrize("mech", MIXTURES, ids=lambda m: f"{type(m).__name__}-{m.sampling}-{m.relation}")
def test_subsampled_cgf_matches_direct_quadrature(mech):
    (label, cgf, _), = mechanism_cgfs(mech)
    for t in (0.5, 4.0, 15.0):
        got = cgf.cumulants(t)
        ref = _direct_moments(mech, t)
        assert got[0] == pytest.approx(ref[0], rel=1e-9, abs=1e-13)
        assert got[1] == pytest.approx(ref[1], rel=1e-9, abs=1e-13)
        assert got[2] == pytest.approx(ref[2], rel=1e-8)
        scale = ref[2] ** 1.5
        assert got[3] == pytest.approx(ref[3], rel=1e-6, abs=1e-8 * scale)
        assert got[4] == pytest.approx(ref[4], rel=1e-6, abs=1e-8 * ref[2] ** 2)


@pytest.mark.parametrize("mech", MIXTURES + [
    Gaussian(sigma=1.0, q=0.02, sampling="wor", relation="substitution"),
    Laplace(scale=1.0, q=0.1, sampling="wor", relation="substitution"),
], ids=lambda m: f"{type(m).__name__}-{m.sampling}-{m.relation}")
def test_k_at_minus_one_is_zero_and_derivatives_match_finite_differences(mech):
    for _, cgf, _ in mechanism_cgfs(mech):
        # E_P[e^{-L}] = Q(P > 0) = 1 for these mutually absolutely continuous pairs
        assert abs(cgf.K(-1.0)) < 1e-12
        for t in (0.3, 2.0, 8.0):
            h = 1e-3 * max(t, 1.0)
            c = cgf.cumulants(np.array([t - 2 * h, t - h, t, t + h, t + 2 * h]))
            for m in range(4):  # derivative of cumulant m is cumulant m+1 (5-point stencil)
                fd = (c[m, 0] - 8 * c[m, 1] + 8 * c[m, 3] - c[m, 4]) / (12 * h)
                tol = 1e-5 * (abs(c[m + 1, 2]) + 1e-3 * c[2, 2] ** ((m + 1) / 2) + 1e-12)
                assert abs(fd - c[m + 1, 2]) <= tol, (m, t, fd, c[m + 1, 2])
            assert c[2, 2] > 0 and c[5, 2] >= c[2, 2] ** 1.5 * 0  # variance positive, rho >= 0


@pytest.mark.parametrize("mech", [
    Gaussian(sigma=1.0, q=0.02, sampling="wor", relation="substitution"),
    Gaussian(sigma=0.7, q=0.1, sampling="wor", relation="substitution"),
    Laplace(scale=1.0, q=0.1, sampling="wor", relation="substitution"),
], ids=lambda m: f"{type(m).__name__}-{m.sigma if hasattr(m, 'sigma') else m.scale}")
def test_max_profile_cgf_matches_integration_by_parts_over_its_sf(mech):
    """E[e^{tL}] = 1 + int_0^inf t e^{tl} P(L > l) dl - int_-inf^0 t e^{tl} P(L <= l) dl (sf/cdf route)."""
    (_, cgf, lower), = mechanism_cgfs(mech)
    assert isinstance(cgf, MaxProfileCGF) and not isinstance(lower, MaxProfileCGF)
    prof = mech.branches()[0].upper
    lo, hi = prof.eps_bounds(1e-60)  # the tilt makes the far right tail count
    cuts = sorted({0.0, *[e for e, _ in cgf.atoms], *np.linspace(lo, hi, 41)})
    for t in (0.5, 2.0):
        def right(l):
            return t * math.exp(t * l) * float(prof.sf_p(l))

        def left(l):
            return t * math.exp(t * l) * float(prof.cdf_p(l))

        r_pts = [c for c in cuts if 0.0 <= c <= hi]
        l_pts = [c for c in cuts if lo <= c <= 0.0]
        R = sum(integrate.quad(right, a, b, epsabs=0, epsrel=1e-12, limit=400)[0]
                for a, b in zip(r_pts[:-1], r_pts[1:]))
        L = sum(integrate.quad(left, a, b, epsabs=0, epsrel=1e-12, limit=400)[0]
                for a, b in zip(l_pts[:-1], l_pts[1:]))
        M = 1.0 + R - L
        assert cgf.K(t) == pytest.approx(math.log(M), rel=1e-9, abs=1e-12)


def test_finite_pairs_closed_form_and_infinite_atom():
    eps0 = 0.7
    cgf = mechanism_cgfs(RandomizedResponse(eps0=eps0))[0][1]
    p = math.exp(eps0) / (1 + math.exp(eps0))
    t = np.array([-1.0, 0.1, 2.0, 30.0])
    np.testing.assert_allclose(cgf.K(t), np.log(p * np.exp(t * eps0) + (1 - p) * np.exp(-t * eps0)),
                               rtol=1e-13, atol=1e-15)
    # (eps0, delta0)-DP: the CGF is that of L given L < inf; p_inf is carried separately
    c2 = mechanism_cgfs(ApproxDP(eps0=eps0, delta0=0.01))[0][1]
    assert c2.p_inf == 0.01
    np.testing.assert_allclose(c2.K(t), cgf.K(t), rtol=1e-12, atol=1e-15)


def test_composition_sums_and_unsupported_profiles():
    a = GaussianCGF(1.0)
    b = mechanism_cgfs(Gaussian(sigma=1.0, q=0.1, sampling="poisson", relation="remove"))[0][1]
    comp = ComposedCGF([(a, 3), (b, 1000)])
    t = np.array([0.5, 2.0])
    np.testing.assert_allclose(comp.cumulants(t), 3 * a.cumulants(t) + 1000 * b.cumulants(t), rtol=1e-15)
    assert comp.loss_sup == math.inf
    with pytest.raises(NotImplementedError, match="no CGF"):
        profile_cgf(GaussianProfile(1.0).reversed())
    assert isinstance(profile_cgf(GaussianProfile(2.0)), GaussianCGF)
    fc = FiniteCGF([0.1, -0.1], [0.6, 0.4])
    assert np.shape(fc.K(1.0)) == () and fc.cumulants(np.ones((2, 3))).shape == (7, 2, 3)


# -- the Chernoff lower bound on delta (near 1) ------------------------------------------------
def _gaussian_delta(mu, eps):
    import mpmath as mp

    with mp.workdps(40):
        mu, eps = mp.mpf(mu), mp.mpf(eps)
        return mp.ncdf(-eps / mu + mu / 2) - mp.exp(eps) * mp.ncdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("mu,eps", [(0.3, 0.1), (1.0, 0.5), (5.0, 1.0), (10.0, 5.0), (20.0, 5.0), (40.0, 100.0),
                                    (3.0, -1.0)])
def test_chernoff_lower_bound_is_below_the_gaussian_closed_form_and_tight_near_one(mu, eps):
    lb = chernoff_lower_delta([(GaussianCGF(mu), 1)], [eps])[0]
    truth = _gaussian_delta(mu, eps)
    assert 0.0 <= lb <= truth
    if 1 - truth < 1e-3:  # (where it is meant to serve: 1 - lb within 10x of 1 - delta, or at round-off)
        assert 1 - lb <= max(10 * float(1 - truth), 2e-15), (lb, truth)


@pytest.mark.parametrize("eps0,k,eps", [(0.5, 100, 2.0), (0.1, 1000, 1.0), (1.0, 50, 5.0), (2.0, 20, 3.0)])
def test_chernoff_lower_bound_is_below_exact_randomized_response(eps0, k, eps):
    from pldlib.testing.robust_truths import rr_delta

    (_, _, lo), = mechanism_cgfs(RandomizedResponse(eps0))
    lb = chernoff_lower_delta([(lo, k)], [eps])[0]
    truth = rr_delta(eps0, k, eps)[0]  # (the binomial sum at 60 digits)
    assert 0.5 < lb <= truth
    assert 1 - lb <= 10 * float(1 - truth)


@pytest.mark.parametrize("direction", ["add", "remove"])
def test_chernoff_lower_bound_is_below_the_subsampled_gaussian_reference(direction):
    from pldlib.testing.truth import delta_gaussian

    (_, _, lo), = mechanism_cgfs(Gaussian(0.8, q=0.1, sampling="poisson", relation=direction))
    lb = chernoff_lower_delta([(lo, 5000)], [3.0])[0]
    truth = delta_gaussian(3.0, 0.8, 5000, q=0.1, direction=direction, dps=30)  # (mpmath contour integral)
    assert 0.99 < lb <= truth
    assert 1 - lb <= 20 * float(1 - truth)
