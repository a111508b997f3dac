"""The eps atlas: a sweep store exported for certified sigma look-ups (:mod:`pldlib.atlas`).

An atlas is an ordinary sweep (``sweeps run configs/atlas.yaml``: the Gaussian
mechanism, method ``pld``, one accountant per (sigma, q, sampling, relation)
answering every steps value and delta of its row).  This module is the
post-processing step: :func:`export` reads the store's certified
``eps_upper`` / ``eps_lower`` and writes one ``.npz`` that
:class:`pldlib.atlas.Atlas` loads with numpy alone; :func:`verify` re-checks
random off-grid queries against the accountant and ``pldlib.calibrate``.

Command line::

    python -m sweeps.atlas export results/atlas/atlas.zarr [MORE.zarr ...] results/atlas/atlas.npz
    python -m sweeps.atlas verify results/atlas/atlas.npz --n 200 --seed 0 [--calibrate]
    python -m sweeps.atlas lookup STORE.zarr --epsilon 2 --delta 1e-6 --q 0.01 --steps 1000

``lookup`` answers from the sweep store itself (:class:`StoreLookup`), reading about
log2(number of sigma values) + 1 chunks of ``eps_upper``; the ``.npz`` atlas answers many
queries fast and more tightly (monotone envelope, delta chord).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from .store import StoreError

__all__ = ["export", "atlas_from_store", "merge_atlases", "verify", "lookup", "StoreLookup", "main"]


def atlas_from_store(store: str, method: str = "pld"):
    """An :class:`pldlib.atlas.Atlas` from a sweep store (Gaussian mechanism, ``method``).

    Cells that failed (or were not computed) are NaN: a NaN upper bound certifies
    nothing and a NaN lower bound proves nothing, so look-ups skip them.
    """
    from pldlib.atlas import Atlas

    from .store import open_dataset

    ds = open_dataset(store)
    if ds.attrs.get("mechanism", "gaussian") != "gaussian":
        raise ValueError(f"{store}: an atlas needs the gaussian mechanism, got {ds.attrs.get('mechanism')!r}")
    methods = [str(m) for m in ds["method"].values]
    if method not in methods:
        raise ValueError(f"{store}: no method {method!r} in the store (it has {', '.join(methods)})")
    ds = ds.isel(method=methods.index(method))
    axes = {a: np.asarray(ds[a].values, dtype=float) for a in ("sigma", "q", "steps", "delta")}
    order = {a: np.argsort(v) for a, v in axes.items()}
    idx = np.ix_(order["sigma"], order["q"], order["steps"], order["delta"])
    dims = ("sigma", "q", "steps", "delta")
    tables = {}
    for s in ds["sampling"].values:
        for r in ds["relation"].values:
            sub = ds.sel(sampling=s, relation=r)
            ok = sub["status"].transpose(*dims).values == 1  # STATUS_OK: computed, not failed
            up = np.where(ok, sub["eps_upper"].transpose(*dims).values, np.nan)
            lo = np.where(ok, sub["eps_lower"].transpose(*dims).values, np.nan)
            tables[(str(s), str(r))] = (up[idx], lo[idx])
    axes = {a: v[order[a]] for a, v in axes.items()}
    meta = {"source_store": str(store), "method": method, "fingerprint": ds.attrs.get("sweeps_fingerprint", ""),
            "pldlib_version": ds.attrs.get("pldlib_version", ""), "exported_at": time.time()}
    return Atlas(axes, tables, meta)


#: axis values of different stores within this relative distance are the same grid point
_SAME = 1e-9


def _union_axis(values: list) -> np.ndarray:
    """Sorted union of several axes, values within _SAME (relative) of each other merged."""
    allv = np.sort(np.concatenate([np.asarray(v, dtype=float) for v in values]))
    out = [allv[0]]
    for x in allv[1:]:
        if abs(x - out[-1]) > _SAME * max(abs(x), abs(out[-1])):
            out.append(x)
    return np.array(out)


def _positions(axis: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index in ``axis`` of each of ``values`` (each is within _SAME of one point)."""
    idx = np.clip(np.searchsorted(axis, values * (1 - _SAME)), 0, axis.size - 1)
    if not np.all(np.abs(axis[idx] - values) <= _SAME * np.abs(values)):
        raise AssertionError("axis values lost in the union")  # (never: the union holds them)
    return idx


def merge_atlases(atlases: list):
    """One :class:`pldlib.atlas.Atlas` on the union of the grids of ``atlases`` (sweeps of
    the same mechanism over different, e.g. adjacent, parts of a grid).  A cell takes the value
    of the atlas that computed it; cells no atlas computed are NaN (look-ups read the
    monotone envelope, :func:`pldlib.atlas.monotone_envelope`, which fills them soundly from the
    computed cells that dominate them).  Two atlases computing the same cell must agree (the same
    sweep of the same code gives the same numbers); else ValueError."""
    from pldlib.atlas import ATLAS_AXES, Atlas

    if len(atlases) == 1:
        return atlases[0]
    axes = {a: _union_axis([at.axes[a] for at in atlases]) for a in ATLAS_AXES}
    shape = tuple(axes[a].size for a in ATLAS_AXES)
    keys = list(dict.fromkeys(k for at in atlases for k in at.tables))
    tables = {}
    for key in keys:
        up = np.full(shape, np.nan)
        lo = np.full(shape, np.nan)
        for at in atlases:
            if key not in at.tables:
                continue
            ix = np.ix_(*[_positions(axes[a], at.axes[a]) for a in ATLAS_AXES])
            u, l = at.tables[key]
            for dst, src, what in ((up, u, "eps_upper"), (lo, l, "eps_lower")):
                cur = dst[ix]
                both = np.isfinite(cur) & np.isfinite(src)
                if np.any(both & (np.abs(cur - src) > 1e-12 * np.maximum(np.abs(cur), 1.0))):
                    raise ValueError(f"{key}: the stores disagree on {what} at shared cells")
                dst[ix] = np.where(np.isfinite(src), src, cur)
        tables[key] = (up, lo)
    meta = {"source_store": [at.meta.get("source_store", "") for at in atlases],
            "fingerprint": [at.meta.get("fingerprint", "") for at in atlases],
            "method": atlases[0].meta.get("method", "pld"),
            "pldlib_version": atlases[0].meta.get("pldlib_version", ""), "exported_at": time.time()}
    return Atlas(axes, tables, meta)


def export(store, out: str, method: str = "pld", precision: str = "float64", envelope: bool = True,
           margin: float = 0.0) -> "object":
    """Write the atlas of ``store`` (a path, or a list of paths: their union, :func:`merge_atlases`)
    to ``out`` (``.npz``); returns the :class:`Atlas`.  ``envelope``: store each table's monotone
    envelope (the bounds look-ups use; opening the file then skips computing it), else the
    computed cells as they are.  ``margin`` (relative, >= 0): every upper bound is raised and
    every lower bound lowered by ``margin`` times its size (e.g. for stores computed under an
    earlier, smaller round-off model: results/atlas/README.md)."""
    if not (margin >= 0.0 and math.isfinite(margin)):
        raise ValueError(f"margin must be >= 0 and finite, got {margin!r}")
    stores = [store] if isinstance(store, (str, bytes)) or not hasattr(store, "__iter__") else list(store)
    atlas = merge_atlases([atlas_from_store(str(s), method) for s in stores])
    if margin > 0.0:
        from pldlib.atlas import Atlas

        widened = {k: (u + margin * np.abs(u), l - margin * np.abs(l)) for k, (u, l) in atlas.tables.items()}
        atlas = Atlas(atlas.axes, widened, {**atlas.meta, "margin": float(margin)})
    atlas.save(out, precision=precision, envelope=envelope)
    return atlas


class StoreLookup:
    """Certified sigma look-ups straight from a sweep store (any layout), reading few chunks.

    Opening reads the store's metadata and its coordinate arrays only.  One look-up
    (:meth:`sigma_for`) moves the query to its safe-side grid neighbour -- the smallest grid
    q >= q, the smallest grid steps >= steps, the largest grid delta <= delta; the true eps
    grows with q and steps and shrinks with delta, so an upper bound there bounds the query
    (docs/MATH.md 9.4) -- and bisects the sigma axis for the smallest grid sigma whose stored
    certified ``eps_upper`` is at most epsilon, reading one cell (one chunk of ``eps_upper``)
    per step: about log2(number of sigma values) + 1 chunks.  Cells not computed or failed
    are NaN and never certify.  The sigma returned is verified (its own cell's upper bound
    is <= epsilon): certified even where stored bounds are not monotone in sigma (a
    bisection may then return a larger certified sigma than the smallest one).
    :attr:`reads` counts the data chunks read so far.
    """

    def __init__(self, store: str, method: str = "pld"):
        import zarr

        from .store import read_attrs

        if read_attrs(store) is None:
            raise StoreError(f"{store!r} is not a sweeps store (nothing there, or not readable)")
        self.store = str(store)
        self.group = zarr.open_group(self.store, mode="r")
        self.coords = {d: np.asarray(self.group[d][...]) for d in
                       ("sigma", "q", "steps", "delta", "sampling", "relation", "method")}
        for d in ("sampling", "relation", "method"):
            self.coords[d] = np.array([str(x) for x in self.coords[d].tolist()], dtype=object)
        if method not in list(self.coords["method"]):
            raise ValueError(f"{store}: no method {method!r} in the store (it has "
                             f"{', '.join(self.coords['method'])})")
        self.method = method
        self.upper = self.group["eps_upper"]
        self.sigma_order = np.argsort(self.coords["sigma"], kind="stable")
        self.reads = 0

    def _cell(self, i_sigma: int, ix: tuple) -> float:
        self.reads += 1
        return float(self.upper[(int(i_sigma),) + ix])

    @staticmethod
    def _neighbour(name: str, axis: np.ndarray, x: float, up: bool) -> int:
        order = np.argsort(axis, kind="stable")
        a = axis[order].astype(float)
        tol = 1e-12 * abs(x)
        j = int(np.searchsorted(a, x - tol, side="left")) if up else int(np.searchsorted(a, x + tol, side="right")) - 1
        if not 0 <= j < a.size:
            side = "at or above" if up else "at or below"
            raise ValueError(f"{name}={x:.6g} has no grid value {side} it in the store "
                             f"(its {name} axis spans {a[0]:.6g} .. {a[-1]:.6g})")
        return int(order[j])

    def sigma_for(self, epsilon: float, delta: float, q: float, steps: int, sampling: str = "poisson",
                  relation: str = "add_remove") -> float:
        """The smallest grid sigma found certified to give eps <= ``epsilon`` at (delta, q, steps);
        NaN when not even the largest grid sigma is certified (see the class docstring)."""
        from pldlib import _validate as V

        epsilon = V.positive_finite("epsilon", epsilon)
        delta = V.probability_open("delta", delta)
        q = V.sampling_rate("q", q)
        steps = V.steps("steps", steps)
        for name, val in (("sampling", sampling), ("relation", relation)):
            have = list(self.coords[name])
            if val not in have:
                raise ValueError(f"{name}={val!r} is not in the store (it has {', '.join(have)})")
        iq = self._neighbour("q", self.coords["q"], float(q), up=True)
        ik = self._neighbour("steps", self.coords["steps"], float(steps), up=True)
        idl = self._neighbour("delta", self.coords["delta"], float(delta), up=False)
        ix = (iq, ik, idl, list(self.coords["sampling"]).index(sampling),
              list(self.coords["relation"]).index(relation), list(self.coords["method"]).index(self.method))
        order = self.sigma_order

        def ok(j):
            u = self._cell(order[j], ix)
            return u == u and u <= epsilon  # (NaN: not computed or failed: certifies nothing)

        hi = order.size - 1
        if not ok(hi):
            return math.nan
        lo = -1  # (virtual: not certified)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid
        return float(self.coords["sigma"][order[hi]])


def lookup(store: str, epsilon: float, delta: float, q: float, steps: int, sampling: str = "poisson",
           relation: str = "add_remove", method: str = "pld") -> float:
    """One certified sigma from a sweep store, reading few chunks (:class:`StoreLookup`)."""
    return StoreLookup(store, method).sigma_for(epsilon, delta, q, steps, sampling, relation)


def _random_queries(atlas, n: int, rng, sampling: str, relation: str, eps_range=(0.2, 16.0)):
    ax = atlas.axes
    lq = rng.uniform(math.log(ax["q"][0]), math.log(ax["q"][-1]), n)
    lk = rng.uniform(math.log(ax["steps"][0]), math.log(ax["steps"][-1]), n)
    ld = rng.uniform(math.log(ax["delta"][0]), math.log(ax["delta"][-1]), n)
    le = rng.uniform(math.log(eps_range[0]), math.log(eps_range[1]), n)
    return np.exp(le), np.exp(ld), np.exp(lq), np.maximum(1, np.round(np.exp(lk)))


def verify(atlas_path: str, n: int = 200, seed: int = 0, sampling: str = "poisson", relation: str = "add_remove",
           with_calibrate: bool = False, out=sys.stdout) -> dict:
    """Re-check ``n`` random off-grid queries: every certified sigma's upper eps at the exact
    query (the accountant at the upper-bound grid rule) must meet the target; with
    ``with_calibrate`` also compare with ``pldlib.calibrate``.  Returns the figures."""
    import pldlib
    from pldlib.atlas import open_atlas
    from pldlib.calibrate import upper_interval

    atlas = open_atlas(atlas_path)
    rng = np.random.default_rng(seed)
    e, d, q, k = _random_queries(atlas, n, rng, sampling, relation)
    ans = atlas.sigma_for(e, d, q, k, sampling, relation)
    rows = []
    for i in range(n):
        row = {"epsilon": float(e[i]), "delta": float(d[i]), "q": float(q[i]), "steps": int(k[i]),
               "sigma": float(ans.sigma[i]), "insufficient": float(ans.sigma_insufficient[i]),
               "estimate": float(ans.estimate[i])}
        if math.isfinite(ans.sigma[i]):
            m = pldlib.Gaussian(sigma=float(ans.sigma[i]), q=float(q[i]),
                                sampling="none" if q[i] == 1 else sampling, relation=relation)
            h = upper_interval(m, int(k[i]))
            row["check_upper"] = float(pldlib.account(m, int(k[i]), spacing=h, lower_bound=False)
                                       .epsilon(float(d[i])).upper)
            row["violation"] = bool(row["check_upper"] > e[i])
        if with_calibrate:
            t0 = time.perf_counter()
            try:
                c = pldlib.calibrate(epsilon=float(e[i]), delta=float(d[i]), q=float(q[i]), steps=int(k[i]),
                                     sampling=sampling if q[i] < 1 else "none", relation=relation, table=None)
                row["calibrated"], row["calibrate_seconds"] = c.sigma, time.perf_counter() - t0
            except Exception as exc:
                row["calibrate_error"] = f"{type(exc).__name__}: {exc}"
            # certify=True: the accountant at the exact query, seeded by the atlas's estimate
            if math.isfinite(ans.estimate[i]):
                t0 = time.perf_counter()
                a1 = atlas.sigma_for(float(e[i]), float(d[i]), float(q[i]), int(k[i]), sampling, relation,
                                     certify=True)
                row["certified_exact"], row["certify_seconds"] = float(a1.sigma), time.perf_counter() - t0
                row["certify_evaluations"] = int(a1.evaluations)
        rows.append(row)
    certified = [r for r in rows if math.isfinite(r["sigma"])]
    fig = {"queries": n, "certified": len(certified), "violations": sum(bool(r.get("violation")) for r in rows)}
    ratios = [r["sigma"] / r["calibrated"] for r in rows if "calibrated" in r and math.isfinite(r["sigma"])]
    est = [abs(r["estimate"] / r["calibrated"] - 1) for r in rows if "calibrated" in r and math.isfinite(r["estimate"])]
    if ratios:
        fig.update(ratio_median=float(np.median(ratios)), ratio_p90=float(np.quantile(ratios, 0.9)),
                   ratio_max=float(np.max(ratios)))
    if est:
        fig.update(estimate_err_median=float(np.median(est)), estimate_err_max=float(np.max(est)))
    cert = [r for r in rows if "certified_exact" in r and "calibrated" in r]
    if cert:
        dev = [abs(r["certified_exact"] / r["calibrated"] - 1) for r in cert]
        speed = [r["calibrate_seconds"] / max(r["certify_seconds"], 1e-9) for r in cert]
        ev = [r["certify_evaluations"] for r in cert]
        fig.update(certify_queries=len(cert), certify_dev_median=float(np.median(dev)),
                   certify_dev_max=float(np.max(dev)), certify_evals_median=float(np.median(ev)),
                   certify_evals_max=int(np.max(ev)), certify_speedup_median=float(np.median(speed)),
                   certify_within_2_evals=int(sum(v <= 2 for v in ev)), certify_one_eval=int(sum(v == 1 for v in ev)))
    fig.update(_timings(atlas_path, atlas, rng))
    print(json.dumps(fig), file=out)
    return {"figures": fig, "rows": rows}


def _timings(atlas_path: str, atlas, rng) -> dict:
    """Seconds for 100,000 vectorised look-ups, and for opening the atlas and answering one query
    in a fresh interpreter beyond ``import pldlib`` (median of 3 subprocess runs each way)."""
    import subprocess

    e, d, q, k = _random_queries(atlas, 100_000, rng, "poisson", "add_remove")
    t0 = time.perf_counter()
    atlas.sigma_for(e, d, q, k)
    bulk = time.perf_counter() - t0
    # one query inside the atlas (3.0, 1e-6, 0.004, 20,000 in the curated one)
    mid = {a: float(np.clip(v, atlas.axes[a][0], atlas.axes[a][-1]))
           for a, v in (("delta", 1e-6), ("q", 0.004), ("steps", 20000))}
    code = ("import time; t0 = time.perf_counter(); import pldlib; t1 = time.perf_counter(); "
            "from pldlib.atlas import open_atlas; a = open_atlas({!r}); a.sigma_for(3.0, {!r}, {!r}, {!r}, outside='nan'); "
            "t2 = time.perf_counter(); print(t1 - t0, t2 - t1)").format(str(atlas_path), mid["delta"], mid["q"],
                                                                      round(mid["steps"]))
    extra = []
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        extra.append(float(r.stdout.split()[1]))
    return {"lookup_100k_seconds": bulk, "open_and_query_beyond_import_seconds": float(np.median(extra))}



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sweeps.atlas", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pe = sub.add_parser("export", help="sweep store(s) -> atlas .npz (several stores: the union of their grids)")
    pe.add_argument("stores", nargs="+", metavar="STORE")
    pe.add_argument("out")
    pe.add_argument("--method", default="pld")
    pe.add_argument("--float32", action="store_true",
                    help="store the bounds as float32 rounded outward (upper up, lower down): half the size")
    pe.add_argument("--margin", type=float, default=0.0, metavar="REL",
                    help="raise upper bounds and lower lower bounds by REL times their size (default 0)")
    pe.add_argument("--raw", action="store_true",
                    help="store the computed cells, not their monotone envelope (opening is then slower)")
    pv = sub.add_parser("verify", help="re-check random off-grid queries")
    pv.add_argument("atlas")
    pv.add_argument("--n", type=int, default=200)
    pv.add_argument("--seed", type=int, default=0)
    pv.add_argument("--sampling", default="poisson")
    pv.add_argument("--relation", default="add_remove")
    pv.add_argument("--calibrate", action="store_true", help="also compare with pldlib.calibrate (slow)")
    pv.add_argument("--json-out", default=None, help="write every row to this JSON file")
    pl = sub.add_parser("lookup", help="one certified sigma straight from a sweep store (reads few chunks)")
    pl.add_argument("store")
    pl.add_argument("--epsilon", type=float, required=True)
    pl.add_argument("--delta", type=float, required=True)
    pl.add_argument("--q", type=float, required=True)
    pl.add_argument("--steps", type=int, required=True)
    pl.add_argument("--sampling", default="poisson")
    pl.add_argument("--relation", default="add_remove")
    pl.add_argument("--method", default="pld")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        if a.cmd == "lookup":
            lk = StoreLookup(a.store, a.method)
            sigma = lk.sigma_for(a.epsilon, a.delta, a.q, a.steps, a.sampling, a.relation)
            print(json.dumps({"sigma": sigma if math.isfinite(sigma) else None, "chunks_read": lk.reads}))
            return 0 if math.isfinite(sigma) else 1
        if a.cmd == "export":
            atlas = export(a.stores, a.out, a.method, "float32" if a.float32 else "float64", not a.raw, a.margin)
            print(f"wrote {a.out}: {atlas!r}")
            return 0
        res = verify(a.atlas, a.n, a.seed, a.sampling, a.relation, a.calibrate)
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump(res, f, indent=1)
        return 0 if res["figures"]["violations"] == 0 else 1
    except (OSError, ValueError, KeyError, StoreError) as e:
        print(f"sweeps.atlas: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
