"""Helpers for tests of sweeps (importable by the test suite; no side effects)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import yaml

from pldlib import events as E
from pldlib.methods.base import Accountant, Interval

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
    if config.options["pld"].get("spacing") is not None:
        kw["spacing"] = config.options["pld"]["spacing"]
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


# -- a test method: an accountant whose answers encode the cell -----------------------------------
_REL_CODE = {"add": 0.1, "add_remove": 0.2, "substitution": 0.3, "remove": 0.4}


class CodedAccountant(Accountant):
    """Test-only method (register it with :func:`pldlib.methods.register_method`): eps lower =
    sigma * 1e6 + q * 1e4 + steps + delta + (a code of the relation), upper = lower + 0.5, so
    a stored cell says where it came from.  ``negate``: eps -> -eps (lower and upper
    swapped) at sigma 1; ``bad_sigma``: blocks of that sigma leave the cell (steps 10,
    delta 1e-8) unanswered with the note ``steps=10: fake precision limit``."""

    method = "coded"
    kind = "certified"

    def __init__(self, relation: str = "add_remove", *, negate: bool = False, bad_sigma: float | None = None):
        super().__init__(relation)
        self.negate, self.bad_sigma = bool(negate), bad_sigma

    def _options(self):
        return {"negate": self.negate, "bad_sigma": self.bad_sigma}

    def _unsupported(self, step):
        return None

    def _code(self, ev, k, d):
        base = ev.event if isinstance(ev, E.Sampled) else ev
        sigma = 1.0 if self.negate else float(getattr(base, "sigma", getattr(base, "scale", 0.0)))
        q = ev.q if isinstance(ev, E.Sampled) else 1.0
        lo = sigma * 1e6 + q * 1e4 + k + np.asarray(d, dtype=float) + _REL_CODE[self.relation]
        return (-(lo + 0.5), -lo) if self.negate else (lo, lo + 0.5)

    def epsilon(self, delta):
        (step, k), = self._steps
        lo, up = self._code(step.event, k, delta)
        return Interval(lo, up)

    def delta(self, epsilon):
        raise NotImplementedError("coded: no delta")

    def epsilon_per_steps(self, event, steps, deltas):
        ks = np.asarray(steps, dtype=float)[:, None]
        lo, up = self._code(event, ks, np.asarray(deltas, dtype=float)[None, :])
        lo, up = np.array(lo, dtype=float), np.array(up, dtype=float)
        notes = []
        base = event.event if isinstance(event, E.Sampled) else event
        if self.bad_sigma is not None and getattr(base, "sigma", None) == self.bad_sigma:
            up[list(steps).index(10), list(deltas).index(1e-8)] = np.nan
            notes.append("steps=10: fake precision limit")
        return lo, np.full(lo.shape, np.nan), up, notes


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` is still alive (kill tests)."""
    import os

    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
