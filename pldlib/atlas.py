"""Certified sigma look-ups from an eps atlas (docs/MATH.md section 9.4).

An *atlas* is the result of an ordinary sweep (``sweeps run configs/atlas.yaml``):
certified ``eps_upper`` and ``eps_lower`` of the PLD accountant for the Gaussian
mechanism on a grid ``sigma x q x steps x delta`` per (sampling, relation),
exported to one compressed ``.npz`` file (``python -m sweeps.atlas export
STORE OUT.npz``) that loads with numpy alone.

:meth:`Atlas.sigma_for` inverts it for any target epsilon (epsilon is not a
grid axis), vectorised over arrays of queries.  The true eps(delta) increases
in q and in the number of steps and decreases in delta and in sigma (each a
post-processing argument, docs/MATH.md section 9.2), so

* **certified sigma**: the smallest grid sigma whose certified ``eps_upper`` at
  the safe-side neighbours of the query (q up, steps up, delta down) is
  ``<= epsilon``: its true eps at the query is below that upper bound.  Between
  the grid deltas below and above the query the bound is the chord of the
  convex delta(e^eps) (:func:`_delta_chord`), tighter than the delta-below value;
* **certified insufficient sigma**: the largest grid sigma whose certified
  ``eps_lower`` at the other neighbours (q down, steps down, delta up) is
  ``> epsilon``: its true eps at the query is above it, and so is that of every
  smaller sigma; the smallest feasible sigma lies in ``(insufficient, certified]``;
* **monotone envelope**: the same monotonicity makes every cell's bounds valid
  for the cells it dominates, so look-ups read ``U*(cell) = min U`` over the
  cells with sigma' <= sigma, q' >= q, steps' >= steps, delta' <= delta, and
  ``L*(cell) = max L`` over the mirrored orthant (:func:`monotone_envelope`).
  Cells no sweep computed (an atlas merged from parts on different grids) are
  filled soundly from their safe-side neighbours instead of being skipped;
* **estimate**: log-linear interpolation of the interval's midpoint in
  (log q, log steps, log delta) and then in (log sigma, log eps) -- labelled an
  estimate, no guarantee.

``certify=True`` runs the PLD accountant at the exact query, seeded by the
estimate (one or two upper-only evaluations in the common case, a third when a secant step
between a feasible and an infeasible point tightens it), and returns a
sigma whose certified upper bound meets the target.  The first sigma is the
estimate raised by CERTIFY_START_BIAS (the checked upper bound lies above the
intervals' middle the estimate aims at); when it checks and lies within
CERTIFY_WINDOW of the upper curve's root (by the atlas's slope), it is the answer;
otherwise one Newton step with that slope, shortened when it goes down by
CERTIFY_DAMPING times the first point's miss (a large miss means a poor local curve).
Steering only: every returned sigma is checked by the accountant.

Files written by ``export`` hold each table's monotone envelope (``save(...,
envelope=True)``), so opening one skips computing it.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import _validate as V

__all__ = ["Atlas", "AtlasAnswer", "AtlasRangeError", "monotone_envelope", "open_atlas", "default_atlas_path",
           "ATLAS_AXES"]

#: numeric axes of an atlas, in array order
ATLAS_AXES = ("sigma", "q", "steps", "delta")
ATLAS_FORMAT = 1


def monotone_envelope(up: np.ndarray, lo: np.ndarray, q_cut: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tightest bounds implied by monotonicity, on ``(sigma, q, steps, delta)`` arrays.

    The true eps is non-increasing in sigma and delta and non-decreasing in q and
    steps, so an upper bound at a cell ``c'`` with sigma' <= sigma, q' >= q,
    steps' >= steps, delta' <= delta is an upper bound at ``c``, and a lower bound at
    a cell of the mirrored orthant is a lower bound at ``c``.  Returns
    ``(U*, L*)``: ``U*`` the minimum of ``up`` over each cell's orthant (NaN cells
    ignored; NaN where the orthant has no value), ``L*`` the maximum of ``lo`` over
    the mirrored one.  Both stay certified (pessimistic / optimistic) and
    ``U* <= up``, ``L* >= lo`` wherever those are finite.  Running minima along
    one axis after another give the orthant minimum.

    ``q_cut``: q indices ``>= q_cut`` are a separate family whose cells neither bound nor are
    bounded by those below it (sampling without replacement at q = 1 is the unsampled mechanism,
    not the limit of q -> 1: eps is not monotone across it; :meth:`Atlas.q_cut`).
    """
    return _envelope(up, np.minimum, np.inf, (True, False, False, True), q_cut), \
        _envelope(lo, np.maximum, -np.inf, (False, True, True, False), q_cut)


def _envelope(a: np.ndarray, op, fill: float, forward: tuple, q_cut: int | None) -> np.ndarray:
    """Running ``op`` along the four axes in turn (``forward[axis]``: increasing index, else
    decreasing; in place on flipped views), NaN ignored; the q axis separately on each side of
    ``q_cut``."""
    out = np.where(np.isnan(a), fill, a)
    for axis, fwd in enumerate(forward):
        parts = [out] if axis != 1 or q_cut is None else [out[:, :q_cut], out[:, q_cut:]]
        for part in parts:
            view = part if fwd else np.flip(part, axis=axis)
            op.accumulate(view, axis=axis, out=view)
    out[np.isinf(out)] = np.nan
    return out


def _log_mid(up: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """log of the interval's geometric middle (the upper bound where the lower one is unknown)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(np.where(np.isfinite(lo) & (lo > 0), np.sqrt(np.maximum(lo, 1e-300) * up), up))


def _outward_float32(up: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 copies of certified bounds, rounded outward: ``up32 >= up``, ``lo32 <= lo``."""
    up = np.asarray(up, dtype=np.float64)
    lo = np.asarray(lo, dtype=np.float64)
    with np.errstate(over="ignore"):
        u = up.astype(np.float32)
        l = lo.astype(np.float32)
    u = np.where(u.astype(np.float64) < up, np.nextafter(u, np.float32(np.inf)), u)
    l = np.where(l.astype(np.float64) > lo, np.nextafter(l, np.float32(-np.inf)), l)
    return u, l


def _checked(key, up, lo, shape) -> tuple[np.ndarray, np.ndarray]:
    # float32 tables (export --float32) stay float32: their values are exact, look-ups upcast
    up, lo = (np.asarray(x) for x in (up, lo))
    up, lo = (x if x.dtype in (np.float32, np.float64) else x.astype(float) for x in (up, lo))
    if up.shape != shape or lo.shape != shape:
        raise ValueError(f"atlas arrays for {key} must have shape {shape}")
    return up, lo


class _FileTables(dict):
    """The tables of an atlas file, each (sampling, relation) decompressed on first use: a
    look-up of one key does not pay for the others."""

    def __init__(self, path: str, keys: list):
        super().__init__({k: None for k in keys})
        self.path, self.index, self.shape = path, {k: i for i, k in enumerate(keys)}, None

    def __getitem__(self, key):
        val = super().__getitem__(key)
        if val is None:
            i = self.index[key]
            import zipfile
            import zlib

            try:
                with np.load(self.path) as z:
                    up, lo = z[f"upper_{i}"], z[f"lower_{i}"]
                if not (isinstance(up, np.ndarray) and isinstance(lo, np.ndarray)):
                    raise ValueError("a member is not a numpy array")
            except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
                raise ValueError(f"{self.path}: cannot read the atlas's {key[0]}/{key[1]} table: {e}") from None
            val = _checked(key, up, lo, self.shape)
            super().__setitem__(key, val)
        return val

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def values(self):
        return [self[k] for k in self.keys()]

    def get(self, key, default=None):
        return self[key] if key in self else default


#: columns after a cheap lower curve's crossing where :func:`_first_at_or_below` evaluates the exact one
_CROSS_WINDOW = 6


def _first_at_or_below(cheap: np.ndarray, exact, target: np.ndarray):
    """(j, y[j - 1], y[j]) per row: j the first column where the curve y = ``exact(rows, cols)``
    is at or below ``target`` (-1: nowhere; then the y values are unused), as from whole rows.
    ``cheap`` (n, S) is a lower bound of y, so no column before its crossing (of the target raised
    by 1e-12 relative, for the rounding of ``cheap``) can be the first: y is evaluated on the column before that
    crossing and the _CROSS_WINDOW after it, and in full only on rows whose crossing lies past
    the window."""
    n, S = cheap.shape
    with np.errstate(invalid="ignore", over="ignore"):
        below = cheap <= (target + 1e-12 * (np.abs(target) + 1.0))[:, None]
    jc = np.where(below.any(axis=1), below.argmax(axis=1), -1)
    j = np.full(n, -1)
    y0, y1 = np.full(n, np.nan), np.full(n, np.nan)
    rows = np.nonzero(jc >= 0)[0]
    if rows.size == 0:
        return j, y0, y1
    W = _CROSS_WINDOW
    cols = np.clip(jc[rows, None] - 1 + np.arange(W + 2)[None, :], 0, S - 1)  # jc - 1 .. jc + W
    y = exact(rows, cols)
    ok = (y[:, 1:] <= target[rows, None]) & np.isfinite(y[:, 1:]) & (cols[:, 1:] >= jc[rows, None])
    found = ok.any(axis=1)
    k = ok.argmax(axis=1)
    i = np.arange(rows.size)
    j[rows] = np.where(found, cols[i, k + 1], -1)
    y0[rows], y1[rows] = y[i, k], y[i, k + 1]
    far = rows[~found & (jc[rows] + W < S - 1)]
    if far.size:
        yy = exact(far, np.broadcast_to(np.arange(S), (far.size, S)))
        ok = (yy <= target[far, None]) & np.isfinite(yy)
        jf = np.where(ok.any(axis=1), ok.argmax(axis=1), -1)
        i = np.arange(far.size)
        j[far] = jf
        y0[far], y1[far] = yy[i, np.maximum(jf, 1) - 1], yy[i, np.maximum(jf, 0)]
    return j, y0, y1


def _delta_chord(u_lo: np.ndarray, u_hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Certified upper eps at delta = (1 - t) delta_i + t delta_j (delta_i < delta_j) from upper
    bounds ``u_lo`` at delta_i and ``u_hi`` at delta_j (arrays (n, S); t of shape (n,)).

    The hockey-stick divergence delta(alpha) = sup_S P(S) - alpha Q(S) is convex in alpha = e^eps
    (a supremum of affine functions), and so is a maximum over directions.  The true curve has
    delta(e^{u_lo}) <= delta_i and delta(e^{u_hi}) <= delta_j, so at alpha = (1 - t) e^{u_lo}
    + t e^{u_hi} it is at most (1 - t) delta_i + t delta_j = delta: eps(delta) <= ln alpha
    (docs/MATH.md 9.4).  Rounded up; where ``u_hi`` is unknown or t = 0, ``u_lo``.
    """
    t = np.clip(t, 0.0, 1.0)[:, None]
    u_lo, u_hi = np.asarray(u_lo, dtype=float), np.asarray(u_hi, dtype=float)  # (float32 atlases)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # ln((1 - t) e^a + t e^b) = a + ln(1 + t (e^(b - a) - 1)), b <= a (the envelope falls in delta)
        c = u_lo + np.log1p(t * np.expm1(np.minimum(u_hi - u_lo, 0.0)))
    c = c + 8.0 * np.finfo(float).eps * (np.abs(c) + np.abs(u_lo)) + 1e-300  # the round-off, outward
    use = np.isfinite(c) & np.isfinite(u_lo) & (t > 0.0) & (c < u_lo)
    return np.where(use, c, u_lo)


def _first_chord_below(u_lo: np.ndarray, u_hi: np.ndarray, t: np.ndarray, e: np.ndarray):
    """(j, chord[j]) per row: j the first column whose :func:`_delta_chord` is <= e (-1: none),
    as from the whole rows.  The chord is at least (1 - t) u_lo + t u_hi (concavity of ln; u_lo
    where u_hi is unknown): the cheap curve of :func:`_first_at_or_below`."""
    u_lo, u_hi = np.asarray(u_lo, dtype=float), np.asarray(u_hi, dtype=float)
    tt = np.clip(t, 0.0, 1.0)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        cheap = np.where(np.isfinite(u_hi), (1 - tt) * u_lo + tt * u_hi, u_lo)
    j, _, ce = _first_at_or_below(cheap, lambda r, c: _delta_chord(u_lo[r[:, None], c], u_hi[r[:, None], c], t[r]),
                                  e)
    return j, np.where(j >= 0, ce, np.nan)


def _unpermute(x: np.ndarray, perm: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    out[perm] = x
    return out


class AtlasRangeError(ValueError):
    """A query outside what the atlas covers (names the argument and the covered range)."""


@dataclass
class AtlasAnswer:
    """Result of :meth:`Atlas.sigma_for` (arrays, or floats for scalar queries).

    sigma : certified sigma (NaN where no grid sigma is certified for the query)
    sigma_insufficient : a sigma certified NOT to meet the target (NaN if unknown)
    estimate : interpolated sigma -- an ESTIMATE, no guarantee
    eps_upper : the certified upper eps the certified sigma was read from (or checked at)
    certified_by : "atlas" (grid neighbours) or "accountant" (``certify=True``), per query
    evaluations : accountant evaluations made (``certify=True``)
    """

    sigma: np.ndarray | float
    sigma_insufficient: np.ndarray | float
    estimate: np.ndarray | float
    eps_upper: np.ndarray | float
    certified_by: list | str = "atlas"
    evaluations: int = 0
    notes: list = field(default_factory=list)


class Atlas:
    """An eps atlas: certified eps intervals on ``sigma x q x steps x delta`` per (sampling, relation)."""

    def __init__(self, axes: dict, tables: dict, meta: dict | None = None):
        self.axes = {a: np.asarray(axes[a], dtype=float) for a in ATLAS_AXES}
        for a in ATLAS_AXES:
            v = self.axes[a]
            if v.ndim != 1 or v.size < 1 or np.any(np.diff(v) <= 0):
                raise ValueError(f"atlas axis {a} must be strictly increasing")
        shape = tuple(self.axes[a].size for a in ATLAS_AXES)
        if isinstance(tables, _FileTables):  # read (and checked) one (sampling, relation) at a time
            tables.shape = shape
            self.tables = tables
        else:
            self.tables = {}
            for key, (up, lo) in tables.items():
                self.tables[tuple(key)] = _checked(key, up, lo, shape)
        self.meta = dict(meta or {})
        self._log = {a: np.log(self.axes[a]) for a in ATLAS_AXES}
        self._env = {}

    def envelope(self, sampling: str = "poisson", relation: str = "add_remove") -> tuple[np.ndarray, np.ndarray]:
        """The monotone envelope (:func:`monotone_envelope`) of one table, computed once."""
        up_t, lo_t, _ = self._prepared(sampling, relation)
        return np.moveaxis(up_t, -1, 0), np.moveaxis(lo_t, -1, 0)

    def q_cut(self, sampling: str) -> int | None:
        """Index of q = 1 when it must not bound (or be bounded by) q < 1: every sampling but
        Poisson, whose q -> 1 limit is the unsampled mechanism.  Without replacement under
        add/remove, q < 1 uses a pair of twice the sensitivity, so eps at q = 0.99 is far above
        eps at q = 1 (sigma 2, 100 steps, delta 1e-5: 91.3 against 33.3)."""
        qs = self.axes["q"]
        return qs.size - 1 if sampling != "poisson" and qs.size > 1 and qs[-1] == 1.0 else None

    def _prepared(self, sampling: str, relation: str) -> tuple:
        """The monotone envelope (U*, L*) and the log of the interval's midpoint, each as a
        contiguous (q, steps, delta, sigma) array, computed once: look-ups read whole sigma rows."""
        key = (sampling, relation)
        if key not in self._env:
            if self.meta.get("enveloped"):  # stored as its own envelope (save(envelope=True))
                up, lo = self.tables[key]
            else:
                up, lo = monotone_envelope(*self.tables[key], q_cut=self.q_cut(sampling))
            self._env[key] = tuple(np.ascontiguousarray(np.moveaxis(x, 0, -1)) for x in (up, lo, _log_mid(up, lo)))
        return self._env[key]

    def _few(self, key, boxes) -> tuple:
        """What :meth:`_prepared` gives, on the index box ``boxes`` = ((q_lo, q_hi), (steps_lo,
        steps_hi), (delta_lo, delta_hi)) a few queries read, without the whole table's envelope;
        returns (U*, L*, log middle) on the box and the box's offsets.  U* is the envelope of the
        upper table on q >= q_lo, steps >= steps_lo, delta <= delta_hi (every cell's orthant there
        stays inside), L* that of the lower table on q <= q_hi, steps <= steps_hi, delta >= delta_lo."""
        (q0, q1), (k0, k1), (d0, d1) = boxes
        up, lo = self.tables[key]
        cut = self.q_cut(key[0])
        if self.meta.get("enveloped"):  # the file holds the envelope: the box is a slice of it
            U, L = (x[:, q0 : q1 + 1, k0 : k1 + 1, d0 : d1 + 1] for x in (up, lo))
            out = tuple(np.ascontiguousarray(np.moveaxis(x, 0, -1)) for x in (U, L, _log_mid(U, L)))
            return out + ((q0, k0, d0),)
        U = _envelope(up[:, q0:, k0:, : d1 + 1], np.minimum, np.inf, (True, False, False, True),
                      None if cut is None or cut <= q0 else cut - q0)[:, : q1 - q0 + 1, : k1 - k0 + 1, d0:]
        L = _envelope(lo[:, : q1 + 1, : k1 + 1, d0:], np.maximum, -np.inf, (False, True, True, False),
                      None if cut is None or cut > q1 else cut)[:, q0:, k0:, : d1 - d0 + 1]
        out = tuple(np.ascontiguousarray(np.moveaxis(x, 0, -1)) for x in (U, L, _log_mid(U, L)))
        return out + ((q0, k0, d0),)

    def __repr__(self) -> str:
        ax = ", ".join(f"{a}: {v.size} in [{v[0]:g}, {v[-1]:g}]" for a, v in self.axes.items())
        keys = ", ".join(f"{s}/{r}" for s, r in self.tables)
        return f"<Atlas {ax}; {keys}>"

    # -- files -----------------------------------------------------------------------
    def save(self, path, precision: str = "float64", envelope: bool = False) -> None:
        """Write a compressed ``.npz`` (numpy only; atomic: a temporary file then a rename).

        ``precision="float32"`` halves the file and keeps the bounds certified: each upper
        bound is rounded up and each lower bound down to the nearest float32 (a relative
        loosening of at most 2^-23); look-ups compute in float64 either way.
        ``envelope=True`` stores each table's monotone envelope (:func:`monotone_envelope`:
        tighter or equal bounds, holes filled where monotonicity allows) instead of the computed
        cells, marked in the metadata, so that opening the file skips that pass; look-ups
        answer the same either way.
        """
        if precision not in ("float64", "float32"):
            raise ValueError(f"precision must be 'float64' or 'float32', got {precision!r}")
        arrays = {f"axis_{a}": self.axes[a] for a in ATLAS_AXES}
        keys = []
        for i, (key, (up, lo)) in enumerate(self.tables.items()):
            if envelope:
                up, lo = self.envelope(*key)
            if precision == "float32":
                up, lo = _outward_float32(up, lo)
            arrays[f"upper_{i}"], arrays[f"lower_{i}"] = up, lo
            keys.append(list(key))
        meta = {**self.meta, "format": ATLAS_FORMAT, "keys": keys, "precision": precision,
                "enveloped": bool(envelope or self.meta.get("enveloped", False))}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp.npz")
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, p)

    @classmethod
    def load(cls, path) -> "Atlas":
        p = os.fspath(path)
        if not Path(p).exists():
            raise FileNotFoundError(f"no atlas at {p!r}")
        import zipfile

        try:
            with np.load(p) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                if meta.get("format") != ATLAS_FORMAT:
                    raise ValueError(f"{p}: not a pldlib atlas of format {ATLAS_FORMAT}")
                axes = {a: z[f"axis_{a}"] for a in ATLAS_AXES}
                keys = [tuple(k) for k in meta.pop("keys")]
                names = set(z.files)
                if not all(f"upper_{i}" in names and f"lower_{i}" in names for i in range(len(keys))):
                    raise KeyError("a table named in the atlas's keys is missing")
            tables = _FileTables(p, keys)
        except (zipfile.BadZipFile, KeyError, AttributeError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{p}: not a pldlib atlas (.npz from python -m sweeps.atlas export): {e}") from None
        except IsADirectoryError:
            raise ValueError(f"{p}: a directory, not a pldlib atlas (.npz); the zarr sigma tables of "
                             "earlier versions are replaced by atlases (README: The eps atlas)") from None
        return cls(axes, tables, meta)

    # -- look-ups --------------------------------------------------------------------
    def _index(self, name: str, x: np.ndarray, side: str) -> np.ndarray:
        """Index of the grid neighbour on ``side`` ("up": smallest grid value >= x, "down":
        largest <= x), with a relative tolerance of 1e-9 for grid points."""
        g = self.axes[name]
        tol = 1e-9
        if side == "up":
            i = np.searchsorted(g, x * (1 - tol), side="left")
            bad = i >= g.size
        else:
            i = np.searchsorted(g, x * (1 + tol), side="right") - 1
            bad = i < 0
        if bad.any():
            v = x[np.nonzero(bad)[0][0]]
            raise AtlasRangeError(f"{name}={v:g} is outside the atlas ({name} covers [{g[0]:g}, {g[-1]:g}])")
        return np.clip(i, 0, g.size - 1)

    def _check_range(self, name: str, x: np.ndarray) -> None:
        g = self.axes[name]
        bad = (x < g[0] * (1 - 1e-9)) | (x > g[-1] * (1 + 1e-9))
        if bad.any():
            v = x[np.nonzero(bad)[0][0]]
            raise AtlasRangeError(f"{name}={v:g} is outside the atlas ({name} covers [{g[0]:g}, {g[-1]:g}])")

    def sigma_for(self, epsilon, delta, q, steps, sampling: str = "poisson", relation: str = "add_remove", *,
                  certify: bool = False, outside: str | None = None) -> AtlasAnswer:
        """Certified sigma, certified insufficient sigma and an estimate for each query.

        ``epsilon``, ``delta``, ``q``, ``steps`` broadcast against each other (any
        epsilon > 0; the others inside the atlas's ranges).  Scalars in, floats out.
        With ``certify=True`` each query is also checked by the accountant at its
        exact arguments (see the module docstring); ``sigma`` is then that sigma.

        A query whose answer lies outside the sigma grid -- no grid sigma is certified to meet
        epsilon (the answer lies above the grid), or the smallest grid sigma already is (it lies
        at or below it) -- raises :class:`AtlasRangeError` with ``outside="raise"`` (the default
        for scalar queries), naming epsilon and the eps the grid reaches; with ``outside="nan"``
        (the default for arrays) its ``sigma`` is NaN above the grid and the smallest grid sigma
        below it (certified, not tight).  ``certify=True`` answers either way.
        """
        scalar = all(np.ndim(x) == 0 for x in (epsilon, delta, q, steps))
        e, d, qq, k = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (epsilon, delta, q, steps))
        try:
            e, d, qq, k = np.broadcast_arrays(e, d, qq, k)
        except ValueError:
            raise ValueError("epsilon, delta, q and steps must broadcast to one shape") from None
        e, d, qq, k = (np.ravel(x) for x in (e, d, qq, k))
        if outside is None:
            outside = "raise" if scalar and not certify else "nan"
        V.choice("outside", outside, ("raise", "nan"))
        for name, x, ok in (("epsilon", e, (e > 0) & np.isfinite(e)), ("delta", d, (d > 0) & (d < 1)),
                            ("q", qq, (qq > 0) & (qq <= 1)),
                            ("steps", k, (k >= 1) & np.isfinite(k) & (k == np.floor(k)))):
            if not ok.all():
                bad = x[~ok][0]
                why = {"epsilon": "> 0 and finite", "delta": "in (0, 1)", "q": "in (0, 1]",
                       "steps": "an integer >= 1"}[name]
                raise ValueError(f"{name} must be {why}, got {V.fmt(bad)}")
        for name, x in (("delta", d), ("q", qq), ("steps", k)):
            self._check_range(name, x)
        key = (sampling, relation)
        if key not in self.tables:
            have = ", ".join(f"sampling={s!r}/relation={r!r}" for s, r in self.tables)
            for what, val in (("sampling", sampling), ("relation", relation)):
                if val not in {kk[0 if what == "sampling" else 1] for kk in self.tables}:
                    raise AtlasRangeError(f"{what}={val!r} is not in the atlas (it has {have})")
            raise AtlasRangeError(f"sampling={sampling!r} with relation={relation!r} is not in the atlas "
                                  f"(it has {have})")
        perm = None
        if e.size > _BLOCK and not certify:
            # in the tables' (q, steps, delta) order, the rows read lie near each other in memory
            perm = np.lexsort((d, k, qq))
            e, d, qq, k = e[perm], d[perm], qq[perm], k[perm]
        S = self.axes["sigma"]
        # certified: safe-side neighbours (q up, steps up, delta down)
        iq, ik, idd = self._index("q", qq, "up"), self._index("steps", k, "up"), self._index("delta", d, "down")
        # insufficient: the other neighbours (q down, steps down, delta up)
        jq, jk, jd = self._index("q", qq, "down"), self._index("steps", k, "down"), self._index("delta", d, "up")
        # ... and between the delta below and the delta above, the chord of the convex delta(e^eps)
        D = self.axes["delta"]
        idd_up = np.minimum(idd + 1, D.size - 1)
        if e.size <= _FEW and key not in self._env:
            # a few queries (a CLI call, a calibration seed): the envelope of the boxes they read only
            (a0, a1, _), (b0, b1, _), (c0, c1, _) = (self._bracket(nm, x) for nm, x in
                                                     (("q", qq), ("steps", k), ("delta", d)))
            boxes = [(int(min(v.min() for v in los)), int(max(v.max() for v in his))) for los, his in
                     (((iq, jq, a0), (iq, jq, a1)), ((ik, jk, b0), (ik, jk, b1)), ((idd, jd, c0), (idd_up, jd, c1)))]
            up_t, lo_t, lmid_t, (oq, ok_, od) = self._few(key, boxes)
        else:
            (up_t, lo_t, lmid_t), (oq, ok_, od) = self._prepared(*key), (0, 0, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            tchord = np.where(idd_up > idd, (d - D[idd]) / (D[idd_up] - D[idd]), 0.0)
        n = e.size
        sigma, eps_up, insufficient = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        jcert = np.full(n, -1)
        for s0 in range(0, n, _BLOCK):  # blocks of whole sigma rows that stay in cache
            b = slice(s0, min(n, s0 + _BLOCK))
            j, ce = _first_chord_below(up_t[iq[b] - oq, ik[b] - ok_, idd[b] - od],
                                       up_t[iq[b] - oq, ik[b] - ok_, idd_up[b] - od], tchord[b], e[b])
            jcert[b] = j
            sigma[b] = np.where(j >= 0, S[np.maximum(j, 0)], np.nan)
            eps_up[b] = np.where(j >= 0, ce, np.nan)
            bad = lo_t[jq[b] - oq, jk[b] - ok_, jd[b] - od] > e[b, None]  # NaN compares False: unknown
            last = np.where(bad.any(axis=1), S.size - 1 - bad[:, ::-1].argmax(axis=1), -1)
            insufficient[b] = np.where(last >= 0, S[np.maximum(last, 0)], np.nan)
        est = self._estimate(e, d, qq, k, lmid_t, (oq, ok_, od), hint=jcert)
        cut = self.q_cut(sampling)
        apart = np.zeros(n, dtype=bool)
        if cut is not None:  # q < 1 whose q-up neighbour is q = 1 of another family: not covered
            apart = (iq >= cut) & (qq < 1.0)
            sigma[apart] = eps_up[apart] = est[apart] = np.nan
        if outside == "raise" and not certify:
            self._raise_outside(jcert, apart, e, d, qq, k, up_t, iq - oq, ik - ok_, idd - od, idd_up - od, tchord,
                                perm)
        if perm is not None:  # back to the queries' order
            sigma, insufficient, est, eps_up = (_unpermute(x, perm) for x in (sigma, insufficient, est, eps_up))
        ans = AtlasAnswer(sigma, insufficient, est, eps_up, certified_by=["atlas"] * sigma.size)
        if certify:
            ans = self._certify(ans, e, d, qq, k, sampling, relation)
        if scalar:
            return AtlasAnswer(float(ans.sigma[0]), float(ans.sigma_insufficient[0]), float(ans.estimate[0]),
                               float(ans.eps_upper[0]), ans.certified_by[0], ans.evaluations, ans.notes)
        return ans

    def _raise_outside(self, jcert, apart, e, d, qq, k, up_t, iq, ik, idd, idd_up, tchord, perm) -> None:
        """AtlasRangeError for the first query whose answer lies outside the sigma grid, in the
        queries' own order: ``jcert`` < 0 (no grid sigma certified: above it), or the first grid
        sigma certified is the first with a certified bound at all (nothing in the grid says a
        smaller sigma falls short: at or below it)."""
        S = self.axes["sigma"]
        known = np.isfinite(up_t[iq, ik, idd])  # (n, S): grid sigmas holding a certified upper eps
        first = np.where(known.any(axis=1), known.argmax(axis=1), -1)
        bad = ((jcert < 0) | ((jcert >= 0) & (jcert <= first))) & ~apart
        if not bad.any():
            return
        order = np.arange(e.size) if perm is None else perm  # (sorted position -> query index)
        i = int(np.nonzero(bad)[0][np.argmin(order[bad])])
        # the certified upper eps of the delta chord at the first known and at the last grid sigma
        cols = [max(int(first[i]), 0), S.size - 1]
        rows = [up_t[iq[i], ik[i], idd[i]][cols][None, :], up_t[iq[i], ik[i], idd_up[i]][cols][None, :]]
        top, bottom = _delta_chord(*rows, tchord[i : i + 1])[0]
        what = (f"epsilon={V.fmt(float(e[i]))}, delta={V.fmt(float(d[i]))}, q={V.fmt(float(qq[i]))}, "
                f"steps={int(k[i])}")
        if jcert[i] < 0:
            reach = (f"at its largest sigma {S[-1]:.6g} the certified eps is {bottom:.6g}" if math.isfinite(bottom)
                     else f"it holds no certified eps at its largest sigma {S[-1]:.6g}")
            raise AtlasRangeError(f"{what}: the sigma needed lies above the atlas's sigma range "
                                  f"[{S[0]:.6g}, {S[-1]:.6g}] ({reach}); use pldlib.calibrate (or certify=True)")
        low = S[cols[0]]
        raise AtlasRangeError(f"{what}: already met at the smallest sigma the atlas certifies here, {low:.6g} "
                              f"(eps <= {top:.6g} there), so the smallest sigma meeting it lies at or below the "
                              f"atlas's sigma range [{S[0]:.6g}, {S[-1]:.6g}]; use pldlib.calibrate (or certify=True)")

    def _bracket(self, name: str, x: np.ndarray) -> tuple:
        """Grid indices (i0, i0 + 1) around x on axis ``name`` and the weight of i0 + 1 (in logs)."""
        g = self._log[name]
        lx = np.log(x)
        i0 = np.clip(np.searchsorted(g, lx, side="right") - 1, 0, max(g.size - 2, 0))
        i1 = np.minimum(i0 + 1, g.size - 1)
        span = g[i1] - g[i0]
        w = np.where(span > 0, (lx - g[i0]) / np.where(span > 0, span, 1.0), 0.0)
        return i0, i1, np.clip(w, 0.0, 1.0)

    def _delta_parts(self, d, qq, k, lmid_t, off=(0, 0, 0), cols=None) -> tuple:
        """(p0, p1, w) for each query: log eps on the sigma grid, bilinear in (log q, log steps),
        at the grid deltas below (p0) and above (p1) its delta, and delta's weight w on p1 (in log
        delta).  Between them the estimate takes eps itself linear in log delta,
        ln((1 - w) e^p0 + w e^p1): near delta(0) log eps bends sharply (3.9% -> 1.2% max error
        over log eps linear).  ``lmid_t`` may be a box of the table starting at ``off``; ``cols``
        (n, W), if given, are the sigma columns to read per query (else all)."""
        (a0, a1, wa), (b0, b1, wb), (c0, c1, wc) = (self._bracket(name, x) for name, x in
                                                     (("q", qq), ("steps", k), ("delta", d)))
        a0, a1, b0, b1, c0, c1 = a0 - off[0], a1 - off[0], b0 - off[1], b1 - off[1], c0 - off[2], c1 - off[2]
        if cols is None:
            def read(ia, ib, ic):
                return lmid_t[ia, ib, ic]
        else:
            flat, (_, nb, nc, ns) = lmid_t.reshape(-1), lmid_t.shape  # (lmid_t is contiguous)

            def read(ia, ib, ic):
                return flat.take((((ia * nb + ib) * nc + ic) * ns)[:, None] + cols)
        parts = []
        for ic in (c0, c1):
            part = None
            for ia, fa in ((a0, 1 - wa), (a1, wa)):
                for ib, fb in ((b0, 1 - wb), (b1, wb)):
                    term = (fa * fb)[:, None] * read(ia, ib, ic)
                    part = term if part is None else part + term
            parts.append(part)
        return parts[0], parts[1], wc

    @staticmethod
    def _delta_mix(p0, p1, w) -> np.ndarray:
        """ln((1 - w) e^p0 + w e^p1), w broadcast along the rows."""
        w = np.asarray(w)[:, None]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return np.log((1 - w) * np.exp(p0) + w * np.exp(p1))

    def _estimate(self, e, d, qq, k, lmid_t, off=(0, 0, 0), hint=None) -> np.ndarray:
        """Interpolated sigma (an estimate): the curve of :meth:`_delta_parts` on the sigma grid,
        then log sigma linear in log eps.  ``lmid_t``: see :meth:`_prepared`.

        ``hint`` (sigma column per query, e.g. the certified sigma's; -1: none): the curve is
        first read on the _EST_WINDOW columns ending just past it.  The curve falls in sigma
        (the envelope is monotone), so where the window's crossing has a finite value above the
        target just before it, no earlier column can be at or below the target: the answer is
        the whole row's.  Other queries are read in full."""
        out = np.full(e.size, np.nan)
        S = self._log["sigma"].size
        todo = np.arange(e.size)
        if hint is not None and S > 2 * _EST_WINDOW:
            W = _EST_WINDOW
            has = np.nonzero(hint >= 0)[0]
            c0 = np.clip(hint[has] - (W - 3), 0, S - W)
            cols = c0[:, None] + np.arange(W)[None, :]
            val, ok = np.full(has.size, np.nan), np.zeros(has.size, dtype=bool)
            for s in range(0, has.size, _BLOCK):
                sl = slice(s, min(has.size, s + _BLOCK))
                r = has[sl]
                val[sl], ok[sl] = self._invert(e[r], d[r], qq[r], k[r], lmid_t, off, cols[sl])
            out[has[ok]] = val[ok]
            todo = np.setdiff1d(todo, has[ok], assume_unique=True)
        for s in range(0, todo.size, _BLOCK):  # (blocks that stay in cache: 3x faster than 20,000)
            r = todo[s : s + _BLOCK]
            out[r] = self._invert(e[r], d[r], qq[r], k[r], lmid_t, off, None)[0]
        return out

    def _invert(self, e, d, qq, k, lmid_t, off, cols) -> tuple:
        """(estimate, exact) per query on the sigma columns ``cols`` (None: all); ``exact``: the
        crossing found is the whole row's (always, when reading all columns)."""
        ls = self._log["sigma"] if cols is None else self._log["sigma"][cols]
        p0, p1, w = self._delta_parts(d, qq, k, lmid_t, off, cols)
        target = np.log(e)
        # the curve lies above (1 - w) p0 + w p1 (Jensen): evaluate it near that one's crossing
        with np.errstate(invalid="ignore"):
            cheap = (1 - w)[:, None] * p0 + w[:, None] * p1
        jj, y0, y1 = _first_at_or_below(cheap, lambda r, c: self._delta_mix(p0[r[:, None], c], p1[r[:, None], c],
                                                                             w[r]), target)
        # invert log eps(log sigma) (decreasing) at log epsilon, per query: log-linear between
        # the last sigma above the target and the first at or below it
        j1 = np.maximum(jj, 1)
        t = np.where((y0 - y1) > 0, (y0 - target) / np.where((y0 - y1) > 0, y0 - y1, 1.0), 0.0)
        if cols is None:
            lo_s, hi_s = ls[j1 - 1], ls[j1]
            exact = np.ones(e.size, dtype=bool)
        else:
            i = np.arange(e.size)
            lo_s, hi_s = ls[i, j1 - 1], ls[i, j1]
            with np.errstate(invalid="ignore"):
                exact = (jj >= 1) & np.isfinite(y0) & (y0 > target)
        val = lo_s + np.clip(t, 0.0, 1.0) * (hi_s - lo_s)
        val = np.where(jj == 0, np.nan, val)  # target above the curve's top: below the atlas's sigma range
        return np.where(jj >= 1, np.exp(val), np.nan), exact

    def _certify(self, ans: AtlasAnswer, e, d, qq, k, sampling, relation) -> AtlasAnswer:
        """Check each query with the accountant at its exact arguments (docstring of the module)."""
        from .calibrate import calibrate, upper_interval
        from .mechanisms import Gaussian
        from .methods.pld import account

        sig = np.array(ans.sigma, dtype=float)
        eps_up = np.array(ans.eps_upper, dtype=float)
        by = list(ans.certified_by)
        evals = 0
        notes = list(ans.notes)
        for i in range(e.size):
            samp = "none" if qq[i] == 1.0 else sampling

            spacing = []

            def upper(s):
                # a quarter of calibrate's steering spacing: the upper bound's excess over the
                # truth (~c h^2) drops 16-fold, to ~0.1-0.2% of eps, so the sigma found is as tight
                # as calibrate's (whose final spacing comes from a Richardson estimate).  The
                # spacing of the first sigma serves the second (within a few percent of it).
                m = Gaussian(sigma=float(s), q=float(qq[i]), sampling=samp, relation=relation)
                if not spacing:
                    spacing.append(upper_interval(m, int(k[i])))
                h = spacing[0]
                for f in (CERTIFY_REFINE, 2.0, 1.0):
                    try:
                        acc = account(m, int(k[i]), spacing=h / f, lower_bound=False)
                        return float(acc.epsilon(float(d[i])).upper)
                    except MemoryError:  # GridTooLargeError: a coarser (still certified) grid
                        if f == 1.0:
                            raise

            s0 = ans.estimate[i]
            done = False
            if math.isfinite(s0):
                try:
                    # local slope of log eps in log sigma from the atlas's interpolated curve (a
                    # wrong slope only costs a fall-back)
                    slope = self._slope(e[i], d[i], qq[i], k[i], sampling, relation, s0)
                    sl = slope if slope is not None and slope < -0.05 else None
                    # the estimate aims at the middle of the atlas's intervals; the upper bound
                    # checked here sits above the truth, so start a little higher
                    s0 = s0 * (1 + CERTIFY_START_BIAS)
                    u0 = upper(s0)
                    evals += 1
                    s1 = s0 * (u0 / e[i]) ** 0.5 if u0 > 0 else s0
                    # s0 feasible and within CERTIFY_WINDOW (in sigma) of the upper curve's root
                    close = u0 > 0 and math.log(e[i] / u0) <= (abs(sl) * CERTIFY_WINDOW if sl else 0.005)
                    if u0 <= e[i] and close:
                        sig[i], eps_up[i], done = s0, u0, True
                    else:
                        # one Newton-like step using the atlas's slope at s0
                        if sl is not None:
                            step = (math.log(e[i]) - math.log(u0)) / sl
                            if step < 0:
                                # downwards from a feasible s0, a step past the root costs a third
                                # evaluation: shorten it by the atlas's miss at s0 (a large miss
                                # means a poor local curve, whose slope is then too shallow)
                                step /= 1.0 + CERTIFY_DAMPING * abs(math.log(u0 / e[i]))
                            s1 = s0 * math.exp(step) * (1 + 1e-3)
                        u1 = upper(s1)
                        evals += 1
                        if u1 <= e[i]:
                            sig[i], eps_up[i], done = s1, u1, True
                        elif u0 <= e[i]:
                            sig[i], eps_up[i], done = s0, u0, True
                            if s0 > s1 * 1.005 and u1 > u0 > 0:
                                # the root is bracketed by (s1, s0): one secant step (log-log), kept
                                # only if it checks, makes the answer as tight as calibrate's
                                t = (math.log(u1) - math.log(e[i])) / (math.log(u1) - math.log(u0))
                                s2 = math.exp(math.log(s1) + t * (math.log(s0) - math.log(s1))) * (1 + 5e-4)
                                if s1 < s2 < s0:
                                    u2 = upper(s2)
                                    evals += 1
                                    if u2 <= e[i]:
                                        sig[i], eps_up[i] = s2, u2
                except (ArithmeticError, MemoryError, ValueError) as exc:
                    notes.append(f"query {i}: {type(exc).__name__}: {exc}")
            if not done:
                try:
                    res = calibrate(epsilon=float(e[i]), delta=float(d[i]), q=float(qq[i]), steps=int(k[i]),
                                    sampling=sampling if qq[i] < 1 else "none", relation=relation,
                                    sigma_guess=float(s0) if math.isfinite(s0) else None, table=None,
                                    certify_lower=False)
                    sig[i], eps_up[i] = res.sigma, float(res.epsilon.upper)
                    evals += res.evaluations
                except Exception as exc:  # keep the atlas's certified sigma
                    notes.append(f"query {i}: calibrate failed ({type(exc).__name__}: {exc}); atlas answer kept")
                    continue
            by[i] = "accountant"
        return AtlasAnswer(sig, ans.sigma_insufficient, ans.estimate, eps_up, by, evals, notes)

    def _slope(self, e, d, q, k, sampling, relation, s0) -> float | None:
        """d log eps / d log sigma of the atlas's interpolated curve at s0 (an estimate).  Without
        the table's cached envelope, only the box of cells the curve reads is enveloped."""
        key = (sampling, relation)
        d, q, k = (np.array([float(x)]) for x in (d, q, k))
        if key in self._env:
            lmid, off = self._env[key][2], (0, 0, 0)
        else:
            boxes = tuple((int(i0[0]), int(i1[0])) for i0, i1, _ in (self._bracket(name, x) for name, x in
                                                                      (("q", q), ("steps", k), ("delta", d))))
            *_, lmid, off = self._few(key, boxes)
        a = self._delta_mix(*self._delta_parts(d, q, k, lmid, off))[0]
        ls = self._log["sigma"]
        good = np.isfinite(a)
        if good.sum() < 2:
            return None
        x = math.log(s0)
        j = int(np.clip(np.searchsorted(ls, x) - 1, 0, ls.size - 2))
        if not (good[j] and good[j + 1]):
            return None
        return float((a[j + 1] - a[j]) / (ls[j + 1] - ls[j]))


#: sigma columns the estimate reads first, ending two past the certified sigma's (:meth:`Atlas._estimate`)
_EST_WINDOW = 16
#: queries per block of a vectorised look-up (their sigma rows stay in cache)
_BLOCK = 2_000
#: up to this many queries, a look-up without the table's cached envelope computes it only on the
#: boxes of cells the queries read (a fresh process's first query: ~0.05 s instead of ~0.4 s)
_FEW = 16
#: ``certify=True`` evaluates at this fraction of calibrate's steering spacing (upper_interval)
CERTIFY_REFINE = 4.0
#: ``certify=True`` starts at the estimate times (1 + this): the estimate aims at the middle of the
#: atlas's eps intervals, the checked upper bound lies above it (measured: estimates 0.36% below
#: calibrate's sigma at the median over 170 queries)
CERTIFY_START_BIAS = 0.003
#: a downward step of ``certify=True`` is divided by 1 + this x |ln(u0 / epsilon)| (u0: the first
#: sigma's checked eps): measured over the 200 verify queries, the atlas's local slope is too shallow
#: by up to ~30% where its value misses by >10%
CERTIFY_DAMPING = 3.0
#: a first sigma that checks and lies within this relative distance of the upper curve's root
#: (by the atlas's slope) is returned after one evaluation
CERTIFY_WINDOW = 0.0035


def open_atlas(path) -> Atlas:
    """Load an atlas ``.npz`` (numpy only: no xarray, no zarr)."""
    return Atlas.load(path)


def default_atlas_path() -> str | None:
    """The curated atlas: ``$PLDLIB_ATLAS`` or ``results/atlas/atlas.npz`` of the source
    checkout; None if neither exists (``PLDLIB_ATLAS=`` disables it)."""
    env = os.environ.get("PLDLIB_ATLAS")
    if env is not None:
        return env or None
    p = Path(__file__).resolve().parent.parent / "results" / "atlas" / "atlas.npz"
    return str(p) if p.exists() else None
