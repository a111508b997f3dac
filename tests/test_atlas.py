"""The eps atlas: a sweep store exported to .npz and inverted for certified sigmas.

Every certified sigma an off-grid look-up returns is re-checked by the accountant
at the exact query (its certified upper eps meets the target), every certified
insufficient sigma by the accountant's certified lower bound (above the target).
"""
import io
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import pldlib
from pldlib.atlas import Atlas, AtlasRangeError, open_atlas

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def atlas_path(tmp_path_factory, embedded_client):
    """configs/atlas_test.yaml run by the sweep on the shared in-process cluster, then exported."""
    from sweeps.atlas import export
    from sweeps.config import parse_config
    from sweeps.execute import run_sweep

    d = tmp_path_factory.mktemp("atlas")
    data = yaml.safe_load((ROOT / "configs" / "atlas_test.yaml").read_text())
    data["store"] = str(d / "a.zarr")
    run_sweep(parse_config(data), client=embedded_client, progress=False, stream=io.StringIO())
    out = d / "a.npz"
    export(str(d / "a.zarr"), str(out))
    return out


def test_export_round_trip_keeps_the_store_values(atlas_path):
    import xarray as xr

    from sweeps.atlas import export

    store = str(atlas_path).replace(".npz", ".zarr")
    a = export(store, str(atlas_path.with_name("raw.npz")), envelope=False)
    ds = xr.open_zarr(store, chunks=None).isel(method=0)
    up, lo = a.tables[("poisson", "add_remove")]
    ref = ds["eps_upper"].sel(sampling="poisson", relation="add_remove").transpose("sigma", "q", "steps", "delta")
    assert np.array_equal(up, ref.values)
    assert np.array_equal(open_atlas(atlas_path.with_name("raw.npz")).tables[("poisson", "add_remove")][0], up)
    assert np.all(lo <= up)
    b_path = atlas_path.with_name("copy.npz")
    a.save(b_path)
    b = open_atlas(b_path)
    assert all(np.array_equal(a.axes[k], b.axes[k]) for k in a.axes)


def _check_upper(sigma, e, d, q, k):
    m = pldlib.Gaussian(sigma=float(sigma), q=float(q), sampling="poisson")
    return pldlib.account(m, int(k)).epsilon(float(d))


def test_off_grid_lookups_are_certified_at_the_exact_query(atlas_path):
    a = open_atlas(atlas_path)
    rng = np.random.default_rng(7)
    n = 12
    e = np.exp(rng.uniform(math.log(0.5), math.log(6), n))
    d = np.exp(rng.uniform(math.log(1e-6), math.log(1e-5), n))
    q = np.exp(rng.uniform(math.log(0.01), math.log(0.1), n))
    k = np.round(np.exp(rng.uniform(math.log(10), math.log(1000), n)))
    ans = a.sigma_for(e, d, q, k)
    checked = insufficient = 0
    for i in range(n):
        if math.isfinite(ans.sigma[i]):
            assert _check_upper(ans.sigma[i], e[i], d[i], q[i], k[i]).upper <= e[i]
            checked += 1
        if math.isfinite(ans.sigma_insufficient[i]):
            assert _check_upper(ans.sigma_insufficient[i], e[i], d[i], q[i], k[i]).lower > e[i]
            insufficient += 1
        if math.isfinite(ans.sigma[i]) and math.isfinite(ans.sigma_insufficient[i]):
            assert ans.sigma_insufficient[i] < ans.sigma[i]
    assert checked >= n // 2 and insufficient >= 1  # the test exercises both certificates


def test_certify_runs_the_accountant_and_is_close_to_calibrate(atlas_path):
    a = open_atlas(atlas_path)
    ans = a.sigma_for(2.0, 3e-6, 0.02, 300, certify=True)
    assert ans.certified_by == "accountant" and 1 <= ans.evaluations <= 8
    assert _check_upper(ans.sigma, 2.0, 3e-6, 0.02, 300).upper <= 2.0
    ref = pldlib.calibrate(epsilon=2.0, delta=3e-6, q=0.02, steps=300, table=None).sigma
    assert abs(ans.sigma / ref - 1) < 5e-3


def test_certify_falls_back_on_calibrate_when_its_two_steps_miss(atlas_path, monkeypatch):
    # a start far below the root and a slope so steep that the Newton step barely moves: neither
    # quick evaluation is feasible, so certify=True must run calibrate (it used to keep the
    # atlas's looser sigma: the fall-back read a field the calibration result does not have)
    from pldlib import atlas as A

    monkeypatch.setattr(A, "CERTIFY_START_BIAS", -0.4)
    monkeypatch.setattr(A.Atlas, "_slope", lambda self, *a: -1000.0)
    a = open_atlas(atlas_path)
    ans = a.sigma_for(2.0, 3e-6, 0.02, 300, certify=True)
    assert ans.notes == [] and ans.certified_by == "accountant" and ans.evaluations > 2
    # certified at calibrate's own grid (the default grid of _check_upper is coarser here)
    assert ans.eps_upper <= 2.0
    m = pldlib.Gaussian(sigma=float(ans.sigma), q=0.02, sampling="poisson")
    assert pldlib.account(m, 300, spacing=2e-4).epsilon(3e-6).upper <= 2.0
    ref = pldlib.calibrate(epsilon=2.0, delta=3e-6, q=0.02, steps=300, table=None).sigma
    assert abs(ans.sigma / ref - 1) < 5e-3


def test_estimates_are_within_one_percent_of_calibrate_between_grid_deltas(atlas_path):
    # delta 3e-6 lies between the test atlas's two deltas (eps is interpolated linearly in log
    # delta there); q and steps on the grid; calibrate is the independent reference
    a = open_atlas(atlas_path)
    for e, q, k in [(1.0, 0.01, 100), (4.0, 0.1, 10), (0.5, 0.01, 1000), (1.5, 0.1, 100)]:
        est = a.sigma_for(e, 3e-6, q, k).estimate
        ref = pldlib.calibrate(epsilon=e, delta=3e-6, q=q, steps=k, table=None).sigma
        assert abs(est / ref - 1) < 0.01, (e, q, k, est, ref)


def test_vectorised_lookups_match_scalar_ones(atlas_path):
    a = open_atlas(atlas_path)
    v = a.sigma_for([1.0, 3.0], 5e-6, [0.02, 0.05], [50, 500])
    for i, (e, q, k) in enumerate([(1.0, 0.02, 50), (3.0, 0.05, 500)]):
        s = a.sigma_for(e, 5e-6, q, k, outside="nan")  # (a scalar query above the grid raises by default)
        for f in ("sigma", "sigma_insufficient", "estimate"):
            x, y = getattr(v, f)[i], getattr(s, f)
            assert (math.isnan(x) and math.isnan(y)) or x == y


@pytest.mark.parametrize("kw, word", [
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"), (dict(delta=1.5), "delta"),
    (dict(delta=1e-9), "delta=1e-09 is outside the atlas (delta covers"), (dict(q=0.5), "q=0.5 is outside"),
    (dict(steps=5000), "steps=5000 is outside"), (dict(steps=2.5), "steps"),
    (dict(relation="substitution"), "relation='substitution' is not in the atlas"),
    (dict(sampling="wor"), "sampling='wor' is not in the atlas"),
])
def test_bad_queries_name_the_argument_and_the_range(atlas_path, kw, word):
    a = open_atlas(atlas_path)
    q = dict(epsilon=1.0, delta=3e-6, q=0.02, steps=100)
    q.update(kw)
    with pytest.raises(ValueError, match=word.replace("(", r"\(").replace("[", r"\[")):
        a.sigma_for(**q)
    assert issubclass(AtlasRangeError, ValueError)


def test_opening_an_atlas_loads_no_xarray_or_zarr(atlas_path):
    code = (f"import sys, pldlib.atlas as A; a = A.open_atlas({str(atlas_path)!r}); "
            "a.sigma_for(1.0, 3e-6, 0.02, 100); "
            "print([m for m in ('xarray', 'zarr', 'dask') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_bad_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no atlas"):
        open_atlas(tmp_path / "none.npz")
    with pytest.raises(ValueError, match="strictly increasing"):
        Atlas({"sigma": [2.0, 1.0], "q": [0.1], "steps": [1.0], "delta": [1e-5]}, {})


def _sub_atlas(a, sl):
    """The part of atlas ``a`` on index ranges ``sl`` (one slice per axis)."""
    from pldlib.atlas import ATLAS_AXES

    axes = {ax: a.axes[ax][s] for ax, s in zip(ATLAS_AXES, sl)}
    return Atlas(axes, {k: (u[tuple(sl)], l[tuple(sl)]) for k, (u, l) in a.tables.items()}, dict(a.meta))


def test_atlases_of_parts_of_a_grid_merge_into_the_whole(atlas_path, tmp_path):
    """Three parts of the test atlas (two sigma ranges at all q, and the remaining q at the other
    sigmas; overlapping on one sigma) merge back into exactly the whole; axis values differing by
    round-off (1e-13 relative) are one grid point; stores that disagree on a shared cell are refused."""
    from sweeps.atlas import merge_atlases

    a = open_atlas(atlas_path)
    ns, nq = a.axes["sigma"].size, a.axes["q"].size
    every = slice(None)
    p1 = _sub_atlas(a, [slice(0, ns // 2 + 1), slice(0, nq - 1), every, every])
    p2 = _sub_atlas(a, [slice(ns // 2, ns), slice(0, nq - 1), every, every])
    p3 = _sub_atlas(a, [every, slice(nq - 1, nq), every, every])
    p2.axes["sigma"] = p2.axes["sigma"] * (1 + 1e-13)  # the same points, computed another way
    m = merge_atlases([p1, p2, p3])
    for ax in a.axes:
        np.testing.assert_allclose(m.axes[ax], a.axes[ax], rtol=1e-12)
    for key, (u, l) in a.tables.items():
        mu, ml = m.tables[key]
        np.testing.assert_array_equal(mu, u)
        np.testing.assert_array_equal(ml, l)
    # a cell no part computed stays NaN: certified look-ups skip it
    m2 = merge_atlases([p1, p3])
    key = next(iter(a.tables))
    assert np.all(np.isnan(m2.tables[key][0][ns // 2 + 1:, : nq - 1]))
    bad = _sub_atlas(a, [slice(0, 2), every, every, every])
    u, l = bad.tables[key]
    bad.tables[key] = (u * 1.01, l)
    with pytest.raises(ValueError, match="disagree"):
        merge_atlases([a, bad])


def test_monotone_envelope_is_the_orthant_extremum(tmp_path):
    """U* = min of the upper table over sigma' <= sigma, q' >= q, steps' >= steps, delta' <= delta
    and L* = max of the lower table over the mirrored orthant, NaN cells ignored: checked cell by
    cell against a brute-force loop over the orthant."""
    import itertools

    from pldlib.atlas import monotone_envelope

    rng = np.random.default_rng(3)
    up = rng.random((4, 3, 5, 3))
    lo = rng.random((4, 3, 5, 3))
    up[rng.random(up.shape) < 0.35] = np.nan
    lo[rng.random(lo.shape) < 0.35] = np.nan
    U, L = monotone_envelope(up, lo)
    assert np.isnan(up).sum() > 0 and np.isnan(U).sum() < np.isnan(up).sum()
    for i, j, k, m in itertools.product(*map(range, up.shape)):
        for env, sub, pick in ((U, up[: i + 1, j:, k:, : m + 1], np.nanmin),
                               (L, lo[i:, : j + 1, : k + 1, m:], np.nanmax)):
            want = pick(sub) if np.isfinite(sub).any() else np.nan
            got = env[i, j, k, m]
            assert (np.isnan(want) and np.isnan(got)) or want == got, (i, j, k, m)


def test_cells_a_part_did_not_compute_are_filled_from_safe_side_neighbours(atlas_path):
    """An atlas merged from parts on different grids: the part at q = 0.03 computed one steps value
    and one delta only.  A query whose safe-side neighbours are missing cells is answered from the
    dominating computed cells (the same sigma as without that part), one whose neighbours were
    computed gets at most that sigma; the accountant re-checks both at the exact query."""
    from sweeps.atlas import merge_atlases

    a = open_atlas(atlas_path)
    every = slice(None)
    p1 = _sub_atlas(a, [every, [0, 2], every, every])  # q 0.01 and 0.1
    p2 = _sub_atlas(a, [every, slice(1, 2), slice(1, 2), slice(1, 2)])  # q 0.03 at steps 100, delta 1e-5
    m = merge_atlases([p1, p2])
    assert np.isnan(m.tables[("poisson", "add_remove")][0]).any()
    e = np.array([4.0, 2.0])
    d = np.array([3e-6, 1e-5])
    q = np.array([0.02, 0.02])
    k = np.array([500, 50])
    got, alone = m.sigma_for(e, d, q, k), p1.sigma_for(e, d, q, k)
    assert np.all(np.isfinite(got.sigma)) and np.all(np.isfinite(alone.sigma))
    assert got.sigma[0] == alone.sigma[0]  # holes: the q = 0.1 cells decide, as without the part
    assert got.sigma[1] <= alone.sigma[1]
    for i in range(2):
        assert _check_upper(got.sigma[i], e[i], d[i], q[i], k[i]).upper <= e[i]


def test_a_float32_atlas_rounds_its_bounds_outward(atlas_path, tmp_path):
    """--float32 halves the file: every upper bound is rounded up and every lower bound down to a
    float32 (checked value by value against the float64 atlas), so its certified sigmas are never
    below the float64 atlas's."""
    from pldlib.atlas import _outward_float32

    a = open_atlas(atlas_path)
    p32 = tmp_path / "a32.npz"
    a.save(p32, precision="float32")
    b = open_atlas(p32)
    assert b.meta["precision"] == "float32"
    for key, (u, l) in a.tables.items():
        u32, l32 = b.tables[key]
        fin = np.isfinite(u)
        assert np.array_equal(np.isnan(u), np.isnan(u32)) and np.array_equal(np.isnan(l), np.isnan(l32))
        assert np.all(u32[fin] >= u[fin]) and np.all(u32[fin] <= u[fin] * (1 + 2.0**-22))
        fin = np.isfinite(l)
        assert np.all(l32[fin] <= l[fin]) and np.all(np.abs(l32[fin] - l[fin]) <= np.abs(l[fin]) * 2.0**-22)
    # values that float32 rounds the wrong way, and beyond its range
    x = np.array([0.1, 1 / 3, 2.0**-30 * 3.3, 1e39, -1e39, np.nan])
    u32, l32 = _outward_float32(x, x)
    assert np.all(u32[:5].astype(float) >= x[:5]) and np.all(l32[:5].astype(float) <= x[:5])
    assert np.isnan(u32[5]) and np.isnan(l32[5])
    rng = np.random.default_rng(11)
    e = np.exp(rng.uniform(math.log(0.5), math.log(6), 50))
    q = np.exp(rng.uniform(math.log(0.01), math.log(0.1), 50))
    s64, s32 = a.sigma_for(e, 1e-6, q, 100).sigma, b.sigma_for(e, 1e-6, q, 100).sigma
    both = np.isfinite(s64)
    assert both.any() and np.all(s32[both] >= s64[both])
    with pytest.raises(ValueError, match="precision"):
        a.save(tmp_path / "x.npz", precision="float16")


def test_export_cli_writes_float32_and_refuses_a_missing_store(atlas_path, tmp_path, capsys):
    from sweeps.atlas import main

    store = str(atlas_path).replace(".npz", ".zarr")
    out = tmp_path / "cli32.npz"
    assert main(["export", store, str(out), "--float32"]) == 0
    assert open_atlas(out).meta["precision"] == "float32"
    assert main(["export", str(tmp_path / "missing.zarr"), str(tmp_path / "m.npz")]) == 2
    assert "error" in capsys.readouterr().err and not (tmp_path / "m.npz").exists()


def test_tables_are_read_on_first_use_and_a_damaged_one_is_a_clear_error(atlas_path, tmp_path):
    import zipfile

    bad = tmp_path / "damaged.npz"
    with zipfile.ZipFile(atlas_path) as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, b"not an array" if name == "upper_0.npy" else src.read(name))
    a = open_atlas(bad)  # opening reads the axes and the keys only
    with pytest.raises(ValueError, match="cannot read the atlas's poisson/add_remove table"):
        a.sigma_for(2.0, 3e-6, 0.02, 300)
    good = open_atlas(atlas_path)
    assert dict.__getitem__(good.tables, ("poisson", "add_remove")) is None  # not read yet
    good.sigma_for(2.0, 3e-6, 0.02, 300)
    assert dict.__getitem__(good.tables, ("poisson", "add_remove")) is not None


def test_verify_rechecks_random_queries_with_the_accountant(atlas_path):
    """sweeps.atlas verify: every certified sigma of its random queries is re-checked by the
    accountant at the exact query (none may fail), and the calibrate comparison is reported."""
    from sweeps.atlas import verify

    res = verify(str(atlas_path), n=4, seed=2, with_calibrate=True, out=io.StringIO())
    fig, rows = res["figures"], res["rows"]
    assert fig["queries"] == 4 and fig["violations"] == 0
    for r in rows:
        if math.isfinite(r["sigma"]):
            assert r["check_upper"] <= r["epsilon"]
            assert r["sigma"] >= r["calibrated"] * (1 - 1e-3)  # no certified sigma below the optimum
    assert fig["lookup_100k_seconds"] > 0 and fig["open_and_query_beyond_import_seconds"] > 0


def _eps_of(delta_fn, delta, hi=60.0):
    """eps with delta_fn(eps) = delta, by bisection (delta_fn non-increasing)."""
    lo_, hi_ = -5.0, hi
    for _ in range(200):
        mid = 0.5 * (lo_ + hi_)
        lo_, hi_ = (mid, hi_) if delta_fn(mid) > delta else (lo_, mid)
    return hi_


def test_the_delta_chord_bounds_eps_between_grid_deltas():
    """Between two grid deltas the look-up bounds eps by the chord of the convex delta(e^eps):
    checked against the Gaussian mechanism's closed-form profile and against random discrete pairs
    (hockey-stick divergence summed outcome by outcome), with the grid values rounded up as the
    atlas's upper bounds are."""
    from scipy.stats import norm

    from pldlib.atlas import _delta_chord

    def gauss(mu):
        return lambda eps: norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)

    rng = np.random.default_rng(5)
    profiles = [gauss(mu) for mu in (0.3, 1.0, 2.5)]
    for _ in range(6):
        p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
        profiles.append(lambda eps, p=p, q=q: float(np.sum(np.maximum(p - math.exp(eps) * q, 0.0))))
    gained = 0
    for prof in profiles:
        top = prof(0.0)
        for di, dj in ((1e-6, 3e-6), (1e-4, 1e-3), (1e-3, 1e-2), (1e-2, 5e-2)):
            if dj >= top:
                continue
            ui, uj = _eps_of(prof, di) * (1 + 1e-9), _eps_of(prof, dj) * (1 + 1e-9)
            for delta in np.geomspace(di, dj, 9)[1:-1]:
                t = np.array([(delta - di) / (dj - di)])
                c = float(_delta_chord(np.array([[ui]]), np.array([[uj]]), t)[0, 0])
                assert c >= _eps_of(prof, delta) - 1e-12 and c <= ui
                gained += c < ui * (1 - 1e-6)
    assert gained > 20  # the chord is tighter than the delta-below value, not just sound


def test_a_few_queries_read_the_envelope_of_their_boxes_only(atlas_path):
    """Up to _FEW queries on an atlas whose envelope is not cached compute it on the index boxes
    they read: the same answers, bit for bit, as the whole table's envelope -- on the test atlas
    and on one merged from parts with holes, for float64 and float32 tables."""
    from pldlib import atlas as A
    from sweeps.atlas import merge_atlases

    a = open_atlas(atlas_path)
    every = slice(None)
    holes = merge_atlases([_sub_atlas(a, [every, [0, 2], every, every]),
                           _sub_atlas(a, [every, slice(1, 2), slice(1, 2), slice(1, 2)])])
    f32 = Atlas(a.axes, {k: A._outward_float32(u, l) for k, (u, l) in a.tables.items()})
    rng = np.random.default_rng(9)
    slopes = []
    for atlas in (a, holes, f32):
        warm = Atlas(atlas.axes, dict(atlas.tables.items()))
        warm._prepared("poisson", "add_remove")
        for _ in range(12):
            n = int(rng.integers(1, A._FEW + 1))
            e = np.exp(rng.uniform(math.log(0.3), math.log(8), n))
            d = np.exp(rng.uniform(math.log(1e-6), math.log(1e-5), n))
            q = np.exp(rng.uniform(math.log(0.01), math.log(0.1), n))
            k = np.round(np.exp(rng.uniform(math.log(10), math.log(1000), n)))
            cold = Atlas(atlas.axes, dict(atlas.tables.items()))
            x, y = cold.sigma_for(e, d, q, k), warm.sigma_for(e, d, q, k)
            assert not cold._env  # the few-query path ran
            for f in ("sigma", "sigma_insufficient", "estimate", "eps_upper"):
                np.testing.assert_array_equal(getattr(x, f), getattr(y, f))
            # certify=True's slope, from the box too
            s0 = float(np.nanmax(np.append(y.estimate, 1.0)))
            got = cold._slope(e[0], d[0], q[0], k[0], "poisson", "add_remove", s0)
            slopes.append(got)
            assert got == warm._slope(e[0], d[0], q[0], k[0], "poisson", "add_remove", s0)
            assert not cold._env
    assert sum(s is not None and s < 0 for s in slopes) >= 18  # (eps falls with sigma)


def test_without_replacement_q_below_1_never_reads_the_q_1_cells():
    """WOR add/remove at q < 1 is not bounded by WOR at q = 1 (the unsampled mechanism: eps is far
    smaller there), so neither the envelope nor the q-up rounding may cross q = 1.  A small WOR
    atlas computed cell by cell with the accountant: the q = 0.5 cells keep their own bounds, a
    query above the largest q < 1 is not covered, and a covered one re-checks at the exact query."""
    sig = np.array([1.5, 2.0, 3.0, 4.5])
    qs = np.array([0.5, 0.8, 1.0])
    up = np.empty((4, 3, 1, 1))
    lo = np.empty_like(up)
    for i, s in enumerate(sig):
        for j, q in enumerate(qs):
            m = pldlib.Gaussian(sigma=float(s), q=float(q), sampling="wor" if q < 1 else "none")
            iv = pldlib.account(m, 10).epsilon(1e-5)
            up[i, j, 0, 0], lo[i, j, 0, 0] = iv.upper, iv.lower
    assert up[1, 1, 0, 0] > up[1, 2, 0, 0]  # the non-monotone step at q = 1 this guards against
    a = Atlas({"sigma": sig, "q": qs, "steps": [10.0], "delta": [1e-5]}, {("wor", "add_remove"): (up, lo)})
    U, L = a.envelope("wor", "add_remove")
    np.testing.assert_array_equal(U[:, :2], up[:, :2])
    np.testing.assert_array_equal(L[:, 2], lo[:, 2])
    e = float(up[2, 1, 0, 0]) * 1.01
    for many in (False, True):  # the few-query path and the whole-table envelope
        b = Atlas(a.axes, dict(a.tables))
        if many:
            b._prepared("wor", "add_remove")
        far, near = b.sigma_for(e, 1e-5, 0.9, 10, "wor"), b.sigma_for(e, 1e-5, 0.6, 10, "wor")
        assert math.isnan(far.sigma) and math.isnan(far.estimate)
        m = pldlib.Gaussian(sigma=near.sigma, q=0.6, sampling="wor")
        assert pldlib.account(m, 10).epsilon(1e-5).upper <= e


def test_windowed_chord_search_equals_the_whole_rows():
    # the certified look-up evaluates the delta chord only after the cheap curve's crossing: the
    # same first column and value as scanning whole rows, on random monotone rows with holes
    from pldlib import atlas as A

    rng = np.random.default_rng(3)
    n, S = 4000, 40
    u_lo = np.sort(rng.exponential(3.0, (n, S)), axis=1)[:, ::-1] * rng.uniform(0.2, 5, (n, 1))
    u_hi = u_lo * rng.uniform(0.3, 1.0, (n, S))
    u_hi[rng.random((n, S)) < 0.05] = np.nan
    u_lo[rng.random((n, S)) < 0.02] = np.nan
    t = rng.uniform(0, 1, n)
    t[::7] = 0.0
    e = np.exp(rng.uniform(-3, 3, n))
    j, ce = A._first_chord_below(u_lo, u_hi, t, e)
    col = A._delta_chord(u_lo, u_hi, t)
    ok = col <= e[:, None]
    jr = np.where(ok.any(axis=1), ok.argmax(axis=1), -1)
    np.testing.assert_array_equal(j, jr)
    np.testing.assert_array_equal(ce[jr >= 0], col[np.nonzero(jr >= 0)[0], jr[jr >= 0]])
    assert (jr > 0).sum() > n // 2 and (jr == -1).any()


def _synthetic_atlas(rng, holes=0.1):
    """An 86-sigma atlas from a closed form monotone in every axis (eps ~ q sqrt(k ln(1/delta)) /
    sigma + q^2 k / sigma^2), with its intervals +-(0-3)% and holes; a stand-in for a large store."""
    ax = {"sigma": np.geomspace(0.2, 3000, 86), "q": np.geomspace(1e-4, 1, 30), "steps": np.geomspace(1, 1e6, 25),
          "delta": np.geomspace(1e-10, 1e-3, 8)}
    s, q, k, d = np.meshgrid(*(ax[a] for a in ("sigma", "q", "steps", "delta")), indexing="ij")
    eps = q * np.sqrt(k * 2 * np.log(1.25 / d)) / s + q * q * k / (s * s)
    up = eps * (1 + rng.uniform(0, 0.03, eps.shape))
    lo = eps * (1 - rng.uniform(0, 0.03, eps.shape))
    up[rng.random(eps.shape) < holes] = np.nan
    lo[rng.random(eps.shape) < holes] = np.nan
    return Atlas(ax, {("poisson", "add_remove"): (up, lo)})


def test_large_lookups_equal_small_ones_and_the_windowed_estimate_the_whole_rows():
    """Many queries at once (sorted into the tables' order internally, the estimate read on a
    window of sigma columns near the certified one) answer exactly as batches of a few do, and
    the windowed estimate equals the whole-row one."""
    rng = np.random.default_rng(8)
    a = _synthetic_atlas(rng)
    n = 6000
    e = np.exp(rng.uniform(np.log(0.05), np.log(50), n))
    d = np.exp(rng.uniform(np.log(1e-10), np.log(1e-3), n))
    q = np.exp(rng.uniform(np.log(1e-4), np.log(1), n))
    k = np.round(np.exp(rng.uniform(0, np.log(1e6), n)))
    big = a.sigma_for(e, d, q, k)
    parts = [a.sigma_for(e[i : i + 40], d[i : i + 40], q[i : i + 40], k[i : i + 40]) for i in range(0, n, 40)]
    for f in ("sigma", "sigma_insufficient", "estimate", "eps_upper"):
        np.testing.assert_array_equal(getattr(big, f), np.concatenate([getattr(p, f) for p in parts]))
    fin = np.isfinite(big.estimate)
    assert fin.sum() > n // 2 and (~fin).any() and np.isfinite(big.sigma).sum() > n // 2
    up, lo, lmid = a._prepared("poisson", "add_remove")
    hint = np.searchsorted(a.axes["sigma"], np.where(np.isfinite(big.sigma), big.sigma, np.inf))
    hint = np.where(hint < a.axes["sigma"].size, hint, -1)
    whole = a._estimate(e, d, q, k, lmid, hint=None)
    np.testing.assert_array_equal(a._estimate(e, d, q, k, lmid, hint=hint), whole)
    # a poor hint (far from the crossing) falls back on the whole rows, same answer
    np.testing.assert_array_equal(a._estimate(e, d, q, k, lmid, hint=np.full(n, 20)), whole)


def test_an_enveloped_file_answers_as_the_raw_one(atlas_path, tmp_path):
    """export stores the monotone envelope (opening skips that pass): the same look-ups, few or
    many, as a file of the computed cells, whose values it bounds (tighter or equal)."""
    from pldlib.atlas import monotone_envelope
    from sweeps.atlas import export

    raw, env = tmp_path / "raw.npz", tmp_path / "env.npz"
    rng = np.random.default_rng(4)
    syn = _synthetic_atlas(rng, holes=0.3)
    for atl, name in ((None, "test atlas"), (syn, "synthetic")):
        if atl is None:
            store = str(atlas_path).replace(".npz", ".zarr")
            export(store, str(raw), envelope=False)
            export(store, str(env))
        else:
            atl.save(raw)
            atl.save(env, envelope=True)
        r, v = open_atlas(raw), open_atlas(env)
        assert v.meta["enveloped"] and not r.meta["enveloped"], name
        for key in r.tables:
            U, L = monotone_envelope(*r.tables[key], q_cut=r.q_cut(key[0]))
            np.testing.assert_array_equal(v.tables[key][0], U)
            np.testing.assert_array_equal(v.tables[key][1], L)
        ax = r.axes
        n = 3000
        e = np.exp(rng.uniform(np.log(0.1), np.log(20), n))
        d, q, k = (np.exp(rng.uniform(np.log(ax[x][0]), np.log(ax[x][-1]), n)) for x in ("delta", "q", "steps"))
        k = np.round(k)
        for sl in (slice(0, 3), slice(None)):  # a few (the boxes' envelope) and many (the whole)
            x, y = (t.sigma_for(e[sl], d[sl], q[sl], k[sl]) for t in (open_atlas(raw), open_atlas(env)))
            for f in ("sigma", "sigma_insufficient", "estimate", "eps_upper"):
                np.testing.assert_array_equal(getattr(x, f), getattr(y, f))
    assert (np.isnan(syn.tables[("poisson", "add_remove")][0]).sum()
            > np.isnan(open_atlas(env).tables[("poisson", "add_remove")][0]).sum())  # holes were filled


def test_export_margin_widens_every_bound_outward(atlas_path, tmp_path, capsys):
    from sweeps.atlas import export, main

    store = str(atlas_path).replace(".npz", ".zarr")
    raw = export(store, str(tmp_path / "r.npz"), envelope=False)
    wide = export(store, str(tmp_path / "w.npz"), envelope=False, margin=1e-6)
    assert open_atlas(tmp_path / "w.npz").meta["margin"] == 1e-6
    for key, (u, l) in raw.tables.items():
        U, L = open_atlas(tmp_path / "w.npz").tables[key]
        fin = np.isfinite(u)
        np.testing.assert_array_equal(U[fin], u[fin] + 1e-6 * np.abs(u[fin]))
        fin = np.isfinite(l)
        np.testing.assert_array_equal(L[fin], l[fin] - 1e-6 * np.abs(l[fin]))
    assert main(["export", store, str(tmp_path / "bad.npz"), "--margin", "-1"]) == 2
    assert "margin" in capsys.readouterr().err and not (tmp_path / "bad.npz").exists()


def test_a_lookup_from_the_store_reads_few_chunks_and_is_certified(atlas_path):
    """sweeps.atlas.lookup on the sweep store itself: bisection over the sigma axis at the
    safe-side grid neighbour, one eps_upper chunk per step (counted), each sigma it returns
    re-checked by the accountant at the exact off-grid query, and equal to the smallest grid
    sigma whose stored upper bound meets epsilon there (found by reading the whole column)."""
    import zarr

    from sweeps.atlas import StoreLookup

    store = str(atlas_path.with_suffix(".zarr"))
    lk = StoreLookup(store)
    g = zarr.open_group(store, mode="r")
    sig = np.asarray(g["sigma"][...])
    n_sigma = sig.size
    rng = np.random.default_rng(5)
    answered = 0
    for _ in range(12):
        q = float(np.exp(rng.uniform(np.log(0.005), np.log(0.1))))
        k = int(rng.integers(5, 1001))
        d = float(np.exp(rng.uniform(np.log(1e-6), np.log(9e-5))))
        e = float(np.exp(rng.uniform(np.log(0.3), np.log(6.0))))
        before = lk.reads
        s = lk.sigma_for(e, d, q, k)
        assert lk.reads - before <= math.ceil(math.log2(n_sigma)) + 1
        # the whole column at the safe-side neighbour, read directly
        qs, ks, ds = (np.asarray(g[a][...], dtype=float) for a in ("q", "steps", "delta"))
        iq = int(np.argmin(np.where(qs >= q, qs, np.inf)))
        ik = int(np.argmin(np.where(ks >= k, ks, np.inf)))
        idl = int(np.argmax(np.where(ds <= d, ds, -np.inf)))
        col = np.asarray(g["eps_upper"][:, iq, ik, idl, 0, 0, 0])
        meets = np.isfinite(col) & (col <= e)
        if not meets.any():
            assert math.isnan(s)
            continue
        answered += 1
        assert s == sig[meets].min()  # (the stored bounds are monotone in sigma here)
        assert _check_upper(s, e, d, q, k).upper <= e
    assert answered >= 6


def test_store_lookup_errors_name_the_argument(atlas_path):
    from sweeps.atlas import StoreLookup
    from sweeps.store import StoreError

    lk = StoreLookup(str(atlas_path.with_suffix(".zarr")))
    with pytest.raises(ValueError, match="q=0.5 has no grid value at or above"):
        lk.sigma_for(1.0, 1e-5, 0.5, 10)
    with pytest.raises(ValueError, match="delta"):
        lk.sigma_for(1.0, 1.5, 0.01, 10)
    with pytest.raises(ValueError, match="sampling='wor' is not in the store"):
        lk.sigma_for(1.0, 1e-5, 0.01, 10, sampling="wor")
    with pytest.raises(StoreError, match="not a sweeps store"):
        StoreLookup(str(atlas_path.parent / "nothing.zarr"))
