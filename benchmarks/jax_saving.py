"""Balls-in-bins against Poisson batches for DP-SGD: the certified noise multiplier of each.

JAX Privacy's ``BallsInBinsSampling(iterations, cycle_length=b)`` puts each example in one of b
bins once for the run (rounds = iterations / b passes over the bins); Poisson sampling at rate
q = 1/b gives the same expected batch.  pldlib certifies both: balls-in-bins as one
random-allocation epoch of b steps at noise multiplier sigma / sqrt(rounds) (docs/MATH.md 14),
Poisson directly.  For each shape and target, ``pldlib.calibrate`` gives the smallest certified
sigma and a sigma below which the target is certified to fail, so the true minimal sigma of each
scheme lies in (sigma_lower, sigma]; the saving of balls-in-bins over Poisson,
1 - sigma*_bib / sigma*_poisson, is then bracketed by
[1 - sigma_bib / sigma_lower_poisson, 1 - sigma_lower_bib / sigma_poisson].

    python -m benchmarks.jax_saving   -> section of results/CORRELATED.md
"""
from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

from benchmarks.report import replace_marked

DELTA = 1e-5
#: (bins b, rounds)
SHAPES = [(100, 1), (100, 10), (1000, 1), (1000, 10)]
TARGETS = (1.0, 2.0, 4.0, 8.0)
START, END = "<!-- jaxsaving:start -->", "<!-- jaxsaving:end -->"


def main(out: str = "results/CORRELATED.md") -> None:
    from pldlib import calibrate

    warnings.simplefilter("ignore")
    rows = []
    for b, rounds in SHAPES:
        for eps in TARGETS:
            t0 = time.perf_counter()
            bib = calibrate(eps, DELTA, q=1.0 / b, steps=b, sampling="random_allocation", certify_lower=True)
            t_bib = time.perf_counter() - t0
            t0 = time.perf_counter()
            poi = calibrate(eps, DELTA, q=1.0 / b, steps=b * rounds, sampling="poisson", certify_lower=True)
            t_poi = time.perf_counter() - t0
            r = math.sqrt(rounds)
            s_b, s_p = bib.sigma * r, poi.sigma
            s_bl = bib.sigma_lower * r if bib.sigma_lower else None
            s_pl = poi.sigma_lower
            lo_save = f"{100 * (1 - s_b / s_pl):.2f}%" if s_pl else "-"
            hi_save = f"{100 * (1 - s_bl / s_p):.2f}%" if s_bl else "100%"

            def fmt(x):
                return f"{x:.4f}" if x else "not certified"

            rows.append(f"| {b} | {rounds} | {b * rounds:,} | {eps:g} | {s_b:.4f} ({fmt(s_bl)}) | {s_p:.4f} ({fmt(s_pl)}) "
                        f"| {100 * (1 - s_b / s_p):.2f}% | [{lo_save}, {hi_save}] | {t_bib:.1f} | {t_poi:.1f} |")
            print(rows[-1], flush=True)
    text = "\n".join([
        START,
        "## DP-SGD: balls-in-bins against Poisson batches, certified noise multipliers",
        "",
        "`python -m benchmarks.jax_saving`. b bins used in turn for `rounds` passes (JAX Privacy's "
        "`BallsInBinsSampling(iterations=b * rounds, cycle_length=b)`: the bin is drawn once for the run) "
        f"against Poisson sampling at q = 1/b for the same steps; add_remove, delta = {DELTA:g}. sigma: the "
        "smallest certified noise multiplier found by `pldlib.calibrate`; in brackets a sigma whose certified "
        "lower epsilon exceeds the target (the true minimum lies between). Saving: 1 - sigma_bib / sigma_poisson "
        "of the certified sigmas, and the interval the true saving is certified to lie in. Seconds per "
        "calibration.",
        "",
        "| bins b | rounds | steps | target eps | balls-in-bins sigma | Poisson sigma | saving (certified sigmas) "
        "| true saving in | balls-in-bins s | Poisson s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "With the bin fixed for the run, the example's signal accumulates over the rounds in one bin, so the "
        "epoch's allocation amplification is against sigma / sqrt(rounds): it shrinks as the rounds grow, where "
        "Poisson's independent draws keep amplifying every round. In one pass (rounds = 1) balls-in-bins is "
        "random allocation and needs slightly less noise than Poisson; over several passes it needs much more. "
        "(For a banded matrix mechanism, whose bands span a cycle, the comparison is with cyclic Poisson, and "
        "the section on banded strategies below compares the two.)",
        END,
    ])
    path = Path(out)
    replace_marked(path, START, END, text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
