"""Helpers for tests of sweeps (importable by the test suite; no side effects)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import yaml

from .plan import DIMS


def tree_snapshot(path) -> dict:
    """relative path -> (size, mtime_ns, sha256) for every file under ``path``."""
    out = {}
    root = Path(path)
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns,
                                             hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def write_config(path, data: dict) -> str:
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def small_config(store, **changes) -> dict:
    """The dict of configs/test_small.yaml with ``store`` and top-level/grid changes."""
    root = Path(__file__).resolve().parent.parent
    data = yaml.safe_load((root / "configs" / "test_small.yaml").read_text())
    data["store"] = str(store)
    for k, v in changes.items():
        if k in data.get("grid", {}) or k in ("sigma", "q", "steps", "delta", "sampling", "relation"):
            data["grid"][k] = v
        else:
            data[k] = v
    return data


def direct_eps(config, per_cell: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """eps_lower, eps_upper (DIMS order) from direct pldlib calls (small grids only).

    Default: one ``account(...)`` per (block, steps) asked for all deltas at
    once, exactly the call a block makes.  ``per_cell``: one full accounting
    per cell, asked for its one delta (the tilt search then differs, so the
    answers agree as certified intervals, not bit for bit).
    """
    import pldlib

    from .methods import make_mechanism

    shape = tuple(len(config.axis(d)) for d in DIMS)
    lo = np.full(shape, np.nan)
    up = np.full(shape, np.nan)
    deltas = np.array(config.delta)
    kw = {}
    if config.options["pld"].get("interval") is not None:
        kw["interval"] = config.options["pld"]["interval"]
    outer = [d for d in DIMS if d != "delta"]
    for idx in np.ndindex(*[len(config.axis(d)) for d in outer]):
        p = {d: config.axis(d)[i] for d, i in zip(outer, idx)}
        assert p["method"] == "pld"
        mech = make_mechanism({**p, "mechanism": config.mechanism})
        sl = list(idx)
        sl.insert(DIMS.index("delta"), slice(None))
        if per_cell:
            for j, d in enumerate(deltas):
                r = pldlib.account(mech, steps=p["steps"], **kw).epsilon(float(d))
                cell = list(sl)
                cell[DIMS.index("delta")] = j
                lo[tuple(cell)], up[tuple(cell)] = r.lower, r.upper
        else:
            r = pldlib.account(mech, steps=p["steps"], **kw).epsilon(deltas)
            lo[tuple(sl)], up[tuple(sl)] = r.lower, r.upper
    return lo, up
