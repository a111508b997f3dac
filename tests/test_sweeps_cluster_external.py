"""sweeps on a real external cluster: `dask scheduler` and `dask worker` subprocesses on 127.0.0.1.

What a cluster user meets: workers that cannot run the code, no workers at
all, workers with other code, SIGTERM to the driver, two drivers on one store,
workers that vanish mid-run.  Every wait is bounded.
"""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from conftest import ROOT, checkout_env
from sweeps.cli import main
from sweeps.config import load_config, parse_config
from sweeps.execute import run_sweep
from sweeps.lease import LEASE_NAME, read_lease
from sweeps.plan import make_plan
from sweeps.preflight import ClusterError
from sweeps.store import block_states, read_status
from sweeps.testing import small_config, write_config


def quiet():
    return {"progress": False, "stream": io.StringIO()}


def tiny(store, **pld):
    """2 blocks x 2 cells of pld: seconds on one worker."""
    d = small_config(store, sigma=[1.0, 2.0], relation=["add_remove"], steps=[1, 10], delta=[1e-5])
    d["options"]["pld"].update(pld)
    return d


def eight(store, **pld):
    d = small_config(store, sigma=[1.0, 2.0, 3.0, 4.0], steps=[1, 10])
    d["options"]["pld"].update(pld)
    return d


def driver(args, log_path, **popen):
    """``python -m sweeps ARGS`` as its own process group, importing this checkout."""
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "sweeps", *args], cwd=ROOT, env=checkout_env(),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **popen)
    proc._log = log
    return proc


def finish(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        proc._log.close()


def error_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("sweeps: error:")]
    assert len(lines) == 1, text
    assert "Traceback" not in text, text
    return lines[0]


def wait_blocks_done(store, plan, n, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if Path(store).exists():
            try:
                st = block_states(plan, read_status(str(store)))
                if (st == 1).sum() >= n:
                    return True
            except Exception:
                pass
        time.sleep(0.05)
    return False


# -- before submitting -------------------------------------------------------------------
def test_worker_without_pldlib_is_a_clear_error(make_external_cluster, tmp_path):
    broken = tmp_path / "broken"
    (broken / "pldlib").mkdir(parents=True)
    (broken / "pldlib" / "__init__.py").write_text("raise ImportError('pldlib is broken in this environment')\n")
    cl = make_external_cluster(n_workers=0)
    cl.start_worker(pythonpath_first=[broken])
    cl.wait_for_workers(1)
    store = tmp_path / "s.zarr"
    cfg = write_config(tmp_path / "c.yaml", tiny(store))
    t0 = time.monotonic()
    proc = driver(["run", cfg, "--scheduler", cl.address, "--no-progress", "--worker-timeout", "30"],
                  tmp_path / "d.log")
    rc = finish(proc, 60)
    elapsed = time.monotonic() - t0
    out = (tmp_path / "d.log").read_text()
    assert rc == 2, out
    assert elapsed < 60
    line = error_line(out)
    assert "cannot run the sweep code" in line and "import pldlib failed" in line
    assert "pldlib is broken in this environment" in line
    assert not store.exists()  # nothing written


def test_no_workers_is_a_clear_error_within_the_timeout(make_external_cluster, tmp_path):
    cl = make_external_cluster(n_workers=0)
    store = tmp_path / "s.zarr"
    cfg = write_config(tmp_path / "c.yaml", tiny(store))
    t0 = time.monotonic()
    proc = driver(["run", cfg, "--scheduler", cl.address, "--no-progress", "--worker-timeout", "3"],
                  tmp_path / "d.log")
    rc = finish(proc, 60)
    elapsed = time.monotonic() - t0
    out = (tmp_path / "d.log").read_text()
    assert rc == 2, out
    line = error_line(out)
    assert "no workers joined" in line and "within 3 s" in line and "--worker-timeout" in line
    assert 3 <= elapsed < 3 + 15, elapsed  # the stated timeout plus start-up, not forever
    assert "dashboard:" in out  # the external scheduler's dashboard (none here: --no-dashboard)
    assert not store.exists()


def test_mismatched_worker_version_is_reported(make_external_cluster, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(ROOT / "pldlib", other / "pldlib", ignore=shutil.ignore_patterns("__pycache__"))
    (other / "pldlib" / "_patched.py").write_text("# another build of the numeric code\n")
    dist = other / "pldlib-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pldlib\nVersion: 9.9.9\n")
    cl = make_external_cluster(n_workers=0)
    cl.start_worker(pythonpath_first=[other])
    cl.wait_for_workers(1)
    store = tmp_path / "s.zarr"
    cfg_path = write_config(tmp_path / "c.yaml", tiny(store))
    assert main(["run", cfg_path, "--scheduler", cl.address, "--no-progress", "--worker-timeout", "30"]) == 2
    assert not store.exists()
    # with --allow-mismatch it runs, warns, and the run record names the workers' versions
    err = io.StringIO()
    with cl.client() as client:
        rep = run_sweep(cfg_path, client=client, allow_mismatch=True, progress=False, stream=err)
    assert rep.complete
    assert "warning: 1 of 1 workers run other code than the driver" in err.getvalue()
    assert "pldlib 9.9.9 (driver" in err.getvalue() and "pldlib_code differs" in err.getvalue()
    rec = json.loads(xr.open_zarr(store, chunks=None).attrs["runs"])[-1]
    workers = rec["provenance"]["workers"]
    assert len(workers) == 1 and workers[0]["pldlib"] == "9.9.9"
    assert workers[0]["pldlib_code"] != rec["provenance"]["driver"]["pldlib_code"]


def test_mismatch_error_text(make_external_cluster, tmp_path, capsys):
    """(The CLI form of the refusal above, one line naming the difference.)"""
    other = tmp_path / "other"
    shutil.copytree(ROOT / "pldlib", other / "pldlib", ignore=shutil.ignore_patterns("__pycache__"))
    (other / "pldlib" / "_patched.py").write_text("# another build\n")
    cl = make_external_cluster(n_workers=0)
    cl.start_worker(pythonpath_first=[other])
    cl.wait_for_workers(1)
    cfg_path = write_config(tmp_path / "c.yaml", tiny(tmp_path / "s.zarr"))
    assert main(["run", cfg_path, "--scheduler", cl.address, "--no-progress"]) == 2
    err = capsys.readouterr().err
    line = error_line(err)
    assert "workers run other code than the driver" in line and "pldlib_code differs" in line
    assert "--allow-mismatch" in line


# -- while running ---------------------------------------------------------------------------
def test_workers_gone_mid_run_is_an_error_not_a_hang(make_external_cluster, tmp_path):
    cl = make_external_cluster(n_workers=1)
    cfg = parse_config(eight(tmp_path / "s.zarr", sleep=1.0))
    killed = []

    def on_result(block, result, report):
        if not killed:
            killed.append(block.number)
            cl.kill_worker(cl.workers[0])  # the only worker (and its nanny): nobody left

    err = io.StringIO()
    t0 = time.monotonic()
    with cl.client() as client:
        with pytest.raises(ClusterError, match="no workers .* and no progress for 3 s") as ei:
            run_sweep(cfg, client=client, worker_timeout=3, on_result=on_result, progress=False, stream=err)
    assert time.monotonic() - t0 < 45
    assert ei.value.exit_code == 1
    ds = xr.open_zarr(cfg.store, chunks=None)
    rec = json.loads(ds.attrs["runs"])[-1]
    assert rec["state"] == "stalled" and rec["ok"] >= 1
    assert not (Path(cfg.store) / LEASE_NAME).exists()  # the lease is released


def test_sigterm_records_interrupted_and_resume_is_identical(external_cluster, tmp_path):
    store = tmp_path / "t.zarr"
    cfg_path = write_config(tmp_path / "t.yaml", eight(store, sleep=0.6))
    plan = make_plan(load_config(cfg_path))
    proc = driver(["run", cfg_path, "--scheduler", external_cluster.address, "--no-progress"], tmp_path / "d.log")
    try:
        assert wait_blocks_done(store, plan, 2, proc), (tmp_path / "d.log").read_text()
        os.kill(proc.pid, signal.SIGTERM)  # what SLURM / Kubernetes send
        rc = proc.wait(timeout=30)
    finally:
        rc = finish(proc, 30)
    out = (tmp_path / "d.log").read_text()
    assert rc == 143, out
    assert "terminated (SIGTERM" in out and "Traceback" not in out
    ds = xr.open_zarr(store, chunks=None)
    recs = json.loads(ds.attrs["runs"])
    assert [r["state"] for r in recs] == ["interrupted"]
    assert read_lease(str(store)) is None  # released on the way out
    states = block_states(plan, read_status(str(store)))
    assert set(np.unique(states)) <= {0, 1} and 2 <= int((states == 1).sum()) < 8
    missing = sorted(int(i) for i in np.nonzero(states == 0)[0])

    with external_cluster.client() as client:
        rep = run_sweep(cfg_path, client=client, **quiet())
        assert rep.complete and sorted(rep.submitted_blocks) == missing
        ref_cfg = parse_config(eight(tmp_path / "ref.zarr"))  # the same sweep, uninterrupted
        assert run_sweep(ref_cfg, client=client, **quiet()).complete
    ds, ref = xr.open_zarr(store, chunks=None), xr.open_zarr(ref_cfg.store, chunks=None)
    for v in ("eps_lower", "eps_upper", "status"):
        np.testing.assert_array_equal(ds[v].values, ref[v].values)


def test_second_driver_refuses_while_the_first_runs(external_cluster, tmp_path, capsys):
    store = tmp_path / "two.zarr"
    cfg_path = write_config(tmp_path / "two.yaml", eight(store, sleep=0.5))
    plan = make_plan(load_config(cfg_path))
    proc = driver(["run", cfg_path, "--scheduler", external_cluster.address, "--no-progress"], tmp_path / "d.log")
    try:
        assert wait_blocks_done(store, plan, 1, proc), (tmp_path / "d.log").read_text()
        lease = read_lease(str(store))
        assert lease and lease["pid"] == proc.pid and lease["run"] == 1
        t0 = time.monotonic()
        rc2 = main(["run", cfg_path, "--scheduler", external_cluster.address, "--no-progress"])
        assert time.monotonic() - t0 < 10
        err = capsys.readouterr().err
        assert rc2 == 2
        line = error_line(err)
        assert "in use by another driver" in line and f"pid {proc.pid}" in line and "--takeover" in line
        rc1 = proc.wait(timeout=90)
    finally:
        rc1 = finish(proc, 30)
    assert rc1 == 0, (tmp_path / "d.log").read_text()
    ds = xr.open_zarr(store, chunks=None)
    recs = json.loads(ds.attrs["runs"])
    assert [r["state"] for r in recs] == ["finished"] and recs[0]["submitted"] == 8
    assert (ds.run.values == 1).all()  # every block computed once, by the first driver
