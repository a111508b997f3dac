"""The batches people train with.  Three parts, each cached as JSON in
results/batches/ and rendered together into results/BATCHES.md (+ plots):

* ``shapes`` -- Poisson vs random allocation vs shuffle at the same batch size (certified
  epsilon at delta 1e-5, add_remove, Gaussian), on the DP-SGD shapes;
* ``user``   -- user-level accounting, g = 1, 2, 4, 8 (Poisson), against the group-privacy
  conversion of the example-level curve (docs/MATH.md 13.1);
* ``mc``     -- Monte Carlo soundness of random allocation at the issue's scale: 10^7 samples
  per direction, t in {4, 16}, sigma in {0.8, 1.5}, 1 and 10 epochs, three eps per case.

Run: ``python -m benchmarks.batches [--part shapes|user|mc|all] [--samples N]`` (default: all;
the mc part at 10^7 samples takes several minutes on one core).  ``--render`` rewrites the
markdown from the cached parts only.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import time

import numpy as np

import pldlib

OUT = pathlib.Path("results")
CACHE = OUT / "batches"
DELTA = 1e-5

#: (sigma, t = 1/q, epochs): the DP-SGD shapes of the campaigns (q = 0.001, 0.01, 0.1) and a
#: few small-sigma shapes where shuffling is known to lose most (Chua et al., arXiv 2411.04205)
SHAPES = [(1.0, 100, 100), (2.0, 100, 100), (4.0, 100, 100), (1.0, 1000, 10), (2.0, 1000, 10),
          (1.0, 10, 1000), (2.0, 10, 1000), (0.5, 1000, 1), (0.4, 1000, 1), (0.4, 10000, 1),
          (0.5, 100, 10), (0.6, 100, 10), (0.4, 100, 1),
          # the ratio lower / Poisson upper rises towards 1 as t grows and sigma falls
          (0.5, 3000, 1), (0.5, 10000, 1), (0.7, 10000, 1)]

#: user-level shapes (sigma, q, steps): DP-SGD grid points of the campaigns
USER_SHAPES = [(s, q, k) for s in (0.5, 1.0, 2.0, 4.0) for q in (0.001, 0.01) for k in (1000, 10000)]
GROUPS = (1, 2, 4, 8)

#: the issue's Monte Carlo cases
MC_CASES = [(t, s, e) for t in (4, 16) for s in (0.8, 1.5) for e in (1, 10)]


def mc_eps(sigma, epochs):
    """Three epsilons per case (as tests/test_allocation.py::issue_eps)."""
    return [0.1 * math.sqrt(epochs) / sigma, 0.4 * math.sqrt(epochs) / sigma, 1.0 * math.sqrt(epochs) / sigma]


def _f(x):
    return None if x is None or not math.isfinite(x) else float(x)


# -- part 1: Poisson vs random allocation vs shuffle -------------------------------------------
def run_shapes() -> list[dict]:
    from pldlib.methods.pld import max_coordinate_lower
    from pldlib.sampling.allocation import (LatticeTooLarge, allocation_epoch_amplified, allocation_epoch_lower_pair,
                                            allocation_epoch_pair)

    rows = []
    for sigma, t, epochs in SHAPES:
        t0 = time.perf_counter()
        k = t * epochs
        pois = pldlib.account(pldlib.Gaussian(sigma=sigma, q=1 / t, sampling="poisson"), steps=k).epsilon(DELTA)
        t1 = time.perf_counter()
        ra = pldlib.account(pldlib.Gaussian(sigma=sigma, q=1 / t, sampling="random_allocation"),
                            steps=k).epsilon(DELTA)
        ra_s = time.perf_counter() - t1
        coarse = False
        try:
            allocation_epoch_pair(sigma, t)  # cached: whether the amplified pair was used
            amplified = True
        except LatticeTooLarge:
            try:  # (the coarser lattices of MATH 13.2 "Small sigma")
                allocation_epoch_amplified(sigma, t)
                amplified = coarse = True
            except LatticeTooLarge:
                amplified = False
        try:
            lower_lattice = amplified and allocation_epoch_lower_pair(sigma, t) is not None  # (cached)
        except LatticeTooLarge:
            lower_lattice = False
        sh = pldlib.account(pldlib.Gaussian(sigma=sigma, q=1 / t, sampling="shuffle"), steps=k).epsilon(DELTA)
        mx = max_coordinate_lower(sigma, t, epochs, DELTA)
        rows.append({"sigma": sigma, "t": t, "epochs": epochs, "steps": k, "poisson_lower": pois.lower,
                     "poisson_upper": pois.upper, "sum_lower": sh.lower, "max_lower": mx, "ra_lower": ra.lower,
                     "upper": ra.upper, "amplified": amplified, "coarse": coarse, "lower_lattice": lower_lattice,
                     "ra_seconds": ra_s,
                     "shuffle_upper": sh.upper,
                     "seconds": time.perf_counter() - t0})
        print("shapes", rows[-1], flush=True)
    return rows


# -- part 2: user-level against group privacy ---------------------------------------------------
def group_conversion(acc, g: int, delta: float, side: str) -> float:
    """g * eps1*, eps1* the smallest eps1 with g e^{(g-1) eps1} delta1(eps1) <= delta (the
    group-privacy conversion), delta1 the example-level certified ``side`` curve: 'upper' (what a
    certified accountant lets one report) or 'lower' (below the exact curve, so the result is a
    lower bound on the conversion of the exact curve).  Located on a 0.002 grid from 0, then
    bisected to 1e-6 between the last infeasible and the first feasible grid point (upper: the
    feasible end; lower: the infeasible end).  inf when no eps1 <= 100 qualifies."""
    def c(e):
        e = np.atleast_1d(np.asarray(e, dtype=float))
        return g * np.exp(np.minimum((g - 1) * e, 700.0)) * np.asarray(getattr(acc.delta(e), side))

    grid = np.arange(0.0, 100.0, 0.002)
    ok = np.nonzero(c(grid) <= delta)[0]
    if ok.size == 0:
        return math.inf
    if ok[0] == 0:
        return 0.0
    a, b = float(grid[ok[0] - 1]), float(grid[ok[0]])
    while b - a > 1e-6:
        m = 0.5 * (a + b)
        if c(m)[0] <= delta:
            b = m
        else:
            a = m
    return g * (b if side == "upper" else a)


def run_user() -> list[dict]:
    rows = []
    for sigma, q, steps in USER_SHAPES:
        ex = None
        for g in GROUPS:
            t0 = time.perf_counter()
            try:
                acc = pldlib.account(pldlib.Gaussian(sigma=sigma, q=q, sampling="poisson", group=g), steps=steps)
                iv = acc.epsilon(DELTA)
                lo, up = float(iv.lower), float(iv.upper)
            except (ArithmeticError, MemoryError, ValueError) as e:  # e.g. loss range beyond e^700
                acc, lo, up = None, math.nan, math.nan
                print("user: failed", sigma, q, steps, g, type(e).__name__, e)
            if g == 1:
                ex = acc
            conv_up = conv_lo = math.nan
            if g > 1 and ex is not None:
                conv_up, conv_lo = group_conversion(ex, g, DELTA, "upper"), group_conversion(ex, g, DELTA, "lower")
            rows.append({"sigma": sigma, "q": q, "steps": steps, "g": g, "lower": lo, "upper": up,
                         "conversion_upper": conv_up, "conversion_lower": conv_lo,
                         "seconds": time.perf_counter() - t0})
            print("user", rows[-1], flush=True)
    return rows


# -- part 3: Monte Carlo soundness of random allocation ----------------------------------------
def run_mc(n_samples: int) -> list[dict]:
    from pldlib.methods.pld import max_coordinate_accountant
    from pldlib.testing.montecarlo import allocation_delta

    rows = []
    for t, sigma, epochs in MC_CASES:
        eps = mc_eps(sigma, epochs)
        t0 = time.perf_counter()
        mc = allocation_delta(sigma, t, epochs, eps, n_samples=n_samples,
                              seed=20_000 + 100 * t + 10 * epochs + int(10 * sigma))
        mc_s = time.perf_counter() - t0
        iv = pldlib.account(pldlib.Gaussian(sigma=sigma, q=1 / t, sampling="random_allocation"),
                            steps=t * epochs).delta(eps)
        mx = max_coordinate_accountant(sigma, t, epochs).delta(eps).lower
        for j, e in enumerate(eps):
            est = max(mc.remove[j], mc.add[j])
            se = mc.se_remove[j] if mc.remove[j] >= mc.add[j] else mc.se_add[j]
            lower = max(float(iv.lower[j]), float(mx[j]))
            rows.append({"t": t, "sigma": sigma, "epochs": epochs, "eps": e, "ra_lower": float(iv.lower[j]),
                         "max_lower": float(mx[j]), "estimate": est, "remove": mc.remove[j], "add": mc.add[j],
                         "eta": mc.eta, "se": se, "mc_lower": float(mc.lower[j]), "mc_upper": float(mc.upper[j]),
                         "upper": float(iv.upper[j]),
                         "inside": bool(lower <= mc.upper[j] and mc.lower[j] <= iv.upper[j]),
                         "n_samples": n_samples, "mc_seconds": mc_s})
            print("mc", rows[-1], flush=True)
    return rows


# -- rendering --------------------------------------------------------------------------------
def _g(x, fmt=".4g"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else \
        ("inf" if isinstance(x, float) and math.isinf(x) else format(x, fmt))


def render() -> None:
    parts = {p: json.loads((CACHE / f"{p}.json").read_text())
             for p in ("shapes", "user", "mc", "truncated", "allocation", "kmc", "noise", "saving")
             if (CACHE / f"{p}.json").exists()}
    L = ["# Batches: Poisson, random allocation, shuffling, truncated Poisson and user-level accounting", "",
         "Generated by `python -m benchmarks.batches` and `python -m benchmarks.batches_peers` (parts cached in "
         "results/batches/*.json).  Gaussian "
         "mechanism (unless a section names another noise), add_remove, every epsilon a certified bound at "
         "delta = 1e-5 unless marked as a Monte Carlo estimate.", ""]
    if "shapes" in parts:
        rows = parts["shapes"]
        L += ["## Poisson vs random allocation / shuffle (same batch size q = 1/t)", "",
              "Random allocation (RA): where its lattices fit (lattice pairs = both / upper), the PLD accountant "
              "composes the per-epoch pairs of docs/MATH.md 13.2 (upper: a lattice pair dominating the epoch) and 13.3 "
              "(lower: a lattice pair dominated by it), once per epoch; else the unamplified upper and the epoch-sum "
              "lower. "
              "The RA lower reported is the larger of the scheme's and the max-coordinate lower bound.  Shuffle: "
              "lower = the larger of the scheme's (where the lower lattice fits: the same dominated pair as RA, "
              "docs/MATH.md 13.4; else the epoch sum) and the max-coordinate lower bound, upper = no amplification "
              "(docs/MATH.md 13).  RA seconds = the random-allocation accountant (build and query).", "",
              "| sigma | t = 1/q | epochs | steps | Poisson [lower, upper] | RA [lower, upper] | lattice pairs | "
              "shuffle [lower, upper] (lower: scheme / max-coord) | RA upper / Poisson upper | "
              "RA lower / Poisson upper | shuffle lower / Poisson upper | RA seconds |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            slo = max(r["sum_lower"], r["max_lower"])
            rlo = max(r.get("ra_lower", r["sum_lower"]), r["max_lower"])
            L.append(f"| {r['sigma']} | {r['t']} | {r['epochs']} | {r['steps']} | [{_g(r['poisson_lower'])}, "
                     f"{_g(r['poisson_upper'])}] | [{_g(rlo)}, {_g(r['upper'])}] | "
                     f"{_lattices(r)} | [{_g(slo)}, {_g(r.get('shuffle_upper'))}] "
                     f"({_g(r['sum_lower'])} / {_g(r['max_lower'])}) | {r['upper'] / r['poisson_upper']:.3f} | "
                     f"{rlo / r['poisson_upper']:.3f} | {slo / r['poisson_upper']:.3f} | "
                     f"{r.get('ra_seconds', math.nan):.2f} |")
        n_above = sum(max(r["sum_lower"], r["max_lower"]) > r["poisson_upper"] for r in rows)
        best = max(rows, key=lambda r: max(r["sum_lower"], r["max_lower"]) / r["poisson_upper"])
        best_ratio = max(best["sum_lower"], best["max_lower"]) / best["poisson_upper"]
        amp = [r for r in rows if r.get("amplified")]
        fine = [r for r in amp if not r.get("coarse")]
        coarse = [r for r in amp if r.get("coarse")]
        ratios = [r["upper"] / r["poisson_upper"] for r in fine]
        cr = [r["upper"] / r["poisson_upper"] for r in coarse]
        both = [r for r in amp if r.get("lower_lattice")]
        widths = [(r["upper"] - max(r["ra_lower"], r["max_lower"])) / r["upper"] for r in both] or [math.nan]
        above = [r for r in rows if max(r["sum_lower"], r["max_lower"]) > r["poisson_upper"]]
        L += ["", f"Rows where the shuffle certified lower bound exceeds the Poisson upper bound: {n_above} of "
              f"{len(rows)}"
              + (" (" + ", ".join(f"sigma {r['sigma']}, t = {r['t']}, {r['epochs']} epochs: "
                                  f"{max(r['sum_lower'], r['max_lower']):.4g} > {r['poisson_upper']:.4g}"
                                  for r in above) + "): the published finding (Chua et al., arXiv 2411.04205: "
                 "shuffled DP-SGD certifiably less private than its Poisson accounting), here certified on both "
                 "sides." if above else
                 f".  The largest ratio shuffle lower / Poisson upper is {best_ratio:.3f} (sigma {best['sigma']}, "
                 f"t = {best['t']}).") + "", "",
              f"Random allocation with the per-epoch lattice pairs: {len(amp)} of {len(rows)} rows, {len(coarse)} of "
              "them on a coarser lattice (docs/MATH.md 13.2, \"Small sigma\": the default one would exceed 2^22 "
              "points, the likelihood ratio's lognormal tail being heavy)"
              + (f", where RA upper / Poisson upper ranges {min(cr):.3f} to {max(cr):.3f}" if cr else "")
              + ("; at sigma " + ", ".join(sorted({str(r['sigma']) for r in coarse
                                                    if r['upper'] > 0.95 * r['shuffle_upper']}))
                 + " the coarse pair's delta floor (its P(+inf), about 1e-5 per epoch) exceeds delta and the upper "
                 "bound stays within 5% of the unamplified one"
                 if any(r['upper'] > 0.95 * r['shuffle_upper'] for r in coarse) else "")
              + (f"; the others (sigma <= {max(r['sigma'] for r in rows if not r.get('amplified'))}) keep the "
                 "unamplified upper and the epoch-sum lower" if len(amp) < len(rows) else "")
              + ".  On the default lattice RA upper / Poisson upper ranges "
              f"{min(ratios):.3f} to {max(ratios):.3f}: at or below Poisson except at t = 10 (q = 0.1), consistent "
              "with Feldman & Shenfeld (arXiv 2602.17284: random allocation at least as private as Poisson in the "
              f"DP-SGD regime).  Where the lower lattice pair fits too ({len(both)} rows; its FFT needs t K <= 2^23 "
              "cells), the certified RA interval is at most "
              f"{100 * max(widths):.2f}% wide (relative to its upper end).  Rows where the certified RA lower bound exceeds the Poisson upper bound (random "
              "allocation certifiably less private than Poisson at the same batch size): "
              + (", ".join(f"sigma {r['sigma']}, t = {r['t']}, {r['epochs']} epochs "
                           f"({max(r['ra_lower'], r['max_lower']):.4g} > {r['poisson_upper']:.4g})"
                           for r in amp if max(r["ra_lower"], r["max_lower"]) > r["poisson_upper"]) or "none")
              + ".", ""]
    if "user" in parts:
        rows = parts["user"]
        L += ["## User-level accounting against group privacy", "",
              "Poisson sampling, a user with up to g records (docs/MATH.md 13.1).  Conversion = the group-privacy "
              "conversion (eps, delta) -> (g eps, g e^((g-1) eps) delta) of the example-level certified curve: "
              "from its upper curve (what a certified accountant lets one report; inf = no eps1 <= 100 "
              "qualifies) and from its lower curve (a lower bound on the conversion of the exact curve).", "",
              "| sigma | q | steps | g | user-level [lower, upper] | conversion (upper curve) | conversion (lower "
              "curve) | user upper / conversion (lower curve) | seconds |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            ratio = r["upper"] / r["conversion_lower"] if r["g"] > 1 and 0 < r["conversion_lower"] < math.inf \
                else math.nan
            L.append(f"| {r['sigma']} | {r['q']} | {r['steps']} | {r['g']} | [{_g(r['lower'])}, {_g(r['upper'])}] | "
                     f"{_g(r['conversion_upper']) if r['g'] > 1 else '-'} | "
                     f"{_g(r['conversion_lower']) if r['g'] > 1 else '-'} | {_g(ratio, '.3f') if r['g'] > 1 else '-'} | "
                     f"{r['seconds']:.2f} |")
        gr = [r for r in rows if r["g"] > 1 and math.isfinite(r["upper"])]
        below = sum(r["upper"] < r["conversion_lower"] for r in gr)
        fin = [r for r in gr if math.isfinite(r["conversion_upper"])]
        below_up = sum(r["upper"] <= r["conversion_upper"] for r in fin)
        consistent = all(r["lower"] <= r["conversion_upper"] for r in fin)
        L += ["", f"User-level certified upper below the lower-curve conversion in {below} of {len(gr)} rows with "
              f"g > 1, and below the upper-curve conversion (what one can report through group privacy) in "
              f"{below_up} of the {len(fin)} rows where that is finite.  Where it is not below the lower-curve "
              "conversion (sigma >= 2 with q = 0.001, eps < 0.5: group privacy is nearly tight at such small eps) "
              "the user-level interval overlaps the conversion's bracket [lower-curve, upper-curve conversion]: "
              "the difference is within the discretisation.  Consistency check (the exact "
              "user-level curve lies below the conversion of the exact example-level curve, so the user-level "
              f"certified lower must lie below the upper-curve conversion): {consistent}.", ""]
    if "mc" in parts:
        rows = parts["mc"]
        n = rows[0]["n_samples"]
        L += ["## Monte Carlo soundness of random allocation", "",
              f"{n:.0e} samples per direction (remove: under P; add: under Q), seeded; the exact random-allocation "
              "pair (one record, the others contributing 0: the worst case).  Estimate = the larger direction; "
              "eta = Hoeffding half-width (all estimates of a case within eta with probability >= 1 - 1e-3); "
              "se = standard error.  Certified lower = max(the scheme's lower: the dominated lattice pair of "
              "docs/MATH.md 13.3, max-coordinate lower); certified upper = the dominating lattice pair (13.2); "
              "inside = [estimate - eta, estimate + eta] meets [certified lower, certified upper].", "",
              "| t | sigma | epochs | eps | certified lower (lattice / max-coord) | MC estimate | eta | 3 se | "
              "certified upper | estimate - lower | upper - estimate | inside |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lo = max(r.get("ra_lower", r.get("sum_lower", 0.0)), r["max_lower"])
            L.append(f"| {r['t']} | {r['sigma']} | {r['epochs']} | {r['eps']:.4g} | "
                     f"{_g(r.get('ra_lower', r.get('sum_lower')))} / {_g(r['max_lower'])} | {r['estimate']:.5g} | "
                     f"{r['eta']:.1e} | {3 * r['se']:.1e} | {_g(r['upper'])} | {r['estimate'] - lo:.1e} | "
                     f"{r['upper'] - r['estimate']:.1e} | {'yes' if r['inside'] else 'NO'} |")
        secs = sorted({(r["t"], r["sigma"], r["epochs"], r["mc_seconds"]) for r in rows})
        L += ["", f"All inside: {all(r['inside'] for r in rows)} ({sum(r['inside'] for r in rows)} of {len(rows)}).  "
              f"Monte Carlo time {sum(s[3] for s in secs):.0f} s on one core for the 8 cases.  The test "
              "(tests/test_allocation.py::test_monte_carlo_inside_the_certified_interval) runs the same cases at "
              "2e5 samples per direction, with empirical Bernstein intervals at level 1e-3.", ""]
    L += _render_peers(parts)
    OUT.mkdir(exist_ok=True)
    (OUT / "BATCHES.md").write_text("\n".join(L) + "\n")
    _plots(parts)


def _pct(x):
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _render_peers(parts) -> list[str]:
    """The sections of :mod:`benchmarks.batches_peers` (truncated Poisson, noise saving)."""
    L = []
    if "truncated" in parts:
        rows = parts["truncated"]
        L += ["## Truncated Poisson (a capped batch) beside dp_accounting", "",
              "Each record sampled with probability q from n records, a batch above the cap cut to a uniform subset of "
              "the cap (docs/MATH.md 2.6); add_remove, delta = 1e-5.  dp_accounting = its `PLDAccountant` on the same "
              "`TruncatedSubsampledGaussianDpEvent` (default discretisation: a pessimistic estimate, no interval); "
              "both timed in the same run.  Poisson = the same rate without a cap.", "",
              "| sigma | q | n | cap | P(cut) | certified [lower, upper] | dp_accounting | ours / theirs (upper) | "
              "Poisson [lower, upper] | cost of the cap (lower / Poisson upper) | seconds (ours / theirs) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            L.append(f"| {r['sigma']} | {r['q']} | {r['n']:,} | {r['batch_cap']} | {r['cut_probability']:.3g} | "
                     f"[{r['lower']:.4g}, {r['upper']:.4g}] | {r['dp_accounting']:.4g} | "
                     f"{r['upper'] / r['dp_accounting']:.4f} | [{r['poisson_lower']:.4g}, {r['poisson_upper']:.4g}] | "
                     f"{r['lower'] / r['poisson_upper']:.3f} | {r['seconds']:.2f} / {r['dp_accounting_seconds']:.2f} |")
        ratio = [r["upper"] / r["dp_accounting"] for r in rows]
        inside = sum(r["lower"] <= r["dp_accounting"] * (1 + 1e-9) for r in rows)
        L += ["", f"Certified upper / dp_accounting: {min(ratio):.4f} to {max(ratio):.4f}; dp_accounting's value lies "
              f"above the certified lower end in {inside} of {len(rows)} rows.  Time ratio (ours / theirs): "
              f"median {sorted(r['seconds'] / r['dp_accounting_seconds'] for r in rows)[len(rows) // 2]:.2f}.", ""]
    if "allocation" in parts:
        rows = parts["allocation"]
        L += ["## Random allocation beside PLD_accounting (Feldman and Shenfeld)", "",
              "Each record in k of the t steps of every epoch, chosen uniformly; Gaussian noise, add_remove, "
              "delta = 1e-5.  PLD_accounting = `gaussian_allocation_epsilon_range` of its PyPI package (version 2.0, "
              f"numba {'on' if rows and rows[0]['numba'] else 'off'}), its upper and lower bounds at its default "
              "accuracy; pldlib = the PLD accountant with `sampling=\"random_allocation\"` (k > 1: "
              "`selections=k`, docs/MATH.md 13.8: upper = one step per block of t/k steps, the blocks composed; "
              "lower = the cell-index sum).  Both timed in the same run, each shape from empty caches.  "
              "Poisson = pldlib's certified interval at the same rate q = k/t.  dp_accounting's pull request "
              "adding `RandomAllocationDpEvent` is not in a release and is not run here (pldlib accepts that event "
              "by its fields).", "",
              "| sigma | t | epochs | k | pldlib [lower, upper] | PLD_accounting [lower, upper] | overlap | "
              "width pldlib / theirs | Poisson q = k/t [lower, upper] | pldlib upper / Poisson upper | "
              "seconds (pldlib / theirs) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            theirs = f"[{r['peer_lower']:.4g}, {r['peer_upper']:.4g}]"
            pois = f"[{r['poisson_lower']:.4g}, {r['poisson_upper']:.4g}]" if "poisson_upper" in r else "-"
            rp = f"{r['upper'] / r['poisson_upper']:.3f}" if "poisson_upper" in r else "-"
            if "upper" in r:
                ok = r["lower"] <= r["peer_upper"] * (1 + 1e-9) and r["peer_lower"] <= r["upper"] * (1 + 1e-9)
                wr = (r["upper"] - r["lower"]) / max(r["peer_upper"] - r["peer_lower"], 1e-300)
                L.append(f"| {r['sigma']} | {r['t']} | {r['epochs']} | {r['k']} | [{r['lower']:.4g}, {r['upper']:.4g}] | "
                         f"{theirs} | {'yes' if ok else 'NO'} | {wr:.3f} | {pois} | {rp} | "
                         f"{r['seconds']:.2f} / {r['peer_seconds']:.2f} |")
            else:
                L.append(f"| {r['sigma']} | {r['t']} | {r['epochs']} | {r['k']} | not supported (k > 1) | {theirs} | - | - | "
                         f"{pois} | - | - / {r['peer_seconds']:.2f} |")
        kk = [r for r in rows if r["k"] > 1 and "upper" in r]
        if kk:
            tighter_up = sum(r["upper"] <= r["peer_upper"] for r in kk)
            tighter_lo = sum(r["lower"] >= r["peer_lower"] for r in kk)
            below = sum(r["upper"] < r["poisson_upper"] for r in kk if "poisson_upper" in r)
            sp = sorted(r["peer_seconds"] / max(r["seconds"], 1e-9) for r in kk)
            L += ["", f"k > 1 ({len(kk)} shapes): pldlib's upper bound is the smaller in {tighter_up}, its lower bound "
                  f"the larger in {tighter_lo}; the certified upper bound is below Poisson's at the same rate in "
                  f"{below}; PLD_accounting takes {sp[0]:.1f}x to {sp[-1]:.1f}x pldlib's time (median "
                  f"{sp[len(sp) // 2]:.1f}x)."]
        L.append("")
    if "kmc" in parts:
        rows = parts["kmc"]
        n = rows[0]["samples"] if rows else 0
        L += ["## Monte Carlo soundness of k of t random allocation", "",
              f"{n:.0e} samples per direction (remove: under P; add: under Q), seeded, of the exact pair (one record in "
              "a uniform k-subset of the t steps of each epoch, the others contributing 0; its likelihood ratio is the "
              "elementary symmetric polynomial e_k of the steps' ratios, docs/MATH.md 13.8).  Estimate = the larger "
              "direction; eta = Hoeffding half-width (each case's estimates within eta with probability >= 1 - 1e-3); "
              "inside = [estimate - eta, estimate + eta] meets the certified [lower, upper].", "",
              "| t | k | sigma | epochs | eps | certified lower | MC estimate | eta | certified upper | "
              "relative width | inside |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            L.append(f"| {r['t']} | {r['k']} | {r['sigma']} | {r['epochs']} | {r['eps']:.4g} | {r['lower']:.4g} | "
                     f"{r['estimate']:.5g} | {r['eta']:.1e} | {r['upper']:.4g} | "
                     f"{(r['upper'] - r['lower']) / max(r['upper'], 1e-300):.3f} | {'yes' if r['inside'] else 'NO'} |")
        mc_s = sum({(r["t"], r["k"], r["sigma"], r["epochs"]): r["mc_seconds"] for r in rows}.values())
        L += ["", f"All inside: {all(r['inside'] for r in rows)} ({sum(r['inside'] for r in rows)} of {len(rows)}).  "
              f"Monte Carlo time {mc_s:.0f} s on one core; certified intervals "
              f"{max(r['seconds'] for r in rows):.2f} s at most per case.  The test "
              "(tests/test_allocation_k_of_t.py) runs these shapes but the largest, (16, 4, 1.5, 10), at 3e5 "
              "samples per direction, with empirical Bernstein intervals at level 1e-3.", ""]
    if "noise" in parts:
        rows, mc = parts["noise"]["rows"], parts["noise"]["mc"]
        names = {"laplace": "Laplace, scale", "rr": "randomized response, eps0", "approx_dp": "(eps0, 1e-8) step, eps0"}
        L += ["## Random allocation with other noises", "",
              "One record in one of the t steps of every epoch; add_remove, delta = 1e-5, sensitivity 1.  Certified = "
              "the PLD accountant's per-epoch pairs built from the noise's own pair (docs/MATH.md 13.9: upper = the "
              "amplified lattice pair, proven for non-adaptive queries; lower = the dominated cell-index pair).  "
              "Poisson = pldlib's certified interval at the same rate q = 1/t (none for the finite pairs, which have "
              "no subsampled pair in pldlib); unamplified = the noise's pair composed once per epoch (the record in "
              "one step, what the per-epoch argument without amplification gives).", "",
              "| noise | t | epochs | certified [lower, upper] | relative width | Poisson [lower, upper] | "
              "unamplified [lower, upper] | upper / unamplified upper | seconds |",
              "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            pois = f"[{r['poisson_lower']:.4g}, {r['poisson_upper']:.4g}]" if "poisson_upper" in r else "-"
            un = f"[{r['unamplified_lower']:.4g}, {r['unamplified_upper']:.4g}]" if "unamplified_upper" in r else "-"
            ru = f"{r['upper'] / r['unamplified_upper']:.3f}" if "unamplified_upper" in r else "-"
            L.append(f"| {names[r['noise']]} {r['parameter']} | {r['t']} | {r['epochs']} | "
                     f"[{r['lower']:.4g}, {r['upper']:.4g}] | {(r['upper'] - r['lower']) / r['upper']:.4f} | {pois} | "
                     f"{un} | {ru} | {r['seconds']:.2f} |")
        worse = [r for r in rows if "poisson_upper" in r and r["lower"] > r["poisson_upper"]]
        ratio = [r["upper"] / r["unamplified_upper"] for r in rows if "unamplified_upper" in r]
        L += ["", f"Certified upper / unamplified upper: {min(ratio):.3f} to {max(ratio):.3f}.  Rows where random "
              f"allocation is certifiably less private than Poisson sampling at the same rate (its certified lower "
              f"bound above Poisson's certified upper bound): {len(worse)} of "
              f"{sum('poisson_upper' in r for r in rows)}"
              + (" (" + "; ".join(f"{names[r['noise']]} {r['parameter']}, t = {r['t']}, {r['epochs']} "
                                  f"epoch{'s' if r['epochs'] > 1 else ''}: "
                                  f"{r['lower']:.4g} > {r['poisson_upper']:.4g}" for r in worse) + ")" if worse else "")
              + ".  With Laplace noise, unlike Gaussian noise in the DP-SGD regime, random allocation is not "
              "more private than Poisson sampling on these shapes."
              if worse else "."]
        if mc:
            n = mc[0]["samples"]
            L += ["", f"Monte Carlo of the exact Laplace pair (scale b, the others contributing 0, one dimension), "
                  f"{n:.0e} samples per direction, seeded; eta = Hoeffding half-width at beta = 1e-3 per case.", "",
                  "| b | t | epochs | eps | certified lower | MC estimate | eta | certified upper | inside |",
                  "|---|---|---|---|---|---|---|---|---|"]
            for r in mc:
                L.append(f"| {r['b']} | {r['t']} | {r['epochs']} | {r['eps']:.4g} | {r['lower']:.5g} | "
                         f"{r['estimate']:.5g} | {r['eta']:.1e} | {r['upper']:.5g} | {'yes' if r['inside'] else 'NO'} |")
            L += ["", f"All inside: {all(r['inside'] for r in mc)} ({sum(r['inside'] for r in mc)} of {len(mc)})."]
        L.append("")
    if "saving" in parts:
        rows = parts["saving"]
        L += ["## Certified noise saving of random allocation over Poisson", "",
              "Same expected batch size (q = k/t: each record in k of the t steps of an epoch), same target eps at "
              "delta = 1e-5, add_remove.  sigma (Poisson) and "
              "sigma (RA) = the smallest sigma whose certified upper bound meets the target (pldlib.calibrate); "
              "floor (RA) = the largest sigma at which random allocation's certified *lower* bound still exceeds "
              "the target, so no accountant can certify less noise than it.  The true saving lies between "
              "'certified' (what can be claimed today) and 'at most'.", "",
              "| t | k | epochs | steps | target eps | sigma (Poisson) | sigma (RA) | floor (RA) | saving certified | "
              "saving at most | seconds (Poisson / RA) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            L.append(f"| {r['t']} | {r.get('k', 1)} | {r['epochs']} | {r['steps']:,} | {r['eps']} | {r['sigma_poisson']:.4f} | "
                     f"{r['sigma_ra']:.4f} | {_g(r['sigma_ra_floor'], '.4f')} | {100 * r['saving_certified']:.2f}% | "
                     f"{_pct(r['saving_at_most'])} | {r['seconds_poisson']:.1f} / {r['seconds_ra']:.1f} |")
        best = max(rows, key=lambda r: r["saving_certified"])
        most = [r["saving_at_most"] for r in rows if r["saving_at_most"] is not None]
        L += ["", f"Largest certified saving on these shapes: {100 * best['saving_certified']:.2f}% (t = {best['t']}, "
              f"k = {best.get('k', 1)}, {best['epochs']} epochs, eps {best['eps']}); where a floor is certified, at most "
              f"{_pct(max(most)) if most else 'n/a'}.  n/a: random allocation's certified lower bound is too weak "
              "within 20% below its certified sigma to bound the saving.  Dong and Özgür (arXiv 2605.07072) report "
              "up to 9.6% less noise than Poisson with a Monte Carlo accountant; on the shapes above where a floor "
              f"is certified, no accountant can certify more than {_pct(max(most)) if most else 'n/a'} (their own "
              "shapes were not at hand).", ""]
    return L


def _lattices(r) -> str:
    """The 'lattice pairs' cell of a shapes row: both / upper / no, '(coarse)' on a fallback lattice."""
    if not r.get("amplified"):
        return "no"
    out = "both" if r.get("lower_lattice") else "upper"
    return out + (" (coarse)" if r.get("coarse") else "")


def _plots(parts) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "shapes" in parts:
        rows = parts["shapes"]
        fig, ax = plt.subplots(figsize=(9, 4))
        x = np.arange(len(rows))
        ax.plot(x, [r["poisson_upper"] for r in rows], "o", label="Poisson upper")
        ax.vlines(x, [max(r["sum_lower"], r["max_lower"]) for r in rows], [r["shuffle_upper"] for r in rows],
                  color="0.7", lw=6, label="shuffle certified range")
        ax.vlines(x, [max(r.get("ra_lower", r["sum_lower"]), r["max_lower"]) for r in rows], [r["upper"] for r in rows],
                  color="r", lw=2, label="random allocation certified range")
        ax.set_xticks(list(x), [f"s={r['sigma']}\nt={r['t']}\nE={r['epochs']}" for r in rows], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("epsilon at delta 1e-5")
        ax.legend()
        fig.tight_layout()
        fig.savefig(OUT / "batches.png", dpi=120)
        plt.close(fig)
    if "user" in parts:
        rows = parts["user"]
        shapes = sorted({(r["sigma"], r["q"], r["steps"]) for r in rows})
        fig, axes = plt.subplots(2, 4, figsize=(13, 6), sharex=True)
        for ax, sh in zip(axes.ravel(), [s for s in shapes if s[2] == 10000] + [s for s in shapes if s[2] == 1000]):
            rs = [r for r in rows if (r["sigma"], r["q"], r["steps"]) == sh]
            gs = [r["g"] for r in rs]
            ax.plot(gs, [r["upper"] for r in rs], "o-", label="user-level (certified upper)")
            ax.plot(gs[1:], [r["conversion_lower"] for r in rs[1:]], "s--", label="group privacy (lower curve)")
            cu = [r["conversion_upper"] for r in rs[1:]]
            ax.plot(gs[1:], [c if math.isfinite(c) else np.nan for c in cu], "^:", label="group privacy (upper curve)")
            ax.set_title(f"sigma={sh[0]} q={sh[1]} steps={sh[2]}", fontsize=8)
            ax.set_yscale("log")
        axes[0, 0].legend(fontsize=7)
        for ax in axes[1]:
            ax.set_xlabel("g (records per user)")
        for ax in axes[:, 0]:
            ax.set_ylabel("epsilon at delta 1e-5")
        fig.tight_layout()
        fig.savefig(OUT / "user_level.png", dpi=110)
        plt.close(fig)
    if "mc" in parts:
        rows = parts["mc"]
        fig, ax = plt.subplots(figsize=(10, 4))
        x = np.arange(len(rows))
        ax.vlines(x, [max(r.get("ra_lower", r.get("sum_lower", 0.0)), r["max_lower"]) for r in rows],
                  [r["upper"] for r in rows], color="0.6", lw=6, label="certified [lower, upper]")
        ax.errorbar(x, [r["estimate"] for r in rows], yerr=[r["eta"] for r in rows], fmt="k.", label="Monte Carlo +- eta")
        ax.set_xticks(list(x), [f"t={r['t']} s={r['sigma']}\nE={r['epochs']} e={r['eps']:.2g}" for r in rows],
                      fontsize=5, rotation=90)
        ax.set_ylabel("delta(eps)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(OUT / "batches_mc.png", dpi=120)
        plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--part", choices=("shapes", "user", "mc", "all"), default="all")
    ap.add_argument("--samples", type=int, default=10_000_000, help="Monte Carlo samples per direction (mc part)")
    ap.add_argument("--render", action="store_true", help="only rewrite the markdown and plots from the cache")
    a = ap.parse_args(argv)
    CACHE.mkdir(parents=True, exist_ok=True)
    if not a.render:
        todo = ("shapes", "user", "mc") if a.part == "all" else (a.part,)
        for part in todo:
            t0 = time.perf_counter()
            rows = {"shapes": run_shapes, "user": run_user, "mc": lambda: run_mc(a.samples)}[part]()
            (CACHE / f"{part}.json").write_text(json.dumps(rows, indent=1, default=_f))
            print(f"{part}: {time.perf_counter() - t0:.1f} s", flush=True)
    render()


if __name__ == "__main__":
    main()
