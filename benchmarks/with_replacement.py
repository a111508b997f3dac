"""Batches drawn with replacement beside sampling without replacement and Poisson sampling, and the
Monte Carlo check of many steps (docs/MATH.md 2.7).

For five DP-SGD shapes (noise multiplier sigma, batch size B, dataset size n, steps): the
certified eps(1e-5) interval of each scheme at the same rate q = B/n, the time of the
with-replacement query, and the smallest certified sigma for eps(1e-5) <= 8 of with-replacement
and of Poisson batches (pldlib.calibration.calibrate_parameter; each answer checked).  Then seeded
Monte Carlo of the extremal data set (the record at +1, the others at -1, whose curve the add/remove
pair is) at 10^7 samples per direction, with a Hoeffding band at 1 - 1e-6 jointly over every
value of the run.

    python -m benchmarks.with_replacement   -> section of results/BATCHES.md
"""
from __future__ import annotations

import math
import time
import warnings

import numpy as np

from benchmarks.report import replace_marked

DELTA = 1e-5
#: (sigma, B, n, steps)
SHAPES = [(1.0, 256, 60_000, 2_000), (1.1, 256, 60_000, 10_000), (0.8, 1_024, 50_000, 5_000),
          (2.0, 4_096, 1_000_000, 10_000), (1.5, 64, 10_000, 3_000)]
TARGET = 8.0
#: Monte Carlo shapes (sigma, B, n, steps) and epsilons
MC_SHAPES = [(1.0, 16, 200, 20), (2.0, 64, 1_000, 50), (0.8, 4, 100, 10)]
MC_EPS = (0.5, 1.0, 2.0)
MC_SAMPLES = 10_000_000
START, END = "<!-- withreplacement:start -->", "<!-- withreplacement:end -->"


def _eps(mech, steps, relation="add_remove"):
    from pldlib.methods.pld import PLDAccountant

    t0 = time.perf_counter()
    r = PLDAccountant(relation).compose(mech.event, steps).epsilon(DELTA)
    return r, time.perf_counter() - t0


def _sigma(make, steps):
    """Smallest certified sigma for eps(DELTA) <= TARGET and the largest one certified to miss it."""
    from pldlib.calibration import calibrate_parameter

    r = calibrate_parameter(make, (0.2, 50.0), direction="larger_is_more_private", epsilon=TARGET, delta=DELTA,
                            steps=steps, parameter="sigma", tol=2e-3)
    return r.value, (r.beyond if r.beyond_certified else float("nan"))


def mc_band(sigma, B, n, steps, eps, samples, direction, seed, chunk=500_000):
    """(lo, hi) per eps: Hoeffding band at 1 - 1e-6 / (number of bands in the run) of delta(eps) of
    the extremal data set's ``steps`` steps (numpy, from the densities)."""
    from scipy import stats

    k = np.arange(B + 1)
    w = stats.binom.pmf(k, B, 1.0 / n)
    keep = w > 1e-300
    k, w = k[keep], w[keep]
    rng = np.random.default_rng(seed)
    sums = np.zeros(len(eps))
    done = 0
    while done < samples:
        m = min(chunk, samples - done)
        total = np.zeros(m)
        for _ in range(steps):
            y = rng.normal(2.0 * rng.choice(k, size=m, p=w / w.sum()), sigma) if direction == "remove" else \
                rng.normal(0.0, sigma, m)
            a = np.log(w)[None, :] + (2.0 * k[None, :] * y[:, None] - 2.0 * k[None, :] ** 2) / sigma ** 2
            top = a.max(axis=1)
            ell = top + np.log(np.exp(a - top[:, None]).sum(axis=1))
            total += ell if direction == "remove" else -ell
        sums += [np.sum(np.clip(1.0 - np.exp(e - total), 0.0, 1.0)) for e in eps]
        done += m
    n_bands = len(MC_SHAPES) * len(MC_EPS) * 2
    half = math.sqrt(math.log(2 * n_bands / 1e-6) / (2 * samples))
    return [(s / samples - half, s / samples + half) for s in sums]


def main(out: str = "results/BATCHES.md") -> None:
    from pldlib.events import WithReplacementGaussianEvent
    from pldlib.mechanisms import Gaussian
    from pldlib.methods.pld import PLDAccountant

    warnings.simplefilter("ignore")
    rows = []
    for sigma, B, n, steps in SHAPES:
        q = B / n
        wr, t_wr = _eps(Gaussian(sigma, sampling="with_replacement", batch_size=B, dataset_size=n), steps)
        wor, _ = _eps(Gaussian(sigma, q=q, sampling="wor"), steps)
        poi, t_poi = _eps(Gaussian(sigma, q=q, sampling="poisson"), steps)
        sub, t_sub = _eps(Gaussian(sigma, sampling="with_replacement", batch_size=B, dataset_size=n), steps,
                          "substitution")
        s_wr, s_wr_lo = _sigma(lambda s: Gaussian(s, sampling="with_replacement", batch_size=B, dataset_size=n),
                               steps)
        s_poi, s_poi_lo = _sigma(lambda s: Gaussian(s, q=q, sampling="poisson"), steps)
        rows.append(dict(sigma=sigma, B=B, n=n, steps=steps, wr=wr, t_wr=t_wr, wor=wor, poi=poi, t_poi=t_poi,
                         sub=sub, t_sub=t_sub, s_wr=s_wr, s_wr_lo=s_wr_lo, s_poi=s_poi, s_poi_lo=s_poi_lo))
        print(rows[-1], flush=True)
    mc = []
    for i, (sigma, B, n, steps) in enumerate(MC_SHAPES):
        for direction in ("remove", "add"):
            t0 = time.perf_counter()
            band = mc_band(sigma, B, n, steps, MC_EPS, MC_SAMPLES, direction, seed=100 + i)
            t_mc = time.perf_counter() - t0
            cert = PLDAccountant(direction).compose(WithReplacementGaussianEvent(sigma, n, B), steps) \
                .delta(np.array(MC_EPS))
            for e, (lo, hi), cl, cu in zip(MC_EPS, band, cert.lower, cert.upper):
                mc.append(dict(sigma=sigma, B=B, n=n, steps=steps, direction=direction, eps=e, mc_lo=lo, mc_hi=hi,
                               lower=float(cl), upper=float(cu), inside=bool(cl <= hi and lo <= cu), t_mc=t_mc))
            print(mc[-1], flush=True)

    def iv(r):
        return f"[{r.lower:.4g}, {r.upper:.4g}]"

    def miss(v):  # (the largest sigma certified to miss the target, when the search certified one)
        return "-" if math.isnan(v) else f"{v:.4g}"

    lines = [START, "## Batches drawn with replacement beside WOR and Poisson", "",
             "Generated by `python -m benchmarks.with_replacement`. Each batch is B independent uniform draws "
             "from n records (with replacement); the other columns are sampling without replacement and Poisson "
             f"sampling at the same rate q = B/n. Certified eps(delta = {DELTA:g}) intervals (PLD accountant, "
             "automatic grid), add_remove unless marked; sigma for eps <= 8: the smallest certified noise "
             "multiplier, with the largest one certified to miss the target in parentheses.", "",
             "| sigma | B | n | steps | with replacement | WOR | Poisson | WR / Poisson (upper) "
             "| WR substitution | WR time (s) | Poisson time (s) | sigma for eps <= 8: WR | Poisson "
             "| noise WR / Poisson |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['sigma']:g} | {r['B']:,} | {r['n']:,} | {r['steps']:,} | {iv(r['wr'])} | {iv(r['wor'])} "
                     f"| {iv(r['poi'])} | {r['wr'].upper / r['poi'].upper:.2f} | {iv(r['sub'])} | {r['t_wr']:.2f} "
                     f"| {r['t_poi']:.2f} | {r['s_wr']:.4g} ({miss(r['s_wr_lo'])}) | {r['s_poi']:.4g} ({miss(r['s_poi_lo'])}) "
                     f"| {r['s_wr'] / r['s_poi']:.2f} |")
    inside = sum(m["inside"] for m in mc)
    lines += ["", f"Monte Carlo of the extremal data set (record at +1, the others at -1), {MC_SAMPLES:,} samples "
                  "per direction, seeded, Hoeffding band at 1 - 1e-6 jointly over the "
                  f"{len(mc)} values: {inside} of {len(mc)} certified delta(eps) intervals meet the band.", "",
              "| sigma | B | n | steps | direction | eps | Monte Carlo band | certified | MC time (s) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for m in mc:
        lines.append(f"| {m['sigma']:g} | {m['B']} | {m['n']:,} | {m['steps']} | {m['direction']} | {m['eps']:g} "
                     f"| [{max(m['mc_lo'], 0):.4g}, {m['mc_hi']:.4g}] | [{m['lower']:.4g}, {m['upper']:.4g}] "
                     f"| {m['t_mc']:.0f} |")
    lines.append(END)
    replace_marked(out, START, END, "\n".join(lines))


if __name__ == "__main__":
    main()
