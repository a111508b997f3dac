"""k of t random allocation beside the code of dp_accounting's random-allocation pull request
(google/differential-privacy pull request 414, head 125d46c, not in a dp_accounting release).

That code is run unchanged from a checkout given by ``--pr PATH`` (the directory that holds its
``dp_accounting`` package, i.e. ``python/dp_accounting`` of the pull request's tree), in a child
process so that it does not meet the installed dp_accounting 0.6.  Its two bounds come from its
public function ``gaussian_allocation_pld(params, config, bound_type)`` with ``DOMINATES`` (the
upper end, what its PLDAccountant reports for a ``RandomAllocationDpEvent``) and ``IS_DOMINATED``
(the lower end), at its default discretisation (1e-4) and tail truncation (1e-12).  Ours: the
certified interval of ``Gaussian(sigma, q=k/t, sampling="random_allocation", selections=k)`` over
t x epochs steps (PLD accountant, automatic grid).  Shapes: the pull request's own example
(sigma 2, k 10, t 100, one epoch, delta 1e-6) and shapes of the PLD_accounting comparison.

    python -m benchmarks.allocation_pr --pr /path/to/pr/python/dp_accounting  -> results/BATCHES.md
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import warnings

from benchmarks.report import replace_marked

#: (sigma, k, t, epochs, delta); the first is the pull request's own example
SHAPES = [(2.0, 10, 100, 1, 1e-6), (1.0, 1, 100, 1, 1e-5), (1.0, 1, 100, 10, 1e-5), (1.0, 2, 100, 10, 1e-5),
          (1.0, 4, 100, 10, 1e-5), (0.8, 1, 1000, 1, 1e-5), (1.5, 3, 30, 5, 1e-6)]
START, END = "<!-- allocationpr:start -->", "<!-- allocationpr:end -->"

CHILD = r"""
import json, sys, time
from dp_accounting.pld import random_allocation as ra
from dp_accounting.pld.random_allocation import definitions as d
out = []
for sigma, k, t, epochs, delta in json.loads(sys.argv[1]):
    params = d.PrivacyParams(sigma=sigma, num_steps=t, num_selected=k, num_epochs=epochs)
    config = d.AllocationSchemeConfig()
    row = {}
    for name, bt in (("upper", d.BoundType.DOMINATES), ("lower", d.BoundType.IS_DOMINATED)):
        t0 = time.perf_counter()
        try:
            pld = ra.gaussian_allocation_pld(params, config, bt)
            row[name] = float(pld.get_epsilon_for_delta(delta))
        except Exception as e:
            row[name] = None
            row[name + "_error"] = f"{type(e).__name__}: {e}"[:200]
        row[name + "_seconds"] = time.perf_counter() - t0
    print(json.dumps([sigma, k, t, epochs, delta, row]), flush=True)
"""


def theirs(pr: str | None, log: str | None = None) -> list[dict]:
    """Their bounds per shape, from the child's one JSON line per shape (also appended to ``log``,
    whose earlier lines are reused: a long run can be resumed)."""
    done = {}
    if log and os.path.exists(log):
        for line in open(log):
            *shape, row = json.loads(line)
            done[tuple(shape)] = row
    todo = [s for s in SHAPES if tuple(s) not in done]
    if todo and pr:
        env = dict(os.environ, PYTHONPATH=pr)
        with subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(todo)], stdout=subprocess.PIPE, text=True,
                              env=env, cwd="/") as proc:
            for line in proc.stdout:
                *shape, row = json.loads(line)
                done[tuple(shape)] = row
                print(f"theirs {shape}: {row}", flush=True)
                if log:
                    with open(log, "a") as f:
                        f.write(line)
        if proc.returncode:
            raise RuntimeError(f"their code exited with status {proc.returncode}")
    return [done.get(tuple(s), {"upper": None, "lower": None, "upper_seconds": math.nan, "lower_seconds": math.nan})
            for s in SHAPES]


def ours() -> list[dict]:
    import pldlib
    from pldlib.mechanisms import Gaussian

    out = []
    for sigma, k, t, epochs, delta in SHAPES:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = pldlib.account(Gaussian(sigma, q=k / t, sampling="random_allocation", selections=k),
                               steps=t * epochs).epsilon(delta)
        out.append({"lower": float(r.lower), "upper": float(r.upper), "seconds": time.perf_counter() - t0})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pr", default=None, help="directory holding the pull request's dp_accounting package "
                                                "(without it: only the rows already in --log)")
    ap.add_argument("--out", default="results/BATCHES.md")
    ap.add_argument("--log", default="results/batches/allocation_pr.jsonl",
                    help="their rows, one JSON line per shape (reused when the run is resumed)")
    ap.add_argument("--note", default="", help="a line under the table (e.g. how long their code was given)")
    args = ap.parse_args(argv)
    th, us = theirs(args.pr, args.log), ours()

    def f(v):
        return "-" if v is None else f"{v:.4f}"

    lines = [START, "## k of t random allocation beside dp_accounting's random-allocation pull request", "",
             "Generated by `python -m benchmarks.allocation_pr --pr PATH`. Their code: google/differential-privacy "
             "pull request 414 at 125d46c (not in a dp_accounting release), run unchanged in its own process; "
             "their upper end is `gaussian_allocation_pld(..., DOMINATES)` (what their PLDAccountant reports for "
             "a `RandomAllocationDpEvent`), their lower end the same with `IS_DOMINATED`, at their defaults "
             "(discretisation 1e-4, tail 1e-12). Ours: the certified interval of k of t random allocation "
             "(PLD accountant, automatic grid). eps(delta); times in seconds, theirs for both ends together. "
             "The first row is their own example.", "",
             "| sigma | k | t | epochs | delta | pldlib | theirs | overlap | our upper <= theirs | time pldlib "
             "| time theirs | theirs / ours |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (sigma, k, t, epochs, delta), a, b in zip(SHAPES, us, th):
        tt = b["upper_seconds"] + b["lower_seconds"]
        if math.isnan(tt):
            lines.append(f"| {sigma:g} | {k} | {t} | {epochs} | {delta:g} | [{a['lower']:.4f}, {a['upper']:.4f}] "
                         f"| not finished | - | - | {a['seconds']:.2f} | - | - |")
            continue
        lo_t, up_t = b.get("lower"), b.get("upper")
        overlap = "-" if lo_t is None or up_t is None else ("yes" if a["lower"] <= up_t and lo_t <= a["upper"]
                                                             else "NO")
        below = "-" if up_t is None else ("yes" if a["upper"] <= up_t else "no")
        lines.append(f"| {sigma:g} | {k} | {t} | {epochs} | {delta:g} | [{a['lower']:.4f}, {a['upper']:.4f}] "
                     f"| [{f(lo_t)}, {f(up_t)}] | {overlap} | {below} | {a['seconds']:.2f} | {tt:.2f} "
                     f"| {tt / a['seconds']:.1f}x |")
    if args.note:
        lines += ["", args.note]
    errs = [f"{k}: {b[k]}" for b in th for k in ("upper_error", "lower_error") if k in b]
    if errs:
        lines += ["", "Their errors: " + "; ".join(sorted(set(errs)))]
    lines.append(END)
    replace_marked(args.out, START, END, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
