"""Banded matrix factorisation (BandMF) under cyclic Poisson sampling: certified epsilon and the
certified noise multiplier for a target, beside dp_accounting's PLD accountant on the same
reduced events (docs/MATH.md 13.7), and DP-SGD (b = 1) at the same expected batch size.

Strategy: the banded Toeplitz square root of the prefix-sum matrix, c_k = C(2k, k) / 4^k for
k < b (the coefficients of (1 - x)^(-1/2), truncated to b bands).  n = 50,000 records, expected
batch 500 (DP-SGD: q = 0.01; cyclic Poisson: each step uses one of b groups of n / b records, each
with probability 0.01 b), 2,000 steps (20 epochs), delta = 1e-5, add_remove.  Times measured side
by side in the same run.

    python -m benchmarks.bandmf   -> section "BandMF under cyclic Poisson sampling" of results/CORRELATED.md
"""
from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

from pldlib.correlated import BandedStrategy, account_bandmf, bandmf_cyclic_poisson, calibrate_bandmf

N, BATCH, STEPS, DELTA = 50_000, 500, 2000, 1e-5
BANDS = (1, 2, 4, 16, 64)
SIGMAS = (0.8, 1.5)
TARGETS = (2.0, 8.0)
START, END = "<!-- bandmf:start -->", "<!-- bandmf:end -->"


def coefs(b: int) -> list[float]:
    return [math.comb(2 * k, k) / 4 ** k for k in range(b)]


def dp_accounting_eps(sigma, strategy, q):
    from dp_accounting import dp_event as D
    from dp_accounting.pld import pld_privacy_accountant as P

    worst = 0.0
    for evs in bandmf_cyclic_poisson(sigma, strategy, q):
        acc = P.PLDAccountant()
        for ev, k in evs:
            g = D.GaussianDpEvent(ev.event.sigma if hasattr(ev, "event") else ev.sigma)
            acc.compose(D.PoissonSampledDpEvent(q, g) if q < 1 else g, k)
        worst = max(worst, acc.get_epsilon(DELTA))
    return worst


def main() -> None:
    warnings.simplefilter("ignore")
    rows = []
    for b in BANDS:
        q = min(1.0, BATCH * b / N)
        s = BandedStrategy.toeplitz(coefs(b), STEPS)
        for sig in SIGMAS:
            t0 = time.perf_counter()
            iv = account_bandmf(sig, s, q).epsilon(DELTA)
            ours = time.perf_counter() - t0
            t0 = time.perf_counter()
            theirs = dp_accounting_eps(sig, s, q)
            their_s = time.perf_counter() - t0
            rows.append(("eps", b, q, sig, iv, ours, theirs, their_s))
            print(rows[-1], flush=True)
        for target in TARGETS:
            t0 = time.perf_counter()
            sig = calibrate_bandmf(target, DELTA, s, q)
            rows.append(("cal", b, q, target, sig, time.perf_counter() - t0, max(s.column_norms)))
            print(rows[-1], flush=True)
    L = [START, "## BandMF under cyclic Poisson sampling (exact reduction, certified both sides)", "",
         "`python -m benchmarks.bandmf`.  " + __doc__.split("\n\n")[1].replace("\n", " "), "",
         "| bands b | q (per group) | sigma | certified eps [lower, upper] | dp_accounting (same reduction) | "
         "seconds (ours / dp_accounting) |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r[0] == "eps":
            _, b, q, sig, iv, ours, theirs, their_s = r
            L.append(f"| {b} | {q:g} | {sig} | [{iv.lower:.4f}, {iv.upper:.4f}] | {theirs:.4f} | {ours:.2f} / {their_s:.2f} |")
    L += ["", "Certified noise multiplier for a target eps (delta 1e-5; `calibrate_bandmf`; sigma is relative to "
          "the unamplified mechanism's sensitivity, max column norm m; b = 1 is DP-SGD with Poisson sampling):", "",
          "| bands b | q (per group) | max column norm m | target eps | certified sigma | seconds |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r[0] == "cal":
            _, b, q, target, sig, secs, m = r
            L.append(f"| {b} | {q:g} | {m:.4f} | {target} | {sig:.4f} | {secs:.1f} |")
    L += ["", "Each interval is the maximum over the record's groups that no other group dominates (group 0 for "
          "these Toeplitz strategies); dp_accounting's value is its pessimistic PLD estimate on the same blocks, "
          "not an independent analysis of the matrix mechanism.", END]
    path = Path("results/CORRELATED.md")
    text = path.read_text() if path.exists() else ""
    if START in text:
        text = text[:text.index(START)] + "\n".join(L) + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(L) + "\n"
    path.write_text(text)


if __name__ == "__main__":
    main()
