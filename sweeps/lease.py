"""One driver per store: a lease file inside the store with its owner and a heartbeat.

``<store>/sweeps.lease.json`` holds ``{"token", "host", "pid", "pid_start",
"run", "started", "heartbeat", "interval"}`` (``pid_start``: the owner
process's start time, so that a reused pid is not taken for the owner).  The
driver takes it before it changes the store (a restart deletes nothing
another live driver holds; a new store is claimed together with its lease,
see :func:`sweeps.store.claim_new`), rewrites ``heartbeat`` every
``interval`` seconds from its own daemon thread, and removes it when the run
ends (finished, interrupted or failed).

Liveness (:func:`owner_state`) is judged by the process where that can be
seen and by the heartbeat where it cannot: an owner on this host is alive
exactly while its process (pid and start time) exists -- a busy driver whose
heartbeat is late is never called gone; an owner on another host is alive
while its heartbeat is younger than ``stale_after`` seconds (default
:data:`STALE_AFTER`, twelve heartbeat intervals).  A stale lease is taken
over with a warning, a live one only with ``takeover=True`` (``--takeover``).
A driver whose lease was taken from it, or whose lease file vanished, notices
at its next heartbeat and stops (:attr:`Lease.lost`).

Local stores take a fresh lease atomically (``O_CREAT | O_EXCL``) and replace
it atomically (write + rename); on object stores the lease is written and
read back (best effort: object stores have no exclusive create here).
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid

from .plan import Plan
from .store import (PROBE_PREFIX, StoreError, _check_layout, _create_exclusive, _fs, _is_local, claim_restart,
                    create_skeleton, process_start, read_attrs, read_creating, store_exists)

__all__ = ["LEASE_NAME", "Lease", "LeaseHeld", "read_lease", "lease_state", "owner_state", "describe_owner",
           "creator_state", "UNREADABLE_AFTER", "check_store", "prepare_store",
           "process_start", "run_states", "mark_abandoned", "HEARTBEAT", "STALE_AFTER"]

LEASE_NAME = "sweeps.lease.json"
HEARTBEAT = 10.0
#: heartbeat age after which an owner on *another* host counts as gone (owners on this host are
#: judged by their process); generous, so that a driver under load is never called gone
STALE_AFTER = 120.0


class LeaseHeld(StoreError):
    """Another live driver holds the store."""


def _lease_path(store: str) -> str:
    return store.rstrip("/") + "/" + LEASE_NAME


def _local(store: str) -> str:
    return _lease_path(store).removeprefix("file://")


@contextlib.contextmanager
def _exclusive(store: str):
    """Hold an exclusive ``flock`` on a local store's directory while its lease is read, compared and
    written, so that a driver's heartbeat (read: still mine; write) and another driver's takeover
    (write; read back: mine) cannot interleave on this host: without it a beat that read its own
    token just before a takeover wrote the file could overwrite the new owner's lease after that
    owner had read it back.  Stores that are not local directories (object stores, no directory
    yet) are not locked: their heartbeats keep the look-twice rule of ``_beat``."""
    fd = None
    if _is_local(store):
        try:
            import fcntl

            fd = os.open(store.removeprefix("file://"), os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except (OSError, ImportError):
            if fd is not None:
                os.close(fd)
            fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # (closing the descriptor releases the lock)


def read_lease(store: str) -> dict | None:
    try:
        if _is_local(store):
            with open(_local(store)) as f:
                return json.load(f)
        fs, p = _fs(_lease_path(store))
        return json.loads(fs.cat_file(p))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, ValueError):
        return None


def _unreadable_age(store: str) -> float | None:
    """Age in seconds of a local lease file that exists but cannot be read, else None."""
    if not _is_local(store) or read_lease(store) is not None:
        return None
    try:
        return time.time() - os.stat(_local(store)).st_mtime
    except OSError:
        return None


def _pid_alive(pid: int, start: float | None = None) -> bool:
    """Whether process ``pid`` on this host exists (and, given ``start``, is the one that
    started then -- a pid reused by another process is not alive)."""
    got = process_start(pid)
    if got is None:
        return False
    return start is None or got == 0.0 or abs(got - float(start)) < 1.0


def owner_state(info: dict, stale_after: float = STALE_AFTER, now: float | None = None,
                heartbeat: float | None = None) -> str:
    """'live' or 'stale: <reason>' for the owner ``info`` (a lease or a creation marker).

    On this host: the process (pid + start time) decides, the heartbeat does not. On another
    host: the heartbeat (``heartbeat`` if given, else ``info['heartbeat']``) younger than
    ``stale_after`` seconds."""
    now = time.time() if now is None else now
    if info.get("host") == socket.gethostname():
        if not _pid_alive(int(info.get("pid", -1)), info.get("pid_start")):
            return f"stale: driver pid {info.get('pid')} on {info.get('host')} is not running"
        return "live"
    hb = float(info.get("heartbeat", 0) if heartbeat is None else heartbeat)
    age = now - hb
    if age > stale_after:
        return f"stale: last heartbeat {age:.0f} s ago (> {stale_after:.0f} s) from {info.get('host')}"
    return "live"


def lease_state(info: dict | None, stale_after: float = STALE_AFTER, now: float | None = None) -> str:
    """'free', 'live' or 'stale' (with the reason after a colon)."""
    if not info:
        return "free"
    return owner_state(info, stale_after, now)


#: seconds after which a lease or creation-marker file that cannot be read (its driver was killed
#: between creating and writing it; writing takes microseconds) belongs to nobody
UNREADABLE_AFTER = 10.0


def creator_state(store: str, creating: dict, stale_after: float = STALE_AFTER, now: float | None = None) -> str:
    """'live' or 'stale: <reason>' for the driver that wrote the creation marker ``creating`` of
    ``store`` (:func:`sweeps.store.read_creating`): its process on this host, else the heartbeat
    of its lease (same token), else the marker's own time."""
    now = time.time() if now is None else now
    if creating.get("unreadable"):
        age = now - float(creating.get("heartbeat", 0))
        if age > UNREADABLE_AFTER:
            return (f"stale: its creation marker is empty or unreadable since {age:.0f} s (the driver "
                    "was killed while writing it)")
        return "live"
    lease = read_lease(store)
    hb = lease.get("heartbeat") if lease and lease.get("token") == creating.get("token") else None
    return owner_state(creating, stale_after, now, heartbeat=hb)


def describe_owner(info: dict) -> str:
    """``host pid N (run R, run id T, since S)`` of a lease or a creation marker."""
    if info.get("unreadable"):
        return f"an unknown driver (since {info.get('started')})"
    run = info.get("run")
    bits = ([f"run {run}"] if run is not None else []) + ([f"run id {str(info['token'])[:8]}"] if info.get("token")
                                                         else []) + [f"since {info.get('started')}"]
    return f"{info.get('host')} pid {info.get('pid')} ({', '.join(bits)})"


_owner = describe_owner


class Lease:
    def __init__(self, store: str, run: int | None = None, interval: float = HEARTBEAT,
                 stale_after: float = STALE_AFTER):
        self.store = store
        self.interval = interval
        self.stale_after = stale_after
        self.info = {"token": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                     "pid_start": process_start(os.getpid()), "run": run,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "heartbeat": time.time(), "interval": interval}
        self.lost: str | None = None
        self.held = False
        self.beats = 0                      # heartbeats written by the thread (tests read it)
        self.beat_error: str | None = None  # the last error of a heartbeat write, if any
        self._stop = threading.Event()
        self._lock = threading.Lock()       # the heartbeat thread and the main thread both write
        self._thread = None

    # -- writing ---------------------------------------------------------------------
    def _write(self, exclusive: bool = False) -> None:
        with self._lock:
            self.info["heartbeat"] = time.time()
            data = json.dumps(self.info).encode()
            if _is_local(self.store):
                path = _local(self.store)
                if exclusive:
                    _create_exclusive(path, data)
                    return
                tmp = f"{path}.{self.info['token'][:8]}.tmp"
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            else:
                fs, p = _fs(_lease_path(self.store))
                fs.pipe_file(p, data)

    def acquire(self, takeover: bool = False, say=None) -> None:
        """Take the lease or raise :class:`LeaseHeld`; ``say`` gets a warning on a takeover."""
        say = say or (lambda m: None)
        for _ in range(3):  # bounded: another driver may race us between read and write
            with _exclusive(self.store):
                done = self._try_acquire(takeover, say)
            if done:
                self._start()
                return
            time.sleep(0.05)
        raise LeaseHeld(f"{self.store!r}: another driver took the lease at the same time; try again")

    def _try_acquire(self, takeover: bool, say) -> bool:
        """One attempt of :meth:`acquire` (under :func:`_exclusive`): True when the lease is ours."""
        cur = read_lease(self.store)
        state = lease_state(cur, self.stale_after)
        if state == "live" and not takeover:
            raise LeaseHeld(f"{self.store!r} is in use by another driver: {_owner(cur)}, heartbeat "
                            f"{time.time() - float(cur['heartbeat']):.0f} s ago; wait for it, stop it, or "
                            "pass --takeover if it is gone")
        try:
            if cur is None and _is_local(self.store):
                self._write(exclusive=True)
            else:
                if cur is not None:
                    say(f"taking over the lease of {_owner(cur)} ({state}{'; --takeover' if state == 'live' else ''})")
                self._write()
        except FileExistsError:
            # someone took it just now (look again), or a driver was killed between creating
            # and writing the file: an unreadable lease file older than UNREADABLE_AFTER is nobody's
            age = _unreadable_age(self.store)
            if age is not None and age > UNREADABLE_AFTER:
                say(f"replacing the unreadable lease file of {self.store!r} ({age:.0f} s old; a driver "
                    "was killed while writing it)")
                try:
                    self._write()
                except OSError as e:
                    raise StoreError(f"cannot write the lease of {self.store!r}: {e.strerror or e}") from None
            else:
                return False
        except OSError as e:
            raise StoreError(f"cannot write the lease of {self.store!r}: {e.strerror or e}") from None
        if (read_lease(self.store) or {}).get("token") == self.info["token"]:
            self.held = True
            return True
        return False

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="sweeps-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        """The heartbeat thread: blocks only in ``Event.wait`` and short file I/O (both release the
        GIL), so a busy driver loop delays a beat by seconds at most (measured on 2 busy cores,
        one-cell blocks at ~40/s: beats due every 0.5 s came at most 3.6 s apart), far inside
        the staleness window -- and on this host liveness is judged by the process anyway."""
        while not self._stop.wait(self.interval):
            try:
                cur = read_lease(self.store)
                if cur is None and not self._stop.wait(0.2):  # look twice before calling it gone
                    cur = read_lease(self.store)
                if self._stop.is_set():
                    return
                if cur is None:
                    self.lost = (f"the lease file of {self.store!r} disappeared (the store was removed or "
                                 "changed by someone else)")
                    return
                with _exclusive(self.store):  # (read again, compare and write as one step)
                    cur = read_lease(self.store) or cur
                    if cur.get("token") != self.info["token"]:
                        self.lost = f"the lease of {self.store!r} was taken over by {_owner(cur)}"
                        return
                    self._write()
                self.beats += 1
                self.beat_error = None
            except Exception as e:  # a transient store error: try again at the next beat
                self.beat_error = f"{type(e).__name__}: {e}"

    def rewrite(self) -> None:
        """Write the lease again (after a restart deleted the store it lived in)."""
        if self.held:
            self._write()

    def set_run(self, run: int) -> None:
        self.info["run"] = run
        if self.held:
            self._write()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.ident is not None:  # (interrupted while starting it)
            self._thread.join(timeout=5)
        if not self.held or self.lost:
            return
        self.held = False
        try:
            with _exclusive(self.store):  # (a takeover cannot come between the look and the removal)
                if (read_lease(self.store) or {}).get("token") == self.info["token"]:
                    if _is_local(self.store):
                        os.remove(_local(self.store))
                    else:
                        fs, p = _fs(_lease_path(self.store))
                        fs.rm(p)
        except (FileNotFoundError, OSError):
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def run_states(store: str, runs: list, stale_after: float = STALE_AFTER, now: float | None = None) -> list:
    """The runs of ``store`` (its ``runs`` attribute) with the state of each run recorded as
    ``running`` checked against the lease and the driver's process: still ``running`` while
    its driver is alive (see :func:`owner_state`; a late heartbeat is noted, never taken for
    death), else ``abandoned`` with the reason that was observed."""
    now = time.time() if now is None else now
    cur = read_lease(store)
    out = []
    for r in runs:
        r = dict(r)
        out.append(r)
        if r.get("state") != "running":
            continue
        d = r.get("driver") or {}
        who = f"driver {d.get('host')} pid {d.get('pid')}" if d else "its driver"
        if cur and cur.get("run") == r.get("run"):
            st = owner_state(cur, stale_after, now)
            if st == "live":
                age = now - float(cur.get("heartbeat", now))
                interval = float(cur.get("interval", HEARTBEAT))
                if age > 3 * interval:
                    r["state"] = f"running (driver alive; its last heartbeat was {age:.0f} s ago)"
                continue
            r["state"] = f"abandoned ({st.removeprefix('stale: ')})"
            continue
        # no lease for this run: the driver released or lost it, or never took one
        if d and d.get("host") == socket.gethostname() and _pid_alive(int(d.get("pid", -1)), d.get("pid_start")):
            r["state"] = f"running? ({who} is alive but holds no lease on the store)"
        elif d and d.get("host") == socket.gethostname():
            r["state"] = f"abandoned ({who} is not running)"
        else:
            r["state"] = f"abandoned ({who} holds no lease on the store)"
    return out


def mark_abandoned(store: str, summary: dict) -> dict:
    """``sweeps status``: :func:`run_states` applied to ``summary['runs']``."""
    summary["runs"] = run_states(store, summary.get("runs", []))
    return summary


# -- what a driver may do with a store path ------------------------------------------------
def check_store(path: str, plan: Plan, restart: bool = False) -> str:
    """What ``prepare_store`` would do with ``path``: 'create', 'resume' or 'restart'.

    Writes nothing.  Raises :class:`StoreError` when ``path`` holds a store
    made from another config and ``restart`` is false, holds something that
    is not a sweeps store (never deleted, not even with ``restart``), is being
    created by a live driver, or was left half-created by a driver that is
    gone and ``restart`` is false.
    """
    fp = plan.config.fingerprint()
    if not store_exists(path):
        return "create"
    creating = read_creating(path)
    if creating is not None:
        state = creator_state(path, creating)
        what = "restarted" if creating.get("action") == "restart" else "created"
        if state == "live":
            raise StoreError(f"{path!r} is being {what} by another driver, {describe_owner(creating)}, which "
                             f"then runs the sweep; wait for it (sweeps status {path}) or choose another --store")
        if not restart:
            why = state.removeprefix("stale: ")
            raise StoreError(f"{path!r} was left half-created by a driver that is gone ({why}; it was "
                             f"{describe_owner(creating)}); it holds no results: pass --restart to clear it "
                             "and create it again")
        return "restart"
    attrs = read_attrs(path)
    fs, p = _fs(path)
    if attrs is None or "sweeps_fingerprint" not in attrs:
        if fs.isdir(p) and not [q for q in fs.ls(p, detail=False)
                                if not q.rstrip("/").rsplit("/", 1)[-1].startswith(PROBE_PREFIX)]:
            return "create"  # an empty directory (perhaps another driver's writability probe in it): use it
        raise StoreError(f"{path!r} exists and is not a sweeps store; choose another --store "
                         "(it is never overwritten, not even with --restart)")
    if attrs["sweeps_fingerprint"] != fp and not restart:
        raise StoreError(
            f"{path!r} was made from a different config (fingerprint "
            f"{attrs['sweeps_fingerprint'][:12]} != {fp[:12]}); use --restart to start over "
            "or choose another --store")
    if restart:
        return "restart"
    _check_layout(path, plan)
    return "resume"


def prepare_store(path: str, plan: Plan, restart: bool = False, action: str | None = None) -> str:
    """Make ``path`` ready for ``plan`` (without a lease; the driver uses :func:`claim_new` /
    :func:`claim_restart` with its lease); returns 'created', 'resumed' or 'restarted'.

    ``action``: the result of :func:`check_store` if already known.
    """
    from .shards import choose_layout

    action = action or check_store(path, plan, restart)
    if action == "resume":
        return "resumed"
    layout = choose_layout(plan, plan.config.layout, plan.config.task_seconds)
    if action == "restart":
        return claim_restart(path).build(plan, layout)
    create_skeleton(path, plan, layout)
    return "created"
