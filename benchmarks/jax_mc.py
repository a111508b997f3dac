"""Balls-in-bins DP-SGD: pldlib's certified interval beside JAX Privacy's own Monte Carlo accounting.

JAX Privacy 2.x accounts balls-in-bins batch selection (``BallsInBinsSampling(iterations,
cycle_length)``: each example is put in one of ``cycle_length`` bins once, for the whole run, and
bin j is used at steps j, j + b, j + 2b, ...) by Monte Carlo only
(``jax_privacy.experimental.monte_carlo``): privacy-loss samples of its dominating pair in both
directions (``positive_sample`` True and False), and the mean of (1 - e^(eps - L))_+ as delta.
pldlib certifies it (the bin is fixed for the run, so the run is one random-allocation epoch of
b steps whose step is the Gaussian at sigma / sqrt(rounds); docs/MATH.md 14).

Here both run on the same shapes, DP-SGD (``c_col = [1]``), add_remove:

* JAX Privacy's samplers and privacy-loss function, N samples per direction (seeded), with an
  empirical Bernstein interval (Maurer and Pontil 2009) at confidence 1 - BETA jointly over the
  epsilons and both directions (union bound); the add_remove delta is the larger direction's;
* pldlib's certified [lower, upper] (``pldlib.interop.jax_privacy.account``).

A certified interval is consistent with the Monte Carlo band when the two overlap (an upper end
below the band's lower end would be unsound).  Times are measured side by side in the same run.

    python -m benchmarks.jax_mc [--samples 100000]   -> section of results/CORRELATED.md
"""
from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path

from benchmarks.report import replace_marked

import numpy as np

EPS = (0.25, 0.5, 1.0, 2.0)
BETA = 1e-3
CHUNK = 5_000
#: (sigma, cycle_length b, rounds): iterations = b * rounds
SHAPES = [(3.0, 10, 10), (2.0, 8, 4), (4.0, 20, 10), (5.0, 50, 20), (6.0, 25, 16), (3.0, 100, 4)]
START, END = "<!-- jaxmc:start -->", "<!-- jaxmc:end -->"


def compare(pos, neg, iv, j):
    """(Monte Carlo band low, high, estimate, pldlib lower, upper, consistent) at EPS[j], add_remove:
    the larger direction's band and estimate; consistent when the certified interval meets the band."""
    lo_mc = max(pos[j][0] - pos[j][1], neg[j][0] - neg[j][1], 0.0)
    up_mc = max(pos[j][0] + pos[j][1], neg[j][0] + neg[j][1])
    est = max(pos[j][0], neg[j][0])
    lo, up = float(iv.lower[j]), float(iv.upper[j])
    return lo_mc, up_mc, est, lo, up, up >= lo_mc and lo <= up_mc


def mc_delta(sigma: float, b: int, rounds: int, n: int, seed: int, c_col=(1.0,)):
    """(per direction: (delta_hat, half_width)) over EPS, and the seconds taken (``c_col``: the
    banded Toeplitz strategy's coefficients, DP-SGD by default)."""
    from jax_privacy import batch_selection as B
    from jax_privacy.experimental.monte_carlo import sample_generation as G

    strategy = B.BallsInBinsSampling(iterations=b * rounds, cycle_length=b)
    c_col = np.asarray(c_col, dtype=float)
    rng = np.random.default_rng(seed)
    log_term = math.log(4 * len(EPS) * 2 / BETA)  # (two-sided, union over eps and directions)
    t0 = time.perf_counter()
    out = []
    for positive in (True, False):
        losses = np.concatenate([G.get_privacy_loss_sample(strategy, sigma, c_col, seed=rng, positive_sample=positive,
                                                           num_samples=min(CHUNK, n - i))[0]
                                 for i in range(0, n, CHUNK)])
        per = []
        for e in EPS:
            x = -np.expm1(np.minimum(e - losses, 0.0))  # (1 - e^(eps - L))_+, in [0, 1]
            v = float(np.var(x, ddof=1))
            half = math.sqrt(2 * v * log_term / n) + 7 * log_term / (3 * (n - 1))
            per.append((float(np.mean(x)), half))
        out.append(per)
    return out, time.perf_counter() - t0


def ours(sigma: float, b: int, rounds: int):
    from jax_privacy import batch_selection as B

    from pldlib.interop.jax_privacy import account

    t0 = time.perf_counter()
    acc = account(B.BallsInBinsSampling(iterations=b * rounds, cycle_length=b), 10 * b, sigma)
    iv = acc.delta(np.array(EPS))
    return iv, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--out", default="results/CORRELATED.md")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rows, ok_all, n_rows = [], 0, 0
    for i, (sigma, b, rounds) in enumerate(SHAPES):
        (pos, neg), t_mc = mc_delta(sigma, b, rounds, args.samples, seed=1000 + i)
        iv, t_ours = ours(sigma, b, rounds)
        for j, e in enumerate(EPS):
            lo_mc, up_mc, est, lo, up, ok = compare(pos, neg, iv, j)
            ok_all += ok
            n_rows += 1
            rows.append(f"| {sigma} | {b} | {rounds} | {b * rounds} | {e} | [{lo:.5g}, {up:.5g}] | {est:.5g} "
                        f"| [{lo_mc:.4g}, {up_mc:.4g}] | {'yes' if ok else '**no**'} | "
                        + (f"{t_ours:.2f} | {t_mc:.1f} |" if j == 0 else " | |"))
        print(rows[-len(EPS):], flush=True)
    text = "\n".join([
        START,
        "## Balls-in-bins DP-SGD beside JAX Privacy's Monte Carlo accounting",
        "",
        f"`python -m benchmarks.jax_mc --samples {args.samples}`. JAX Privacy's own samplers and privacy-loss "
        "function (`jax_privacy.experimental.monte_carlo`, `BallsInBinsSampling`, `c_col = [1]`), "
        f"N = {args.samples:,} samples per direction, empirical Bernstein band at confidence 1 - {BETA:g} "
        "jointly over the epsilons and both directions; add_remove (the larger direction). pldlib: the "
        "certified interval of `pldlib.interop.jax_privacy.account` (one random-allocation epoch of b steps at "
        "sigma / sqrt(rounds)). Seconds for all three epsilons, measured side by side.",
        "",
        f"**{ok_all} of {n_rows} rows consistent** (the certified interval meets the Monte Carlo band).",
        "",
        "| sigma | bins b | rounds | steps | eps | pldlib delta [lower, upper] | Monte Carlo estimate "
        "| Monte Carlo band | consistent | pldlib s | Monte Carlo s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Banded strategies (more than one band) under balls-in-bins get a certified but wider interval (the "
        "section on banded strategies below); b-min-sep sampling has no certified bound in pldlib and JAX "
        "Privacy accounts it by Monte Carlo only.",
        END,
    ])
    path = Path(args.out)
    replace_marked(path, START, END, text)
    print(f"{ok_all}/{n_rows} consistent; wrote {path}")


if __name__ == "__main__":
    main()
