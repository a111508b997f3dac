"""Cost of cluster-atlas rows: a seeded sample of rows of ``configs/atlas_cluster.yaml``.

``python -m benchmarks.atlas_rows [--n 40] [--seed 0] [--engines before,after] [--out results/atlas/row_costs.json]``

A row is one sweep block: the PLD accountant of one (sigma, q, sampling, relation) over the
config's 205 steps values and 19 deltas (:func:`sweeps.methods.run_block`, exactly what a
worker runs).  Rows are drawn uniformly from the config's grid (seeded).  Each engine named
runs every row in turn, interleaved row by row so that the machine's drift hits both alike;
the JSON keeps the seconds of every row per engine and the cells' certified bounds are
compared where both engines computed them.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "atlas_cluster.yaml"

#: what each engine adds to the config's options: ``before`` the config as it was; ``band`` the
#: look-up band (cells certified below eps 0.05 by Renyi DP or above 64 by the PLD lower bound
#: are left out, status 3)
ENGINES = {"before": {}, "band": {"eps_floor": 0.05, "eps_cap": 64.0}}


def sample_rows(n: int, seed: int) -> tuple[list, dict]:
    """``n`` rows (block params) drawn from the cluster atlas grid, and the common spec parts."""
    from sweeps.config import load_config
    from sweeps.plan import make_plan

    plan = make_plan(load_config(CONFIG))
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(plan.blocks), size=n, replace=False)
    return [plan.spec(plan.blocks[int(i)]) for i in sorted(picks)], {"config": str(CONFIG.name)}


def run(n: int, seed: int, engines: list[str], out: str | None) -> dict:
    from sweeps.methods import run_block

    specs, meta = sample_rows(n, seed)
    rows = []
    for i, spec in enumerate(specs):
        row = {k: spec["params"][k] for k in ("sigma", "q", "sampling", "relation")}
        res = {}
        for eng in engines:
            s = dict(spec, options=dict(spec["options"], **ENGINES[eng]))
            t0 = time.perf_counter()
            r = run_block(s)
            row[eng] = time.perf_counter() - t0
            row[eng + "_failed"] = int(np.sum(r["failed"]))
            res[eng] = r
        if len(engines) > 1:
            a, b = res[engines[0]], res[engines[-1]]
            ok = ~(a["failed"] | b["failed"])
            row["cells_both"] = int(ok.sum())
            row["identical_upper"] = bool(np.array_equal(a["eps_upper"][ok], b["eps_upper"][ok]))
            row["identical_lower"] = bool(np.array_equal(a["eps_lower"][ok], b["eps_lower"][ok]))
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.abs(a["eps_upper"][ok] - b["eps_upper"][ok]) / np.abs(a["eps_upper"][ok])
            row["max_rel_diff_upper"] = float(np.nanmax(rel)) if rel.size else 0.0
            row["left_out"] = int(b["unsupported"].sum())
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    out_d = {"meta": {**meta, "n": n, "seed": seed, "engines": engines, "steps": len(specs[0]["steps"]),
                      "deltas": len(specs[0]["deltas"])},
             "rows": rows}
    for eng in engines:
        out_d[eng] = [r[eng] for r in rows]
        out_d[eng + "_median"] = float(np.median(out_d[eng]))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(out_d, indent=1))
    return out_d


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.atlas_rows", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engines", default="before")
    p.add_argument("--out", default="results/atlas/row_costs.json")
    a = p.parse_args(argv)
    d = run(a.n, a.seed, a.engines.split(","), a.out)
    for e in d["meta"]["engines"]:
        print(f"{e}: median {d[e + '_median']:.3f} s per row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
