"""The store of a sweep: skeleton, chunk-aligned region writes, status.

A store keeps one xarray Dataset; its format (:class:`StoreFormat`) is chosen by
the path (:func:`format_for`): zarr by default (:class:`ZarrFormat`), others
added with :func:`register_format`.  Layout (zarr format 3, consolidated metadata
for the default format):

* cell variables, dims ``(sigma, q, steps, delta, sampling, relation, method)``:
  ``eps_lower``, ``eps_upper`` (float64, NaN where not computed),
  ``seconds`` (float64: compute time of the cell's block / cells per block),
  ``eps_estimate`` (float64: a method's central *estimate*, never a bound;
  NaN where the method gives none -- e.g. ``clt``, whose bounds are NaN),
  ``status`` (int8: 0 missing, 1 ok, 2 failed, 3 unsupported -- the method
  does not handle this combination, e.g. WOR sampling in dp_accounting);
* with the TPR metric (config ``grid.fpr``), variables with dims ``(sigma, q,
  steps, fpr, sampling, relation, method)``: ``tpr_lower``, ``tpr_upper``
  (float64: the certified interval of the largest true-positive rate of any
  membership test at false-positive rate ``fpr``; NaN where not computed) and
  ``tpr_status`` (int8, same codes as ``status``; 3 = the method has no
  certified trade-off curve, e.g. ``clt`` and the peers).  A block is done when
  its cells and its TPR cells are all ok or unsupported;
* block variables, dims ``(sigma, q, sampling, relation, method)``:
  ``error`` (variable-length UTF-8 text, "" when none), ``run`` (int16, the
  run that wrote the block, 0 = never), ``finished_at`` (float64 unix time),
  ``host`` (text, worker host:pid);
* attrs: ``sweeps_config`` (canonical YAML), ``sweeps_fingerprint``,
  ``pldlib_version``, ``created``, ``started`` (first run), ``finished`` (end
  of the last run that ran to its end), ``complete`` (every block ok),
  ``machine`` (JSON), ``runs`` (JSON list, one record per ``sweeps run``),
  ``status_codes``, ``mechanism`` and ``mechanism_source`` (``config`` or
  the default), ``store_id`` (random, new each time the store is made).

Chunks are 1 along the block dims and full along steps and delta, so one
block = one chunk of every variable.  The skeleton is written once by the
client (``to_zarr(compute=False, mode="w-")`` of dask placeholders, chunks
never written: zarr 3 reads them as the fill value); afterwards only the
client writes, block by block, one whole chunk per variable through zarr
arrays opened once per run -- data variables first, then ``status``/``run``
as the commit marker, so a driver killed between the two leaves the block
"missing", never "ok" with stale numbers.

That is the *block layout*, a new store's layout up to a few thousand blocks.  Larger
plans (or ``layout: sharded`` / ``layout: {shard_blocks: N}`` in the config) get the
*sharded layout* (:mod:`sweeps.shards`), recorded in the attr ``layout`` (JSON; absent: the
block layout):

* the same variables and dims, and the same inner chunks (one block), but every cell
  variable is a zarr format 3 sharded array (sharding codec, uncompressed inner chunks)
  whose shard is a box of many blocks along the block dims (e.g. a run of consecutive q
  values): one file per shard, not per block;
* block variables have one plain chunk per shard box, and two more of them exist:
  ``state`` (int8: 0 missing, 1 done -- every cell ok or unsupported --, 2 failed or
  partial) and ``block_seconds`` (float64, the block's compute time);
* attr ``cost_model`` (JSON, :mod:`sweeps.cost`): the per-row cost model the tasks were
  sized with, refitted from ``block_seconds`` on every resume;
* the *workers* write (one task = whole shards; no two tasks write one file): per shard the
  data variables, then ``status``/``tpr_status``, then ``state`` and ``run`` as the commit,
  every file through a temporary file and ``os.replace``; a resumed run reads only
  ``state`` (never the cell ``status`` array) to find the work left.

Creating a store is exclusive (:func:`claim_new`): the driver makes the store
folder and, as the one exclusive step, its creation marker
``sweeps.creating.json`` (``O_CREAT | O_EXCL``; it names the driver: host,
pid, run id), takes the lease in it, and only then starts the cluster; the
skeleton is built inside the store and moved into place (``zarr.json`` last),
then the marker is removed.  Of drivers racing for one new path exactly one
creates it; the others see the marker (or the lease) and refuse.  A driver
never removes what it did not create; a marker whose driver is gone means a
half-created store (no results in it), which ``--restart`` clears.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
import time
import uuid
import warnings
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .plan import BLOCK_DIMS, DIMS, TPR_DIMS, Block, Plan

__all__ = ["StoreError", "STATUS_MISSING", "STATUS_OK", "STATUS_FAILED", "STATUS_UNSUPPORTED",
           "STATUS_DONE", "STATUS_CODES",
           "CELL_VARS", "BLOCK_VARS", "TPR_VARS", "read_attrs", "store_exists", "create_skeleton",
           "read_status", "CREATING_NAME", "read_creating", "Claim", "claim_new",
           "claim_restart", "block_states", "BlockWriter", "update_attrs",
           "open_dataset", "now_iso"]

STATUS_MISSING, STATUS_OK, STATUS_FAILED, STATUS_UNSUPPORTED = 0, 1, 2, 3
#: final states: a resumed run never recomputes these
STATUS_DONE = (STATUS_OK, STATUS_UNSUPPORTED)
STATUS_CODES = ("0 = missing (not computed yet), 1 = ok, 2 = failed (see the block's error), "
                "3 = unsupported (the method does not handle this combination; see the block's error)")
CELL_VARS = ("eps_lower", "eps_upper", "eps_estimate", "seconds", "status")
BLOCK_VARS = ("error", "run", "finished_at", "host")
#: block variables of the sharded layout only (:mod:`sweeps.shards`)
SHARD_BLOCK_VARS = ("state", "block_seconds")
#: variables of the TPR metric (dims :data:`sweeps.plan.TPR_DIMS`; only with ``grid.fpr``)
TPR_VARS = ("tpr_lower", "tpr_upper", "tpr_status")


def _vars(plan: Plan) -> tuple:
    """The variables of ``plan``'s store: the TPR ones only with ``grid.fpr``."""
    return CELL_VARS + BLOCK_VARS + (TPR_VARS if plan.fprs else ())


def _dims(var: str) -> tuple:
    return TPR_DIMS if var in TPR_VARS else DIMS if var in CELL_VARS else BLOCK_DIMS
STORE_FORMAT = 2  # 2: eps_estimate and status 3 (unsupported)
STR = np.dtypes.StringDType()


class StoreError(Exception):
    """A store that cannot be used as asked (message names the store and the problem)."""

    def __init__(self, problem: str):
        super().__init__(f"store: {problem}")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def machine_info() -> dict:
    import dask.system

    return {"host": socket.gethostname(), "platform": platform.platform(),
            "python": sys.version.split()[0], "cores": int(dask.system.CPU_COUNT)}


@contextmanager
def _quiet():
    # zarr warns that consolidated metadata is not in the v3 spec on every write
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
        # the driver's lease file (sweeps.lease) lives in the store while a run holds it
        warnings.filterwarnings("ignore", message=".*sweeps.lease.json.*")
        warnings.filterwarnings("ignore", message=".*sweeps.creating.json.*")
        yield


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _fs(path: str):
    """``(filesystem, path)``; a URL whose filesystem package is missing (``s3://`` without
    s3fs) or that fsspec cannot open is a one-line :class:`StoreError`."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(path)
    except ImportError as e:
        missing = getattr(e, "name", None)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise StoreError(f"cannot open {path!r}: {msg}"
                         + (f" (missing package {missing!r})" if missing and missing not in msg else "")) from None
    except (ValueError, KeyError) as e:
        raise StoreError(f"cannot open {path!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def _zarr_location(path: str) -> str:
    """What zarr opens for ``path``: a ``file://`` URL as its local path.  zarr opens such a URL
    through fsspec's local filesystem, which does not create a chunk's directories, so region
    writes of the block layout failed there (object stores have no directories to create)."""
    return path[len("file://"):] if isinstance(path, str) and path.startswith("file://") else path


def store_exists(path: str) -> bool:
    fs, p = _fs(path)
    return fs.exists(p)


def read_attrs(path: str) -> dict | None:
    """The store's attrs, or None when ``path`` holds no store of its format."""
    return format_for(path).read_attrs(path)


def open_dataset(path: str):
    """The sweep as an xarray Dataset (NumPy-backed)."""
    if not _is_local(path):
        _fs(path)  # a URL whose filesystem package is missing: say which
    fmt = format_for(path)
    if fmt.read_attrs(path) is None:
        raise StoreError(f"{path!r} is not a {fmt.name} store (nothing there, or not readable)")
    with _quiet():
        return fmt.open_dataset(path)


def _template(plan: Plan, attrs: dict, sharded: bool = False):
    import dask.array as da
    import xarray as xr

    # one dask chunk per variable (the data is never computed: to_zarr(compute=False) writes
    # metadata only), so the template costs the same for 10 blocks and for 10^6; the zarr
    # chunks (one per block) come from the encoding (see create_skeleton)
    shape = tuple(plan.shape[d] for d in DIMS)
    chunks = shape
    bshape = tuple(plan.shape[d] for d in BLOCK_DIMS)
    bchunks = bshape
    coords = {}
    for d in DIMS:
        vals = plan.coords[d]
        if d in ("sampling", "relation", "method"):
            coords[d] = np.array(vals, dtype=STR)
        elif d == "steps":
            coords[d] = np.array(vals, dtype=np.int64)
        else:
            coords[d] = np.array(vals, dtype=np.float64)
    data = {
        "eps_lower": (DIMS, da.full(shape, np.nan, chunks=chunks, dtype=np.float64),
                      {"long_name": "certified lower bound on epsilon(delta)"}),
        "eps_upper": (DIMS, da.full(shape, np.nan, chunks=chunks, dtype=np.float64),
                      {"long_name": "certified upper bound on epsilon(delta)"}),
        "eps_estimate": (DIMS, da.full(shape, np.nan, chunks=chunks, dtype=np.float64),
                         {"long_name": "central estimate of epsilon(delta) -- NOT a bound (NaN if none)"}),
        "seconds": (DIMS, da.full(shape, np.nan, chunks=chunks, dtype=np.float64),
                    {"long_name": "compute time of the cell's block / cells per block",
                     "unit": "s"}),
        "status": (DIMS, da.zeros(shape, chunks=chunks, dtype=np.int8),
                   {"long_name": "cell status", "flag_values": [0, 1, 2, 3],
                    "flag_meanings": "missing ok failed unsupported", "codes": STATUS_CODES}),
        "error": (BLOCK_DIMS, da.full(bshape, "", chunks=bchunks, dtype=STR),
                  {"long_name": "error text of the block ('' if none)"}),
        "run": (BLOCK_DIMS, da.zeros(bshape, chunks=bchunks, dtype=np.int16),
                {"long_name": "number of the sweeps run that wrote the block (0 = never)"}),
        "finished_at": (BLOCK_DIMS, da.full(bshape, np.nan, chunks=bchunks, dtype=np.float64),
                        {"long_name": "when the block's result was written",
                         "unit": "seconds since 1970-01-01 UTC"}),
        "host": (BLOCK_DIMS, da.full(bshape, "", chunks=bchunks, dtype=STR),
                 {"long_name": "worker (host:pid) that computed the block"}),
    }
    if sharded:  # the block state a resumed run reads instead of the cell status (sweeps.shards)
        data["state"] = (BLOCK_DIMS, da.zeros(bshape, chunks=bchunks, dtype=np.int8),
                         {"long_name": "block state", "flag_values": [0, 1, 2],
                          "flag_meanings": "missing done failed",
                          "codes": "0 = missing, 1 = done (every cell ok or unsupported), 2 = failed or partial"})
        data["block_seconds"] = (BLOCK_DIMS, da.full(bshape, np.nan, chunks=bchunks, dtype=np.float64),
                                 {"long_name": "compute time of the block", "unit": "seconds"})
    if plan.fprs:
        coords["fpr"] = np.array(plan.fprs, dtype=np.float64)
        tshape = tuple(plan.shape[d] if d != "fpr" else len(plan.fprs) for d in TPR_DIMS)
        data["tpr_lower"] = (TPR_DIMS, da.full(tshape, np.nan, chunks=tshape, dtype=np.float64),
                             {"long_name": "certified lower bound on the largest true-positive rate of any "
                                           "membership test at false-positive rate fpr"})
        data["tpr_upper"] = (TPR_DIMS, da.full(tshape, np.nan, chunks=tshape, dtype=np.float64),
                             {"long_name": "certified upper bound on the largest true-positive rate of any "
                                           "membership test at false-positive rate fpr"})
        data["tpr_status"] = (TPR_DIMS, da.zeros(tshape, chunks=tshape, dtype=np.int8),
                              {"long_name": "status of the TPR cell", "flag_values": [0, 1, 2, 3],
                               "flag_meanings": "missing ok failed unsupported", "codes": STATUS_CODES})
    ds = xr.Dataset({k: xr.Variable(*v) for k, v in data.items()}, coords=coords)
    if plan.fprs:
        ds.coords["fpr"].attrs["long_name"] = "false-positive rate of the membership test"
    from pldlib.mechanisms import mechanism_spec

    if plan.config.mechanism == "bandmf":
        ds.coords["sigma"].attrs["long_name"] = "noise multiplier of the banded matrix mechanism (unit column norm)"
        ds.coords["q"].attrs["long_name"] = "expected batch fraction"
        ds.coords["steps"].attrs["long_name"] = "training steps of the run"
        ds.coords["sampling"].attrs["long_name"] = "batch selection"
        ds.coords["method"].attrs["long_name"] = "method @ b<bands> (the strategy's bands; 1: DP-SGD)"
    else:
        spec = mechanism_spec(plan.config.mechanism)
        ds.coords["sigma"].attrs["long_name"] = f"{spec.help} (the mechanism's {spec.noise})"
        ds.coords["q"].attrs["long_name"] = "sampling rate"
        ds.coords["steps"].attrs["long_name"] = "number of compositions"
    ds.attrs.update(attrs)
    return ds


def _skeleton(plan: Plan, layout=None):
    """``(dataset, encoding)`` of the empty store of ``plan`` (metadata + coordinates only) in
    ``layout`` (a :class:`sweeps.shards.Layout`, chosen by :func:`sweeps.shards.choose_layout`;
    None: the block layout)."""
    from .cost import CostModel

    cfg = plan.config
    from .provenance import package_version

    attrs = {
        "title": f"sweeps: {cfg.name}",
        "sweeps_format": STORE_FORMAT,
        "sweeps_config": cfg.to_yaml(),
        "sweeps_fingerprint": cfg.fingerprint(),
        "pldlib_version": package_version(),
        "mechanism": cfg.mechanism,
        # the config may leave the mechanism out: then the default was used, and the store says so
        "mechanism_source": "default (the config has no mechanism:)" if cfg.mechanism_default else "config",
        "status_codes": STATUS_CODES,
        "created": now_iso(),
        "store_id": uuid.uuid4().hex,  # which making of the store this is (a driver checks it is still there)
        "started": "",
        "finished": "",
        "complete": False,
        "machine": json.dumps(machine_info()),
        "runs": "[]",
        "n_blocks": len(plan.blocks),
        "cells_per_block": plan.cells_per_block,
    }
    sharded = layout is not None and layout.sharded
    if sharded:
        attrs["layout"] = layout.to_attr()
        attrs["cost_model"] = CostModel().to_json()
    ds = _template(plan, attrs, sharded=sharded)
    zchunks = tuple(plan.chunks[d] for d in DIMS)
    tchunks = tuple(len(plan.fprs) if d == "fpr" else plan.chunks[d] for d in TPR_DIMS)
    encoding = {v: {"chunks": zchunks if v in CELL_VARS else tchunks if v in TPR_VARS else (1,) * len(BLOCK_DIMS)}
                for v in _vars(plan)}
    if sharded:  # inner chunk = one block; a shard = a box of blocks (sweeps.shards)
        box = dict(zip(BLOCK_DIMS, layout.shard))
        for v in _vars(plan) + SHARD_BLOCK_VARS:
            dims = _dims(v) if v not in SHARD_BLOCK_VARS else BLOCK_DIMS
            if v in CELL_VARS or v in TPR_VARS:
                shards = tuple(box.get(d, c) for d, c in zip(dims, encoding[v]["chunks"]))
                encoding[v] = {"chunks": encoding[v]["chunks"], "shards": shards, "compressors": None}
            else:
                encoding[v] = {"chunks": tuple(box[d] for d in BLOCK_DIMS)}
    return ds, encoding


# -- creating a store: exclusive, and recognisable when interrupted -------------------------------
#: the creation marker: present from the moment a driver claims a new store (or starts a restart)
#: until the store is complete; it names the driver (host, pid, run id)
CREATING_NAME = "sweeps.creating.json"
_LEASE_NAME = "sweeps.lease.json"  # sweeps.lease.LEASE_NAME (that module imports this one)
_SWEEPS_FILES = (CREATING_NAME, _LEASE_NAME)
#: name prefix of the folder :func:`sweeps.config.check_store_writable` makes and removes at once
PROBE_PREFIX = ".sweeps-probe-"


def _join(path: str, name: str) -> str:
    return path.rstrip("/") + "/" + name


def _local_path(path: str) -> Path:
    return Path(path.removeprefix("file://")).expanduser()


@contextmanager
def signals_held():
    """Hold SIGINT and SIGTERM back (delivered right after) while a file is created and written:
    an interrupted driver then never leaves an empty marker or lease file behind (a SIGKILL
    still can; :func:`read_creating` and the lease tell such files apart)."""
    import signal

    held = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _create_exclusive(path, data: bytes) -> None:
    """Create ``path`` with ``data``, failing with FileExistsError if it exists (``O_EXCL``)."""
    with signals_held():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def read_creating(path: str) -> dict | None:
    """The creation marker of ``path`` (who is creating it), or None when there is none.

    A marker file that exists but cannot be read as JSON (its driver was killed between
    creating and writing it) gives ``{"unreadable": True, "heartbeat": <its mtime>}``."""
    try:
        if _is_local(path):
            f = _local_path(path) / CREATING_NAME
            text, mtime = f.read_text(), f.stat().st_mtime
        else:
            fs, p = _fs(_join(path, CREATING_NAME))
            text, mtime = fs.cat_file(p).decode(), time.time()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return None
    try:
        info = json.loads(text)
        if isinstance(info, dict):
            return info
    except ValueError:
        pass
    return {"unreadable": True, "heartbeat": mtime,
            "started": datetime.fromtimestamp(mtime, timezone.utc).isoformat(timespec="seconds")}


def process_start(pid: int) -> float | None:
    """Start time (unix seconds) of process ``pid`` on this host; None if there is no such process.
    Raises nothing: a process that cannot be inspected (another user's) gives ``0.0`` (exists)."""
    import psutil

    try:
        return float(psutil.Process(int(pid)).create_time())
    except (psutil.NoSuchProcess, ValueError):
        return None
    except psutil.Error:  # AccessDenied, ZombieProcess: it exists
        return 0.0


def _owner_info(lease, action: str) -> dict:
    if lease is not None:
        info = {k: lease.info.get(k) for k in ("token", "host", "pid", "pid_start", "started", "heartbeat")}
    else:
        info = {"token": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                "pid_start": process_start(os.getpid()), "started": now_iso(), "heartbeat": time.time()}
    info["action"] = action
    return info


class Claim:
    """A driver's exclusive hold on a store it creates (or restarts).

    From :func:`claim_new` / :func:`claim_restart` until :meth:`build` has written the
    whole skeleton, the store holds the marker :data:`CREATING_NAME` naming the driver;
    other drivers refuse the store while that driver lives, and call it half-created
    (``--restart`` clears it) once it is gone.  No block is ever written before the
    marker is removed, so a half-created store holds no results.
    """

    def __init__(self, path: str, info: dict, made_dir: bool, lease=None):
        self.path, self.info, self.made_dir, self.lease = path, info, made_dir, lease
        self.built = False
        self.moved: list[str] = []  # entries of the skeleton already moved into the store

    @property
    def action(self) -> str:
        return self.info["action"]

    def _marker_is_ours(self, or_unreadable: bool = False) -> bool:
        got = read_creating(self.path)
        if got is None:  # gone, or (interrupted while writing it) empty
            return or_unreadable
        return got.get("token") == self.info["token"]

    def _remove_marker(self, or_unreadable: bool = False) -> None:
        if not self._marker_is_ours(or_unreadable):
            return
        if _is_local(self.path):
            (_local_path(self.path) / CREATING_NAME).unlink(missing_ok=True)
        else:
            fs, p = _fs(_join(self.path, CREATING_NAME))
            fs.rm(p)

    def build(self, plan: Plan, layout=None) -> str:
        """Write the skeleton of ``plan`` into the claimed store, then drop the marker;
        returns 'created' or 'restarted'.  Local stores: built in a hidden folder inside the
        store and moved into place, the format's own metadata (zarr: ``zarr.json``) last."""
        ds, encoding = _skeleton(plan, layout)
        fmt = format_for(self.path)
        try:
            if _is_local(self.path):
                root = _local_path(self.path)
                tmp = root / f".sweeps-build-{self.info['token'][:8]}"
                if tmp.exists():
                    shutil.rmtree(tmp)
                with _quiet():
                    fmt.write_skeleton(str(tmp), ds, encoding, append=False)
                names = sorted(os.listdir(tmp), key=lambda n: n in fmt.last)  # what makes it a store last
                for n in names:
                    os.rename(tmp / n, root / n)
                    self.moved.append(n)
                os.rmdir(tmp)
            else:
                self.info["url_written"] = True
                with _quiet():
                    fmt.write_skeleton(self.path, ds, encoding, append=True)
            self._remove_marker()
        except OSError as e:
            raise StoreError(f"cannot create {self.path!r}: {e.strerror or e}") from None
        self.built = True
        return "restarted" if self.action == "restart" else "created"

    def abandon(self) -> None:
        """Undo a claim whose store was never built (the run stopped before): release the
        lease; for a new store remove what this driver put there (build folder, skeleton
        entries already moved, marker) and the store folder if this driver made it.  Removes
        nothing else.  A restart keeps its marker: the old store is (partly) cleared, and the
        marker makes it a recognisable half-created store."""
        if self.built:
            return
        if self.lease is not None:
            self.lease.release()
        if self.action == "restart":
            return
        try:
            if _is_local(self.path):
                root = _local_path(self.path)
                shutil.rmtree(root / f".sweeps-build-{self.info['token'][:8]}", ignore_errors=True)
                for n in reversed(self.moved):  # zarr.json (moved last) goes first
                    q = root / n
                    shutil.rmtree(q) if q.is_dir() and not q.is_symlink() else q.unlink(missing_ok=True)
                # while the marker holds the store no other driver writes a lease into it: a lease
                # file that is ours, or empty (interrupted while writing it), is this driver's
                lease = root / _LEASE_NAME
                try:
                    got = json.loads(lease.read_text())
                except (OSError, ValueError):
                    got = None
                if lease.exists() and (got is None or got.get("token") == self.info["token"]):
                    lease.unlink(missing_ok=True)
            elif self.moved or self.info.get("url_written"):
                return  # an object store's partial skeleton: keep the marker (half-created)
            self._remove_marker(or_unreadable=True)
            if self.made_dir and _is_local(self.path):
                os.rmdir(_local_path(self.path))  # only if empty: never anything another made
        except OSError:
            pass


def claim_new(path: str, lease=None, holder: list | None = None) -> Claim | None:
    """Claim the new store ``path`` for this driver, exclusively; None when another driver
    claimed it first (then :func:`sweeps.lease.check_store` says what is there).

    Local: the store folder is made (``mkdir``; an existing empty folder is used), and the
    exclusive step is the creation of the marker :data:`CREATING_NAME` with ``O_CREAT |
    O_EXCL``: of drivers racing for one path exactly one succeeds.  Then ``lease`` (a
    :class:`sweeps.lease.Lease`) is taken in the fresh store, so the store is never without
    an owner.  Object stores: the marker is written if absent and read back (best effort).
    Errors are one-line :class:`StoreError`.  The claim is appended to ``holder`` (when given)
    with signals held, as soon as it exists: an interrupt that arrives between the marker's
    creation and this function's return still leaves the caller a claim to abandon.
    """
    info = _owner_info(lease, "create")
    data = json.dumps(info).encode()
    made = False
    if _is_local(path):
        root = _local_path(path)
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            try:
                with signals_held():  # the folder and the record that this driver made it
                    os.mkdir(root)
                    made = True
            except FileExistsError:
                if not root.is_dir():
                    raise StoreError(f"{path!r} exists and is not a directory (a zarr store is one)") from None
                if any(n != CREATING_NAME and not n.startswith(PROBE_PREFIX) for n in os.listdir(root)):
                    return None  # something appeared meanwhile: not ours to use
            with signals_held():  # the marker and the record that it is ours, as one step
                try:
                    _create_exclusive(root / CREATING_NAME, data)
                except FileExistsError:
                    return None  # another driver's claim
                claim = Claim(path, info, made, lease)
                if holder is not None:
                    holder.append(claim)
        except BaseException as e:
            if made:
                try:
                    os.rmdir(root)
                except OSError:
                    pass
            if isinstance(e, OSError) and not isinstance(e, StoreError):
                raise StoreError(f"cannot create {path!r}: {e.strerror or e}") from None
            raise
    else:
        fs, p = _fs(path)
        mp = _join(p, CREATING_NAME)
        try:
            if fs.exists(mp) or (fs.exists(p) and fs.ls(p)):
                return None
            fs.pipe_file(mp, data)
            if json.loads(fs.cat_file(mp)).get("token") != info["token"]:
                return None
        except OSError as e:
            raise StoreError(f"cannot create {path!r}: {e.strerror or e}") from None
        claim = Claim(path, info, made, lease)
        if holder is not None:
            holder.append(claim)
    if lease is not None:
        try:
            lease.acquire()
        except BaseException:
            claim.abandon()
            raise
    return claim


def claim_restart(path: str, lease=None) -> Claim:
    """Start over in the sweeps store ``path`` (``--restart``; the caller holds ``lease``):
    the marker is written first, then every entry but the lease and the marker is
    removed.  A driver killed during the restart leaves a half-created store."""
    info = _owner_info(lease, "restart")
    data = json.dumps(info).encode()
    try:
        if _is_local(path):
            root = _local_path(path)
            tmp = root / f".{CREATING_NAME}.{info['token'][:8]}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, root / CREATING_NAME)
            for n in os.listdir(root):
                if n in _SWEEPS_FILES or n.startswith(PROBE_PREFIX):
                    continue
                q = root / n
                if q.is_dir() and not q.is_symlink():
                    shutil.rmtree(q)
                else:
                    q.unlink()
        else:
            fs, p = _fs(path)
            fs.pipe_file(_join(p, CREATING_NAME), data)
            for q in fs.ls(p, detail=False):
                if q.rstrip("/").rsplit("/", 1)[-1] not in _SWEEPS_FILES:
                    fs.rm(q, recursive=True)
    except OSError as e:
        raise StoreError(f"cannot restart {path!r}: {e.strerror or e}") from None
    return Claim(path, info, False, lease)


def create_skeleton(path: str, plan: Plan, layout=None) -> None:
    """Create the store of ``plan`` at ``path`` (no data chunks): :func:`claim_new` +
    :meth:`Claim.build`.  Raises :class:`StoreError` when ``path`` is taken."""
    claim = claim_new(path)
    if claim is None:
        raise StoreError(f"cannot create {path!r}: another driver is creating it, or it is not empty")
    claim.build(plan, layout)


def _check_layout(path: str, plan: Plan) -> None:
    fmt = format_for(path)
    with _quiet():
        shapes = fmt.shapes(path)
    for v in _vars(plan):
        want = tuple(len(plan.fprs) if d == "fpr" else plan.shape[d] for d in _dims(v))
        if shapes.get(v) != want:
            raise StoreError(f"{path!r} is incomplete or has another layout (variable {v!r}); "
                             "use --restart to start over")


def read_status(path: str, var: str = "status") -> np.ndarray:
    """The cell status array, dims in :data:`DIMS` order (``var="tpr_status"``: the TPR
    cells', dims in :data:`sweeps.plan.TPR_DIMS` order; any other variable by its name)."""
    with _quiet():
        return format_for(path).read_var(path, var)


def block_states(plan: Plan, status: np.ndarray, tpr_status: np.ndarray | None = None) -> np.ndarray:
    """Per block (in plan order): 0 missing (no cell written), 1 done (every cell ok or
    unsupported: final answers; with ``tpr_status`` every TPR cell too), 2 failed/partial.
    Vectorised: no Block objects are made."""
    cell_axes = tuple(DIMS.index(d) for d in DIMS if d not in BLOCK_DIMS)
    done = np.isin(status, STATUS_DONE).all(axis=cell_axes)       # dims: DIMS without steps, delta
    if tpr_status is not None and tpr_status.size:
        done &= np.isin(tpr_status, STATUS_DONE).all(axis=cell_axes)  # same block dims, same order
    missing = (status == STATUS_MISSING).all(axis=cell_axes)
    rest = [d for d in DIMS if d in BLOCK_DIMS]
    perm = [rest.index(d) for d in BLOCK_DIMS]
    by_index = np.full(done.shape, STATUS_FAILED, dtype=np.int8)
    by_index[missing] = STATUS_MISSING
    by_index[done] = STATUS_OK
    by_index = by_index.transpose(perm)                            # dims: BLOCK_DIMS
    out = np.empty(len(plan.blocks), dtype=np.int8)
    out[plan.blocks.numbers_by_index().ravel()] = by_index.ravel()
    return out


def update_attrs(path: str, **attrs) -> None:
    """Update the root attrs (client only, serially)."""
    with _quiet():
        format_for(path).update_attrs(path, attrs)


class BlockWriter:
    """Writes block results into the store, one chunk per variable, client side."""

    def __init__(self, path: str, plan: Plan, fresh: bool = False):
        """``fresh``: the store was created by this run, so no chunk has been written yet and
        a data chunk holding only the fill value (NaN estimates, empty error text) need not
        be written at all (a missing chunk reads as the fill value)."""
        self.path = path
        self.plan = plan
        self.fresh = fresh
        self.format = format_for(path)
        with _quiet():
            self.out = self.format.open_writer(path, plan)
        self.chunks = getattr(self.out, "chunks", None)

    def _assert_aligned(self, var: str, region: dict) -> None:
        if self.chunks is None:  # a format without chunks
            return
        for d, sl in region.items():
            c, n = self.chunks[var][d], (len(self.plan.fprs) if d == "fpr" else self.plan.shape[d])
            if sl.start % c != 0 or sl.stop != min(sl.start + c, n):
                raise AssertionError(f"region {d}={sl} of {var!r} is not exactly one chunk (chunk size {c})")

    def write(self, block: Block, result: dict, run: int, keep_ok: np.ndarray | None = None,
              keep_tpr: np.ndarray | None = None) -> np.ndarray:
        """Write one block (see :meth:`write_many`); returns its cell status (steps, delta)."""
        return self.write_many([(block, result, run, keep_ok, keep_tpr)])[0]

    def write_many(self, items, with_tpr: bool = False) -> list:
        """Write several blocks: ``items`` of ``(block, result, run, keep_ok[, keep_tpr])``.

        All data chunks of all the blocks are written concurrently (zarr's async
        API, one event-loop round trip), and only then all their commit chunks
        (``status``, ``tpr_status``, ``run``): a block is never "ok" before its data is there.
        Returns each block's written cell status (``with_tpr``: pairs of it and the
        TPR cells' status, steps x fpr, None without the TPR metric).
        """
        prepared = [self._prepare(*it) for it in items]
        if not prepared:
            return []
        with _quiet():
            self.out.write(prepared, self.fresh)
        if with_tpr:
            return [(p["status"], p.get("tpr_status")) for p in prepared]
        return [p["status"] for p in prepared]

    def _prepare(self, block: Block, result: dict, run: int, keep_ok: np.ndarray | None = None,
                 keep_tpr: np.ndarray | None = None) -> dict:
        """The chunks to write for ``result`` (from :func:`sweeps.methods.run_block`) of ``block``.

        ``keep_ok``: boolean (steps, delta) mask of cells already ok in the
        store; where the new result failed them, the old values are kept
        (a retry never writes a worse result over a good one); ``keep_tpr`` the
        same for the TPR cells (steps, fpr).  Optional result keys:
        ``eps_estimate`` (steps, delta), ``unsupported`` (a boolean mask of
        failed cells that are status 3, not 2: the method cannot take the event, or ``eps_cap`` left them out) and the
        TPR metric's ``tpr_lower``, ``tpr_upper``, ``tpr_failed``,
        ``tpr_unsupported`` (steps, fpr; missing: every TPR cell failed).
        Returns the written cell status (steps, delta).
        """
        plan = self.plan
        S, D = len(plan.coords["steps"]), len(plan.coords["delta"])
        lo = np.asarray(result["eps_lower"], dtype=np.float64).reshape(S, D)
        up = np.asarray(result["eps_upper"], dtype=np.float64).reshape(S, D)
        failed = np.asarray(result["failed"], dtype=bool).reshape(S, D)
        est = result.get("eps_estimate")
        est = np.full((S, D), np.nan) if est is None else np.asarray(est, dtype=np.float64).reshape(S, D)
        unsupported = result.get("unsupported")
        unsupported = (np.zeros((S, D), bool) if unsupported is None
                       else np.asarray(unsupported, dtype=bool).reshape(S, D) & failed)
        est = np.where(failed, np.nan, est)
        secs = np.full((S, D), np.nan)
        if result.get("seconds") is not None:
            secs[:] = float(result["seconds"]) / plan.cells_per_block
        status = np.where(failed, np.where(unsupported, STATUS_UNSUPPORTED, STATUS_FAILED),
                          STATUS_OK).astype(np.int8)
        region = plan.region(block)
        bregion = plan.region(block, BLOCK_DIMS)
        if keep_ok is not None and (keep_ok & failed).any():
            key = tuple(region[d] for d in DIMS)
            with _quiet():
                old = {v: _cells(self.format.read_region(self.path, v, key))
                       for v in ("eps_lower", "eps_upper", "eps_estimate", "seconds")}
            keep = keep_ok & failed
            lo = np.where(keep, old["eps_lower"], lo)
            up = np.where(keep, old["eps_upper"], up)
            est = np.where(keep, old["eps_estimate"], est)
            secs = np.where(keep, old["seconds"], secs)
            status = np.where(keep, STATUS_OK, status).astype(np.int8)

        def cell(a):  # (S, D) -> DIMS-shaped region
            return np.ascontiguousarray(a).reshape(1, 1, S, D, 1, 1, 1)

        def blk(value, dtype):
            return np.full((1,) * len(BLOCK_DIMS), value, dtype=dtype)

        data = {
            "eps_lower": cell(lo), "eps_upper": cell(up), "eps_estimate": cell(est), "seconds": cell(secs),
            "error": blk(result.get("error", ""), STR),
            "finished_at": blk(result.get("finished_at", time.time()), np.float64),
            "host": blk(result.get("host", ""), STR),
        }
        commit = {"status": cell(status), "run": blk(run, np.int16)}
        key = tuple(region[d] for d in DIMS)
        bkey = tuple(bregion[d] for d in BLOCK_DIMS)
        out = {"data": data, "commit": commit, "key": key, "bkey": bkey, "status": status}
        tregion = None
        if plan.fprs:
            tregion = {d: (slice(0, len(plan.fprs)) if d == "fpr" else region[d]) for d in TPR_DIMS}
            tl, tu, tstatus = self._tpr(result, tregion, keep_tpr)
            F = len(plan.fprs)

            def tcell(a):  # (S, F) -> TPR_DIMS-shaped region
                return np.ascontiguousarray(a).reshape(1, 1, S, F, 1, 1, 1)

            data.update(tpr_lower=tcell(tl), tpr_upper=tcell(tu))
            commit["tpr_status"] = tcell(tstatus)
            out.update(tkey=tuple(tregion[d] for d in TPR_DIMS), tpr_status=tstatus)
        for group in (data, commit):
            for v in group:
                self._assert_aligned(v, region if v in CELL_VARS else tregion if v in TPR_VARS else bregion)
        # each assignment writes exactly one whole chunk; data first, then the commit marker
        return out

    def _tpr(self, result: dict, tregion: dict, keep_tpr: np.ndarray | None):
        """``(lower, upper, status)`` of the block's TPR cells (steps, fpr) from ``result``."""
        S, F = len(self.plan.coords["steps"]), len(self.plan.fprs)
        if result.get("tpr_upper") is None:  # a lost block, or a result without the metric
            tl, tu = np.full((S, F), np.nan), np.full((S, F), np.nan)
            tfailed, tunsup = np.ones((S, F), bool), np.zeros((S, F), bool)
        else:
            tl = np.asarray(result["tpr_lower"], dtype=np.float64).reshape(S, F)
            tu = np.asarray(result["tpr_upper"], dtype=np.float64).reshape(S, F)
            tfailed = np.asarray(result["tpr_failed"], dtype=bool).reshape(S, F)
            tunsup = np.asarray(result.get("tpr_unsupported", np.zeros((S, F), bool)), dtype=bool).reshape(S, F)
            tunsup &= tfailed
        tl = np.where(tfailed, np.nan, tl)
        tu = np.where(tfailed, np.nan, tu)
        tstatus = np.where(tfailed, np.where(tunsup, STATUS_UNSUPPORTED, STATUS_FAILED), STATUS_OK).astype(np.int8)
        if keep_tpr is not None and (keep_tpr & tfailed).any():
            with _quiet():
                key = tuple(tregion[d] for d in TPR_DIMS)
                old_l = np.asarray(self.format.read_region(self.path, "tpr_lower", key)).reshape(S, F)
                old_u = np.asarray(self.format.read_region(self.path, "tpr_upper", key)).reshape(S, F)
            keep = keep_tpr & tfailed
            tl, tu = np.where(keep, old_l, tl), np.where(keep, old_u, tu)
            tstatus = np.where(keep, STATUS_OK, tstatus).astype(np.int8)
        return tl, tu, tstatus


def _all_fill(a: np.ndarray) -> bool:
    """Whether ``a`` holds only the fill value of its variable (NaN, or '' for text)."""
    if a.dtype.kind == "f":
        return bool(np.isnan(a).all())
    if a.dtype == STR or a.dtype.kind in "UT":
        return bool((a == "").all())
    return False


def _cells(a: np.ndarray) -> np.ndarray:
    """A DIMS-shaped single-block array -> (steps, delta)."""
    return a.reshape(a.shape[2], a.shape[3])


# -- formats: how a store keeps its arrays and attrs ---------------------------------------------
class StoreFormat:
    """How a sweep store keeps its arrays and attrs.  The claim, creation-marker and lease files
    around them (:class:`Claim`, :mod:`sweeps.lease`) are the same for every format; a format
    is chosen by the store's path (:func:`format_for`) and added with :func:`register_format`.

    Arrays are those of the skeleton Dataset (:func:`_template`): dims and fill values as
    there; a writer writes whole regions, one block at a time, data variables before the
    commit variables (``status``, ``tpr_status``, ``run``) of the same blocks."""

    #: the format's name (messages)
    name = ""
    #: entries of a freshly built skeleton folder moved into place last: they make it a store
    last: tuple = ()

    def matches(self, path: str) -> bool:
        raise NotImplementedError

    def write_skeleton(self, target: str, ds, encoding: dict, append: bool) -> None:
        """Write the empty store ``ds`` (metadata, coordinates, fill values) at ``target``: a
        new local folder (``append`` false) or a URL claimed for it (``append`` true)."""
        raise NotImplementedError

    def read_attrs(self, path: str) -> dict | None:
        raise NotImplementedError

    def update_attrs(self, path: str, attrs: dict) -> None:
        raise NotImplementedError

    def shapes(self, path: str) -> dict:
        """``{variable: shape}`` of what the store holds."""
        raise NotImplementedError

    def read_var(self, path: str, var: str) -> np.ndarray:
        raise NotImplementedError

    def read_region(self, path: str, var: str, key: tuple) -> np.ndarray:
        return self.read_var(path, var)[key]

    def open_dataset(self, path: str):
        raise NotImplementedError

    def open_writer(self, path: str, plan: Plan):
        """An object whose ``write(prepared, fresh)`` writes :meth:`BlockWriter._prepare` results:
        each a dict with ``data`` and ``commit`` ({variable: array}) and the region ``key``
        (cell variables), ``bkey`` (block variables), ``tkey`` (TPR variables)."""
        raise NotImplementedError


def region_key(p: dict, var: str) -> tuple:
    """The region of ``var`` in one prepared block ``p`` (see :meth:`StoreFormat.open_writer`)."""
    return p["key"] if var in CELL_VARS else p["tkey"] if var in TPR_VARS else p["bkey"]


class ZarrFormat(StoreFormat):
    """The default: zarr format 3 (consolidated metadata), one chunk per block."""

    name = "zarr"
    last = ("zarr.json",)  # the group's metadata

    def matches(self, path: str) -> bool:
        return True

    def write_skeleton(self, target, ds, encoding, append):
        ds.to_zarr(target, compute=False, mode="a" if append else "w-", encoding=encoding)

    def _group(self, path: str, mode: str = "r"):
        import zarr

        return zarr.open_group(_zarr_location(path), mode=mode)

    def read_attrs(self, path):
        try:
            with _quiet():
                return dict(self._group(path).attrs)
        except Exception:
            return None

    def update_attrs(self, path, attrs):
        import zarr

        g = self._group(path, "r+")
        g.attrs.update(attrs)
        zarr.consolidate_metadata(path)

    def shapes(self, path):
        g = self._group(path)
        return {k: tuple(a.shape) for k, a in g.arrays()}

    def read_var(self, path, var):
        return np.asarray(self._group(path)[var][...])

    def read_region(self, path, var, key):
        return np.asarray(self._group(path)[var][key])

    def open_dataset(self, path):
        import xarray as xr

        return xr.open_zarr(path, chunks=None)

    def open_writer(self, path, plan):
        return _ZarrWriter(self._group(path, "r+"), plan)


class _ZarrWriter:
    """Region writes through zarr arrays opened once per run: all data chunks of a batch of
    blocks concurrently (zarr's async API, one event-loop round trip), then all their commit
    chunks, so a block is never "ok" before its data is there."""

    def __init__(self, group, plan: Plan):
        self.arrays = {v: group[v] for v in _vars(plan)}  # opened once: each write is one chunk
        self.chunks = {v: dict(zip(_dims(v), a.chunks)) for v, a in self.arrays.items()}

    def write(self, prepared: list, fresh: bool) -> None:
        import asyncio

        from zarr.core.sync import sync

        def coros(group):
            for p in prepared:
                for v, a in p[group].items():
                    if group == "data" and fresh and _all_fill(a):
                        continue  # a missing chunk reads as the fill value
                    yield self.arrays[v].async_array.setitem(region_key(p, v), a)

        async def go():
            await asyncio.gather(*coros("data"))
            await asyncio.gather(*coros("commit"))

        sync(go())


_FORMATS: list[StoreFormat] = [ZarrFormat()]


def register_format(fmt: StoreFormat) -> StoreFormat:
    """Add a store format; it is tried before those registered earlier (zarr, the default,
    matches every path and is tried last)."""
    if not isinstance(fmt, StoreFormat):
        raise TypeError(f"fmt: a StoreFormat, got {fmt!r}")
    _FORMATS.insert(0, fmt)
    return fmt


def format_for(path: str) -> StoreFormat:
    """The format of the store at ``path``: the first registered one that matches it."""
    for fmt in _FORMATS:
        if fmt.matches(path):
            return fmt
    raise StoreError(f"no store format for {path!r}")
