"""Grid -> blocks -> chunks.  Pure data; no Dask, no store.

The dataset has the cell dimensions :data:`DIMS`.  A *block* fixes one value
of each of :data:`BLOCK_DIMS` (sigma, q, sampling, relation, method) and spans
the whole ``steps`` and ``delta`` axes: the worker builds one accountant per
steps value and asks it for all deltas in one vectorised call, so the work
that cells share is shared.  The zarr chunks are chosen to be exactly the
blocks (size 1 along the block dimensions, full along steps and delta), so
each block writes exactly one chunk of every variable: one writer per chunk.  In the
sharded layout (:mod:`sweeps.shards`) those chunks are the inner chunks of shards that
hold boxes of many blocks, and one task writes whole shards.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .config import SweepConfig

__all__ = ["DIMS", "BLOCK_DIMS", "CELL_DIMS", "TPR_DIMS", "Block", "Plan", "make_plan"]

#: dimensions of the cell variables (eps_lower, eps_upper, seconds, status), in order
DIMS = ("sigma", "q", "steps", "delta", "sampling", "relation", "method")
#: one block per combination of these (the per-block variables use them as dims)
BLOCK_DIMS = ("sigma", "q", "sampling", "relation", "method")
#: dimensions a block spans in full
CELL_DIMS = ("steps", "delta")
#: dimensions of the TPR variables (config ``grid.fpr``): the cell dims with ``fpr`` for ``delta``
TPR_DIMS = ("sigma", "q", "steps", "fpr", "sampling", "relation", "method")


@dataclass(frozen=True)
class Block:
    """One task: indices along :data:`BLOCK_DIMS` (``index``) and their values."""

    number: int           # position in plan.blocks
    index: tuple          # (i_sigma, i_q, i_sampling, i_relation, i_method)
    params: dict          # mechanism, sigma, q, sampling, relation, method

    def label(self) -> str:
        p = self.params
        return (f"sigma={p['sigma']:.6g} q={p['q']:.6g} sampling={p['sampling']} "
                f"relation={p['relation']} method={p['method']}")


@dataclass(frozen=True)
class Plan:
    config: SweepConfig
    coords: dict          # dim -> tuple of values, for every dim in DIMS
    blocks: Sequence      # of Block, heaviest first (lazy: a Block is made when asked for)

    @property
    def shape(self) -> dict:
        return {d: len(self.coords[d]) for d in DIMS}

    @property
    def chunks(self) -> dict:
        """Chunk size per dimension: 1 along block dims, full along steps and delta."""
        return {d: (len(self.coords[d]) if d in CELL_DIMS else 1) for d in DIMS}

    @property
    def fprs(self) -> tuple:
        """The false-positive rates of the TPR metric (``grid.fpr``; empty: no TPR variables)."""
        return tuple(self.config.fpr)

    @property
    def cells_per_block(self) -> int:
        return len(self.coords["steps"]) * len(self.coords["delta"])

    @property
    def n_cells(self) -> int:
        return len(self.blocks) * self.cells_per_block

    def region(self, block: Block, dims=DIMS) -> dict:
        """The block's region (dim -> slice) over ``dims``."""
        pos = dict(zip(BLOCK_DIMS, block.index))
        return {d: (slice(pos[d], pos[d] + 1) if d in pos else slice(0, len(self.coords[d])))
                for d in dims}

    def spec(self, block: Block) -> dict:
        """What a worker needs for ``block`` (plain data, cheap to pickle)."""
        m = block.params["method"]
        spec = {
            "index": block.number,
            # (``truncated_poisson``: the config's batch_size and dataset_size; ``random_allocation``:
            # its selections; for the mechanism)
            "params": {**block.params, **self.config.mechanism_keywords()},
            "steps": list(self.coords["steps"]),
            "deltas": list(self.coords["delta"]),
            "options": dict(self.config.options.get(m, {})),
        }
        if self.fprs:
            spec["fprs"] = list(self.fprs)
        return spec


def _cost(sigma: float) -> float:
    # rough work estimate for ordering: eps (and so the PLD grid) grows as sigma shrinks
    return 1.0 / sigma ** 2


class BlockSeq(Sequence):
    """The plan's blocks, heaviest first, made on demand (a plan of 10^6 blocks holds
    no 10^6 objects).  Order: sigma by decreasing cost (stable), then the other block
    dims in grid order -- the same order as sorting the grid-order blocks by cost."""

    def __init__(self, coords: dict, mechanism: str):
        self.coords = coords
        self.mechanism = mechanism
        self.sizes = tuple(len(coords[d]) for d in BLOCK_DIMS)
        sig = coords["sigma"]
        self.sigma_order = tuple(sorted(range(len(sig)), key=lambda i: -_cost(sig[i])))
        self.rest = int(np.prod(self.sizes[1:], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.sigma_order) * self.rest

    def index_of(self, n: int) -> tuple:
        rank, r = divmod(n, self.rest)
        idx = [self.sigma_order[rank]]
        for size in reversed(self.sizes[1:]):
            r, i = divmod(r, size)
            idx.insert(1, i)
        return tuple(idx)

    def __getitem__(self, n):
        if isinstance(n, slice):
            return [self[i] for i in range(*n.indices(len(self)))]
        if n < 0:
            n += len(self)
        if not 0 <= n < len(self):
            raise IndexError(n)
        idx = self.index_of(n)
        params = {d: self.coords[d][i] for d, i in zip(BLOCK_DIMS, idx)}
        params["mechanism"] = self.mechanism
        return Block(n, idx, params)

    def __iter__(self):
        for n in range(len(self)):
            yield self[n]

    def numbers_by_index(self) -> np.ndarray:
        """Block number of every grid position (array shaped like the BLOCK_DIMS sizes)."""
        rank = np.empty(len(self.sigma_order), dtype=np.int64)
        rank[list(self.sigma_order)] = np.arange(len(self.sigma_order))
        rest = np.arange(self.rest, dtype=np.int64).reshape(self.sizes[1:])
        return rank.reshape(-1, *([1] * (len(self.sizes) - 1))) * self.rest + rest[None]


def make_plan(config: SweepConfig) -> Plan:
    coords = {d: tuple(config.axis(d)) for d in DIMS}
    return Plan(config=config, coords=coords, blocks=BlockSeq(coords, config.mechanism))
