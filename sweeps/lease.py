"""One driver per store: a lease file inside the store with its owner and a heartbeat.

``<store>/sweeps.lease.json`` holds ``{"token", "host", "pid", "run",
"started", "heartbeat"}``.  The driver takes it before it changes the store
(a restart deletes nothing another live driver holds), rewrites
``heartbeat`` every ``interval`` seconds from a daemon thread, and removes it
when the run ends (finished, interrupted or failed).  A lease is *stale* when
its heartbeat is older than ``stale_after`` seconds, or its owner is a
process on this host that no longer exists; a stale lease is taken over with
a warning, a live one only with ``takeover=True`` (``--takeover``).  A driver
whose lease was taken from it notices at its next heartbeat and stops
(:attr:`Lease.lost`).

Local stores take a fresh lease atomically (``O_CREAT | O_EXCL``) and replace
it atomically (write + rename); on object stores the lease is written and
read back (best effort: object stores have no exclusive create here).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid

from .store import StoreError, _fs, _is_local

__all__ = ["LEASE_NAME", "Lease", "LeaseHeld", "read_lease", "lease_state", "HEARTBEAT", "STALE_AFTER"]

LEASE_NAME = "sweeps.lease.json"
HEARTBEAT = 10.0
STALE_AFTER = 60.0


class LeaseHeld(StoreError):
    """Another live driver holds the store."""


def _lease_path(store: str) -> str:
    return store.rstrip("/") + "/" + LEASE_NAME


def _local(store: str) -> str:
    return _lease_path(store).removeprefix("file://")


def read_lease(store: str) -> dict | None:
    try:
        if _is_local(store):
            with open(_local(store)) as f:
                return json.load(f)
        fs, p = _fs(_lease_path(store))
        return json.loads(fs.cat_file(p))
    except (FileNotFoundError, json.JSONDecodeError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def lease_state(info: dict | None, stale_after: float = STALE_AFTER, now: float | None = None) -> str:
    """'free', 'live' or 'stale' (with the reason after a colon)."""
    if not info:
        return "free"
    now = time.time() if now is None else now
    if info.get("host") == socket.gethostname() and not _pid_alive(int(info.get("pid", -1))):
        return f"stale: driver pid {info.get('pid')} on {info.get('host')} is gone"
    age = now - float(info.get("heartbeat", 0))
    if age > stale_after:
        return f"stale: last heartbeat {age:.0f} s ago (> {stale_after:.0f} s)"
    return "live"


def _owner(info: dict) -> str:
    return f"{info.get('host')} pid {info.get('pid')} (run {info.get('run')}, since {info.get('started')})"


class Lease:
    def __init__(self, store: str, run: int | None = None, interval: float = HEARTBEAT,
                 stale_after: float = STALE_AFTER):
        self.store = store
        self.interval = interval
        self.stale_after = stale_after
        self.info = {"token": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                     "run": run, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "heartbeat": time.time()}
        self.lost: str | None = None
        self.held = False
        self._stop = threading.Event()
        self._thread = None

    # -- writing ---------------------------------------------------------------------
    def _write(self, exclusive: bool = False) -> None:
        self.info["heartbeat"] = time.time()
        data = json.dumps(self.info).encode()
        if _is_local(self.store):
            path = _local(self.store)
            if exclusive:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
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
                continue  # someone took it just now: look again
            if (read_lease(self.store) or {}).get("token") == self.info["token"]:
                self.held = True
                self._start()
                return
        raise LeaseHeld(f"{self.store!r}: another driver took the lease at the same time; try again")

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="sweeps-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                cur = read_lease(self.store)
                if cur is not None and cur.get("token") != self.info["token"]:
                    self.lost = (f"the lease of {self.store!r} was taken over by "
                                 f"{_owner(cur)}")
                    return
                self._write()
            except Exception:  # a transient store error: try again at the next beat
                pass

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
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not self.held or self.lost:
            return
        self.held = False
        try:
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


def mark_abandoned(store: str, summary: dict) -> dict:
    """``sweeps status``: a run record still ``running`` whose driver holds no live lease on the
    store (killed, SIGKILLed, its host gone) is shown as ``abandoned``."""
    cur = read_lease(store)
    live = lease_state(cur) == "live"
    for r in summary.get("runs", []):
        if r.get("state") == "running" and not (live and cur.get("run") == r.get("run")):
            d = r.get("driver") or {}
            r["state"] = "abandoned" + (f" (driver {d.get('host')} pid {d.get('pid')} is gone)" if d else "")
    return summary
