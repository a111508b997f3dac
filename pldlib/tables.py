"""Precomputed sigma lookup tables: certified noise multipliers without running an accountant.

A table holds, on a grid of ``(epsilon, delta, q, steps, sampling, relation)``,
a Gaussian noise multiplier ``sigma`` whose *certified* PLD upper bound
``eps(delta) <= epsilon`` was verified by the accountant at exactly that grid
point (the verified upper bound is stored next to it as ``eps_upper``).

A query between grid points is answered conservatively (docs/MATH.md section 9):
eps(delta) increases in q and in the number of steps k and decreases in delta
(each a post-processing argument), so every argument is rounded to its
adjacent grid value on the *safe* side -- q up, steps up, delta down, target
epsilon down -- and the sigma stored there is certified for the query as well.
A query outside the grid raises :class:`TableRangeError` naming the argument;
sampling and relation must match a table entry exactly.

Tables are built by the sweep workflow (``sweeps run configs/sigma_table.yaml``,
a config with ``kind: sigma_table``; see :mod:`sweeps.tables`) and stored as zarr.

Examples
--------
>>> import pldlib.tables
>>> t = pldlib.tables.open("results/sigma_table/sigma_table.zarr")   # = open_table(...)
>>> a = t.sigma_for(epsilon=3.0, delta=1e-6, q=0.004, steps=20_000)
>>> a.sigma, a.rounding["q"]          # (2.07..., (0.004, 0.005, 'up'))
>>> a.describe()   # 'epsilon=3 -> 2 (down), delta=1e-06, q=0.004 -> 0.005 (up), steps=20000 -> 30000 (up)'
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import _validate as V

__all__ = ["SigmaTable", "TableAnswer", "TableRangeError", "open", "open_table", "default_table_path",
           "TABLE_DIMS", "TABLE_KIND", "invert_on_safe_side"]

#: dimension order of a table's variables
TABLE_DIMS = ("epsilon", "delta", "q", "steps", "sampling", "relation")
#: value of the ``kind`` attribute that marks a pldlib sigma table
TABLE_KIND = "pldlib.sigma_table"
#: status codes of table entries
STATUS_MISSING, STATUS_OK, STATUS_FAILED = 0, 1, 2

# which way each numeric argument is rounded: "down" = to the largest grid value <= query
_SAFE_SIDE = {"epsilon": "down", "delta": "down", "q": "up", "steps": "up"}


class TableRangeError(ValueError):
    """A query outside what the table covers (names the argument and the covered range)."""


@dataclass(frozen=True)
class TableAnswer:
    """A certified sigma from a table look-up.

    sigma : the noise multiplier (certified for the query: see :mod:`pldlib.tables`)
    eps_upper : the certified upper eps verified at the grid point used (<= its epsilon)
    grid : the grid point whose entry was used, ``{dim: value}``
    rounding : ``{argument: (query value, grid value, 'exact' | 'up' | 'down')}``
    """

    sigma: float
    eps_upper: float
    grid: dict = field(default_factory=dict)
    rounding: dict = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        """True when the query was a grid point (no rounding)."""
        return all(r[2] == "exact" for r in self.rounding.values())

    def describe(self) -> str:
        parts = []
        for k, (qv, gv, how) in self.rounding.items():
            parts.append(f"{k}={qv:g}" if how == "exact" else f"{k}={qv:g} -> {gv:g} ({how})")
        return ", ".join(parts)


def invert_on_safe_side(sigmas, eps_upper, eps_lower, target: float):
    """Invert eps(sigma) on a sigma grid for one target, on the safe side.

    Returns ``(i_feasible, i_infeasible)``: the index of the smallest grid sigma
    whose certified upper eps is <= target (None if none), and of the largest
    grid sigma whose certified lower eps is > target (None if none).  Each is a
    certificate on its own (no interpolation and no monotonicity assumption);
    the true smallest feasible sigma lies in (sigmas[i_infeasible], sigmas[i_feasible]].
    """
    s = np.asarray(sigmas, dtype=float)
    up = np.asarray(eps_upper, dtype=float)
    lo = np.asarray(eps_lower, dtype=float)
    order = np.argsort(s)
    feas = [i for i in order if np.isfinite(up[i]) and up[i] <= target]
    infeas = [i for i in order if np.isfinite(lo[i]) and lo[i] > target]
    return (int(feas[0]) if feas else None), (int(infeas[-1]) if infeas else None)


def _round_safe(name: str, value: float, grid: np.ndarray) -> tuple[int, str]:
    """Index of the safe-side grid neighbour of ``value`` (raises TableRangeError outside)."""
    g = np.asarray(grid, dtype=float)
    rtol = 1e-9
    hit = np.nonzero(np.isclose(g, value, rtol=rtol, atol=0.0))[0]
    if hit.size:
        return int(hit[0]), "exact"
    side = _SAFE_SIDE[name]
    if side == "down":
        idx = np.nonzero(g < value)[0]
        if idx.size == 0:
            raise TableRangeError(f"{name}={value:g} is below the table's smallest {name} "
                                  f"{g.min():g} (covered: [{g.min():g}, {g.max():g}]); rounding "
                                  f"it down would leave the table")
        return int(idx[np.argmax(g[idx])]), "down"
    idx = np.nonzero(g > value)[0]
    if idx.size == 0:
        raise TableRangeError(f"{name}={value:g} is above the table's largest {name} "
                              f"{g.max():g} (covered: [{g.min():g}, {g.max():g}]); rounding "
                              f"it up would leave the table")
    return int(idx[np.argmin(g[idx])]), "up"


class SigmaTable:
    """A sigma lookup table (an :class:`xarray.Dataset` with dims :data:`TABLE_DIMS`).

    Variables: ``sigma`` (certified noise multiplier, NaN where none was
    found), ``eps_upper`` / ``eps_lower`` (the certified interval at that sigma),
    ``sigma_infeasible`` (a sigma certified NOT to meet the target, NaN if
    unknown), ``status`` (0 missing, 1 ok, 2 failed).
    """

    def __init__(self, ds):
        missing = [d for d in TABLE_DIMS if d not in ds.dims]
        if missing or "sigma" not in ds or ds.attrs.get("kind") != TABLE_KIND:
            raise ValueError(f"not a pldlib sigma table (kind={ds.attrs.get('kind')!r}, "
                             f"missing dims {missing})")
        self.ds = ds
        self._axes = {d: np.asarray(ds[d].values) for d in TABLE_DIMS}
        self._sigma = np.asarray(ds["sigma"].values, dtype=float)
        self._eps_upper = np.asarray(ds["eps_upper"].values, dtype=float)
        self._status = np.asarray(ds["status"].values) if "status" in ds else None

    def __repr__(self) -> str:
        ax = ", ".join(f"{d}: {len(v)}" for d, v in self._axes.items())
        return f"<SigmaTable {ax}; {int(np.isfinite(self._sigma).sum())} certified entries>"

    @property
    def axes(self) -> dict:
        return {d: v.copy() for d, v in self._axes.items()}

    def covers(self, epsilon, delta, q, steps, sampling="poisson", relation="add_remove") -> bool:
        """Whether :meth:`sigma_for` can answer this query."""
        try:
            self.sigma_for(epsilon, delta, q, steps, sampling, relation)
            return True
        except (TableRangeError, KeyError):
            return False

    def sigma_for(self, epsilon: float, delta: float, q: float, steps: int, sampling: str = "poisson",
                  relation: str = "add_remove") -> TableAnswer:
        """Certified sigma for the query, by safe-side rounding of every argument.

        Raises
        ------
        ValueError : a bad argument (names it), :class:`TableRangeError` (a
            ValueError) outside the table, KeyError where the grid point has no
            certified entry (its computation failed or is missing).
        """
        epsilon, delta, q, steps, sampling, relation = V.dp_target(epsilon, delta, q, steps, sampling, relation)
        idx, rounding = [], {}
        for name, val in (("epsilon", epsilon), ("delta", delta), ("q", q), ("steps", float(steps))):
            i, how = _round_safe(name, val, self._axes[name])
            idx.append(i)
            rounding[name] = (val, float(self._axes[name][i]), how)
        for name, val in (("sampling", sampling), ("relation", relation)):
            names = [str(x) for x in self._axes[name]]
            if val not in names:
                raise TableRangeError(f"{name}={V.fmt(val)} is not in the table (it has: {', '.join(names)})")
            idx.append(names.index(val))
        k = tuple(idx)
        sigma = float(self._sigma[k])
        if not math.isfinite(sigma) or (self._status is not None and self._status[k] != STATUS_OK):
            grid = ", ".join(f"{n}={rounding[n][1]:g}" for n in ("epsilon", "delta", "q", "steps"))
            raise KeyError(f"the table has no certified sigma at the grid point {grid}, "
                           f"{sampling}, {relation} (its computation failed or is missing); "
                           f"run pldlib.calibrate instead")
        grid = {n: rounding[n][1] for n in ("epsilon", "delta", "q", "steps")}
        grid["steps"] = int(grid["steps"])
        grid.update(sampling=sampling, relation=relation)
        return TableAnswer(sigma=sigma, eps_upper=float(self._eps_upper[k]), grid=grid, rounding=rounding)


def open_table(path) -> SigmaTable:
    """Open a sigma table stored as zarr (a local path or an fsspec URL)."""
    import xarray as xr

    p = os.fspath(path)
    if "://" not in p and not Path(p).exists():
        raise FileNotFoundError(f"no sigma table at {p!r}")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(p, consolidated=False).load()
    return SigmaTable(ds)


#: ``pldlib.tables.open(path)``: the same as :func:`open_table` (the name issue #7 uses).
#: It shadows the builtin ``open`` inside this module only -- code here that reads a
#: file must call ``builtins.open``.
open = open_table  # noqa: A001


def default_table_path() -> str | None:
    """The curated table: ``$PLDLIB_SIGMA_TABLE`` or ``results/sigma_table/sigma_table.zarr``
    of the source checkout; None if neither exists (``PLDLIB_SIGMA_TABLE=`` disables it)."""
    env = os.environ.get("PLDLIB_SIGMA_TABLE")
    if env is not None:
        return env or None
    p = Path(__file__).resolve().parent.parent / "results" / "sigma_table" / "sigma_table.zarr"
    return str(p) if p.exists() else None
