"""The zarr store of a sweep: skeleton, chunk-aligned region writes, status.

Layout (an xarray Dataset, zarr format 3, consolidated metadata):

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
  ``status_codes``.

Chunks are 1 along the block dims and full along steps and delta, so one
block = one chunk of every variable.  The skeleton is written once by the
client (``to_zarr(compute=False, mode="w-")`` of dask placeholders, chunks
never written: zarr 3 reads them as the fill value); afterwards only the
client writes, block by block, one whole chunk per variable through zarr
arrays opened once per run -- data variables first, then ``status``/``run``
as the commit marker, so a driver killed between the two leaves the block
"missing", never "ok" with stale numbers.
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
           "check_store", "prepare_store", "read_status", "block_states", "BlockWriter", "update_attrs",
           "open_dataset", "now_iso"]

STATUS_MISSING, STATUS_OK, STATUS_FAILED, STATUS_UNSUPPORTED = 0, 1, 2, 3
#: final states: a resumed run never recomputes these
STATUS_DONE = (STATUS_OK, STATUS_UNSUPPORTED)
STATUS_CODES = ("0 = missing (not computed yet), 1 = ok, 2 = failed (see the block's error), "
                "3 = unsupported (the method does not handle this combination; see the block's error)")
CELL_VARS = ("eps_lower", "eps_upper", "eps_estimate", "seconds", "status")
BLOCK_VARS = ("error", "run", "finished_at", "host")
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


def store_exists(path: str) -> bool:
    fs, p = _fs(path)
    return fs.exists(p)


def read_attrs(path: str) -> dict | None:
    """The store's attrs, or None when ``path`` holds no zarr group."""
    import zarr

    try:
        with _quiet():
            g = zarr.open_group(path, mode="r")
        return dict(g.attrs)
    except Exception:
        return None


def open_dataset(path: str):
    """The sweep as an xarray Dataset (NumPy-backed)."""
    import xarray as xr

    if not _is_local(path):
        _fs(path)  # a URL whose filesystem package is missing: say which
    if read_attrs(path) is None:
        raise StoreError(f"{path!r} is not a zarr store (nothing there, or not readable)")
    with _quiet():
        return xr.open_zarr(path, chunks=None)


def _template(plan: Plan, attrs: dict):
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
    ds.coords["sigma"].attrs["long_name"] = (
        "Laplace noise scale b" if plan.config.mechanism == "laplace" else "Gaussian noise multiplier sigma")
    ds.coords["q"].attrs["long_name"] = "sampling rate"
    ds.coords["steps"].attrs["long_name"] = "number of compositions"
    ds.attrs.update(attrs)
    return ds


def create_skeleton(path: str, plan: Plan) -> None:
    """Write metadata + coordinates (no data chunks) with mode 'w-'.

    Local stores are built next to ``path`` and renamed into place, so a
    driver killed while creating leaves no half-made store at ``path``.
    """
    cfg = plan.config
    from .provenance import package_version

    attrs = {
        "title": f"sweeps: {cfg.name}",
        "sweeps_format": STORE_FORMAT,
        "sweeps_config": cfg.to_yaml(),
        "sweeps_fingerprint": cfg.fingerprint(),
        "pldlib_version": package_version(),
        "mechanism": cfg.mechanism,
        "status_codes": STATUS_CODES,
        "created": now_iso(),
        "started": "",
        "finished": "",
        "complete": False,
        "machine": json.dumps(machine_info()),
        "runs": "[]",
        "n_blocks": len(plan.blocks),
        "cells_per_block": plan.cells_per_block,
    }
    ds = _template(plan, attrs)
    zchunks = tuple(plan.chunks[d] for d in DIMS)
    tchunks = tuple(len(plan.fprs) if d == "fpr" else plan.chunks[d] for d in TPR_DIMS)
    encoding = {v: {"chunks": zchunks if v in CELL_VARS else tchunks if v in TPR_VARS else (1,) * len(BLOCK_DIMS)}
                for v in _vars(plan)}
    if _is_local(path):
        final = Path(path.removeprefix("file://"))
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.creating-{uuid.uuid4().hex[:8]}"
        try:
            with _quiet():
                ds.to_zarr(str(tmp), compute=False, mode="w-", encoding=encoding)
            try:
                os.rename(tmp, final)  # fails if final exists (not empty): never clobber
            except OSError as e:
                raise StoreError(f"cannot create {path!r}: {e.strerror or e} (another driver may have "
                                 "created it just now)") from None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    else:
        with _quiet():
            ds.to_zarr(path, compute=False, mode="w-", encoding=encoding)


def check_store(path: str, plan: Plan, restart: bool = False) -> str:
    """What ``prepare_store`` would do with ``path``: 'create', 'resume' or 'restart'.

    Writes nothing.  Raises :class:`StoreError` when ``path`` holds a store
    made from another config and ``restart`` is false, or holds something
    that is not a sweeps store (never deleted, not even with ``restart``).
    """
    fp = plan.config.fingerprint()
    if not store_exists(path):
        return "create"
    attrs = read_attrs(path)
    fs, p = _fs(path)
    if attrs is None or "sweeps_fingerprint" not in attrs:
        if fs.isdir(p) and not fs.ls(p):
            return "create"  # an empty directory: use it
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
    """Make ``path`` ready for ``plan``; returns 'created', 'resumed' or 'restarted'.

    ``action``: the result of :func:`check_store` if already known.
    """
    action = action or check_store(path, plan, restart)
    if action == "resume":
        return "resumed"
    fs, p = _fs(path)
    if fs.exists(p):  # a sweeps store to start over, or an empty directory
        fs.rm(p, recursive=True)
    create_skeleton(path, plan)
    return "restarted" if action == "restart" else "created"


def _check_layout(path: str, plan: Plan) -> None:
    import zarr

    with _quiet():
        g = zarr.open_group(path, mode="r")
    for v in _vars(plan):
        want = tuple(len(plan.fprs) if d == "fpr" else plan.shape[d] for d in _dims(v))
        if v not in g or tuple(g[v].shape) != want:
            raise StoreError(f"{path!r} is incomplete or has another layout (variable {v!r}); "
                             "use --restart to start over")


def read_status(path: str, var: str = "status") -> np.ndarray:
    """The cell status array, dims in :data:`DIMS` order (``var="tpr_status"``: the TPR
    cells', dims in :data:`sweeps.plan.TPR_DIMS` order)."""
    import zarr

    with _quiet():
        g = zarr.open_group(path, mode="r")
    return np.asarray(g[var][...])


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
    """Update the root attrs (client only, serially) and refresh consolidated metadata."""
    import zarr

    with _quiet():
        g = zarr.open_group(path, mode="r+")
        g.attrs.update(attrs)
        zarr.consolidate_metadata(path)


class BlockWriter:
    """Writes block results into the store, one chunk per variable, client side."""

    def __init__(self, path: str, plan: Plan, fresh: bool = False):
        """``fresh``: the store was created by this run, so no chunk has been written yet and
        a data chunk holding only the fill value (NaN estimates, empty error text) need not
        be written at all (zarr reads a missing chunk as the fill value)."""
        import zarr

        self.path = path
        self.plan = plan
        self.fresh = fresh
        with _quiet():
            g = zarr.open_group(path, mode="r+")
        self.chunks = {}
        self.arrays = {}
        for v in _vars(plan):
            self.chunks[v] = dict(zip(_dims(v), g[v].chunks))
            self.arrays[v] = g[v]  # opened once: each write is one chunk, no metadata work

    def _assert_aligned(self, var: str, region: dict) -> None:
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
        import asyncio

        from zarr.core.sync import sync

        def coros(group):
            for p in prepared:
                for v, a in p[group].items():
                    if group == "data" and self.fresh and _all_fill(a):
                        continue
                    key = p["key"] if v in CELL_VARS else p["tkey"] if v in TPR_VARS else p["bkey"]
                    yield self.arrays[v].async_array.setitem(key, a)

        async def go():
            await asyncio.gather(*coros("data"))
            await asyncio.gather(*coros("commit"))

        with _quiet():
            sync(go())
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
        failed cells that are status 3, not 2; see :mod:`sweeps.peers`) and the
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
            import xarray as xr

            with _quiet():
                old = xr.open_zarr(self.path, chunks=None)[["eps_lower", "eps_upper", "eps_estimate", "seconds"]]
                old = old.isel(region).load()
            keep = keep_ok & failed
            lo = np.where(keep, _cells(old["eps_lower"].values), lo)
            up = np.where(keep, _cells(old["eps_upper"].values), up)
            est = np.where(keep, _cells(old["eps_estimate"].values), est)
            secs = np.where(keep, _cells(old["seconds"].values), secs)
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
                g = _open_read(self.path)
                key = tuple(tregion[d] for d in TPR_DIMS)
                old_l = np.asarray(g["tpr_lower"][key]).reshape(S, F)
                old_u = np.asarray(g["tpr_upper"][key]).reshape(S, F)
            keep = keep_tpr & tfailed
            tl, tu = np.where(keep, old_l, tl), np.where(keep, old_u, tu)
            tstatus = np.where(keep, STATUS_OK, tstatus).astype(np.int8)
        return tl, tu, tstatus


def _open_read(path: str):
    import zarr

    return zarr.open_group(path, mode="r")


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
