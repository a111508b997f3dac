"""Run a sweep on Dask distributed: plan, store, submit, write as results arrive.

``run_sweep(config)`` plans the grid, prepares the store (create, resume or
refuse), submits one task per unfinished block (``client.submit(run_block,
spec, retries=...)``) and writes every result from the client as it arrives
(``as_completed``), one chunk per variable.  A block's own exceptions come
back as data (status 2 + error text); a block whose worker keeps dying ends
as ``KilledWorker`` and is recorded the same way; the sweep goes on.

A store in the sharded layout (large plans; :mod:`sweeps.shards`) is run by tasks of
whole shards sized by a cost model (:mod:`sweeps.cost`, ``task_seconds``): the workers
write their shards themselves and send back only a summary, which the driver counts.

Cluster choice: an explicit ``client``; else ``scheduler`` (an address);
else the Dask config / ``DASK_SCHEDULER_ADDRESS``; else an embedded
``LocalCluster`` (one single-threaded worker process per core; its workers get a
fixed glibc mmap threshold, see :func:`_worker_environ`).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from pldlib import allocator

from .config import SweepConfig, check_store_writable, load_config
from .lease import HEARTBEAT, STALE_AFTER, Lease, check_store
from .plan import BLOCK_DIMS, DIMS, TPR_DIMS, make_plan
from .shards import choose_layout, layout_of, read_block_var
from .preflight import (DEFAULT_WORKER_TIMEOUT, MAX_INFLIGHT, ClusterError, check_size, check_workers,
                        estimate_config, summarize_workers)
from .provenance import code_changes, environment
from .store import (STATUS_DONE, STATUS_OK, BlockWriter, StoreError, block_states, claim_new,
                    claim_restart, now_iso, read_attrs, read_status, update_attrs)

__all__ = ["RunReport", "run_sweep", "make_client", "slurm_cluster", "Progress", "Terminated", "dashboard_link",
           "slurm_job_script"]


@dataclass
class RunReport:
    store: str
    run: int = 0                 # run number written into the store (0: nothing submitted)
    action: str = ""             # created / resumed / restarted
    n_blocks: int = 0
    already_done: int = 0
    submitted: int = 0
    ok: int = 0                  # blocks with every cell ok
    failed: int = 0              # blocks with a failed cell
    lost: int = 0                # futures cancelled / lost with the cluster (left missing)
    wall_seconds: float = 0.0
    submitted_blocks: list = field(default_factory=list)  # block numbers (block layout only)
    tasks: int = 0               # tasks submitted (sharded layout: groups of shards)

    @property
    def complete(self) -> bool:
        return self.already_done + self.ok == self.n_blocks


class Progress:
    """A text progress bar on stderr: redrawn in place on a terminal, a line per 10% otherwise."""

    def __init__(self, total: int, stream=None, enabled: bool = True, width: int = 30):
        self.total, self.done, self.failed = total, 0, 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.width = width
        self.t0 = time.monotonic()
        self._last_decile = -1

    def update(self, failed: bool = False) -> None:
        self.advance(1, int(bool(failed)))

    def advance(self, n: int, failed: int = 0) -> None:
        """``n`` more blocks finished, ``failed`` of them failed (a task of a sharded store)."""
        if n <= 0:
            return
        self.done += n
        self.failed += failed
        if not self.enabled:
            return
        decile = (10 * self.done) // self.total
        if not self.tty and decile == self._last_decile and self.done != self.total:
            return
        self._last_decile = decile
        frac = self.done / self.total
        bar = "#" * int(round(frac * self.width))
        el = time.monotonic() - self.t0
        eta = el / frac - el if frac > 0 else float("nan")
        line = (f"[{bar:<{self.width}}] {self.done}/{self.total} blocks "
                f"({self.failed} failed)  {el:.0f}s elapsed, ~{eta:.0f}s left")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _default_workers() -> int:
    import dask.system

    return max(1, int(dask.system.CPU_COUNT))


#: glibc's mmap threshold for the embedded workers' NumPy temporaries (bytes; the allocator's)
MMAP_THRESHOLD = allocator.MMAP_THRESHOLD


def _worker_environ() -> dict:
    """Dask's pre-spawn environment for the embedded workers, plus a fixed
    ``MALLOC_MMAP_THRESHOLD_`` when Dask sets ``MALLOC_TRIM_THRESHOLD_`` (its default).

    Setting the trim threshold turns off glibc's adaptive mmap threshold, so every
    array over 128 KiB would be mmapped and page-faulted afresh: the PLD compositions
    (many short-lived arrays of 0.1-10 MB) then run ~1.6x slower than in a plain
    process.  Arrays up to :data:`MMAP_THRESHOLD` come from the heap again; the trim
    of freed memory at the top of the heap that Dask asks for is kept.  A value in
    the Dask config or the process environment wins.
    """
    import dask
    import distributed  # noqa: F401  (loads its config defaults)

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", None) or {})
    if env.get("MALLOC_TRIM_THRESHOLD_") is not None and "MALLOC_MMAP_THRESHOLD_" not in env:
        env["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD
    return env


#: the bokeh Dask's dashboard needs (older or no bokeh: its page says only "Dask needs bokeh>=3.1.0")
BOKEH_MIN = "3.1"


def _has_bokeh() -> bool:
    """Whether bokeh >= :data:`BOKEH_MIN` is installed here (what Dask's dashboard needs)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        from packaging.version import Version

        return Version(version("bokeh")) >= Version(BOKEH_MIN)
    except PackageNotFoundError:
        return False
    except Exception:  # an unparsable version: let Dask decide
        import importlib.util

        return importlib.util.find_spec("bokeh") is not None


def dashboard_link(client, cluster=None) -> str | None:
    """The dashboard URL of the cluster behind ``client``, None when it has none (no HTTP
    dashboard service, or a scheduler without bokeh >= :data:`BOKEH_MIN`, whose page shows
    only an error)."""
    try:
        if cluster is not None:  # the embedded cluster's HTTP server serves the dashboard with bokeh only
            return cluster.dashboard_link if _has_bokeh() else None
        services = client.scheduler_info(n_workers=0).get("services", {})
        if "dashboard" not in services:
            return None
        try:
            if not client.run_on_scheduler(_has_bokeh):
                return None
        except Exception:  # the scheduler does not run functions for us: show the link
            pass
        return client.dashboard_link
    except Exception:
        return None


def _dashboard_line(client, cluster, where: str) -> str:
    link = dashboard_link(client, cluster)
    if link:
        return f"dashboard: {link}"
    if cluster is not None:
        return f"dashboard: none (pip install bokeh: the Dask dashboard needs bokeh>={BOKEH_MIN})"
    return (f"dashboard: the scheduler {where.split()[-1]} serves none (a dashboard needs "
            f"bokeh>={BOKEH_MIN} where the scheduler runs)")


def make_client(scheduler: str | None = None, workers: int | None = None, max_needed: int | None = None,
                connect_timeout: float | None = None):
    """Return ``(client, cluster_or_None, description)``; the caller closes what it got.

    ``scheduler`` (an address) or the Dask config ``scheduler-address`` (also
    set by ``DASK_SCHEDULER_ADDRESS``) connect to an existing cluster;
    otherwise an embedded LocalCluster with ``workers`` single-threaded
    worker processes (default: one per core, at most ``max_needed``), its HTTP
    server (the dashboard, when bokeh is installed) on a free loopback port.
    """
    import dask
    from distributed import Client, LocalCluster

    address = scheduler or dask.config.get("scheduler-address", None)
    if address:
        if workers:
            warnings.warn("--workers is ignored with an existing scheduler", stacklevel=2)
        try:
            client = Client(address, timeout=connect_timeout) if connect_timeout else Client(address)
        except (OSError, ValueError) as e:  # includes TimeoutError
            from .config import ConfigError

            raise ConfigError("scheduler", f"cannot connect to {address!r}: {type(e).__name__}: {e}") from None
        return client, None, f"scheduler {address}"
    n = workers or _default_workers()
    if max_needed:
        n = max(1, min(n, max_needed))
    with dask.config.set({"distributed.nanny.pre-spawn-environ": _worker_environ()}):
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                               dashboard_address="127.0.0.1:0",  # loopback, a free port
                               preload=["sweeps.worker_logging"])  # (no heartbeat traceback at close)
    client = cluster.get_client()
    return client, cluster, f"embedded LocalCluster ({n} worker process{'es' if n != 1 else ''})"


def slurm_cluster(jobs: int = 1, **kwargs):
    """A dask-jobqueue ``SLURMCluster`` scaled to ``jobs`` jobs (needs the ``cluster`` extra).

    Keyword arguments go to ``SLURMCluster`` (``queue``, ``account``,
    ``cores``, ``memory``, ``walltime``, ``job_extra_directives`` ...).  Use
    ``run_sweep(config, client=cluster.get_client())``.
    """
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as e:
        raise RuntimeError("dask-jobqueue is not installed: pip install 'pldlib[cluster]'") from e
    opts = {"cores": 4, "processes": 4, "memory": "16GB", "walltime": "02:00:00"}
    opts.update(kwargs)
    cluster = SLURMCluster(**opts)
    cluster.scale(jobs=jobs)
    return cluster


def slurm_job_script(scheduler: str, **kwargs) -> str:
    """The ``sbatch`` script of one dask-jobqueue worker job for ``scheduler`` (needs the ``cluster``
    extra); starts no cluster.  Same keyword arguments and defaults as :func:`slurm_cluster`,
    e.g. ``job_script_prologue=["source /shared/pldlib/.venv/bin/activate"]`` so that the
    workers run the driver's environment (same pldlib, same sweeps; checked before submitting).
    Submit it with ``sbatch``, then ``sweeps run CONFIG --scheduler ADDRESS``."""
    try:
        from dask_jobqueue.slurm import SLURMJob
    except ImportError as e:
        raise RuntimeError("dask-jobqueue is not installed: pip install 'pldlib[cluster]'") from e
    opts = {"cores": 4, "processes": 4, "memory": "16GB", "walltime": "02:00:00", "name": "sweeps-worker",
            "job_name": "sweeps-worker"}
    opts.update(kwargs)
    return SLURMJob(scheduler=scheduler, **opts).job_script()


def _lost_result(block, exc: BaseException | None, what: str) -> dict:
    return {"index": block.number, "eps_lower": None, "eps_upper": None, "failed": None,
            "error": what if exc is None else f"{what}: {type(exc).__name__}: {exc}",
            "seconds": None, "host": "", "finished_at": time.time()}


class Terminated(KeyboardInterrupt):
    """SIGTERM (what SLURM and Kubernetes send) arrived: handled like Ctrl-C."""


@contextmanager
def _sigterm_as_interrupt():
    """In the main thread: SIGTERM raises :class:`Terminated` (a KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_sweep(config: SweepConfig | str | os.PathLike, *, store: str | None = None, client=None,
              scheduler: str | None = None, workers: int | None = None, restart: bool = False,
              retries: int = 2, progress: bool = True, stream=None, on_result=None,
              max_cells: int | None = None, worker_timeout: float = DEFAULT_WORKER_TIMEOUT,
              allow_mismatch: bool = False, takeover: bool = False, lease_interval: float = HEARTBEAT,
              lease_stale_after: float = STALE_AFTER, max_inflight: int | None = None,
              task_seconds: float | None = None) -> RunReport:
    """Run (or resume) a sweep; returns a :class:`RunReport`.

    Raises :class:`sweeps.config.ConfigError` / :class:`sweeps.store.StoreError`
    (also :class:`sweeps.lease.LeaseHeld`: another live driver holds the
    store) / :class:`sweeps.preflight.ClusterError` (no workers within
    ``worker_timeout`` s, workers that cannot import the code or run other
    code) on bad input, before anything is written.  While running, no worker
    for ``worker_timeout`` s and no progress is a ClusterError (exit code 1;
    the run is recorded as ``stalled``).  SIGTERM is handled like Ctrl-C
    (:class:`Terminated`; the run is recorded as ``interrupted``).
    ``on_result(block, result, report)`` is called after each block is
    written (tests use it); in a sharded store (:mod:`sweeps.shards`) after each task, as
    ``on_result(None, summary, report)``.  ``task_seconds``: target duration of one task of a
    sharded store (default: the config's ``task_seconds``, else :data:`sweeps.cost.DEFAULT_TASK_SECONDS`).
    """
    with _sigterm_as_interrupt():
        for attempt in (1, 2):
            try:
                return _run_sweep(config, store=store, client=client, scheduler=scheduler, workers=workers,
                                  restart=restart, retries=retries, progress=progress, stream=stream,
                                  on_result=on_result, max_cells=max_cells, worker_timeout=worker_timeout,
                                  allow_mismatch=allow_mismatch, takeover=takeover, lease_interval=lease_interval,
                                  lease_stale_after=lease_stale_after, max_inflight=max_inflight,
                                  task_seconds=task_seconds)
            except _ClaimedMeanwhile as e:
                # another driver claimed the new store between our look and our claim: look again
                # (its creation marker, or its lease once the store is made, says who has it; a
                # finished store is resumed: nothing to do)
                if attempt == 2:
                    raise StoreError(str(e)) from None


class _ClaimedMeanwhile(Exception):
    """Another driver claimed a new store between this driver's look and its claim."""


def _run_sweep(config, *, store, client, scheduler, workers, restart, retries, progress, stream,
               on_result, max_cells, worker_timeout, allow_mismatch, takeover, lease_interval,
               lease_stale_after, max_inflight, task_seconds=None) -> RunReport:
    stream = stream if stream is not None else sys.stderr
    t_start = time.monotonic()
    cfg = load_config(config) if not isinstance(config, SweepConfig) else config
    cfg = cfg.with_store(store)
    check_size(estimate_config(cfg), max_cells)
    path = cfg.store
    check_store_writable(path)
    plan = make_plan(cfg)
    planned = check_store(path, plan, restart=restart)  # raises before anything is written
    task_seconds = task_seconds or cfg.task_seconds
    layout = (layout_of(read_attrs(path)) if planned == "resume"
              else choose_layout(plan, cfg.layout, task_seconds))
    status = tpr_status = None
    if planned == "resume" and cfg.layout is not None and (cfg.layout == "blocks") == layout.sharded:
        stream.write(f"sweeps: note: {path} keeps its {layout.kind} layout (the config's layout: applies to "
                     "new stores)\n")
    if layout.sharded:  # the block state only, never the cell status (sweeps.shards)
        bstate = (read_block_var(path, "state") if planned == "resume"
                  else np.zeros(tuple(plan.shape[d] for d in BLOCK_DIMS), np.int8))
        states = None
        n_todo = int((bstate != STATUS_OK).sum())
    else:
        status = read_status(path) if planned == "resume" else None  # cell status before this run
        tpr_status = read_status(path, "tpr_status") if status is not None and plan.fprs else None
        states = (block_states(plan, status, tpr_status) if status is not None
                  else np.zeros(len(plan.blocks), np.int8))
        n_todo = int((states != STATUS_OK).sum())
    report = RunReport(store=path, action=planned, n_blocks=len(plan.blocks),
                       already_done=len(plan.blocks) - n_todo)

    def say(msg):
        stream.write(f"sweeps: {msg}\n")
        stream.flush()

    if cfg.mechanism_default:
        say(f"mechanism: {cfg.mechanism} (the default: the config has no mechanism: key)")
    if not n_todo:
        report.action = "resumed"
        say(f"{cfg.name}: all {len(plan.blocks)} blocks of {path} are done")
        report.wall_seconds = time.monotonic() - t_start
        return report
    lease = Lease(path, interval=lease_interval, stale_after=lease_stale_after)
    own_client = client is None
    cluster = None
    claim = None
    claimed: list = []  # claim_new's claim, recorded even if an interrupt lands before it returns
    try:
        if planned == "create":
            # the exclusive step, before the cluster starts: of drivers racing for a new store
            # exactly one claims it (and its lease); the others see the claim and refuse
            claim = claim_new(path, lease, holder=claimed)
            if claim is None:  # another driver claimed it between our look and our claim
                check_store(path, plan, restart=restart)  # raises with what is there now, if it can
                raise _ClaimedMeanwhile(f"{path!r} was claimed by another driver at the same moment; run again")
        else:  # the store exists: take it before connecting (a second driver refuses at once)
            lease.acquire(takeover=takeover, say=say)  # and before any change
        if own_client:  # connect first: a bad --scheduler leaves no trace in the store
            client, cluster, where = make_client(scheduler, workers, max_needed=n_todo)
        else:
            where = f"client {client.scheduler.address}"
        say(_dashboard_line(client, cluster, where))
        driver_env = environment()
        worker_envs = check_workers(client, where, driver_env, timeout=worker_timeout,
                                    allow_mismatch=allow_mismatch, say=say)
        if planned == "restart":
            claim = claim_restart(path, lease)
        report.action = claim.build(plan, layout) if claim is not None else "resumed"
        say(f"{cfg.name}: {len(plan.blocks)} blocks x {plan.cells_per_block} cells, store {path} "
            f"({report.action}); {report.already_done} done, {n_todo} to compute")
        if layout.sharded:
            _run_sharded(client, where, plan, layout, bstate, report, retries=retries, say=say,
                         bar=Progress(n_todo, stream=stream, enabled=progress), on_result=on_result,
                         lease=lease, env={"driver": driver_env, "workers": summarize_workers(worker_envs)},
                         worker_timeout=worker_timeout, max_inflight=max_inflight, task_seconds=task_seconds)
        else:
            todo = (b for b in plan.blocks if states[b.number] != STATUS_OK)  # lazy: one Block at a time
            _submit_and_write(client, where, plan, todo, n_todo, (status, tpr_status), report, retries=retries,
                              say=say, bar=Progress(n_todo, stream=stream, enabled=progress), on_result=on_result,
                              lease=lease, env={"driver": driver_env, "workers": summarize_workers(worker_envs)},
                              worker_timeout=worker_timeout, max_inflight=max_inflight)
    except BaseException as e:
        claim = claim if claim is not None else (claimed[0] if claimed else None)
        if claim is None:
            store_state = "none" if planned == "create" else "kept"
        elif claim.built:
            store_state = "kept"
        else:
            store_state = "half" if claim.action == "restart" else "none"
            claim.abandon()  # stopped before the store was made: remove only what this driver made
        ok = report.ok
        if store_state == "kept" and not layout.sharded:
            # (a signal between a block's write and its count: the store is the record)
            try:
                now = block_states(plan, read_status(path), read_status(path, "tpr_status") if plan.fprs else None)
                ok = max(ok, int(((now == STATUS_OK) & (states != STATUS_OK)).sum()))
            except Exception:  # (the message then counts what this driver counted)
                pass
        try:  # what the command line's one-line message says (interrupted / terminated)
            e.sweeps_progress = {"store": path, "state": store_state, "written": ok + report.failed}
        except AttributeError:
            pass
        raise
    finally:
        lease.release()
        if own_client and client is not None:
            client.close()
            if cluster is not None:
                cluster.close()
    report.wall_seconds = time.monotonic() - t_start
    say(f"run {report.run}: {report.ok} blocks ok, {report.failed} failed"
        + (f", {report.lost} lost (left missing)" if report.lost else "")
        + f", {report.already_done} done before; {report.wall_seconds:.1f} s")
    return report


def _workers(client) -> dict | None:
    """address -> name (``name (address)``) of the cluster's workers; None if it cannot be asked."""
    try:
        try:
            info = client.scheduler_info(n_workers=-1)["workers"]
        except TypeError:  # older distributed: no n_workers argument
            info = client.scheduler_info()["workers"]
    except Exception:
        return None
    out = {}
    for addr, w in info.items():
        name = w.get("name")
        out[addr] = f"{name} ({addr})" if name not in (None, "", addr) else addr
    return out


def _check_lease(lease, path: str, store_id, run: int) -> None:
    """StoreError when the driver's lease on the store was lost (a driver that lost the store must
    not write into it)."""
    if lease.lost:
        raise StoreError(_lost_message(lease.lost, path, store_id, run))


def _lost_message(lost: str, path: str, store_id, run: int) -> str:
    """Why this driver stops, and what of its work is in the store -- read back, not assumed."""
    attrs = read_attrs(path)
    if attrs is None:
        kept = "the store is gone, and with it the blocks this run wrote"
    elif (attrs.get("store_id") or attrs.get("created")) != store_id:
        kept = "the store was made again by someone else: the blocks this run wrote are not in it"
    else:
        try:
            n = int((read_status(path, "run") == run).sum())
            kept = (f"{n} block{'s' if n != 1 else ''} written by this run (run {run}) "
                    f"{'are' if n != 1 else 'is'} in the store")
        except Exception as e:
            kept = f"could not read back what this run wrote ({type(e).__name__})"
    return f"{lost}; this driver stops and writes nothing more; {kept}"


def _inflight_limit(client, max_inflight, cap: int | None = MAX_INFLIGHT):
    """Tasks kept in flight: ``max_inflight`` if given, else 4 per worker thread (at least 16),
    at most ``cap`` (the block layout's one-row tasks; None for the sharded layout, whose tasks
    last tens of seconds: its driver holds one future per task, so 10,000 workers get 40,000)."""
    if max_inflight:
        return int(max_inflight)
    try:
        threads = sum(client.nthreads().values())
    except Exception:
        threads = 1
    n = max(16, 4 * threads)
    return n if cap is None else min(cap, n)


class _WorkerWatch:
    """Once a second (every n/1,000 s with n workers), which workers the cluster has: a note
    when one leaves (Dask runs its unfinished ``what`` again on the others), and
    :class:`ClusterError` (the run recorded as ``stalled``) after ``worker_timeout`` s with no
    worker and no progress."""

    def __init__(self, client, where: str, say, worker_timeout: float, what: str):
        self.client, self.where, self.say, self.timeout, self.what = client, where, say, worker_timeout, what
        self.seen = _workers(client) or {}
        self.next_check = 0.0
        self.none_since = None

    def check(self, last_progress: float, record: dict, pending) -> None:
        now = time.monotonic()
        if now < self.next_check:
            return
        current = _workers(self.client)
        # (the answer lists every worker: at 10,000 workers ask every 10 s, not every second)
        self.next_check = now + max(1.0, len(current or ()) / 1000.0)
        nw = len(current) if current is not None else 0
        if current is not None:
            for addr in sorted(set(self.seen) - set(current)):
                self.say(f"note: worker {self.seen[addr]} left the cluster ({nw} left); "
                         f"Dask runs its unfinished {self.what} again on the others")
            self.seen = current
        if nw:
            self.none_since = None
            return
        self.none_since = self.none_since or now
        if now - self.none_since > self.timeout and now - last_progress > self.timeout:
            record["state"] = "stalled"
            raise ClusterError(f"no workers on {self.where} and no progress for {self.timeout:.0f} s "
                               f"(--worker-timeout); {pending()}", exit_code=1)


def _start_run(attrs: dict, report, lease, env: dict, where: str, n_todo: int, say, **extra) -> tuple[list, dict]:
    """``(runs, record)``: the store's run records (a run still "running" lost its driver: we
    hold the lease, so it is marked abandoned) and this run's new record (``extra`` keys added);
    sets ``report.run`` and the lease's run, and warns when the code differs from the last run's."""
    runs = json.loads(attrs.get("runs", "[]"))
    for r in runs:
        if r.get("state") == "running":
            r["state"] = "abandoned"
    report.run = len(runs) + 1
    lease.set_run(report.run)
    driver = env["driver"]
    record = {"run": report.run, "started": now_iso(), "finished": "", "state": "running",
              "submitted": n_todo, "ok": 0, "failed": 0, "lost": 0, "where": where,
              "pldlib_version": driver["pldlib"], **extra,
              "driver": {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": lease.info.get("pid_start")},
              "provenance": env}
    prev = _previous_env(runs)
    if prev is not None:
        changes = code_changes(prev[1], driver)
        if changes:
            say(f"warning: the code differs from run {prev[0]} of this store: " + "; ".join(changes))
    elif attrs.get("pldlib_version") not in (None, driver["pldlib"]):
        say(f"warning: store was created with pldlib {attrs.get('pldlib_version')}, now {driver['pldlib']}")
    return runs, record


def _previous_env(runs: list) -> tuple[int, dict] | None:
    for r in reversed(runs):
        d = (r.get("provenance") or {}).get("driver")
        if d:
            return r["run"], d
    return None


def _submit_and_write(client, where, plan, todo, n_todo, status, report, *, retries, say, bar, on_result,
                      lease, env, worker_timeout, max_inflight):
    """Submit ``todo`` (an iterator) keeping at most a bounded number of blocks in flight, write
    each result as it arrives, keep the run record in the attrs.  ``status``: the cell status and
    the TPR cells' status (None) before this run (None, None: a new store)."""
    from distributed import CancelledError, as_completed

    status, tpr_status = status

    from .methods import run_block

    path = plan.config.store
    attrs = read_attrs(path)
    runs, record = _start_run(attrs, report, lease, env, where, n_todo, say)
    update_attrs(path, runs=json.dumps(runs + [record]), started=attrs.get("started") or record["started"],
                 provenance=json.dumps(env))
    say(f"run {report.run}: submitting {n_todo} blocks to {where}")
    writer = BlockWriter(path, plan, fresh=report.action in ("created", "restarted"))
    S, D = len(plan.coords["steps"]), len(plan.coords["delta"])
    futures = {}
    limit = _inflight_limit(client, max_inflight)
    ac = as_completed()
    rank = 0

    def fill():
        """Top the blocks in flight up to ``limit``: one ``client.map`` call per refill (one
        message to the scheduler), earlier blocks at higher priority (heaviest first)."""
        nonlocal rank
        new = []
        while len(futures) + len(new) < limit:
            b = next(todo, None)
            if b is None:
                break
            new.append(b)
        if not new:
            return
        salt = os.urandom(4).hex()
        futs = client.map(run_block, [plan.spec(b) for b in new],
                          key=[f"sweeps-block-{b.number}-{salt}" for b in new],
                          pure=False, retries=retries, priority=n_todo - rank)
        rank += len(new)
        for fut, b in zip(futs, new):
            futures[fut] = b
            report.submitted_blocks.append(b.number)
            ac.add(fut)
        report.submitted += len(new)

    last_progress = time.monotonic()
    store_id = attrs.get("store_id") or attrs.get("created")
    watch = _WorkerWatch(client, where, say, worker_timeout, "blocks")

    def check_lease():
        _check_lease(lease, path, store_id, report.run)

    try:
        fill()
        while futures:
            check_lease()  # every round: a driver that lost the store must not write into it
            watch.check(last_progress, record, lambda: (
                f"{len(futures)} blocks in flight, {n_todo - report.ok - report.failed - report.lost} unfinished "
                "(finished blocks are saved; run again to resume)"))
            batch = ac.next_batch(block=False) if not ac.is_empty() else []
            if not batch:
                time.sleep(0.01)
                continue
            ready = []
            got = {}
            finished = [f for f in batch if f.status == "finished"]
            if len(finished) > 1:  # fetch the batch's results in one round trip
                try:
                    got = dict(zip(finished, client.gather(finished)))
                except Exception:  # e.g. a result lost with its worker meanwhile: one by one below
                    got = {}
            for fut in batch:
                b = futures[fut]
                if fut.status in ("pending", "lost"):
                    # its result died with a worker before we fetched it: Dask recomputes it
                    ac.add(fut)
                    continue
                futures.pop(fut)
                last_progress = time.monotonic()
                try:
                    result = got[fut] if fut in got else fut.result()
                except CancelledError:  # cancelled or lost with the cluster: leave it missing
                    report.lost += 1
                    bar.update(failed=True)
                    continue
                except Exception as exc:
                    if type(exc).__name__ == "KilledWorker":
                        what = "the worker process died every time this block ran"
                    else:
                        what = f"transient error persisted after {retries} retries"
                    result = _lost_result(b, exc, what)
                finally:
                    fut.release()
                if result.get("eps_upper") is None:
                    result.update(eps_lower=np.full((S, D), np.nan), eps_upper=np.full((S, D), np.nan),
                                  failed=np.ones((S, D), bool))
                keep = keep_tpr = None
                if status is not None:  # cells that were ok before this run stay ok
                    reg = plan.region(b)
                    keep = (status[tuple(reg[d] for d in DIMS)] == STATUS_OK).reshape(S, D)
                    if tpr_status is not None:  # dims TPR_DIMS: fpr (spanned in full) in place of delta
                        tkey = tuple(slice(None) if d == "fpr" else reg[d] for d in TPR_DIMS)
                        keep_tpr = (tpr_status[tkey] == STATUS_OK).reshape(S, -1)
                ready.append((b, result, report.run, keep, keep_tpr))
            fill()  # keep the workers busy while this batch is written
            check_lease()
            # every result of the batch in one concurrent write (data chunks, then commit chunks)
            for (b, result, *_), (cells, tcells) in zip(ready, writer.write_many(ready, with_tpr=True)):
                bad = bool((~np.isin(cells, STATUS_DONE)).any())  # unsupported cells are final answers
                bad |= tcells is not None and bool((~np.isin(tcells, STATUS_DONE)).any())
                report.failed += bad
                report.ok += not bad
                bar.update(failed=bad)
                if on_result is not None:
                    on_result(b, result, report)
        record["state"] = "finished"
    except BaseException:
        if record["state"] == "running":
            record["state"] = "interrupted"
        raise
    finally:
        for fut in futures:
            fut.cancel()
        if not lease.lost:  # a store that is not ours any more: leave its attributes alone
            _record_end(path, record, report)


def _record_end(path, record, report) -> None:
    record.update(finished=now_iso(), ok=report.ok, failed=report.failed, lost=report.lost)
    attrs = read_attrs(path) or {}
    runs = json.loads(attrs.get("runs", "[]"))
    runs = [r for r in runs if r.get("run") != report.run] + [record]
    extra = {}
    if record["state"] == "finished":
        extra["finished"] = record["finished"]
        extra["complete"] = report.already_done + report.ok == report.n_blocks
    update_attrs(path, runs=json.dumps(runs), **extra)


def _run_sharded(client, where, plan, layout, bstate, report, *, retries, say, bar, on_result, lease, env,
                 worker_timeout, max_inflight, task_seconds):
    """The sharded layout (:mod:`sweeps.shards`): group the shards left to do into tasks of about
    ``task_seconds`` (:mod:`sweeps.cost`), submit :func:`sweeps.shards.run_task` per task (the
    workers write their shards), track only the summaries.  A failed task is split into one
    task per shard; a failed one-shard task is run block by block (:func:`sweeps.methods.run_block`)
    and that shard written here.  ``bstate``: the block state before this run (block dims)."""
    from distributed import CancelledError, as_completed

    from . import shards as SH
    from .cost import DEFAULT_TASK_SECONDS, CostModel, group_tasks
    from .methods import run_block

    path = plan.config.store
    attrs = read_attrs(path)
    store_id = attrs.get("store_id") or attrs.get("created")
    SH.check_workers_write(client, path, store_id)  # the workers write the store: can they?
    fresh = report.action in ("created", "restarted")
    n_todo = int((bstate != SH.STATE_DONE).sum())
    runs, record = _start_run(attrs, report, lease, env, where, n_todo, say, layout="sharded")
    model = CostModel.from_json(attrs.get("cost_model"))
    if not fresh:  # refit the cost model to what the store's done blocks took
        try:
            model = SH.refit_model(plan, model, bstate, read_block_var(path, "block_seconds"))
        except Exception as e:  # a model is an estimate: never a reason to stop
            say(f"note: cost model not refitted ({type(e).__name__}: {e})")
    update_attrs(path, runs=json.dumps(runs + [record]), started=attrs.get("started") or record["started"],
                 provenance=json.dumps(env), cost_model=model.to_json())
    grid = SH.ShardGrid(tuple(plan.shape[d] for d in BLOCK_DIMS), layout.shard)
    costs, counts = SH.shard_costs(plan, grid, model, bstate != SH.STATE_DONE)
    live = np.nonzero(counts)[0]
    target = float(task_seconds or DEFAULT_TASK_SECONDS)
    groups = group_tasks(costs[live], target, min_tasks=SH.suggest_min_tasks(client))
    ctx = SH.task_context(plan, layout, store_id, report.run, fresh, lease.info.get("token"))
    # work items: ("task", [shard ids]) or ("block", shard id, position in its box)
    queue = [("task", [int(live[i]) for i in g]) for g in groups]
    queue.reverse()  # pop() from the end: heaviest first
    report.tasks = len(queue)
    report.submitted = n_todo
    est = float(costs[live].sum()) if len(live) else 0.0
    say(f"run {report.run}: {n_todo} blocks in {len(queue)} tasks ({len(live)} shards of up to "
        f"{layout.shard_blocks} blocks; target {target:g} s per task, ~{est:.3g} s of work expected) to {where}")
    arrays = None  # the driver's own view of the store (only for shards it writes itself)
    pending: dict = {}  # shard id -> {"prev", "todo", "results"} of a shard run block by block
    futures = {}
    limit = _inflight_limit(client, max_inflight, cap=None)
    ac = as_completed()
    rank = 0
    n_items = len(queue)

    def fill():
        nonlocal rank
        new = []
        while queue and len(futures) + len(new) < limit:
            new.append(queue.pop())
        if not new:
            return
        salt = os.urandom(4).hex()
        specs, keys = [], []
        for i, it in enumerate(new):
            if it[0] == "task":
                specs.append({"task": rank + i, "shards": it[1], "ctx": ctx})
                keys.append(f"sweeps-task-{rank + i}-{salt}")
            else:
                box = grid.box(it[1])
                idx = tuple(sl.start + p for sl, p in zip(box, it[2]))
                specs.append(SH.block_spec(ctx, idx))
                keys.append(f"sweeps-shardblock-{it[1]}-{'-'.join(map(str, it[2]))}-{salt}")
        for it, spec, key in zip(new, specs, keys):
            fn = SH.run_task if it[0] == "task" else run_block
            fut = client.submit(fn, spec, key=key, pure=False, retries=retries, priority=max(1, n_items - rank))
            futures[fut] = it
            ac.add(fut)
        rank += len(new)

    last_progress = time.monotonic()
    watch = _WorkerWatch(client, where, say, worker_timeout, "tasks")

    def check_lease():
        _check_lease(lease, path, store_id, report.run)

    try:
        fill()
        while futures:
            check_lease()
            watch.check(last_progress, record, lambda: (
                f"{len(futures)} tasks in flight, {n_todo - report.ok - report.failed - report.lost} blocks "
                "unfinished (finished shards are saved; run again to resume)"))
            batch = ac.next_batch(block=False) if not ac.is_empty() else []
            if not batch:
                time.sleep(0.01)
                continue
            for fut in batch:
                it = futures[fut]
                if fut.status in ("pending", "lost"):
                    ac.add(fut)
                    continue
                futures.pop(fut)
                last_progress = time.monotonic()
                exc = None
                try:
                    result = fut.result()
                except CancelledError:
                    result = None
                    n = (int(sum(counts[s] for s in it[1])) if it[0] == "task" else 1)
                    report.lost += n
                    bar.advance(n, n)
                    continue
                except Exception as e:
                    exc = e
                    result = None
                finally:
                    fut.release()
                if it[0] == "task":
                    if exc is None:
                        report.ok += result["ok"]
                        report.failed += result["failed"]
                        bar.advance(result["ok"] + result["failed"], result["failed"])
                        if on_result is not None:
                            on_result(None, result, report)
                    elif len(it[1]) > 1:  # one of its blocks kills workers (or keeps failing): split it
                        queue.extend(("task", [s]) for s in reversed(it[1]))
                    else:  # a one-shard task: run its blocks one by one, write the shard here
                        sid = it[1][0]
                        check_lease()
                        if arrays is None:
                            arrays = SH._Arrays(path)
                        prev, todo = SH.shard_todo(arrays, ctx, sid)
                        say(f"note: a task of {len(todo)} blocks failed ({type(exc).__name__}); "
                            "running them one by one")
                        if not todo:
                            continue
                        pending[sid] = {"prev": prev, "todo": len(todo), "results": {}}
                        queue.extend(("block", sid, p) for p in reversed(todo))
                else:
                    sid, pos = it[1], it[2]
                    if exc is not None:
                        if type(exc).__name__ == "KilledWorker":
                            what = "the worker process died every time this block ran"
                        else:
                            what = f"transient error persisted after {retries} retries"
                        result = {"eps_lower": None, "eps_upper": None, "failed": None, "seconds": None,
                                  "error": f"{what}: {type(exc).__name__}: {exc}", "host": "",
                                  "finished_at": time.time()}
                    ps = pending[sid]
                    ps["results"][pos] = result
                    if len(ps["results"]) == ps["todo"]:
                        check_lease()
                        got = SH.write_shard(arrays, ctx, grid.box(sid), ps["results"], ps["prev"])
                        del pending[sid]
                        report.ok += got["ok"]
                        report.failed += got["failed"]
                        bar.advance(got["ok"] + got["failed"], got["failed"])
                        if on_result is not None:
                            on_result(None, dict(got, shards=1, task=None), report)
            fill()
        record["state"] = "finished"
    except BaseException:
        if record["state"] == "running":
            record["state"] = "interrupted"
        raise
    finally:
        for fut in futures:
            fut.cancel()
        if not lease.lost:
            _record_end(path, record, report)
