"""Tests of the driver/scheduler discrete-event simulation (benchmarks/driver_sim.py), each against
an independent closed form."""
import json
import math

import numpy as np
import pytest

from benchmarks import driver_sim as DS


def test_one_worker_wall_is_the_sum_of_costs():
    costs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    r = DS.simulate(costs, workers=1)
    assert r["wall_s"] == pytest.approx(sum(costs), abs=1e-12)
    assert r["worker_utilisation"] == pytest.approx(1.0)
    assert r["driver_busy_frac"] == 0 and r["sched_busy_frac"] == 0


@pytest.mark.parametrize("slots", [1, 2, 3])
@pytest.mark.parametrize("T,W,d", [(25, 4, 3.0), (100, 10, 1.5), (7, 10, 2.0), (1000, 37, 0.25)])
def test_equal_tasks_wall_is_ceil_T_over_W_times_d(T, W, d, slots):
    r = DS.simulate([d] * T, workers=W, worker_slots=slots)
    assert r["wall_s"] == pytest.approx(math.ceil(T / W) * d, rel=1e-12)


def test_inflight_one_serialises_the_tasks():
    costs = np.random.default_rng(1).uniform(1, 5, 50)
    r = DS.simulate(costs, workers=8, inflight=1)
    assert r["wall_s"] == pytest.approx(costs.sum(), rel=1e-12)


@pytest.mark.parametrize("K", [None, 10])
def test_driver_overhead_limits_throughput_to_one_over_2c(K):
    c, T = 0.01, 400
    r = DS.simulate([1e-6] * T, workers=1000, inflight=K, driver_submit_s=c, driver_complete_s=c)
    assert r["wall_s"] >= 2 * c * T * (1 - 1e-9)  # (float sums)
    assert r["wall_s"] == pytest.approx(2 * c * T, rel=0.01)
    assert r["tasks_per_s"] <= 1 / (2 * c) + 1e-9
    assert r["driver_busy_frac"] == pytest.approx(1.0, rel=0.01)


def test_scheduler_overhead_limits_throughput_too():
    s, T = 0.004, 300
    r = DS.simulate([1e-6] * T, workers=500, sched_submit_s=s / 2, sched_complete_s=s / 2)
    assert r["wall_s"] >= s * T * (1 - 1e-9)
    assert r["wall_s"] == pytest.approx(s * T, rel=0.01)


def test_latency_adds_the_hops_of_a_lone_task():
    # driver -> scheduler -> worker -> scheduler -> driver: 4 hops
    r = DS.simulate([5.0], workers=3, latency_s=0.1)
    assert r["wall_s"] == pytest.approx(5.0 + 4 * 0.1)


def test_busy_fractions_in_unit_interval_and_work_conserved():
    rng = np.random.default_rng(3)
    dur = rng.lognormal(1.0, 1.0, 3000)
    for W, slots in ((1, 1), (20, 2), (500, 2), (500, 1)):
        r = DS.simulate(dur, workers=W, inflight=4 * W, driver_submit_s=2e-3, driver_complete_s=1e-3,
                        sched_submit_s=5e-4, sched_complete_s=5e-4, latency_s=1e-3, write_s=0.2, rows=3000,
                        worker_slots=slots)
        for k in ("driver_busy_frac", "sched_busy_frac", "worker_utilisation"):
            assert 0.0 <= r[k] <= 1.0, (W, k, r[k])
        assert r["worker_busy_s"] == pytest.approx(dur.sum() + 0.2 * dur.size)
        assert r["wall_s"] >= r["worker_busy_s"] / W
        assert r["wall_s"] >= dur.max()
        assert r["tail_idle_core_s"] >= 0 and r["tail_s"] >= 0


def test_group_tasks_matches_sweeps_cost():
    cost = pytest.importorskip("sweeps.cost")
    c = np.random.default_rng(5).lognormal(1, 1, 2000)
    c = np.sort(c)[::-1]
    for target, mt in ((10.0, 1), (30.0, 1), (30.0, 400)):
        b = DS.group_tasks(c, target, mt)
        ref = cost.group_tasks(c, target, mt)
        assert [list(range(b[i], b[i + 1])) for i in range(len(b) - 1)] == ref


def test_make_tasks_keeps_all_rows_and_work():
    act, pred, cnt = DS.make_rows([1.0, 2.0, 5.0], 1000, 0.5, 1.0, seed=0, shard_rows=16)
    assert cnt.sum() == 1000 and np.all(np.diff(pred) <= 0)
    dur, rows = DS.make_tasks(act, pred, cnt, 30.0, 1)
    assert rows.sum() == 1000 and dur.sum() == pytest.approx(act.sum())


def _small(tmp_path, seed):
    p = dict(DS.DEFAULTS, rows=5000, workers=[50], targets=[20.0], seed=seed, row_costs=str(tmp_path / "none.json"),
             driver_costs=str(tmp_path / "none.json"), driver_setup_row_s=0.0, out=str(tmp_path))
    return DS.run_study(p, say=lambda *a: None)


def test_reproducible_with_a_seed(tmp_path):
    a, b, c = _small(tmp_path, 1), _small(tmp_path, 1), _small(tmp_path, 2)
    strip = lambda s: [{k: v for k, v in r.items() if k != "sim_seconds"} for r in s["results"]]
    assert strip(a) == strip(b)
    assert strip(a) != strip(c)
    assert a["stand_in"] and a["results"][0]["cost_set"] == "stand-in"


def test_cli_reads_row_costs_and_writes_outputs(tmp_path):
    rc = tmp_path / "row_costs.json"
    rc.write_text(json.dumps({"meta": {"engines": ["before", "after"]}, "before": [4.0, 8.0, 12.0],
                              "after": [2.0, 4.0, 6.0]}))
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"rows": 2000, "targets": [30.0]}))
    rc_code = DS.main(["--config", str(cfg), "--workers", "20", "--row-costs", str(rc), "--driver-costs",
                       str(tmp_path / "none.json"), "--out", str(tmp_path / "o"), "--name", "t"])
    assert rc_code == 0
    d = json.loads((tmp_path / "o" / "sim_t.json").read_text())
    assert not d["stand_in"] and {r["cost_set"] for r in d["results"]} == {"before", "after"}
    assert all(r["rows"] == 2000 and r["target_s"] == 30.0 for r in d["results"])
    md = (tmp_path / "o" / "SIMULATION.md").read_text()
    assert "ASSUMED" in md and "| after |" in md


@pytest.mark.parametrize("slots,hops", [(1, 6), (2, 4)])
def test_a_second_slot_hides_the_scheduler_round_trip(slots, hops):
    # one worker, two tasks of d: with one slot the second task waits for the first's report to
    # reach the scheduler and the scheduler's answer (2 more hops); with two it waits on the worker
    L, d = 0.1, 5.0
    r = DS.simulate([d, d], workers=1, latency_s=L, worker_slots=slots)
    assert r["wall_s"] == pytest.approx(hops * L + 2 * d)


def test_model_ratios_prior_is_one_when_rows_cost_what_the_prior_says(tmp_path):
    cost = pytest.importorskip("sweeps.cost")
    rng = np.random.default_rng(0)
    sig, q = rng.uniform(0.3, 100, 12), rng.uniform(1e-5, 1, 12)
    smp = np.array(["poisson", "wor"] * 6)
    secs = cost.CostModel().predict("pld", sig, q, 205, 19, smp)
    rows = [{"sigma": float(a), "q": float(b), "sampling": str(c)} for a, b, c in zip(sig, q, smp)]
    f = tmp_path / "rc.json"
    f.write_text(json.dumps({"meta": {"engines": ["before"], "steps": 205, "deltas": 19}, "rows": rows,
                             "before": [float(x) for x in secs * 3.0]}))
    np.testing.assert_allclose(DS.model_ratios(f, "before", "prior"), 1 / 3.0, rtol=1e-9)
    # paired sampling: every predicted/actual ratio is the sampled row's own
    act, pred, _ = DS.make_rows(secs, 500, 0.0, 1.0, seed=1, ratios=np.full(12, 0.5))
    np.testing.assert_allclose(pred / act, 0.5)
