"""Tests of the high-precision quadrature truth (pldlib.truth) against independent computations.

Every reference here is computed without the contour integral: closed forms
with mpmath.ncdf, direct mpmath quadrature of E_P[(1 - e^{eps - L})_+], and a
nested 1-d quadrature for two steps.
"""
import functools
import math

import mpmath as mp
import pytest
from mpmath.calculus.quadrature import GaussLegendre

from pldlib.testing import truth


# ---------------------------------------------------------------------------
# independent references
# ---------------------------------------------------------------------------
def gaussian_closed(eps, sigma, k, dps=60):
    """k-fold Gaussian: r = sqrt(k)/sigma, delta = Phi(-eps/r + r/2) - e^eps Phi(-eps/r - r/2)."""
    with mp.workdps(dps):
        r = mp.sqrt(k) / mp.mpf(sigma)
        e = mp.mpf(eps)
        return +(mp.ncdf(-e / r + r / 2) - mp.exp(e) * mp.ncdf(-e / r - r / 2))


def _ell(x, sigma, q):
    """ln(1 - q + q exp((2x - 1) / (2 sigma^2))): the remove-direction loss at output x."""
    return mp.log(1 - q + q * mp.exp((2 * x - 1) / (2 * sigma**2)))


def one_step_closed(e, sigma, q, direction):
    """Single-step delta of the Poisson-subsampled Gaussian from the threshold (docs/MATH.md section 2)."""
    sigma, q, e = mp.mpf(sigma), mp.mpf(q), mp.mpf(e)
    if direction == "remove":
        # L = ell(x) increasing; P = (1-q) N(0, s^2) + q N(1, s^2), Q = N(0, s^2)
        if e <= mp.log1p(-q):
            return -mp.expm1(e)
        x = sigma**2 * mp.log((mp.exp(e) - (1 - q)) / q) + mp.mpf(1) / 2
        return (1 - q) * mp.ncdf(-x / sigma) + q * mp.ncdf(-(x - 1) / sigma) - mp.exp(e) * mp.ncdf(-x / sigma)
    # add: P = N(0, s^2), Q = mixture, L = -ell(x) decreasing
    if e >= -mp.log1p(-q):
        return mp.mpf(0)
    x = sigma**2 * mp.log((mp.exp(-e) - (1 - q)) / q) + mp.mpf(1) / 2
    return mp.ncdf(x / sigma) - mp.exp(e) * ((1 - q) * mp.ncdf(x / sigma) + q * mp.ncdf((x - 1) / sigma))


def one_step_quad(e, sigma, q, direction):
    """Single-step delta = E_P[(1 - e^{e - L})_+] by mpmath quadrature, split at the threshold L = e."""
    sigma, q, e = mp.mpf(sigma), mp.mpf(q), mp.mpf(e)
    if direction == "remove":
        x = sigma**2 * mp.log((mp.exp(e) - (1 - q)) / q) + mp.mpf(1) / 2

        def f(u):
            dens = (1 - q) * mp.npdf(u, 0, sigma) + q * mp.npdf(u, 1, sigma)
            return -mp.expm1(e - _ell(u, sigma, q)) * dens

        return mp.quad(f, [x, x + sigma, x + 4 * sigma, x + 12 * sigma, mp.inf])
    x = sigma**2 * mp.log((mp.exp(-e) - (1 - q)) / q) + mp.mpf(1) / 2

    def g(u):
        return -mp.expm1(e + _ell(u, sigma, q)) * mp.npdf(u, 0, sigma)

    return mp.quad(g, [-mp.inf, x - 12 * sigma, x - 4 * sigma, x - sigma, x])


def two_steps(e, sigma, q, direction):
    """delta_2(e) = E_{x1 ~ P}[delta_1(e - L(x1))]: a 1-d quadrature over the first step's output
    of the closed-form single-step curve (the second step), split at its kink."""
    sigma, q, e = mp.mpf(sigma), mp.mpf(q), mp.mpf(e)
    if direction == "remove":
        v = e - mp.log1p(-q)  # delta_1(e - ell) has a kink where e - ell(x) = ln(1 - q)

        def f(u):
            dens = (1 - q) * mp.npdf(u, 0, sigma) + q * mp.npdf(u, 1, sigma)
            return dens * one_step_closed(e - _ell(u, sigma, q), sigma, q, "remove")
    else:
        v = -mp.log1p(-q) - e  # delta_1^add(e + ell) vanishes where e + ell(x) >= -ln(1 - q)

        def f(u):
            return mp.npdf(u, 0, sigma) * one_step_closed(e + _ell(u, sigma, q), sigma, q, "add")
    xk = sigma**2 * mp.log((mp.exp(v) - (1 - q)) / q) + mp.mpf(1) / 2
    pts = sorted({-mp.inf, xk - 8 * sigma, xk - 2 * sigma, xk, xk + 2 * sigma, xk + 8 * sigma,
                  mp.mpf(0), mp.mpf(1), mp.inf})
    return mp.quad(f, pts)


@functools.lru_cache(maxsize=None)
def two_steps_40(e, sigma, q, direction):
    """:func:`two_steps` at 40 digits, computed once (two tests ask for the same nested quadrature)."""
    with mp.workdps(40):
        return two_steps(e, sigma, q, direction)


def rel(a, b):
    return float(abs(mp.mpf(a) - mp.mpf(b)) / abs(mp.mpf(b)))


# ---------------------------------------------------------------------------
# (1) q = 1: closed form, including tiny deltas
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sigma,k,eps", [
    (1.0, 1, 1.0), (1.0, 10, 2.0), (0.5, 1, 3.0), (2.0, 100, 1.0), (5.0, 1000, 0.5),
    (1.0, 1, -1.0), (1.0, 1, 8.0),     # delta ~ 3.7e-15
    (0.7, 20, 72.0),                   # delta ~ 1.5e-16
    (3.0, 1, 2.6),                     # delta ~ 4.6e-16 at large sigma
    (3.0, 1, 3.0),                     # delta ~ 1.8e-20
])
def test_gaussian_matches_closed_form(sigma, k, eps):
    ref = gaussian_closed(eps, sigma, k)
    got = truth.delta_gaussian(eps, sigma, k)
    assert rel(got, ref) < 1e-25
    # q = 1: both directions are the same pair
    assert rel(truth.delta_gaussian(eps, sigma, k, direction="add"), ref) < 1e-25


def test_tiny_delta_really_tiny():
    d = truth.delta_gaussian(8.0, 1.0, 1)
    assert 1e-15 < d < 1e-14
    d = truth.delta_gaussian(72.0, 0.7, 20)
    assert 1e-16 < float(d) < 2e-16
    assert rel(d, gaussian_closed(72.0, 0.7, 20)) < 1e-25


# ---------------------------------------------------------------------------
# (2) the answer does not depend on the integration line
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("t", [0.3, 1.0, 2.5, 6.0, -2.0, -4.0])
def test_line_independence_gaussian(t):
    ref = gaussian_closed(1.5, 1.0, 4)
    got = truth.delta_gaussian(1.5, 1.0, 4, t=t)
    assert rel(got, ref) < 1e-25


def test_line_independence_subsampled():
    # sigma 1, q 0.01, 10,000 steps, eps 6: two positive lines and the line left of -1
    vals = [truth.delta_gaussian(6.0, 1.0, 10_000, q=0.01, t=t) for t in (3.0, 4.5, -3.0)]
    for v in vals[1:]:
        assert rel(v, vals[0]) < 1e-25


def test_invalid_line():
    with pytest.raises(ValueError):
        truth.delta_gaussian(1.0, 1.0, 1, t=-0.5)
    with pytest.raises(ValueError):
        truth.delta_gaussian(1.0, 1.0, 1, t=0.0)


# ---------------------------------------------------------------------------
# (3) q < 1, one step: direct quadrature of E_P[(1 - e^{eps - L})_+]
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sigma,q,eps,direction", [
    (4.0, 0.5, 0.1, "remove"),
    (4.0, 0.5, 0.5, "remove"),   # delta ~ 2e-5
    (4.0, 0.5, 0.1, "add"),
])
def test_one_step_subsampled_matches_quadrature(sigma, q, eps, direction):
    with mp.workdps(40):
        ref = one_step_quad(eps, sigma, q, direction)
        # the two references agree with each other
        assert rel(ref, one_step_closed(eps, sigma, q, direction)) < 1e-30
    got = truth.delta_gaussian(eps, sigma, 1, q=q, direction=direction)
    assert rel(got, ref) < 1e-10
    assert rel(got, ref) < 1e-25  # what it actually achieves


# ---------------------------------------------------------------------------
# (4) q < 1, two steps: nested quadrature over the first step's output
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["remove", "add"])
def test_two_steps_subsampled_matches_nested_quadrature(direction):
    sigma, q, eps = 4.0, 0.5, 0.2
    ref = two_steps_40(eps, sigma, q, direction)
    got = truth.delta_gaussian(eps, sigma, 2, q=q, direction=direction)
    assert rel(got, ref) < 1e-10


def test_add_remove_is_max():
    args = (0.2, 4.0, 2)
    r = truth.delta_gaussian(*args, q=0.5, direction="remove")
    a = truth.delta_gaussian(*args, q=0.5, direction="add")
    ar = truth.delta_gaussian(*args, q=0.5, direction="add_remove")
    assert ar == max(r, a)


# ---------------------------------------------------------------------------
# exact values outside the support of the composed loss
# ---------------------------------------------------------------------------
def test_exact_outside_support():
    q, k = 0.3, 3
    # add: L <= -ln(1-q) per step, so delta = 0 for eps >= -k ln(1-q)
    assert truth.delta_gaussian(-k * math.log1p(-q) + 1e-9, 1.0, k, q=q, direction="add") == 0
    # remove: L > ln(1-q) per step, so delta = 1 - e^eps for eps <= k ln(1-q)
    e = k * math.log1p(-q) - 0.1
    d = truth.delta_gaussian(e, 1.0, k, q=q, direction="remove")
    assert rel(d, -mp.expm1(e)) < 1e-25


# ---------------------------------------------------------------------------
# epsilon(delta)
# ---------------------------------------------------------------------------
def test_epsilon_gaussian_inverts_closed_form():
    sigma, k, target = 2.0, 50, 1e-6
    eps = truth.epsilon_gaussian(target, sigma, k)
    assert rel(gaussian_closed(eps, sigma, k), target) < 1e-12


# ---------------------------------------------------------------------------
# (5), (6) seed 002 Table 1: sigma 0.8, q 0.001, 10,000 steps, Poisson add_remove
# (at dps 15, the least the truth takes: eps to 1e-7, five orders inside the table's 0.01-0.02;
# up to 30% less work than the default 30 digits, and the same answers to 1e-15)
# ---------------------------------------------------------------------------
def test_seed002_table1_delta_1e5():
    eps = truth.epsilon_gaussian(1e-5, 0.8, 10_000, q=0.001, direction="add_remove", dps=15)
    # published 0.80 is an upper bound from an accountant with eps error ~0.01; tight ~0.78
    assert 0.75 < eps < 0.80


@pytest.mark.slow
def test_seed002_table1_all_deltas():
    expected = {1e-7: 1.17, 1e-4: 0.63}  # docs/MATH.md section 8, its two ends (1e-5: the test above)
    for delta, approx in expected.items():
        eps = truth.epsilon_gaussian(delta, 0.8, 10_000, q=0.001, direction="add_remove", dps=15)
        assert abs(float(eps) - approx) < 0.02, (delta, eps)


# ---------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------
def test_gauss_legendre_nodes_match_mpmath():
    with mp.workdps(50):
        for degree in (5, 6):
            ours = sorted(truth._gauss_legendre(degree))
            ref = sorted(GaussLegendre(mp.mp).calc_nodes(degree, mp.mp.prec))
            assert len(ours) == len(ref) == 3 * 2 ** (degree - 1)
            err = max(max(abs(x - y), abs(w - v)) for (x, w), (y, v) in zip(ours, ref))
            assert err < mp.mpf(10) ** -45


def test_single_step_cgf_against_quadrature():
    """The inner rule reproduces M(z) = E_Q[(dP/dQ)^{1+z}] computed by mpmath.quad at a complex z."""
    st = truth._get_step(0.8, 0.05, "remove")
    t, y = 2.0, 7.0
    with mp.workdps(40):
        sigma, q = mp.mpf(0.8), mp.mpf(0.05)
        z = mp.mpc(t, y)

        def f(x):
            return mp.npdf(x, 0, sigma) * mp.exp((1 + z) * _ell(x, sigma, q))

        ref = mp.quad(f, mp.linspace(-12 * sigma, 12 * sigma + (1 + t) * sigma**2, 41))
        ref += mp.quad(f, [-mp.inf, -12 * sigma]) + mp.quad(f, [12 * sigma + (1 + t) * sigma**2, mp.inf])
        got = mp.exp(st.log_mgf_progression(t, y, 1.0, 1, 40, 10.0)[0])
        assert abs(got - ref) / abs(ref) < mp.mpf(10) ** -30
    # add direction: E_P[(dP/dQ)^z]
    st = truth._get_step(0.8, 0.05, "add")
    with mp.workdps(40):
        def g(x):
            return mp.npdf(x, 0, sigma) * mp.exp(-z * _ell(x, sigma, q))

        ref = mp.quad(g, mp.linspace(-14 * sigma, 14 * sigma, 57))
        got = mp.exp(st.log_mgf_progression(t, y, 1.0, 1, 40, 10.0)[0])
        assert abs(got - ref) / abs(ref) < mp.mpf(10) ** -30


def test_argument_validation():
    with pytest.raises(ValueError):
        truth.delta_gaussian(1.0, -1.0, 1)
    with pytest.raises(ValueError):
        truth.delta_gaussian(1.0, 1.0, 0)
    with pytest.raises(ValueError):
        truth.delta_gaussian(1.0, 1.0, 1, q=0.0)
    with pytest.raises(ValueError):
        truth.delta_gaussian(1.0, 1.0, 1, direction="substitution")
    with pytest.raises(ValueError):
        truth.epsilon_gaussian(1.5, 1.0, 1)


def test_out_of_reach_raises_instead_of_guessing():
    # q = 0.001 with 100 steps (k q = 0.1) and sigma 0.6: the composed loss keeps a
    # near-atom whose transform decays too slowly on every admissible line
    with pytest.raises(truth.ContourError):
        truth.delta_gaussian(1.0, 0.6, 100, q=0.001)
    # eps just below the largest possible composed add-loss: delta is astronomically small
    with pytest.raises(truth.ContourError):
        truth.delta_gaussian(1.0, 1.0, 100, q=0.01, direction="add")


def test_halving_check_path(monkeypatch):
    """Without the Chernoff bounds the step is verified by the 2*Delta sub-sum; same answers."""
    orig = truth._Composed.alias_T

    def no_chernoff(self, eps, t, ln_abs_tol):
        t_triv, _ = orig(self, eps, t, ln_abs_tol)
        return t_triv, math.inf

    monkeypatch.setattr(truth._Composed, "alias_T", no_chernoff)
    for sigma, k, eps in [(1.0, 10, 2.0), (2.0, 100, 1.0), (1.0, 1, 8.0)]:
        got, info = truth.delta_gaussian(eps, sigma, k, return_info=True, t=None)
        assert info["alias"] == "halving check"
        assert rel(got, gaussian_closed(eps, sigma, k)) < 1e-25
    ref = two_steps_40(0.2, 4.0, 0.5, "remove")
    got, info = truth.delta_gaussian(0.2, 4.0, 2, q=0.5, return_info=True)
    assert info["alias"] == "halving check"
    assert rel(got, ref) < 1e-10
