"""Discrete-event simulation of the sweeps driver + Dask scheduler + W workers.

``python -m benchmarks.driver_sim --rows 1822080 --workers 1000 10000
     --row-costs results/atlas/row_costs.json --driver-costs results/driver/rows.json --out results/driver/``

Question: at 1,000 and 10,000 workers, is the driver (and the scheduler) busy under 50% of
the wall time, and what are the wall time and the core-hours of the cluster atlas
(``configs/atlas_cluster.yaml``, 1,822,080 rows)?

What is simulated (plain Python, a ``heapq`` event queue; tasks, not rows):

* **Rows -> tasks.**  ``--rows`` row costs are sampled with replacement (seeded) from the
  measured per-row seconds (``--row-costs``: ``{"before": [...], "after": [...]}``; every
  list-valued key named in ``meta.engines`` or called before/after/band is a cost set).
  Without that file a *stand-in* lognormal is used (``--standin-mean``, ``--standin-sigma``)
  and every output is labelled ``stand-in``.  The cost model's *prediction* of a row is its
  actual cost x ``model_bias`` x ``exp(model_error * N(0, 1))`` (independent per row).
  Rows are optionally packed into shards of ``--shard-rows`` consecutive rows (heaviest
  first, as the planner's boxes of neighbouring q at one sigma), then grouped exactly like
  :func:`sweeps.cost.group_tasks`: heaviest *predicted* first, a task closed once its
  predicted cost reaches the target (the target lowered so that there are at least
  ``min_tasks_per_worker`` x W tasks).  A worker takes the task's *actual* seconds
  (sum of its rows' actual costs) plus the write time ``write_task_s + write_row_s x rows``.
* **Driver** (one FIFO server): first ``rows x driver_setup_row_s`` of planning, then
  submits ``K`` tasks (``--inflight``, default 4 x W) at ``driver_submit_s`` each; every
  completion it receives costs ``driver_complete_s`` and is followed by one more submit
  while tasks are left (it keeps at most K tasks in flight).
* **Scheduler** (one FIFO server): ``sched_task_s`` of CPU per task lifecycle, a fraction
  ``sched_submit_frac`` when the task arrives from the driver, the rest when the worker
  reports it finished.  A task is runnable only once the scheduler has registered it; it
  is sent (FIFO = the driver's heaviest-first order) to the least occupied worker with a
  free slot (``worker_slots``: 2 = Dask's default ``worker-saturation`` 1.1 on one-thread
  workers: one task running, one waiting on the worker), or queued on the scheduler until
  a worker's completion has been processed (Dask's queuing of root tasks).  A completion reaches the
  driver through the scheduler.  Every message hop costs ``latency_s``.
* **Outputs** per (cost set, W, target): wall time, worker compute core-hours, allocated
  core-hours (W x wall), worker utilisation, driver and scheduler busy fractions, tasks,
  rows/s, the idle tail (from the first worker idle for good to the end) and its idle
  core-hours.  JSON to ``OUT/sim_<name>.json`` and a markdown report to
  ``OUT/SIMULATION.md``.

Parameters can be given in a JSON file (``--config FILE``, keys = the long option names with
underscores); command-line options override it.
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

#: the parameters and their defaults (units: seconds unless said otherwise)
DEFAULTS = {
    "rows": 1_822_080,
    "workers": [1000, 10000],
    "targets": [10.0, 30.0, 60.0, 120.0],
    "row_costs": "results/atlas/row_costs.json",
    "cost_sets": None,            # which lists of the row-costs file (default: all found)
    "standin_mean": 17.0,         # stand-in lognormal: mean seconds per row
    "standin_sigma": 0.6,         # ... and sigma of log seconds
    "standin_n": 40,              # ... sampled as that many "measured" rows (like the real file)
    "model_error": 0.5,           # sigma of log(predicted / actual) per row
    "model_bias": 1.0,            # predicted / actual, systematic
    "model": "given",             # given (model_error, model_bias) | prior | refit (sweeps.cost on the measured rows)
    "shard_rows": 1,              # rows per shard (a task is whole shards)
    "min_tasks_per_worker": 2,    # sweeps.shards.suggest_min_tasks: 2 x threads
    "driver_costs": "results/driver/rows.json",
    "driver_submit_s": 1e-3,
    "driver_complete_s": 1e-3,
    "driver_setup_row_s": None,   # planning CPU per row before the first submit (None: from driver_costs, else 0)
    "sched_task_s": 1e-3,         # ASSUMED scheduler CPU per task lifecycle
    "sched_submit_frac": 0.5,
    "latency_s": 1e-3,            # one message hop
    "write_task_s": 0.1,          # worker write per task (open, index, rename)
    "write_row_s": 0.01,          # ... and per row (205 x 19 cells x a few float64 vars)
    "inflight": "4x",             # tasks in flight: "Nx" = N x workers, or a number
    "inflight_cap": None,         # an upper bound on it (sweeps' MAX_INFLIGHT is 1000)
    "worker_slots": 2,            # tasks sent to a 1-thread worker at once (Dask worker-saturation 1.1 -> 2)
    "seed": 0,
    "name": None,
    "out": "results/driver/",
}

_READY, _WDONE, _SDONE, _DDONE = 0, 1, 2, 3


# ----------------------------------------------------------------------------- the simulation
def simulate(durations, workers: int, inflight: int | None = None, *, driver_submit_s: float = 0.0,
             driver_complete_s: float = 0.0, sched_submit_s: float = 0.0, sched_complete_s: float = 0.0,
             latency_s: float = 0.0, write_s=0.0, driver_setup_s: float = 0.0, rows=None,
             worker_slots: int = 1) -> dict:
    """Simulate tasks of ``durations`` actual seconds (in submission order) on ``workers``
    workers; ``write_s``: a scalar or one value per task added to the worker time;
    ``worker_slots``: tasks the scheduler sends to a one-thread worker at most (one running,
    the rest waiting on the worker; Dask's default ``worker-saturation`` 1.1 gives 2).
    Returns the wall time and the busy times (see the module doc for the model)."""
    dur = np.asarray(durations, dtype=float)
    T = int(dur.size)
    W = int(workers)
    K = T if inflight is None else max(1, int(inflight))
    wr = np.broadcast_to(np.asarray(write_s, dtype=float), (T,))
    work = (dur + wr).tolist()
    heap: list = []
    push, pop = heapq.heappush, heapq.heappop
    seq = 0
    c_sub, c_done, s_sub, s_done, lat = (float(driver_submit_s), float(driver_complete_s), float(sched_submit_s),
                                         float(sched_complete_s), float(latency_s))
    dfree = float(driver_setup_s)
    dbusy = float(driver_setup_s)
    sfree = 0.0
    sbusy = 0.0
    # the initial fill: K submits, one driver job each
    n0 = min(K, T)
    for i in range(n0):
        dfree += c_sub
        push(heap, (dfree, seq, _DDONE, i, -1))
        seq += 1
    dbusy += n0 * c_sub
    next_task = n0
    S = max(1, int(worker_slots))
    # free[k]: a stack of workers holding k < S tasks (lazily cleaned: checked against occ on pop)
    free = [list(range(W - 1, -1, -1))] + [[] for _ in range(S - 1)]
    occ = [0] * W          # tasks assigned to each worker, not yet reported done by the scheduler
    wfree = [0.0] * W      # when each worker is through with the tasks it was sent
    ready: deque = deque()
    last_end = [0.0] * W   # each worker's last finish of compute + write

    def take():  # the least occupied worker with a free slot, or -1
        for k in range(S):
            st = free[k]
            while st:
                w = st.pop()
                if occ[w] == k:
                    return w
        return -1

    last_start = 0.0
    done = 0
    wall = dfree if T == 0 else 0.0
    while heap:
        t, _, kind, task, w = pop(heap)
        if kind == _WDONE:  # the worker finished: report to the scheduler
            last_end[w] = t
            a = t + lat
            sfree = (sfree if sfree > a else a) + s_done
            sbusy += s_done
            push(heap, (sfree, seq, _SDONE, task, w))
            seq += 1
        elif kind == _SDONE:  # the scheduler processed a completion: free the slot, tell the driver
            if ready:  # every slot was taken: this one goes at once
                nt = ready.popleft()
                st = t + lat
                if wfree[w] > st:
                    st = wfree[w]
                last_start = st if st > last_start else last_start
                wfree[w] = st + work[nt]
                push(heap, (wfree[w], seq, _WDONE, nt, w))
                seq += 1
            else:
                k = occ[w] - 1
                occ[w] = k
                free[k].append(w)
            a = t + lat
            dfree = (dfree if dfree > a else a) + c_done
            dbusy += c_done
            done += 1
            if next_task < T:
                dfree += c_sub
                dbusy += c_sub
                push(heap, (dfree, seq, _DDONE, next_task, -1))
                seq += 1
                next_task += 1
            if done == T:
                wall = dfree
        elif kind == _READY:  # the scheduler registered the task: send it to a worker or queue it
            w2 = take() if S > 1 else (free[0].pop() if free[0] else -1)
            if w2 >= 0:
                k = occ[w2] + 1
                occ[w2] = k
                if k < S:
                    free[k].append(w2)
                st = t + lat
                if wfree[w2] > st:
                    st = wfree[w2]
                last_start = st if st > last_start else last_start
                wfree[w2] = st + work[task]
                push(heap, (wfree[w2], seq, _WDONE, task, w2))
                seq += 1
            else:
                ready.append(task)
        else:  # _DDONE: the driver sent the task: the scheduler registers it
            a = t + lat
            sfree = (sfree if sfree > a else a) + s_sub
            sbusy += s_sub
            push(heap, (sfree, seq, _READY, task, -1))
            seq += 1
    used = [e for e in last_end if e > 0]
    first_idle_for_good = min(last_end) if len(used) == W else 0.0
    worker_busy = float(sum(work))
    out = {
        "tasks": T, "workers": W, "inflight": K, "wall_s": wall,
        "worker_busy_s": worker_busy, "compute_s": float(dur.sum()),
        "worker_utilisation": worker_busy / (W * wall) if wall > 0 else 0.0,
        "driver_busy_s": dbusy, "driver_busy_frac": dbusy / wall if wall > 0 else 0.0,
        "sched_busy_s": sbusy, "sched_busy_frac": sbusy / wall if wall > 0 else 0.0,
        "last_start_s": last_start,
        "tail_s": wall - first_idle_for_good,
        "tail_idle_core_s": float(sum(wall - e for e in last_end)),
        "tasks_per_s": T / wall if wall > 0 else 0.0,
    }
    if rows is not None:
        out["rows"] = int(rows)
        out["rows_per_s"] = rows / wall if wall > 0 else 0.0
    return out


# ----------------------------------------------------------------------------- rows -> tasks
def group_tasks(pred, target: float, min_tasks: int = 1) -> np.ndarray:
    """Task boundaries of units of predicted seconds ``pred`` *already in heaviest-first order*,
    as :func:`sweeps.cost.group_tasks` does: a task is closed once its predicted cost reaches
    ``target`` (lowered so that there are at least ``min_tasks`` tasks).  Returns the start
    index of every task plus ``len(pred)`` at the end."""
    pred = np.asarray(pred, dtype=float)
    n = pred.size
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    if min_tasks > 1:
        target = min(target, float(pred.sum()) / min(min_tasks, n))
    target = max(target, 1e-12)
    starts = [0]
    acc = 0.0
    for i, c in enumerate(pred.tolist()):
        acc += c
        if acc >= target:
            starts.append(i + 1)
            acc = 0.0
    if starts[-1] != n:
        starts.append(n)
    return np.asarray(starts, dtype=np.int64)


def make_rows(samples, n_rows: int, model_error: float, model_bias: float, seed: int, shard_rows: int = 1,
              ratios=None):
    """Actual and predicted seconds of ``n_rows`` rows (units of ``shard_rows`` rows), sampled with
    replacement from ``samples``, in the planner's heaviest-first (predicted) order.  The prediction
    is actual x ``model_bias`` x exp(``model_error`` N(0,1)), or, with ``ratios`` (predicted /
    actual of each sample), the sampled row's own ratio (pairs drawn together)."""
    rng = np.random.default_rng(seed)
    samples = np.asarray(samples, dtype=float)
    idx = rng.integers(0, samples.size, size=n_rows)
    actual = samples[idx]
    if ratios is not None:
        pred = actual * np.asarray(ratios, dtype=float)[idx]
    else:
        pred = actual * model_bias * np.exp(model_error * rng.standard_normal(n_rows))
    counts = np.ones(n_rows, dtype=np.int64)
    if shard_rows > 1:  # a shard: neighbouring rows (one sigma): consecutive rows of the sorted order
        o = np.argsort(-pred, kind="stable")
        actual, pred = actual[o], pred[o]
        edges = np.arange(0, n_rows, shard_rows)
        actual = np.add.reduceat(actual, edges)
        pred = np.add.reduceat(pred, edges)
        counts = np.add.reduceat(counts, edges)
    o = np.argsort(-pred, kind="stable")
    return actual[o], pred[o], counts[o]


def make_tasks(actual, pred, counts, target: float, min_tasks: int):
    """(actual seconds, rows) per task, in submission order (heaviest predicted first)."""
    b = group_tasks(pred, target, min_tasks)
    return np.add.reduceat(actual, b[:-1]), np.add.reduceat(counts, b[:-1])


# ----------------------------------------------------------------------------- inputs
def standin_samples(n: int, mean: float, sigma: float, seed: int) -> np.ndarray:
    """The stand-in "measured" rows: ``n`` draws of a lognormal of the given mean and log-sigma."""
    rng = np.random.default_rng(seed + 7919)
    mu = math.log(mean) - sigma ** 2 / 2
    return np.exp(mu + sigma * rng.standard_normal(n))


def model_ratios(path, cost_set: str, mode: str):
    """predicted / actual seconds of every measured row of ``cost_set`` under the sweeps cost model:
    ``prior`` (a fresh store: :data:`sweeps.cost.PRIOR`) or ``refit`` (the model refitted to the
    other measured rows: leave one out, as a resumed store refits to its done rows).  None when
    the file has no row parameters."""
    from sweeps.cost import CostModel

    d = json.loads(Path(path).read_text())
    rows = d.get("rows") or []
    secs = np.asarray(d[cost_set], dtype=float)
    if len(rows) != secs.size or not all(k in r for r in rows for k in ("sigma", "q", "sampling")):
        return None
    meta = d.get("meta") or {}
    S, D = int(meta.get("steps", 205)), int(meta.get("deltas", 19))
    sig = np.array([r["sigma"] for r in rows], float)
    q = np.array([r["q"] for r in rows], float)
    smp = np.array([r["sampling"] for r in rows])
    method = meta.get("method", "pld")
    ok = np.isfinite(secs) & (secs > 0)
    if mode == "prior":
        pred = CostModel().predict(method, sig, q, S, D, smp)
    elif mode == "refit":
        pred = np.full(secs.size, np.nan)
        for i in np.nonzero(ok)[0]:
            k = ok.copy()
            k[i] = False
            m = CostModel().refit(method, sig[k], q[k], S, D, smp[k], secs[k])
            pred[i] = m.predict(method, sig[i:i + 1], q[i:i + 1], S, D, smp[i:i + 1])[0]
    else:
        raise ValueError(f"model: given, prior or refit, not {mode!r}")
    return (pred / secs)[ok]


def load_row_costs(path, wanted=None) -> dict:
    """{cost set: list of seconds per row} from the row-costs file, or {} if there is none."""
    p = Path(path) if path else None
    if p is None or not p.exists():
        return {}
    d = json.loads(p.read_text())
    names = list(wanted or [])
    if not names:
        eng = (d.get("meta") or {}).get("engines") or []
        names = [k for k in list(eng) + ["before", "after", "band"] if k in d]
        names = list(dict.fromkeys(names)) or [k for k, v in d.items() if isinstance(v, list)
                                                and v and all(isinstance(x, (int, float)) for x in v)]
    out = {}
    for k in names:
        v = d.get(k)
        if isinstance(v, list) and v:
            a = np.asarray(v, dtype=float)
            out[k] = a[np.isfinite(a) & (a > 0)]
    return out


def load_driver_costs(path) -> dict:
    """What results/driver/rows.json measured: explicit per-submit/per-completion keys if present;
    per-row and per-task CPU fitted (least squares, >= 0) from the sharded entries when two or
    more differ in tasks per row, else the per-row CPU of the largest run (an upper bound: it
    holds the per-task CPU and the embedded scheduler).  {} without the file."""
    p = Path(path) if path else None
    if p is None or not p.exists():
        return {}
    d = json.loads(p.read_text())
    ents = [e for e in (d.values() if isinstance(d, dict) else d) if isinstance(e, dict)]
    out: dict = {"source": str(p)}
    for e in ents:
        for k_src, k_dst in (("driver_cpu_s_per_submit", "driver_submit_s"),
                             ("driver_cpu_s_per_completion", "driver_complete_s")):
            if k_src in e:
                out[k_dst] = float(e[k_src])
    sh = [e for e in ents if e.get("layout") == "sharded" and e.get("rows") and e.get("tasks")
          and e.get("driver_cpu_s") is not None]
    if not sh:
        return out
    x = np.array([[e["rows"], e["tasks"]] for e in sh], dtype=float)
    y = np.array([e["driver_cpu_s"] for e in sh], dtype=float)
    fitted = False
    if len(sh) >= 2 and np.linalg.matrix_rank(x / x.max(axis=0)) == 2:
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        if (coef >= 0).all():
            out["driver_setup_row_s"] = float(coef[0])
            if "driver_submit_s" not in out:
                out["driver_submit_s"] = out["driver_complete_s"] = float(coef[1]) / 2
            out["fit"] = f"cpu = {coef[0]:.3g} s/row x rows + {coef[1]:.3g} s/task x tasks over {len(sh)} runs"
            fitted = True
    if not fitted:
        big = max(sh, key=lambda e: e["rows"])
        out["driver_setup_row_s"] = float(big["driver_cpu_s"]) / float(big["rows"])
        out["fit"] = (f"per-row CPU of the {big['rows']:,}-row run ({big['tasks']} tasks, "
                      f"{big['workers']} workers): {big['driver_cpu_s']} s / {big['rows']:,} rows (upper bound: includes its "
                      "per-task CPU and the embedded scheduler)")
    return out


def inflight_of(spec, workers: int, cap=None) -> int:
    s = str(spec).strip().lower()
    k = int(round(float(s[:-1]) * workers)) if s.endswith("x") else int(float(s))
    if cap:
        k = min(k, int(cap))
    return max(1, k)


# ----------------------------------------------------------------------------- driver of the study
def run_study(p: dict, say=print) -> dict:
    sets = load_row_costs(p["row_costs"], p["cost_sets"])
    standin = not sets
    if standin:
        sets = {"stand-in": standin_samples(p["standin_n"], p["standin_mean"], p["standin_sigma"], p["seed"])}
    dc = load_driver_costs(p["driver_costs"])
    prov = {}
    for k in ("driver_submit_s", "driver_complete_s", "driver_setup_row_s"):
        if p.get(k) is not None and p.get("_cli_" + k):
            prov[k] = "command line / config"
        elif k in dc:
            p[k] = dc[k]
            prov[k] = "measured (" + dc["source"] + ")"
        elif p.get(k) is None:
            p[k] = 0.0
            prov[k] = "not measured: 0"
        else:
            prov[k] = "assumed default"
    results = []
    model_fit = {}
    for cs, samples in sets.items():
        ratios = None
        if p["model"] != "given":
            if standin:
                raise SystemExit(f"--model {p['model']} needs measured rows (the row-costs file)")
            ratios = model_ratios(p["row_costs"], cs, p["model"])
            if ratios is None:
                raise SystemExit(f"--model {p['model']}: {p['row_costs']} has no row parameters")
            lr = np.log(ratios)
            model_fit[cs] = {"mode": p["model"], "bias": float(np.exp(lr.mean())), "log_sd": float(lr.std()),
                             "n": int(lr.size)}
            say(f"{cs}: cost model ({p['model']}) predicted/actual: geometric mean {model_fit[cs]['bias']:.2f}, "
                f"sd of log {model_fit[cs]['log_sd']:.2f}")
        actual, pred, counts = make_rows(samples, p["rows"], p["model_error"], p["model_bias"], p["seed"],
                                         p["shard_rows"], ratios)
        for W in p["workers"]:
            K = inflight_of(p["inflight"], W, p["inflight_cap"])
            for target in p["targets"]:
                t0 = time.perf_counter()
                dur, nrows = make_tasks(actual, pred, counts, target, int(p["min_tasks_per_worker"] * W))
                write = p["write_task_s"] + p["write_row_s"] * nrows
                r = simulate(dur, W, K, driver_submit_s=p["driver_submit_s"], driver_complete_s=p["driver_complete_s"],
                             sched_submit_s=p["sched_task_s"] * p["sched_submit_frac"],
                             sched_complete_s=p["sched_task_s"] * (1 - p["sched_submit_frac"]),
                             latency_s=p["latency_s"], write_s=write,
                             driver_setup_s=p["driver_setup_row_s"] * p["rows"], rows=p["rows"],
                             worker_slots=p["worker_slots"])
                r.update({
                    "cost_set": cs, "stand_in": standin, "target_s": target,
                    "task_mean_s": float(dur.mean()), "task_p99_s": float(np.quantile(dur, 0.99)),
                    "task_max_s": float(dur.max()), "rows_per_task": float(nrows.mean()),
                    "wall_h": r["wall_s"] / 3600, "compute_core_h": r["compute_s"] / 3600,
                    "worker_core_h": r["worker_busy_s"] / 3600, "allocated_core_h": W * r["wall_s"] / 3600,
                    "tail_idle_core_h": r["tail_idle_core_s"] / 3600,
                    "driver_under_half": r["driver_busy_frac"] < 0.5, "sched_under_half": r["sched_busy_frac"] < 0.5,
                    "sim_seconds": time.perf_counter() - t0,
                })
                results.append(r)
                say(f"{cs:>9} W={W:>6} target={target:>5g}s tasks={r['tasks']:>8} wall={r['wall_h']:7.2f} h "
                    f"util={r['worker_utilisation']:.3f} driver={r['driver_busy_frac']:.3f} "
                    f"sched={r['sched_busy_frac']:.3f} tail={r['tail_s']:6.0f} s ({r['sim_seconds']:.1f} s)")
    params = {k: v for k, v in p.items() if not k.startswith("_")}
    return {"name": p["name"], "stand_in": standin, "params": params, "provenance": prov, "model_fit": model_fit,
            "driver_costs_file": dc, "row_cost_sets": {k: {"n": int(v.size), "mean_s": float(v.mean()),
                                                           "median_s": float(np.median(v)),
                                                           "min_s": float(v.min()), "max_s": float(v.max())}
                                                       for k, v in sets.items()},
            "results": results}


def _fmt_pct(x):
    return f"{100 * x:.1f}%"


def markdown(study: dict) -> str:
    p = study["params"]
    sets = study["row_cost_sets"]
    lab = " (STAND-IN row costs)" if study["stand_in"] else ""
    L = [f"## Run `{study['name']}`{lab}", "", "Command: `" + str(study.get("command", "")) + "`", ""]
    if study["stand_in"]:
        L += [f"**The row costs are a stand-in**: `{p['row_costs']}` did not exist, so the measured rows were "
              f"replaced by {p['standin_n']} draws of a lognormal of mean {p['standin_mean']} s and log-sigma "
              f"{p['standin_sigma']} (chosen to match results/atlas/README.md: 4 rows measured at 7.2-34.7 s, "
              "~17 s per row projected). Re-run when that file exists.", ""]
    L += ["Row-cost sets (seconds per row, 205 steps x 19 deltas):", "",
          "| set | rows sampled from | mean | median | min | max |", "|---|---|---|---|---|---|"]
    for k, v in sets.items():
        L.append(f"| {k} | {v['n']} | {v['mean_s']:.2f} | {v['median_s']:.2f} | {v['min_s']:.2f} | {v['max_s']:.2f} |")
    L += ["", f"{p['rows']:,} rows; in flight: `{p['inflight']}`" + (f" capped at {p['inflight_cap']}" if p["inflight_cap"] else "")
          + f"; shard (the smallest task) = {p['shard_rows']} row(s); cost model: `{p.get('model', 'given')}`; "
          f"seed {p['seed']}.", ""]
    L += ["### Results", "",
          "Wall in hours; core-hours: *compute* = the rows' seconds, *allocated* = W x wall (what a cluster "
          "reservation costs); util = worker busy (compute + write) / (W x wall); driver/sched = busy fraction of "
          "the wall time; tail = from the first worker idle for good to the end.", "",
          "| row costs | W | target s | tasks | rows/task | task mean / max s | wall h | compute core-h | allocated core-h "
          "| util | driver busy | sched busy | rows/s | tail s | tail idle core-h |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in study["results"]:
        L.append(f"| {r['cost_set']} | {r['workers']:,} | {r['target_s']:g} | {r['tasks']:,} | {r['rows_per_task']:.2f} "
                 f"| {r['task_mean_s']:.0f} / {r['task_max_s']:.0f} | {r['wall_h']:.2f} | {r['compute_core_h']:,.0f} "
                 f"| {r['allocated_core_h']:,.0f} | {_fmt_pct(r['worker_utilisation'])} "
                 f"| {_fmt_pct(r['driver_busy_frac'])} | {_fmt_pct(r['sched_busy_frac'])} | {r['rows_per_s']:.0f} "
                 f"| {r['tail_s']:.0f} | {r['tail_idle_core_h']:,.1f} |")
    worst_d = max(r["driver_busy_frac"] for r in study["results"])
    worst_s = max(r["sched_busy_frac"] for r in study["results"])
    L += ["", f"Highest driver busy fraction: {_fmt_pct(worst_d)}; highest scheduler busy fraction: "
              f"{_fmt_pct(worst_s)} (the question's limit: 50%).", ""]
    L += ["Per row-cost set and W: the targets at which the driver and the scheduler are both busy under 50%, "
          "and the target of the shortest wall time:", "",
          "| row costs | W | targets with driver & scheduler < 50% | shortest wall: target s | wall h "
          "| allocated core-h | driver busy | sched busy |", "|---|---|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["cost_set"], r["workers"]) for r in study["results"]))
    for cs, W in keys:
        rs = [r for r in study["results"] if r["cost_set"] == cs and r["workers"] == W]
        ok = [f"{r['target_s']:g}" for r in rs if r["driver_busy_frac"] < 0.5 and r["sched_busy_frac"] < 0.5]
        b = min(rs, key=lambda r: r["wall_s"])
        L.append(f"| {cs} | {W:,} | {', '.join(ok) or 'none'} | {b['target_s']:g} | {b['wall_h']:.2f} "
                 f"| {b['allocated_core_h']:,.0f} | {_fmt_pct(b['driver_busy_frac'])} | {_fmt_pct(b['sched_busy_frac'])} |")
    L.append("")
    prov = study["provenance"]
    dcf = study.get("driver_costs_file") or {}
    L += ["### Inputs: measured vs assumed", "",
          "| input | value | status |", "|---|---|---|",
          f"| row cost distribution | {', '.join(sets)} | "
          + ("STAND-IN lognormal (assumed)" if study["stand_in"] else f"measured (`{p['row_costs']}`), resampled with replacement")
          + " |",
          (f"| cost-model error | predicted = actual x {p['model_bias']} x exp({p['model_error']} N(0,1)) per row | assumed |"
           if p.get("model", "given") == "given" else
           f"| cost-model error | sweeps.cost {p['model']} on the measured rows, each sampled row with its own "
           "predicted/actual ratio: " + "; ".join(f"{k}: x{v['bias']:.2f} geometric mean, log sd {v['log_sd']:.2f}"
                                                  for k, v in study.get("model_fit", {}).items())
           + " | measured (" + ("leave-one-out refit" if p["model"] == "refit" else "fresh store: the prior") + ") |"),
          f"| driver CPU per submit | {1e3 * p['driver_submit_s']:.3g} ms | {prov.get('driver_submit_s')} |",
          f"| driver CPU per completion | {1e3 * p['driver_complete_s']:.3g} ms | {prov.get('driver_complete_s')} |",
          f"| driver planning CPU per row (before the first submit) | {1e6 * p['driver_setup_row_s']:.3g} us "
          f"| {prov.get('driver_setup_row_s')} |",
          f"| scheduler CPU per task lifecycle | {1e3 * p['sched_task_s']:.3g} ms ({_fmt_pct(p['sched_submit_frac'])} "
          "on arrival, the rest on completion) | ASSUMED (not measured) |",
          f"| message latency per hop | {1e3 * p['latency_s']:.3g} ms | assumed |",
          f"| worker write per task | {p['write_task_s']} s + {p['write_row_s']} s per row | assumed |",
          f"| in flight | {p['inflight']}" + (f", cap {p['inflight_cap']}" if p["inflight_cap"] else "") + " | parameter |",
          f"| min tasks | {p['min_tasks_per_worker']} x W (as `sweeps.shards.suggest_min_tasks`) | as the code |",
          f"| tasks sent to a worker at once | {p.get('worker_slots', 1)} | Dask's default (`worker-saturation` 1.1 on 1-thread workers) |", ""]
    if dcf.get("fit"):
        L += [f"Driver costs file: {dcf['fit']}.", ""]
    return "\n".join(L) + "\n"


def markdown_all(studies: list) -> str:
    """SIMULATION.md: every run of the folder (measured runs first), then the model."""
    L = ["# Driver / scheduler simulation", "",
         "Made by `python -m benchmarks.driver_sim` (a discrete-event simulation of the sweeps driver, the "
         "Dask scheduler and W workers: `benchmarks/driver_sim.py`, tests `tests/test_driver_sim.py`); "
         "one section per `sim_*.json` of this folder. **Question**: at 1,000 and 10,000 workers, is the "
         "driver (and the scheduler) busy under 50% of the wall time; wall time and core-hours of "
         "`configs/atlas_cluster.yaml` (1,822,080 rows).", ""]
    studies = sorted(studies, key=lambda s: (s["stand_in"], s["name"]))
    L += ["## Summary", "",
          "Per run, row-cost set and W: the target duration with the shortest wall time, and the highest "
          "driver / scheduler busy fractions over all the targets simulated (details per run below).", "",
          "| run | row costs | shard rows | in flight | W | best target s | wall h | compute core-h "
          "| allocated core-h | util | driver busy (max over targets) | sched busy (max) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for st in studies:
        p = st["params"]
        inf = str(p["inflight"]) + (f" (cap {p['inflight_cap']})" if p.get("inflight_cap") else "")
        for cs, W in dict.fromkeys((r["cost_set"], r["workers"]) for r in st["results"]):
            rs = [r for r in st["results"] if r["cost_set"] == cs and r["workers"] == W]
            bst = min(rs, key=lambda r: r["wall_s"])
            L.append(f"| {st['name']} | {cs} | {p['shard_rows']} | {inf} | {W:,} | {bst['target_s']:g} "
                     f"| {bst['wall_h']:.2f} | {bst['compute_core_h']:,.0f} | {bst['allocated_core_h']:,.0f} "
                     f"| {_fmt_pct(bst['worker_utilisation'])} | {_fmt_pct(bst['driver_busy_frac'])} "
                     f"({_fmt_pct(max(r['driver_busy_frac'] for r in rs))}) | {_fmt_pct(bst['sched_busy_frac'])} "
                     f"({_fmt_pct(max(r['sched_busy_frac'] for r in rs))}) |")
    L.append("")
    for st in studies:
        L.append(markdown(st))
    L += ["## The model and its assumptions", "",
          "* **Driver**: one FIFO server. Planning (`rows x per-row CPU`) first, then K submits; each completion "
          "it receives costs the per-completion CPU and is followed by one submit while tasks are left, so at "
          "most K tasks are in flight. Its busy fraction = its CPU seconds / wall. It cannot exceed "
          "1 / (submit + completion CPU) tasks per second.",
          "* **Scheduler**: one FIFO server (Dask's scheduler is a single-threaded event loop). The CPU per task "
          "lifecycle is an **assumption**: Dask's documentation gives 'about 1 ms of overhead' per task for "
          "the distributed scheduler (https://distributed.dask.org/en/latest/, 'Each task suffers about 1ms of "
          "overhead') and '200us overhead per task' for the local threaded scheduler "
          "(https://docs.dask.org/en/stable/shared.html); 1 ms is the conservative end. The scheduler's other "
          "work (heartbeats of W workers, the dashboard, transition logs, the driver's `nthreads` poll "
          "every second) is **not** modelled; Dask spaces heartbeats to at most ~200 per second "
          "(`distributed.scheduler.heartbeat_interval`: n/200 + 1 s for n >= 200 workers), which adds load "
          "this model leaves out.",
          "* A task runs only after the driver sent it and the scheduler registered it; the scheduler sends it, "
          "in submission order (heaviest predicted first), to the least occupied worker with a free slot "
          "(a 1-thread worker takes ceil(1.1 x 1) = 2 tasks with Dask's default `worker-saturation: 1.1`: one "
          "running, one waiting on the worker, so a worker does not wait for a scheduler round trip), or "
          "keeps it queued until a completion frees a slot (Dask's queuing of root tasks). Work stealing is not "
          "modelled. A completion goes worker -> scheduler -> driver; every hop costs the latency.",
          "* Workers: one task at a time (one thread each); no failures, retries, restarts or slow nodes; the "
          "write time is a fixed assumed cost, not a shared-filesystem queue (10,000 workers writing to one "
          "filesystem may well be the real limit, and is not in this model).",
          "* Row costs are draws with replacement from the measured rows (40 rows stand for 1.8 M: a cost above "
          "the largest measured row never occurs, and the grid's spatial structure is lost: shards of "
          "`--shard-rows` rows are consecutive rows of the heaviest-predicted-first order, not the planner's "
          "boxes of neighbouring q, sampling and relation at one sigma). With `--model prior|refit` each drawn "
          "row keeps its own predicted/actual ratio from the sweeps cost model (paired), so systematic "
          "mis-predictions cluster as they would on the real grid; with `given`, the error is independent "
          "lognormal noise.",
          "* A failed task being split and re-run (sweeps does that) is not modelled.",
          "* Not modelled either, and growing with W: the sweeps driver asks the scheduler for "
          "`client.scheduler_info(n_workers=-1)` (every worker's info) once a second to notice departed "
          "workers (`sweeps.execute._workers`); at 10,000 workers that is a reply of every worker's metrics "
          "per second, serialised by the scheduler and read by the driver, a load neither measured nor "
          "simulated here. The driver's 10 ms sleep when no result is ready is ignored too (latency only).", ""]
    return "\n".join(L) + "\n"


# ----------------------------------------------------------------------------- CLI
def _parser():
    a = argparse.ArgumentParser(prog="python -m benchmarks.driver_sim", description=__doc__.splitlines()[0])
    a.add_argument("--config", help="JSON file of parameters (keys as the options, with underscores)")
    a.add_argument("--rows", type=int)
    a.add_argument("--workers", type=int, nargs="+")
    a.add_argument("--targets", type=float, nargs="+", help="target task durations (s)")
    a.add_argument("--row-costs")
    a.add_argument("--cost-sets", nargs="+", help="lists of the row-costs file to use (default: all)")
    a.add_argument("--standin-mean", type=float)
    a.add_argument("--standin-sigma", type=float)
    a.add_argument("--standin-n", type=int)
    a.add_argument("--model-error", type=float, help="sigma of log(predicted/actual) per row")
    a.add_argument("--model-bias", type=float, help="predicted/actual, systematic")
    a.add_argument("--model", choices=["given", "prior", "refit"],
                   help="the prediction of a row: given (--model-error, --model-bias), or the sweeps cost model's "
                        "prior / leave-one-out refit on the measured rows (paired with each sampled row)")
    a.add_argument("--shard-rows", type=int, help="rows per shard (sweeps: >= 16 with an automatic layout)")
    a.add_argument("--min-tasks-per-worker", type=float)
    a.add_argument("--driver-costs")
    a.add_argument("--driver-submit-s", type=float)
    a.add_argument("--driver-complete-s", type=float)
    a.add_argument("--driver-setup-row-s", type=float)
    a.add_argument("--sched-task-s", type=float)
    a.add_argument("--sched-submit-frac", type=float)
    a.add_argument("--latency-s", type=float)
    a.add_argument("--write-task-s", type=float)
    a.add_argument("--write-row-s", type=float)
    a.add_argument("--inflight", help="'4x' (x workers) or a number")
    a.add_argument("--inflight-cap", type=int, help="e.g. 1000, sweeps' MAX_INFLIGHT")
    a.add_argument("--worker-slots", type=int, help="tasks the scheduler sends a 1-thread worker at once (Dask: 2)")
    a.add_argument("--seed", type=int)
    a.add_argument("--name", help="the output is OUT/sim_<name>.json (default: stand-in or measured-<model>)")
    a.add_argument("--out", help="output folder")
    a.add_argument("--no-markdown", action="store_true", help="do not write OUT/SIMULATION.md")
    a.add_argument("--markdown-only", action="store_true", help="only rewrite OUT/SIMULATION.md from OUT/sim_*.json")
    return a


def params_from(argv=None) -> tuple[dict, argparse.Namespace]:
    ns = _parser().parse_args(argv)
    p = dict(DEFAULTS)
    if ns.config:
        cfg = json.loads(Path(ns.config).read_text())
        unknown = set(cfg) - set(DEFAULTS)
        if unknown:
            raise SystemExit(f"unknown keys in {ns.config}: {sorted(unknown)}")
        p.update(cfg)
        for k in cfg:
            p["_cli_" + k] = True
    for k in DEFAULTS:
        v = getattr(ns, k, None)
        if v is not None:
            p[k] = v
            p["_cli_" + k] = True
    p["min_tasks_per_worker"] = float(p["min_tasks_per_worker"])
    return p, ns


def write_markdown(out: Path) -> Path:
    studies = []
    for f in sorted(out.glob("sim_*.json")):
        try:
            studies.append(json.loads(f.read_text()))
        except (ValueError, OSError):
            continue
    (out / "SIMULATION.md").write_text(markdown_all(studies))
    return out / "SIMULATION.md"


def main(argv=None) -> int:
    p, ns = params_from(argv)
    if ns.markdown_only:
        print(f"wrote {write_markdown(Path(p['out']))}")
        return 0
    t0 = time.perf_counter()
    study = run_study(p)
    if not study["name"]:
        study["name"] = "stand-in" if study["stand_in"] else f"measured-{p['model']}"
        study["params"]["name"] = study["name"]
    out = Path(p["out"])
    out.mkdir(parents=True, exist_ok=True)
    study["sim_seconds_total"] = time.perf_counter() - t0
    study["command"] = "python -m benchmarks.driver_sim " + " ".join(sys.argv[1:] if argv is None else argv)
    jf = out / f"sim_{study['name'].replace(' ', '_')}.json"
    jf.write_text(json.dumps(study, indent=1, default=float))
    print(f"wrote {jf}")
    if not ns.no_markdown:
        print(f"wrote {write_markdown(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
