"""Mixtures of Gaussians of banded-matrix (BandMF) shape: pldlib's certified delta(eps) against a
seeded Monte Carlo estimate with a stated confidence, and dp_accounting's PLD value beside them.

Shapes: a b-banded Toeplitz strategy with band coefficients c_j proportional to r^j (unit norm)
and Poisson participation with probability p in each round; one round's output, given which of
the b rounds its band covers the example took part in (each independently with probability p),
is Gaussian with sensitivity sum_{j in S} c_j: the mixture of Gaussians (noise sigma,
sensitivities sum_{j in S} c_j, probabilities p^|S| (1-p)^(b-|S|)) that dp_accounting's
MixtureOfGaussiansDpEvent describes, composed k times under add_remove.

The Monte Carlo interval samples the composed privacy loss of each direction's dominating pair
under P (N samples, a fresh seeded generator per shape); with probability >= 1 - beta every
estimate is within its empirical Bernstein half-width sqrt(2 V ln(4/b) / N) + 7 ln(4/b) / (3 (N-1))
of the truth (Maurer and Pontil 2009; V the sample variance, b = beta / (|E| B), a union bound
over the |E| epsilons and B = 2 directions).  A certified interval is consistent with it when
its upper end is >= the Monte Carlo lower end and its lower end <= the Monte Carlo upper end.

    python -m benchmarks.correlated_mc [--samples 10000000]   -> results/CORRELATED.md
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from pldlib import events as E
from pldlib.methods.pld import PLDAccountant
from pldlib.testing.montecarlo import banded_mixture, events_delta_interval

EPS = (0.0, 0.25, 0.5, 1.0, 1.5)
BETA = 1e-3
#: (bands b, decay r, participation p, sigma, rounds k)
SHAPES = [(2, 0.5, 0.02, 0.8, 10), (2, 0.5, 0.1, 1.5, 10), (3, 0.5, 0.02, 0.8, 10), (3, 0.5, 0.1, 1.5, 10),
          (4, 0.5, 0.02, 0.8, 10), (4, 0.5, 0.1, 1.5, 10), (4, 0.8, 0.05, 1.0, 10), (6, 0.5, 0.02, 0.8, 10),
          (6, 0.5, 0.1, 1.5, 10), (6, 0.8, 0.05, 1.0, 10), (3, 0.8, 0.2, 2.0, 20), (2, 0.3, 0.3, 2.0, 20)]


def dp_accounting_delta(ev: E.MixtureOfGaussiansEvent, k: int, eps) -> list | None:
    try:
        from dp_accounting import dp_event as D
        from dp_accounting.pld import pld_privacy_accountant as P
    except ImportError:
        return None
    acc = P.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(D.MixtureOfGaussiansDpEvent(ev.sigma, list(ev.sensitivities), list(ev.probabilities)), k)
    return [acc.get_delta(e) for e in eps]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--out", default="results/CORRELATED.md")
    a = ap.parse_args(argv)
    eps = np.asarray(EPS)
    rows, bad = [], 0
    for i, (b, r, p, sigma, k) in enumerate(SHAPES):
        ev = banded_mixture(b, r, p, sigma)
        t0 = time.perf_counter()
        iv = PLDAccountant("add_remove").compose(ev, k).delta(eps)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        mc = events_delta_interval("add_remove", [(ev, k)], eps, n_samples=a.samples, beta=BETA, seed=1000 + i,
                                   bound="bernstein")
        t_mc = time.perf_counter() - t0
        t0 = time.perf_counter()
        dpa = dp_accounting_delta(ev, k, eps)
        t_dp = time.perf_counter() - t0
        ok = bool(np.all(iv.upper >= mc.lower) and np.all(iv.lower <= mc.upper))
        bad += not ok
        rows.append((b, r, p, sigma, k, len(ev.sensitivities), iv, mc, dpa, t_ours, t_mc, t_dp, ok))
        print(f"shape {i + 1}/{len(SHAPES)}: b={b} p={p} sigma={sigma} k={k}: {'ok' if ok else 'OUTSIDE'} "
              f"({t_ours:.2f} s ours, {t_mc:.1f} s Monte Carlo)", flush=True)
    L = ["# Correlated noise: mixtures of Gaussians of banded-matrix shape", "",
         f"`python -m benchmarks.correlated_mc --samples {a.samples}`. " + __doc__.split("\n\n")[1].replace("\n", " "),
         "", f"Monte Carlo: N = {a.samples:,} composed samples per direction and shape, confidence 1 - beta = "
             f"{1 - BETA:g} for all {len(EPS)} epsilons and both directions together (empirical Bernstein). "
             "dp_accounting: its PLDAccountant at value_discretization_interval 1e-3 (pessimistic, "
             "not a certified bound).", "",
         f"**{len(SHAPES) - bad} of {len(SHAPES)} shapes consistent at every epsilon** (certified interval and "
         "Monte Carlo interval overlap; an upper end below the Monte Carlo lower end would be unsound).", "",
         "| b | r | p | sigma | rounds | components | eps | pldlib delta [lower, upper] | Monte Carlo [lower, upper] "
         "| dp_accounting | ok |", "|" + "---|" * 11]
    for b, r, p, sigma, k, nc, iv, mc, dpa, t_ours, t_mc, t_dp, ok in rows:
        for j, e in enumerate(EPS):
            L.append(f"| {b} | {r} | {p} | {sigma} | {k} | {nc} | {e} | [{iv.lower[j]:.5g}, {iv.upper[j]:.5g}] | "
                     f"[{mc.lower[j]:.4g}, {mc.upper[j]:.4g}] | {'-' if dpa is None else f'{dpa[j]:.5g}'} | "
                     f"{'yes' if ok else 'NO'} |")
    L += ["", "Seconds per shape (all five epsilons): pldlib "
          f"{np.median([r[9] for r in rows]):.2f} median, {max(r[9] for r in rows):.2f} worst; dp_accounting "
          f"{np.median([r[11] for r in rows]):.2f} median; Monte Carlo {np.median([r[10] for r in rows]):.0f} median.",
          ""]
    Path(a.out).write_text("\n".join(L))
    print(f"written: {a.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
