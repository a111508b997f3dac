"""A static copy of the calculator (``pldlib serve --export DIR``): atlas look-ups with no server.

``DIR/index.html`` is the page in static mode and ``DIR/atlas_slice.js`` a table of certified
sigmas read from the shipped atlas: for each (sampling, relation) it covers, each grid q, steps,
delta and a grid of target epsilons, the atlas's certified sigma (:meth:`Atlas.sigma_for`).  The
page answers a query from the cell on the safe side of it in every coordinate (the next grid q
and steps at or above the query's, the next delta and epsilon at or below): eps(delta) does not
decrease with q or steps nor increase with delta, so the cell's target is harder than the
query's and its certified sigma meets the query's target too (certified, coarser than the
server's answer).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from .page import page_html

#: target epsilons of the slice (the page reads the largest at or below the query's)
SLICE_EPSILONS = tuple(float(x) for x in np.round(np.geomspace(0.1, 50.0, 43), 4))
#: every SLICE_STRIDE-th grid value of q and steps is kept (the largest always)
SLICE_STRIDE = 2


def _thin(axis: np.ndarray, stride: int) -> np.ndarray:
    keep = list(range(0, axis.size, stride))
    if keep[-1] != axis.size - 1:
        keep.append(axis.size - 1)
    return axis[keep]


def atlas_slice(atlas=None, epsilons=SLICE_EPSILONS, stride: int = SLICE_STRIDE) -> dict:
    """The slice as plain data: axes and, per ``"sampling/relation"``, its q axis and the
    certified sigmas in C order (q, steps, delta, epsilon); NaN-free (0 where no grid sigma
    is certified to meet the cell's target)."""
    from ..atlas import default_atlas_path, open_atlas

    atlas = atlas if atlas is not None else open_atlas(default_atlas_path())
    steps = _thin(atlas.axes["steps"], stride)
    deltas = atlas.axes["delta"]
    eps = np.asarray(epsilons, dtype=float)
    out = {"steps": steps.tolist(), "delta": deltas.tolist(), "epsilon": eps.tolist(), "tables": {},
           "source": {k: str(v) for k, v in atlas.meta.items() if isinstance(v, (str, int, float))}}
    for sampling, relation in list(atlas.tables):
        qs = atlas.axes["q"]
        if atlas.q_cut(sampling) is not None:  # (q = 1 does not bound q < 1 for this sampling)
            qs = qs[qs < 1.0]
        qs = _thin(qs, stride)
        Q, K, D, E = np.meshgrid(qs, steps, deltas, eps, indexing="ij")
        ans = atlas.sigma_for(E.ravel(), D.ravel(), Q.ravel(), K.ravel(), sampling=sampling, relation=relation,
                              outside="nan")
        sig = np.asarray(ans.sigma, dtype=float)
        sig = np.where(np.isfinite(sig), sig, 0.0)
        # stored rounded UP to 6 significant digits (a larger sigma is still certified)
        mag = np.where(sig > 0, 10.0 ** (np.floor(np.log10(np.where(sig > 0, sig, 1.0))) - 5), 1.0)
        sig = np.where(sig > 0, np.ceil(sig / mag) * mag, 0.0)
        out["tables"][f"{sampling}/{relation}"] = {"q": qs.tolist(), "sigma": [float(f"{s:.6g}") for s in sig]}
    return out


def export(out_dir, atlas=None) -> list[str]:
    """Write the static page into ``out_dir`` (created); returns the files written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = atlas_slice(atlas)
    files = []
    for name, text in (("atlas_slice.js", "window.PLDLIB_ATLAS = " + json.dumps(data, separators=(",", ":"),
                                                                               allow_nan=False) + ";\n"),
                       ("index.html", page_html(mode="static"))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out / name)
        files.append(str(out / name))
    return files


def lookup(data: dict, epsilon: float, delta: float, q: float, steps: int, sampling: str = "poisson",
           relation: str = "add_remove") -> float | None:
    """The static page's look-up in Python (the same rule as its JavaScript): the certified sigma
    of the safe-side cell, or None outside the slice or where no sigma is certified."""
    t = data["tables"].get(f"{sampling}/{relation}")
    if t is None:
        return None

    def first_at_least(axis, x):
        return next((i for i, a in enumerate(axis) if a >= x), -1)

    def last_at_most(axis, x):
        return next((i for i in range(len(axis) - 1, -1, -1) if axis[i] <= x), -1)

    iq, ik = first_at_least(t["q"], q), first_at_least(data["steps"], steps)
    idd, ie = last_at_most(data["delta"], delta), last_at_most(data["epsilon"], epsilon)
    if min(iq, ik, idd, ie) < 0:
        return None
    nk, nd, ne = len(data["steps"]), len(data["delta"]), len(data["epsilon"])
    s = t["sigma"][((iq * nk + ik) * nd + idd) * ne + ie]
    return s if s > 0 and math.isfinite(s) else None
