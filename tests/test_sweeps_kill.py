"""Process kills on real process clusters: a worker mid-sweep, a poison block, the driver.

Uses the test-only method options ``sleep`` (slow blocks, so there is time
to kill something) and ``crash`` (the block kills its worker process).
"""
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from sweeps.config import load_config, parse_config
from sweeps.execute import run_sweep
from sweeps.plan import make_plan
from sweeps.store import block_states, read_status
from sweeps.testing import group_alive, small_config, write_config

ROOT = Path(__file__).resolve().parent.parent


def eight_blocks(store, **pld_options):
    d = small_config(store, sigma=[1.0, 2.0, 3.0, 4.0], steps=[1, 10, 100])
    d["options"]["pld"].update(pld_options)
    return d


@pytest.fixture(scope="module")
def pcluster(tmp_path_factory):
    """A real external cluster (tests/conftest.py): scheduler + 2 worker processes.

    allowed-failures 1: a block whose worker dies twice is KilledWorker (default 3: slower test);
    worker-saturation 1.0: a single-threaded worker holds one task, so a crash hits no bystander."""
    from conftest import ExternalCluster

    c = ExternalCluster(tmp_path_factory.mktemp("pcluster"), n_workers=2,
                        scheduler_env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": 1,
                                       "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": 1.0})
    yield c
    c.close()


@pytest.fixture(scope="module")
def pclient(pcluster):
    with pcluster.client() as cl:
        yield cl


@pytest.fixture(scope="module")
def reference(pclient, tmp_path_factory):
    """The eight-block sweep, uninterrupted (test_sweeps_run checks such runs against pldlib)."""
    cfg = parse_config(eight_blocks(tmp_path_factory.mktemp("ref") / "r.zarr"))
    rep = run_sweep(cfg, client=pclient, progress=False, stream=io.StringIO())
    assert rep.ok == 8
    return xr.open_zarr(cfg.store, chunks=None)


def same_results(ds, ref):
    for v in ("eps_lower", "eps_upper", "status"):
        np.testing.assert_array_equal(ds[v].values, ref[v].values)


def test_worker_killed_mid_sweep(pclient, tmp_path, reference):
    cfg = parse_config(eight_blocks(tmp_path / "w.zarr", sleep=0.4))
    killed = {}

    def on_result(block, result, report):
        if killed:
            return
        busy = [w for w, keys in pclient.processing().items() if keys]
        if not busy:
            return
        addr = busy[0]
        killed["pid"] = pclient.run(os.getpid, workers=[addr])[addr]
        killed["addr"] = addr
        try:
            pclient.run(os._exit, 1, workers=[addr])
        except Exception:  # the worker dies before it can answer
            pass

    rep = run_sweep(cfg, client=pclient, on_result=on_result, progress=False, stream=io.StringIO())
    assert killed, "no worker was busy when the first result came"
    assert rep.ok == 8 and rep.failed == 0 and rep.lost == 0
    ds = xr.open_zarr(cfg.store, chunks=None)
    assert (ds.status.values == 1).all()
    same_results(ds, reference)
    pclient.wait_for_workers(2, timeout=60)
    assert killed["pid"] not in pclient.run(os.getpid).values()  # it really died (and was replaced)


def test_poison_block_killed_worker_recorded(pclient, tmp_path, reference):
    cfg = parse_config(eight_blocks(tmp_path / "p.zarr", crash={"sigma": 3.0, "relation": "add_remove"}))
    rep = run_sweep(cfg, client=pclient, progress=False, stream=io.StringIO())
    assert rep.ok == 7 and rep.failed == 1
    ds = xr.open_zarr(cfg.store, chunks=None)
    bad = ds.sel(sigma=3.0, relation="add_remove")
    assert (bad.status.values == 2).all() and np.isnan(bad.eps_upper.values).all()
    assert "KilledWorker" in str(bad.error.values.ravel()[0])
    assert int((ds.status.values == 1).sum()) == 7 * 6
    good = ds.sel(sigma=[1.0, 2.0, 4.0])
    np.testing.assert_array_equal(good.eps_upper.values, reference.sel(sigma=[1.0, 2.0, 4.0]).eps_upper.values)
    pclient.wait_for_workers(2, timeout=60)


def _done_blocks(store, plan):
    try:
        return block_states(plan, read_status(store))
    except Exception:
        return None


def test_driver_killed_then_resumed(pclient, tmp_path, reference):
    store = tmp_path / "d.zarr"
    cfg_path = write_config(tmp_path / "d.yaml", eight_blocks(store, sleep=0.5))
    plan = make_plan(load_config(cfg_path))
    log = open(tmp_path / "driver.log", "w")
    from conftest import checkout_env

    proc = subprocess.Popen([sys.executable, "-m", "sweeps", "run", cfg_path, "--workers", "2", "--no-progress"],
                            cwd=ROOT, env=checkout_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            st = _done_blocks(str(store), plan) if store.exists() else None
            if st is not None and (st == 1).sum() >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the driver finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)  # the driver only
        proc.wait(timeout=30)
        # its worker processes notice that their parent died and exit by themselves
        deadline = time.monotonic() + 30
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        orphans = group_alive(proc.pid)
    finally:
        if proc.poll() is None or group_alive(proc.pid):
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # clean up what is left of that process group
            except ProcessLookupError:
                pass
        log.close()
    assert not orphans, "worker processes outlived the killed driver"
    states = _done_blocks(str(store), plan)
    assert set(np.unique(states)) <= {0, 1}, "a block was left half written"
    done = sorted(int(i) for i in np.nonzero(states == 1)[0])
    missing = sorted(int(i) for i in np.nonzero(states == 0)[0])
    assert 2 <= len(done) < 8, (done, (tmp_path / "driver.log").read_text())

    rep = run_sweep(cfg_path, client=pclient, progress=False, stream=io.StringIO())
    assert rep.action == "resumed" and rep.run == 2
    assert rep.submitted == len(missing) and sorted(rep.submitted_blocks) == missing
    assert rep.ok == len(missing) and rep.complete

    ds = xr.open_zarr(store, chunks=None)
    same_results(ds, reference)  # identical to an uninterrupted run
    runs = ds.run.transpose("sigma", "q", "sampling", "relation", "method").values.ravel()
    assert int((runs == 1).sum()) == len(done) and int((runs == 2).sum()) == len(missing)
    import json

    recs = json.loads(ds.attrs["runs"])
    # run 1 never got to record its end; run 2 took its stale lease and marked it abandoned
    assert [r["state"] for r in recs] == ["abandoned", "finished"]
