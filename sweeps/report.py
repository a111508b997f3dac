"""Reading a sweep store: status counts, tables, plots."""
from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path

import numpy as np

from .plan import BLOCK_DIMS, DIMS, TPR_DIMS
from .shards import layout_of, read_cell_var
from .store import (CELL_VARS, STATUS_DONE, STATUS_FAILED, STATUS_MISSING, STATUS_OK, STATUS_UNSUPPORTED, TPR_VARS,
                    StoreError, open_dataset)

__all__ = ["SelectionError", "parse_sel", "apply_sel", "status_summary", "status_text",
           "show_text", "summary_table", "plot_store", "fmt_interval"]

NUMERIC = ("sigma", "q", "steps", "delta")
#: relative tolerance when matching a typed number to a coordinate (0.88 -> 0.8807...)
SEL_RTOL = 0.01


class SelectionError(ValueError):
    """A bad ``--sel key=value`` (message names it)."""


def parse_sel(items) -> dict:
    """``["sigma=0.6", "q=0.01"]`` -> ``{"sigma": "0.6", "q": "0.01"}`` (values still text)."""
    out = {}
    for it in items or []:
        if "=" not in it:
            raise SelectionError(f"--sel {it}: expected key=value (e.g. sigma=0.6)")
        k, v = it.split("=", 1)
        k, v = k.strip(), v.strip()
        if k not in DIMS:
            raise SelectionError(f"--sel {it}: unknown dimension {k!r} (use {', '.join(DIMS)})")
        out.setdefault(k, []).append(v)
    return out


def _match(ds, dim: str, text: str):
    vals = ds.indexes[dim]
    if dim in NUMERIC:
        try:
            x = float(text)
        except ValueError:
            raise SelectionError(f"--sel {dim}={text}: not a number") from None
        arr = np.asarray(vals, dtype=float)
        i = int(np.argmin(np.abs(arr - x)))
        if not math.isclose(arr[i], x, rel_tol=SEL_RTOL):
            have = ", ".join(f"{v:.4g}" for v in arr)
            raise SelectionError(f"--sel {dim}={text}: no such value (have {have})")
        return vals[i]
    if text not in list(vals):
        raise SelectionError(f"--sel {dim}={text}: no such value (have {', '.join(map(str, vals))})")
    return text


def apply_sel(ds, sel: dict):
    """Select (keeping every dim) with tolerant number matching; several values per key allowed."""
    for dim, texts in sel.items():
        vals = [_match(ds, dim, t) for t in texts]
        ds = ds.sel({dim: vals})
    return ds



def _open(path: str):
    """The sweep's Dataset (:func:`sweeps.store.open_dataset`), a local sharded store's cell
    variables read shard file by shard file (:func:`sweeps.shards.read_cell_var`: zarr decodes
    a sharded array inner chunk by inner chunk, minutes for a million blocks; same values)."""
    ds = open_dataset(path)
    if layout_of(ds.attrs).sharded and "://" not in str(path):
        for v in (*CELL_VARS, *TPR_VARS):
            if v in ds:
                ds[v] = (ds[v].dims, read_cell_var(path, v), ds[v].attrs)
    return ds

# -- status -----------------------------------------------------------------------
def status_summary(path: str) -> dict:
    ds = _open(path)
    if "sweeps_fingerprint" not in ds.attrs:
        raise StoreError(f"{path!r} is not a sweeps store")
    # (_open reads a sharded store's cell variables shard file by shard file)
    st = ds["status"].transpose(*DIMS).values
    # block state: reduce over steps and delta
    b = st.reshape(st.shape[0], st.shape[1], -1, *st.shape[4:]) if st.size else st
    allok = np.isin(b, STATUS_DONE).all(axis=2)  # ok or unsupported: final answers
    tst = ds["tpr_status"].transpose(*TPR_DIMS).values if "tpr_status" in ds else None
    if tst is not None and tst.size:  # the TPR cells of a block must be final answers too
        tb = tst.reshape(tst.shape[0], tst.shape[1], -1, *tst.shape[4:])
        allok &= np.isin(tb, STATUS_DONE).all(axis=2)
    allmiss = (b == STATUS_MISSING).all(axis=2)
    allunsup = (b == STATUS_UNSUPPORTED).all(axis=2)
    n_blocks = int(allok.size)
    done = int(allok.sum())
    missing = int(allmiss.sum())
    failed = n_blocks - done - missing
    errs = ds["error"].transpose(*BLOCK_DIMS).values
    run = ds["run"].transpose(*BLOCK_DIMS).values
    errors, unsupported = [], []
    for idx in zip(*np.nonzero((~allok & ~allmiss) | allunsup)):
        label = " ".join(f"{d}={_fmt_coord(ds, d, i)}" for d, i in zip(BLOCK_DIMS, idx))
        (unsupported if allunsup[idx] else errors).append((label, str(errs[idx])))
    secs = ds["seconds"].values
    return {
        "store": path,
        "name": ds.attrs.get("title", "").removeprefix("sweeps: "),
        "fingerprint": ds.attrs.get("sweeps_fingerprint", ""),
        "pldlib_version": ds.attrs.get("pldlib_version", ""),
        "shape": {d: int(ds.sizes[d]) for d in DIMS},
        "blocks": {"done": done, "failed": failed, "missing": missing, "unsupported": int(allunsup.sum()),
                   "total": n_blocks},
        "cells": {"ok": int((st == STATUS_OK).sum()), "failed": int((st == STATUS_FAILED).sum()),
                  "missing": int((st == STATUS_MISSING).sum()),
                  "unsupported": int((st == STATUS_UNSUPPORTED).sum()), "total": int(st.size)},
        **({"fpr": [float(x) for x in ds.indexes["fpr"]],
            "tpr_cells": {"ok": int((tst == STATUS_OK).sum()), "failed": int((tst == STATUS_FAILED).sum()),
                          "missing": int((tst == STATUS_MISSING).sum()),
                          "unsupported": int((tst == STATUS_UNSUPPORTED).sum()), "total": int(tst.size)}}
           if tst is not None else {}),
        "compute_seconds": float(np.nansum(secs)),
        "runs": json.loads(ds.attrs.get("runs", "[]")),
        "created": ds.attrs.get("created", ""),
        "started": ds.attrs.get("started", ""),
        "finished": ds.attrs.get("finished", ""),
        "complete": bool(ds.attrs.get("complete", False)),
        "errors": errors,
        "unsupported": unsupported,
        "blocks_by_run": {int(r): int((run == r).sum()) for r in np.unique(run) if r > 0},
    }


def _fmt_coord(ds, d, i):
    v = ds.indexes[d][i]
    return f"{v:.6g}" if d in NUMERIC else str(v)


def status_text(s: dict, max_errors: int = 10) -> str:
    shape = " x ".join(f"{d} {n}" for d, n in s["shape"].items())
    b, c = s["blocks"], s["cells"]
    lines = [
        f"store     {s['store']}",
        f"sweep     {s['name']} (fingerprint {s['fingerprint'][:12]}, pldlib {s['pldlib_version']})",
        f"grid      {shape} = {c['total']} cells in {b['total']} blocks",
        f"blocks    done {b['done']}, failed {b['failed']}, missing {b['missing']}"
        + (f" (done includes {b['unsupported']} unsupported)" if b.get("unsupported") else ""),
        f"cells     ok {c['ok']}, failed {c['failed']}, missing {c['missing']}"
        + (f", unsupported {c['unsupported']}" if c.get("unsupported") else ""),
    ]
    if s.get("tpr_cells"):
        t = s["tpr_cells"]
        lines.append(f"tpr cells ok {t['ok']}, failed {t['failed']}, missing {t['missing']}"
                     + (f", unsupported {t['unsupported']}" if t["unsupported"] else "")
                     + " (max TPR at FPR " + ", ".join(f"{x:g}" for x in s["fpr"]) + ")")
    lines.append(f"compute   {s['compute_seconds']:.1f} s in total (sum of block compute times)")
    if s["runs"]:
        last = s["runs"][-1]
        lines.append(f"runs      {len(s['runs'])}; last: run {last['run']} {last['state']} "
                     f"{last['started']} .. {last['finished'] or '?'}, submitted {last['submitted']}, "
                     f"ok {last['ok']}, failed {last['failed']}")
    if s["finished"]:
        lines.append(f"finished  {s['finished']}" + ("" if s["complete"] else " (not complete)"))
    if s.get("unsupported"):
        lines.append(f"unsupported ({len(s['unsupported'])} blocks; status 3, not errors):")
        for label, text in s["unsupported"][:max_errors]:
            lines.append(f"  {label}: {text or '(no text)'}")
        if len(s["unsupported"]) > max_errors:
            lines.append(f"  ... and {len(s['unsupported']) - max_errors} more")
    if s["errors"]:
        lines.append(f"errors ({len(s['errors'])} blocks):")
        for label, text in s["errors"][:max_errors]:
            lines.append(f"  {label}: {text or '(no text)'}")
        if len(s["errors"]) > max_errors:
            lines.append(f"  ... and {len(s['errors']) - max_errors} more")
    return "\n".join(lines)


# -- tables -----------------------------------------------------------------------
def _round_sig(x: float, sig: int, up: bool) -> float:
    if not math.isfinite(x) or x == 0:
        return x
    e = math.floor(math.log10(abs(x))) - sig + 1
    f = 10.0 ** e
    return (math.ceil if up else math.floor)(x / f) * f


def fmt_interval(lo: float, up: float, status: int, sig: int = 5, est: float = math.nan) -> str:
    """``[lower, upper]`` rounded outwards to ``sig`` digits (still a valid enclosure).

    A cell with no bounds but an estimate (``clt``) reads ``~x (estimate)``.
    """
    if status == STATUS_MISSING:
        return "-"
    if status == STATUS_UNSUPPORTED:
        return "unsupported"
    if status == STATUS_OK and not np.isfinite(up) and np.isfinite(est):
        return f"~{est:.{sig}g} (estimate)"
    if status == STATUS_FAILED or not np.isfinite(up):
        return "failed"
    lo_s = f"{_round_sig(lo, sig, up=False):.{sig}g}" if np.isfinite(lo) else "-inf"
    return f"[{lo_s}, {_round_sig(up, sig, up=True):.{sig}g}]"


def _grid_table(row_name, rows, col_names, cells) -> list[str]:
    table = [[row_name] + list(col_names)] + [[r] + c for r, c in zip(rows, cells)]
    widths = [max(len(str(t[i])) for t in table) for i in range(len(table[0]))]
    out = []
    for n, t in enumerate(table):
        out.append("  ".join(str(x).rjust(w) for x, w in zip(t, widths)))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _combos(ds, dims):
    return itertools.product(*[range(ds.sizes[d]) for d in dims])


def show_text(path: str, sel: dict | None = None, max_tables: int = 50) -> str:
    """Tables of ``[eps_lower, eps_upper]``, steps x delta, one per remaining combination."""
    ds = apply_sel(_open(path), sel or {})
    other = [d for d in DIMS if d not in ("steps", "delta")]
    combos = list(_combos(ds, other))
    lines = []
    if len(combos) > max_tables:
        raise SelectionError(f"--sel: {len(combos)} tables would be printed (at most {max_tables}); "
                             f"narrow it with --sel, e.g. sigma=... q=...")
    for combo in combos:
        sub = ds.isel(dict(zip(other, combo)))
        head = " ".join(f"{d}={_fmt_coord(ds, d, i)}" for d, i in zip(other, combo))
        err = str(sub["error"].values)
        lines.append(head)
        lines.append("eps(delta) as [lower, upper], rounded outwards")
        cols = [f"delta={v:.3g}" for v in ds.indexes["delta"]]
        cells = []
        st = sub["status"].transpose("steps", "delta").values
        lo = sub["eps_lower"].transpose("steps", "delta").values
        up = sub["eps_upper"].transpose("steps", "delta").values
        est = (sub["eps_estimate"].transpose("steps", "delta").values if "eps_estimate" in sub
               else np.full(up.shape, np.nan))
        for i in range(ds.sizes["steps"]):
            cells.append([fmt_interval(lo[i, j], up[i, j], st[i, j], est=est[i, j])
                          for j in range(ds.sizes["delta"])])
        lines += _grid_table("steps", [str(s) for s in ds.indexes["steps"]], cols, cells)
        if "tpr_status" in sub:
            tst = sub["tpr_status"].transpose("steps", "fpr").values
            tlo = sub["tpr_lower"].transpose("steps", "fpr").values
            tup = sub["tpr_upper"].transpose("steps", "fpr").values
            lines.append("max TPR of any membership test at FPR, as [lower, upper], rounded outwards")
            tcells = [[fmt_interval(tlo[i, j], tup[i, j], tst[i, j]) for j in range(ds.sizes["fpr"])]
                      for i in range(ds.sizes["steps"])]
            lines += _grid_table("steps", [str(s) for s in ds.indexes["steps"]],
                                 [f"fpr={v:.3g}" for v in ds.indexes["fpr"]], tcells)
        if err:
            lines.append(f"error: {err}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def summary_table(path: str, delta: float | None = None) -> str:
    """One compact table: rows = sigma (x q x the other block dims), columns = steps, at one delta."""
    ds = _open(path)
    deltas = np.asarray(ds.indexes["delta"], dtype=float)
    j = 0 if delta is None else int(np.argmin(np.abs(np.log(deltas) - np.log(delta))))
    sub = ds.isel(delta=j)
    rows_dims = ["q", "sigma", "sampling", "relation", "method"]
    rows_dims = [d for d in rows_dims if ds.sizes[d] > 1 or d in ("q", "sigma")]
    fixed = {d: str(ds.indexes[d][0]) for d in ("sampling", "relation", "method") if ds.sizes[d] == 1}
    head = (f"eps(delta={deltas[j]:.3g}) as [lower, upper]; "
            + " ".join(f"{k}={v}" for k, v in fixed.items()))
    rows, cells = [], []
    for combo in _combos(sub, rows_dims):
        s = sub.isel(dict(zip(rows_dims, combo)), drop=False)
        s = s.squeeze([d for d in ("sampling", "relation", "method") if d not in rows_dims])
        rows.append(" ".join(f"{d}={_fmt_coord(ds, d, i)}" for d, i in zip(rows_dims, combo)))
        st, lo, up = s["status"].values, s["eps_lower"].values, s["eps_upper"].values
        est = s["eps_estimate"].values if "eps_estimate" in s else np.full(up.shape, np.nan)
        cells.append([fmt_interval(lo[k], up[k], st[k], sig=4, est=est[k]) for k in range(ds.sizes["steps"])])
    cols = [f"steps={v}" for v in ds.indexes["steps"]]
    return "\n".join([head] + _grid_table("", rows, cols, cells)) + "\n"


# -- plot -------------------------------------------------------------------------
def default_plot_path(path: str) -> str:
    stem = Path(path.rstrip("/")).name
    stem = stem[:-5] if stem.endswith(".zarr") else stem
    return str(Path("results") / f"{stem}.png")


def plot_store(path: str, sel: dict | None = None, out: str | None = None, max_panels: int = 36) -> str:
    """eps vs steps, one colour per delta, upper solid / lower dashed; a panel per combination.

    Written atomically (``out + '.tmp'`` then rename); returns the path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ds = apply_sel(_open(path), sel or {})
    out = out or default_plot_path(path)
    other = [d for d in DIMS if d not in ("steps", "delta")]
    varying = [d for d in other if ds.sizes[d] > 1]
    combos = list(_combos(ds, varying))
    if len(combos) > max_panels:
        raise SelectionError(f"--sel: {len(combos)} panels would be drawn (at most {max_panels}); "
                             "narrow it with --sel")
    n = len(combos)
    if len(varying) == 2 and ds.sizes[varying[0]] <= 8:
        # a panel grid: columns = first varying dim, rows = second
        ncols, nrows = ds.sizes[varying[0]], ds.sizes[varying[1]]
        pos = [(c[1], c[0]) for c in combos]
    else:
        ncols = min(n, 6 if n > 9 else 3) if n > 1 else 1
        nrows = math.ceil(n / ncols)
        pos = [(k // ncols, k % ncols) for k in range(n)]
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols + 0.6, 3.0 * nrows + 0.8),
                             squeeze=False, sharex=True)
    steps = np.asarray(ds.indexes["steps"], dtype=float)
    deltas = list(ds.indexes["delta"])
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(deltas)))
    drawn = 0
    for k, combo in enumerate(combos):
        row, col = pos[k]
        ax = axes[row][col]
        sub = ds.isel(dict(zip(varying, combo)))
        sub = sub.squeeze([d for d in other if d not in varying])
        for j, d in enumerate(deltas):
            up = np.where(sub["status"].isel(delta=j).values == STATUS_OK, sub["eps_upper"].isel(delta=j).values, np.nan)
            lo = np.where(sub["status"].isel(delta=j).values == STATUS_OK, sub["eps_lower"].isel(delta=j).values, np.nan)
            lo = np.where(np.isfinite(lo) & (lo > 0), lo, np.nan)
            drawn += int(np.isfinite(up).sum())
            ax.plot(steps, up, "-", color=colors[j], marker=".", label=f"delta={d:.0e}")
            ax.plot(steps, lo, "--", color=colors[j])
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ups = np.where(sub["status"].values == STATUS_OK, sub["eps_upper"].values, np.nan)
        ups = ups[np.isfinite(ups) & (ups > 0)]
        if ups.size:
            ax.set_yscale("log")
            # scaled to the upper bounds; a lower bound far below them leaves the panel downwards
            ax.set_ylim(ups.min() / 1.5, ups.max() * 1.5)
            # few ticks (1, 2, 5 x 10^k), plain labels: minor log ticks are slow and cluttered
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=7))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_locator(NullLocator())
        else:
            ax.text(0.5, 0.5, "no finished cells", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
        ax.set_title(" ".join(f"{d}={_fmt_coord(ds, d, i)}" for d, i in zip(varying, combo)) or "", fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        if row == nrows - 1:
            ax.set_xlabel("steps")
        if col == 0:
            ax.set_ylabel("epsilon")
    used = set(pos)
    for r in range(nrows):
        for c in range(ncols):
            if (r, c) not in used:
                axes[r][c].set_visible(False)
    fixed = " ".join(f"{d}={_fmt_coord(ds, d, 0)}" for d in other if d not in varying)
    fig.suptitle(f"{ds.attrs.get('title', path)} -- eps(delta) vs steps; upper solid, lower dashed\n{fixed}",
                 fontsize=9)
    h, l = axes[0][0].get_legend_handles_labels()
    if h:
        fig.legend(h, l, loc="lower center", ncol=len(deltas), fontsize=8, frameon=False)
    # fixed margins (tight_layout costs seconds on many log-scaled panels)
    fig.subplots_adjust(left=0.6 / fig.get_figwidth() + 0.04, right=0.98, top=1 - 0.75 / fig.get_figheight(),
                        bottom=0.9 / fig.get_figheight(), wspace=0.32, hspace=0.38)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = out + ".tmp"
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    os.replace(tmp, out)
    return out
