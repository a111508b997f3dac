"""The sweep metric 'TPR at configured FPRs' (grid.fpr) and the campaign report's trade-off curve.

Independent truth: the k-fold unsampled Gaussian with noise multiplier sigma has the trade-off
curve f(a) = Phi(Phi^-1(1 - a) - mu), mu = sqrt(k)/sigma under add/remove (2 sqrt(k)/sigma
under substitution: sensitivity 2), so the largest TPR at FPR a is 1 - f(a).
"""
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from scipy import special

from sweeps.campaign import write_report
from sweeps.config import ConfigError, load_config, parse_config
from sweeps.execute import run_sweep
from sweeps.plan import DIMS, TPR_DIMS, make_plan
from sweeps.lease import prepare_store
from sweeps.store import STATUS_FAILED, STATUS_OK, BlockWriter, block_states, read_status
from sweeps.testing import direct_eps, small_config, tree_snapshot

ROOT = Path(__file__).resolve().parent.parent
FPRS = [1e-3, 1e-2, 0.3]
CURVE = {"sigma": 2.0, "q": 1.0, "steps": 10, "sampling": "none", "relation": "add_remove", "delta": 1e-5}


def quiet():
    return {"progress": False, "stream": io.StringIO()}


def true_tpr(sigma, k, relation, fpr):
    mu = (2.0 if relation == "substitution" else 1.0) * math.sqrt(k) / sigma
    return 1.0 - special.ndtr(special.ndtri(1.0 - np.asarray(fpr, float)) - mu)


def tpr_config(store, **changes):
    d = small_config(store, **{"methods": ["pld", "clt", "rdp"], **changes})
    d["grid"]["fpr"] = list(FPRS)
    d["report"] = {"tradeoff_curve": dict(CURVE)}
    return d


@pytest.fixture(scope="module")
def tpr_run(embedded_client, tmp_path_factory):
    store = tmp_path_factory.mktemp("tpr") / "t.zarr"
    cfg = parse_config(tpr_config(store))
    rep = run_sweep(cfg, client=embedded_client, **quiet())
    return cfg, str(store), rep


# -- config --------------------------------------------------------------------------------
@pytest.mark.parametrize("fpr, field, text", [
    ([1e-3, 0.0], "grid.fpr[1]", "false-positive rate must be in (0, 1), got 0.0"),
    ([1.0], "grid.fpr[0]", "false-positive rate must be in (0, 1), got 1.0"),
    ([-0.01], "grid.fpr[0]", "must be in (0, 1)"),
    (["often"], "grid.fpr[0]", "must be a number, got 'often'"),
    ([0.01, 0.01], "grid.fpr[1]", "duplicate value 0.01"),
    ([], "grid.fpr", "is empty"),
    ({"geomspace": [1e-4, 2.0, 3]}, "grid.fpr[2]", "must be in (0, 1), got 2.0"),
])
def test_bad_fpr_values_name_the_key(tmp_path, fpr, field, text):
    d = small_config(tmp_path / "x.zarr")
    d["grid"]["fpr"] = fpr
    with pytest.raises(ConfigError) as e:
        parse_config(d)
    assert e.value.field == field and text in str(e.value) and str(e.value).startswith(field + ":")


def test_fpr_config_and_fingerprints(tmp_path):
    d = small_config(tmp_path / "x.zarr")
    base = parse_config(d)
    # configs without grid.fpr keep the fingerprint they had before the metric existed
    assert load_config(ROOT / "configs" / "test_small.yaml").fingerprint() == \
        "df33299f7915498e991ed63942b3ad36ed15c449d7083d41b6ac0c50ba58211a"
    assert load_config(ROOT / "configs" / "campaign_dpsgd.yaml", quick=False).fingerprint() == \
        "27d02527979fdf5a7b5f928fcff04280cea44b3d7ecacfadf686b993ad575726"
    assert base.fpr == () and "fpr" not in base.canonical()["grid"] and "fprs" not in make_plan(base).spec(
        make_plan(base).blocks[0])
    d["grid"]["fpr"] = {"geomspace": [1e-3, 1e-1, 3]}
    cfg = parse_config(d)
    np.testing.assert_allclose(cfg.fpr, [1e-3, 1e-2, 1e-1])
    assert cfg.fingerprint() != base.fingerprint() and cfg.canonical()["grid"]["fpr"] == list(cfg.fpr)
    assert make_plan(cfg).spec(make_plan(cfg).blocks[0])["fprs"] == list(cfg.fpr)
    # the quick variant may set it too, and is validated with it
    d["quick"] = {"grid": {"fpr": [2.0]}}
    with pytest.raises(ConfigError, match=r"^quick\.grid\.fpr\[0\]: false-positive rate"):
        parse_config(d)
    # report.tradeoff_curve: validated, not part of the fingerprint
    d.pop("quick")
    d["report"] = {"tradeoff_curve": {"sigma": 1.0, "steps": 100}}
    with_report = parse_config(d)
    assert with_report.fingerprint() == cfg.fingerprint()
    assert with_report.report["tradeoff_curve"] == {**CURVE, "sigma": 1.0, "q": 0.01, "steps": 100,
                                                    "sampling": "poisson"}
    d["report"] = {"tradeoff_curve": {"sigma": 1.0, "temperature": 3}}
    with pytest.raises(ConfigError, match=r"^report\.tradeoff_curve\.temperature: unknown key"):
        parse_config(d)
    d["report"] = {"tradeoff_curve": {"steps": 0}}
    with pytest.raises(ConfigError, match=r"^report\.tradeoff_curve\.steps: steps must be an integer >= 1"):
        parse_config(d)


# -- a real sweep ----------------------------------------------------------------------------
def test_tpr_brackets_the_gaussian_closed_form(tpr_run):
    cfg, store, rep = tpr_run
    assert rep.complete and rep.failed == 0
    ds = xr.open_zarr(store, chunks=None)
    assert ds["tpr_lower"].dims == TPR_DIMS and ds["tpr_status"].dims == TPR_DIMS
    assert ds["tpr_lower"].encoding["chunks"] == (1, 1, 3, 3, 1, 1, 1)
    np.testing.assert_array_equal(ds.indexes["fpr"], FPRS)
    checked = 0
    for s in cfg.sigma:
        for r in cfg.relation:
            for k in cfg.steps:
                truth = true_tpr(s, k, r, FPRS)
                cell = ds.sel(sigma=s, relation=r, steps=k).squeeze()
                pld = cell.sel({"method": "pld"})
                assert (pld.tpr_status.values == STATUS_OK).all()
                lo, up = pld.tpr_lower.values, pld.tpr_upper.values
                assert (lo <= truth).all() and (truth <= up).all(), (s, r, k, lo, truth, up)
                assert (up - lo <= 0.02 * up + 1e-6).all()  # and tight
                rdp = cell.sel({"method": "rdp"})  # an upper bound of the curve only
                assert (rdp.tpr_status.values == STATUS_OK).all() and (rdp.tpr_upper.values >= truth).all()
                assert (rdp.tpr_lower.values <= truth).all()
                checked += 1
    assert checked == 12
    # clt has no certified curve: NaN with status 3 (unsupported) and the reason; its eps cells are fine
    clt = ds.sel({"method": "clt"})
    assert (clt.tpr_status.values == 3).all() and np.isnan(clt.tpr_upper.values).all()
    assert (clt.status.values == STATUS_OK).all() and np.isfinite(clt.eps_estimate.values).all()
    assert all("tpr: clt: no certified trade-off curve" in str(t) for t in clt.error.values.ravel())
    # the eps cells are exactly those of the sweep without the metric (the same library calls)
    lo, up = direct_eps(parse_config(small_config("unused.zarr")))
    pld = ds.sel({"method": ["pld"]})
    np.testing.assert_array_equal(pld.eps_upper.transpose(*DIMS).values, up)
    np.testing.assert_array_equal(pld.eps_lower.transpose(*DIMS).values, lo)


def test_resumed_sweep_keeps_tpr_values(tpr_run, embedded_client, tmp_path):
    cfg0, store0, _ = tpr_run
    cfg = parse_config(tpr_config(tmp_path / "r.zarr"))
    first = []

    def stop_after_first(block, result, report):
        first.append(block.number)
        raise KeyboardInterrupt("test: driver stopped after the first block")

    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, client=embedded_client, on_result=stop_after_first, **quiet())
    ds = xr.open_zarr(cfg.store, chunks=None)
    written = (ds.tpr_status.values != 0).sum()  # ok, or unsupported (clt)
    assert 0 < written < ds.tpr_status.size
    before = {k: v for k, v in tree_snapshot(cfg.store).items() if k.startswith(("tpr_", "eps_"))
              and not k.endswith("zarr.json")}
    kept = ds.tpr_upper.where(ds.tpr_status == STATUS_OK).values.copy()
    rep = run_sweep(cfg, client=embedded_client, **quiet())
    assert rep.action == "resumed" and rep.already_done >= 1 and rep.complete
    assert first[0] not in rep.submitted_blocks
    after = tree_snapshot(cfg.store)
    assert all(after[k] == v for k, v in before.items())  # the first block's chunks were not rewritten
    ds = xr.open_zarr(cfg.store, chunks=None)
    ok = np.isfinite(kept)
    np.testing.assert_array_equal(ds.tpr_upper.values[ok], kept[ok])
    ref = xr.open_zarr(store0, chunks=None)
    for v in ("tpr_lower", "tpr_upper", "tpr_status", "eps_upper"):
        np.testing.assert_array_equal(ds[v].values, ref[v].values)
    assert run_sweep(cfg, client=embedded_client, **quiet()).submitted == 0


def test_failed_tpr_cells_make_the_block_retried_and_ok_ones_are_kept(tmp_path):
    cfg = parse_config(tpr_config(tmp_path / "w.zarr"))
    plan = make_plan(cfg)
    prepare_store(cfg.store, plan)
    w = BlockWriter(cfg.store, plan)
    b = plan.blocks[0]
    S, D, F = 3, 2, len(FPRS)
    tfailed = np.zeros((S, F), bool)
    tfailed[1, 2] = True
    good = {"eps_lower": np.ones((S, D)), "eps_upper": np.full((S, D), 2.0), "failed": np.zeros((S, D), bool),
            "error": "tpr: steps=10: boom", "seconds": 1.0, "tpr_lower": np.full((S, F), 0.1),
            "tpr_upper": np.full((S, F), 0.2), "tpr_failed": tfailed, "tpr_unsupported": np.zeros((S, F), bool)}
    cells, tcells = w.write_many([(b, good, 1, None, None)], with_tpr=True)[0]
    assert (cells == STATUS_OK).all() and tcells[1, 2] == STATUS_FAILED and (tcells != STATUS_FAILED).sum() == 8
    st = block_states(plan, read_status(cfg.store), read_status(cfg.store, "tpr_status"))
    assert st[0] == STATUS_FAILED  # eps all ok, one TPR cell failed: the block runs again on resume
    assert block_states(plan, read_status(cfg.store))[0] == STATUS_OK  # (eps alone would call it done)
    # a retry that fails everything keeps the cells that were ok
    bad = {"eps_lower": None, "eps_upper": np.full((S, D), np.nan), "failed": np.ones((S, D), bool),
           "error": "KilledWorker", "seconds": None}
    bad["eps_lower"] = bad["eps_upper"]
    keep_tpr = tcells == STATUS_OK
    w.write(b, bad, run=2, keep_ok=cells == STATUS_OK, keep_tpr=keep_tpr)
    ds = xr.open_zarr(cfg.store, chunks=None).isel(plan.region(b))
    tup = ds.tpr_upper.transpose(*TPR_DIMS).values.reshape(S, F)
    tst = ds.tpr_status.transpose(*TPR_DIMS).values.reshape(S, F)
    assert (tup[keep_tpr] == 0.2).all() and np.isnan(tup[1, 2]) and tst[1, 2] == STATUS_FAILED


# -- the campaign report -------------------------------------------------------------------
def test_report_writes_tradeoff_curve_png(tpr_run, tmp_path):
    cfg, store, _ = tpr_run
    out = tmp_path / "report"
    md_path = write_report(store, str(out))
    png = out / "tradeoff_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < png.stat().st_size < 400_000
    md = Path(md_path).read_text()
    assert "## Attack bounds: largest TPR at each FPR" in md and "![trade-off curve](tradeoff_curve.png)" in md
    res = json.loads((out / "summary.json").read_text())
    tc = res["tradeoff_curve"]
    truth = true_tpr(CURVE["sigma"], CURVE["steps"], CURVE["relation"], tc["fpr"])
    assert tc["fpr"] == FPRS
    assert (np.array(tc["tpr_lower"]) <= truth).all() and (truth <= np.array(tc["tpr_upper"])).all()
    # for q = 1 the CLT mu is sqrt(k)/sigma, the exact curve: inside the certified interval
    assert tc["mu_clt"] == pytest.approx(math.sqrt(CURVE["steps"]) / CURVE["sigma"], rel=1e-12)
    gdp = np.array(tc["tpr_gdp"])
    assert (np.array(tc["tpr_lower"]) <= gdp + 1e-12).all() and (gdp <= np.array(tc["tpr_upper"]) + 1e-12).all()
    # the (eps, delta) pair is a lossy summary: it allows at least the certified TPR
    assert (np.array(tc["tpr_implied"]) >= np.array(tc["tpr_upper"])).all()
    # the store's own TPR intervals of that configuration are drawn: pld and rdp, not clt
    assert [p["method"] for p in tc["store_points"]] == ["pld", "rdp"]
    assert res["tpr"]["methods"]["clt"]["unsupported"] == 3 * 2 * 2 * 3 and not res["tpr"]["violations"]


def test_block_task_tpr_for_failed_unsupported_and_peer_blocks(tmp_path):
    """The task itself (no cluster): a failing block fails its TPR cells too (status 2), a block
    the method does not support is unsupported throughout (3), a peer without a certified curve
    has its eps cells and unsupported TPR cells with the reason."""
    from sweeps.methods import run_block

    d = tpr_config(tmp_path / "b.zarr", methods=["pld", "dp_accounting"], sampling=["poisson", "wor"],
                   q=[0.5], relation=["add_remove"], steps=[1, 10])
    d["options"] = {"pld": {"spacing": 2e-3, "fail": {"sigma": 2.0}},
                    "dp_accounting": {"value_discretization_interval": 1e-2}}
    plan = make_plan(parse_config(d))
    by = {(b.params["sigma"], b.params["sampling"], b.params["method"]): b for b in plan.blocks}
    out = run_block(plan.spec(by[(2.0, "poisson", "pld")]))
    assert out["failed"].all() and out["tpr_failed"].all() and not out["tpr_unsupported"].any()
    assert np.isnan(out["tpr_upper"]).all() and "test-only 'fail'" in out["error"]
    out = run_block(plan.spec(by[(1.0, "wor", "dp_accounting")]))
    assert out["unsupported"].all() and out["tpr_unsupported"].all()
    assert out["error"].startswith("dp_accounting: ") and "without replacement" in out["error"]
    out = run_block(plan.spec(by[(1.0, "poisson", "dp_accounting")]))
    assert not out["failed"].any() and out["tpr_unsupported"].all()
    assert "tpr: dp_accounting: no certified trade-off curve (kind 'peer'" in out["error"]
    out = run_block(plan.spec(by[(1.0, "poisson", "pld")]))
    assert not out["failed"].any() and not out["tpr_failed"].any() and out["error"] == ""
    assert (out["tpr_lower"] <= out["tpr_upper"]).all() and out["tpr_lower"].shape == (2, 3)
