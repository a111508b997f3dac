"""FFT composition (docs/MATH.md section 4) against exact direct convolution.

The reference is the k-fold convolution of the same discrete masses computed
exactly (fractions.Fraction: every float is a rational) or by repeated
np.convolve (sums of non-negative terms: relative accuracy ~k n u per entry),
and curves are read off it with high-precision sums.  For the Laplace
accountant test the truth is an mpmath integral of the exact Laplace PLD.
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib.pld.compose import compose
from pldlib.pld.discretize import connect_the_dots, convex_hull_optimistic, grid_for
from pldlib.pld.grid import DiscretePLD, GridMeasure
from pldlib.profiles.base import GaussianProfile, LaplaceProfile, approx_dp_profile, randomized_response_profile


# ----------------------------------------------------------------------------
# references
# ----------------------------------------------------------------------------
def exact_kfold(masses, k):
    """k-fold self-convolution in exact rational arithmetic."""
    base = [Fraction(float(m)) for m in masses]
    out = [Fraction(1)]
    for _ in range(k):
        new = [Fraction(0)] * (len(out) + len(base) - 1)
        for i, a in enumerate(out):
            if a:
                for j, b in enumerate(base):
                    if b:
                        new[i + j] += a * b
        out = new
    return out


def float_kfold(masses, k):
    out = np.array([1.0])
    for _ in range(k):
        out = np.convolve(out, masses)
    return out


def curve(masses, start, h, const, eps):
    """const + sum_{eps_i > eps} m_i (1 - e^{eps - eps_i}), at 30 digits."""
    with mp.workdps(30):
        e = mp.mpf(float(eps))
        tot = mp.mpf(const.numerator) / const.denominator if isinstance(const, Fraction) else mp.mpf(const)
        for i, m in enumerate(masses):
            g = (start + i) * h
            if g > eps and m:
                tot += mp.mpf(m.numerator) / m.denominator * (1 - mp.exp(e - g)) if isinstance(m, Fraction) \
                    else mp.mpf(float(m)) * (1 - mp.exp(e - g))
        return tot


def fcurve(masses, start, h, const, eps):
    """The same sum in double precision, correctly rounded by math.fsum (relative ~1e-15)."""
    g = (start + np.arange(len(masses))) * h
    sel = g > eps
    m = np.asarray(masses, dtype=float)[sel]
    return const + math.fsum(m * -np.expm1(eps - g[sel]))


def on_window(ref, ref_start, start, n):
    """Reference masses placed on a window [start, start + n) (zeros outside the support)."""
    out = np.zeros(n)
    for i, v in enumerate(ref):
        j = ref_start + i - start
        if 0 <= j < n:
            out[j] = float(v)
    return out


def small_plds():
    out = {}
    for name, prof, h in [
        ("rr", randomized_response_profile(0.7), 0.1),
        ("laplace", LaplaceProfile(1.0), 0.1),
        ("gauss", GaussianProfile(2.0), 0.1),
        ("adp", approx_dp_profile(0.5, 0.01), 0.05),
    ]:
        g = grid_for(prof, h, 1e-10)
        out[name] = connect_the_dots(prof, g)
    return out


PLDS = small_plds()


def as_exact(p: DiscretePLD) -> DiscretePLD:
    """The same masses with no round-off allowance: the composition of exactly this measure."""
    return DiscretePLD(p.h, p.start, p.masses, p.p_inf, p.pessimistic, None)


# ----------------------------------------------------------------------------
# composition vs exact convolution
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("name", sorted(PLDS))
def test_fft_composition_matches_exact_convolution(name, k):
    p = as_exact(PLDS[name])
    comp = compose([p], [p], [k])
    ref = exact_kfold(p.masses, k)
    ref_start = k * p.start
    p_inf = 1 - (1 - Fraction(p.p_inf)) ** k
    # entrywise: lower <= exact <= upper, and the claimed round-off dominates the FFT error
    n = comp.upper.masses.size
    assert comp.upper.start == comp.lower.start == comp.roundoff.start
    exact = on_window(ref, ref_start, comp.upper.start, n)
    # reference mass outside the window (it wraps around) is negligible by construction
    outside = sum(float(v) for v in ref) - math.fsum(exact)
    assert abs(outside) <= 1e-14
    assert np.all(comp.lower.masses <= exact)
    est = comp.upper.masses - comp.roundoff.masses  # the clipped FFT output itself
    # the claimed 2-norm bound dominates the FFT error (theta = 0: untilting is by the total
    # mass, <= 1 up to rounding)
    E = comp.roundoff_l2
    assert math.sqrt(math.fsum((est - exact) ** 2)) <= E * (1 + 1e-9), (math.sqrt(math.fsum((est - exact) ** 2)), E)
    # the bound is meaningful on these small cases
    assert comp.roundoff.masses.max() <= 1e-12 and E <= 1e-12
    entrywise = GridMeasure(comp.upper.h, comp.upper.start, np.full(n, E * (1 + 1e-9)), 0.0)
    # curves
    eps = np.linspace(ref_start * p.h - 0.5, (ref_start + len(ref)) * p.h + 0.5, 41)
    up, lo, ro = comp.upper.delta(eps), comp.lower.delta(eps), comp.roundoff.delta(eps)
    for e, u, l, r in zip(eps, up, lo, ro):
        t = curve(ref, ref_start, p.h, p_inf, e)
        # 1e-15: reading a curve of total mass ~1 off its masses is exact only to a few ulps
        assert l - comp.alias_term(e) <= t + 1e-15 and t <= u + 1e-15, (name, k, e, l, t, u)
        # upper - exact <= 2 roundoff (|y - exact| <= E and upper = max(y, 0) + E)
        assert u - t <= 2 * r + 1e-15
        # the lower side subtracts the bound entrywise
        assert t - l <= 2 * float(entrywise.delta(e)) + 1e-15


@pytest.mark.parametrize("k", [10, 50])
@pytest.mark.parametrize("name", ["gauss", "laplace"])
def test_roundoff_bound_dominates_fft_error_larger_k(name, k):
    """np.convolve of non-negative masses as the reference (entrywise relative error
    <= k n u, far below the FFT's absolute error)."""
    p = as_exact(PLDS[name])
    comp = compose([p], [p], [k])
    ref = float_kfold(p.masses, k)
    n = comp.upper.masses.size
    exact = on_window(ref, k * p.start, comp.upper.start, n)
    ref_err = 4 * k * p.masses.size * np.finfo(float).eps * exact
    est = comp.upper.masses - comp.roundoff.masses
    # the 2-norm claim of docs/MATH.md 4.4 (theta = 0)
    err2 = math.sqrt(math.fsum((est - exact) ** 2))
    assert err2 <= comp.roundoff_l2 * (1 + 1e-9) + math.sqrt(math.fsum(ref_err ** 2)), (err2, comp.roundoff_l2)
    assert np.all(comp.lower.masses <= exact + ref_err)
    # the upper curve (block-l2 allowance) dominates the exact one everywhere
    eps = comp.upper.eps_grid[:: max(1, n // 200)]
    ex = GridMeasure(p.h, comp.upper.start, exact + ref_err, 0.0)
    assert np.all(ex.delta(eps) <= comp.upper.delta(eps) + 1e-16)


def test_heterogeneous_composition_matches_exact_convolution():
    a, b = as_exact(PLDS["rr"]), as_exact(PLDS["laplace"])
    comp = compose([a, b], [a, b], [2, 3])
    ra, rb = exact_kfold(a.masses, 2), exact_kfold(b.masses, 3)
    ref = [Fraction(0)] * (len(ra) + len(rb) - 1)
    for i, x in enumerate(ra):
        for j, y in enumerate(rb):
            ref[i + j] += x * y
    ref_start = 2 * a.start + 3 * b.start
    exact = on_window(ref, ref_start, comp.upper.start, comp.upper.masses.size)
    assert np.all(comp.lower.masses <= exact)
    p_inf = 1 - (1 - Fraction(a.p_inf)) ** 2 * (1 - Fraction(b.p_inf)) ** 3
    for e in [-1.0, 0.0, 0.3, 1.5, 3.0]:
        t = curve(ref, ref_start, a.h, p_inf, e)
        assert comp.lower.delta(e) - comp.alias_term(e) <= t + 1e-15 and t <= comp.upper.delta(e) + 1e-15


def test_p_inf_composes_as_one_minus_product():
    """delta(eps) far right of the support is the composed +inf mass 1 - prod(1 - p_inf)."""
    p = as_exact(PLDS["adp"])
    comp = compose([p], [p], [4])
    far = 1e3
    assert comp.upper.delta(far) >= 1 - (1 - p.p_inf) ** 4 - 1e-16
    assert comp.lower.delta(far) <= 1 - (1 - p.p_inf) ** 4 + 1e-16
    assert comp.upper.delta(far) == pytest.approx(1 - (1 - p.p_inf) ** 4, rel=1e-12)


def test_mass_err_is_added_on_the_pessimistic_side():
    """compose() composes masses + mass_err for the upper curve and masses - mass_err for
    the lower: the upper must dominate the exact composition of the plain masses."""
    prof = GaussianProfile(1.0)
    g = grid_for(prof, 0.05, 1e-12)
    up, lo = connect_the_dots(prof, g), convex_hull_optimistic(prof, g)
    k = 3
    comp = compose([up], [lo], [k])
    ref_u = float_kfold(up.masses, k)
    ref_l = float_kfold(lo.masses, k)
    eps = np.linspace(-1, 6, 29)
    for e in eps:
        tu = fcurve(ref_u, k * up.start, g.h, 1 - (1 - up.p_inf) ** k, e)
        tl = fcurve(ref_l, k * lo.start, g.h, 1 - (1 - lo.p_inf) ** k, e)
        assert comp.upper.delta(e) >= tu * (1 - 1e-13)
        assert comp.lower.delta(e) - comp.alias_term(e) <= tl * (1 + 1e-13) + 1e-16


# ----------------------------------------------------------------------------
# wrap-around: windows smaller than the support
# ----------------------------------------------------------------------------
WRAP_CASES = [
    (GaussianProfile(1.0), 0.05, 10, 1e-4, 0.0),
    (GaussianProfile(1.0), 0.05, 10, 1e-4, 1.0),
    (GaussianProfile(0.5), 0.05, 6, 1e-8, 0.0),
    (LaplaceProfile(1.0), 0.05, 8, 1e-3, 0.0),
    (LaplaceProfile(1.0), 0.05, 8, 1e-3, 0.7),
    (approx_dp_profile(0.5, 1e-3), 0.05, 6, 1e-2, 0.0),
    (randomized_response_profile(1.0), 0.1, 12, 1e-3, 0.0),
    (randomized_response_profile(1.0), 0.1, 12, 1e-3, 0.5),
]


@pytest.mark.parametrize("prof,h,k,tol,theta", WRAP_CASES)
def test_window_smaller_than_support_keeps_upper_above_exact(prof, h, k, tol, theta):
    g = grid_for(prof, h, 1e-12)
    up = as_exact(connect_the_dots(prof, g))
    lo = as_exact(convex_hull_optimistic(prof, g))
    comp = compose([up], [lo], [k], theta=theta, alias_tol=tol)
    ref_u, ref_l = float_kfold(up.masses, k), float_kfold(lo.masses, k)
    support = ref_u.size
    assert comp.n_bins < support  # the window really is smaller: mass wraps around
    pu, pl = 1 - (1 - up.p_inf) ** k, 1 - (1 - lo.p_inf) ** k
    lo_e, hi_e = k * up.start * h, (k * up.start + support) * h
    eps = np.linspace(lo_e - 1, hi_e + 1, 121)
    eps = eps[eps >= comp.valid_from]
    assert eps.size > 50
    for e in eps:
        tu = fcurve(ref_u, k * up.start, h, pu, e)
        tl = fcurve(ref_l, k * lo.start, h, pl, e)
        # the reference sums carry relative ~1e-14 (np.convolve); nothing else is allowed
        assert comp.upper.delta(e) >= tu * (1 - 1e-12) - 1e-300, (e, comp.upper.delta(e), tu)
        assert comp.lower.delta(e) - comp.alias_term(e) <= tl * (1 + 1e-12) + 1e-300, (e, tl)


# ----------------------------------------------------------------------------
# the accountant on a non-Gaussian composition: Laplace, k = 2, mpmath truth
# ----------------------------------------------------------------------------
def laplace2_delta(a, eps):
    """delta(eps) of the 2-fold Laplace pair with a = D / b.

    Under P the loss has atoms at a (mass 1/2) and -a (mass e^{-a}/2) and density
    e^{(l - a)/2} / 4 on (-a, a).  delta = E[(1 - e^{eps - L1 - L2})_+] is split into
    atom x atom terms, atom x density terms (closed form G), and one quadrature."""
    with mp.workdps(30):
        a, eps = mp.mpf(a), mp.mpf(eps)
        atoms = [(a, mp.mpf(1) / 2), (-a, mp.exp(-a) / 2)]

        def g(y):
            return max(mp.mpf(0), 1 - mp.exp(eps - y))

        def G(s):  # int_{-a}^{a} e^{(l-a)/2}/4 * g(s + l) dl
            c = max(-a, eps - s)
            if c >= a:
                return mp.mpf(0)
            return (1 - mp.exp((c - a) / 2)) / 2 - mp.exp(eps - s - a / 2) * (mp.exp(-c / 2) - mp.exp(-a / 2)) / 2

        tot = mp.fsum(w1 * w2 * g(x1 + x2) for x1, w1 in atoms for x2, w2 in atoms)
        tot += 2 * mp.fsum(w * G(x) for x, w in atoms)
        pts = sorted({-a, a, *[p for p in (eps - a, eps + a) if -a < p < a]})
        tot += mp.quad(lambda l: mp.exp((l - a) / 2) / 4 * G(l), pts)
        return tot


def test_laplace_pld_reference_is_right_at_k1():
    """Sanity of the reference: with one step it reduces to the Laplace closed form."""
    a = mp.mpf(1)

    def one(eps):
        mp.mp.dps = 30
        eps = mp.mpf(eps)
        atoms = [(a, mp.mpf(1) / 2), (-a, mp.exp(-a) / 2)]
        tot = mp.fsum(w * max(0, 1 - mp.exp(eps - x)) for x, w in atoms)
        tot += mp.quad(lambda l: mp.exp((l - a) / 2) / 4 * max(0, 1 - mp.exp(eps - l)),
                       sorted({-a, a, *([eps] if -a < eps < a else [])}))
        return tot

    try:
        for e in [0.0, 0.3, 0.9]:
            assert abs(one(e) - (1 - mp.exp((mp.mpf(e) - 1) / 2))) < 1e-20
    finally:
        mp.mp.dps = 15


@pytest.mark.parametrize("scale", [0.5, 1.0, 2.0])
def test_laplace_two_fold_accountant_brackets_truth(scale):
    a = 1.0 / scale
    acc = pldlib.account(pldlib.Laplace(scale=scale), steps=2)
    eps = np.array([-0.5, 0.0, 0.4 * a, a, 1.5 * a, 1.9 * a, 2.5 * a])
    iv = acc.delta(eps)
    for e, lo, up in zip(eps, iv.lower, iv.upper):
        t = laplace2_delta(a, e)
        assert lo <= t <= up, (scale, e, lo, t, up)
    # eps(delta): truth by bisection on the mpmath curve
    for d in [1e-2, 1e-4]:
        lo_e, hi_e = mp.mpf(0), mp.mpf(2 * a)
        while hi_e - lo_e > 1e-11:
            mid = (lo_e + hi_e) / 2
            if laplace2_delta(a, mid) > d:
                lo_e = mid
            else:
                hi_e = mid
        t = float(hi_e)
        e = acc.epsilon(d)
        assert e.lower <= t + 1e-11 and t <= e.upper + 1e-11, (scale, d, e, t)
        # a useful interval at the default accuracy.  (The 1% target is the Gaussian's;
        # here the composed loss has atoms between grid points, which cost the
        # optimistic side O(h), so allow 2%.)
        assert (e.upper - e.lower) / t <= 0.02, (scale, d, e, t)
        # and not beyond the largest possible loss 2a (delta is exactly 0 there), up to
        # the pessimistic rounding of each step's atom at a to the next grid point
        assert e.upper <= 2 * (a + acc.spacing) + 1e-9, (scale, d, e, acc.spacing)


@pytest.mark.parametrize("delta", [1e-8, 1e-12])
def test_tilted_composition_cuts_a_far_tail_soundly(delta):
    """Poisson-subsampled Gaussian (sigma 1, q 1e-3), remove direction: its loss has a tail of
    negligible mass reaching eps ~ 6 that dominates the tilted law at the tilts small deltas
    need (docs/MATH.md 4.3).  Given ``cut_scale=delta`` the composition moves it to +inf (upper)
    or drops it (lower), tilts on the cut law, and needs a much smaller window; both curves
    still bracket the float convolution of the full PLD (relative error <= k n u for
    non-negative terms), and the upper curve stays tight where the answer is."""
    from pldlib.pld.compose import estimate_tilt

    br = [b for b in pldlib.Gaussian(1.0, q=1e-3, sampling="poisson").branches() if b.label == "remove"][0]
    h, k = 2e-3, 16
    up = as_exact(connect_the_dots(br.upper, grid_for(br.upper, h, 1e-40)))
    lo = as_exact(convex_hull_optimistic(br.lower, grid_for(br.lower, h, 1e-40)))
    assert up.masses.size * h > 5.0  # the far tail is on the grid
    comp = compose([up], [lo], [k], theta=estimate_tilt([up], [k], delta, delta), cut_scale=delta)
    full = compose([up], [lo], [k], theta=estimate_tilt([up], [k], delta))
    assert comp.n_bins * 2 <= full.n_bins
    ref_u = float_kfold(up.masses, k)
    ref_l = float_kfold(lo.masses, k)
    slack = 4 * k * up.masses.size * np.finfo(float).eps
    e_star = float(comp.upper.epsilon(delta))
    for e in np.concatenate([np.linspace(comp.valid_from, 1.0, 11), [e_star]]):
        tu = fcurve(ref_u, k * up.start, h, 1 - (1 - up.p_inf) ** k, e)
        tl = fcurve(ref_l, k * lo.start, h, 1 - (1 - lo.p_inf) ** k, e)
        assert tu * (1 - slack) <= comp.upper.delta(e), (e, tu, comp.upper.delta(e))
        assert comp.lower.delta(e) - comp.alias_term(e) <= tl * (1 + slack) + 1e-300
    # at the answer the cut costs at most CUT_REL of delta (plus round-off)
    tu = fcurve(ref_u, k * up.start, h, 1 - (1 - up.p_inf) ** k, e_star)
    assert comp.upper.delta(e_star) <= tu * (1 + 1e-4)


def test_upper_only_window_starts_near_the_answer_and_its_folded_tail_only_raises_the_curve(monkeypatch):
    """An upper-only composition at a tilt starts its window LEFT_CUT_SD tilted standard
    deviations below the tilted mean (docs/MATH.md 4.3): a real share of the tilted law left of it
    folds into the window; and it ends early, its right tail folding onto the window's start.
    Against the float convolution of the same masses (relative error <= k n u): the upper curve
    stays above the truth everywhere it is valid, and at the answer it costs at most a relative
    1e-6 of delta over the two-sided composition's window."""
    import pldlib.pld.compose as C
    from pldlib.pld.compose import estimate_tilt

    monkeypatch.setattr(C, "LEFT_CUT_FROM", 0)  # (a window this small is cut only when told to)
    br = [b for b in pldlib.Gaussian(1.0, q=0.1, sampling="poisson").branches() if b.label == "remove"][0]
    h, k, delta = 0.02, 32, 1e-6
    up = as_exact(connect_the_dots(br.upper, grid_for(br.upper, h, 1e-20)))
    lo = as_exact(convex_hull_optimistic(br.lower, grid_for(br.lower, h, 1e-20)))
    theta = estimate_tilt([up], [k], delta, delta)
    assert theta > 0.5
    cut = compose([up], None, [k], theta=theta, cut_scale=delta)
    full = compose([up], [lo], [k], theta=theta, cut_scale=delta)
    with monkeypatch.context() as m:
        m.setattr(C, "RIGHT_FOLD_SD", 1e9)  # (no room: the window ends at the Chernoff edge)
        no_fold = compose([up], None, [k], theta=theta, cut_scale=delta)
    assert cut.upper.start >= full.upper.start + 100 and cut.n_bins < full.n_bins  # it starts 2 units later
    assert no_fold.upper.start == cut.upper.start and cut.n_bins < no_fold.n_bins  # and ends earlier
    ref = float_kfold(up.masses, k)
    g = (k * up.start + np.arange(ref.size)) * h
    pinf = 1 - (1 - up.p_inf) ** k
    # the tilted law (where the window ends) has a real share left of the window's start
    tilted = ref * np.exp(theta * (g - g.max()))
    inside = g < (cut.upper.start + cut.n_bins) * h
    folded = tilted[g < cut.upper.start * h].sum() / tilted[inside].sum()
    assert folded > 1e-3, folded
    slack = 4 * k * up.masses.size * np.finfo(float).eps
    e_star = float(cut.upper.epsilon(delta))
    assert e_star >= cut.valid_from
    for e in np.concatenate([np.linspace(cut.valid_from, g[-1] + h, 41), [e_star]]):
        tu = fcurve(ref, k * up.start, h, pinf, e)
        assert cut.upper.delta(e) >= tu * (1 - slack), (e, tu, cut.upper.delta(e))
    tu = fcurve(ref, k * up.start, h, pinf, e_star)
    assert cut.upper.delta(e_star) <= full.upper.delta(e_star) + 1e-6 * delta + 1e-4 * tu
    assert abs(e_star - float(full.upper.epsilon(delta))) <= 1e-6


def _random_sides(rng, n, h=0.01):
    from pldlib.pld.compose import _Side

    sides = []
    for m in range(n):
        size = int(rng.integers(5, 400))
        w = rng.random(size) ** 6  # spread-out magnitudes, some tiny
        w[rng.random(size) < 0.2] = 0.0
        w[int(rng.integers(size))] = 1.0
        pld = DiscretePLD(h=h, start=int(rng.integers(-300, 300)), masses=w / w.sum(), p_inf=0.0,
                          pessimistic=True)
        sides.append(_Side.of(pld, int(rng.integers(1, 30))))
    return sides


def test_batched_log_mgf_and_moments_match_mpmath_sums():
    """The schedule path (_Batch: all sides' ln M(t) by one product per block) against each side's
    sum in 40-digit arithmetic, at tilts from -300 to 2000 (where a block's shared exponent shift
    leaves some sides to the per-side fallback): ln M rounded up is never below the truth and
    within 1e-12 of it, rounded down never above; tilted means and variances agree to 1e-9."""
    from pldlib.pld.compose import _Batch

    rng = np.random.default_rng(7)
    sides = _random_sides(rng, 70)
    batch = _Batch(sides)
    thetas = np.array([-300.0, -2.5, 0.0, 0.7, 13.0, 250.0, 2000.0])
    up = batch.log_mgf(thetas)
    down = batch.log_mgf(thetas, down=True)
    mp.mp.dps = 40
    for r, sd in enumerate(sides):
        for j, t in enumerate(thetas):
            terms = [mp.mpf(float(m)) * mp.exp(mp.mpf(float(t)) * mp.mpf(float(e)))
                     for m, e in zip(sd.masses, sd.eps) if m > 0]
            exact = mp.log(mp.fsum(terms))
            assert up[r, j] >= exact and down[r, j] <= exact, (r, t)
            assert abs(up[r, j] - exact) <= 1e-12 * max(1.0, abs(exact)), (r, t)
    for t in (0.0, 3.0, 40.0):
        means, variances = batch.moments(t)
        for r, sd in enumerate(sides[:20]):
            w = [mp.mpf(float(m)) * mp.exp(mp.mpf(t) * mp.mpf(float(e))) for m, e in zip(sd.masses, sd.eps)]
            tot = mp.fsum(w)
            mean = mp.fsum(wi * mp.mpf(float(e)) for wi, e in zip(w, sd.eps)) / tot
            var = mp.fsum(wi * (mp.mpf(float(e)) - mean) ** 2 for wi, e in zip(w, sd.eps)) / tot
            assert abs(means[r] - mean) <= 1e-9 * max(1.0, abs(mean))
            assert abs(variances[r] - var) <= 1e-9 * max(float(var), 1e-6)


def test_schedule_of_many_components_composes_like_its_exact_convolution():
    """A heterogeneous composition of 40 distinct PLDs (the batched path: Chernoff windows,
    tilt estimates and grouped forward FFTs) gives an upper curve above the direct convolution
    (np.convolve of the 40 mass arrays, accurate here to ~1e-15) and within 1e-6 of it."""
    rng = np.random.default_rng(11)
    plds = []
    for m in range(40):
        size = int(rng.integers(3, 12))
        w = rng.random(size) + 0.05
        plds.append(DiscretePLD(h=0.05, start=int(rng.integers(-4, 2)), masses=w / w.sum(), p_inf=0.0,
                                pessimistic=True))
    comp = compose(plds, None, [1] * 40, theta=0.0)
    exact = np.array([1.0])
    start = 0
    for p in plds:
        exact = np.convolve(exact, p.masses)
        start += p.start
    eps_grid = (start + np.arange(exact.size)) * 0.05
    for eps in (0.0, 0.5, 1.0, 2.0):
        truth = float(np.sum(np.clip(exact * (1.0 - np.exp(eps - eps_grid)), 0.0, None)))
        up = float(comp.upper.delta(np.array([eps]))[0])
        assert up >= truth * (1 - 1e-12) - 1e-15
        assert up <= truth * (1 + 1e-6) + 1e-12


@pytest.mark.parametrize("sigma,q,k,delta", [(1.0, 0.01, 10000, 1e-5), (0.7, 0.005, 13756, 1.2e-8),
                                             (1.4, 1.3e-4, 5855, 2.4e-7), (3.7, 0.0049, 886, 1.8e-12),
                                             (0.45, 0.19, 2608, 7.4e-5)])
def test_estimate_tilt_lands_within_15_percent_of_the_saddle_point_root(sigma, q, k, delta):
    # the root of f(t) = K(t) - t K'(t) - ln(t (1 + t)) - ln sqrt(2 pi K''(t)) - ln delta, found
    # here by plain bisection to 1e-6 (Newton's iterates in estimate_tilt need only 15%)
    import math

    from pldlib.pld import compose as C

    acc = pldlib.account(pldlib.Gaussian(sigma=sigma, q=q, sampling="poisson", relation="remove"), steps=k)
    acc._ensure_built()
    st = acc._branches[0]
    sides = [C._Side.of(p, n) for p, n in zip(st.uppers, st.counts)]

    def f(t):
        mean, var = C._moments(sides, t)
        return (C._log_mgf_total(sides, t) - t * mean - math.log(t * (1 + t))
                - 0.5 * math.log(2 * math.pi * var) - math.log(delta))

    lo, hi = 1e-6, 1.0
    while f(hi) > 0:
        hi *= 2.0
    while hi / lo > 1 + 1e-6:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    got = C.estimate_tilt(st.uppers, st.counts, delta)
    assert lo / 1.15 <= got <= hi * 1.15


def test_curve_at_a_few_points_without_the_table_matches_exact_sums():
    """GridMeasure.delta_at_few (the round-off share's reader, no table: a sum of non-negative
    terms right of each eps on small grids, the block tail sums and one block on grids of 4,096
    points or more) against the curve summed at 40 digits, on grid points, between them, beyond
    both ends, with an offset lattice (within 1e-14), and as delta() to 1e-11."""
    rng = np.random.default_rng(5)
    for n, start, shift in ((7, -3, 0.0), (300, -40, 0.25e-3), (5000, -1000, 0.0)):
        h = 1e-3
        m = rng.exponential(1.0, n) * np.exp(-np.linspace(0, 25, n))
        m[rng.random(n) < 0.1] = 0.0
        g = GridMeasure(h=h, start=start, masses=m, const=3e-9, shift=shift)
        grid = (start + np.arange(n)) * h + shift
        pts = np.array([grid[0] - 1.0, grid[0], grid[min(5, n - 1)], 0.5 * (grid[1] + grid[2]), grid[-1], grid[-1] + 2.0])
        for e in pts:
            fresh = GridMeasure(h=h, start=start, masses=m, const=3e-9, shift=shift)
            got = float(fresh.delta_at_few(np.array([e]))[0])
            assert "_table" not in fresh.__dict__  # answered without building the table
            mp.mp.dps = 40
            exact = mp.mpf(3e-9) + sum(mp.mpf(float(mi)) * (1 - mp.e ** (mp.mpf(float(e)) - mp.mpf(float(gi))))
                                       for mi, gi in zip(m, grid) if gi > e)
            assert abs(got - float(exact)) <= 1e-14 * float(exact) + 1e-300
            assert got == pytest.approx(float(g.delta(np.array([e]))[0]), rel=1e-11, abs=1e-300)


def test_epsilon_at_a_few_deltas_without_the_table_inverts_the_exact_curve():
    """GridMeasure.epsilon for at most 4 deltas on a grid of >= 4,096 points reads the curve at
    the block starts and builds one block's table: its answers put the 40-digit curve at delta
    (relative 1e-11), agree with the whole table's to 1e-12, and give +inf below the constant
    and -inf above the total mass, as the table does."""
    rng = np.random.default_rng(11)
    for n, start, shift, h in ((6000, -2500, 0.0, 1e-3), (9000, 100, 0.4e-4, 1e-4)):
        m = rng.exponential(1.0, n) * np.exp(-np.linspace(0, 30, n))
        m[rng.random(n) < 0.1] = 0.0
        m /= m.sum()
        const = 1e-12
        grid = (start + np.arange(n)) * h + shift
        deltas = [0.5, 1e-2, 1e-5, 1e-9, 1e-11, 5e-13, 2.0]
        table = GridMeasure(h=h, start=start, masses=m, const=const, shift=shift).epsilon(np.array(deltas))
        for d, t in zip(deltas, table):
            fresh = GridMeasure(h=h, start=start, masses=m, const=const, shift=shift)
            got = float(fresh.epsilon(np.array([d]))[0])
            assert "_table" not in fresh.__dict__  # answered without the whole table
            if d < const:
                assert got == np.inf and t == np.inf
                continue
            if d > const + 1.0:
                assert got == -np.inf and t == -np.inf
                continue
            assert got == pytest.approx(float(t), rel=1e-12, abs=1e-12)
            mp.mp.dps = 40
            e = mp.mpf(got)
            exact = mp.mpf(const) + mp.fsum(mp.mpf(float(mi)) * (1 - mp.e ** (e - mp.mpf(float(gi))))
                                            for mi, gi in zip(m, grid) if gi > got and mi > 0)
            assert abs(float(exact) - d) <= 1e-11 * d, (d, got, float(exact))
