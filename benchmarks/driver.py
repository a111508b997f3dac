"""Driver benchmarks of ``sweeps``: is the driver ever the bottleneck?

``python -m benchmarks.driver throughput [--workers 8] [--blocks 4000]``
    Blocks per second the driver plans, submits and writes with *trivial*
    blocks (a test-only method that returns at once, registered on the driver
    and, through ``client.run``, on every worker) on an embedded cluster of
    ``--workers`` single-threaded worker processes.  Also the planning rate
    alone (lazy blocks + task specs) and the driver's CPU seconds per block.

With ``--external`` the scheduler and the workers are ``dask scheduler`` /
    ``dask worker --nworkers N`` subprocesses, so the driver's CPU time per
    block is the driver's own (the embedded cluster's scheduler runs inside
    the driver process).  ``write_only_blocks_per_s``: the store writer alone.

``python -m benchmarks.driver million [--workers 2]``
    An accepted 10^6-cell sweep (1,000 blocks x 1,000 cells) of a cheap real
    method (``rdp``) end to end on an embedded cluster: wall time and the
    driver's peak RSS (the driver process, which also hosts the embedded
    scheduler; the workers are other processes).

``python -m benchmarks.driver rows [--rows 1000000] [--workers 4] [--layout sharded|blocks]``
    ``--rows`` trivial rows (one steps value, one delta each: one cell per block) end to
    end through the real pipeline on an embedded cluster of ``--workers`` worker processes:
    in the sharded layout the workers write their shards and the driver tracks tasks; in
    the block layout the driver writes every block.  Wall time, rows/s, tasks/s, the
    driver's CPU seconds per task and per row (the driver process hosts the embedded
    scheduler too), its peak RSS, and the number of files in the store.  ``--out FILE``
    adds the result to a JSON file (results/driver/rows.json), keyed by layout and rows.

Both print one markdown table row set; the numbers go to results/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import io
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path


def _register_trivial():
    """Register the test-only ``trivial`` method in this process (driver or worker): the sweeps'
    coded test accountant (eps a code of the cell, no accounting work)."""
    from pldlib.methods import register_method
    from sweeps.testing import CodedAccountant

    register_method("trivial", CodedAccountant, kind="certified", summary="benchmark only: no accounting work")
    return True


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _external(workers: int, tmp: Path):
    """``dask scheduler`` + ``dask worker --nworkers N`` subprocesses on 127.0.0.1 (PYTHONPATH: this
    checkout); returns (address, stop)."""
    import json
    import os
    import signal
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent)]
                                                      + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    sf = tmp / "sched.json"
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(sf)], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    deadline = time.monotonic() + 60
    while not sf.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    addr = json.loads(sf.read_text())["address"]
    procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", addr, "--nworkers", str(workers),
                                   "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard", "--memory-limit", "0",
                                   "--local-directory", str(tmp / "scratch")], env=env, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop():
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
    return addr, stop


def write_rate(blocks: int = 2000, batch: int = 16) -> float:
    """Blocks per second BlockWriter.write_many stores alone (fresh local store, batches of ``batch``)."""
    import numpy as np

    from sweeps.config import parse_config
    from sweeps.plan import make_plan
    from sweeps.store import BlockWriter, prepare_store

    tmp = Path(tempfile.mkdtemp(prefix="sweeps-write-"))
    try:
        cfg = parse_config({"store": str(tmp / "w.zarr"), "grid": {"sigma": {"geomspace": [0.5, 4, 40]},
                            "q": {"geomspace": [1e-4, 0.5, max(1, blocks // 40)]}, "sampling": ["poisson"],
                            "steps": [1], "delta": [1e-5]}})
        plan = make_plan(cfg)
        prepare_store(cfg.store, plan)
        w = BlockWriter(cfg.store, plan, fresh=True)
        res = {"eps_lower": np.ones((1, 1)), "eps_upper": np.ones((1, 1)), "failed": np.zeros((1, 1), bool),
               "error": "", "seconds": 0.1, "host": "h:1", "finished_at": time.time()}
        bl = list(plan.blocks)
        t0 = time.perf_counter()
        for i in range(0, len(bl), batch):
            w.write_many([(b, res, 1, None) for b in bl[i:i + batch]])
        return len(bl) / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def throughput(workers: int, blocks: int, external: bool = False) -> dict:
    import dask
    from distributed import Client, LocalCluster

    from sweeps.config import parse_config
    from sweeps.execute import _worker_environ, run_sweep
    from sweeps.plan import make_plan

    _register_trivial()
    n_sigma = 40
    n_q = max(1, blocks // n_sigma)
    tmp = Path(tempfile.mkdtemp(prefix="sweeps-driver-"))
    data = {"name": "driver-bench", "store": str(tmp / "t.zarr"), "methods": ["trivial"],
            "grid": {"sigma": {"geomspace": [0.5, 4, n_sigma]}, "q": {"geomspace": [1e-4, 0.5, n_q]},
                     "sampling": ["poisson"], "steps": [1], "delta": [1e-5]}}
    cfg = parse_config(data)
    t0 = time.perf_counter()
    plan = make_plan(cfg)
    specs = sum(1 for b in plan.blocks if plan.spec(b))
    plan_rate = specs / (time.perf_counter() - t0)
    if external:
        addr, stop = _external(workers, tmp)
        cluster = None
    else:
        with dask.config.set({"distributed.nanny.pre-spawn-environ": _worker_environ()}):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        with (Client(addr) if external else cluster.get_client()) as client:
            client.wait_for_workers(workers, timeout=120)
            client.run(_register_trivial)
            cpu0, t0 = time.process_time(), time.perf_counter()
            rep = run_sweep(cfg, client=client, progress=False, stream=io.StringIO())
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
    finally:
        stop() if external else cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)
    assert rep.complete and rep.ok == len(plan.blocks), rep
    return {"blocks": len(plan.blocks), "workers": workers,
            "scheduler": "external (dask scheduler subprocess)" if external else "embedded (in the driver process)",
            "wall_s": wall, "blocks_per_s": len(plan.blocks) / wall,
            "driver_cpu_ms_per_block": 1000 * cpu / len(plan.blocks), "plan_blocks_per_s": plan_rate,
            "driver_peak_rss_mb": _rss_mb(), "write_only_blocks_per_s": write_rate()}


def million(workers: int) -> dict:
    from sweeps.config import parse_config
    from sweeps.execute import run_sweep

    tmp = Path(tempfile.mkdtemp(prefix="sweeps-million-"))
    data = {"name": "million", "store": str(tmp / "m.zarr"), "methods": ["rdp"],
            "grid": {"sigma": {"geomspace": [0.6, 4, 10]}, "q": {"geomspace": [1e-4, 0.1, 100]},
                     "sampling": ["poisson"], "steps": {"linspace": [100, 10_000, 100]},
                     "delta": {"geomspace": [1e-10, 1e-4, 10]}}}
    cfg = parse_config(data)
    try:
        t0 = time.perf_counter()
        rep = run_sweep(cfg, workers=workers, progress=False, stream=io.StringIO())
        wall = time.perf_counter() - t0
        import xarray as xr

        ds = xr.open_zarr(cfg.store, chunks=None)
        cells = int(ds.status.size)
        ok = int((ds.status.values == 1).sum())
        store_mb = sum(p.stat().st_size for p in Path(cfg.store).rglob("*") if p.is_file()) / 1e6
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"cells": cells, "ok_cells": ok, "blocks": rep.n_blocks, "workers": workers, "wall_s": wall,
            "driver_peak_rss_mb": _rss_mb(), "store_mb": store_mb, "complete": rep.complete}


def rows(n_rows: int, workers: int, layout: str = "sharded", task_seconds: float | None = None,
         keep: str | None = None) -> dict:
    """``n_rows`` trivial one-cell rows end to end (see the module doc)."""
    import os

    import dask
    from distributed import LocalCluster

    from sweeps.config import parse_config
    from sweeps.execute import _worker_environ, run_sweep

    _register_trivial()
    n_sigma = 1000 if n_rows >= 10**6 else 100
    n_q = max(1, n_rows // n_sigma)
    tmp = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="sweeps-rows-"))
    tmp.mkdir(parents=True, exist_ok=True)
    data = {"name": "rows-bench", "store": str(tmp / f"rows-{layout}.zarr"), "methods": ["trivial"],
            "layout": "blocks" if layout == "blocks" else "sharded",
            "grid": {"sigma": {"geomspace": [0.5, 4, n_sigma]}, "q": {"geomspace": [1e-5, 0.5, n_q]},
                     "sampling": ["poisson"], "steps": [1], "delta": [1e-5]}}
    if task_seconds:
        data["task_seconds"] = task_seconds
    cfg = parse_config(data)
    with dask.config.set({"distributed.nanny.pre-spawn-environ": _worker_environ()}):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        with cluster.get_client() as client:
            client.wait_for_workers(workers, timeout=120)
            client.run(_register_trivial)
            cpu0, t0 = time.process_time(), time.perf_counter()
            rep = run_sweep(cfg, client=client, progress=False, stream=io.StringIO(), max_cells=10**9,
                            task_seconds=task_seconds)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            rss = _rss_mb()  # before the check below reads the store
        files = sum(len(f) for _, _, f in os.walk(cfg.store))
        import zarr

        g = zarr.open_group(cfg.store, mode="r")
        # read back from the store: the sharded layout's block state (reading 10^6 one-cell chunks
        # through zarr takes minutes); the block layout: the driver's count (the same reason)
        ok_cells = int((g["state"][...] == 1).sum()) if layout != "blocks" else rep.ok
        store_mb = sum(p.stat().st_size for p in Path(cfg.store).rglob("*") if p.is_file()) / 1e6
    finally:
        cluster.close()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    n = rep.n_blocks
    tasks = rep.tasks if layout != "blocks" else rep.submitted
    return {"layout": layout, "rows": n, "workers": workers, "task_seconds": task_seconds or "default (30)", "cores": os.cpu_count(), "complete": rep.complete,
            "ok_blocks": ok_cells, "tasks": tasks, "wall_s": round(wall, 2), "rows_per_s": round(n / wall, 1),
            "tasks_per_s": round(tasks / wall, 3),
            "driver_cpu_s": round(cpu, 2), "driver_cpu_s_per_task": round(cpu / max(tasks, 1), 4),
            "driver_cpu_us_per_row": round(1e6 * cpu / n, 2), "driver_peak_rss_mb": round(rss, 1),
            "store_files": files, "store_mb": round(store_mb, 1),
            "note": "driver CPU includes the embedded scheduler (same process); 2 cores shared with "
                    "other jobs"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.driver")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--workers", type=int, default=8)
    t.add_argument("--blocks", type=int, default=4000)
    t.add_argument("--external", action="store_true", help="scheduler and workers as subprocesses")
    m = sub.add_parser("million")
    m.add_argument("--workers", type=int, default=2)
    r = sub.add_parser("rows")
    r.add_argument("--rows", type=int, default=10**6)
    r.add_argument("--workers", type=int, default=4)
    r.add_argument("--layout", choices=["sharded", "blocks"], default="sharded")
    r.add_argument("--task-seconds", type=float, default=None)
    r.add_argument("--out", default=None, help="add the result to this JSON file")
    a = p.parse_args(argv)
    if a.cmd == "rows":
        out = rows(a.rows, a.workers, a.layout, a.task_seconds)
        if a.out:
            import json

            f = Path(a.out)
            f.parent.mkdir(parents=True, exist_ok=True)
            got = json.loads(f.read_text()) if f.exists() else {}
            key = f"{a.layout}-{out['rows']}" + (f"-task{a.task_seconds:g}s" if a.task_seconds else "")
            got[key] = out
            f.write_text(json.dumps(got, indent=2) + "\n")
    else:
        out = throughput(a.workers, a.blocks, a.external) if a.cmd == "throughput" else million(a.workers)
    for k, v in out.items():
        print(f"{k:24s} {v:.4g}" if isinstance(v, float) else f"{k:24s} {v}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
