"""Discretisation onto a grid (docs/MATH.md section 3) and reading curves off discrete PLDs.

Expected values are independent of pldlib: the Gaussian curve from its closed
form in mpmath, connect-the-dots masses from the slope formula of docs/MATH.md 3.1
evaluated in mpmath on those exact curve values, bucket masses from exact
normal CDFs, and discrete-PLD curves/inverses from direct high-precision sums
and bisection.
"""
from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

from pldlib.pld.discretize import (Grid, connect_the_dots, convex_hull_optimistic, grid_for, optimistic,
                                  privacy_buckets)
from pldlib.pld.grid import DiscretePLD, GridMeasure
from pldlib.profiles.base import (FiniteProfile, GaussianProfile, LaplaceProfile, approx_dp_profile,
                                 randomized_response_profile)

DPS = 40


def gauss_delta(r, eps):
    with mp.workdps(DPS):
        r, eps = mp.mpf(r), mp.mpf(eps)
        return mp.ncdf(-eps / r + r / 2) - mp.exp(eps) * mp.ncdf(-eps / r - r / 2)


def mp_curve(masses, eps_grid, p_inf, eps):
    """p_inf + sum_{eps_i > eps} m_i (1 - e^{eps - eps_i}), at 40 digits."""
    with mp.workdps(DPS):
        e = mp.mpf(eps)
        return mp.mpf(p_inf) + mp.fsum(
            mp.mpf(m) * (1 - mp.exp(e - mp.mpf(g))) for m, g in zip(masses, eps_grid) if g > eps and m != 0
        )


def full_masses(pld: DiscretePLD, grid: Grid):
    """The PLD's masses placed on the whole grid (the library trims zero ends)."""
    out = np.zeros(grid.n + 1)
    err = np.zeros(grid.n + 1)
    off = pld.start - grid.start
    out[off : off + pld.size] = pld.masses
    if pld.mass_err is not None:
        err[off : off + pld.size] = pld.mass_err
    return out, err


# ----------------------------------------------------------------------------
# the grid
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prof", [GaussianProfile(0.7), GaussianProfile(20.0), LaplaceProfile(2.0), randomized_response_profile(0.3)]
)
@pytest.mark.parametrize("h", [0.3, 0.01])
def test_grid_covers_the_loss_range_and_contains_zero(prof, h):
    tail = 1e-15
    g = grid_for(prof, h, tail)
    lo, hi = prof.eps_bounds(tail)
    eps = g.eps
    assert eps.size == g.n + 1
    np.testing.assert_allclose(np.diff(eps), h, rtol=1e-9)
    assert eps[0] <= lo + 1e-12 and eps[-1] >= hi - 1e-12
    assert eps[0] < 0 < eps[-1]
    assert 0.0 in eps  # the hull construction needs alpha = 1 on the grid


# ----------------------------------------------------------------------------
# connect the dots: equals the true curve at the grid points (docs/MATH.md 3.1)
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("sigma,h,tail", [(1.0, 0.05, 1e-12), (0.5, 0.1, 1e-20), (5.0, 0.01, 1e-12), (20.0, 0.002, 1e-30)])
def test_connect_the_dots_interpolates_the_gaussian_curve(sigma, h, tail):
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    g = grid_for(prof, h, tail)
    pld = connect_the_dots(prof, g)
    sel = np.unique(np.linspace(0, g.n, 60).astype(int))
    eps = g.eps[sel]
    got = pld.delta(eps)
    for e, v in zip(eps, got):
        t = gauss_delta(r, e)
        # never below the truth beyond the round-off of evaluating a sum of masses of
        # total 1 (absolute ~1e-16); above it only by the deliberate rounding of each
        # cell's split towards its right end (relative ~u/h per cell)
        assert v >= t * (1 - 1e-14) - 1e-16, (e, v, t)
        assert v - t <= 1e-10 * t + 1e-14, (e, v, t)


@pytest.mark.parametrize("sigma,h,tail", [(1.0, 0.05, 1e-12), (0.5, 0.1, 1e-20), (5.0, 0.01, 1e-12), (20.0, 0.002, 1e-30)])
def test_connect_the_dots_p_inf_is_not_below_the_true_tail(sigma, h, tail):
    """p_inf = d_n is the pessimistic +inf atom: the library rounds it up by its assumed
    relative accuracy of profile values; it must not end up below the exact d_n."""
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    g = grid_for(prof, h, tail)
    pld = connect_the_dots(prof, g)
    exact = gauss_delta(r, g.eps[-1])
    assert mp.mpf(pld.p_inf) >= exact, (pld.p_inf, exact)
    assert mp.mpf(pld.p_inf) <= exact * (1 + 1e-9)


@pytest.mark.parametrize("sigma,h,tail", [(1.0, 0.05, 1e-12), (0.5, 0.1, 1e-20), (3.0, 0.02, 1e-16)])
def test_connect_the_dots_masses_match_slope_formula(sigma, h, tail):
    """p_i = x_i (B_{i-1} - B_i) with B from the exact curve values (mpmath, 40 digits).

    The library builds the masses from interval masses instead (same algebra) and
    rounds each cell's split towards its right end on purpose; so masses agree to
    absolute round-off (total mass 1), and the curve of (masses + mass_err), which is
    what the composition uses, never lies below the exact interpolant at the grid."""
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    g = grid_for(prof, h, tail)
    pld = connect_the_dots(prof, g)
    m, err = full_masses(pld, g)
    with mp.workdps(DPS):
        x = [mp.exp(mp.mpf(float(e))) for e in g.eps]
        d = [gauss_delta(r, float(e)) for e in g.eps]
        B = [(1 - d[0]) / x[0]] + [(d[i - 1] - d[i]) / (x[i] - x[i - 1]) for i in range(1, g.n + 1)] + [mp.mpf(0)]
        exact = [x[i] * (B[i] - B[i + 1]) for i in range(g.n + 1)]
        assert all(v >= 0 for v in exact)  # convexity of the true curve
        assert abs(mp.fsum(exact) + d[-1] - 1) < mp.mpf(10) ** -30
        # Q-mass of the PLD: sum p_i e^{-eps_i} = B_{-1} <= 1
        assert mp.fsum(p / xi for p, xi in zip(exact, x)) <= 1
    diff = np.array([float(mp.mpf(a) - b) for a, b in zip(m, exact)])
    assert np.max(np.abs(diff)) <= 1e-13
    assert float(np.sum(m / np.exp(g.eps))) <= 1 + 1e-12
    up = GridMeasure(g.h, g.start, m + err, pld.p_inf)
    for e in g.eps[:: max(1, g.n // 40)]:
        assert float(up.delta(e)) >= float(gauss_delta(r, e)) * (1 - 1e-14) - 1e-16


# ----------------------------------------------------------------------------
# the optimistic hull
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_convex_hull_is_below_and_converges_at_second_order(sigma):
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    gaps = []
    for h in [0.1, 0.05, 0.025]:
        g = grid_for(prof, h, 1e-12)
        pld = convex_hull_optimistic(prof, g)
        assert not pld.pessimistic
        sel = np.unique(np.linspace(0, g.n, 80).astype(int))
        eps = np.concatenate([g.eps[sel], g.eps[sel][:-1] + h / 3])
        t = np.array([float(gauss_delta(r, e)) for e in eps])
        v = pld.delta(eps)
        assert np.all(v <= t * (1 + 1e-12) + 1e-15)
        gaps.append(np.max(t - v))
    # tangent-based lower bounds are O(h^2): halving h divides the gap by ~4
    assert gaps[1] <= gaps[0] / 3 and gaps[2] <= gaps[1] / 3, gaps
    assert gaps[0] <= 0.01


# ----------------------------------------------------------------------------
# atoms on the grid: both discretisations are exact
# ----------------------------------------------------------------------------
def rr_delta_mp(eps0, eps):
    with mp.workdps(DPS):
        e0 = mp.mpf(eps0)
        p = mp.exp(e0) / (1 + mp.exp(e0))
        a = mp.exp(mp.mpf(eps))
        return max(mp.mpf(0), p - a * (1 - p)) + max(mp.mpf(0), (1 - p) - a * p)


def laplace_delta_mp(a, eps):
    a, eps = mp.mpf(a), mp.mpf(eps)
    if eps >= a:
        return mp.mpf(0)
    if eps >= -a:
        return 1 - mp.exp((eps - a) / 2)
    return 1 - mp.exp(eps)


@pytest.mark.parametrize("N", [1, 2, 5])
@pytest.mark.parametrize("kind", ["ctd", "hull"])
def test_randomized_response_on_grid_is_discretised_exactly(N, kind):
    """With eps0 = ln 3 and h = ln 3 / N the atoms +-eps0 are grid points and the true
    curve is linear in alpha between grid points: the pessimistic and the optimistic
    PLDs must both reproduce it (up to round-off)."""
    eps0 = math.log(3)
    prof = randomized_response_profile(eps0)
    g = grid_for(prof, eps0 / N, 1e-12)
    pld = (connect_the_dots if kind == "ctd" else convex_hull_optimistic)(prof, g)
    eps = np.concatenate([g.eps, g.eps[:-1] + g.h / 2, [-3.0, 2.0]])
    got = pld.delta(eps)
    for e, v in zip(eps, got):
        t = rr_delta_mp(eps0, e)
        assert abs(v - t) <= 1e-13, (kind, N, e, v, float(t))


@pytest.mark.parametrize("N", [10, 20])
@pytest.mark.parametrize("kind", ["ctd", "hull"])
def test_laplace_with_atoms_on_grid_hits_the_curve_at_grid_points(N, kind):
    """Laplace (a = 1) on h = 1/N: the atoms at +-1 are grid points.  At the grid points
    the connect-the-dots curve equals the truth.  The optimistic hull is built from
    points on tangent lines of the convex curve h(alpha) = 1 - sqrt(alpha / e) on
    [1/e, e] (linear elsewhere), so it lies within the largest tangent error
    (1/2) max|h''| dx^2 of the truth, with max|h''| = e/4 and dx <= e (1 - e^-h)."""
    prof = LaplaceProfile(1.0)
    h = 1.0 / N
    g = grid_for(prof, h, 1e-12)
    assert np.any(np.isclose(g.eps, 1.0, atol=1e-15)) and np.any(np.isclose(g.eps, -1.0, atol=1e-15))
    pld = (connect_the_dots if kind == "ctd" else convex_hull_optimistic)(prof, g)
    got = pld.delta(g.eps)
    tangent_err = 0.5 * (math.e / 4) * (math.e * -math.expm1(-h)) ** 2
    for e, v in zip(g.eps, got):
        t = laplace_delta_mp(1.0, e)
        if kind == "ctd":
            assert abs(v - t) <= 1e-13, (e, v, float(t))
        else:
            assert v <= t + 1e-13
            assert t - v <= tangent_err + 1e-13, (N, e, v, float(t), tangent_err)


# ----------------------------------------------------------------------------
# privacy buckets (baseline)
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("sigma,h", [(1.0, 0.1), (4.0, 0.02)])
def test_privacy_buckets_masses_and_direction(sigma, h):
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    tail = 1e-14
    g = grid_for(prof, h, tail)
    pes = privacy_buckets(prof, g, pessimistic=True)
    opt = privacy_buckets(prof, g, pessimistic=False)
    mp_, _ = full_masses(pes, g)
    mo, _ = full_masses(opt, g)
    with mp.workdps(DPS):
        cdf = [mp.ncdf((mp.mpf(float(e)) - r * r / 2) / r) for e in g.eps]  # P(L <= eps_i)
        cell = [cdf[i] - cdf[i - 1] for i in range(1, g.n + 1)]
    # pessimistic: P(eps_{i-1} < L <= eps_i) at eps_i (round up); optimistic: at eps_{i-1}
    for i in range(1, g.n):
        assert abs(mp_[i] - cell[i - 1]) <= 1e-13 * cell[i - 1] + 1e-17
        assert abs(mo[i] - cell[i]) <= 1e-13 * cell[i] + 1e-17
    # the curve of the pessimistic buckets dominates connect-the-dots (the best
    # pessimistic PLD on the grid), which dominates the truth; the optimistic
    # buckets lie below the truth
    ctd = connect_the_dots(prof, g)
    eps = np.linspace(g.eps[0], g.eps[-1], 301)
    t = np.array([float(gauss_delta(r, e)) for e in eps])
    assert np.all(pes.delta(eps) >= ctd.delta(eps) * (1 - 1e-12) - 1e-15)
    assert np.all(ctd.delta(eps) >= t * (1 - 1e-12) - 1e-15)
    assert np.all(opt.delta(eps) <= t * (1 + 1e-12) + 1e-15)


# ----------------------------------------------------------------------------
# reading a discrete PLD: delta(eps) and eps(delta), exact per segment
# ----------------------------------------------------------------------------
def _small_plds():
    out = []
    rng = np.random.default_rng(42)
    for start, n, p_inf in [(-3, 7, 0.0), (-10, 25, 1e-3), (0, 5, 0.2), (-40, 81, 1e-9)]:
        m = rng.random(n) ** 3
        m *= (1 - p_inf) / m.sum()
        out.append(DiscretePLD(h=0.07, start=start, masses=m, p_inf=p_inf, pessimistic=True))
    prof = approx_dp_profile(0.5, 1e-4)
    out.append(connect_the_dots(prof, grid_for(prof, 0.05, 1e-12)))
    return out


@pytest.mark.parametrize("idx", range(5))
def test_discrete_pld_curve_matches_direct_sum(idx):
    pld = _small_plds()[idx]
    grid = pld.eps_grid
    eps = np.concatenate([np.linspace(grid[0] - 2, grid[-1] + 1, 97), grid, grid[:-1] + pld.h / 3])
    got = pld.delta(eps)
    for e, v in zip(eps, got):
        t = mp_curve(pld.masses, grid, pld.p_inf, e)
        assert abs(v - t) <= 1e-14 + 1e-12 * t, (e, v, t)
    assert pld.total_mass() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("idx", range(5))
def test_discrete_pld_epsilon_inverts_the_curve(idx):
    """eps(delta) = inf{eps : delta(eps) <= delta}, against bisection on the directly summed curve."""
    pld = _small_plds()[idx]
    grid = pld.eps_grid
    # deltas the curve reaches: above its floor p_inf, below 1
    deltas = np.geomspace(1.5 * pld.p_inf if pld.p_inf > 0 else 1e-12, 0.9, 25)
    got = pld.epsilon(deltas)
    m, grid_ = np.asarray(pld.masses), np.asarray(grid)

    def direct(e):  # p_inf + sum_{eps_i > e} m_i (1 - e^{e - eps_i}), summed exactly-rounded
        sel = grid_ > e
        return pld.p_inf + math.fsum(m[sel] * -np.expm1(e - grid_[sel]))

    for d, e in zip(deltas, got):
        lo, hi = grid[0] - 30.0, float(grid[-1])
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if direct(mid) > d:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-13 * max(1.0, abs(hi)):
                break
        assert abs(e - hi) <= 1e-9 * max(1.0, abs(hi)), (d, e, hi)
    # below p_inf the curve never gets: +inf
    if pld.p_inf > 0:
        assert np.isinf(pld.epsilon(pld.p_inf / 2))


# ----------------------------------------------------------------------------
# the optimistic hull on an offset lattice (docs/MATH.md 3.2)
# ----------------------------------------------------------------------------
def _subsampled(sigma, q, sampling, label):
    import pldlib

    m = pldlib.Gaussian(sigma, q=q, sampling=sampling, relation="add_remove")
    return [b for b in m.branches() if b.label == label][0].lower


@pytest.mark.parametrize("sampling", ["poisson", "wor"])
@pytest.mark.parametrize("label", ["remove", "add"])
@pytest.mark.parametrize("q,h", [(3e-4, 4e-3), (1e-3, 1e-2), (2e-3, 2.5e-3)])
def test_offset_hull_is_a_valid_pair_below_the_truth_with_delta0_positive(sampling, label, q, h):
    """On a lattice through 0 coarser than 2|ln(1 - q)| no optimistic PLD has delta(0) > 0;
    the offset lattice (a point halfway to the support edge) gives one.  Checked: the curve is
    below the true curve (the profile's own log-space evaluation, at 2,000 points and at the
    lattice points), the sub-probabilities P and Q (masses minus their round-off bounds) are
    <= 1 (a dominated pair), and delta(0) > 0 while the lattice through 0 gives 0.  (How much
    of the true delta(0) a coarse lattice can keep is limited: the hull is linear across the
    cell around 0, which is wider than the loss spread here.)"""
    from pldlib.pld.discretize import hull_offset

    prof = _subsampled(0.8, q, sampling, label)
    off = hull_offset(prof, h)
    assert off != 0.0 and abs(off) < h
    g = grid_for(prof, h, 1e-30, offset=off)
    p = convex_hull_optimistic(prof, g)
    assert p.shift == off
    ml = np.maximum(p.masses - p.mass_err, 0.0)
    assert math.fsum(ml) + p.p_inf <= 1.0 + 1e-15
    assert math.fsum(ml * np.exp(-p.eps_grid)) <= 1.0 + 1e-15
    eps = np.concatenate([np.linspace(-0.05, 0.3, 1500), np.geomspace(1e-6, 3.0, 500), p.eps_grid[::7]])
    truth = prof.delta(eps)
    p_lo = DiscretePLD(p.h, p.start, ml, p.p_inf, False, None, p.shift)  # the certified pair
    assert np.all(p_lo.delta(eps) <= truth * (1 + 1e-12) + 1e-300)
    p0 = convex_hull_optimistic(prof, grid_for(prof, h, 1e-30))
    d0, d00, t0 = float(p.delta(0.0)), float(p0.delta(0.0)), float(prof.delta(np.array([0.0]))[0])
    assert d00 == 0.0 and 0.1 * t0 < d0 <= t0


def test_composition_of_offset_lattice_plds_is_shifted_by_the_offsets():
    """Composing k copies of a PLD on the lattice (i + s) h equals composing it on i h and
    shifting by k s h: checked against the float convolution of the masses placed at their
    true losses (curves at 40 points, lower side with its alias term)."""
    from pldlib.pld.compose import compose
    from pldlib.pld.discretize import hull_offset

    prof = _subsampled(0.8, 1e-3, "poisson", "remove")
    h, k = 1e-2, 12
    off = hull_offset(prof, h)
    lo = convex_hull_optimistic(prof, grid_for(prof, h, 1e-30, offset=off))
    up = connect_the_dots(prof, grid_for(prof, h, 1e-30))
    lo_x = DiscretePLD(lo.h, lo.start, lo.masses, lo.p_inf, False, None, lo.shift)
    comp = compose([up], [lo_x], [k])
    ref = np.array([1.0])
    for _ in range(k):
        ref = np.convolve(ref, lo.masses)
    ref_meas = GridMeasure(h, k * lo.start, ref, 1 - (1 - lo.p_inf) ** k, k * off)
    eps = np.linspace(-0.02, 0.6, 40)
    want = ref_meas.delta(eps)
    got = comp.lower.delta(eps) - comp.alias_term(eps)
    assert np.all(got <= want * (1 + 1e-9) + 1e-15)
    # and it is that curve, not just below it (less the round-off allowance of the masses)
    assert np.all(got >= want * (1 - 1e-6) - 1e-10)
    for theta in (5.0, 40.0):
        c = compose([up], [lo_x], [k], theta=theta)
        sel = eps >= c.valid_from
        g2 = c.lower.delta(eps[sel]) - c.alias_term(eps[sel])
        assert np.all(g2 <= want[sel] * (1 + 1e-9) + 1e-15)


def test_offset_lattice_at_huge_spacings_falls_back_without_overflow():
    """A coarsened grid (h in the hundreds, as the memory-budget fallback makes) puts e^eps of
    the cell around 0 beyond floating point: hull_offset answers 0 (the lattice through 0), and
    the cell helper refuses with ValueError (which the accountant catches), never OverflowError
    (found by the robustness run: rr x 42 + Poisson Laplace x 5e8 + Laplace x 14)."""
    from pldlib.pld.discretize import _middle_cell_choice, hull_offset

    prof = _subsampled(0.8, 0.1, "poisson", "remove")
    assert hull_offset(prof, 800.0) == 0.0
    tau = np.linspace(-1.0, 750.0, 8)
    with pytest.raises(ValueError):
        _middle_cell_choice(-1.0, 750.0, 1.0, 0.0, tau, np.ones(8), np.ones(8))


@pytest.mark.parametrize("start, shift", [(-37, 0.0), (40, 0.0), (-5, 3.1e-3), (16, -2.2e-3)])
def test_coarsened_pld_is_connect_the_dots_of_its_own_curve(start, shift):
    """DiscretePLD.coarsened(8): the curve equals the fine one at the coarse points, lies on or
    above it in between, and the total P- and Q-masses are kept (all against direct mpmath sums)."""
    rng = np.random.default_rng(start + 100)
    h = 1.3e-2
    m = rng.random(203) ** 3
    m = 0.98 * m / m.sum()
    fine = DiscretePLD(h=h, start=start, masses=m, p_inf=0.02, pessimistic=True, shift=shift)
    c = fine.coarsened(8)
    assert c.h == pytest.approx(8 * h) and c.shift == shift and c.p_inf == fine.p_inf
    ef, ec = fine.eps_grid, c.eps_grid
    # the coarse points are points of the fine lattice's multiples of 8h, covering its support
    assert np.allclose((ec - shift) / (8 * h), np.round((ec - shift) / (8 * h)))
    assert ec[0] <= ef[0] + 1e-12 and ec[-1] >= ef[-1] - 1e-12
    with mp.workdps(DPS):
        q_fine = mp.fsum(mp.mpf(float(a)) * mp.exp(-mp.mpf(float(e))) for a, e in zip(m, ef))
        q_coarse = mp.fsum(mp.mpf(float(a)) * mp.exp(-mp.mpf(float(e))) for a, e in zip(c.masses, ec))
    assert math.fsum(c.masses) == pytest.approx(math.fsum(m), rel=1e-13)
    assert float(q_coarse) == pytest.approx(float(q_fine), rel=1e-12)
    for e in ec[(ec > ef[0] - 0.2) & (ec < ef[-1] + 0.2)]:
        want = mp_curve(m, ef, 0.02, e)
        assert float(mp_curve(c.masses, ec, 0.02, e)) == pytest.approx(float(want), rel=1e-12, abs=1e-15)
    for e in np.linspace(ef[0] - 0.05, ef[-1] + 0.05, 157):
        assert mp_curve(c.masses, ec, 0.02, e) >= mp_curve(m, ef, 0.02, e) - 1e-15


# ----------------------------------------------------------------------------
# connect the dots at some grid points only (docs/MATH.md 3.1)
# ----------------------------------------------------------------------------
def mp_chord(r, a, b, e):
    """The true Gaussian curve's chord between a and b, linear in e^eps, at e (mpmath)."""
    with mp.workdps(DPS):
        a, b, e = mp.mpf(a), mp.mpf(b), mp.mpf(e)
        da, db = gauss_delta(r, a), gauss_delta(r, b)
        return da + (db - da) * (mp.exp(e) - mp.exp(a)) / (mp.exp(b) - mp.exp(a))


@pytest.mark.parametrize("sigma,h,seed", [(1.0, 0.02, 0), (0.5, 0.05, 1), (3.0, 0.01, 2)])
def test_connect_the_dots_on_kept_points_interpolates_there_and_follows_the_chords_between(sigma, h, seed):
    """keep=: the curve equals the true curve at the points kept and, between two of them, is
    the true curve's chord linear in e^eps (so above the truth, and above the curve of the whole
    grid); the masses sit on the kept points only and keep total 1; keeping every point gives
    the whole grid's numbers exactly."""
    prof = GaussianProfile(sigma)
    r = 1.0 / sigma
    g = grid_for(prof, h, 1e-12)
    rng = np.random.default_rng(seed)
    keep = np.concatenate([[0], np.flatnonzero(rng.random(g.n - 1) < 0.25) + 1, [g.n]])
    full = connect_the_dots(prof, g)
    same = connect_the_dots(prof, g, keep=np.arange(g.n + 1))
    assert same.start == full.start and np.array_equal(same.masses, full.masses)
    assert np.array_equal(same.mass_err, full.mass_err) and same.p_inf == full.p_inf
    thin = connect_the_dots(prof, g, keep=keep)
    m, err = full_masses(thin, g)
    left_out = np.setdiff1d(np.arange(g.n + 1), keep)
    assert np.all(m[left_out] == 0) and np.all(err[left_out] == 0)
    assert math.fsum(m) + thin.p_inf == pytest.approx(1.0, abs=1e-12)
    eps = g.eps
    for i in keep[np.unique(np.linspace(0, keep.size - 1, 25).astype(int))]:
        v, t = float(thin.delta(eps[i])), gauss_delta(r, eps[i])
        assert v >= t * (1 - 1e-14) - 1e-16 and v - t <= 1e-10 * t + 1e-14, (eps[i], v, t)
    for i in left_out[np.unique(np.linspace(0, left_out.size - 1, 40).astype(int))]:
        j = np.searchsorted(keep, i)
        a, b = eps[keep[j - 1]], eps[keep[j]]
        for e in (eps[i], eps[i] + 0.5 * h):
            v, want = float(thin.delta(e)), mp_chord(r, a, b, min(e, b))
            assert v >= want * (1 - 1e-13) - 1e-16 and v - want <= 1e-10 * want + 1e-14, (e, v, want)
            assert v >= float(full.delta(e)) * (1 - 1e-13) - 1e-16
    for bad in (keep[1:], keep[:-1], keep[::-1], np.array([0, 3, 3, g.n])):
        with pytest.raises(ValueError, match="keep"):
            connect_the_dots(prof, g, keep=bad)


def test_kept_points_leave_out_only_cells_of_little_tilted_mass():
    """kept_points: both ends and every 8th lattice point are kept; a coarse cell loses points
    only when both its ends are among the coarse points that together carry at most ``rel`` of
    the tilted mass exp(theta eps) m (summed in mpmath); the cells at the tilted law's peak are
    whole; lattices that do not line up and negative tilts give None."""
    from pldlib.pld.discretize import kept_points

    prof = GaussianProfile(1.5)
    h, theta, rel = 2e-3, 1.3, 1e-4
    g = grid_for(prof, h, 1e-12)
    coarse = connect_the_dots(prof, grid_for(prof, 8 * h, 1e-12))
    keep = kept_points(g, coarse, theta, rel)
    assert keep is not None and keep[0] == 0 and keep[-1] == g.n and np.all(np.diff(keep) > 0)
    lattice = np.arange(g.n + 1)[(g.start + np.arange(g.n + 1)) % 8 == 0]
    assert np.isin(lattice, keep).all()
    assert keep.size < 0.7 * (g.n + 1)  # (61% here)
    kept = np.zeros(g.n + 1, dtype=bool)
    kept[keep] = True
    ce = coarse.eps_grid
    with mp.workdps(DPS):
        tilted = [mp.mpf(float(mj)) * mp.exp(mp.mpf(theta) * mp.mpf(float(e))) for mj, e in zip(coarse.masses, ce)]
        total = mp.fsum(tilted)
    ends = set()
    for i in np.flatnonzero(~kept):
        c = (g.start + i) // 8 - coarse.start  # the coarse cell (c, c + 1) holding grid point i
        ends.update((c, c + 1))
    with mp.workdps(DPS):
        assert mp.fsum(tilted[c] for c in ends if 0 <= c < len(tilted)) <= rel * total
    peak = int(np.argmax([float(t) for t in tilted]))
    for c in (peak - 1, peak):  # the two cells beside the peak
        lo_i, hi_i = 8 * (coarse.start + c) - g.start, 8 * (coarse.start + c + 1) - g.start
        assert kept[max(lo_i, 0): min(hi_i, g.n) + 1].all()
    from pldlib.pld.discretize import lattice_points

    for start, n in [(-37, 3), (8, 0), (5, 2), (-16, 17), (3, 40)]:  # (no lattice point, one, several)
        want = sorted({0, n} | {i for i in range(n + 1) if (start + i) % 8 == 0})
        assert lattice_points(Grid(h=h, start=start, n=n), 8).tolist() == want
    assert kept_points(g, coarse, -0.5, rel) is None
    assert np.array_equal(kept_points(g, coarse, theta, 1e-300), np.arange(g.n + 1))
    g_off = Grid(h=g.h, start=g.start, n=g.n, offset=0.3 * h)
    assert kept_points(g_off, coarse, theta, rel) is None
    odd = connect_the_dots(prof, grid_for(prof, 7.5 * h, 1e-12))
    assert kept_points(g, odd, theta, rel) is None


class _PTailCut(FiniteProfile):
    """A finite pair whose loss range is cut at the P-tail (the generic rule of profiles without
    their own), so that its far-left atom -- tiny P-mass, Q-mass 0.19 -- lies left of the grid:
    the shape of an add-direction subsampled pair at small sigma."""

    def eps_bounds(self, tail):
        return self._eps_bounds_search(tail)


def _far_left_pair():
    with mp.workdps(DPS):
        q, b = mp.mpf("0.19"), mp.mpf(-150)
        a, p0 = -mp.log(1 - q), q * mp.exp(b)  # Q-masses 1 - q at a, q at b: Q sums to 1
    return _PTailCut([float(b), float(a)], [float(p0), 1.0 - float(p0)]), (a, b, p0)


def _far_left_truth(k, eps, a, b, p0):
    """delta of k compositions by the exact binomial sum over how many steps land on b (40 digits)."""
    with mp.workdps(DPS):
        e = mp.mpf(eps)
        return mp.fsum(mp.binomial(k, j) * p0**j * (1 - p0) ** (k - j) * max(0, 1 - mp.exp(e - (j * b + (k - j) * a)))
                       for j in range(k + 1))


@pytest.mark.parametrize("k", [2, 5, 48])
@pytest.mark.parametrize("spacing", [None, 2.7e-3])
def test_optimistic_side_keeps_the_mass_of_a_pair_whose_q_mass_lies_left_of_the_grid(k, spacing):
    """Lower ends within 0.2% of the exact binomial sum where the hull alone gave about 1 - alpha
    (2 steps at delta(0): 2e-6 on the automatic grid against 0.3439); upper ends above it."""
    from pldlib.mechanisms import Custom
    from pldlib.methods.pld import account

    prof, (a, b, p0) = _far_left_pair()
    lo_, hi_ = prof.eps_bounds(1e-38)
    assert lo_ > -1.0  # (the far atom is outside the grid: the case this is about)
    acc = account(Custom(profile=prof), steps=k, **({"spacing": spacing} if spacing else {}))
    for eps in (0.0, 0.1, 0.3):
        iv = acc.delta(eps)
        t = float(_far_left_truth(k, eps, a, b, p0))
        assert iv.lower <= t <= iv.upper, (eps, iv, t)
        assert iv.lower >= t * (1 - 2e-3), (eps, iv, t)


def test_optimistic_is_the_hull_where_the_hull_holds_the_mass():
    """Elsewhere the hull itself is returned (no second discretisation): a Gaussian pair."""
    prof = GaussianProfile(1.0)
    g = grid_for(prof, 1e-3, 1e-30)
    a, b = optimistic(prof, g), convex_hull_optimistic(prof, g)
    assert a.start == b.start and np.array_equal(a.masses, b.masses) and a.p_inf == b.p_inf
