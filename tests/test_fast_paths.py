"""Fast paths of the accountant against their plain reference computations.

* the vectorised lower hull (discretize._lower_hull_values) against Andrew's
  monotone chain on point sets built to defeat neighbour-only passes;
* the windowed log-MGF of composition._Side (negligible blocks bounded, not
  summed) against the full log-sum-exp: never below it, and equal to round-off.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp

import pldlib.methods.pld_grid as pld_grid
from pldlib.pld import compose as C
from pldlib.pld.discretize import _lower_hull_values, _monotone_chain


def _reference_hull(px, py, x):
    hx, hy = _monotone_chain(px, py)
    return np.interp(x, hx, hy)


def _point_sets():
    rng = np.random.default_rng(7)
    n = 5000
    x = np.cumsum(rng.uniform(0.1, 1.0, n))
    yield "convex+noise", x, (x - x.mean()) ** 2 * 1e-3 + rng.normal(0, 1e-3, n)
    # a long concave run ending in a drop at the last point (one point per neighbour pass)
    y = 1e-3 * np.exp(-x / x[-1]) + 1e-4
    y[-1] = 0.0
    yield "concave tail", x, y
    yield "concave head", x, np.concatenate([[0.0], 1.0 - (x[1:] / x[-1]) ** 2])
    yield "sawtooth", x, np.where(np.arange(n) % 3 == 0, 0.0, 1.0) + 1e-6 * x
    yield "random", x, rng.uniform(0, 1, n)
    yield "staircase", x, np.repeat(np.linspace(1, 0, n // 50), 50)
    # a line with round-off noise (the optimistic hull's far-left candidates, h ~ 1 - alpha):
    # late passes flag a few points each, which the local repair finishes
    xl = np.exp(np.linspace(-8.0, 0.0, n))
    yield "noisy line", xl, (1.0 - xl) * (1.0 + 1e-15 * rng.standard_normal(n))
    # a convex run above the chord to one low point: only its neighbour is flagged at first,
    # then the removals cascade through the run one point at a time
    yc = 1e-3 * (x / x[-1]) ** 2 + 1.0
    yc[-1] = 0.0
    yield "dip after convex run", x, yc


@pytest.mark.parametrize("name,px,py", list(_point_sets()), ids=[p[0] for p in _point_sets()])
def test_lower_hull_matches_monotone_chain(name, px, py):
    v = _lower_hull_values(px, py, px)
    ref = _reference_hull(px, py, px)
    np.testing.assert_allclose(v, ref, rtol=1e-12, atol=1e-12 * np.max(np.abs(py)))
    # the hull lies under every point (to round-off) and is convex
    assert np.all(v <= py + 1e-12 * np.max(np.abs(py)))
    s = np.diff(v) / np.diff(px)
    assert np.all(np.diff(s) >= -1e-9 * np.max(np.abs(s)))


@pytest.mark.parametrize("cap", [1, 7, 128, 10**6])
def test_local_repair_hands_back_to_the_passes(cap, monkeypatch):
    # with a small cap the repair stops early and the vectorised passes resume on what is left
    from pldlib.pld import discretize as D

    monkeypatch.setattr(D, "LOCAL_REPAIR_MAX", cap)
    for name, px, py in _point_sets():
        v = D._lower_hull_values(px, py, px)
        ref = _reference_hull(px, py, px)
        np.testing.assert_allclose(v, ref, rtol=1e-12, atol=1e-12 * np.max(np.abs(py)), err_msg=name)


def _sides():
    rng = np.random.default_rng(3)
    h = 1e-3
    e = np.arange(-2000, 30000) * h
    # subsampled-Gaussian-like: a bulk near 0 and a long light right tail
    m = np.exp(-0.5 * (e / 0.01) ** 2) + 1e-3 * np.exp(-0.5 * ((e - 1.0) / 3.0) ** 2) * np.exp(-e)
    m[rng.uniform(size=m.size) < 0.05] = 0.0
    yield C._Side(h, -2000, m / m.sum(), 100)
    m2 = rng.uniform(size=5000) ** 8
    yield C._Side(0.01, -100, m2 / m2.sum(), 3)
    yield C._Side(0.01, -10, np.array([0.2, 0.0, 0.5, 0.3]), 7)  # below the block threshold


@pytest.mark.parametrize("side", list(_sides()), ids=["long-tail", "random", "tiny"])
def test_windowed_log_mgf_is_an_upper_bound_within_round_off(side):
    theta = np.concatenate([-np.geomspace(1e-3, 3e3, 25), [0.0], np.geomspace(1e-3, 3e3, 25)])
    got = side.log_mgf(theta)
    if side.masses.size > 10_000:  # the window really skips blocks there
        assert any(np.subtract(*side._windows(np.array([t]))[1::-1]) < side.masses.size // 2 for t in theta)
    with np.errstate(divide="ignore"):
        logm = np.log(side.masses)
    ref = np.array([logsumexp(logm + t * side.eps) for t in theta])
    assert np.all(got >= ref - 1e-12 * np.maximum(1.0, np.abs(ref)))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    for t in [0.0, 2.0, 50.0, -5.0]:
        w = np.exp(logm + t * side.eps - logsumexp(logm + t * side.eps))
        mean = float(np.sum(w * side.eps))
        var = float(np.sum(w * (side.eps - mean) ** 2))
        m1, v1 = side.tilted_moments(t)
        assert m1 == pytest.approx(mean, rel=1e-9, abs=1e-12)
        assert v1 == pytest.approx(var, rel=1e-9, abs=1e-15)


def _mid_side():
    """A side of ~3,000 points (summed in full, in the product form) with a heavy right end."""
    h = 1e-4
    e = np.arange(-500, 2600) * h
    m = np.exp(-0.5 * (e / 0.002) ** 2) + 1e-9 * np.exp(-e / 0.05)
    return C._Side(h, -500, m / m.sum(), 1)


def _underflowing_sides():
    """Masses decaying geometrically into the subnormal range: at a large tilt the far end, where
    every mass is below 1e-250, dominates, and products of such masses with e^{-50}..e^{50} would
    underflow (a random search found ln M understated by 2.5e-3 before the block scaling)."""
    for n, h, start in [(17610, 0.0021269755257753995, -16403), (3000, 0.002, -2500)]:
        x = np.arange(n)
        m = np.exp(-x * 0.2322103932090195)
        m[np.random.default_rng(0).uniform(size=n) < 0.08] = 0.0
        yield C._Side(h, start, m / m.sum(), 1)


@pytest.mark.parametrize("whole_max", [0, None], ids=["row-windows", "whole-side"])
@pytest.mark.parametrize("side", list(_sides()) + [_mid_side()] + list(_underflowing_sides()),
                         ids=["long-tail", "random", "tiny", "mid", "subnormal-windowed", "subnormal-full"])
def test_log_mgf_upper_is_never_below_an_extended_precision_sum(side, whole_max, monkeypatch):
    """The Chernoff slopes' ln M (product form, or log-sum-exp rounded up) against the same sum in
    80-bit extended precision: never below it, and within 1e-9 of it -- on both of its paths
    (every row over the whole side, or each row over its window: ``_PRODUCT_ALL_MAX`` 0 forces
    the windows on sides above _WINDOW_MIN points)."""
    if whole_max is not None:
        monkeypatch.setattr(C, "_PRODUCT_ALL_MAX", whole_max)
    theta = np.concatenate([-np.geomspace(1e-3, 3e5, 30), [0.0], np.geomspace(1e-3, 3e5, 30), [7.3, -41.0],
                            np.geomspace(10.0, 1e4, 60), -np.geomspace(10.0, 1e4, 60)])
    got = side.log_mgf_upper(theta)
    m = side.masses.astype(np.longdouble)
    e = side.eps.astype(np.longdouble)
    keep = m > 0
    ref = []
    for t in theta.astype(np.longdouble):
        z = np.log(m[keep]) + t * e[keep]
        c = z.max()
        ref.append(float(c + np.log(np.sum(np.exp(z - c)))))
    ref = np.array(ref)
    assert np.all(got >= ref), np.max(ref - got)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9)
    # (the product form is what runs on the mid-sized side)
    assert side.masses.size < C._PRODUCT_FROM or side.masses.size > C._PRODUCT_ALL_MAX or \
        np.sum(np.abs(theta) * side.h * C._PRODUCT_MIN <= 50.0) > 10


@pytest.mark.parametrize("mech", ["gauss-poisson", "gauss-sub", "gauss-add"])
@pytest.mark.parametrize("tail", [1e-12, 1e-38])
def test_generic_eps_bounds_hold_and_are_tight(mech, tail):
    """Unbounded losses (the generic search of PrivacyProfile.eps_bounds)."""
    import pldlib

    m = {"gauss-poisson": pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson"),
         "gauss-sub": pldlib.Gaussian(sigma=2.0, q=0.1, sampling="poisson", relation="substitution"),
         "gauss-add": pldlib.Gaussian(sigma=0.7, q=0.2, sampling="poisson", relation="add")}[mech]
    for b in m.branches():
        prof = b.upper
        lo, hi = prof.eps_bounds(tail)
        assert prof.eps_bounds(tail) == (lo, hi)  # cached
        assert float(prof.cdf_p(lo)) <= tail
        assert float(prof.sf_p(hi)) - prof.p_inf <= tail
        # tight to 1e-6 (relative to max(1, |end|)), unless the end is the support's own edge
        step = 1e-6
        if float(prof.cdf_p(lo)) > 0:
            assert float(prof.cdf_p(lo + step * max(1, abs(lo)))) > tail or lo >= 0
        if float(prof.sf_p(hi)) - prof.p_inf > 0:
            assert float(prof.sf_p(hi - step * max(1, abs(hi)))) - prof.p_inf > tail or hi <= 0


def test_cached_sides_give_the_same_compositions_as_fresh_ones():
    """Sides cached on a DiscretePLD (shared by every steps count and tilt) change no result:
    composing after many other compositions of the same PLDs equals composing copies with
    empty caches, bit for bit; and the cache never carries one side's count to another."""
    import dataclasses

    import pldlib
    from pldlib.methods.pld import account

    acc = account(pldlib.Gaussian(sigma=1.0, q=0.02, sampling="poisson"), steps=2000, spacing=2e-3)
    st = acc._branches[-1]
    for k in (10, 300, 2000):  # fill the caches with other counts and tilts
        C.compose(st.uppers, st.lowers, [k], theta=C.estimate_tilt(st.uppers, [k], 1e-8))
    fresh_u = [dataclasses.replace(p) for p in st.uppers]
    fresh_l = [dataclasses.replace(p) for p in st.lowers]
    assert "_sides" in st.uppers[0].__dict__ and "_sides" not in fresh_u[0].__dict__
    for k in (1, 700):
        th_a = C.estimate_tilt(st.uppers, [k], 1e-6)
        th_b = C.estimate_tilt(fresh_u, [k], 1e-6)
        assert th_a == th_b
        a = C.compose(st.uppers, st.lowers, [k], theta=th_a)
        b = C.compose(fresh_u, fresh_l, [k], theta=th_b)
        for ca, cb in ((a.upper, b.upper), (a.lower, b.lower), (a.roundoff, b.roundoff)):
            assert (ca.start, ca.const) == (cb.start, cb.const)
            np.testing.assert_array_equal(ca.masses, cb.masses)
        assert (a.alias_log_bound, a.valid_from, a.n_bins) == (b.alias_log_bound, b.valid_from, b.n_bins)
        assert [sd.count for sd in (C._Side.of(st.uppers[0], k), C._Side.of(st.uppers[0], 3))] == [k, 3]


# ---------------------------------------------------------------- speed paths (issue 21)
@pytest.mark.parametrize("k", [1, 2, 3, 7, 64, 1000, 10_007, 10**6])
def test_binary_powering_is_within_its_round_off_bound(k):
    """_int_power(X, k) against the product evaluated in high precision (mpmath, 40 digits):
    relative error <= (pi + 1) k u, the term docs/MATH.md 4.4 charges for the powers."""
    import mpmath

    rng = np.random.default_rng(k)
    # |X| <= 1 as for the spectrum of a normalised (tilted) mass array
    X = rng.uniform(0.9, 1.0, 40) ** (1.0 / k) * np.exp(1j * rng.uniform(-np.pi, np.pi, 40))
    X0 = X.copy()
    got = C._int_power(X, k)
    assert np.array_equal(X, X0)  # (the products are made in place, never in the argument)
    # ... unless it may: the squarings then run in X's own array, with the same numbers
    X1 = X0.copy()
    assert np.array_equal(C._int_power(X1, k, overwrite_x=True), got)
    u = np.finfo(float).eps / 2
    with mpmath.workdps(40):
        for x, g in zip(X, got):
            ref = mpmath.mpc(x.real, x.imag) ** k
            assert abs(mpmath.mpc(g.real, g.imag) - ref) <= (np.pi + 1) * k * u * abs(ref) + 1e-300


def test_grid_values_and_consecutive_masses_match_the_single_functions():
    """The one-pass grid values and cell masses of connect-the-dots (and the hull's shared
    delta/sf_q evaluation) equal the separate sf/cdf evaluations and ``interval_masses`` they
    replace, for mixtures (Poisson and WOR, every direction) and a closed-form profile."""
    import pldlib
    from pldlib.pld.discretize import grid_for

    mechs = [pldlib.Gaussian(0.8, q=0.05, sampling="poisson", relation=r) for r in ("add", "remove", "substitution")]
    mechs += [pldlib.Gaussian(1.3, q=0.2, sampling="wor"), pldlib.Gaussian(1.0), pldlib.Laplace(1.0)]
    for mech in mechs:
        acc = pldlib.PLDAccountant(mech.relation).compose(mech.event, 1)
        for branch in acc.components[0][0].branches():
            prof = branch.upper
            eps = grid_for(prof, 1e-3, 1e-12).eps
            vals = prof.grid_values(eps)
            for got, fn in zip(vals, (prof.sf_p, prof.cdf_p, prof.sf_q, prof.cdf_q)):
                np.testing.assert_array_equal(got, fn(eps))
            if hasattr(prof, "delta_and_sf_q"):  # the optimistic hull's shared evaluation
                d, sq = prof.delta_and_sf_q(eps)
                np.testing.assert_array_equal(d, prof.delta(eps))
                np.testing.assert_array_equal(sq, prof.sf_q(eps))
            P, Q = prof.consecutive_masses(eps, vals)
            P0, Q0 = prof.interval_masses(eps[:-1], eps[1:])
            np.testing.assert_array_equal(P, P0)
            np.testing.assert_array_equal(Q, Q0)


def test_fft_thread_knob(monkeypatch):
    C._fft_threads.cache_clear()
    try:
        monkeypatch.setenv("PLDLIB_FFT_WORKERS", "3")
        rows = C.FFT_THREADS_ROWS
        assert C.fft_workers(C.FFT_THREADS_FROM, rows) == 3 and C.fft_workers(C.FFT_THREADS_FROM - 1, rows) == 1
        # a single transform (or a small batch) gets one thread: pocketfft would not split it
        assert C.fft_workers(C.FFT_THREADS_FROM) == 1 and C.fft_workers(10**8, rows - 1) == 1
        C._fft_threads.cache_clear()
        monkeypatch.setenv("PLDLIB_FFT_WORKERS", "two")
        with pytest.raises(ValueError, match="PLDLIB_FFT_WORKERS: must be a positive integer"):
            C.fft_workers(C.FFT_THREADS_FROM, rows)
    finally:
        C._fft_threads.cache_clear()


@pytest.mark.parametrize("relation", ["remove", "add_remove"])
def test_upper_only_and_default_paths_bracket_the_truth(relation):
    """The upper-only path (fixed fine spacing) and the default path against the mpmath
    contour-integral truth (pldlib.testing.truth) for a DP-SGD shape."""
    import pldlib
    from pldlib.testing.truth import epsilon_gaussian

    sigma, q, steps, delta = 1.0, 0.02, 300, 1e-5
    dirs = ["remove"] if relation == "remove" else ["remove", "add"]
    truth = max(float(epsilon_gaussian(delta, sigma, steps, q=q, direction=d)) for d in dirs)
    mech = pldlib.Gaussian(sigma, q=q, sampling="poisson", relation=relation)
    fast = pldlib.account(mech, steps=steps, spacing=2e-4, lower_bound=False).epsilon(delta)
    default = pldlib.account(mech, steps=steps).epsilon(delta)
    assert truth <= fast.upper <= truth * (1 + 1e-3)
    assert default.lower <= truth <= default.upper


def test_one_pass_cgf_equals_log_mgf_and_tilted_moments():
    # estimate_tilt's one-pass K, K', K'' of a side: the same numbers, bit for bit, as the
    # separate (cached, windowed beyond _WINDOW_MIN points) evaluations -- and both match an
    # independent log-sum-exp
    rng = np.random.default_rng(11)
    for n, h in [(9, 0.3), (700, 1e-3), (C._WINDOW_MIN, 2e-4), (50_000, 1e-4)]:
        m = rng.uniform(size=n) ** 6
        m[rng.uniform(size=n) < 0.1] = 0.0
        if n > C._WINDOW_MIN:  # (the windowed path, with skipped blocks, is the one compared)
            assert C._Side(h, -n // 3, m / m.sum(), 5)._row_windows(np.array([400.0]))[0][0] > 0
        for t in [0.0, 0.7, 35.0, -3.0, 400.0]:
            a = C._Side(h, -n // 3, m / m.sum(), 5)
            b = C._Side(h, -n // 3, m / m.sum(), 5)
            lm, m1, v1 = a.cgf_moments(t)
            assert lm == float(b.log_mgf(t)[0])
            assert (m1, v1) == b.tilted_moments(t)
            assert a.cgf_moments(t) == (lm, m1, v1)  # (cached)
            with np.errstate(divide="ignore"):
                z = np.log(b.masses) + t * b.eps
            assert lm == pytest.approx(logsumexp(z), rel=1e-13, abs=1e-13)


def test_cell_errors_single_switch_equals_the_two_sided_form():
    # connect-the-dots takes each cell's error from the side it differences; the sides switch
    # once (sf is non-increasing), so the fast path bounds each point's value once -- the same
    # numbers as bounding both sides everywhere and picking per cell (also when they do not
    # switch once: the general form is used then)
    from pldlib.profiles.base import cell_errors, value_error
    from scipy.special import ndtr

    def reference(sf, cdf, p_inf=0.0):
        use = sf[:-1] - p_inf < 0.5
        es, ec = value_error(sf), value_error(cdf)
        return np.where(use, es[:-1] + es[1:], ec[:-1] + ec[1:])

    z = np.linspace(-40.0, 40.0, 20_001)
    sf, cdf = ndtr(-z), ndtr(z)
    cases = [(sf, cdf, 0.0), (sf[:9000], cdf[:9000], 0.0), (sf[12000:], cdf[12000:], 0.0),
             (sf, cdf, 0.3), (sf[:3], cdf[:3], 0.0)]
    rng = np.random.default_rng(5)
    wobble = rng.permutation(sf)  # not monotone: the general form
    cases.append((wobble, 1.0 - wobble, 0.0))
    for s, c, p in cases:
        np.testing.assert_array_equal(cell_errors(s, c, p), reference(s, c, p))
    for v in [0.0, 1e-300, 3e-17, 0.25, 0.5, 0.999]:  # scalars and arrays agree
        assert float(value_error(v)) == float(value_error(np.array([v]))[0])


def test_upper_only_queries_on_large_grids_compose_thinned_plds(monkeypatch):
    """Upper-only eps(delta) on grids of >= THIN_FROM points connects the dots only where the
    tilted law carries mass (kept_points): the fine PLDs of the whole grid are never built; the
    answer brackets the mpmath truth, is not below the whole grid's answer (beyond round-off) and
    within 1e-7 of it; and it does not depend on what earlier queries built."""
    import pldlib
    import pldlib.methods.pld as A
    from pldlib.pld.discretize import connect_the_dots
    from pldlib.testing.truth import epsilon_gaussian

    sigma, q, steps, delta, h = 1.0, 0.01, 10000, 1e-5, 1e-4  # (the DP-SGD headline)
    truth = float(epsilon_gaussian(delta, sigma, steps, q=q, direction="remove"))
    mech = pldlib.Gaussian(sigma, q=q, sampling="poisson", relation="remove")
    acc = pldlib.account(mech, steps=steps, spacing=h, lower_bound=False)
    got = acc.epsilon(delta)
    (st,) = acc._branches
    assert st.source._thinned and not st.source.uppers_built
    ((_t, (kept,)), (_serial, (pld,))), = st.source._thinned.items()
    g = st.source._grids_at(st.source.level_for(A._cut_scale(np.array([delta])), st.counts))[0][0]
    assert np.count_nonzero(pld.masses) < 0.75 * (g.n + 1)
    # (the cached PLD is connect-the-dots at the points it names)
    fresh = connect_the_dots(st.source.pairs[0][0], g, keep=np.frombuffer(kept, dtype=np.int64))
    assert fresh.start == pld.start and np.array_equal(fresh.masses, pld.masses)
    assert np.array_equal(fresh.mass_err, pld.mass_err)
    assert truth <= got.upper <= truth * (1 + 1e-5)
    # after other queries (other tilts, other thinned PLDs), the same answer
    again = pldlib.account(mech, steps=steps, spacing=h, lower_bound=False)
    again.epsilon(1e-9)
    again.epsilon(np.array([1e-3, 1e-7]))
    assert again.epsilon(delta).upper == got.upper
    monkeypatch.setattr(pld_grid, "THIN_FROM", 10**9)
    whole = pldlib.account(mech, steps=steps, spacing=h, lower_bound=False).epsilon(delta)
    # (the curve is above the whole grid's; the certified answers differ also by their tilts' round-off
    # allowances, ~1e-11 here)
    assert whole.upper * (1 - 1e-9) <= got.upper <= whole.upper * (1 + 1e-7)


def test_cheap_plds_on_fine_grids_keep_their_spacing(monkeypatch):
    """On fine grids the cheap pessimistic PLDs (screens, tilt estimates, points to connect) are
    at k h with k = 8 doubled while the smallest grid keeps >= COARSE_POINTS points per cheap
    point (checked against that definition written out); the certified answers at h/8 of the
    headline (add_remove: the other direction screened) bracket the mpmath truth, the other
    direction is still skipped, and they are within 1e-8 of the answers with k = 8."""
    import pldlib
    import pldlib.methods.pld as A
    from pldlib.testing.truth import epsilon_gaussian

    sigma, q, steps, delta, h = 1.0, 0.01, 10000, 1e-5, 1.25e-5
    mech = pldlib.Gaussian(sigma, q=q, sampling="poisson", relation="add_remove")

    def run():
        calls = []
        orig = A.PLDAccountant._branch_epsilon
        monkeypatch.setattr(A.PLDAccountant, "_branch_epsilon",
                            lambda self, st, d, lower=True: calls.append(st.label) or orig(self, st, d, lower))
        acc = pldlib.account(mech, steps=steps, spacing=h, lower_bound=False)
        got = acc.epsilon(delta).upper
        monkeypatch.setattr(A.PLDAccountant, "_branch_epsilon", orig)
        return acc, got, calls

    acc, got, calls = run()
    cut = A._cut_scale(np.array([delta]))
    for st in acc._branches:
        t = st.source.level_for(cut, st.counts)
        n = min(g.n for g, _ in st.source._grids_at(t))
        ks = [8 * 2**j for j in range(12) if n // (8 * 2**j) >= pld_grid.COARSE_POINTS]
        assert st.source.coarse_factor(t) == max(ks + [8])
    (first,) = [st for st in acc._branches if st.label == calls[0]]
    k = first.source.coarse_factor(first.source.level_for(cut, first.counts))
    assert k >= 32 and first.source.coarse(first.source.level_for(cut, first.counts))[0].h == pytest.approx(k * h)
    assert len(calls) == 1  # the other direction: skipped by its cheap certified bound
    truth = max(float(epsilon_gaussian(delta, sigma, steps, q=q, direction=d)) for d in ("remove", "add"))
    assert truth <= got <= truth * (1 + 1e-5)
    monkeypatch.setattr(pld_grid, "COARSE_POINTS", 10**12)  # (k = 8 everywhere)
    acc8, got8, calls8 = run()
    assert all(st.source.coarse_factor(None) == 8 for st in acc8._branches) and len(calls8) == 1
    assert abs(got - got8) <= 1e-8 * got8


@pytest.mark.parametrize("n", [1, 63, 64, 65, 4096, 40_003])
def test_side_tail_masses_and_cut_index_from_block_sums(n):
    """A side's tail masses come from its block sums (the masses > 0 only): at every block start
    (and any other index) they are never below the exact tail (math.fsum) and within 4 u size of
    it; cut_index is the first block start whose tail is within the threshold, as a scan of the
    exact tails finds (away from ties)."""
    import math

    rng = np.random.default_rng(n)
    m = rng.exponential(size=n) * np.exp(-np.linspace(0.0, 60.0, n))
    m[rng.random(n) < 0.2] = 0.0
    m /= m.sum()
    sd = C._Side(1e-4, -n // 4, m, 3)
    u = np.finfo(float).eps / 2
    for i in sorted({0, n // 2, n - 1} | set(range(0, n, C._BLOCK))):
        exact = math.fsum(m[i:])
        got = sd.tail_mass(i)
        assert exact <= got <= exact * (1 + 8 * u * n) + 1e-300, (i, exact, got)
    assert sd.tail_mass(n) == 0.0
    for log_thr in (-1.0, -5.0, -20.0, -50.0, -200.0):
        want = next((b for b in range(0, n, C._BLOCK) if math.fsum(m[b:]) <= math.exp(log_thr) * (1 - 1e-9)), n)
        got = sd.cut_index(log_thr)
        assert got == min(max(want, C._BLOCK), n) or abs(math.log(max(math.fsum(m[got:]), 1e-300)) - log_thr) < 1e-6


@pytest.mark.parametrize("start", [0, 1, 137, 999])
@pytest.mark.parametrize("sub", [None, 1e-3])
def test_positive_part_reads_a_circular_composition_in_window_order(start, sub):
    """_positive_part(y, start) is max(y - sub, 0) of np.roll(y, -start) (the window order of a
    circular composition), with the same numbers, whether or not it may work in y's array."""
    rng = np.random.default_rng(start)
    y = rng.normal(size=1000) * 1e-3
    r = np.roll(y, -start)
    want = np.maximum(r if sub is None else r - sub, 0.0)
    for overwrite in (False, True):
        y1 = y.copy()
        got = C._positive_part(y1, start, overwrite, sub=sub)
        assert np.array_equal(got, want)
        if not overwrite or start:
            assert np.array_equal(y1, y)  # (the argument kept, unless it may be and is used)
