"""Single-step privacy profiles against independent closed forms (docs/MATH.md sections 0-1).

Every expected value here is computed independently of pldlib: mpmath at 40
digits for the Gaussian and Laplace closed forms (and quadrature of the
densities for Laplace), exact rationals (fractions.Fraction) or direct
enumeration of the output distributions for randomized response and the
(eps0, delta0)-DP pair.
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest

from pldlib.profiles.base import (
    FiniteProfile,
    GaussianProfile,
    LaplaceProfile,
    approx_dp_profile,
    randomized_response_profile,
)

DPS = 40


# ----------------------------------------------------------------------------
# independent truths
# ----------------------------------------------------------------------------
def gauss_delta(r, eps):
    """delta(eps) = Phi(-eps/r + r/2) - e^eps Phi(-eps/r - r/2), at 40 digits."""
    with mp.workdps(DPS):
        r, eps = mp.mpf(r), mp.mpf(eps)
        return mp.ncdf(-eps / r + r / 2) - mp.exp(eps) * mp.ncdf(-eps / r - r / 2)


def laplace_pdf(x, c, b):
    return mp.exp(-abs(x - c) / b) / (2 * b)


def laplace_delta_quad(b, D, eps):
    """int (p(x) - e^eps q(x))_+ dx with p = Lap(0, b), q = Lap(D, b), by quadrature."""
    with mp.workdps(30):
        b, D, eps = mp.mpf(b), mp.mpf(D), mp.mpf(eps)
        f = lambda x: max(mp.mpf(0), laplace_pdf(x, 0, b) - mp.exp(eps) * laplace_pdf(x, D, b))
        pts = [-mp.inf, mp.mpf(0), D, mp.inf]
        xc = (D - b * eps) / 2  # where L(x) = eps inside (0, D)
        if 0 < xc < D:
            pts = [-mp.inf, mp.mpf(0), xc, D, mp.inf]
        return mp.quad(f, pts)


def laplace_cdf(x, c, b):
    x, c, b = mp.mpf(x), mp.mpf(c), mp.mpf(b)
    if x < c:
        return mp.exp((x - c) / b) / 2
    return 1 - mp.exp(-(x - c) / b) / 2


def discrete_delta(P, Q, alpha):
    """sum_o (P(o) - alpha Q(o))_+ for finite distributions (exact for Fractions)."""
    return sum((max(0, p - alpha * q) for p, q in zip(P, Q)), start=0 * alpha)


def _mpf(x):
    """mpf from a float or a Fraction (mpmath < 1.4 does not convert Fractions itself)."""
    if isinstance(x, Fraction):
        return mp.mpf(x.numerator) / x.denominator
    return mp.mpf(x)


def mp_discrete_delta(P, Q, eps):
    with mp.workdps(DPS):
        a = mp.exp(mp.mpf(eps))
        return mp.fsum(max(mp.mpf(0), _mpf(p) - a * _mpf(q)) for p, q in zip(P, Q))


EPS_GRID = np.concatenate([-np.geomspace(30, 1e-3, 25), [0.0], np.geomspace(1e-3, 30, 25)])


# ----------------------------------------------------------------------------
# Gaussian
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [0.1, 0.5, 1.0, 2.0, 5.0, 20.0])
def test_gaussian_delta_matches_closed_form_both_tails(sigma):
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    # cover the bulk and far tails of L ~ N(r^2/2, r^2) under P: z from -30 to +37 sd
    z = np.linspace(-30, 37, 135)
    eps = np.concatenate([r * r / 2 + z * r, EPS_GRID])
    got = prof.delta(eps)
    for e, g in zip(eps, got):
        t = gauss_delta(r, e)
        if t < mp.mpf("1e-300"):
            assert g <= 1e-300
            continue
        # log-space evaluation: relative accuracy, a little worse deep in the tail
        # (cancellation of two log_ndtr values of size z^2/2 amplified by (z+r)/r)
        assert abs(mp.mpf(g) - t) <= 1e-9 * t, (sigma, e, g, t)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 7.0])
def test_gaussian_loss_distribution_functions(sigma):
    """Under P, L ~ N(r^2/2, r^2); under Q, L ~ N(-r^2/2, r^2)."""
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    eps = np.linspace(-35 * r, 35 * r, 141)
    with mp.workdps(DPS):
        for e, sp, sq, cp, cq in zip(eps, prof.sf_p(eps), prof.sf_q(eps), prof.cdf_p(eps), prof.cdf_q(eps)):
            e_ = mp.mpf(e)
            for got, t in [
                (sp, mp.ncdf(-(e_ - r * r / 2) / r)),
                (sq, mp.ncdf(-(e_ + r * r / 2) / r)),
                (cp, mp.ncdf((e_ - r * r / 2) / r)),
                (cq, mp.ncdf((e_ + r * r / 2) / r)),
            ]:
                if t > 1e-300:
                    assert abs(got - t) <= 1e-12 * t, (e, got, t)


@pytest.mark.parametrize("sigma", [0.5, 2.0])
def test_gaussian_derivative_and_loss_identity(sigma):
    """delta'(eps) = -e^eps Q(L > eps) and P(L > eps) = delta - delta' (docs/MATH.md section 0)."""
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    eps = np.linspace(-3, 6, 19) * r
    dprime = prof.delta_prime(eps)
    for e, dp in zip(eps, dprime):
        with mp.workdps(DPS):
            # numerical derivative of the closed form (evaluated at diff's own precision)
            rr = mp.mpf(r)
            t = mp.diff(lambda x: mp.ncdf(-x / rr + rr / 2) - mp.exp(x) * mp.ncdf(-x / rr - rr / 2), mp.mpf(e))
            assert abs(dp - t) <= 1e-11 * abs(t) + 1e-300
            sfp = mp.ncdf(-mp.mpf(e) / r + r / 2)
            assert abs((gauss_delta(r, e) - t) - sfp) <= mp.mpf(10) ** -30
    # the library's own pieces obey the same identity
    np.testing.assert_allclose(prof.delta(eps) - dprime, prof.sf_p(eps), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("sigma", [0.5, 3.0, 20.0])
@pytest.mark.parametrize("tail", [1e-6, 1e-16, 1e-32])
def test_gaussian_eps_bounds_contain_the_mass(sigma, tail):
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    lo, hi = prof.eps_bounds(tail)
    with mp.workdps(DPS):
        assert mp.ncdf((mp.mpf(lo) - r * r / 2) / r) <= tail * (1 + 1e-9)
        assert mp.ncdf(-(mp.mpf(hi) - r * r / 2) / r) <= tail * (1 + 1e-9)


def test_gaussian_sensitivity_does_not_change_the_pair():
    """Noise multiplier sigma: the pair depends only on noise/sensitivity = sigma."""
    a, b = GaussianProfile(1.7), GaussianProfile(1.7, sensitivity=13.0)
    np.testing.assert_array_equal(a.delta(EPS_GRID), b.delta(EPS_GRID))


# ----------------------------------------------------------------------------
# Laplace
# ----------------------------------------------------------------------------
def laplace_closed_form(a, eps):
    """docs/MATH.md section 1 for 0 <= eps <= a, extended to eps < 0 by the reversed-pair
    identity (the Laplace pair is symmetric): 1 - e^{(eps-a)/2} on [-a, a], 1 - e^eps below."""
    eps = mp.mpf(eps)
    if eps >= a:
        return mp.mpf(0)
    if eps >= -a:
        return 1 - mp.exp((eps - a) / 2)
    return 1 - mp.exp(eps)


@pytest.mark.parametrize("scale,sens", [(0.1, 1.0), (0.5, 1.0), (1.0, 1.0), (3.0, 1.0), (10.0, 1.0), (2.0, 3.0)])
def test_laplace_delta_matches_closed_form(scale, sens):
    prof = LaplaceProfile(scale, sensitivity=sens)
    a = sens / scale
    eps = np.concatenate([np.linspace(-1.5 * a, 1.5 * a, 61), [0.0, a, -a, 0.999 * a]])
    got = prof.delta(eps)
    with mp.workdps(DPS):
        for e, g in zip(eps, got):
            t = laplace_closed_form(mp.mpf(a), e)
            assert abs(g - t) <= 1e-14 + 1e-13 * t, (e, g, t)


@pytest.mark.parametrize("scale,sens", [(0.5, 1.0), (1.0, 1.0), (3.0, 2.0)])
def test_laplace_delta_matches_quadrature(scale, sens):
    """The closed form itself against direct integration of the two densities."""
    prof = LaplaceProfile(scale, sensitivity=sens)
    a = sens / scale
    for e in [-1.2 * a, -0.5 * a, -0.1, 0.0, 0.2 * a, 0.5 * a, 0.9 * a, 1.1 * a]:
        t = laplace_delta_quad(scale, sens, e)
        assert abs(float(prof.delta(e)) - t) <= 1e-12, (e, t)


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_laplace_loss_distribution_and_atoms(scale):
    """P(L > eps) via the Laplace CDF at the threshold x = (D - b eps)/2; atoms at +-a."""
    D = 1.0
    prof = LaplaceProfile(scale, sensitivity=D)
    a = D / scale
    for e in np.linspace(-0.95 * a, 0.95 * a, 21):
        xc = (D - scale * e) / 2  # L(x) > eps  <=>  x < xc
        with mp.workdps(DPS):
            assert abs(float(prof.sf_p(e)) - laplace_cdf(xc, 0, scale)) <= 1e-14
            assert abs(float(prof.sf_q(e)) - laplace_cdf(xc, D, scale)) <= 1e-14
            assert abs(float(prof.cdf_p(e)) - (1 - laplace_cdf(xc, 0, scale))) <= 1e-14
            assert abs(float(prof.cdf_q(e)) - (1 - laplace_cdf(xc, D, scale))) <= 1e-14
    below, above = np.nextafter(a, -np.inf), a
    # P(L = a) = P(X <= 0) = 1/2; Q(L = a) = e^{-a}/2; P(L = -a) = e^{-a}/2
    assert float(prof.sf_p(below) - prof.sf_p(above)) == pytest.approx(0.5, abs=1e-12)
    assert float(prof.sf_q(below) - prof.sf_q(above)) == pytest.approx(math.exp(-a) / 2, abs=1e-12)
    assert float(prof.cdf_p(-a)) == pytest.approx(math.exp(-a) / 2, abs=1e-12)
    assert float(prof.sf_p(a)) == 0.0 and float(prof.cdf_p(np.nextafter(-a, -np.inf))) == 0.0


# ----------------------------------------------------------------------------
# Randomized response and (eps0, delta0)-DP
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("eps0", [0.1, 0.5, 1.0, math.log(3), 3.0])
def test_randomized_response_closed_form(eps0):
    prof = randomized_response_profile(eps0)
    got = prof.delta(EPS_GRID)
    e0 = math.exp(eps0)
    p = e0 / (1 + e0)
    for e, g in zip(EPS_GRID, got):
        # enumeration of the two outputs, any eps
        t = mp_discrete_delta([p, 1 - p], [1 - p, p], e)
        assert abs(g - t) <= 1e-14, (e, g, t)
        if e >= 0:  # docs/MATH.md section 1 closed form
            assert abs(g - max(e0 - math.exp(e), 0.0) / (1 + e0)) <= 1e-14


def test_randomized_response_exact_rationals():
    """eps0 = ln 3: p = 3/4, and at alpha = e^eps rational the curve is an exact rational."""
    prof = randomized_response_profile(math.log(3))
    P, Q = [Fraction(3, 4), Fraction(1, 4)], [Fraction(1, 4), Fraction(3, 4)]
    for alpha in [Fraction(1, 3), Fraction(1, 2), Fraction(1), Fraction(3, 2), Fraction(2), Fraction(3), Fraction(5)]:
        exact = discrete_delta(P, Q, alpha)
        assert abs(float(prof.delta(math.log(alpha))) - float(exact)) <= 1e-15
    assert discrete_delta(P, Q, Fraction(1)) == Fraction(1, 2)


@pytest.mark.parametrize("eps0,delta0", [(0.0, 0.1), (0.5, 1e-3), (1.0, 1e-6), (2.0, 0.3), (math.log(3), 0.01)])
def test_approx_dp_profile_closed_form(eps0, delta0):
    """Four outputs: (delta0, 0), ((1-d0) p, (1-d0)(1-p)), ((1-d0)(1-p), (1-d0) p), (0, delta0)."""
    prof = approx_dp_profile(eps0, delta0)
    p = math.exp(eps0) / (1 + math.exp(eps0))
    P = [delta0, (1 - delta0) * p, (1 - delta0) * (1 - p), 0.0]
    Q = [0.0, (1 - delta0) * (1 - p), (1 - delta0) * p, delta0]
    got = prof.delta(EPS_GRID)
    for e, g in zip(EPS_GRID, got):
        t = mp_discrete_delta(P, Q, e)
        assert abs(g - t) <= 1e-14, (e, g, t)
        if e >= 0:
            closed = delta0 + (1 - delta0) * max(math.exp(eps0) - math.exp(e), 0.0) / (1 + math.exp(eps0))
            assert abs(g - closed) <= 1e-14
    assert prof.p_inf == delta0
    # h(inf) = P(L = +inf) = delta0
    assert float(prof.delta(50.0)) == pytest.approx(delta0, abs=1e-15)


# ----------------------------------------------------------------------------
# hockey-stick characterisation of the exact profiles (docs/MATH.md section 0)
# ----------------------------------------------------------------------------
PROFILES = {
    "gauss0.5": GaussianProfile(0.5),
    "gauss4": GaussianProfile(4.0),
    "laplace0.7": LaplaceProfile(0.7),
    "rr1": randomized_response_profile(1.0),
    "adp": approx_dp_profile(0.7, 0.05),
}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_exact_profile_is_a_hockey_stick_curve(name):
    prof = PROFILES[name]
    alpha = np.concatenate([[0.0], np.geomspace(1e-6, 1e4, 3001)])
    with np.errstate(divide="ignore"):
        eps = np.log(alpha)
    d = prof.delta(eps)
    tol = 1e-13
    assert d[0] == pytest.approx(1.0, abs=1e-15)  # h(0) = 1
    assert np.all(np.diff(d) <= tol)  # non-increasing
    assert np.all(d >= np.maximum(0.0, 1.0 - alpha) - tol)
    s = np.diff(d) / np.diff(alpha)
    # convex: slopes non-decreasing, up to round-off of the values over the spacing
    assert np.all(np.diff(s) >= -4 * tol / np.minimum(np.diff(alpha)[:-1], np.diff(alpha)[1:]))


# ----------------------------------------------------------------------------
# reversed pair: delta_{Q||P}(eps) = 1 - e^eps + e^eps delta_{P||Q}(-eps)
# ----------------------------------------------------------------------------
# an asymmetric pair on four outputs, one of which Q cannot produce and one P cannot
ASYM_P = [Fraction(1, 10), Fraction(2, 5), Fraction(3, 10), Fraction(1, 5), Fraction(0)]
ASYM_Q = [Fraction(0), Fraction(1, 10), Fraction(3, 10), Fraction(1, 2), Fraction(1, 10)]


def asym_profile():
    losses = [math.log(p / q) for p, q in zip(ASYM_P, ASYM_Q) if p > 0 and q > 0]
    masses = [float(p) for p, q in zip(ASYM_P, ASYM_Q) if p > 0 and q > 0]
    p_inf = float(sum(p for p, q in zip(ASYM_P, ASYM_Q) if q == 0))
    return FiniteProfile(losses, masses, p_inf=p_inf)


def test_finite_profile_matches_exact_enumeration():
    prof = asym_profile()
    for alpha in [Fraction(1, 7), Fraction(1, 2), Fraction(1), Fraction(4, 3), Fraction(2), Fraction(4), Fraction(9)]:
        exact = discrete_delta(ASYM_P, ASYM_Q, alpha)
        assert abs(float(prof.delta(math.log(alpha))) - float(exact)) <= 1e-15
        exact_rev = discrete_delta(ASYM_Q, ASYM_P, alpha)
        # generic sf_p - e^eps sf_q of the reversed profile: round-off of order alpha * u
        assert abs(float(prof.reversed().delta(math.log(alpha))) - float(exact_rev)) <= 1e-14 * (1 + float(alpha))


@pytest.mark.parametrize(
    "name,reverse_truth",
    [
        # symmetric pairs: the reversed pair is the pair itself
        ("gauss0.5", lambda e: gauss_delta(2.0, e)),
        ("gauss4", lambda e: gauss_delta(0.25, e)),
        ("laplace0.7", lambda e: laplace_closed_form(mp.mpf(1) / mp.mpf(0.7), e)),
        ("asym", lambda e: mp_discrete_delta(ASYM_Q, ASYM_P, e)),
    ],
)
def test_reversed_pair_identity(name, reverse_truth):
    prof = asym_profile() if name == "asym" else PROFILES[name]
    rev = prof.reversed()
    eps = np.concatenate([np.linspace(-4, 4, 41), [-math.log(2), math.log(4 / 3)]])
    got = rev.delta(eps)
    for e, g in zip(eps, got):
        with mp.workdps(DPS):
            truth = reverse_truth(e)
            # the identity, evaluated on the forward closed form / enumeration
            if name == "asym":
                fwd = mp_discrete_delta(ASYM_P, ASYM_Q, -e)
            else:
                fwd = reverse_truth(-e)  # symmetric pair: forward curve = reversed curve
            ident = 1 - mp.exp(e) + mp.exp(e) * fwd
            assert abs(ident - truth) <= mp.mpf(10) ** -25
            # ReversedProfile evaluates sf_p - e^eps sf_q in double precision
            assert abs(g - truth) <= 1e-13 * (1 + math.exp(e)), (name, e, g, truth)


def test_reversed_twice_is_the_original():
    prof = asym_profile()
    rr = prof.reversed().reversed()
    eps = np.linspace(-3, 3, 61)
    np.testing.assert_allclose(rr.delta(eps), prof.delta(eps), atol=1e-14)
    assert rr.p_inf == pytest.approx(prof.p_inf, abs=1e-15)


def test_finite_profile_delta_with_many_atoms_matches_exact_sums():
    # the suffix-sum path (>= DIRECT_ATOMS atoms) against an exactly rounded sum (math.fsum of
    # the atom-by-atom terms), at eps on, just above, just below and NEAR above atoms
    import math

    from pldlib.profiles.base import FiniteProfile

    rng = np.random.default_rng(7)
    n = 5000
    losses = np.sort(rng.normal(0.0, 3.0, n))
    p = rng.random(n)
    p *= 0.999 / p.sum()
    q = p * np.exp(-losses)
    if q.sum() > 1.0:
        p /= q.sum()
    prof = FiniteProfile(losses, p, p_inf=1.0 - p.sum())
    assert prof.losses.size >= FiniteProfile.DIRECT_ATOMS
    eps = np.concatenate([np.linspace(-8, 12, 97), losses[::250], losses[::250] + 1e-12,
                          losses[::250] - 1e-9, losses[::333] + FiniteProfile.NEAR])
    got = prof.delta(eps)
    for e, g in zip(eps, got):
        terms = [pj * -math.expm1(e - lj) for lj, pj in zip(prof.losses, prof.p_masses) if lj > e]
        want = math.fsum(terms + [prof.p_inf])
        assert abs(g - want) <= 8 * 2.0**-53 * want + 1e-300, (e, g, want)


@pytest.mark.parametrize("s", [0.3, 1.0, 7.0])
def test_gaussian_noise_sf_and_cdf_from_one_tail_evaluation(s):
    """GaussianNoise.sf_cdf (the larger side as 1 - the smaller tail) against mpmath's normal tails
    within the value-error model the discretisers use (value_error: 16 ulp for values of order 1,
    growing with |ln v|; ndtr's own tail error grows like z^2 ulp), deep into both tails; and a
    mixture's grid_values (one evaluation per shift) against its four separate functions."""
    import pldlib
    from pldlib.profiles.base import PrivacyProfile, value_error
    from pldlib.profiles.mixtures import GaussianNoise

    noise = GaussianNoise(s, 1.0)
    x = np.concatenate([np.linspace(-39 * s, 39 * s, 2001), [0.0, -0.0, 1e-300, np.inf, -np.inf]])
    sf, cdf = noise.sf_cdf(x)
    mp.mp.dps = 40
    worst = 0.0
    for xi, a, b in zip(x, sf, cdf):
        if not np.isfinite(xi):
            assert (a, b) == ((0.0, 1.0) if xi > 0 else (1.0, 0.0))
            continue
        z = mp.mpf(float(xi)) / s
        for got, want in ((a, mp.ncdf(-z)), (b, mp.ncdf(z))):
            err = abs(mp.mpf(float(got)) - want)
            assert err <= float(value_error(float(got))), (xi, got)
            if want > 1e-290:
                worst = max(worst, float(err / want) / (np.finfo(float).eps / 2))
    assert worst > 16  # (why a constant 16 ulp was not enough: ndtr's tails are further off)
    for rel in ("add", "remove"):
        m = pldlib.Gaussian(sigma=s, q=0.03, sampling="poisson", relation=rel)
        for br in m.branches():
            eps = np.linspace(-0.2, 6.0, 3001)
            for got, sep in zip(br.upper.grid_values(eps), PrivacyProfile.grid_values(br.upper, eps)):
                np.testing.assert_allclose(got, sep, rtol=8 * np.finfo(float).eps, atol=1e-300)


@pytest.mark.parametrize("sigma, q", [(1.0, 0.01), (0.5, 0.3)])
def test_subsampled_gaussian_grid_values_are_within_the_value_error_model(sigma, q):
    """The values connect-the-dots differences (sf/cdf of both sides at loss thresholds, the
    threshold's own rounding included) against mpmath at the exact threshold, far into the tails:
    each within value_error (the model the certified mass errors are built on)."""
    import pldlib
    from pldlib.profiles.base import value_error

    mp.mp.dps = 50
    for rel in ("add", "remove"):
        pr = pldlib.Gaussian(sigma=sigma, q=q, sampling="poisson", relation=rel).branches()[0].upper
        lo, hi = pr.eps_bounds(1e-250)
        eps = np.linspace(max(lo, -30.0), min(hi, 30.0), 27)[1:-1]
        vals = pr.grid_values(eps)
        s, D = mp.mpf(pr.noise.s), mp.mpf(pr.noise.D)
        P = [(mp.mpf(a), mp.mpf(c)) for a, c in zip(pr.pa, pr.pc) if a > 0]
        Q = [(mp.mpf(b), mp.mpf(d)) for b, d in zip(pr.qb, pr.qd) if b > 0]

        def loss(x):  # ln of the density ratio of the unreversed pair (components N(c, s^2))
            def dens(W):
                return mp.log(sum(w * mp.e ** ((2 * x * c - c * c) / (2 * s * s)) for w, c in W))
            return dens(P) - dens(Q)

        for i, e in enumerate(eps):
            target = mp.mpf(-e if pr.reverse else e)
            a, b = mp.mpf(-1000), mp.mpf(1000)
            for _ in range(230):  # bisection: the loss is increasing in x
                mid = (a + b) / 2
                a, b = (a, mid) if loss(mid) > target else (mid, b)
            x = (a + b) / 2
            up = (lambda y: mp.ncdf(y / s)) if pr.reverse else (lambda y: mp.ncdf(-y / s))
            down = (lambda y: mp.ncdf(-y / s)) if pr.reverse else (lambda y: mp.ncdf(y / s))
            Pp, Qq = (Q, P) if pr.reverse else (P, Q)
            exact = [sum(w * f(x - c) for w, c in W) for W, f in ((Pp, up), (Pp, down), (Qq, up), (Qq, down))]
            for k in range(4):
                got = float(vals[k][i])
                assert abs(mp.mpf(got) - exact[k]) <= float(value_error(got)), (rel, e, k, got)


@pytest.mark.parametrize("relation", ["remove", "add"])
@pytest.mark.parametrize("sigma,q", [(0.5, 1e-4), (1.0, 0.01), (2.5, 0.2), (4.0, 0.6)])
@pytest.mark.parametrize("tail", [1e-32, 1e-12, 1e-5])
def test_subsampled_gaussian_eps_bounds_from_the_noise_quantiles_are_tight(sigma, q, relation, tail):
    """The loss range of a Poisson-subsampled Gaussian is found on the noise axis (closed-form
    quantile brackets, then refinement): against 40-digit normal tails at the thresholds, the
    unbounded end holds at most ``tail`` beyond it and at least 0.9 * tail (it is not loose);
    the generic search on the loss axis finds the same end to 1e-6."""
    import pldlib
    from pldlib.profiles.base import PrivacyProfile

    prof = [b for b in pldlib.Gaussian(sigma, q=q, sampling="poisson").branches() if b.label == relation][0].upper
    lo, hi = prof._eps_bounds_search(tail)
    glo, ghi = PrivacyProfile._eps_bounds_search(prof, tail)
    mp.mp.dps = 40
    s, q_ = mp.mpf(sigma), mp.mpf(q)

    def x_of(loss):  # the noise value x with L_remove(x) = loss (g(x) = (2x - 1) / (2 s^2))
        t = mp.log((mp.e ** mp.mpf(loss) - (1 - q_)) / q_)
        return s**2 * t + mp.mpf(1) / 2

    if relation == "remove":  # P = (1-q) N(0, s^2) + q N(1, s^2); {L > e} = {x > x(e)}
        assert lo == -math.inf or lo >= -1e-12  # (bounded below by ln(1-q))
        x = x_of(hi)
        beyond = (1 - q_) * mp.ncdf(-x / s) + q_ * mp.ncdf(-(x - 1) / s)
        g = ghi
        end = hi
    else:  # P = N(0, s^2), L = -L_remove: {L <= e} = {x >= x(-e)}
        x = x_of(-lo)
        beyond = mp.ncdf(-x / s)
        g = glo
        end = lo
    assert beyond <= tail
    assert beyond >= 0.9 * tail, (float(beyond), tail)
    assert abs(end - g) <= 1e-6 * max(1.0, abs(g))


@pytest.mark.parametrize("sigma, q", [(2.54, 0.01), (1.22, 4.3e-4), (0.5, 0.17), (0.8, 0.5)])
def test_mixture_loss_moments_match_quadrature(sigma, q):
    """MixtureProfile.loss_moments (Gauss-Hermite over the noise) against mpmath quadrature of
    the loss under each mixture component, for both directions of Poisson subsampling."""
    from pldlib.profiles.mixtures import GaussianNoise

    noise = GaussianNoise(sigma, 1.0)
    for prof in (noise.remove_pair(q), noise.add_pair(q)):
        mean, var = prof.loss_moments()
        pw, ps, *_ = prof._sides()
        sign = -1.0 if prof.reverse else 1.0

        def L(x):
            return sign * float(prof._loss(np.array([float(x)]))[0])

        with mp.workdps(30):
            m1 = m2 = mp.mpf(0)
            for a, c in zip(pw, ps):
                if a > 0:
                    pts = [-mp.inf, c - 6 * sigma, c, c + 6 * sigma, mp.inf]
                    m1 += a * mp.quad(lambda x: L(x) * mp.npdf(x, c, sigma), pts)
                    m2 += a * mp.quad(lambda x: L(x) ** 2 * mp.npdf(x, c, sigma), pts)
        assert mean == pytest.approx(float(m1), rel=1e-8)
        assert var == pytest.approx(float(m2 - m1**2), rel=1e-8)


def test_loss_moments_absent_without_a_quadrature():
    from pldlib.profiles.mixtures import LaplaceNoise

    assert LaplaceNoise(1.0, 1.0).remove_pair(0.1).loss_moments() is None
    assert GaussianProfile(1.0).loss_moments() is None


def test_one_run_finds_the_true_run_at_an_end_by_enumeration():
    """_one_run (the slice of eps > 0 on a sorted grid) against the definition, on every
    boolean array of up to 9 entries."""
    from pldlib.profiles.mixtures import _one_run

    for n in range(1, 10):
        for bits in range(2**n):
            m = np.array([(bits >> i) & 1 for i in range(n)], dtype=bool)
            idx = np.flatnonzero(m)
            if idx.size == 0:
                want = (0, 0)
            elif idx[-1] + 1 - idx[0] == idx.size and (idx[0] == 0 or idx[-1] == n - 1):
                want = (int(idx[0]), int(idx[-1]) + 1)
            else:
                want = None
            assert _one_run(m) == want, m


@pytest.mark.parametrize("q", [1e-3, 0.3])
def test_remove_threshold_on_a_grid_equals_its_pointwise_values(q):
    """The remove pair's loss threshold on whole grids (sorted either way, or shuffled: the
    in-place and one-slice paths) has the very numbers of its point-by-point evaluation (one-point
    arrays: numpy's scalar and array loops may round differently)."""
    from pldlib.profiles.mixtures import GaussianNoise, LaplaceNoise, poisson_remove

    rng = np.random.default_rng(3)
    for noise in (GaussianNoise(0.7, 1.0), LaplaceNoise(1.0, 1.0)):
        thr = poisson_remove(noise, q)._threshold
        up = np.linspace(math.log1p(-q) * 1.5, 4.0, 401)
        for eps in (up, up[::-1], rng.permutation(up), up[up > 0], up[up < 0]):
            want = np.array([float(thr(np.array([e]))[0]) for e in eps])
            np.testing.assert_array_equal(thr(eps), want)
