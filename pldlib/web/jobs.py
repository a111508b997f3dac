"""Exact answers computed in child processes: progress while they run, cancellable at any time.

A job is one process (forked from a fork server) running :func:`pldlib.web.compute.exact_answer`; it sends its
stages and its result (or its error) through a queue.  Cancelling a job terminates its process,
so a long composition stops at once, whatever it is doing.  Finished jobs are kept for
:data:`KEEP_SECONDS` and at most :data:`MAX_JOBS` run at once.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import queue as queue_mod
import threading
import time
import traceback

#: finished jobs are forgotten this long after they end
KEEP_SECONDS = 600.0
#: at most this many jobs run at once (the others wait their turn: ``state == "queued"``)
MAX_JOBS = 2


def _child(form_query, out) -> None:
    from .compute import exact_answer

    try:
        res = exact_answer(form_query, progress=lambda stage: out.put(("stage", stage)))
        out.put(("done", res))
    except Exception as e:  # noqa: BLE001  (reported to the page, in one line)
        out.put(("error", f"{type(e).__name__}: {e}", traceback.format_exc(limit=4)))


class Job:
    """One exact computation: ``state`` is queued, running, done, error or cancelled."""

    def __init__(self, job_id: str, query):
        self.id = job_id
        self.query = query
        self.state = "queued"
        self.stages: list[str] = []
        self.result = None
        self.error = None
        self.started = self.ended = None
        self.created = time.time()
        self._proc = None
        self._out = None

    def as_dict(self) -> dict:
        now = time.time()
        return {"id": self.id, "state": self.state, "stages": list(self.stages), "result": self.result,
                "error": self.error, "seconds": ((self.ended or now) - self.started) if self.started else 0.0}


class Jobs:
    """The jobs of one server (thread-safe)."""

    def __init__(self, max_jobs: int = MAX_JOBS):
        self._jobs: dict[str, Job] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        # (a fork server: children fork from a clean single-threaded process that has pldlib
        # imported, not from the web server's threads, whose locks a plain fork could copy held)
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(["pldlib", "pldlib.web.compute"])
        self.max_jobs = max_jobs

    def submit(self, query) -> Job:
        with self._lock:
            job = Job(str(next(self._ids)), query)
            self._jobs[job.id] = job
        self.poll()
        return job

    def get(self, job_id: str) -> Job | None:
        self.poll()
        return self._jobs.get(job_id)

    def cancel(self, job_id: str) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.state in ("queued", "running"):
                if job._proc is not None:
                    job._proc.terminate()
                    job._proc.join(5)
                job.state, job.ended = "cancelled", time.time()
        self.poll()
        return job

    def poll(self) -> None:
        """Read what running jobs sent, start queued ones, forget old finished ones."""
        with self._lock:
            for job in self._jobs.values():
                if job.state != "running":
                    continue
                while True:
                    try:
                        msg = job._out.get_nowait()
                    except (queue_mod.Empty, OSError, ValueError):
                        break
                    if msg[0] == "stage":
                        job.stages.append(msg[1])
                    elif msg[0] == "done":
                        job.result, job.state = msg[1], "done"
                    else:
                        job.error, job.state = msg[1], "error"
                if job.state == "running" and not job._proc.is_alive() and job._out.empty():
                    job.error, job.state = f"the computation ended without an answer (exit {job._proc.exitcode})", \
                        "error"
                if job.state != "running":
                    job.ended = time.time()
                    job._proc.join(1)
            running = sum(j.state == "running" for j in self._jobs.values())
            for job in self._jobs.values():
                if running >= self.max_jobs:
                    break
                if job.state == "queued":
                    job._out = self._ctx.Queue()
                    job._proc = self._ctx.Process(target=_child, args=(job.query, job._out), daemon=True)
                    job._proc.start()
                    job.state, job.started = "running", time.time()
                    running += 1
            now = time.time()
            for jid in [j.id for j in self._jobs.values() if j.ended and now - j.ended > KEEP_SECONDS]:
                del self._jobs[jid]

    def shutdown(self) -> None:
        for jid in list(self._jobs):
            self.cancel(jid)
