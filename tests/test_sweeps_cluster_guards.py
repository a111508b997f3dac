"""Guards of cluster-grade sweeps that need no external cluster: size refusal (time and memory),
the store lease, provenance, remote stores (a real S3-compatible server), one-line errors,
the SLURM job script, the dashboard line, abandoned runs in `sweeps status`."""
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from conftest import ROOT, checkout_env
from pldlib.methods import register_method
from sweeps.cli import main
from sweeps.config import parse_config
from sweeps.execute import run_sweep
from sweeps.lease import LEASE_NAME, Lease, LeaseHeld, lease_state, read_lease
from sweeps.plan import make_plan
from sweeps.preflight import check_size, estimate_config, estimate_data
from sweeps.provenance import _tree_hash, code_changes, code_hash, environment
from sweeps.lease import prepare_store
from sweeps.store import StoreError, block_states
from sweeps.testing import CodedAccountant, small_config, tree_snapshot, write_config


def quiet():
    return {"progress": False, "stream": io.StringIO()}


def one_error_line(err: str, *words):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sweeps: error: "), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


register_method("guards_fake", CodedAccountant, kind="certified", summary="test: eps = a code of the cell's coordinates")


def fake_only(store, **changes):
    """test_small's grid (4 blocks x 6 cells) with the in-process test method only."""
    d = small_config(store, methods=["guards_fake"], **changes)
    d["options"] = {}
    return d


# -- huge grids ----------------------------------------------------------------------------
BIG = """store: {store}
grid:
  sigma: {{geomspace: [0.5, 4, 1000]}}
  q: {{geomspace: [0.001, 0.5, 1000]}}
  sampling: [poisson]
  steps: [1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000]
  delta: {{linspace: [1.0e-10, 1.0e-5, {ndelta}]}}
"""


_PEAK = """
import atexit, runpy, sys
def _peak():
    with open({out!r}, "w") as f:
        f.write(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")))
atexit.register(_peak)
sys.argv = {argv!r}
runpy.run_module("sweeps", run_name="__main__")
"""


def _run_measured(args, cwd):
    """Run ``python -m sweeps ARGS``; (returncode, stderr, wall seconds, its own peak RSS in MB,
    its CPU seconds: user + system, which other work on the machine -- the other test process of
    ``make test`` -- does not inflate as it does the wall time).

    The peak is the child's VmHWM after exec (read from /proc at exit): the rusage of a
    forked child also counts the parent's pages it shared before exec (the size of this
    pytest process), which is not the driver's memory."""
    import tempfile

    out = Path(tempfile.mkstemp(prefix="peak-")[1])
    code = _PEAK.format(out=str(out), argv=["sweeps", *args[3:]])
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([args[0], "-c", code], cwd=cwd, env=checkout_env(), capture_output=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    kb = float(out.read_text() or "nan")
    out.unlink()
    return proc.returncode, proc.stderr.decode(), wall, kb / 1024, cpu


@pytest.mark.parametrize("ndelta, cells", [(100, "1,000,000,000"), (100_000, "1,000,000,000,000")])
def test_huge_grid_exits_2_fast_and_small(tmp_path, ndelta, cells):
    store = tmp_path / "big.zarr"
    cfg = tmp_path / "big.yaml"
    cfg.write_text(BIG.format(store=store, ndelta=ndelta))
    rc, err, wall, rss_mb, cpu = _run_measured([sys.executable, "-m", "sweeps", "run", str(cfg)], ROOT)
    assert rc == 2, err
    one_error_line(err, f"grid: {cells} cells", "blocks", "store ~", "driver ~", "exceeds --max-cells")
    # fast: under 2 s of CPU (start-up included), and no waiting (wall under 4 s while the other
    # test process competes for the two cores)
    assert cpu < 2.0 and wall < 4.0, (cpu, wall)
    assert rss_mb < 200, rss_mb
    assert not store.exists() and not any(p.name.startswith(".big.zarr") for p in tmp_path.iterdir())


def test_max_cells_is_configurable(tmp_path, embedded_client, capsys):
    d = fake_only(tmp_path / "m.zarr")  # 4 blocks x 6 cells = 24 cells
    path = write_config(tmp_path / "m.yaml", d)
    assert main(["run", path, "--max-cells", "23"]) == 2
    one_error_line(capsys.readouterr().err, "24 cells in 4 blocks of 6", "--max-cells 23")
    assert not (tmp_path / "m.zarr").exists()
    with pytest.raises(Exception, match="exceeds --max-cells 10"):
        run_sweep(parse_config(d), client=embedded_client, max_cells=10, **quiet())
    assert run_sweep(parse_config(d), client=embedded_client, max_cells=24, **quiet()).complete


def test_estimate_counts_generators_without_expanding():
    data = {"grid": {"sigma": {"linspace": [1, 2, 10**12]}, "steps": [1, 2], "delta": [1e-5]},
            "methods": ["pld", "rdp"]}
    est = estimate_data(data)
    assert est.cells == 2 * 10**12 * 2 and est.blocks == 2 * 10**12 and est.cells_per_block == 2
    with pytest.raises(Exception, match="exceeds"):
        check_size(est)
    cfg = parse_config(small_config("x.zarr"))
    est = estimate_config(cfg)
    assert est.cells == make_plan(cfg).n_cells and est.blocks == len(make_plan(cfg).blocks)
    assert estimate_data(small_config("x.zarr")).cells == est.cells


def test_large_plan_is_lazy_and_block_states_match():
    d = small_config("x.zarr", sigma={"geomspace": [0.5, 4, 1000]}, q={"geomspace": [1e-3, 0.5, 1000]},
                     sampling=["poisson"], relation=["add_remove"], steps=[1], delta=[1e-5])
    plan = make_plan(parse_config(d))
    assert len(plan.blocks) == 10**6
    b = plan.blocks[123_457]
    assert b.number == 123_457 and plan.coords["sigma"][b.index[0]] == b.params["sigma"]
    assert plan.blocks[0].params["sigma"] == min(plan.coords["sigma"])  # heaviest first
    status = np.zeros(tuple(plan.shape.values()), np.int8)
    reg = plan.region(b)
    status[tuple(reg[k] for k in plan.shape)] = 1
    st = block_states(plan, status)
    assert st[123_457] == 1 and int(st.sum()) == 1


# -- the lease ----------------------------------------------------------------------------
def test_lease_live_stale_and_takeover(tmp_path):
    store = tmp_path / "s.zarr"
    store.mkdir()
    live = {"token": "x", "host": socket.gethostname(), "pid": os.getpid(), "run": 3,
            "started": "then", "heartbeat": time.time()}
    (store / LEASE_NAME).write_text(json.dumps(live))
    assert lease_state(live) == "live"
    with pytest.raises(LeaseHeld, match=f"pid {os.getpid()} \\(run 3"):
        Lease(str(store)).acquire()
    said = []
    lease = Lease(str(store), interval=0.05)
    lease.acquire(takeover=True, say=said.append)
    assert "taking over" in said[0] and read_lease(str(store))["token"] == lease.info["token"]
    # the heartbeat moves
    hb = read_lease(str(store))["heartbeat"]
    time.sleep(0.3)
    assert read_lease(str(store))["heartbeat"] > hb
    # another driver takes it over: the first one notices at its next beat
    other = Lease(str(store))
    other.acquire(takeover=True)
    deadline = time.monotonic() + 5
    while lease.lost is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "taken over" in lease.lost
    lease.release()
    assert read_lease(str(store))["token"] == other.info["token"]  # not removed by the loser
    other.release()
    assert read_lease(str(store)) is None
    # stale: an old heartbeat, or a dead pid on this host
    old = dict(live, heartbeat=time.time() - 3600, host="elsewhere")
    assert lease_state(old).startswith("stale: last heartbeat")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert lease_state(dict(live, pid=dead.pid)).startswith("stale: driver pid")


def test_takeover_never_lost_to_a_beat_in_flight(tmp_path):
    """A takeover that lands while the owner's heartbeat is between reading the lease (its own) and
    writing it again: the new owner keeps the lease and the old one notices.  Without the lock over
    the heartbeat's read-compare-write the beat overwrote the new lease (seen as a sweep that went on
    writing after its store was taken over).  The race is made likely by a heartbeat that pauses
    after its read, every millisecond."""
    import sweeps.lease as L

    store = tmp_path / "t.zarr"
    store.mkdir()
    real_read = L.read_lease

    def slow_read(path):  # (the beat thread reads, then pauses: the window a takeover can fall into)
        cur = real_read(path)
        if threading.current_thread().name == "sweeps-lease":
            time.sleep(0.002)
        return cur

    L.read_lease = slow_read
    try:
        for _ in range(40):
            old = Lease(str(store), interval=0.001)
            old.acquire()
            time.sleep(0.01)
            new = Lease(str(store), interval=10)
            new.acquire(takeover=True)
            deadline = time.monotonic() + 5
            while old.lost is None and time.monotonic() < deadline:
                time.sleep(0.001)
            assert old.lost and "taken over" in old.lost
            old.release()
            assert real_read(str(store))["token"] == new.info["token"]  # never overwritten by the old beat
            new.release()
            assert real_read(str(store)) is None
    finally:
        L.read_lease = real_read


def test_stale_lease_is_taken_over_by_a_run(tmp_path, embedded_client):
    d = fake_only(tmp_path / "s.zarr")
    cfg = parse_config(d)
    prepare_store(cfg.store, make_plan(cfg))
    (Path(cfg.store) / LEASE_NAME).write_text(json.dumps(
        {"token": "old", "host": "gone-host", "pid": 1, "run": 1, "started": "x",
         "heartbeat": time.time() - 1000}))
    out = io.StringIO()
    rep = run_sweep(cfg, client=embedded_client, progress=False, stream=out)
    assert rep.complete and "taking over the lease of gone-host pid 1" in out.getvalue()
    assert read_lease(cfg.store) is None


# -- provenance ---------------------------------------------------------------------------
def test_code_hash_walks_subpackages(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub" / "deeper").mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "deeper" / "m.py").write_text("y = 2\n")
    (pkg / "sub" / "notes.txt").write_text("not code")
    h = _tree_hash(pkg)
    (pkg / "sub" / "notes.txt").write_text("changed, still not code")
    assert _tree_hash(pkg) == h
    (pkg / "sub" / "deeper" / "m.py").write_text("y = 3\n")
    assert _tree_hash(pkg) != h
    import pldlib

    assert code_hash("pldlib") == _tree_hash(Path(pldlib.__file__).resolve().parent)


def test_run_records_provenance_and_resume_warns_on_changed_code(tmp_path, embedded_client):
    d = fake_only(tmp_path / "p.zarr")
    d["options"] = {"guards_fake": {"fail": {"sigma": 2.0}}}  # two blocks fail: a second run retries them
    cfg = parse_config(d)
    run_sweep(cfg, client=embedded_client, **quiet())
    ds = xr.open_zarr(cfg.store, chunks=None)
    rec = json.loads(ds.attrs["runs"])[0]
    env = environment()
    drv = rec["provenance"]["driver"]
    for k in ("pldlib", "pldlib_code", "numpy", "scipy", "dask", "distributed", "xarray", "zarr"):
        assert drv[k] == env[k] and drv[k] not in ("", None, "not installed")
    assert drv["git"] is None or (len(drv["git"]["commit"]) == 40 and isinstance(drv["git"]["dirty"], bool))
    assert rec["pldlib_version"] == env["pldlib"] and rec["driver"]["pid"] == os.getpid()
    wk = rec["provenance"]["workers"]
    assert len(wk) == 1 and len(wk[0]["workers"]) == 2 and wk[0]["pldlib_code"] == env["pldlib_code"]
    # pretend run 1 ran other numeric code: the resume says what changed
    runs = json.loads(ds.attrs["runs"])
    runs[0]["provenance"]["driver"].update(pldlib_code="0" * 64, numpy="0.0.1")
    from sweeps.store import update_attrs

    update_attrs(cfg.store, runs=json.dumps(runs))
    out = io.StringIO()
    rep = run_sweep(cfg, client=embedded_client, progress=False, stream=out)
    assert rep.submitted == 2
    warn = [ln for ln in out.getvalue().splitlines() if "warning: the code differs from run 1" in ln]
    assert len(warn) == 1 and "pldlib code hash 000000000000 ->" in warn[0] and "numpy 0.0.1 ->" in warn[0]
    assert code_changes(drv, drv) == []


# -- remote stores --------------------------------------------------------------------------
def test_store_url_without_its_filesystem_package(tmp_path, capsys):
    pytest.importorskip("fsspec")
    import importlib.util

    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here")
    path = write_config(tmp_path / "c.yaml", fake_only("gcs://bucket/sweep.zarr"))
    assert main(["run", path]) == 2
    one_error_line(capsys.readouterr().err, "gcs://bucket/sweep.zarr", "gcsfs")
    assert main(["status", "gcs://bucket/sweep.zarr"]) == 2
    one_error_line(capsys.readouterr().err, "gcsfs")


@pytest.fixture
def s3_server(tmp_path):
    """A moto S3 server on 127.0.0.1 (started and stopped here) and fsspec pointed at it."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    import fsspec

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "moto.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=checkout_env())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    saved = fsspec.config.conf.get("s3")
    fsspec.config.conf["s3"] = {"endpoint_url": url, "key": "testing", "secret": "testing"}
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir("sweeps-bucket")
        yield "s3://sweeps-bucket"
    finally:
        if saved is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = saved
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_s3_store_round_trip(s3_server, tmp_path, embedded_client, capsys):
    url = f"{s3_server}/rt.zarr"
    cfg = parse_config(fake_only(url))
    rep = run_sweep(cfg, client=embedded_client, **quiet())
    assert rep.complete and rep.submitted == 4
    ds = xr.open_zarr(url, chunks=None)
    assert (ds.status.values == 1).all()
    local = parse_config(fake_only(tmp_path / "local.zarr"))
    run_sweep(local, client=embedded_client, **quiet())
    ref = xr.open_zarr(local.store, chunks=None)
    for v in ("eps_lower", "eps_upper", "status"):
        np.testing.assert_array_equal(ds[v].values, ref[v].values)
    assert read_lease(url) is None  # the lease was taken and released on the object store
    assert json.loads(ds.attrs["runs"])[0]["state"] == "finished"
    assert run_sweep(cfg, client=embedded_client, **quiet()).submitted == 0  # resumed: nothing to do
    assert main(["status", url]) == 0
    assert "done 4, failed 0, missing 0" in capsys.readouterr().out


# -- one-line errors --------------------------------------------------------------------------
def test_steps_overflow_is_one_line(tmp_path, capsys):
    d = small_config(tmp_path / "o.zarr", steps=[1.0e30])
    assert main(["run", write_config(tmp_path / "o.yaml", d)]) == 2
    one_error_line(capsys.readouterr().err, "grid.steps[0]", "<=")
    assert not (tmp_path / "o.zarr").exists()


def test_plot_and_report_to_unwritable_out(tmp_path, embedded_client, capsys):
    cfg = parse_config(fake_only(tmp_path / "w.zarr"))
    run_sweep(cfg, client=embedded_client, **quiet())
    afile = tmp_path / "afile"
    afile.write_text("a file, not a directory")
    # unwritable even for root: below a regular file
    assert main(["plot", cfg.store, "--out", str(afile / "x.png")]) == 2
    one_error_line(capsys.readouterr().err, "--out", "x.png")
    assert main(["report", cfg.store, "--out", str(afile / "rep")]) == 2
    one_error_line(capsys.readouterr().err, "--out")
    assert main(["plot", cfg.store, "--out", str(tmp_path)]) == 2  # a directory
    one_error_line(capsys.readouterr().err, "--out", "is a directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # (root may write anywhere: then only the cases above)
            assert main(["plot", cfg.store, "--out", str(locked / "x.png")]) == 2
            one_error_line(capsys.readouterr().err, "--out", "x.png", "permission denied")
    finally:
        locked.chmod(0o700)
    assert not list(tmp_path.glob("**/*.png"))


# -- seeing the cluster, SLURM ------------------------------------------------------------------
def test_embedded_cluster_prints_its_dashboard(tmp_path):
    import importlib.util

    cfg = parse_config(small_config(tmp_path / "e.zarr", sigma=[1.0], relation=["add_remove"], steps=[1]))
    out = io.StringIO()
    rep = run_sweep(cfg, workers=1, progress=False, stream=out)
    assert rep.complete
    line = [ln for ln in out.getvalue().splitlines() if "dashboard:" in ln]
    assert len(line) == 1
    if importlib.util.find_spec("bokeh") is None:
        assert "pip install bokeh" in line[0]
    else:
        assert "http://127.0.0.1:" in line[0]


def test_slurm_job_script():
    pytest.importorskip("dask_jobqueue")
    from sweeps.execute import slurm_job_script

    text = slurm_job_script("tcp://10.0.0.1:8786", queue="normal", account="proj", cores=8, processes=8,
                            memory="32GB", walltime="04:00:00",
                            job_script_prologue=["source /shared/pldlib/.venv/bin/activate"])
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    for want in ("#SBATCH -J sweeps-worker", "#SBATCH -p normal", "#SBATCH -A proj", "#SBATCH --cpus-per-task=8",
                 "#SBATCH -t 04:00:00", "source /shared/pldlib/.venv/bin/activate"):
        assert want in lines, (want, text)
    worker = [ln for ln in lines if "dask_worker" in ln or "dask worker" in ln]
    assert len(worker) == 1
    w = worker[0].split()
    assert "tcp://10.0.0.1:8786" in w and w[w.index("--nthreads") + 1] == "1" and w[w.index("--nworkers") + 1] == "8"
    assert lines.index("source /shared/pldlib/.venv/bin/activate") < lines.index(worker[0])


# -- abandoned runs ----------------------------------------------------------------------------
def test_status_shows_a_dead_drivers_run_as_abandoned(tmp_path, capsys):
    cfg = parse_config(fake_only(tmp_path / "a.zarr"))
    prepare_store(cfg.store, make_plan(cfg))
    from sweeps.store import update_attrs

    rec = {"run": 1, "started": "2026-01-01T00:00:00+00:00", "finished": "", "state": "running",
           "submitted": 4, "ok": 0, "failed": 0, "lost": 0, "where": "x",
           "driver": {"host": "nodeA", "pid": 4242}}
    update_attrs(cfg.store, runs=json.dumps([rec]))
    before = tree_snapshot(cfg.store)
    assert main(["status", cfg.store]) == 0
    out = capsys.readouterr().out
    # nodeA is another host: status cannot see its processes, only that the run holds no lease
    assert "run 1 abandoned (driver nodeA pid 4242 holds no lease on the store)" in out
    assert tree_snapshot(cfg.store) == before  # status only reads
    # while a live driver holds the lease for that run it is shown as running
    (Path(cfg.store) / LEASE_NAME).write_text(json.dumps(
        {"token": "t", "host": socket.gethostname(), "pid": os.getpid(), "run": 1, "started": "x",
         "heartbeat": time.time()}))
    assert main(["status", cfg.store]) == 0
    assert "run 1 running" in capsys.readouterr().out
