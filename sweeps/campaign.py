"""Campaign reports: ``sweeps report STORE [--out DIR]``.

Reads a sweep store and writes ``REPORT.md`` (self-contained markdown),
``summary.json`` (the same numbers, for tests and scripts) and PNG plots into
one folder (default ``results/campaigns/<store name>/``).

Definitions used throughout (all computed from the store, nothing else):

* **Kinds of method.**  ``pld``, ``prv`` and ``spa`` (and their variants) give
  *certified* intervals; ``rdp`` gives an upper bound only; ``clt`` gives an
  estimate only (never a bound); ``dp_accounting`` and ``prv_accountant`` are
  *peers*: their lower/upper values are what they claim, not certified here.
* **Reference.**  Per cell, ``L`` = the largest certified lower bound and
  ``U`` = the smallest certified upper bound over the certified methods in the
  store, so the exact epsilon lies in ``[L, U]``.  Where ``(U - L) / M <=
  1%`` (``M = (L + U) / 2``) the cell has a *tight reference* and a method's
  ``(eps_upper - M) / M`` is reported, with the reference's own half-width
  ``(U - L) / 2M`` as its uncertainty.
* **Relative width** of an interval: ``(upper - lower) / upper``.
* **Excess** of an upper bound: ``upper - L`` (how far above the exact value
  it can be, at most).
* **Estimate within 1%**: decided only where the reference decides it: the
  estimate is within 1% when ``|est - t| / t <= 1%`` for every ``t`` in
  ``[L, U]``, not within when it is above 1% for every such ``t``, else
  "undecided".
* **Soundness violation**: an upper bound of one method below a lower bound of
  another in the same cell (both finite, both cells ok).  Violations against
  a *certified* lower bound mean the upper bound is wrong.
* **Matched comparison** (side-by-side section): for each peer and each
  tightness measure (median width, median excess), the cheapest of our
  certified methods whose measure is at most the peer's times ``1 +
  MATCH_RTOL`` (``MATCH_RTOL = 1e-4``): values that agree to within 1e-4
  relative are a tie and count as matched.  At equal discretisation our
  certified upper bounds also carry aliasing and round-off terms, so they can
  sit marginally above a peer's uncertified ones (in campaign_dots, pld_h1's
  median excess is 5.7e-5 relative above dp_accounting_h1's, with
  dp_accounting 0.6); a strict ``<=`` would call that "not as tight".  A tie
  is reported as such, with the relative difference.
* **Attack bounds** (stores with the TPR metric, config ``grid.fpr``): per
  method, the TPR cells ok / failed / unsupported (methods without a certified
  trade-off curve) and the median relative width (upper - lower)/upper of the
  certified max-TPR intervals; a TPR *violation* is one method's upper end
  below another's lower end in the same cell.
* **Trade-off curve** (config ``report: {tradeoff_curve: {sigma, q, steps,
  sampling, relation, delta}}``, or ``write_report(..., tradeoff_curve=...)``):
  :func:`tradeoff_curve_plot` draws, for that one configuration, the certified
  interval of beta(alpha) (pldlib's PLD accountant at its default accuracy)
  beside the Gaussian-DP (CLT) approximation Phi(Phi^-1(1 - alpha) - mu) and the
  curve implied by the single pair (eps, delta) with eps the certified upper
  eps(delta), with the store's certified TPR intervals at its FPRs as markers.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import yaml

from .plan import DIMS
from .store import STATUS_FAILED, STATUS_MISSING, STATUS_OK, STATUS_UNSUPPORTED, StoreError, open_dataset

__all__ = ["analyse", "write_report", "default_out_dir", "tradeoff_curve_plot", "KINDS", "REF_RTOL", "EST_RTOL",
           "MATCH_RTOL"]

#: base method -> kind
def _kinds() -> dict:
    """Method -> what its numbers are, from pldlib's method registry (the peers are ``peer``)."""
    from pldlib.methods import method_info, method_names

    return {m: {"upper": "upper bound"}.get(method_info(m).kind, method_info(m).kind)
            for m in method_names(installed=False)}


KINDS = _kinds()
#: pldlib's own methods
OURS = tuple(m for m, k in KINDS.items() if k != "peer")
#: a reference is "tight" when its relative width is at most this
REF_RTOL = 0.01
#: the accuracy asked of estimates
EST_RTOL = 0.01
#: matched comparisons: a tightness measure within this relative tolerance of a peer's is a tie
#: (counts as "at least as tight"); see the module docstring
MATCH_RTOL = 1e-4
_MATCH_RTOL_TEXT = f"{MATCH_RTOL:.0e}".replace("e-0", "e-")  # "1e-4"
DEFAULT_TARGETS = (1.0, 2.0, 4.0, 8.0)


def default_out_dir(store: str) -> str:
    stem = Path(store.rstrip("/")).name
    stem = stem[:-5] if stem.endswith(".zarr") else stem
    return str(Path("results") / "campaigns" / stem)


def _f(x, digits=4) -> str:
    """A number for a table (n/a for NaN)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{x:.{digits}g}"


def _pct(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.3g}%"


def _md_table(head, rows) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _q(a, p):
    a = np.asarray(a, dtype=float)
    a = a[np.isfinite(a)]
    return float(np.quantile(a, p)) if a.size else math.nan


# -- analysis -------------------------------------------------------------------------
def _load(store: str):
    ds = open_dataset(store)
    if "sweeps_fingerprint" not in ds.attrs:
        raise StoreError(f"{store!r} is not a sweeps store")
    cfg = yaml.safe_load(ds.attrs.get("sweeps_config", "")) or {}
    ds = ds.transpose(*DIMS, ...)
    return ds, cfg


def analyse(store: str) -> dict:
    """Every number of the report, as plain data (also written to summary.json)."""
    ds, cfg = _load(store)
    methods = [str(m) for m in ds.indexes["method"]]
    variants = cfg.get("variants") or {}
    options = cfg.get("options") or {}
    base = {m: variants.get(m, m) for m in methods}
    kind = {m: KINDS.get(base[m], "other") for m in methods}
    st = ds["status"].values
    ok = st == STATUS_OK
    lo = np.where(ok, ds["eps_lower"].values, np.nan)
    up = np.where(ok, ds["eps_upper"].values, np.nan)
    est = (np.where(ok, ds["eps_estimate"].values, np.nan) if "eps_estimate" in ds
           else np.full(up.shape, np.nan))
    secs = ds["seconds"].values
    lo_f = np.where(np.isfinite(lo), lo, np.nan)
    up_f = np.where(np.isfinite(up), up, np.nan)
    cert = [i for i, m in enumerate(methods) if kind[m] == "certified"]
    # a bandmf store's methods are one method per band count: different mechanisms, so each is
    # compared only with the methods of its own band count (reference, overshoot, violations)
    group = ({m: (options.get(m) or {}).get("bands") for m in methods} if cfg.get("mechanism") == "bandmf"
             else {m: None for m in methods})
    grouped = len(set(group.values())) > 1

    def reference(cols):
        with np.errstate(all="ignore"), _nowarn():
            L_ = np.nanmax(lo_f[..., cols], axis=-1) if cols else np.full(up.shape[:-1], np.nan)
            U_ = np.nanmin(up_f[..., cols], axis=-1) if cols else np.full(up.shape[:-1], np.nan)
            M_ = 0.5 * (L_ + U_)
            ok_ = np.isfinite(L_) & np.isfinite(U_) & (L_ > 0) & (U_ >= L_)
            w_ = np.where(ok_, (U_ - L_) / M_, np.nan)
        return L_, U_, M_, ok_, w_, ok_ & (w_ <= REF_RTOL)

    if grouped:  # (no reference across band counts: the cross-method sections stay empty)
        L, U, M, ref_ok, ref_w, tight = reference([])
        own = {g: reference([i for i in cert if group[methods[i]] == g]) for g in set(group.values())}
    else:
        L, U, M, ref_ok, ref_w, tight = reference(cert)
        own = {None: (L, U, M, ref_ok, ref_w, tight)}
    per = {}
    for i, m in enumerate(methods):
        s = st[..., i]
        u, l_, e = up_f[..., i], lo_f[..., i], est[..., i]
        L, U, M, ref_ok, ref_w, tight = own[group[m]] if grouped else (L, U, M, ref_ok, ref_w, tight)
        with np.errstate(all="ignore"):
            width = np.where(np.isfinite(u) & np.isfinite(l_) & (u > 0), (u - l_) / u, np.nan)
            over = np.where(tight & np.isfinite(u), (u - M) / M, np.nan)
            eerr = np.where(tight & np.isfinite(e), (e - M) / M, np.nan)
            emax = np.maximum(np.abs(e - L) / L, np.abs(e - U) / U)
            emin = np.where((e >= L) & (e <= U), 0.0, np.minimum(np.abs(e - L) / L, np.abs(e - U) / U))
        has_e = ref_ok & np.isfinite(e)
        within = has_e & (emax <= EST_RTOL)
        outside = has_e & (emin > EST_RTOL)
        blk_sec = secs[..., i]
        done = s != STATUS_MISSING
        per[m] = {
            "method": base[m], "kind": kind[m], "ours": base[m] in OURS,
            "options": {k: v for k, v in (options.get(m) or {}).items() if k != "variant_of" and v is not None},
            "cells": int(s.size), "ok": int((s == STATUS_OK).sum()), "failed": int((s == STATUS_FAILED).sum()),
            "unsupported": int((s == STATUS_UNSUPPORTED).sum()), "missing": int((s == STATUS_MISSING).sum()),
            "upper_cells": int(np.isfinite(u).sum()),
            "width_median": _q(width, 0.5), "width_max": _q(width, 1.0),
            "width_cells": int(np.isfinite(width).sum()),
            "overshoot_cells": int(np.isfinite(over).sum()),
            "overshoot_median": _q(over, 0.5), "overshoot_p95": _q(over, 0.95),
            "overshoot_max": _q(over, 1.0), "overshoot_min": _q(over, 0.0),
            "estimate_cells": int(np.isfinite(e).sum()),
            "estimate_abs_err_median": _q(np.abs(eerr), 0.5), "estimate_abs_err_max": _q(np.abs(eerr), 1.0),
            "estimate_within": int(within.sum()), "estimate_outside": int(outside.sum()),
            "estimate_undecided": int((has_e & ~within & ~outside).sum()),
            "seconds_per_cell_median": _q(np.where(done & (s != STATUS_UNSUPPORTED), blk_sec, np.nan), 0.5),
            "seconds_total": float(np.nansum(np.where(done, blk_sec, 0.0))),
        }
    if grouped:
        L, U, M, ref_ok, ref_w, tight = reference([])
    res = {
        "store": store, "name": ds.attrs.get("title", "").removeprefix("sweeps: "),
        "grouped_by_bands": grouped,
        "fingerprint": ds.attrs.get("sweeps_fingerprint", ""), "pldlib_version": ds.attrs.get("pldlib_version", ""),
        "machine": json.loads(ds.attrs.get("machine", "{}") or "{}"),
        "runs": json.loads(ds.attrs.get("runs", "[]") or "[]"),
        "started": ds.attrs.get("started", ""), "finished": ds.attrs.get("finished", ""),
        "shape": {d: int(ds.sizes[d]) for d in DIMS}, "cells": int(st.size),
        "coords": {d: [v.item() if hasattr(v, "item") else str(v) for v in ds.indexes[d]] for d in DIMS},
        "methods": per,
        "reference": {"certified_methods": [methods[i] for i in cert], "cells_with_reference": int(ref_ok.sum()),
                      "cells_with_tight_reference": int(tight.sum()), "tight_rtol": REF_RTOL,
                      "ref_halfwidth_median": _q(np.where(tight, ref_w / 2, np.nan), 0.5)},
        "match_rtol": MATCH_RTOL,
    }
    res["violations"] = _violations(ds, methods, kind, base, lo_f, up_f, group)
    res["estimates"] = _estimate_breakdown(ds, methods, kind, est, L, U, ref_ok)
    res["tightness"] = _tightness(ds, methods, kind, lo_f, up_f, L, secs, st)
    res["sampling"] = _sampling(ds, methods, kind, up_f, cfg)
    res["tpr"] = _tpr(ds, methods, kind)
    arrays = {"L": L, "U": U, "M": M, "tight": tight, "lo": lo_f, "up": up_f, "est": est, "secs": secs,
              "status": st}
    return res, ds, arrays


class _nowarn:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *a):
        self._w.__exit__(*a)


def _cell_label(ds, idx) -> dict:
    out = {}
    for d, i in zip(DIMS[:-1], idx):
        v = ds.indexes[d][i]
        out[d] = v.item() if hasattr(v, "item") else str(v)
    return out


def _violations(ds, methods, kind, base, lo, up, group=None) -> dict:
    """Every (upper method, lower method, cell) with upper < lower (methods of the same ``group``
    only: a bandmf store's band counts are different mechanisms)."""
    rows, counts = [], {}
    group = group or {}
    for a, ma in enumerate(methods):
        if kind[ma] == "estimate":
            continue
        for b, mb in enumerate(methods):
            if a == b or kind[mb] == "estimate" or group.get(ma) != group.get(mb):
                continue
            with np.errstate(invalid="ignore"):
                bad = np.isfinite(up[..., a]) & np.isfinite(lo[..., b]) & (up[..., a] < lo[..., b])
            n = int(bad.sum())
            if not n:
                continue
            counts[f"{ma} upper < {mb} lower"] = {
                "upper_method": ma, "lower_method": mb, "cells": n,
                "lower_certified": kind[mb] == "certified", "upper_ours": base[ma] in OURS}
            for idx in list(zip(*np.nonzero(bad)))[:20]:
                u, l_ = float(up[idx + (a,)]), float(lo[idx + (b,)])
                rows.append({"upper_method": ma, "lower_method": mb, "cell": _cell_label(ds, idx),
                             "upper": u, "lower": l_, "rel_gap": (l_ - u) / l_})
    ours_vs_cert = sum(c["cells"] for c in counts.values() if c["upper_ours"] and c["lower_certified"])
    return {"counts": counts, "rows": rows, "ours_below_certified_lower": ours_vs_cert}


def _estimate_breakdown(ds, methods, kind, est, L, U, ref_ok) -> dict:
    """Per estimating method: within-1% counts by (q, sigma) and by steps."""
    out = {}
    for i, m in enumerate(methods):
        e = est[..., i]
        has = ref_ok & np.isfinite(e)
        if not has.any():
            continue
        with np.errstate(all="ignore"):
            emax = np.maximum(np.abs(e - L) / L, np.abs(e - U) / U)
            emin = np.where((e >= L) & (e <= U), 0.0, np.minimum(np.abs(e - L) / L, np.abs(e - U) / U))
        within = has & (emax <= EST_RTOL)
        outside = has & (emin > EST_RTOL)
        by = {}
        for dim in ("steps", "q", "sigma", "delta", "sampling", "relation"):
            ax = DIMS.index(dim)
            other = tuple(k for k in range(within.ndim) if k != ax)
            by[dim] = [{"value": _cell_label(ds, (0,) * ax + (j,))[dim],
                        "within": int(within.sum(axis=other)[j]), "outside": int(outside.sum(axis=other)[j]),
                        "cells": int(has.sum(axis=other)[j])} for j in range(within.shape[ax])]
        worst = []
        ee = np.where(outside, emin, -1.0)
        for flat in np.argsort(ee, axis=None)[::-1][:10]:
            idx = np.unravel_index(flat, ee.shape)
            if ee[idx] < 0:
                break
            worst.append({"cell": _cell_label(ds, idx), "estimate": float(e[idx]), "L": float(L[idx]),
                          "U": float(U[idx]), "rel_err_at_least": float(emin[idx])})
        out[m] = {"within": int(within.sum()), "outside": int(outside.sum()),
                  "undecided": int((has & ~within & ~outside).sum()), "cells": int(has.sum()), "by": by,
                  "worst": worst}
    return out


def _tightness(ds, methods, kind, lo, up, L, secs, st) -> dict:
    """Per relation: methods with an interval, on the cells where all of them have one."""
    out = {}
    rel_ax = DIMS.index("relation")
    for r, rel in enumerate(ds.indexes["relation"]):
        cols = [i for i, m in enumerate(methods)
                if kind[m] in ("certified", "peer")
                and (np.isfinite(np.take(up[..., i], r, axis=rel_ax)) &
                     np.isfinite(np.take(lo[..., i], r, axis=rel_ax))).any()]
        if len(cols) < 2:
            continue
        u = np.take(up, r, axis=rel_ax)[..., cols]
        l_ = np.take(lo, r, axis=rel_ax)[..., cols]
        Lr = np.take(L, r, axis=rel_ax)
        common = np.all(np.isfinite(u) & np.isfinite(l_), axis=-1) & np.isfinite(Lr) & (Lr > 0)
        if not common.any():
            continue
        rows = []
        for k, i in enumerate(cols):
            with np.errstate(all="ignore"):
                width = (u[..., k] - l_[..., k]) / u[..., k]
                excess = (u[..., k] - Lr) / Lr
            sec = np.take(secs[..., i], r, axis=rel_ax)
            rows.append({"method": methods[i], "kind": kind[methods[i]],
                         "width_median": _q(np.where(common, width, np.nan), 0.5),
                         "excess_median": _q(np.where(common, excess, np.nan), 0.5),
                         "seconds_per_cell_median": _q(np.where(common, sec, np.nan), 0.5),
                         "seconds_sum": float(np.nansum(np.where(common, sec, 0.0)))})
        # ratio of excess (upper - L) between every pair, median over the common cells
        ratios = {}
        for a, ia in enumerate(cols):
            for b, ib in enumerate(cols):
                if a == b:
                    continue
                with np.errstate(all="ignore"):
                    ea, eb = u[..., a] - Lr, u[..., b] - Lr
                    rat = np.where(common & (ea > 0), eb / ea, np.nan)
                ratios[f"{methods[ib]} / {methods[ia]}"] = _q(rat, 0.5)
        out[str(rel)] = {"cells": int(common.sum()), "rows": rows, "excess_ratio_median": ratios}
    return out


def _tpr(ds, methods, kind) -> dict:
    """The TPR metric (stores with ``grid.fpr``): counts, widths and violations per method."""
    if "tpr_status" not in ds:
        return {}
    from .plan import TPR_DIMS

    tst = ds["tpr_status"].transpose(*TPR_DIMS).values
    ok = tst == STATUS_OK
    tlo = np.where(ok, ds["tpr_lower"].transpose(*TPR_DIMS).values, np.nan)
    tup = np.where(ok, ds["tpr_upper"].transpose(*TPR_DIMS).values, np.nan)
    fprs = [float(x) for x in ds.indexes["fpr"]]
    per = {}
    for i, m in enumerate(methods):
        s = tst[..., i]
        with np.errstate(all="ignore"):
            w = np.where(tup[..., i] > 0, (tup[..., i] - tlo[..., i]) / tup[..., i], np.nan)
        per[m] = {"kind": kind[m], "ok": int((s == STATUS_OK).sum()), "failed": int((s == STATUS_FAILED).sum()),
                  "unsupported": int((s == STATUS_UNSUPPORTED).sum()), "missing": int((s == STATUS_MISSING).sum()),
                  "width_median": _q(w, 0.5), "width_max": _q(w, 1.0),
                  "width_median_by_fpr": [_q(w[:, :, :, j], 0.5) for j in range(len(fprs))]}
    viol = []
    for i, a in enumerate(methods):
        for j, b in enumerate(methods):
            if i == j:
                continue
            with np.errstate(invalid="ignore"):
                bad = tup[..., i] < tlo[..., j]
            if bad.any():
                viol.append({"upper_method": a, "lower_method": b, "cells": int(bad.sum()),
                             "max_gap": float(np.nanmax(np.where(bad, tlo[..., j] - tup[..., i], np.nan)))})
    return {"fpr": fprs, "methods": per, "violations": viol}


def _sampling(ds, methods, kind, up, cfg) -> dict:
    """Noise needed for a target epsilon, Poisson vs WOR (interpolated over the sigma grid)."""
    samp = [str(s) for s in ds.indexes["sampling"]]
    if not ("poisson" in samp and "wor" in samp) or ds.sizes["sigma"] < 2:
        return {}
    targets = [float(t) for t in ((cfg.get("report") or {}).get("eps_targets") or DEFAULT_TARGETS)]
    sigmas = np.asarray(ds.indexes["sigma"], dtype=float)
    mi = [i for i, m in enumerate(methods) if kind[m] == "certified"]
    if not mi:
        return {}
    m = mi[0]
    ip, iw = samp.index("poisson"), samp.index("wor")
    rows = []
    for qi, q in enumerate(ds.indexes["q"]):
        for ki, k in enumerate(ds.indexes["steps"]):
            for di, d in enumerate(ds.indexes["delta"]):
                for ri, rel in enumerate(ds.indexes["relation"]):
                    for t in targets:
                        sp = _sigma_for(sigmas, up[:, qi, ki, di, ip, ri, m], t)
                        sw = _sigma_for(sigmas, up[:, qi, ki, di, iw, ri, m], t)
                        rows.append({"q": float(q), "steps": int(k), "delta": float(d), "relation": str(rel),
                                     "target": t, "sigma_poisson": sp, "sigma_wor": sw,
                                     "ratio": (sw / sp) if math.isfinite(sp) and math.isfinite(sw) else math.nan})
    by_rel = {}
    for rel in ds.indexes["relation"]:
        r = [x["ratio"] for x in rows if x["relation"] == str(rel)]
        by_rel[str(rel)] = {"median": _q(r, 0.5), "min": _q(r, 0.0), "max": _q(r, 1.0),
                            "n": int(np.isfinite(np.asarray(r, float)).sum())}
    return {"method": methods[m], "targets": targets, "rows": rows, "ratio_by_relation": by_rel}


def _sigma_for(sigmas, ups, target) -> float:
    """Smallest sigma whose certified upper eps is <= target, log-log interpolated on the grid.

    NaN when the grid does not bracket it (the smallest grid sigma is already
    enough, or the largest is not).  The grid point just above the returned
    value is certified; the interpolated value itself is not.
    """
    ups = np.asarray(ups, dtype=float)
    good = np.isfinite(ups) & (ups > 0)
    s, u = sigmas[good], ups[good]
    if s.size < 2:
        return math.nan
    order = np.argsort(s)
    s, u = s[order], u[order]
    ok = np.nonzero(u <= target)[0]
    if not ok.size or ok[0] == 0:
        return math.nan
    j = ok[0]
    x0, x1, y0, y1 = math.log(s[j - 1]), math.log(s[j]), math.log(u[j - 1]), math.log(u[j])
    if y0 == y1:
        return float(s[j])
    x = x0 + (math.log(target) - y0) * (x1 - x0) / (y1 - y0)
    return float(math.exp(min(max(x, x0), x1)))


# -- plots -----------------------------------------------------------------------------
def _plots(res, ds, A, out_dir: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(res["methods"])
    colors = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
    files = {}

    # 1. eps vs steps (one delta, one sampling/relation: the one with the most finished cells)
    st, up, lo, est = A["status"], A["up"], A["lo"], A["est"]
    s_ax, r_ax = DIMS.index("sampling"), DIMS.index("relation")
    best, best_n = (0, 0), -1
    for si in range(ds.sizes["sampling"]):
        for ri in range(ds.sizes["relation"]):
            n = int((np.take(np.take(st, si, axis=s_ax), ri, axis=r_ax - 1) == STATUS_OK).sum())
            if n > best_n:
                best, best_n = (si, ri), n
    si, ri = best
    sig_idx = np.unique(np.linspace(0, ds.sizes["sigma"] - 1, min(4, ds.sizes["sigma"])).round().astype(int))
    q_idx = np.unique(np.linspace(0, ds.sizes["q"] - 1, min(3, ds.sizes["q"])).round().astype(int))
    steps = np.asarray(ds.indexes["steps"], dtype=float)
    fig, axes = plt.subplots(len(q_idx), len(sig_idx),
                             figsize=(max(8.0, 3.4 * len(sig_idx) + 0.8), 2.6 * len(q_idx) + 2.0),
                             squeeze=False, sharex=True)
    for a, qi in enumerate(q_idx):
        for b, gi in enumerate(sig_idx):
            ax = axes[a][b]
            for mi, m in enumerate(methods):
                sl = (gi, qi, slice(None), 0, si, ri, mi)
                if np.isfinite(up[sl]).any():
                    ax.plot(steps, up[sl], "-", marker=".", color=colors[m], label=m)
                if np.isfinite(lo[sl]).any():
                    ax.plot(steps, np.where(lo[sl] > 0, lo[sl], np.nan), "--", color=colors[m], lw=0.8)
                if np.isfinite(est[sl]).any():
                    ax.plot(steps, est[sl], ":", marker="x", ms=3, color=colors[m],
                            label=f"{m} (estimate)" if not np.isfinite(up[sl]).any() else None)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
            ax.set_title(f"sigma={ds.indexes['sigma'][gi]:.3g} q={ds.indexes['q'][qi]:.3g}", fontsize=8)
            if a == len(q_idx) - 1:
                ax.set_xlabel("steps")
            if b == 0:
                ax.set_ylabel("epsilon")
    h, l_ = [], []
    for row in axes:
        for ax in row:
            for hh, ll in zip(*ax.get_legend_handles_labels()):
                if ll not in l_:
                    h.append(hh)
                    l_.append(ll)
    fig.legend(h, l_, loc="lower center", ncol=min(len(l_), 5), fontsize=7, frameon=False)
    fig.suptitle(f"eps(delta={ds.indexes['delta'][0]:.0e}) vs steps, sampling={ds.indexes['sampling'][si]}, "
                 f"relation={ds.indexes['relation'][ri]}\nupper solid, lower dashed, estimate dotted", fontsize=9)
    fig.subplots_adjust(left=0.08, right=0.98, top=1 - 0.85 / fig.get_figheight(),
                        bottom=1.2 / fig.get_figheight(), wspace=0.3, hspace=0.35)
    files["eps_vs_steps"] = _save(fig, out_dir / "eps_vs_steps.png")

    # 2. accuracy / time trade-off: per block, median relative width (or overshoot) vs seconds per cell
    fig, ax = plt.subplots(figsize=(7, 4.6))
    cell_axes = (DIMS.index("steps"), DIMS.index("delta"))
    for mi, m in enumerate(methods):
        with np.errstate(all="ignore"), _nowarn():
            width = np.where(np.isfinite(lo[..., mi]), (up[..., mi] - lo[..., mi]) / up[..., mi], np.nan)
            over = np.where(A["tight"], (up[..., mi] - A["M"]) / A["M"], np.nan)
            y = np.where(np.isfinite(width), width, over)
            yb = np.nanmedian(y, axis=cell_axes)
            xb = np.nanmedian(np.where(np.isfinite(y), A["secs"][..., mi], np.nan), axis=cell_axes)
        keep = np.isfinite(xb) & np.isfinite(yb) & (yb > 0) & (xb > 0)
        if keep.any():
            ax.scatter(xb[keep], yb[keep], s=14, color=colors[m], label=m, alpha=0.75)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("seconds per cell (block time / cells)")
    ax.set_ylabel("relative width (upper-lower)/upper\n(rdp: overshoot vs reference)")
    ax.set_title("accuracy / time trade-off, one point per block (median over its cells)", fontsize=9)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    files["tradeoff"] = _save(fig, out_dir / "tradeoff.png")

    # 3. distribution of (upper - M)/M on cells with a tight reference
    fig, ax = plt.subplots(figsize=(7, 4.2))
    drawn = False
    for mi, m in enumerate(methods):
        with np.errstate(all="ignore"):
            v = np.where(A["tight"], (up[..., mi] - A["M"]) / A["M"], np.nan)
        v = np.sort(v[np.isfinite(v)])
        if v.size:
            ax.step(np.maximum(v, 1e-7), np.arange(1, v.size + 1) / v.size, where="post", color=colors[m], label=m)
            drawn = True
    ax.set_xscale("log")
    ax.set_xlabel("(eps_upper - reference) / reference  (values <= 1e-7 drawn at 1e-7)")
    ax.set_ylabel("fraction of cells")
    ax.set_title("distribution of the upper bound's relative overshoot (cells with a tight reference)", fontsize=9)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    fig.tight_layout()
    files["overshoot"] = _save(fig, out_dir / "overshoot.png")

    # 4. WOR vs Poisson: sigma needed, if present
    smp = res.get("sampling") or {}
    if smp.get("rows"):
        rels = sorted({r["relation"] for r in smp["rows"]})
        fig, axes = plt.subplots(1, len(rels), figsize=(3.6 * len(rels) + 0.6, 3.6), squeeze=False)
        for k, rel in enumerate(rels):
            ax = axes[0][k]
            rows = [r for r in smp["rows"] if r["relation"] == rel and math.isfinite(r["ratio"])]
            if rows:
                ax.scatter([r["sigma_poisson"] for r in rows], [r["sigma_wor"] for r in rows], s=12)
                lim = [min(r["sigma_poisson"] for r in rows) * 0.9, max(r["sigma_wor"] for r in rows) * 1.1]
                ax.plot(lim, lim, "k:", lw=0.8, label="equal")
                ax.plot(lim, [2 * x for x in lim], "r:", lw=0.8, label="2x")
                ax.legend(fontsize=7)
            ax.set_title(f"relation={rel}", fontsize=9)
            ax.set_xlabel("sigma needed, Poisson")
            if k == 0:
                ax.set_ylabel("sigma needed, WOR")
            ax.grid(True, alpha=0.3)
        fig.suptitle(f"noise for a target eps ({smp['method']} upper bounds, interpolated on the sigma grid)",
                     fontsize=9)
        fig.tight_layout()
        files["wor_vs_poisson"] = _save(fig, out_dir / "wor_vs_poisson.png")
    return files


def _tradeoff_numbers(spec: dict, mechanism: str, fprs) -> dict:
    """The certified curve, the Gaussian-DP (CLT) approximation and the (eps, delta)-implied curve
    of one configuration (see :func:`tradeoff_curve_plot`), at ``fprs`` and on a plotting grid."""
    import time

    import pldlib
    from pldlib.methods.clt import CLTAccountant
    from pldlib.pld.tradeoff import gaussian_tradeoff, implied_tradeoff

    from .methods import make_mechanism

    params = {**spec, "mechanism": mechanism}
    mech = make_mechanism(params)
    t0 = time.perf_counter()
    acc = pldlib.account(mech, steps=spec["steps"])
    eps = acc.epsilon(spec["delta"])
    alpha = np.unique(np.concatenate([np.geomspace(1e-7, 1.0, 300), np.asarray(fprs, float)]))
    iv = acc.tradeoff(alpha)
    seconds = time.perf_counter() - t0
    try:
        clt = CLTAccountant(spec["relation"]).compose(mech.event, spec["steps"])
        clt._ensure_built()
        mu = float(clt.mu)
    except Exception:  # e.g. Laplace: no CLT approximation
        mu = math.nan
    e_up = float(eps.upper)
    symmetric = spec["relation"] in ("add_remove", "substitution")

    def implied(a):
        a = np.asarray(a, dtype=float)
        if symmetric:
            return implied_tradeoff(e_up, spec["delta"], a)
        # one direction only: an (eps, delta) bound on delta(eps) of that direction alone
        return np.maximum(0.0, 1.0 - spec["delta"] - math.exp(e_up) * a)

    f = np.asarray(fprs, float)
    tpr = acc.max_tpr(f)
    return {"spec": dict(spec), "mechanism": mechanism, "spacing": float(acc.spacing), "seconds": seconds,
            "eps_delta": [float(eps.lower), e_up], "mu_clt": mu, "symmetric": symmetric,
            "fpr": f.tolist(), "tpr_lower": np.asarray(tpr.lower).tolist(), "tpr_upper": np.asarray(tpr.upper).tolist(),
            "tpr_gdp": (1.0 - gaussian_tradeoff(mu, f)).tolist() if math.isfinite(mu) else [math.nan] * f.size,
            "tpr_implied": np.minimum(1.0 - implied(f), 1.0).tolist(),
            "_curve": {"alpha": alpha, "beta_lower": iv.lower, "beta_upper": iv.upper,
                       "gdp": gaussian_tradeoff(mu, alpha) if math.isfinite(mu) else None,
                       "implied": implied(alpha)}}


def _store_tpr_points(ds, spec: dict) -> list:
    """The store's certified TPR intervals of the configuration ``spec`` (one entry per method with
    ok TPR cells): ``[(method, fprs, lower, upper)]``; [] when the store lacks them."""
    if ds is None or "tpr_status" not in ds:
        return []
    sel = {}
    for d in ("sigma", "q", "steps"):
        vals = np.asarray(ds.indexes[d], dtype=float)
        hit = np.nonzero(np.isclose(vals, float(spec[d]), rtol=1e-9))[0]
        if not hit.size:
            return []
        sel[d] = int(hit[0])
    for d in ("sampling", "relation"):
        vals = [str(v) for v in ds.indexes[d]]
        if spec[d] not in vals:
            return []
        sel[d] = vals.index(spec[d])
    sub = ds.isel(sel)
    out = []
    for m in [str(v) for v in ds.indexes["method"]]:
        c = sub.sel({"method": m})
        ok = c["tpr_status"].values == STATUS_OK
        if ok.any():
            f = np.asarray(ds.indexes["fpr"], dtype=float)
            out.append((m, f[ok], c["tpr_lower"].values[ok], c["tpr_upper"].values[ok]))
    return out


def tradeoff_curve_plot(spec: dict, out: str | os.PathLike, *, mechanism: str = "gaussian", ds=None,
                        fprs=(1e-3, 1e-2)) -> dict:
    """Plot the trade-off curve of one configuration into the PNG ``out``; returns its numbers.

    ``spec``: ``{sigma, q, steps, sampling, relation, delta}`` (see
    :func:`sweeps.config.tradeoff_curve_spec`; missing keys take the DP-SGD headline values).
    Left panel: beta(alpha) against a log-scale FPR axis: the certified interval (lower and
    upper end, pldlib's PLD accountant at its default accuracy), the Gaussian-DP (CLT mu)
    approximation Phi(Phi^-1(1 - alpha) - mu) (an estimate, no guarantee) and the curve implied
    by the single pair (eps, delta), eps the certified upper eps(delta): max(0, 1 - delta -
    e^eps alpha, e^-eps (1 - delta - alpha)) (for the one-direction relations add / remove only
    the first line).  Right panel: the same as TPR = 1 - beta against FPR, log-log, with the
    store's certified TPR intervals (``ds``, a sweep store with ``grid.fpr``) as error bars.
    The returned dict (``spec``, ``eps_delta``, ``mu_clt``, ``fpr``, ``tpr_lower``,
    ``tpr_upper``, ``tpr_gdp``, ``tpr_implied``, ``interval``, ``seconds``, ``file``) goes
    into the report's summary.json.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .config import tradeoff_curve_spec

    spec = tradeoff_curve_spec(dict(spec))
    points = _store_tpr_points(ds, spec)
    if ds is not None and "fpr" in ds.indexes:
        fprs = [float(x) for x in ds.indexes["fpr"]]
    res = _tradeoff_numbers(spec, mechanism, fprs)
    c = res.pop("_curve")
    a = c["alpha"]
    e_up = res["eps_delta"][1]
    pair = f"(eps={e_up:.3g}, delta={spec['delta']:g})"
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.3))
    ax = axes[0]
    ax.fill_between(a, c["beta_lower"], c["beta_upper"], color="0.6", alpha=0.5, lw=0)
    ax.plot(a, c["beta_lower"], "k-", lw=1.3, label="certified beta: lower end (no attack is stronger)")
    ax.plot(a, c["beta_upper"], "k--", lw=0.9, label="certified beta: upper end (some attack is this strong)")
    if c["gdp"] is not None:
        ax.plot(a, c["gdp"], "b:", lw=1.4, label=f"Gaussian-DP (CLT) estimate, mu = {res['mu_clt']:.4g}")
    ax.plot(a, c["implied"], "r-.", lw=1.1, label=f"implied by the single pair {pair}")
    ax.plot(a, 1 - a, color="0.75", lw=0.8, label="random guess (beta = 1 - alpha)")
    ax.set_xscale("log")
    ax.set_xlim(a[0], 1.0)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("alpha = FPR (log scale)")
    ax.set_ylabel("beta = 1 - TPR (least type II error)")
    ax.set_title("trade-off curve beta(alpha)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6.5, loc="lower left")
    ax = axes[1]
    ax.plot(a, 1 - c["beta_lower"], "k-", lw=1.3, label="certified max TPR: upper end")
    ax.plot(a, 1 - c["beta_upper"], "k--", lw=0.9, label="certified max TPR: lower end")
    if c["gdp"] is not None:
        ax.plot(a, 1 - c["gdp"], "b:", lw=1.4, label="Gaussian-DP (CLT) estimate")
    ax.plot(a, np.minimum(1 - c["implied"], 1.0), "r-.", lw=1.1, label=f"implied by {pair}")
    ax.plot(a, a, color="0.75", lw=0.8, label="random guess")
    marks = "osD^v<>"
    for k, (m, f, lo, up) in enumerate(points):
        ax.errorbar(f, 0.5 * (lo + up), yerr=[0.5 * (up - lo), 0.5 * (up - lo)], fmt=marks[k % len(marks)],
                    ms=4, mfc="none", capsize=2, lw=0.8, label=f"store: {m} [tpr_lower, tpr_upper]")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(a[0], 1.0)
    ax.set_ylim(max(a[0], 1e-7), 1.1)
    ax.set_xlabel("FPR (log scale)")
    ax.set_ylabel("TPR (log scale)")
    ax.set_title("best attack's TPR at each FPR (ROC, log-log)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6.5, loc="lower right")
    fig.suptitle(f"{mechanism} sigma={spec['sigma']:g}, q={spec['q']:g} ({spec['sampling']}), "
                 f"{spec['steps']:,} steps, relation {spec['relation']}; PLD spacing {res['spacing']:.3g}",
                 fontsize=9)
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    res["file"] = _save(fig, path, dpi=85)
    res["store_points"] = [{"method": m, "fpr": f.tolist(), "tpr_lower": lo.tolist(), "tpr_upper": up.tolist()}
                           for m, f, lo, up in points]
    return res


def _save(fig, path: Path, dpi: int = 100) -> str:
    import matplotlib.pyplot as plt

    tmp = str(path) + ".tmp"
    fig.savefig(tmp, format="png", dpi=dpi)
    plt.close(fig)
    os.replace(tmp, path)
    return path.name


# -- markdown ------------------------------------------------------------------------------
def _markdown(res, files, command) -> str:
    P = res["methods"]
    sh = res["shape"]
    runs = res["runs"]
    wall = ""
    if runs:
        from datetime import datetime

        try:
            secs = sum((datetime.fromisoformat(r["finished"]) - datetime.fromisoformat(r["started"])).total_seconds()
                       for r in runs if r.get("finished"))
            wall = f"{secs:.0f} s wall time over {len(runs)} run(s)"
        except (KeyError, ValueError):
            wall = ""
    mach = res["machine"]
    L = [f"# Campaign report: {res['name']}", ""]
    L.append(f"Store `{res['store']}` (fingerprint `{res['fingerprint'][:12]}`), pldlib {res['pldlib_version']}; "
             f"grid " + " x ".join(f"{d} {n}" for d, n in sh.items()) + f" = {res['cells']} cells; "
             + (f"{wall} " if wall else "")
             + (f"on {mach.get('cores', '?')} cores ({mach.get('platform', '')})." if mach else "."))
    if command:
        L += ["", f"Reproduce: `{command}` then `sweeps report {res['store']}`."]
    L += ["", "Grid: " + "; ".join(f"{d} = {', '.join(_f(v) if not isinstance(v, str) else v for v in vals)}"
                                   for d, vals in res["coords"].items()), ""]
    L += ["Definitions (see `sweeps/campaign.py`): the **reference** of a cell is the bracket [L, U] of the "
          "largest certified lower and smallest certified upper bound among "
          + (", ".join(res["reference"]["certified_methods"]) or "(none)")
          + f"; it is *tight* where (U-L)/M <= {REF_RTOL:.0%} (M the midpoint); "
          f"{res['reference']['cells_with_tight_reference']} of {res['cells'] // max(1, len(P))} grid points "
          f"have one (median half-width {_pct(res['reference']['ref_halfwidth_median'])}). "
          "**Overshoot** = (eps_upper - M)/M, **width** = (upper - lower)/upper, **excess** = (upper - L)/L. "
          "`clt` is an estimate, never a bound: it is stored in `eps_estimate` with NaN bounds. "
          "Peers' bounds are what they claim; only ours are certified.", ""]
    if res.get("grouped_by_bands"):
        L += ["This is a `mechanism: bandmf` store: each method coordinate is one method at one band count "
              "(`pld@b4`: 4 bands; `@b1` is DP-SGD), so its methods account *different* mechanisms. Overshoot "
              "and the soundness check compare a method only with the methods of its own band count; the "
              "cross-method reference and tightness sections are left out.", ""]

    L += ["## Methods", ""]
    head = ["method", "kind", "options", "ok", "failed", "unsupported", "missing", "median width", "max width",
            "median overshoot", "p95 overshoot", "max overshoot", "median s/cell", "total s"]
    rows = []
    for m, p in P.items():
        opts = ", ".join(f"{k}={v}" for k, v in p["options"].items()) or "-"
        rows.append([f"`{m}`", p["kind"], opts, p["ok"], p["failed"], p["unsupported"], p["missing"],
                     _pct(p["width_median"]), _pct(p["width_max"]), _pct(p["overshoot_median"]),
                     _pct(p["overshoot_p95"]), _pct(p["overshoot_max"]), _f(p["seconds_per_cell_median"], 3),
                     _f(p["seconds_total"], 4)])
    L += [_md_table(head, rows), ""]
    L += ["Seconds are compute time of each block (one block = one sigma, q, sampling, relation, method over all "
          "steps and deltas) divided by its cells; unsupported cells are left out of the median.", ""]

    # estimates
    E = res["estimates"]
    if E:
        L += ["## Estimates: within 1% of the exact value?", ""]
        rows = [[f"`{m}`", e["cells"], e["within"], e["outside"], e["undecided"],
                 _pct(P[m]["estimate_abs_err_median"]), _pct(P[m]["estimate_abs_err_max"])] for m, e in E.items()]
        L += [_md_table(["method", "cells with reference", "within 1%", "not within 1%", "undecided",
                         "median abs error (tight ref.)", "max abs error (tight ref.)"], rows), ""]
        for m, e in E.items():
            for dim in ("steps", "q", "sigma"):
                r = [x for x in e["by"][dim] if x["cells"]]
                if len(r) > 1:
                    L += [f"`{m}` by {dim}: " + "; ".join(
                        f"{dim}={_f(x['value'])}: {x['within']}/{x['cells']} within, {x['outside']} not"
                        for x in r), ""]
            if e["worst"]:
                L += [f"`{m}` furthest from the reference (relative error at least):", ""]
                L += [_md_table(["cell", "estimate", "L", "U", "rel. error >="],
                                [[_cell_text(w["cell"]), _f(w["estimate"], 6), _f(w["L"], 6), _f(w["U"], 6),
                                  _pct(w["rel_err_at_least"])] for w in e["worst"][:5]]), ""]

    # tightness / matched width
    T = res["tightness"]
    if T:
        L += ["## Tightness and cost, side by side", "",
              "Per relation, on the cells where every listed method has both bounds. `excess ratio` = median "
              "over those cells of (upper_B - L)/(upper_A - L): how many times further above the exact value "
              "B's upper bound can be than A's. In the matched comparisons, one of our methods is *at least as "
              f"tight* as a peer when its median width (or excess) is at most the peer's times 1 + {_MATCH_RTOL_TEXT}: "
              f"values within {_MATCH_RTOL_TEXT} relative of each other are a tie and count as matched (at equal h "
              "our certified upper bounds also carry aliasing and round-off terms, so they can sit marginally above "
              "a peer's uncertified ones).",
              ""]
        for rel, t in T.items():
            L += [f"### relation = {rel} ({t['cells']} common cells)", ""]
            rows = [[f"`{r['method']}`", r["kind"], _pct(r["width_median"]), _pct(r["excess_median"]),
                     _f(r["seconds_per_cell_median"], 3), _f(r["seconds_sum"], 4)] for r in t["rows"]]
            L += [_md_table(["method", "kind", "median width", "median excess (U-L)/L", "median s/cell",
                             "sum s (common cells)"], rows), ""]
            L += _matched(t, P), ""
            ratios = t["excess_ratio_median"]
            if ratios:
                names = [r["method"] for r in t["rows"]]
                mat = [[f"`{a}`"] + [("-" if a == b else _f(ratios.get(f"{b} / {a}"), 3)) for b in names]
                       for a in names]
                L += ["Excess ratio (row A, column B):", "", _md_table(["A \\ B"] + [f"`{b}`" for b in names], mat),
                      ""]

    # WOR vs Poisson
    S = res["sampling"]
    if S:
        L += ["## Poisson vs sampling without replacement: noise for a target epsilon", "",
              f"sigma needed for eps <= target from `{S['method']}` certified upper bounds, log-log interpolated "
              "between the two grid sigmas that bracket it (the grid point above is certified; the interpolated "
              "value is not). n/a: the sigma grid does not bracket it.", ""]
        rows = [[rel, v["n"], _f(v["median"], 4), _f(v["min"], 4), _f(v["max"], 4)]
                for rel, v in S["ratio_by_relation"].items()]
        L += [_md_table(["relation", "cases", "median sigma_WOR / sigma_Poisson", "min", "max"], rows), ""]
        rows = [[r["relation"], _f(r["q"]), r["steps"], _f(r["delta"]), _f(r["target"]), _f(r["sigma_poisson"], 4),
                 _f(r["sigma_wor"], 4), _f(r["ratio"], 4)] for r in S["rows"]]
        L += ["<details><summary>all cases</summary>", "",
              _md_table(["relation", "q", "steps", "delta", "target eps", "sigma Poisson", "sigma WOR", "ratio"], rows),
              "", "</details>", ""]

    # attack bounds (the TPR metric)
    TP = res.get("tpr") or {}
    if TP:
        fp = ", ".join(f"{x:g}" for x in TP["fpr"])
        L += ["## Attack bounds: largest TPR at each FPR", "",
              f"Certified interval [tpr_lower, tpr_upper] of the largest true-positive rate of any membership "
              f"test at FPR {fp} (`grid.fpr`; `Accountant.max_tpr`, docs/MATH.md section 10). Unsupported: the "
              "method has no certified trade-off curve (estimates, peers). Width = (upper - lower)/upper. "
              "The seconds of the tables above include the TPR metric (one block computes both).", ""]
        rows = [[f"`{m}`", p["kind"], p["ok"], p["failed"], p["unsupported"], p["missing"], _pct(p["width_median"]),
                 _pct(p["width_max"]), " / ".join(_pct(w) for w in p["width_median_by_fpr"])]
                for m, p in TP["methods"].items()]
        L += [_md_table(["method", "kind", "ok", "failed", "unsupported", "missing", "median width", "max width",
                         f"median width at FPR {fp}"], rows), ""]
        if TP["violations"]:
            L += ["TPR intervals that do not overlap (an upper end below another method's lower end):", ""]
            L += [_md_table(["upper of", "below lower of", "cells", "max gap"],
                            [[f"`{v['upper_method']}`", f"`{v['lower_method']}`", v["cells"], _f(v["max_gap"], 3)]
                             for v in TP["violations"]]), ""]
        else:
            L += ["Every pair of TPR intervals overlaps in every cell (no violations).", ""]
    TC = res.get("tradeoff_curve")
    if TC:
        sp = TC["spec"]
        e_lo, e_up = TC["eps_delta"]
        L += ["## Trade-off curve of one configuration", "",
              f"{TC['mechanism']} sigma = {sp['sigma']:g}, q = {sp['q']:g} ({sp['sampling']}), {sp['steps']:,} steps, "
              f"relation {sp['relation']}: pldlib's PLD accountant at its default accuracy (spacing "
              f"{TC['spacing']:.3g}; built and the curve at 300 alphas read in {TC['seconds']:.2f} s); certified "
              f"eps({sp['delta']:g}) in [{e_lo:.4f}, {e_up:.4f}]. The Gaussian-DP (CLT) mu = {_f(TC['mu_clt'], 5)} "
              "is an estimate (no guarantee); the last column is the largest TPR that the single pair "
              f"({e_up:.4f}, {sp['delta']:g}) allows"
              + ("." if TC["symmetric"] else " (one direction of the relation: its first line only)."), "",
              _md_table(["FPR", "certified max TPR [lower, upper]", "Gaussian-DP estimate",
                         f"implied by ({e_up:.4f}, {sp['delta']:g})"],
                        [[f"{f:g}", f"[{lo:.5f}, {up:.5f}]", _f(g, 5), _f(i, 4)]
                         for f, lo, up, g, i in zip(TC["fpr"], TC["tpr_lower"], TC["tpr_upper"], TC["tpr_gdp"],
                                                    TC["tpr_implied"])]), ""]
        if TC.get("store_points"):
            L += ["The markers in the right panel are the store's own certified TPR intervals of this configuration ("
                  + ", ".join(f"`{p['method']}`" for p in TC["store_points"]) + ").", ""]
        L += [f"![trade-off curve]({TC['file']})", ""]

    # failures
    L += ["## Failures and unsupported cells", ""]
    rows = [[f"`{m}`", p["failed"], p["unsupported"], p["missing"]] for m, p in P.items()
            if p["failed"] or p["unsupported"] or p["missing"]]
    L += [_md_table(["method", "failed cells", "unsupported cells", "missing cells"], rows) if rows
          else "None: every cell of every method is ok.", ""]
    for m, texts in res.get("errors", {}).items():
        if texts:
            L += [f"`{m}`:", ""] + [f"- {t}" for t in texts] + [""]

    # soundness
    V = res["violations"]
    L += ["## Soundness: upper bounds below another method's lower bound", ""]
    L += [f"Our upper bounds (pld, prv, spa, rdp) below a certified lower bound: "
          f"**{V['ours_below_certified_lower']}** cells.", ""]
    if V["counts"]:
        rows = [[f"`{c['upper_method']}`", f"`{c['lower_method']}`",
                 "certified" if c["lower_certified"] else "claimed (peer)", c["cells"]] for c in V["counts"].values()]
        L += [_md_table(["upper of", "below lower of", "that lower is", "cells"], rows), ""]
        rows = [[f"`{r['upper_method']}`", _f(r["upper"], 7), f"`{r['lower_method']}`", _f(r["lower"], 7),
                 _pct(r["rel_gap"]), _cell_text(r["cell"])] for r in V["rows"][:30]]
        L += ["Examples:", "", _md_table(["upper of", "upper", "lower of", "lower", "gap", "cell"], rows), ""]
    else:
        L += ["No violations: every upper bound is above every lower bound in every cell.", ""]

    L += ["## Plots", ""]
    for key, title in (("eps_vs_steps", "eps vs steps"), ("tradeoff", "accuracy / time trade-off"),
                       ("overshoot", "overshoot of the upper bounds"), ("wor_vs_poisson", "WOR vs Poisson")):
        if key in files:
            L += [f"![{title}]({files[key]})", ""]
    return "\n".join(L).rstrip() + "\n"


def _as_tight(ours: float, peer: float, rtol: float = MATCH_RTOL) -> bool:
    """``ours`` is at least as tight as ``peer`` (smaller is tighter), ties within ``rtol`` relative included."""
    return math.isfinite(ours) and math.isfinite(peer) and ours <= peer * (1.0 + rtol)


def _matched(t, P) -> str:
    """For each peer: the cheapest of our certified variants at least as tight, by width and by excess.

    "At least as tight" allows a tie within :data:`MATCH_RTOL` (relative); a tie is labelled as such.
    """
    ours = [r for r in t["rows"] if r["kind"] == "certified" and math.isfinite(r["seconds_per_cell_median"])]
    lines = []
    for r in t["rows"]:
        if r["kind"] != "peer":
            continue
        for key, what in (("width_median", "interval width (upper-lower)/upper"),
                          ("excess_median", "upper-bound excess (upper-L)/L")):
            if not math.isfinite(r[key]):
                continue
            cand = [o for o in ours if _as_tight(o[key], r[key])]
            if not cand:
                lines.append(f"- `{r['method']}` ({what} {_pct(r[key])}): none of our certified methods here "
                             f"is as tight (not even within {_MATCH_RTOL_TEXT} relative).")
                continue
            best = min(cand, key=lambda o: o["seconds_per_cell_median"])
            ratio = (r["seconds_per_cell_median"] / best["seconds_per_cell_median"]
                     if best["seconds_per_cell_median"] > 0 else math.inf)
            tie = ""
            if best[key] > r[key]:
                tie = (f" (a tie: {_f((best[key] - r[key]) / r[key], 2)} relative above the peer's, "
                       f"within the {_MATCH_RTOL_TEXT} tolerance)")
            lines.append(f"- matched {what}: `{r['method']}` {_pct(r[key])} in "
                         f"{_f(r['seconds_per_cell_median'], 3)} s/cell; cheapest of ours at least as tight: "
                         f"`{best['method']}` {_pct(best[key])}{tie} in {_f(best['seconds_per_cell_median'], 3)} "
                         f"s/cell (peer time / our time = {_f(ratio, 3)}; > 1 means ours is faster).")
    return "\n".join(lines)


def _cell_text(c: dict) -> str:
    return " ".join(f"{k}={_f(v) if not isinstance(v, str) else v}" for k, v in c.items())


def _errors(ds) -> dict:
    """Up to 3 distinct error texts per method (failed blocks only)."""
    out = {}
    st = ds["status"].values
    err = ds["error"].transpose("sigma", "q", "sampling", "relation", "method").values
    failed_blk = (st == STATUS_FAILED).any(axis=(DIMS.index("steps"), DIMS.index("delta")))
    for mi, m in enumerate(ds.indexes["method"]):
        texts = []
        for idx in zip(*np.nonzero(failed_blk[..., mi])):
            t = str(err[idx + (mi,)])
            t = t if len(t) <= 300 else t[:300] + "..."
            if t and t not in texts:
                texts.append(t)
            if len(texts) >= 3:
                break
        out[str(m)] = texts
    return out


def write_report(store: str, out: str | None = None, command: str | None = None,
                 tradeoff_curve: dict | bool | None = None) -> str:
    """Write REPORT.md, summary.json and PNGs into ``out``, and REPORT.html (the same report as
    one self-contained page: :func:`sweeps.report_html.write_html`); returns the markdown path.

    ``tradeoff_curve``: the configuration whose trade-off curve to plot (``tradeoff_curve.png``,
    :func:`tradeoff_curve_plot`); default: the store config's ``report.tradeoff_curve``, if any
    (``False``: none)."""
    res, ds, arrays = analyse(store)
    res["errors"] = _errors(ds)
    out_dir = Path(out or default_out_dir(store))
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _plots(res, ds, arrays, out_dir)
    if tradeoff_curve is None:
        cfg = yaml.safe_load(ds.attrs.get("sweeps_config", "")) or {}
        tradeoff_curve = (cfg.get("report") or {}).get("tradeoff_curve")
    if tradeoff_curve is not None and tradeoff_curve is not False:
        tc = tradeoff_curve_plot({} if tradeoff_curve is True else tradeoff_curve, out_dir / "tradeoff_curve.png",
                                 mechanism=ds.attrs.get("mechanism", "gaussian"), ds=ds)
        files["tradeoff_curve"] = tc["file"]
        res["tradeoff_curve"] = tc
    res["plots"] = files
    res["command"] = command
    md = _markdown(res, files, command)
    (out_dir / "summary.json").write_text(json.dumps(res, indent=1, default=_json_default, allow_nan=True) + "\n")
    path = out_dir / "REPORT.md"
    tmp = out_dir / "REPORT.md.tmp"
    tmp.write_text(md)
    os.replace(tmp, path)
    from .report_html import write_html

    write_html(out_dir)
    return str(path)


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
