"""Sigma lookup tables: every stored and every looked-up sigma is certified by an
independent accountant run; bad queries and bad configs give clear errors; an
interrupted build resumes only the missing rows."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

import pldlib
from pldlib.tables import SigmaTable, TableRangeError, invert_on_safe_side, open_table
from sweeps.config import ConfigError
from sweeps.tables import build_table, load_table_config, parse_table_config

ROOT = Path(__file__).resolve().parent.parent
TEST_CONFIG = ROOT / "configs" / "sigma_table_test.yaml"


def _mech(sigma, q, sampling, relation="add_remove"):
    return pldlib.Gaussian(sigma=sigma, q=q, sampling="none" if q == 1 else sampling, relation=relation)


def _upper(sigma, q, steps, delta, sampling, relation="add_remove"):
    """Independent re-check: the certified upper eps at the accountant's own default accuracy."""
    return float(pldlib.account(_mech(sigma, q, sampling, relation), steps=int(steps)).epsilon(delta).upper)


@pytest.fixture(scope="module")
def built(embedded_client, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("table") / "t.zarr")
    build_table(str(TEST_CONFIG), store=store, client=embedded_client, progress=False, say=lambda *_: None)
    return store


def test_every_entry_is_certified_at_its_grid_point(built):
    t = open_table(built)
    ds = t.ds
    assert int((ds["status"].values == 1).sum()) == ds["status"].size  # all entries found
    for e in ds.epsilon.values:
        for d in ds.delta.values:
            for q in ds.q.values:
                for k in ds.steps.values:
                    s = float(ds.sigma.sel(epsilon=e, delta=d, q=q, steps=k, sampling="poisson",
                                           relation="add_remove"))
                    assert _upper(s, float(q), k, float(d), "poisson") <= e
    # certified-infeasible sigmas really are infeasible (independent lower bound)
    inf = ds.sigma_infeasible.sel(sampling="poisson", relation="add_remove")
    e, d, q, k = (float(inf.epsilon[0]), float(inf.delta[0]), float(inf.q[0]), int(inf.steps[-1]))
    si = float(inf.sel(epsilon=e, delta=d, q=q, steps=k))
    assert math.isfinite(si)
    lo = pldlib.account(_mech(si, q, "poisson"), steps=k).epsilon(d).lower
    assert lo > e


def test_table_sigma_is_close_to_calibrated(built):
    t = open_table(built)
    # the table is a refined inversion: within the sigma grid ratio of the optimum
    for e, d, q, k in [(1.0, 1e-5, 0.01, 1000), (4.0, 1e-7, 0.05, 100)]:
        a = t.sigma_for(e, d, q, k)
        r = pldlib.calibrate(e, d, q, k, tol=1e-3)
        assert r.sigma_lower < a.sigma <= 1.3 * r.sigma


def test_random_off_grid_queries_are_certified(built):
    t = open_table(built)
    rng = np.random.default_rng(7)
    ax = t.axes
    for _ in range(8):
        e = float(rng.uniform(ax["epsilon"][0], 6.0))
        d = float(10 ** rng.uniform(-7, -4))
        q = float(10 ** rng.uniform(-3, math.log10(ax["q"][-1])))
        k = int(rng.integers(5, ax["steps"][-1] + 1))
        samp = str(rng.choice(["poisson", "wor"]))
        a = t.sigma_for(e, d, q, k, samp, "add_remove")
        assert a.rounding["epsilon"][1] <= e and a.rounding["delta"][1] <= d
        assert a.rounding["q"][1] >= q and a.rounding["steps"][1] >= k
        assert _upper(a.sigma, q, k, d, samp) <= e, (e, d, q, k, samp, a)


def test_exact_and_rounded_answers_say_how_they_rounded(built):
    t = open_table(built)
    a = t.sigma_for(1.0, 1e-5, 0.01, 100, "poisson", "add_remove")
    assert a.exact and a.grid["q"] == 0.01 and a.eps_upper <= 1.0
    b = t.sigma_for(1.5, 1e-6, 0.02, 150, "poisson", "add_remove")
    assert not b.exact
    assert b.rounding["epsilon"] == (1.5, 1.0, "down")
    assert b.rounding["delta"] == (1e-6, 1e-7, "down")
    assert b.rounding["q"] == (0.02, 0.05, "up")
    assert b.rounding["steps"] == (150.0, 1000.0, "up")
    assert "q=0.02 -> 0.05 (up)" in b.describe()
    # WOR add_remove is Poisson at sensitivity 2: the certified sigmas double (up to refinement)
    w = t.sigma_for(1.0, 1e-5, 0.01, 100, "wor", "add_remove")
    assert w.sigma == pytest.approx(2 * a.sigma, rel=0.02)


@pytest.mark.parametrize("kwargs,match", [
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=-1.0), "epsilon"),
    (dict(epsilon=0.5), "epsilon=0.5 is below"),       # below the smallest target
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(delta=1e-9), "delta=1e-09 is below"),
    (dict(q=0.2), "q=0.2 is above"),
    (dict(q=1.5), "q"),
    (dict(steps=5000), "steps=5000 is above"),
    (dict(steps=0), "steps"),
    (dict(relation="sideways"), "relation"),
    (dict(relation="substitution"), "relation='substitution' is not in the table"),
    (dict(sampling="bernoulli"), "sampling"),
])
def test_bad_queries(built, kwargs, match):
    t = open_table(built)
    q = dict(epsilon=1.0, delta=1e-5, q=0.01, steps=100, sampling="poisson", relation="add_remove")
    q.update(kwargs)
    with pytest.raises(ValueError, match=match):
        t.sigma_for(**q)


def test_safe_side_rounding_below_the_grid_is_allowed(built):
    t = open_table(built)
    a = t.sigma_for(10.0, 1e-3, 1e-3, 3, "poisson", "add_remove")  # every argument inside the safe side
    assert a.rounding["epsilon"][2] == "down" and a.rounding["q"][2] == "up"
    assert _upper(a.sigma, 1e-3, 3, 1e-3, "poisson") <= 10.0


def test_open_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_table(tmp_path / "nothing.zarr")
    import xarray as xr

    xr.Dataset({"x": ("a", [1.0])}).to_zarr(tmp_path / "other.zarr", consolidated=False)
    with pytest.raises(ValueError, match="not a pldlib sigma table"):
        open_table(tmp_path / "other.zarr")


def test_invert_on_safe_side_uses_only_certificates():
    s = [1.0, 2.0, 3.0, 4.0]
    up = [9.0, 5.0, 2.5, 1.0]
    lo = [8.0, 4.5, 2.0, 0.9]
    assert invert_on_safe_side(s, up, lo, 3.0) == (2, 1)   # feasible at 3.0, infeasible at 2.0
    assert invert_on_safe_side(s, up, lo, 0.5) == (None, 3)
    assert invert_on_safe_side(s, up, lo, 10.0) == (0, None)
    # an ambiguous point (lower <= target < upper) is neither
    assert invert_on_safe_side(s, up, lo, 4.7) == (2, 0)


def test_calibrate_uses_the_table_as_seed(built):
    t = open_table(built)
    # a grid point: the stored sigma is the seed
    g = pldlib.calibrate(1.0, 1e-5, 0.01, 100, table=t)
    assert g.seed == "table"
    assert g.sigma == pytest.approx(t.sigma_for(1.0, 1e-5, 0.01, 100).sigma, rel=0.01)
    # off the grid the (safe-side, over-estimating) table answer caps the GDP estimate
    r = pldlib.calibrate(2.0, 1e-6, 0.02, 300, table=t)
    assert r.seed in ("table", "gdp (table cap)")
    # re-checked on a finer grid than the search certified it on
    acc = pldlib.account(_mech(r.sigma, 0.02, "poisson"), steps=300, interval=r.interval / 2)
    assert acc.epsilon(1e-6).upper <= 2.0
    r2 = pldlib.calibrate(2.0, 1e-6, 0.02, 300)
    assert r.sigma == pytest.approx(r2.sigma, rel=2e-3)


def test_resume_recomputes_only_missing_rows(embedded_client, built, tmp_path):
    client = embedded_client
    import shutil

    import zarr

    store = str(tmp_path / "copy.zarr")
    shutil.copytree(built, store)
    g = zarr.open_group(store, mode="r+")
    st = g["status"][...]
    st[:, :, 1, :, 0, :] = 0  # "interrupted": q[1], poisson never committed
    g["status"][...] = st
    msgs = []
    build_table(str(TEST_CONFIG), store=store, client=client, progress=False, say=msgs.append)
    assert "3 already done, 1 to compute" in msgs[0]
    a, b = open_table(built).ds, open_table(store).ds
    np.testing.assert_array_equal(a.sigma.values, b.sigma.values)
    # a different config is refused and the store is left as it was
    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    cfg["grid"]["epsilon"] = [1.0, 2.0]
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="another config"):
        build_table(str(other), store=store, client=client, progress=False, say=lambda *_: None)


@pytest.mark.parametrize("change,field", [
    ({"kind": "sweep"}, "kind"),
    ({"grid": {"epsilon": [1.0], "delta": [1e-5], "q": [0.01], "steps": [10],
               "sampling": ["poisson"], "relation": ["add_remove"], "sigma": [1.0]}}, "grid.sigma"),
    ({"grid": {"epsilon": [-1.0], "delta": [1e-5], "q": [0.01], "steps": [10],
               "sampling": ["poisson"], "relation": ["add_remove"]}}, "grid.epsilon"),
    ({"grid": {"epsilon": [1.0], "delta": [1e-5], "q": [1.5], "steps": [10],
               "sampling": ["poisson"], "relation": ["add_remove"]}}, "grid.q"),
    ({"options": {"sigma_ratio": 1.0}}, "options.sigma_ratio"),
    ({"options": {"colour": 1}}, "options.colour"),
])
def test_bad_table_configs(change, field):
    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    cfg.update(change)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_table_config(cfg)


def test_unreadable_config_and_cli_exit_status(tmp_path, capsys):
    from sweeps.tables import main

    with pytest.raises(ConfigError, match="cannot read"):
        load_table_config(tmp_path / "missing.yaml")
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_open_is_the_public_alias_of_open_table(built):
    import builtins

    import pldlib.tables as T

    assert "open" in T.__all__ and T.open is T.open_table
    t = pldlib.tables.open(built)  # the name issue #7 uses, reachable from `import pldlib`
    assert isinstance(t, SigmaTable)
    a = t.sigma_for(1.0, 1e-5, 0.01, 100)
    assert a.exact and a.sigma == open_table(built).sigma_for(1.0, 1e-5, 0.01, 100).sigma
    with pytest.raises(FileNotFoundError):
        T.open("no/such/table.zarr")
    assert builtins.open is not T.open  # the builtin is untouched outside the module


def test_stored_sigmas_are_tight_upper_only_searches(built):
    """The search uses upper-only evaluations; each stored sigma has its upper bound
    certified, the entries are within a few tenths of a percent of the upper curve's root
    (the sigma just below them is not certified feasible at the same spacing), and the
    lower bounds (one coarser full evaluation) are certified and below the upper."""
    from pldlib.calibrate import upper_interval

    t = open_table(built)
    ds = t.ds.sel(sampling="poisson", relation="add_remove")
    lo, up = ds.eps_lower.values, ds.eps_upper.values
    assert np.all(up <= ds.epsilon.values[:, None, None, None])
    ok = np.isfinite(lo)
    assert ok.mean() > 0.9 and np.all(lo[ok] <= up[ok])
    for e, d, q, k in [(1.0, 1e-5, 0.01, 1000), (4.0, 1e-7, 0.05, 100)]:
        s = float(ds.sigma.sel(epsilon=e, delta=d, q=q, steps=k))
        below = s / 1.01
        m = _mech(below, q, "poisson")
        u = pldlib.account(m, steps=k, interval=upper_interval(m, k), lower_bound=False).epsilon(d).upper
        assert u > e, (e, d, q, k, s)


# -- `sweeps run/status/show` on table configs and stores -----------------------------
def _sweeps(argv, capsys):
    from sweeps.cli import main

    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_sweeps_run_builds_and_resumes_a_table(embedded_client, built, tmp_path, capsys):
    client = embedded_client
    import shutil

    import zarr

    store = str(tmp_path / "cli.zarr")
    shutil.copytree(built, store)
    g = zarr.open_group(store, mode="r+")
    st = g["status"][...]
    st[:, :, 1, :, 1, :] = 0  # q[1], wor: never committed
    g["status"][...] = st
    addr = client.scheduler.address
    rc, out, err = _sweeps(["run", str(TEST_CONFIG), "--store", store, "--scheduler", addr, "--no-progress"],
                           capsys)
    assert rc == 0, err
    assert "entries: 32 ok, 0 failed, 0 missing" in out
    np.testing.assert_array_equal(open_table(store).ds.sigma.values, open_table(built).ds.sigma.values)
    # nothing left: a second run computes nothing
    rc, out, _ = _sweeps(["run", str(TEST_CONFIG), "--store", store, "--scheduler", addr, "--no-progress"], capsys)
    assert rc == 0 and "32 ok" in out


def test_sweeps_status_and_show_understand_table_stores(built, capsys):
    rc, out, _ = _sweeps(["status", built], capsys)
    assert rc == 0 and "pldlib.sigma_table" in out and "32 ok" in out
    rc, out, _ = _sweeps(["show", built, "--sel", "epsilon=1", "delta=1e-5", "sampling=poisson"], capsys)
    assert rc == 0
    assert "certified sigma: epsilon=1 delta=1e-05 sampling=poisson relation=add_remove" in out
    assert "q=0.01" in out and "q=0.05" in out
    s = open_table(built).sigma_for(1.0, 1e-5, 0.01, 100).sigma
    assert f"{s:.5g}" in out
    rc, out, _ = _sweeps(["show", built], capsys)
    assert rc == 0 and out.count("certified sigma:") == 8


def _table_config(tmp_path, name, **changes):
    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    cfg.update(changes)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


def test_sweeps_bad_table_input_exits_2(built, tmp_path, capsys):
    def bad(argv, *words):
        rc, out, err = _sweeps(argv, capsys)
        assert rc == 2, (argv, out, err)
        line = err.strip()
        assert len(line.splitlines()) == 1 and line.startswith("sweeps"), err
        for w in words:
            assert w in line, line

    store = str(tmp_path / "never.zarr")
    bad(["run", _table_config(tmp_path, "c", options={"colour": 1}), "--store", store], "options.colour")
    bad(["run", _table_config(tmp_path, "r", options={"sigma_ratio": 0.5}), "--store", store],
        "options.sigma_ratio")
    bad(["run", _table_config(tmp_path, "e", options={"eps_lower": "yes"}), "--store", store], "options.eps_lower")
    bad(["run", str(TEST_CONFIG), "--store", store, "--quick"], "--quick")
    bad(["run", str(TEST_CONFIG), "--store", store, "--workers", "0"], "--workers")
    # a table made from another config is refused, and left as it was
    other = _table_config(tmp_path, "o", grid={**yaml.safe_load(TEST_CONFIG.read_text())["grid"],
                                               "epsilon": [1.0, 2.0]})
    before = open_table(built).ds.sigma.values.copy()
    bad(["run", other, "--store", built], "another config")
    np.testing.assert_array_equal(open_table(built).ds.sigma.values, before)
    assert not Path(store).exists()
    # an unknown kind in a sweep config names the key (not "unknown key")
    bad(["run", _table_config(tmp_path, "k", kind="histogram")], "kind", "unknown config kind")
    # selections and commands a table store does not have
    bad(["show", built, "--sel", "sigma=1"], "unknown dimension 'sigma'")
    bad(["show", built, "--sel", "epsilon=3"], "epsilon=3: no such value")
    bad(["plot", built], "sigma table", "sweeps show")
    bad(["report", built], "sigma table")


def test_sweep_loader_explains_a_table_config():
    from sweeps.config import load_config

    with pytest.raises(ConfigError, match="sigma table config"):
        load_config(TEST_CONFIG)


def test_verify_table_rechecks_queries(built):
    from sweeps.tables import verify_table

    rec = verify_table(built, queries=3, grid_points=2, seed=1, say=lambda *_: None)
    assert rec["violations"] == 0 and rec["checked"] + rec["unanswered"] + rec["uncheckable"] == 3
    assert rec["checked"] >= 1 and rec["off_grid_ratio_summary"]["min"] > 0.99
    g = rec["grid_ratio_summary"]
    assert g["n"] == 2 and 0.99 < g["min"] <= g["max"] < 1.3  # the test table refines once only
