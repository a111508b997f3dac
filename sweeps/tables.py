"""Sweep kind ``sigma_table``: build certified sigma lookup tables on a Dask cluster.

A table config (YAML, see ``configs/sigma_table.yaml``) names a grid of
targets and mechanism settings::

    kind: sigma_table
    name: ...
    store: results/sigma_table/sigma_table.zarr
    grid: {epsilon: [...], delta: [...], q: [...], steps: [...],
           sampling: [poisson, wor], relation: [add_remove]}
    options: {sigma_ratio: 1.25, sigma_min: 0.1, sigma_max: 20000, refine: 2, margin: 0.002,
              eps_lower: true}

Plan -> tasks -> chunks: one task per ``(q, sampling, relation)`` row answers
every (epsilon, delta, steps) of that row, and is exactly one zarr chunk of
every variable, written from the driver as the task finishes (data first,
``status`` last as the commit marker).  An interrupted build resumes: rows
whose status is ok are kept; a store made from another config is refused.

What one row task does, for each steps value k (docs/MATH.md section 9):

1. **eps cube** -- the certified PLD *upper* bound eps(delta) for all deltas at once,
   on a geometric sigma grid (ratio ``sigma_ratio``) that brackets every target:
   seeded by the Gaussian-DP (CLT) estimate for the largest and the smallest
   target, then extended until each target has a feasible grid sigma (certified
   upper <= target) with a grid sigma below it whose upper bound exceeds the target;
2. **inversion on the safe side** (:func:`pldlib.tables.invert_on_safe_side`): the
   smallest grid sigma whose certified upper meets the target;
3. **refinement** (up to ``refine`` rounds): for each target not yet within
   ``margin`` of its bracket (in sigma) or two margins of the target (in eps),
   regula falsi (Illinois rule) in log eps vs log sigma between the bracketing
   points proposes the sigma where the upper bound meets ``target * (1 - margin)``;
   the proposals are evaluated, join the cube, and the inversion is redone.  Every
   stored sigma is a point where the accountant certified upper eps <= target;
   interpolation only proposes;
4. **lower bounds** (``eps_lower: true``): one full evaluation per distinct stored
   sigma at spacing min(:data:`LOWER_SPACING` x the search spacing, |ln(1-q)|/2)
   gives ``eps_lower`` and ``sigma_infeasible`` (the largest of those sigmas whose
   certified lower bound exceeds the target: loose, it is another target's sigma).
   Skipped (NaN) where that spacing would be finer than the search spacing (tiny
   q: resolving the optimistic side there would cost more than the search), and
   NaN where the lower bound found is not positive (uninformative).

Steps 1-3 evaluate the pessimistic side only (``pldlib.account(...,
lower_bound=False)``: about half the work of a full evaluation) on the grid
spacing :func:`pldlib.calibrate.upper_interval` (the library's accuracy rule
without the optimistic-side constraint h <= |ln(1-q)|/2, which forces tiny
grids for tiny q): the upper bounds are certified at any spacing and tight at
this one.  A delta that cannot be certified at some sigma (floating-point
round-off, e.g. delta = 1e-8 with 1e5+ steps) is NaN there without losing the
other deltas.

Run: ``sweeps run CONFIG [--workers N] [--scheduler ADDR] [--store PATH]
[--restart] [--retries N]`` (or ``python -m sweeps.tables run CONFIG ...``);
``sweeps status STORE`` / ``sweeps show STORE [--sel epsilon=1 ...]`` (or
``python -m sweeps.tables show STORE``).  A build exits 1 when some entries have
no certified sigma (listed as notes by ``status``).  ``python -m sweeps.tables
verify STORE`` re-checks random off-grid queries with the accountant at its default
accuracy and compares entries with ``pldlib.calibrate`` (:func:`verify_table`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np

from .config import ConfigError, _axis, _number
from .store import _quiet as _quiet_consolidated


from contextlib import contextmanager


@contextmanager
def _quiet():
    """Silence zarr's notices about consolidated metadata and v3 string dtypes."""
    with _quiet_consolidated(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")
        yield

__all__ = ["TableConfig", "load_table_config", "parse_table_config", "compute_row", "build_table", "main",
           "is_table_store", "summary", "show_text", "entry_counts", "verify_table"]

TABLE_AXES = ("epsilon", "delta", "q", "steps", "sampling", "relation")
DEFAULT_OPTIONS = {"sigma_ratio": 1.25, "sigma_min": 0.1, "sigma_max": 2.0e4, "refine": 2,
                   "margin": 2.0e-3, "max_bins": None, "eps_lower": True}
#: the full evaluation that gives a stored sigma its ``eps_lower`` uses at most this many
#: times the upper-bound spacing of the search, at most |ln(1-q)|/2 (the accountant's rule
#: for the optimistic side) and never less than the search spacing (else it is skipped)
LOWER_SPACING = 4.0


@dataclass(frozen=True)
class TableConfig:
    name: str
    store: str
    axes: dict
    options: dict
    source: str | None = None

    def canonical(self) -> dict:
        return {"kind": "sigma_table", "axes": {k: list(v) for k, v in self.axes.items()},
                "options": dict(sorted(self.options.items()))}

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.canonical(), sort_keys=True).encode()).hexdigest()


def parse_table_config(data, source: str | None = None) -> TableConfig:
    """Validate a table config mapping; errors name the field (ConfigError)."""
    if not isinstance(data, dict):
        raise ConfigError("config", "must be a mapping")
    if data.get("kind") != "sigma_table":
        raise ConfigError("kind", f"must be 'sigma_table' for a table config, got {data.get('kind')!r}")
    unknown = set(data) - {"kind", "name", "description", "store", "grid", "options"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown key (known: kind, name, description, store, grid, options)")
    name = str(data.get("name") or "sigma_table")
    store = data.get("store")
    if not isinstance(store, str) or not store:
        raise ConfigError("store", "must be a path or URL")
    grid = data.get("grid")
    if not isinstance(grid, dict):
        raise ConfigError("grid", "must be a mapping of axes")
    extra = set(grid) - set(TABLE_AXES)
    if extra:
        raise ConfigError(f"grid.{sorted(extra)[0]}", f"unknown axis (known: {', '.join(TABLE_AXES)})")
    axes = {}
    for ax in TABLE_AXES:
        if ax not in grid:
            raise ConfigError(f"grid.{ax}", "is missing")
        if ax == "epsilon":
            vals = _axis(f"grid.{ax}", "sigma", grid[ax])  # positive finite numbers
        else:
            vals = _axis(f"grid.{ax}", ax, grid[ax])
        axes[ax] = tuple(sorted(vals)) if ax not in ("sampling", "relation") else vals
    if "none" in axes["sampling"]:
        raise ConfigError("grid.sampling", "use poisson or wor (q = 1 covers no subsampling)")
    opts = dict(DEFAULT_OPTIONS)
    given = data.get("options") or {}
    if not isinstance(given, dict):
        raise ConfigError("options", "must be a mapping")
    for k, v in given.items():
        if k not in DEFAULT_OPTIONS:
            raise ConfigError(f"options.{k}", f"unknown option (known: {', '.join(DEFAULT_OPTIONS)})")
        if k == "eps_lower":
            if not isinstance(v, bool):
                raise ConfigError(f"options.{k}", f"must be true or false, got {v!r}")
            opts[k] = v
            continue
        if k in ("refine", "max_bins"):
            if v is None and k == "max_bins":
                opts[k] = None
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"options.{k}", f"must be an integer >= 0, got {v!r}")
            opts[k] = int(v)
        else:
            x = _number(f"options.{k}", v)
            if not (x > 0 and math.isfinite(x)):
                raise ConfigError(f"options.{k}", f"must be > 0 and finite, got {v!r}")
            opts[k] = x
    if opts["sigma_ratio"] <= 1.0:
        raise ConfigError("options.sigma_ratio", f"must be > 1, got {opts['sigma_ratio']!r}")
    if opts["sigma_min"] >= opts["sigma_max"]:
        raise ConfigError("options.sigma_min", "must be < options.sigma_max")
    if opts["margin"] >= 0.5:
        raise ConfigError("options.margin", "must be < 0.5")
    return TableConfig(name=name, store=store, axes=axes, options=opts, source=source)


def load_table_config(path) -> TableConfig:
    from .config import read_config_data

    return parse_table_config(read_config_data(path), source=os.fspath(path))


# -- the row task ------------------------------------------------------------------
def _mechanism(sigma, q, sampling, relation):
    import pldlib

    samp = "none" if q >= 1.0 else sampling
    return pldlib.Gaussian(sigma=float(sigma), q=float(q), sampling=samp, relation=relation)


def _cube_interval(mech, steps: int) -> float:
    """The accountant's accuracy rule for the upper bound (:func:`pldlib.calibrate.upper_interval`)."""
    from pldlib.calibrate import upper_interval

    return upper_interval(mech, steps)


def seed_sigma(epsilon, delta, q, steps, sampling, relation) -> float:
    from pldlib.calibrate import seed_sigma as s

    return s(epsilon, delta, q, steps, sampling, relation)


def compute_row(q: float, sampling: str, relation: str, steps, deltas, epsilons, options: dict) -> dict:
    """One row of the table: arrays of shape (epsilon, delta, steps).  Never raises for
    a cell's own failure: cells without a certified sigma are NaN with a note.

    The search and the refinement use *upper-only* evaluations (``pldlib.account(...,
    lower_bound=False)``, the pessimistic side only: about half the work) at the
    upper-bound spacing :func:`pldlib.calibrate.upper_interval`; the inversion needs
    nothing else.  With ``options["eps_lower"]`` every distinct stored sigma then gets one
    full evaluation (step 4 of the module doc) for ``eps_lower`` and ``sigma_infeasible``.
    """
    import pldlib
    from pldlib.tables import invert_on_safe_side

    E, D, K = len(epsilons), len(deltas), len(steps)
    deltas = np.asarray(deltas, dtype=float)
    out = {k: np.full((E, D, K), np.nan) for k in ("sigma", "eps_upper", "eps_lower", "sigma_infeasible")}
    out["evaluations"] = np.zeros(K, dtype=np.int32)
    notes = []
    r, smin, smax = options["sigma_ratio"], options["sigma_min"], options["sigma_max"]
    margin = options["margin"]
    kw = {"max_bins": options["max_bins"]} if options.get("max_bins") else {}
    errors = (pldlib.PrecisionLimitError, pldlib.GridTooLargeError, OverflowError, FloatingPointError,
              ValueError, MemoryError)
    for ik, k in enumerate(steps):
        k = int(k)
        pts: dict[float, np.ndarray] = {}  # sigma -> certified upper eps for every delta
        n_full = 0

        def evaluate(s, full):
            """(lower, upper) eps for every delta; a delta that cannot be certified at this
            sigma (PrecisionLimitError) is NaN without losing the others.  A full evaluation
            whose optimistic side cannot be resolved at the coarse spacing returns None."""
            mech = _mechanism(s, q, sampling, relation)
            h = _cube_interval(mech, k)
            if full:
                # the optimistic side needs h <= |ln(1-q)|/2 (the accountant's own rule); a full
                # evaluation finer than the search spacing is not cheap: skip it (NaN)
                h_l = LOWER_SPACING * h if q >= 1.0 else min(LOWER_SPACING * h, 0.5 * abs(math.log1p(-q)))
                if h_l < h:
                    return None
                h = h_l
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                acc = pldlib.account(mech, steps=k, interval=h, lower_bound=full, **kw)
                try:
                    iv = acc.epsilon(deltas)
                    return np.asarray(iv.lower, dtype=float), np.asarray(iv.upper, dtype=float)
                except pldlib.PrecisionLimitError as e:
                    lo, up = np.full(D, np.nan), np.full(D, np.nan)
                    for j, d in enumerate(deltas):
                        try:
                            iv = acc.epsilon(float(d))
                            lo[j], up[j] = iv.lower, iv.upper
                        except pldlib.PrecisionLimitError as e:
                            notes.append(f"steps={k} sigma={s:.6g} delta={d:g}: {str(e)[:160]}")
                    if not np.isfinite(up).any():
                        raise
                    return lo, up

        def ev(s):
            s = float(min(max(s, smin), smax))
            if s not in pts:
                try:
                    pts[s] = evaluate(s, False)[1]
                except errors as e:
                    notes.append(f"steps={k} sigma={s:.6g}: {type(e).__name__}: {str(e)[:160]}")
                    pts[s] = np.full(D, np.nan)
            return pts[s]

        def arrays():
            ss = np.array(sorted(pts))
            return ss, np.array([pts[s] for s in ss])

        def first_feasible(ss, up, e, j):
            return invert_on_safe_side(ss, up[:, j], np.full(len(ss), -np.inf), e)[0]

        # 1. the eps cube on a geometric sigma grid bracketing every target
        s_hi = seed_sigma(min(epsilons), float(deltas.min()), q, k, sampling, relation)
        s_lo = seed_sigma(max(epsilons), float(deltas.max()), q, k, sampling, relation)
        n = max(2, int(math.ceil(math.log(max(s_hi, s_lo * r) / s_lo) / math.log(r))) + 1)
        for s in s_lo * r ** np.arange(-1, n + 1):
            ev(s)
        # extend until every target has a feasible point (certified upper <= target) with
        # an infeasible-looking one (upper > target) below it
        for _ in range(40):
            ss, up = arrays()
            moved = False
            if any(not np.any(up[:, j] <= e) for e in epsilons for j in range(D)) and ss[-1] < smax:
                ev(ss[-1] * r * r)
                moved = True
            if np.any(np.isfinite(up[0]) & (up[0] <= max(epsilons))) and ss[0] > smin:
                ev(ss[0] / (r * r))
                moved = True
            if not moved:
                break
        # 2.-3. invert on the safe side and refine.  The root of the upper curve inside the
        # bracket (s0: upper > target, s1: certified upper <= target) is estimated by inverse
        # quadratic interpolation of log sigma in log eps through the bracket and its nearest
        # neighbour, else linearly (Illinois rule: a bracket end kept from the previous round
        # has its weight halved, so a curved eps(sigma) cannot pin it).  A target whose
        # estimated root is within `margin` below s1 is done; otherwise root * (1 + margin/2)
        # is evaluated.
        kept_end: dict = {}
        lm = math.log1p(margin)
        for _ in range(int(options["refine"])):
            ss, up = arrays()
            cands = set()
            for e in epsilons:
                le = math.log(e)
                for j in range(D):
                    i_f = first_feasible(ss, up, e, j)
                    if i_f is None or i_f == 0:
                        continue
                    s0, s1, u0, u1 = ss[i_f - 1], ss[i_f], up[i_f - 1, j], up[i_f, j]
                    if not np.isfinite(u0) and u1 > 0 and s1 / s0 > 1.0 + margin:
                        # no certified value below s1 (e.g. round-off at tiny delta): bisect
                        cands.add(float(math.sqrt(s0 * s1)))
                        continue
                    if not (np.isfinite(u0) and u0 > e >= u1 > 0):
                        continue
                    x0, x1, y0, y1 = math.log(s0), math.log(s1), math.log(u0), math.log(u1)
                    f0, f1 = y0 - le, y1 - le
                    prev = kept_end.get((e, j))
                    n_kept = prev[2] + 1 if prev is not None and (prev[0] == s0 or prev[1] == s1) else 0
                    if n_kept and prev[0] == s0:
                        f0 *= 0.5 ** n_kept
                    elif n_kept:
                        f1 *= 0.5 ** n_kept
                    kept_end[(e, j)] = (s0, s1, n_kept)
                    root = x0 + f0 / (f0 - f1) * (x1 - x0)
                    third = [i for i in (i_f - 2, i_f + 1)
                             if 0 <= i < len(ss) and np.isfinite(up[i, j]) and up[i, j] > 0]
                    if third:
                        i2 = min(third, key=lambda i: abs(math.log(ss[i]) - 0.5 * (x0 + x1)))
                        pts3 = sorted([(x0, y0), (x1, y1), (math.log(ss[i2]), math.log(up[i2, j]))])
                        xs, ys = [p[0] for p in pts3], [p[1] for p in pts3]
                        if ys[0] > ys[1] > ys[2]:  # decreasing: log sigma is a function of log eps
                            x_iqi = sum(xs[a] * math.prod((le - ys[b]) / (ys[a] - ys[b]) for b in range(3)
                                                          if b != a) for a in range(3))
                            if x0 < x_iqi < x1:
                                root = x_iqi
                    if x1 - root <= lm:
                        continue  # s1 is within a margin of the estimated root
                    c = min(max(root + 0.5 * lm, x0 + 0.02 * (x1 - x0)), x0 + 0.98 * (x1 - x0))
                    cands.add(float(math.exp(c)))
            if not cands:
                break
            kept = []
            for c in sorted(cands):  # candidates within 0.01% of each other: evaluate one
                if not kept or c > kept[-1] * 1.0001:
                    kept.append(c)
            for c in kept:
                ev(c)
        ss, up = arrays()
        chosen = {}
        for ie, e in enumerate(epsilons):
            for j in range(D):
                i_f = first_feasible(ss, up, e, j)
                if i_f is None:
                    notes.append(f"steps={k} eps={e:g} delta={deltas[j]:g}: no sigma <= {smax:g} certified")
                    continue
                out["sigma"][ie, j, ik] = ss[i_f]
                out["eps_upper"][ie, j, ik] = up[i_f, j]
                chosen.setdefault(float(ss[i_f]), []).append((ie, j))
        # 4. certified lower bounds at the stored sigmas: one full evaluation each, coarser
        if options.get("eps_lower", True):
            lows = {}
            for s in sorted(chosen):
                try:
                    v = evaluate(s, True)
                    if v is not None:
                        lows[s] = v[0]
                        n_full += 1
                except errors as e:
                    notes.append(f"steps={k} sigma={s:.6g} (lower bound): {type(e).__name__}: {str(e)[:120]}")
            for s, cells in chosen.items():
                if s in lows:
                    for ie, j in cells:
                        lo = lows[s][j]
                        out["eps_lower"][ie, j, ik] = lo if lo > 0 else np.nan
            for ie, e in enumerate(epsilons):  # largest evaluated sigma certified NOT to meet e
                for j in range(D):
                    bad = [s for s, lo in lows.items() if np.isfinite(lo[j]) and lo[j] > e]
                    if bad:
                        out["sigma_infeasible"][ie, j, ik] = max(bad)
        out["evaluations"][ik] = len(pts) + n_full
    out["error"] = "; ".join(dict.fromkeys(notes))[:2000]
    return out


def _row_task(spec: dict) -> dict:
    import pldlib.tables  # noqa: F401

    t0 = time.perf_counter()
    try:
        res = compute_row(spec["q"], spec["sampling"], spec["relation"], spec["steps"], spec["deltas"],
                          spec["epsilons"], spec["options"])
    except Exception as e:  # the row fails, the build goes on
        E, D, K = len(spec["epsilons"]), len(spec["deltas"]), len(spec["steps"])
        res = {k: np.full((E, D, K), np.nan) for k in ("sigma", "eps_upper", "eps_lower", "sigma_infeasible")}
        res["evaluations"] = np.zeros(K, dtype=np.int32)
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
    res["seconds"] = time.perf_counter() - t0
    res["index"] = spec["index"]
    return res


# -- the store -----------------------------------------------------------------------
def _skeleton(cfg: TableConfig):
    import dask.array as da
    import xarray as xr

    import pldlib
    from pldlib.tables import TABLE_KIND

    ax = cfg.axes
    shape = tuple(len(ax[d]) for d in TABLE_AXES)
    E, D, Q, K, S, R = shape
    chunks = (E, D, 1, K, 1, 1)
    coords = {d: np.asarray(ax[d]) for d in TABLE_AXES}
    coords["steps"] = np.asarray(ax["steps"], dtype=np.int64)

    def var(dtype, fill, attrs):
        return (TABLE_AXES, da.full(shape, fill, chunks=chunks, dtype=dtype), attrs)

    rdims = ("q", "sampling", "relation")
    ds = xr.Dataset(
        {
            "sigma": var(np.float64, np.nan, {"long_name": "certified noise multiplier: PLD upper "
                                              "eps(delta) <= epsilon verified at this grid point"}),
            "eps_upper": var(np.float64, np.nan, {"long_name": "certified upper eps at sigma"}),
            "eps_lower": var(np.float64, np.nan, {"long_name": "certified lower eps at sigma (one full "
                                                  "evaluation at a spacing of 1-4x the search's); NaN where "
                                                  "skipped (tiny q), not positive, or not computed"}),
            "sigma_infeasible": var(np.float64, np.nan, {"long_name": "a sigma certified NOT to meet the "
                                                         "target (lower eps > epsilon), from the lower-bound "
                                                         "evaluations (loose); NaN if unknown"}),
            "status": var(np.int8, 0, {"codes": "0 missing, 1 ok, 2 failed (no certified sigma)"}),
            "seconds": (rdims, da.full((Q, S, R), np.nan, chunks=(1, 1, 1)), {"units": "s",
                                                                              "long_name": "row compute time"}),
            "evaluations": (("q", "steps", "sampling", "relation"),
                            da.zeros((Q, K, S, R), chunks=(1, K, 1, 1), dtype=np.int32),
                            {"long_name": "PLD evaluations per steps value"}),
            "error": (rdims, da.full((Q, S, R), "", chunks=(1, 1, 1), dtype="<U2000"), {}),
        },
        coords=coords,
    )
    ds.attrs.update(kind=TABLE_KIND, name=cfg.name, fingerprint=cfg.fingerprint(),
                    config=json.dumps(cfg.canonical()), pldlib_version=pldlib.__version__,
                    rounding="look-ups round epsilon down, delta down, q up, steps up (docs/MATH.md section 9)",
                    created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return ds


def _prepare(cfg: TableConfig, store: str, restart: bool) -> np.ndarray:
    """Create or check the store; returns the row status (q, sampling, relation): True if done."""
    import shutil

    import xarray as xr

    from .config import check_store_writable

    exists = os.path.exists(os.path.join(store, "zarr.json")) or os.path.exists(os.path.join(store, ".zgroup"))
    if exists and not restart:
        with _quiet():
            ds = xr.open_zarr(store, chunks=None, consolidated=False)
        if ds.attrs.get("fingerprint") != cfg.fingerprint():
            raise ConfigError("store", f"{store!r} holds a table made from another config; "
                                       "use --restart to start over (or another --store)")
        st = np.asarray(ds["status"].values)
        return (st == 1).all(axis=(0, 1, 3))
    if os.path.exists(store) and not exists and os.listdir(store):
        raise ConfigError("store", f"{store!r} exists and is not a table store; refusing to overwrite")
    check_store_writable(store)
    if exists:
        shutil.rmtree(store)
    with _quiet():
        _skeleton(cfg).to_zarr(store, mode="w", compute=True, consolidated=False)
    Q, S, R = (len(cfg.axes[d]) for d in ("q", "sampling", "relation"))
    return np.zeros((Q, S, R), dtype=bool)


def _write_row(store: str, idx: tuple, res: dict) -> None:
    import xarray as xr

    iq, isamp, irel = idx
    region = {"q": slice(iq, iq + 1), "sampling": slice(isamp, isamp + 1), "relation": slice(irel, irel + 1)}
    E, D, K = res["sigma"].shape

    def cell(a):
        return xr.Variable(TABLE_AXES, np.asarray(a).reshape(E, D, 1, K, 1, 1))

    status = np.where(np.isfinite(res["sigma"]), 1, 2).astype(np.int8)
    data = xr.Dataset({
        "sigma": cell(res["sigma"]), "eps_upper": cell(res["eps_upper"]), "eps_lower": cell(res["eps_lower"]),
        "sigma_infeasible": cell(res["sigma_infeasible"]),
        "seconds": xr.Variable(("q", "sampling", "relation"), np.full((1, 1, 1), res["seconds"])),
        "evaluations": xr.Variable(("q", "steps", "sampling", "relation"),
                                   np.asarray(res["evaluations"], dtype=np.int32).reshape(1, K, 1, 1)),
        "error": xr.Variable(("q", "sampling", "relation"), np.full((1, 1, 1), res["error"], dtype="<U2000")),
    })
    commit = xr.Dataset({"status": cell(status)})
    full = {"epsilon": slice(0, E), "delta": slice(0, D), "steps": slice(0, K), **region}
    with _quiet():
        data.to_zarr(store, region={d: full[d] for d in data.dims}, mode="r+", consolidated=False)
        commit.to_zarr(store, region={d: full[d] for d in TABLE_AXES}, mode="r+", consolidated=False)


def build_table(cfg: TableConfig | str, *, store: str | None = None, client=None, workers: int | None = None,
                scheduler: str | None = None, restart: bool = False, progress: bool = True, say=print,
                retries: int = 2) -> str:
    """Build (or resume) a sigma table; returns the store path.  ``retries``: Dask retries
    of a row task after a transient error (a lost worker)."""
    from distributed import as_completed

    from .execute import Progress, make_client

    if not isinstance(cfg, TableConfig):
        cfg = load_table_config(cfg)
    store = store or cfg.store
    done = _prepare(cfg, store, restart)
    rows = [(iq, isamp, irel) for iq in range(done.shape[0]) for isamp in range(done.shape[1])
            for irel in range(done.shape[2]) if not done[iq, isamp, irel]]
    say(f"sigma table {cfg.name!r}: {done.size} rows, {done.size - len(rows)} already done, "
        f"{len(rows)} to compute -> {store}")
    if not rows:
        return store
    own, made = None, client is None
    if made:  # our own client (to --scheduler, or to an embedded cluster): closed below
        client, own, desc = make_client(scheduler, workers, max_needed=len(rows))
        say(f"running on {desc}")
    ax = cfg.axes
    try:
        futs = {}
        for idx in rows:
            spec = {"index": idx, "q": ax["q"][idx[0]], "sampling": ax["sampling"][idx[1]],
                    "relation": ax["relation"][idx[2]], "steps": list(ax["steps"]), "deltas": list(ax["delta"]),
                    "epsilons": list(ax["epsilon"]), "options": cfg.options}
            futs[client.submit(_row_task, spec, pure=False, retries=retries)] = idx
        bar = Progress(len(rows), enabled=progress)
        for fut in as_completed(futs):
            idx = futs[fut]
            try:
                res = fut.result()
            except Exception as e:  # a lost worker after retries: record the row as failed
                E, D, K = (len(ax[d]) for d in ("epsilon", "delta", "steps"))
                res = {k: np.full((E, D, K), np.nan) for k in ("sigma", "eps_upper", "eps_lower", "sigma_infeasible")}
                res.update(evaluations=np.zeros(K, dtype=np.int32), seconds=np.nan,
                           error=f"task lost: {type(e).__name__}: {e}"[:2000])
            _write_row(store, idx, res)
            bar.update(failed=not np.all(np.isfinite(res["sigma"])))
    finally:
        if made:
            client.close()
        if own is not None:
            own.close()
    return store


def is_table_store(path: str) -> bool:
    """Whether ``path`` holds a sigma table store (zarr attrs ``kind: pldlib.sigma_table``)."""
    from pldlib.tables import TABLE_KIND

    from .store import read_attrs

    attrs = read_attrs(path) if path and ("://" in path or os.path.exists(path)) else None
    return bool(attrs) and attrs.get("kind") == TABLE_KIND


def _open(store: str):
    import xarray as xr

    if not is_table_store(store):
        raise ConfigError("store", f"{store!r} is not a sigma table store (nothing there, or not a "
                                   "pldlib.sigma_table)")
    with _quiet():
        return xr.open_zarr(store, chunks=None, consolidated=False)


def entry_counts(store: str) -> dict:
    """``{"ok": n, "failed": n, "missing": n, "total": n}`` over the table's entries."""
    st = np.asarray(_open(store)["status"].values)
    return {"ok": int((st == 1).sum()), "failed": int((st == 2).sum()), "missing": int((st == 0).sum()),
            "total": int(st.size)}


def summary(store: str) -> str:
    """A short text summary of a table store."""
    ds = _open(store)
    st = np.asarray(ds["status"].values)
    lines = [f"{store}: {ds.attrs.get('name')} ({ds.attrs.get('kind')})",
             "  " + ", ".join(f"{d}: {ds.sizes[d]}" for d in TABLE_AXES),
             f"  entries: {int((st == 1).sum())} ok, {int((st == 2).sum())} failed, {int((st == 0).sum())} missing",
             f"  compute time: {float(np.nansum(ds['seconds'].values)):.1f} s over "
             f"{int(np.isfinite(ds['seconds'].values).sum())} rows",
             "  look-ups: pldlib.tables.open(STORE).sigma_for(epsilon, delta, q, steps, sampling, relation); "
             "sigma by steps x q: sweeps show STORE [--sel epsilon=1 delta=1e-6 ...]"]
    errs = [e for e in np.asarray(ds["error"].values).ravel() if e]
    for e in errs[:5]:
        lines.append(f"  note: {e[:200]}")
    return "\n".join(lines)


def show_text(store: str, sel_items=(), max_tables: int = 50) -> str:
    """Certified sigma, steps x q, one table per remaining (epsilon, delta, sampling,
    relation) after ``sel_items`` (``["epsilon=1", "delta=1e-6"]``; numbers match within 1%).
    ``-`` marks an entry without a certified sigma."""
    ds = _open(store)
    for it in sel_items or ():
        if "=" not in it:
            raise ConfigError("--sel", f"{it}: expected key=value (e.g. epsilon=1)")
        k, v = (x.strip() for x in it.split("=", 1))
        if k not in TABLE_AXES:
            raise ConfigError("--sel", f"{it}: unknown dimension {k!r} of a sigma table (use {', '.join(TABLE_AXES)})")
        vals = list(ds.indexes[k])
        if k in ("sampling", "relation"):
            if v not in vals:
                raise ConfigError("--sel", f"{k}={v}: no such value (have {', '.join(map(str, vals))})")
            pick = v
        else:
            try:
                x = float(v)
            except ValueError:
                raise ConfigError("--sel", f"{k}={v}: not a number") from None
            arr = np.asarray(vals, dtype=float)
            i = int(np.argmin(np.abs(arr - x)))
            if not math.isclose(arr[i], x, rel_tol=0.01):
                raise ConfigError("--sel", f"{k}={v}: no such value (have {', '.join(f'{a:g}' for a in arr)})")
            pick = vals[i]
        ds = ds.sel({k: [pick]})
    other = ("epsilon", "delta", "sampling", "relation")
    combos = [(a, b, c, d) for a in ds.indexes["epsilon"] for b in ds.indexes["delta"]
              for c in ds.indexes["sampling"] for d in ds.indexes["relation"]]
    if len(combos) > max_tables:
        raise ConfigError("--sel", f"{len(combos)} tables would be printed (at most {max_tables}); narrow it "
                                   "with --sel, e.g. epsilon=1 delta=1e-6")
    from .report import _grid_table

    lines = []
    for combo in combos:
        sub = ds.sel(dict(zip(other, combo)))
        lines.append(f"certified sigma: epsilon={combo[0]:g} delta={combo[1]:g} sampling={combo[2]} "
                     f"relation={combo[3]}")
        sig = sub["sigma"].transpose("steps", "q").values
        st = sub["status"].transpose("steps", "q").values
        cells = [[f"{sig[i, j]:.5g}" if st[i, j] == 1 and np.isfinite(sig[i, j]) else "-"
                  for j in range(sig.shape[1])] for i in range(sig.shape[0])]
        lines += _grid_table("steps", [str(k) for k in ds.indexes["steps"]],
                             [f"q={x:g}" for x in ds.indexes["q"]], cells)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def verify_table(store: str, queries: int = 25, grid_points: int = 25, seed: int = 0, say=print) -> dict:
    """Re-check a table with the accountant (independently of how it was built).

    ``queries`` random off-grid queries (epsilon, delta, q, steps log-uniform over the
    table's ranges, sampling and relation uniform): the answered sigma must have a
    certified upper eps(delta) <= epsilon at the accountant's *default* accuracy
    (a violation otherwise); its ratio to ``pldlib.calibrate(tol=1e-3,
    certify_lower=False)`` (certified, and within about tol of the root of the upper
    curve) for the same query shows what the safe-side rounding costs.  ``grid_points`` random grid points:
    table sigma / calibrated sigma (the tightness of the entries themselves).
    """
    import pldlib
    from pldlib.tables import open_table

    t = open_table(store)
    ax = t.axes
    rng = np.random.default_rng(seed)

    def logu(lo, hi):
        return float(10 ** rng.uniform(math.log10(lo), math.log10(hi)))

    def calibrated(e, d, q, k, samp, rel):
        try:
            return pldlib.calibrate(e, d, q, k, sampling=samp, relation=rel, tol=1e-3, certify_lower=False).sigma
        except Exception:  # noqa: BLE001 - reported as NaN
            return float("nan")

    rec = {"violations": 0, "checked": 0, "unanswered": 0, "uncheckable": 0, "off_grid_ratio": [],
           "grid_ratio": [], "worst_margin": None, "rows": []}
    for _ in range(queries):
        e = logu(ax["epsilon"].min(), ax["epsilon"].max())
        d = logu(ax["delta"].min(), ax["delta"].max())
        q = logu(ax["q"].min(), ax["q"].max())
        k = int(round(logu(ax["steps"].min(), ax["steps"].max())))
        samp = str(rng.choice(ax["sampling"]))
        rel = str(rng.choice(ax["relation"]))
        try:
            a = t.sigma_for(e, d, q, k, samp, rel)
        except (KeyError, ValueError) as ex:
            rec["unanswered"] += 1
            say(f"  unanswered: eps={e:.4g} delta={d:.3g} q={q:.4g} steps={k} {samp}: {str(ex)[:120]}")
            continue
        try:
            up = float(pldlib.account(_mechanism(a.sigma, q, samp, rel), steps=k).epsilon(d).upper)
        except (pldlib.PrecisionLimitError, pldlib.GridTooLargeError) as ex:
            rec["uncheckable"] += 1
            say(f"  not re-checkable: eps={e:.4g} delta={d:.3g} q={q:.4g} steps={k} {samp}: {str(ex)[:120]}")
            continue
        rec["checked"] += 1
        rec["violations"] += int(not up <= e)
        margin = up / e
        rec["worst_margin"] = margin if rec["worst_margin"] is None else max(rec["worst_margin"], margin)
        c = calibrated(e, d, q, k, samp, rel)
        rec["off_grid_ratio"].append(a.sigma / c)
        rec["rows"].append((e, d, q, k, samp, a.sigma, up, c))
        say(f"  eps={e:.4g} delta={d:.3g} q={q:.4g} steps={k} {samp}: sigma {a.sigma:.5g} "
            f"(upper eps {up:.5g}{' VIOLATION' if not up <= e else ''}; calibrated {c:.5g}, "
            f"ratio {a.sigma / c:.4f}) [{a.describe()}]")
    ok = np.argwhere(np.asarray(t.ds["status"].values) == 1)
    rng = np.random.default_rng(seed)  # the grid sample does not depend on the number of queries
    for i in rng.choice(len(ok), size=min(grid_points, len(ok)), replace=False):
        ie, j, iq, ik, isamp, irel = ok[i]
        e, d, q, k = (float(ax["epsilon"][ie]), float(ax["delta"][j]), float(ax["q"][iq]), int(ax["steps"][ik]))
        samp, rel = str(ax["sampling"][isamp]), str(ax["relation"][irel])
        s = float(t.ds["sigma"].values[tuple(ok[i])])
        c = calibrated(e, d, q, k, samp, rel)
        rec["grid_ratio"].append(s / c)
        say(f"  grid eps={e:g} delta={d:g} q={q:g} steps={k} {samp}: table {s:.6g} / calibrated {c:.6g} "
            f"= {s / c:.5f}")
    for key in ("off_grid_ratio", "grid_ratio"):
        v = np.asarray(rec[key], dtype=float)
        v = v[np.isfinite(v)]
        rec[key + "_summary"] = ({"n": int(v.size), "median": float(np.median(v)), "min": float(v.min()),
                                  "max": float(v.max())} if v.size else {"n": 0})
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweeps.tables", description="Build certified sigma lookup tables.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="build or resume a table from a config")
    r.add_argument("config")
    r.add_argument("--store")
    r.add_argument("--workers", type=int)
    r.add_argument("--scheduler")
    r.add_argument("--restart", action="store_true")
    r.add_argument("--no-progress", action="store_true")
    s = sub.add_parser("show", help="summary of a table store")
    s.add_argument("store")
    v = sub.add_parser("verify", help="re-check random off-grid queries and grid points with the accountant")
    v.add_argument("store")
    v.add_argument("--queries", type=int, default=25)
    v.add_argument("--grid-points", type=int, default=25)
    v.add_argument("--seed", type=int, default=0)
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        if args.cmd == "run":
            if args.workers is not None and args.workers < 1:
                raise ConfigError("--workers", f"must be >= 1, got {args.workers}")
            path = build_table(args.config, store=args.store, workers=args.workers, scheduler=args.scheduler,
                               restart=args.restart, progress=not args.no_progress)
            print(summary(path))
            n = entry_counts(path)
            return 0 if n["ok"] == n["total"] else 1
        if not os.path.exists(args.store):
            raise ConfigError("store", f"no table at {args.store!r}")
        if args.cmd == "verify":
            rec = verify_table(args.store, args.queries, args.grid_points, args.seed)
            print(f"off-grid queries: {rec['checked']} re-checked at the accountant's default accuracy, "
                  f"{rec['violations']} violations (largest upper eps / target "
                  f"{rec['worst_margin'] if rec['worst_margin'] is not None else float('nan'):.5f}); "
                  f"{rec['unanswered']} unanswered, {rec['uncheckable']} not re-checkable")
            print(f"table sigma / calibrated sigma, off-grid queries: {rec['off_grid_ratio_summary']}")
            print(f"table sigma / calibrated sigma, grid points: {rec['grid_ratio_summary']}")
            return 1 if rec["violations"] else 0
        print(summary(args.store))
    except ConfigError as e:
        print(f"sweeps.tables: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
