"""The sharded store layout: many blocks per file, written by the workers themselves.

In the *block* layout (the default for small sweeps) every block is one zarr chunk of every
variable and the driver writes every result.  That costs one file per block and variable
and a driver round trip per block: fine for thousands of blocks, hours and millions of
files for a million.  The *sharded* layout keeps the same variables, dims and inner chunks
(one block = one inner chunk of every cell variable, so one block is still read alone) but
packs a box of neighbouring blocks into one file:

* a **shard** is a box of blocks along the block dims (:class:`Layout`: its size along
  sigma, q, sampling, relation, method; filled from the last block dim backwards, e.g. a
  run of consecutive q values); cell variables (``eps_lower``, ``eps_upper``,
  ``eps_estimate``, ``seconds``, ``status``, the TPR ones) are zarr format 3 sharded
  arrays (sharding codec, inner chunk = one block, uncompressed), so one file per shard;
  block variables (``error``, ``run``, ``finished_at``, ``host`` and the two extra ones of
  this layout, ``state`` and ``block_seconds``) have plain chunks of one shard box each;
* a **task** is one or more whole shards (no two tasks write the same file): the shards are
  grouped by the cost model (:mod:`sweeps.cost`) into tasks of about ``task_seconds``;
* the **worker writes** its shards (:func:`run_task`): it runs :func:`sweeps.methods.run_block`
  per row, then writes the data variables of each shard, then ``status``/``tpr_status``,
  then ``state`` and ``run`` (the commit: a block is done when its ``state`` is 1), and
  returns only a small summary to the driver.  Every file is written to a temporary name and
  moved into place (``os.replace``), so a worker killed mid-write leaves the old file or the
  new one, never a torn one;
* ``state`` (int8, per block: 0 missing, 1 done, 2 failed/partial) is what a resumed run
  reads to find the work left, so it never reads the cell ``status`` array; a worker
  resuming a shard reads that shard's previous contents and keeps the cells that were ok.

The store stays a plain zarr store: ``xarray.open_zarr`` / ``zarr.open`` read it.  The cell
shard files are encoded here directly (:func:`encode_shard`), byte for byte the format
zarr's sharding codec reads (uncompressed inner chunks, index at the end with a crc32c),
because zarr's own encoder spends ~100 us per inner chunk; a store whose arrays have other
codecs is written through zarr instead.

A block whose worker keeps dying (or whose transient error persists) fails its task; the
driver then runs that task's shards one task each, and a shard that still fails block by
block on the workers (:func:`sweeps.methods.run_block`, as in the block layout), and writes
that shard itself from the results (a lost block is recorded as failed with its error).
"""
from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .plan import BLOCK_DIMS, DIMS

__all__ = ["Layout", "BLOCKS", "choose_layout", "layout_of", "ShardGrid", "encode_shard", "decode_shard",
           "SHARD_BLOCK_VARS", "AUTO_MIN_BLOCKS", "task_context", "run_task", "write_shard",
           "read_block_var", "read_cell_var", "check_workers_write", "AtomicLocalStore"]

#: a plan with more blocks than this is sharded unless the config says ``layout: blocks``
AUTO_MIN_BLOCKS = 4096
#: bounds of the automatic number of blocks per shard
MIN_SHARD_BLOCKS, MAX_SHARD_BLOCKS = 16, 1024
#: block variables only the sharded layout has
SHARD_BLOCK_VARS = ("state", "block_seconds")
STATE_MISSING, STATE_DONE, STATE_FAILED = 0, 1, 2
_CELL = ("eps_lower", "eps_upper", "eps_estimate", "seconds", "status")
_TPR = ("tpr_lower", "tpr_upper", "tpr_status")
_BLOCK = ("error", "run", "finished_at", "host") + SHARD_BLOCK_VARS
_OK, _FAILED, _UNSUPPORTED = 1, 2, 3


@dataclass(frozen=True)
class Layout:
    """``kind``: "blocks" (one chunk per block) or "sharded"; ``shard``: the shard's size
    along :data:`sweeps.plan.BLOCK_DIMS` (sharded only)."""

    kind: str = "blocks"
    shard: tuple = ()

    @property
    def sharded(self) -> bool:
        return self.kind == "sharded"

    @property
    def shard_blocks(self) -> int:
        return int(np.prod(self.shard)) if self.shard else 1

    def to_attr(self) -> str:
        d = {"kind": self.kind}
        if self.sharded:
            d.update(shard=dict(zip(BLOCK_DIMS, map(int, self.shard))), shard_blocks=self.shard_blocks,
                     inner_chunk="one block", cell_codecs="uncompressed, sharded (zarr sharding codec)")
        return json.dumps(d)


BLOCKS = Layout("blocks")


def layout_of(attrs: dict | None) -> Layout:
    """The layout a store records in its ``layout`` attr (none: the block layout)."""
    text = (attrs or {}).get("layout")
    if not text:
        return BLOCKS
    d = json.loads(text)
    if d.get("kind") != "sharded":
        return BLOCKS
    return Layout("sharded", tuple(int(d["shard"][k]) for k in BLOCK_DIMS))


def shard_box(sizes: tuple, n_blocks: int) -> tuple:
    """A box of at most ``n_blocks`` blocks along the block dims of ``sizes``, filled from the
    last dim backwards (method, relation, sampling, q, sigma)."""
    box = [1] * len(sizes)
    left = max(1, int(n_blocks))
    for i in reversed(range(len(sizes))):
        box[i] = max(1, min(sizes[i], left))
        left = max(1, left // box[i])
    return tuple(box)


def choose_layout(plan, spec=None, task_seconds: float | None = None, model=None) -> Layout:
    """The layout of a new store for ``plan``: ``spec`` is the config's ``layout`` (None or
    "auto": sharded above :data:`AUTO_MIN_BLOCKS` blocks; "blocks"; "sharded";
    ``{"shard_blocks": N}``).  The automatic shard size: the blocks the cost model expects
    in ``task_seconds``, within [:data:`MIN_SHARD_BLOCKS`, :data:`MAX_SHARD_BLOCKS`]."""
    from .cost import DEFAULT_TASK_SECONDS, CostModel

    sizes = tuple(plan.shape[d] for d in BLOCK_DIMS)
    n = int(np.prod(sizes))
    if spec in (None, "auto"):
        if n <= AUTO_MIN_BLOCKS:
            return BLOCKS
        spec = "sharded"
    if spec == "blocks":
        return BLOCKS
    if isinstance(spec, dict) and spec.get("shard_blocks"):
        return Layout("sharded", shard_box(sizes, int(spec["shard_blocks"])))
    model = model or CostModel()
    costs = row_costs(plan, model)
    mean = float(costs.mean()) if costs.size else 1.0
    per = (task_seconds or DEFAULT_TASK_SECONDS) / max(mean, 1e-9)
    nb = int(min(MAX_SHARD_BLOCKS, max(MIN_SHARD_BLOCKS, per)))
    return Layout("sharded", shard_box(sizes, nb))


def row_costs(plan, model) -> np.ndarray:
    """Expected seconds of every block in a task (the model's method time plus
    :data:`sweeps.cost.OVERHEAD_SECONDS`), shaped like the block dims."""
    from .cost import OVERHEAD_SECONDS

    c = plan.coords
    S, D = len(c["steps"]), len(c["delta"])
    shape = (len(c["sigma"]), len(c["q"]), len(c["sampling"]))
    sig, q, samp = (np.asarray(c["sigma"], float), np.asarray(c["q"], float),
                    np.asarray(c["sampling"], dtype=object))
    n = int(np.prod(shape))
    out = np.empty(shape + (len(c["relation"]), len(c["method"])))
    flat = out.reshape(n, len(c["relation"]), len(c["method"]))
    step = 1 << 16  # rows at a time: small temporaries
    for j, m in enumerate(c["method"]):
        model_m = m if m in model.coef else plan.config.base_method(m)
        for i in range(0, n, step):
            a, b, k = np.unravel_index(np.arange(i, min(n, i + step)), shape)
            flat[i:i + step, :, j] = model.predict(model_m, sig[a], q[b], S, D, samp[k])[:, None]
    out += OVERHEAD_SECONDS
    return out


class ShardGrid:
    """The shards of a sharded store: ``shape`` (blocks along the block dims) cut into boxes."""

    def __init__(self, shape: tuple, shard: tuple):
        self.shape, self.shard = tuple(shape), tuple(shard)
        self.grid = tuple(-(-n // s) for n, s in zip(self.shape, self.shard))

    def __len__(self) -> int:
        return int(np.prod(self.grid))

    def position(self, sid: int) -> tuple:
        return tuple(int(i) for i in np.unravel_index(sid, self.grid))

    def box(self, sid: int) -> tuple:
        """The shard's slices along the block dims."""
        return tuple(slice(i * s, min((i + 1) * s, n)) for i, s, n in zip(self.position(sid), self.shard, self.shape))

    def reduce(self, a: np.ndarray) -> np.ndarray:
        """Sums of a block-dims-shaped array over each shard, flat in shard order."""
        for ax, s in enumerate(self.shard):
            a = np.add.reduceat(a, np.arange(0, a.shape[ax], s), axis=ax)
        return a.ravel()


# -- the cell shard files: zarr's sharding format, encoded directly --------------------------------
_MAX = np.uint64(2**64 - 1)


def _crc32c(b: bytes) -> bytes:
    import google_crc32c

    return np.uint32(google_crc32c.value(b)).astype("<u4").tobytes()


def _raw_spec(arr):
    """``(shard_shape, inner_shape, dtype, fill)`` when ``arr`` is a sharded array with uncompressed
    inner chunks and an end index with crc32c (what :func:`encode_shard` writes), else None."""
    try:
        from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

        m = arr.metadata
        codecs = m.codecs
        if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
            return None
        sc = codecs[0]
        if (len(sc.codecs) != 1 or not isinstance(sc.codecs[0], BytesCodec)
                or [type(c) for c in sc.index_codecs] != [BytesCodec, Crc32cCodec]
                or str(getattr(sc.index_location, "value", sc.index_location)) != "end"):
            return None
        if sc.codecs[0].endian is not None and str(getattr(sc.codecs[0].endian, "value", "")) != "little":
            return None
        dtype = np.dtype(arr.dtype)
        if dtype.kind not in "fiub":
            return None
        inner = tuple(sc.chunk_shape)
        shard = tuple(m.chunk_grid.chunk_shape)
        return shard, inner, dtype, m.fill_value
    except Exception:
        return None


def _axes(shard: tuple, inner: tuple, box: tuple):
    grid_axes = [i for i in range(len(shard)) if inner[i] == 1]
    chunk_axes = [i for i in range(len(shard)) if inner[i] != 1]
    for i in chunk_axes:
        if inner[i] != shard[i] or box[i] != shard[i]:
            raise ValueError("encode_shard: inner chunks must be 1 or the whole shard along every axis")
    return grid_axes, chunk_axes


def encode_shard(data: np.ndarray, shard: tuple, inner: tuple) -> bytes:
    """The bytes of one shard file (zarr sharding codec: inner chunks raw little-endian, then
    the index of (offset, nbytes) uint64 pairs in C order and its crc32c) of ``data``, the
    shard's part of the array (smaller than ``shard`` at the array's edge)."""
    grid_axes, chunk_axes = _axes(shard, inner, data.shape)
    t = np.ascontiguousarray(data.transpose(grid_axes + chunk_axes), dtype=data.dtype.newbyteorder("<"))
    rows = int(np.prod([data.shape[i] for i in grid_axes]))
    nb = t.nbytes // max(rows, 1)
    gshape = tuple(shard[i] // inner[i] for i in range(len(shard)))
    index = np.full(gshape + (2,), _MAX, dtype="<u8")
    region = tuple(slice(0, data.shape[i]) if i in grid_axes else slice(0, 1) for i in range(len(shard)))
    off = (np.arange(rows, dtype=np.uint64) * np.uint64(nb)).reshape([data.shape[i] if i in grid_axes else 1
                                                                       for i in range(len(shard))])
    index[region + (0,)] = off
    index[region + (1,)] = nb
    ib = index.tobytes()
    return t.tobytes() + ib + _crc32c(ib)


def decode_shard(buf: bytes | None, box: tuple, shard: tuple, inner: tuple, dtype, fill) -> np.ndarray:
    """The array part ``box`` (a shape) of one shard file's bytes (None: no file, all fill)."""
    dtype = np.dtype(dtype)
    out = np.full(box, fill, dtype=dtype)
    if buf is None:
        return out
    grid_axes, chunk_axes = _axes(shard, inner, box)
    gshape = tuple(shard[i] // inner[i] for i in range(len(shard)))
    nidx = int(np.prod(gshape)) * 16
    ib = buf[len(buf) - nidx - 4:len(buf) - 4]
    if _crc32c(ib) != buf[len(buf) - 4:]:
        raise ValueError("shard index checksum mismatch")
    index = np.frombuffer(ib, dtype="<u8").reshape(gshape + (2,))
    region = tuple(slice(0, box[i]) if i in grid_axes else slice(0, 1) for i in range(len(shard)))
    off = index[region + (0,)].ravel()
    nbytes = index[region + (1,)].ravel()
    celems = int(np.prod([box[i] for i in chunk_axes]))
    want = celems * dtype.itemsize
    present = off != _MAX
    if (nbytes[present] != want).any():
        raise ValueError("shard holds inner chunks of another size")
    tshape = tuple(box[i] for i in grid_axes) + tuple(box[i] for i in chunk_axes)
    flat = np.full((len(off), celems), fill, dtype=dtype)
    if present.any():
        raw = np.frombuffer(buf, dtype=np.uint8)
        pos = off[present].astype(np.int64)[:, None] + np.arange(want, dtype=np.int64)[None, :]
        flat[present] = raw[pos].view(dtype.newbyteorder("<")).reshape(-1, celems)
    t = flat.reshape(tshape)
    inv = np.argsort(grid_axes + chunk_axes)
    return t.transpose(inv).astype(dtype, copy=False)


def _atomic_put(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file moved into place (``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def _store_class():
    from zarr.storage import LocalStore

    class _Atomic(LocalStore):
        """A zarr LocalStore whose ``set`` writes a temporary file and ``os.replace``s it into place
        (zarr 3.1's own LocalStore does the same; this keeps the guarantee whatever zarr does)."""

        async def set(self, key, value):
            import asyncio

            if not self._is_open:
                await self._open()
            self._check_writable()
            await asyncio.to_thread(_atomic_put, self.root / key, bytes(value.as_buffer_like()))

    return _Atomic


def AtomicLocalStore(root):
    """A zarr LocalStore at ``root`` with atomic writes (temporary file + ``os.replace``)."""
    return _store_class()(root)


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _root(path: str) -> Path:
    return Path(path.removeprefix("file://")).expanduser()


_OPEN: dict = {}  # (path, store_id) -> _Arrays, per process


class _Arrays:
    """The store's zarr arrays, opened once per process, and how to write each."""

    def __init__(self, path: str):
        import zarr

        self.path = path
        self.local = _is_local(path)
        store = AtomicLocalStore(_root(path)) if self.local else path
        g = zarr.open_group(store, mode="r+")
        self.arrays = {k: a for k, a in g.arrays()}
        self.raw = {k: _raw_spec(a) for k, a in self.arrays.items()} if self.local else {}

    @classmethod
    def get(cls, path: str, store_id: str | None) -> "_Arrays":
        key = (path, store_id)
        a = _OPEN.get(key)
        if a is None:
            if len(_OPEN) > 8:
                _OPEN.clear()
            a = _OPEN[key] = cls(path)
        return a

    def _file(self, var: str, coords: tuple) -> Path:
        m = self.arrays[var].metadata
        return _root(self.path) / var / m.encode_chunk_key(coords)

    def _shard_coords(self, var: str, key: tuple) -> tuple:
        shard = self.raw[var][0]
        return tuple(sl.start // s for sl, s in zip(key, shard))

    def read(self, var: str, key: tuple) -> np.ndarray:
        spec = self.raw.get(var)
        if spec is None:
            return np.asarray(self.arrays[var][key])
        shard, inner, dtype, fill = spec
        f = self._file(var, self._shard_coords(var, key))
        try:
            buf = f.read_bytes()
        except FileNotFoundError:
            buf = None
        return decode_shard(buf, tuple(sl.stop - sl.start for sl in key), shard, inner, dtype, fill)

    def write(self, items: list) -> None:
        """Write ``(var, key, array)`` items: raw shard files directly, the rest through zarr
        (concurrently)."""
        import asyncio

        from zarr.core.sync import sync

        rest = []
        for var, key, a in items:
            spec = self.raw.get(var)
            if spec is None:
                rest.append((var, key, a))
                continue
            shard, inner, dtype, _ = spec
            _atomic_put(self._file(var, self._shard_coords(var, key)), encode_shard(a.astype(dtype, copy=False),
                                                                                    shard, inner))
        if rest:
            async def go():
                await asyncio.gather(*(self.arrays[v].async_array.setitem(k, a) for v, k, a in rest))

            sync(go())


# -- the task ---------------------------------------------------------------------------------------
def task_context(plan, layout: Layout, store_id: str | None, run: int, fresh: bool,
                 lease_token: str | None = None) -> dict:
    """What every task of a run needs (plain data): the store, its layout, the grid, the options,
    and the token of the driver's lease (a task whose driver no longer holds the store writes
    nothing: :func:`check_owner`)."""
    c = plan.coords
    return {"store": plan.config.store, "store_id": store_id, "run": int(run), "fresh": bool(fresh),
            "lease_token": lease_token,
            "shard": tuple(layout.shard), "shape": tuple(plan.shape[d] for d in BLOCK_DIMS),
            "block_coords": {d: list(c[d]) for d in BLOCK_DIMS},
            "steps": list(c["steps"]), "deltas": list(c["delta"]), "fprs": list(plan.fprs),
            "mechanism": plan.config.mechanism, "mechanism_keywords": dict(plan.config.mechanism_keywords()),
            "options": {m: dict(plan.config.options.get(m, {})) for m in c["method"]}}


class NotOurStore(RuntimeError):
    """The driver that submitted a task no longer holds the store's lease: the task writes nothing."""


def check_owner(ctx: dict) -> None:
    """(on a worker, before each shard is written) Raise :class:`NotOurStore` unless the store's
    lease file still names the driver that submitted the task.  A task left running after its
    driver stopped (interrupted, lease lost, store restarted) so never writes into a store
    another driver now owns.  Local stores only (an object store's lease is not checked here)."""
    token = ctx.get("lease_token")
    if not token or not _is_local(ctx["store"]):
        return
    from .store import _LEASE_NAME

    try:
        got = json.loads((_root(ctx["store"]) / _LEASE_NAME).read_text()).get("token")
    except (OSError, ValueError, AttributeError):
        got = None
    if got != token:
        raise NotOurStore(f"the driver of run {ctx['run']} no longer holds {ctx['store']!r}: shard not written")


def block_spec(ctx: dict, idx: tuple) -> dict:
    """The :func:`sweeps.methods.run_block` spec of the block at grid position ``idx``."""
    params = {d: ctx["block_coords"][d][i] for d, i in zip(BLOCK_DIMS, idx)}
    params["mechanism"] = ctx["mechanism"]
    spec = {"index": int(np.ravel_multi_index(idx, ctx["shape"])), "params": {**params, **ctx["mechanism_keywords"]},
            "steps": ctx["steps"], "deltas": ctx["deltas"], "options": dict(ctx["options"][params["method"]])}
    if ctx["fprs"]:
        spec["fprs"] = ctx["fprs"]
    return spec


def _cell_key(box: tuple, n_cell: tuple) -> tuple:
    """DIMS-order key of a box of blocks (cell axes in full)."""
    b = dict(zip(BLOCK_DIMS, box))
    cells = iter(n_cell)
    return tuple(b[d] if d in b else slice(0, next(cells)) for d in DIMS)


def _vars_of(ctx: dict) -> tuple:
    return _CELL + (_TPR if ctx["fprs"] else ()) + _BLOCK


def _key(ctx, var, box):
    S, D, F = len(ctx["steps"]), len(ctx["deltas"]), len(ctx["fprs"])
    if var in _CELL:
        return _cell_key(box, (S, D))
    if var in _TPR:
        return _cell_key(box, (S, F))
    return box


def _to_bd(a: np.ndarray) -> np.ndarray:
    """A DIMS-ordered box array -> block dims first, cell axes last."""
    return np.moveaxis(a, (2, 3), (5, 6))


def _from_bd(a: np.ndarray) -> np.ndarray:
    return np.moveaxis(a, (5, 6), (2, 3))


def read_shard(arrays: _Arrays, ctx: dict, box: tuple) -> dict:
    """The shard's current contents: cell variables (block dims..., steps, delta|fpr), block ones."""
    out = {}
    for v in _vars_of(ctx):
        a = arrays.read(v, _key(ctx, v, box))
        out[v] = _to_bd(a) if v in _CELL or v in _TPR else a
    return out


def _fill(ctx: dict, box: tuple) -> dict:
    from .store import STR

    bshape = tuple(sl.stop - sl.start for sl in box)
    S, D, F = len(ctx["steps"]), len(ctx["deltas"]), len(ctx["fprs"])
    out = {v: np.full(bshape + (S, D), np.nan) for v in ("eps_lower", "eps_upper", "eps_estimate", "seconds")}
    out["status"] = np.zeros(bshape + (S, D), np.int8)
    if F:
        out.update(tpr_lower=np.full(bshape + (S, F), np.nan), tpr_upper=np.full(bshape + (S, F), np.nan),
                   tpr_status=np.zeros(bshape + (S, F), np.int8))
    out.update(error=np.full(bshape, "", dtype=STR), host=np.full(bshape, "", dtype=STR),
               run=np.zeros(bshape, np.int16), finished_at=np.full(bshape, np.nan),
               state=np.zeros(bshape, np.int8), block_seconds=np.full(bshape, np.nan))
    return out


def _todo(ctx: dict, prev: dict | None, box: tuple) -> list:
    """Positions (within the box) of the blocks to compute: those not done."""
    bshape = tuple(sl.stop - sl.start for sl in box)
    if prev is None:
        return list(np.ndindex(*bshape))
    return [tuple(int(i) for i in p) for p in np.argwhere(prev["state"] != STATE_DONE)]


def write_shard(arrays: _Arrays, ctx: dict, box: tuple, results: dict, prev: dict | None) -> dict:
    """Write one shard: ``results`` (position in the box -> :func:`sweeps.methods.run_block`
    result) over ``prev`` (the shard's contents before, None: a fresh shard).  Data variables
    first, then ``status``/``tpr_status``, then ``state`` and ``run``.  Cells ok in ``prev``
    that a result failed keep their old values.  Returns counts of the written blocks."""
    from .store import STR

    cur = _fill(ctx, box) if prev is None else {k: np.array(v, copy=True) for k, v in prev.items()}
    S, D, F = len(ctx["steps"]), len(ctx["deltas"]), len(ctx["fprs"])
    n = S * D
    ok = failed = errors = 0
    secs_total = 0.0
    for p, r in results.items():
        if r.get("eps_upper") is None:  # a lost block
            r = dict(r, eps_lower=np.full((S, D), np.nan), eps_upper=np.full((S, D), np.nan),
                     failed=np.ones((S, D), bool))
        fl = np.asarray(r["failed"], bool).reshape(S, D)
        un = r.get("unsupported")
        un = np.zeros((S, D), bool) if un is None else np.asarray(un, bool).reshape(S, D) & fl
        est = r.get("eps_estimate")
        est = np.full((S, D), np.nan) if est is None else np.asarray(est, float).reshape(S, D)
        lo = np.asarray(r["eps_lower"], float).reshape(S, D)
        up = np.asarray(r["eps_upper"], float).reshape(S, D)
        est = np.where(fl, np.nan, est)
        sec = r.get("seconds")
        cs = np.full((S, D), np.nan if sec is None else float(sec) / n)
        st = np.where(fl, np.where(un, _UNSUPPORTED, _FAILED), _OK).astype(np.int8)
        keep = (cur["status"][p] == _OK) & fl if prev is not None else np.zeros((S, D), bool)
        for v, new in (("eps_lower", lo), ("eps_upper", up), ("eps_estimate", est), ("seconds", cs)):
            cur[v][p] = np.where(keep, cur[v][p], new)
        cur["status"][p] = np.where(keep, _OK, st)
        done = bool(np.isin(cur["status"][p], (_OK, _UNSUPPORTED)).all())
        if F:
            if r.get("tpr_upper") is None:
                tl, tu = np.full((S, F), np.nan), np.full((S, F), np.nan)
                tf, tn = np.ones((S, F), bool), np.zeros((S, F), bool)
            else:
                tl = np.asarray(r["tpr_lower"], float).reshape(S, F)
                tu = np.asarray(r["tpr_upper"], float).reshape(S, F)
                tf = np.asarray(r["tpr_failed"], bool).reshape(S, F)
                tn = np.asarray(r.get("tpr_unsupported", np.zeros((S, F), bool)), bool).reshape(S, F) & tf
            tst = np.where(tf, np.where(tn, _UNSUPPORTED, _FAILED), _OK).astype(np.int8)
            tkeep = (cur["tpr_status"][p] == _OK) & tf if prev is not None else np.zeros((S, F), bool)
            cur["tpr_lower"][p] = np.where(tkeep, cur["tpr_lower"][p], np.where(tf, np.nan, tl))
            cur["tpr_upper"][p] = np.where(tkeep, cur["tpr_upper"][p], np.where(tf, np.nan, tu))
            cur["tpr_status"][p] = np.where(tkeep, _OK, tst)
            done &= bool(np.isin(cur["tpr_status"][p], (_OK, _UNSUPPORTED)).all())
        err = r.get("error", "") or ""
        cur["error"][p] = err
        cur["host"][p] = r.get("host", "")
        cur["finished_at"][p] = r.get("finished_at", time.time())
        cur["block_seconds"][p] = np.nan if sec is None else float(sec)
        cur["run"][p] = ctx["run"]
        cur["state"][p] = STATE_DONE if done else STATE_FAILED
        ok += done
        failed += not done
        errors += bool(err)
        secs_total += 0.0 if sec is None else float(sec)
    if not results:
        return {"ok": 0, "failed": 0, "errors": 0, "seconds": 0.0}
    fresh = prev is None
    data, commit1, commit2 = [], [], []
    for v in _vars_of(ctx):
        a = cur[v]
        if v in _CELL or v in _TPR:
            a = _from_bd(a)
        item = (v, _key(ctx, v, box), np.ascontiguousarray(a) if a.dtype != STR else a)
        if v in ("status", "tpr_status"):
            commit1.append(item)
        elif v in ("state", "run"):
            commit2.append(item)
        else:
            if fresh and v in ("error", "eps_estimate", "tpr_lower", "tpr_upper") and _all_fill(a):
                continue  # a missing chunk reads as the fill value
            data.append(item)
    arrays.write(data)
    arrays.write(commit1)
    arrays.write(commit2)
    return {"ok": ok, "failed": failed, "errors": errors, "seconds": secs_total}


def _all_fill(a) -> bool:
    if a.dtype.kind == "f":
        return bool(np.isnan(a).all())
    return bool((a == "").all()) if a.dtype.kind in "UT" or str(a.dtype).startswith("StringDType") else False


def run_task(spec: dict) -> dict:
    """One task (runs on a worker): compute the blocks of ``spec["shards"]`` not done yet with
    :func:`sweeps.methods.run_block`, write each shard (:func:`write_shard`), return a summary
    ``{"task", "shards", "blocks", "ok", "failed", "skipped", "errors", "seconds", "wall", "host"}``."""
    from .methods import run_block

    t0 = time.perf_counter()
    ctx = spec["ctx"]
    grid = ShardGrid(ctx["shape"], ctx["shard"])
    arrays = _Arrays.get(ctx["store"], ctx.get("store_id"))
    out = {"task": spec["task"], "shards": len(spec["shards"]), "blocks": 0, "ok": 0, "failed": 0, "skipped": 0,
           "errors": 0, "seconds": 0.0, "host": f"{socket.gethostname()}:{os.getpid()}"}
    for sid in spec["shards"]:
        box = grid.box(sid)
        prev = None if ctx["fresh"] else read_shard(arrays, ctx, box)
        todo = _todo(ctx, prev, box)
        out["skipped"] += int(np.prod([sl.stop - sl.start for sl in box])) - len(todo)
        if not todo:
            continue
        starts = [sl.start for sl in box]
        results = {}
        for p in todo:
            results[p] = run_block(block_spec(ctx, tuple(s + i for s, i in zip(starts, p))))
        check_owner(ctx)
        got = write_shard(arrays, ctx, box, results, prev)
        out["blocks"] += len(todo)
        for k in ("ok", "failed", "errors", "seconds"):
            out[k] += got[k]
    out["wall"] = time.perf_counter() - t0
    return out


def shard_todo(arrays: _Arrays, ctx: dict, sid: int) -> tuple[dict | None, list]:
    """``(prev, todo)`` of one shard (driver side: the shard a failed task left)."""
    box = ShardGrid(ctx["shape"], ctx["shard"]).box(sid)
    prev = None if ctx["fresh"] else read_shard(arrays, ctx, box)
    return prev, _todo(ctx, prev, box)


def read_cell_var(path: str, var: str) -> np.ndarray:
    """A whole cell variable of a store, read shard file by shard file (:func:`decode_shard`: one
    read and one vectorised gather per file) when it is a local sharded array this module
    writes, else through zarr.  Read-only.  (zarr decodes a sharded array inner chunk by inner
    chunk: minutes for a million blocks.)"""
    import zarr

    from .store import _quiet

    with _quiet():
        a = zarr.open_group(path, mode="r")[var]
        spec = _raw_spec(a) if _is_local(path) else None
        if spec is None:
            return np.asarray(a[...])
        shard, inner, dtype, fill = spec
        out = np.empty(a.shape, dtype=dtype)
        root = _root(path) / var
        for coords in np.ndindex(*(-(-n // s) for n, s in zip(a.shape, shard))):
            key = tuple(slice(c * s, min((c + 1) * s, n)) for c, s, n in zip(coords, shard, a.shape))
            f = root / a.metadata.encode_chunk_key(coords)
            try:
                buf = f.read_bytes()
            except FileNotFoundError:
                buf = None
            out[key] = decode_shard(buf, tuple(k.stop - k.start for k in key), shard, inner, dtype, fill)
        return out


def read_block_var(path: str, var: str) -> np.ndarray:
    """A block variable (block dims), read chunk by chunk through zarr (small: one value per block)."""
    import zarr

    from .store import _quiet

    with _quiet():
        return np.asarray(zarr.open_group(path, mode="r")[var][...])


# -- preflight: the workers must write the store themselves ------------------------------------------
def _probe_write(path: str, store_id: str | None) -> str:
    """(runs on a worker) "" when this worker sees the store ``path`` (same ``store_id``) and can
    create a file in it, else why not."""
    from .store import PROBE_PREFIX, read_attrs

    if _is_local(path):
        root = _root(path)
        if not root.is_dir():
            return f"{str(root)!r} does not exist on this worker"
        f = root / f"{PROBE_PREFIX}{uuid.uuid4().hex[:8]}"
        try:
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            os.unlink(f)
        except OSError as e:
            return f"cannot write in {str(root)!r}: {e.strerror or e}"
    try:
        attrs = read_attrs(path)
    except Exception as e:
        return f"cannot read the store: {type(e).__name__}"
    if attrs is None:
        return "sees no store there"
    if store_id is not None and (attrs.get("store_id") or attrs.get("created")) != store_id:
        return "sees another store at that path (not a filesystem shared with the driver?)"
    return ""


def check_workers_write(client, path: str, store_id: str | None) -> None:
    """Raise :class:`sweeps.store.StoreError` (one line) unless every worker can write the store."""
    from .store import StoreError

    try:
        got = client.run(_probe_write, path, store_id)
    except Exception as e:
        raise StoreError(f"cannot check that the workers can write {path!r}: {type(e).__name__}: {e}") from None
    bad = {w: why for w, why in got.items() if why}
    if bad:
        w, why = sorted(bad.items())[0]
        raise StoreError(f"worker {w} cannot write the sharded store {path!r}: {why} (in the sharded layout "
                         f"the workers write their shards: put the store on a filesystem every worker "
                         f"shares{f'; {len(bad) - 1} more worker(s) too' if len(bad) > 1 else ''})")


def suggest_min_tasks(client) -> int:
    try:
        return max(1, 2 * sum(client.nthreads().values()))
    except Exception:
        return 2


def shard_costs(plan, grid: ShardGrid, model, todo_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expected seconds and number of blocks to compute, per shard (flat shard order)."""
    c = row_costs(plan, model) * todo_mask
    return grid.reduce(c), grid.reduce(todo_mask.astype(np.int64))


def refit_model(plan, model, state: np.ndarray, seconds: np.ndarray, limit: int = 20000, seed: int = 0):
    """``model`` refitted to the measured ``block_seconds`` of the done blocks (block dims arrays)."""
    c = plan.coords
    S, D = len(c["steps"]), len(c["delta"])
    rng = np.random.default_rng(seed)
    for j, m in enumerate(c["method"]):
        done = np.argwhere((state[..., j] == STATE_DONE) & np.isfinite(seconds[..., j]))
        if not len(done):
            continue
        if len(done) > limit:
            done = done[rng.choice(len(done), limit, replace=False)]
        sig = np.asarray(c["sigma"], float)[done[:, 0]]
        q = np.asarray(c["q"], float)[done[:, 1]]
        samp = np.asarray(c["sampling"], dtype=object)[done[:, 2]]
        secs = seconds[..., j][tuple(done.T)]
        model = model.refit(m, sig, q, S, D, samp, secs)
    return model

