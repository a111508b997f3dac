"""Shared clusters for the sweep tests.

* ``embedded_cluster`` / ``embedded_client``: one in-process ``LocalCluster``
  (2 single-threaded workers, threads, no dashboard) for the session; cheap,
  and test-only methods registered in the test process are visible to it.
* ``make_external_cluster``: a factory of real external clusters, a
  ``dask scheduler`` and ``dask worker`` processes started as subprocesses on
  127.0.0.1, with helpers to start, kill and restart workers; everything it
  started is stopped at the end of the test.  ``external_cluster`` is one
  such cluster (2 workers) shared by a module.

Every subprocess gets ``PYTHONPATH`` pointing at this checkout (derived from
this file's location), so the scheduler, the workers and any driver import
the code under test, not some other installed copy.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def checkout_env(pythonpath_first=(), **extra) -> dict:
    """os.environ with PYTHONPATH = [pythonpath_first..., this checkout] and ``extra`` set."""
    env = dict(os.environ)
    paths = [str(p) for p in pythonpath_first] + [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``timeout`` s (bounded)."""
    if proc.poll() is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers of its group (a nanny's worker)
        except (ProcessLookupError, PermissionError):
            pass
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Worker:
    def __init__(self, proc, name, log, kwargs):
        self.proc, self.name, self.log, self.kwargs = proc, name, log, kwargs


class ExternalCluster:
    """``dask scheduler`` + ``dask worker`` subprocesses on 127.0.0.1."""

    def __init__(self, workdir: Path, n_workers: int = 2, scheduler_env: dict | None = None,
                 worker_env: dict | None = None, start_timeout: float = 60.0):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.worker_env = dict(worker_env or {})
        self.workers: list[Worker] = []
        self._n = 0
        sched_file = self.dir / "scheduler.json"
        self._slog = open(self.dir / "scheduler.log", "w")
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--no-dashboard", "--scheduler-file", str(sched_file)],
            env=checkout_env(**(scheduler_env or {})), stdout=self._slog, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=self.dir)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if self.scheduler.poll() is not None:
                raise RuntimeError(f"dask scheduler exited: {(self.dir / 'scheduler.log').read_text()[-2000:]}")
            if sched_file.exists():
                try:
                    self.address = json.loads(sched_file.read_text())["address"]
                    break
                except (ValueError, KeyError):
                    pass
            time.sleep(0.1)
        else:
            self.close()
            raise RuntimeError("dask scheduler did not start in time")
        for _ in range(n_workers):
            self.start_worker()
        if n_workers:
            self.wait_for_workers(n_workers, start_timeout)

    def start_worker(self, pythonpath_first=(), name: str | None = None, nanny: bool = True, **env) -> Worker:
        """Start one single-threaded ``dask worker`` (``pythonpath_first``: directories put
        before this checkout on its PYTHONPATH, e.g. one with a broken ``pldlib``)."""
        self._n += 1
        name = name or f"w{self._n}"
        log = open(self.dir / f"{name}.log", "w")
        cmd = [sys.executable, "-m", "dask", "worker", self.address, "--nthreads", "1", "--nworkers", "1",
               "--host", "127.0.0.1", "--no-dashboard", "--name", name, "--death-timeout", "30",
               "--memory-limit", "0", "--local-directory", str(self.dir / "dask-scratch")]
        if not nanny:
            cmd.append("--no-nanny")
        proc = subprocess.Popen(cmd, env=checkout_env(pythonpath_first, **{**self.worker_env, **env}),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.dir)
        w = Worker(proc, name, log, {"pythonpath_first": pythonpath_first, "nanny": nanny, **env})
        self.workers.append(w)
        return w

    def kill_worker(self, w: Worker, sig=signal.SIGKILL) -> None:
        """Kill a worker (its nanny and worker process) at once."""
        try:
            os.killpg(w.proc.pid, sig)
        except ProcessLookupError:
            pass
        w.proc.wait(timeout=30)
        w.log.close()
        self.workers.remove(w)

    def restart_worker(self, w: Worker) -> Worker:
        self.kill_worker(w)
        return self.start_worker(name=w.name + "r", **w.kwargs)

    def n_workers(self) -> int:
        from distributed import Client

        with Client(self.address, timeout=10) as c:
            return len(c.scheduler_info(n_workers=-1)["workers"])

    def wait_for_workers(self, n: int, timeout: float = 60.0) -> None:
        from distributed import Client

        with Client(self.address, timeout=10) as c:
            c.wait_for_workers(n, timeout=timeout)

    def client(self):
        from distributed import Client

        return Client(self.address, timeout=20)

    def close(self) -> None:
        for w in list(self.workers):
            _stop(w.proc)
            w.log.close()
        self.workers.clear()
        _stop(self.scheduler)
        self._slog.close()

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.dir.glob("*.log")))


@pytest.fixture
def make_external_cluster(tmp_path_factory):
    """Factory: ``make_external_cluster(n_workers=2, scheduler_env=..., worker_env=...)``."""
    made = []

    def make(**kwargs):
        c = ExternalCluster(tmp_path_factory.mktemp("extcluster"), **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture(scope="module")
def external_cluster(tmp_path_factory):
    """One external cluster (scheduler + 2 workers as subprocesses) per test module."""
    c = ExternalCluster(tmp_path_factory.mktemp("extcluster"), n_workers=2)
    yield c
    c.close()


@pytest.fixture(scope="session")
def embedded_cluster():
    """An in-process LocalCluster (2 single-threaded workers), shared by the session."""
    from distributed import LocalCluster

    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as c:
        yield c


@pytest.fixture(scope="session")
def embedded_client(embedded_cluster):
    with embedded_cluster.get_client() as cl:
        yield cl


#: modules whose tests start real clusters as subprocesses (schedulers, workers, drivers that are
#: killed and restarted): under ``pytest -n`` (make test) they run one after another on one
#: worker, so two of them never compete for the cores and their timeouts keep their margins
_CLUSTER_MODULES = {"test_sweeps_cluster_external", "test_sweeps_kill", "test_sweeps_cluster_guards"}
#: modules whose module-scoped fixtures are dear (real drivers racing, reference stores): each runs
#: on one worker, so that its fixtures are built once, not once per worker
_ONE_WORKER_MODULES = {"test_sweeps_race", "test_sweeps_sharded"}


@pytest.hookimpl(tryfirst=True)  # (before xdist's own hook, which reads the groups into the test ids)
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.module.__name__.rpartition(".")[2]
        if name in _CLUSTER_MODULES:
            item.add_marker(pytest.mark.xdist_group("subprocess_clusters"))
        elif name in _ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(name))
