"""Sweep kind ``sigma_table``: build certified sigma lookup tables on a Dask cluster.

A table config (YAML, see ``configs/sigma_table.yaml``) names a grid of
targets and mechanism settings::

    kind: sigma_table
    name: ...
    store: results/sigma_table/sigma_table.zarr
    grid: {epsilon: [...], delta: [...], q: [...], steps: [...],
           sampling: [poisson, wor], relation: [add_remove]}
    options: {sigma_ratio: 1.25, sigma_min: 0.1, sigma_max: 20000, refine: 2, margin: 0.002}

Plan -> tasks -> chunks: one task per ``(q, sampling, relation)`` row answers
every (epsilon, delta, steps) of that row, and is exactly one zarr chunk of
every variable, written from the driver as the task finishes (data first,
``status`` last as the commit marker).  An interrupted build resumes: rows
whose status is ok are kept; a store made from another config is refused.

What one row task does, for each steps value k (MATH.md section 9):

1. **eps cube** -- the certified PLD interval eps(delta) for all deltas at once,
   on a geometric sigma grid (ratio ``sigma_ratio``) that brackets every target:
   seeded by the Gaussian-DP (CLT) estimate for the largest and the smallest
   target, then extended until each target has a feasible grid sigma (certified
   upper <= target) and, where the lower bound allows, an infeasible one;
2. **inversion on the safe side** (:func:`pldlib.tables.invert_on_safe_side`): the
   smallest grid sigma whose certified upper meets the target;
3. **refinement** (``refine`` rounds): for each target, the sigma where the
   log-log interpolation of the upper bound between the bracketing grid points
   meets ``target * (1 - margin)`` is evaluated, all evaluations join the cube
   and the inversion is redone.  Every stored sigma is a point where the
   accountant certified upper eps <= target; interpolation only proposes.

The PLD interval for the cube uses the library's accuracy rule without the
optimistic-side edge constraint (which forces tiny grids for tiny q): the
upper bounds stay certified and tight, the lower bounds (used only for
``sigma_infeasible``) may be loose.

Run: ``python -m sweeps.tables run CONFIG [--workers N] [--scheduler ADDR]
[--store PATH] [--restart]`` and ``python -m sweeps.tables show STORE``.
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

__all__ = ["TableConfig", "load_table_config", "parse_table_config", "compute_row", "build_table", "main"]

TABLE_AXES = ("epsilon", "delta", "q", "steps", "sampling", "relation")
DEFAULT_OPTIONS = {"sigma_ratio": 1.25, "sigma_min": 0.1, "sigma_max": 2.0e4, "refine": 2,
                   "margin": 2.0e-3, "max_bins": None}


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
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError("config", f"cannot read {os.fspath(path)!r}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError("config", f"{os.fspath(path)!r} is not valid YAML: {e}") from None
    return parse_table_config(data, source=os.fspath(path))


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
    a cell's own failure: cells without a certified sigma are NaN with a note."""
    import pldlib

    E, D, K = len(epsilons), len(deltas), len(steps)
    deltas = np.asarray(deltas, dtype=float)
    out = {k: np.full((E, D, K), np.nan) for k in ("sigma", "eps_upper", "eps_lower", "sigma_infeasible")}
    out["evaluations"] = np.zeros(K, dtype=np.int32)
    notes = []
    r, smin, smax = options["sigma_ratio"], options["sigma_min"], options["sigma_max"]
    kw = {"max_bins": options["max_bins"]} if options.get("max_bins") else {}
    for ik, k in enumerate(steps):
        k = int(k)
        pts: dict[float, tuple[np.ndarray, np.ndarray]] = {}

        def ev(s):
            s = float(min(max(s, smin), smax))
            if s in pts:
                return pts[s]
            mech = _mechanism(s, q, sampling, relation)
            try:
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    acc = pldlib.account(mech, steps=k, interval=_cube_interval(mech, k), **kw)
                    iv = acc.epsilon(deltas)
                v = (np.asarray(iv.lower, dtype=float), np.asarray(iv.upper, dtype=float))
            except (pldlib.PrecisionLimitError, pldlib.GridTooLargeError, OverflowError,
                    FloatingPointError, ValueError) as e:
                notes.append(f"steps={k} sigma={s:.6g}: {type(e).__name__}: {str(e)[:160]}")
                v = (np.full(D, np.nan), np.full(D, np.nan))
            pts[s] = v
            return v

        def arrays():
            ss = np.array(sorted(pts))
            return ss, np.array([pts[s][0] for s in ss]), np.array([pts[s][1] for s in ss])

        s_hi = seed_sigma(min(epsilons), float(deltas.min()), q, k, sampling, relation)
        s_lo = seed_sigma(max(epsilons), float(deltas.max()), q, k, sampling, relation)
        n = max(2, int(math.ceil(math.log(max(s_hi, s_lo * r) / s_lo) / math.log(r))) + 1)
        for s in s_lo * r ** np.arange(-1, n + 1):
            ev(s)
        # extend until every target has a feasible and (where possible) an infeasible point
        for _ in range(40):
            ss, lo, up = arrays()
            need_up = any(not np.any(up[:, j] <= e) for e in epsilons for j in range(D))
            need_down = any(not np.any(lo[:, j] > e) for e in epsilons for j in range(D))
            moved = False
            if need_up and ss[-1] < smax:
                ev(ss[-1] * r * r)
                moved = True
            # below: only while the smallest point is still feasible for some target
            feas_at_min = np.any(np.isfinite(up[0]) & (up[0] <= max(epsilons)))
            if (need_down or feas_at_min) and ss[0] > smin and (feas_at_min or np.isfinite(up[0]).any()):
                if feas_at_min or np.all(np.isfinite(lo[0])):
                    ev(ss[0] / (r * r))
                    moved = True
            if not moved:
                break
        for rnd in range(int(options["refine"])):
            ss, lo, up = arrays()
            cands = set()
            for e in epsilons:
                goal = e * (1.0 - options["margin"])
                for j in range(D):
                    i_f, _ = pldlib.tables.invert_on_safe_side(ss, up[:, j], lo[:, j], e)
                    if i_f is None or i_f == 0:
                        continue
                    s0, s1, u0, u1 = ss[i_f - 1], ss[i_f], up[i_f - 1, j], up[i_f, j]
                    if s1 / s0 < 1.0 + 1e-3 or not (np.isfinite(u0) and u0 > e >= u1 > 0):
                        continue
                    if rnd == 0 and u0 > goal >= u1:  # interpolate log eps vs log sigma
                        t = (math.log(goal) - math.log(u0)) / (math.log(u1) - math.log(u0))
                        cands.add(float(math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0)))))
                    else:  # later rounds: bisect the remaining bracket in log sigma
                        cands.add(float(math.sqrt(s0 * s1)))
            if not cands:
                break
            kept = []
            for c in sorted(cands):  # candidates within 0.05% of each other: evaluate one
                if not kept or c > kept[-1] * 1.0005:
                    kept.append(c)
            for c in kept:
                ev(c)
        ss, lo, up = arrays()
        out["evaluations"][ik] = len(ss)
        for ie, e in enumerate(epsilons):
            for j in range(D):
                i_f, i_i = pldlib.tables.invert_on_safe_side(ss, up[:, j], lo[:, j], e)
                if i_f is not None:
                    if i_f == 0 and ss[0] > smin * (1 + 1e-12):
                        pass  # the grid did not reach below: still certified, maybe not tight
                    out["sigma"][ie, j, ik] = ss[i_f]
                    out["eps_upper"][ie, j, ik] = up[i_f, j]
                    out["eps_lower"][ie, j, ik] = lo[i_f, j]
                else:
                    notes.append(f"steps={k} eps={e:g} delta={deltas[j]:g}: no sigma <= "
                                 f"{smax:g} certified")
                if i_i is not None:
                    out["sigma_infeasible"][ie, j, ik] = ss[i_i]
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
            "eps_lower": var(np.float64, np.nan, {"long_name": "certified lower eps at sigma"}),
            "sigma_infeasible": var(np.float64, np.nan, {"long_name": "a sigma certified NOT to meet the "
                                                         "target (lower eps > epsilon); NaN if unknown"}),
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
                    rounding="look-ups round epsilon down, delta down, q up, steps up (MATH.md section 9)",
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
                scheduler: str | None = None, restart: bool = False, progress: bool = True, say=print) -> str:
    """Build (or resume) a sigma table; returns the store path."""
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
    own = None
    if client is None:
        client, own, desc = make_client(scheduler, workers, max_needed=len(rows))
        say(f"running on {desc}")
    ax = cfg.axes
    try:
        futs = {}
        for idx in rows:
            spec = {"index": idx, "q": ax["q"][idx[0]], "sampling": ax["sampling"][idx[1]],
                    "relation": ax["relation"][idx[2]], "steps": list(ax["steps"]), "deltas": list(ax["delta"]),
                    "epsilons": list(ax["epsilon"]), "options": cfg.options}
            futs[client.submit(_row_task, spec, pure=False, retries=2)] = idx
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
        if own is not None:
            client.close()
            own.close()
    return store


def summary(store: str) -> str:
    """A short text summary of a table store."""
    import xarray as xr

    with _quiet():
        ds = xr.open_zarr(store, chunks=None, consolidated=False)
    st = np.asarray(ds["status"].values)
    lines = [f"{store}: {ds.attrs.get('name')} ({ds.attrs.get('kind')})",
             "  " + ", ".join(f"{d}: {ds.sizes[d]}" for d in TABLE_AXES),
             f"  entries: {int((st == 1).sum())} ok, {int((st == 2).sum())} failed, {int((st == 0).sum())} missing",
             f"  compute time: {float(np.nansum(ds['seconds'].values)):.1f} s over "
             f"{int(np.isfinite(ds['seconds'].values).sum())} rows"]
    errs = [e for e in np.asarray(ds["error"].values).ravel() if e]
    for e in errs[:5]:
        lines.append(f"  note: {e[:200]}")
    return "\n".join(lines)


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
        else:
            if not os.path.exists(args.store):
                raise ConfigError("store", f"no table at {args.store!r}")
            print(summary(args.store))
    except ConfigError as e:
        print(f"sweeps.tables: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
