"""The sharded store layout (sweeps.shards): workers write whole shards, tasks sized by a cost model."""
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from sweeps.config import ConfigError, load_config, parse_config
from sweeps.cost import CostModel, group_tasks
from sweeps.execute import run_sweep
from sweeps.plan import BLOCK_DIMS, make_plan
from sweeps.shards import (AUTO_MIN_BLOCKS, ShardGrid, _probe_write, check_workers_write, choose_layout,
                           decode_shard, encode_shard, layout_of, refit_model)
from sweeps.store import StoreError, read_attrs
from sweeps.testing import group_alive, small_config, write_config

ROOT = Path(__file__).resolve().parent.parent
COMPARE = ("eps_lower", "eps_upper", "eps_estimate", "status", "error", "run")


def quiet():
    return {"progress": False, "stream": io.StringIO()}


def grid_config(store, layout, **pld_options):
    """3 sigma x 4 q x 2 relations x 2 methods = 48 blocks of 2 steps x 2 deltas."""
    d = small_config(store, sigma=[1.0, 2.0, 3.0], q=[0.1, 0.2, 0.5, 1.0], sampling=["poisson"], steps=[1, 10])
    d["methods"] = ["rdp", "pld"]
    d["options"] = {"pld": {"spacing": 2e-3, **pld_options}}
    if layout is not None:
        d["layout"] = layout
    return d


def same(a, b, vars=COMPARE):
    for v in vars:
        x, y = a[v].values, b[v].values
        if x.dtype.kind == "f":
            np.testing.assert_array_equal(x, y, err_msg=v)
        else:
            assert (x == y).all(), v


@pytest.fixture(scope="module")
def client(embedded_client):  # tests/conftest.py: the shared in-process cluster (2 threads)
    return embedded_client


@pytest.fixture(scope="module")
def pair(client, tmp_path_factory):
    """The same sweep in the block layout and sharded (shards of 4 blocks)."""
    tmp = tmp_path_factory.mktemp("pair")
    cb = parse_config(grid_config(tmp / "b.zarr", "blocks"))
    cs = parse_config(grid_config(tmp / "s.zarr", {"shard_blocks": 4}))
    rb = run_sweep(cb, client=client, **quiet())
    rs = run_sweep(cs, client=client, **quiet())
    return cb, rb, cs, rs


def test_sharded_equals_block_layout_cell_for_cell(pair):
    cb, rb, cs, rs = pair
    assert rb.ok == rs.ok == 48 and rs.complete and rs.failed == 0
    assert layout_of(read_attrs(cb.store)).kind == "blocks"
    lay = layout_of(read_attrs(cs.store))
    assert lay.sharded and lay.shard_blocks == 4
    a, b = xr.open_zarr(cs.store, chunks=None), xr.open_zarr(cb.store, chunks=None)
    same(a, b)
    assert (a.state.values == 1).all() and np.isfinite(a.block_seconds.values).all()
    assert (a.seconds.values > 0).all() and (a.host.values != "").all()
    assert 1 <= rs.tasks < 48


def test_readable_by_plain_xarray_and_zarr(pair):
    cb, _, cs, _ = pair
    g = zarr.open_group(cs.store, mode="r")
    ref = xr.open_zarr(cb.store, chunks=None)
    for v in ("eps_lower", "eps_upper", "status"):
        arr = g[v]
        assert arr.shards is not None and arr.chunks[0] == 1  # sharded, inner chunk = one block
        np.testing.assert_array_equal(arr[...], ref[v].values)
    assert zarr.open(cs.store, mode="r")["status"][...].sum() == ref.status.values.sum()
    ds = xr.open_zarr(cs.store)  # dask-backed, plain xarray
    np.testing.assert_array_equal(ds.eps_upper.sel({"method": "pld"}).values, ref.eps_upper.sel({"method": "pld"}).values)


def test_files_count_shards_not_blocks(pair):
    cb, _, cs, _ = pair

    def files(p, var):
        return sum(len(f) for _, _, f in os.walk(Path(p) / var))

    plan = make_plan(cs)
    n_shards = len(ShardGrid(tuple(plan.shape[d] for d in BLOCK_DIMS), layout_of(read_attrs(cs.store)).shard))
    assert n_shards == 12
    for v in ("eps_upper", "status", "run", "state"):
        assert files(cs.store, v) == n_shards + 1, v  # + zarr.json
    assert files(cb.store, "status") == 48 + 1
    assert not [f for _, _, fs in os.walk(cs.store) for f in fs if f.endswith((".tmp", ".partial"))]


def test_failing_block_recorded_then_resumed(client, tmp_path):
    d = grid_config(tmp_path / "f.zarr", {"shard_blocks": 4})
    d["options"]["pld"]["fail"] = {"sigma": 2.0}
    rep = run_sweep(parse_config(d), client=client, **quiet())
    assert rep.ok == 40 and rep.failed == 8 and not rep.complete
    ds = xr.open_zarr(d["store"], chunks=None)
    bad = ds.sel({"sigma": 2.0, "method": "pld"})
    assert (bad.status.values == 2).all() and np.isnan(bad.eps_upper.values).all()
    assert (bad.state.values == 2).all()
    assert all("RuntimeError: test-only 'fail'" in str(t) for t in bad.error.values.ravel())
    good_before = ds.eps_upper.sel({"method": "rdp"}).values.copy()
    # a second run computes the failed blocks only; the others stay as they were
    rep2 = run_sweep(parse_config(d), client=client, **quiet())
    assert rep2.already_done == 40 and rep2.submitted == 8 and rep2.failed == 8
    ds2 = xr.open_zarr(d["store"], chunks=None)
    np.testing.assert_array_equal(ds2.eps_upper.sel({"method": "rdp"}).values, good_before)
    runs = ds2.run.sel({"sigma": 2.0, "method": "pld"}).values
    assert (runs == 2).all() and int((ds2.run.values == 1).sum()) == 40
    fitted = json.loads(ds2.attrs["cost_model"])["fitted_on_blocks"]
    assert fitted.get("rdp", 0) >= 10 and fitted.get("pld", 0) >= 10  # refitted from the store on resume


def test_config_layout_keys_and_auto_choice(tmp_path):
    with pytest.raises(ConfigError, match="layout"):
        parse_config(grid_config(tmp_path / "x.zarr", "tiles"))
    with pytest.raises(ConfigError, match="layout.shard_blocks"):
        parse_config(grid_config(tmp_path / "x.zarr", {"shard_blocks": 0}))
    with pytest.raises(ConfigError, match="task_seconds"):
        parse_config({**grid_config(tmp_path / "x.zarr", None), "task_seconds": -1})
    small = parse_config(grid_config(tmp_path / "x.zarr", None))
    assert choose_layout(make_plan(small)).kind == "blocks"
    # layout and task_seconds change files, not results: same fingerprint
    assert parse_config(grid_config(tmp_path / "x.zarr", "sharded")).fingerprint() == small.fingerprint()
    d = grid_config(tmp_path / "y.zarr", None)
    d["grid"]["q"] = {"geomspace": [1e-4, 1.0, AUTO_MIN_BLOCKS // 12 + 10]}
    big = make_plan(parse_config(d))
    assert len(big.blocks) > AUTO_MIN_BLOCKS
    lay = choose_layout(big)
    assert lay.sharded and 16 <= lay.shard_blocks <= 1024
    assert choose_layout(big, "blocks").kind == "blocks"


def test_cost_model_groups_rows_near_target():
    assert group_tasks([1.0] * 100, 10.0) == [list(range(i, i + 10)) for i in range(0, 100, 10)]
    costs = [50.0] + [1.0] * 40
    tasks = group_tasks(costs, 10.0)
    assert tasks[0] == [0]  # a unit costlier than the target is a task of its own
    assert all(sum(costs[i] for i in t) == 10.0 for t in tasks[1:])
    assert sorted(i for t in tasks for i in t) == list(range(41))
    rng = np.random.default_rng(1)
    c = rng.lognormal(0, 1, 2000)
    t = group_tasks(c, 30.0)
    sums = np.array([c[i].sum() for i in t])
    assert (sums[:-1] >= 30).all() and (sums[:-1] < 30 + c.max()).all()
    assert len(group_tasks([1.0] * 8, 100.0, min_tasks=4)) == 4  # small sweeps: every worker busy


def test_cost_model_refit_from_synthetic_and_store_seconds(pair):
    m = CostModel()
    sig = np.geomspace(0.5, 4, 200)
    q = np.full(200, 0.1)
    true = 0.02 * sig ** -1.5
    fit = m.refit("rdp", sig, q, 1, 1, np.array(["poisson"] * 200, dtype=object), true)
    pred = fit.predict("rdp", sig, q, 1, 1, np.array(["poisson"] * 200, dtype=object))
    assert np.allclose(np.log(pred), np.log(true), atol=0.3)
    assert CostModel.from_json(fit.to_json()).coef["rdp"] == pytest.approx(fit.coef["rdp"])
    # from a store's measured block seconds
    _, _, cs, _ = pair
    ds = xr.open_zarr(cs.store, chunks=None).transpose(*BLOCK_DIMS, ...)
    plan = make_plan(cs)
    model = refit_model(plan, CostModel(), ds.state.values, ds.block_seconds.values)
    assert model.fitted == {"rdp": 24, "pld": 24}
    from sweeps.shards import row_costs

    from sweeps.cost import OVERHEAD_SECONDS

    pred = row_costs(plan, model) - OVERHEAD_SECONDS  # the method's own time
    for j, meth in enumerate(plan.coords["method"]):
        meas = ds.block_seconds.values[..., j]
        ratio = np.exp(np.mean(np.log(pred[..., j])) - np.mean(np.log(meas)))
        assert 1 / 3 < ratio < 3, (meth, ratio)


def test_shard_codec_round_trip_through_zarr(tmp_path):
    """encode_shard writes what zarr's sharding codec reads, edge shards included."""
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(5, 7, 3, 2), chunks=(1, 1, 3, 2), shards=(2, 4, 3, 2),
                          dtype="f8", fill_value=np.nan, compressors=None)
    data = np.random.default_rng(0).random((5, 7, 3, 2))
    from sweeps.shards import _raw_spec

    spec = _raw_spec(a)
    assert spec is not None and spec[0] == (2, 4, 3, 2) and spec[1] == (1, 1, 3, 2)
    for i in range(0, 5, 2):
        for j in range(0, 7, 4):
            part = data[i:i + 2, j:j + 4]
            f = tmp_path / "a.zarr" / "c" / str(i // 2) / str(j // 4) / "0" / "0"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(encode_shard(part, (2, 4, 3, 2), (1, 1, 3, 2)))
            back = decode_shard(f.read_bytes(), part.shape, (2, 4, 3, 2), (1, 1, 3, 2), np.float64, np.nan)
            np.testing.assert_array_equal(back, part)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...], data)
    # and a shard zarr wrote is read back by decode_shard (missing inner chunks: the fill value)
    b = zarr.create_array(str(tmp_path / "b.zarr"), shape=(2, 4, 3, 2), chunks=(1, 1, 3, 2), shards=(2, 4, 3, 2),
                          dtype="f8", fill_value=np.nan, compressors=None)
    part = data[:2, :4].copy()
    part[1, 2] = np.nan  # an inner chunk of fill values: zarr leaves it out of the shard
    b[...] = part
    buf = (tmp_path / "b.zarr" / "c" / "0" / "0" / "0" / "0").read_bytes()
    np.testing.assert_array_equal(decode_shard(buf, part.shape, (2, 4, 3, 2), (1, 1, 3, 2), np.float64, np.nan), part)


def test_shard_files_written_atomically(tmp_path, monkeypatch):
    """A write that dies midway leaves the old file (temporary file + os.replace)."""
    from sweeps import shards

    f = tmp_path / "x" / "shard"
    shards._atomic_put(f, b"old")

    def boom(src, dst):
        raise OSError("killed")

    monkeypatch.setattr(shards.os, "replace", boom)
    with pytest.raises(OSError):
        shards._atomic_put(f, b"new")
    assert f.read_bytes() == b"old" and os.listdir(f.parent) == ["shard"]
    # the zarr store the workers open writes the same way
    import asyncio

    from zarr.core.buffer import default_buffer_prototype

    st = shards.AtomicLocalStore(tmp_path / "s")
    with pytest.raises(OSError):
        asyncio.run(st.set("k/c/0", default_buffer_prototype().buffer.from_bytes(b"abc")))
    assert not (tmp_path / "s" / "k" / "c" / "0").exists() and os.listdir(tmp_path / "s" / "k" / "c") == []


def test_workers_must_see_and_write_the_store(pair, client, tmp_path):
    _, _, cs, _ = pair
    sid = read_attrs(cs.store)["store_id"]
    check_workers_write(client, cs.store, sid)  # fine
    assert _probe_write(cs.store, sid) == ""
    with pytest.raises(StoreError, match="sees another store.*shares"):
        check_workers_write(client, cs.store, "not-this-one")
    with pytest.raises(StoreError, match="does not exist on this worker"):
        check_workers_write(client, str(tmp_path / "nowhere.zarr"), sid)


# -- real processes: a worker killed by a poison block; a driver killed and resumed ---------------
@pytest.fixture(scope="module")
def pclient():
    """An embedded LocalCluster of 2 worker processes; a block whose worker dies twice is KilledWorker."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 1,
                          "distributed.scheduler.worker-saturation": 1.0}):
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
            with c.get_client() as cl:
                yield cl


def test_worker_killed_by_poison_block_sharded(pclient, pair, tmp_path):
    _, _, cs, _ = pair
    d = grid_config(tmp_path / "k.zarr", {"shard_blocks": 4}, crash={"sigma": 3.0, "q": 0.5})
    rep = run_sweep(parse_config(d), client=pclient, **quiet())
    # the two pld blocks (sigma 3, q 0.5, both relations) kill their worker every time
    assert rep.failed == 2 and rep.ok == 46 and rep.lost == 0
    ds = xr.open_zarr(d["store"], chunks=None)
    bad = ds.sel({"sigma": 3.0, "q": 0.5, "method": "pld"})
    assert (bad.status.values == 2).all() and (bad.state.values == 2).all()
    assert all("KilledWorker" in str(e) for e in bad.error.values.ravel())
    ref = xr.open_zarr(cs.store, chunks=None)
    poison = (ds.sigma == 3.0) & (ds.q == 0.5) & (ds.method == "pld")
    np.testing.assert_array_equal(ds.eps_upper.where(~poison).values, ref.eps_upper.where(~poison).values)
    assert int(np.isin(ds.status.values, (1, 3)).sum()) == 46 * 4  # (3: cells rdp does not answer)
    np.testing.assert_array_equal(ds.status.where(~poison, 2).values, ref.status.where(~poison, 2).values)
    pclient.wait_for_workers(2, timeout=60)


def _done(store):
    try:
        return np.asarray(zarr.open_group(str(store), mode="r")["state"][...])
    except Exception:
        return None


def test_driver_killed_then_resumed_to_identical_store(client, pair, tmp_path):
    _, _, cs, _ = pair
    store = tmp_path / "d.zarr"
    d = grid_config(store, {"shard_blocks": 4}, sleep=0.05)
    d["task_seconds"] = 0.001  # one shard per task: shards finish one after another
    cfg_path = write_config(tmp_path / "d.yaml", d)
    from conftest import checkout_env

    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "sweeps", "run", cfg_path, "--workers", "2", "--no-progress"],
                            cwd=ROOT, env=checkout_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            st = _done(store) if store.exists() else None
            if st is not None and (st == 1).sum() >= 8:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the driver finished before it could be killed: " + (tmp_path / "driver.log").read_text()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if group_alive(proc.pid):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
    st = _done(store)
    assert set(np.unique(st)) <= {0, 1}, "a block was left half written"
    n_done = int((st == 1).sum())
    assert 8 <= n_done < 48, (tmp_path / "driver.log").read_text()
    rep = run_sweep(load_config(cfg_path), client=client, **quiet())
    assert rep.action == "resumed" and rep.run == 2 and rep.complete
    assert rep.already_done == n_done and rep.submitted == 48 - n_done and rep.ok == 48 - n_done
    ds, ref = xr.open_zarr(store, chunks=None), xr.open_zarr(cs.store, chunks=None)
    same(ds, ref, ("eps_lower", "eps_upper", "eps_estimate", "status", "error"))
    assert (ds.state.values == 1).all()
    assert int((ds.run.values == 1).sum()) == n_done and int((ds.run.values == 2).sum()) == 48 - n_done
    assert [r["state"] for r in json.loads(ds.attrs["runs"])] == ["abandoned", "finished"]


def test_tpr_metric_sharded_equals_block_layout(client, tmp_path):
    def cfg(name, layout):
        d = small_config(tmp_path / name, sigma=[1.0, 2.0, 4.0], steps=[1, 10])
        d["grid"]["fpr"] = [1e-3, 1e-1]
        d["layout"] = layout
        return parse_config(d)

    a, b = cfg("a.zarr", {"shard_blocks": 2}), cfg("b.zarr", "blocks")
    ra, rb = run_sweep(a, client=client, **quiet()), run_sweep(b, client=client, **quiet())
    assert ra.ok == rb.ok == 6 and ra.complete
    same(xr.open_zarr(a.store, chunks=None), xr.open_zarr(b.store, chunks=None),
         COMPARE + ("tpr_lower", "tpr_upper", "tpr_status"))


def test_task_of_a_driver_that_lost_the_store_writes_nothing(tmp_path):
    from sweeps.shards import NotOurStore, check_owner

    (tmp_path / "sweeps.lease.json").write_text(json.dumps({"token": "abc", "run": 3}))
    check_owner({"store": str(tmp_path), "run": 3, "lease_token": "abc"})
    with pytest.raises(NotOurStore, match="no longer holds"):
        check_owner({"store": str(tmp_path), "run": 3, "lease_token": "other"})
    (tmp_path / "sweeps.lease.json").unlink()  # released: the driver stopped
    with pytest.raises(NotOurStore):
        check_owner({"store": str(tmp_path), "run": 3, "lease_token": "abc"})



def test_whole_cell_variables_read_shard_by_shard_equal_zarr(pair):
    """read_cell_var (what ``sweeps status`` reads a sharded store's cells with) returns what zarr
    reads; the status summary of the sharded store equals the block layout's."""
    import zarr

    from sweeps.report import status_summary
    from sweeps.shards import read_cell_var

    cb, _rb, cs, _rs = pair
    blocks, sharded = cb.store, cs.store
    g = zarr.open_group(sharded, mode="r")
    for var in ("status", "eps_upper", "seconds"):
        np.testing.assert_array_equal(read_cell_var(sharded, var), np.asarray(g[var][...]))
    a, b = status_summary(blocks), status_summary(sharded)
    for k in ("blocks", "cells", "errors", "unsupported", "shape"):
        assert a[k] == b[k], k


def test_a_lookup_from_a_sharded_store_equals_the_block_stores(pair):
    """sweeps.atlas.StoreLookup reads one inner chunk per bisection step from a sharded store
    (zarr reads the shard's index and that chunk) and answers as from the block layout."""
    from sweeps.atlas import StoreLookup

    cb, _rb, cs, _rs = pair
    a, b = StoreLookup(cb.store), StoreLookup(cs.store)
    found = 0
    for eps in (0.3, 1.0, 3.0, 10.0):
        for q, k in ((0.1, 1), (0.15, 5), (0.5, 10)):
            x, y = a.sigma_for(eps, 1e-5, q, k), b.sigma_for(eps, 1e-5, q, k)
            assert (x == y) or (x != x and y != y)
            found += x == x
    assert b.reads == a.reads and found >= 3



def test_reports_of_a_sharded_store_equal_the_block_stores(pair):
    """sweeps show / summary read a sharded store's cells shard file by shard file: the same
    text as from the block layout."""
    from sweeps.report import show_text, summary_table

    cb, _rb, cs, _rs = pair
    for fn in (show_text, summary_table):
        a, b = fn(cb.store), fn(cs.store)
        assert a.replace(str(cb.store), "S") == b.replace(str(cs.store), "S")
        assert len(a) > 200
