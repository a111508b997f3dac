"""Campaign configs (--quick) and `sweeps report`: produced, and its numbers match the store."""
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from distributed import LocalCluster

from sweeps.campaign import _sigma_for
from sweeps.cli import main
from sweeps.config import ConfigError, load_config, parse_config
from sweeps.execute import run_sweep
from sweeps.plan import DIMS
from sweeps.store import STATUS_OK, STATUS_UNSUPPORTED, open_dataset
from sweeps.testing import tree_snapshot

ROOT = Path(__file__).resolve().parent.parent
CAMPAIGNS = sorted((ROOT / "configs").glob("campaign_*.yaml"))


def test_campaign_configs_and_their_quick_variants_are_valid():
    assert {p.stem for p in CAMPAIGNS} >= {"campaign_dpsgd", "campaign_dots", "campaign_wor"}
    for p in CAMPAIGNS:
        try:
            full, quick = load_config(p), load_config(p, quick=True)
        except ConfigError as e:  # a campaign with peers, which are optional: the error says so
            assert "pip install 'pldlib[peers]'" in str(e) and "not installed" in str(e)
            continue
        assert quick.store != full.store and quick.name.endswith("-quick")
        n = lambda c: np.prod([len(c.axis(d)) for d in DIMS])  # noqa: E731
        assert n(quick) < n(full) / 5


@pytest.fixture(scope="module")
def quick_store(tmp_path_factory):
    """The quick DP-SGD campaign with two of our methods (pld, clt) and, if installed, dp_accounting."""
    d = tmp_path_factory.mktemp("campaign")
    data = yaml.safe_load((ROOT / "configs" / "campaign_dpsgd.yaml").read_text())
    methods = ["pld", "clt"]
    try:
        import dp_accounting  # noqa: F401

        methods.append("dp_accounting")
    except ImportError:
        methods.append("rdp")  # an upper bound of ours to plant a violation in, without peers
    data["quick"]["methods"] = methods
    cfg = parse_config(data, source=str(ROOT / "configs" / "campaign_dpsgd.yaml"), quick=True)
    cfg = cfg.with_store(str(d / "quick.zarr"))
    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as c, \
            c.get_client() as client:
        rep = run_sweep(cfg, client=client, progress=False, stream=io.StringIO())
    assert rep.complete
    out = d / "report"
    assert main(["report", str(d / "quick.zarr"), "--out", str(out), "--command", "sweeps run X --quick"]) == 0
    return str(d / "quick.zarr"), out, methods


def _methods_table(md: str) -> dict:
    """The '## Methods' table as {method: {column: text}}."""
    part = md.split("## Methods", 1)[1].split("\n\n", 2)[1]
    lines = [ln for ln in part.splitlines() if ln.startswith("|")]
    head = [h.strip() for h in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0].strip("`")] = dict(zip(head, cells))
    return rows


def _num(text: str) -> float:
    if text == "n/a":
        return math.nan
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)


def test_report_is_written_and_self_contained(quick_store):
    store, out, methods = quick_store
    md = (out / "REPORT.md").read_text()
    for png in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (out / png).is_file() and (out / png).read_bytes()[:4] == b"\x89PNG"
    assert {"eps_vs_steps.png", "tradeoff.png", "overshoot.png"} <= {p.name for p in out.iterdir()}
    assert "sweeps run X --quick" in md
    assert "## Soundness" in md and "## Estimates" in md


def test_report_numbers_match_the_store(quick_store):
    """Recompute counts, widths, seconds and soundness from the raw store, independently."""
    store, out, methods = quick_store
    ds = xr.open_zarr(store, chunks=None).transpose(*DIMS)
    table = _methods_table((out / "REPORT.md").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert set(table) == set(methods)
    for m in methods:
        s = ds.sel({"method": m})
        st = s.status.values
        row = table[m]
        assert int(row["ok"]) == int((st == STATUS_OK).sum())
        assert int(row["unsupported"]) == int((st == STATUS_UNSUPPORTED).sum())
        assert int(row["failed"]) == int((st == 2).sum())
        up, lo = s.eps_upper.values, s.eps_lower.values
        w = ((up - lo) / up)[np.isfinite(up) & np.isfinite(lo) & (st == STATUS_OK)]
        if w.size:
            assert _num(row["median width"]) == pytest.approx(float(np.median(w)), rel=5e-3)
        else:
            assert row["median width"] == "n/a"
        secs = s.seconds.values[(st != 0) & (st != STATUS_UNSUPPORTED)]
        assert _num(row["median s/cell"]) == pytest.approx(float(np.median(secs)), rel=5e-3)
        assert summary["methods"][m]["ok"] == int((st == STATUS_OK).sum())
    # clt: no bounds ever; it appears only as an estimate
    c = ds.sel({"method": "clt"})
    assert np.isnan(c.eps_upper.values).all() and np.isfinite(c.eps_estimate.values).all()
    assert table["clt"]["kind"] == "estimate" and table["clt"]["median overshoot"] == "n/a"
    # soundness: no upper of ours below the pld certified lower bound, recomputed here
    p = ds.sel({"method": "pld"})
    bad = 0
    for m in methods:
        u = ds.sel({"method": m}).eps_upper.values
        bad += int((np.isfinite(u) & (u < p.eps_lower.values)).sum())
    assert summary["violations"]["ours_below_certified_lower"] == 0
    assert sum(v["cells"] for v in summary["violations"]["counts"].values()
               if v["lower_method"] == "pld") == bad
    if "dp_accounting" in methods:  # the peer answers add_remove and refuses 'remove' when subsampled
        d = ds.sel({"method": "dp_accounting"})
        assert (d.status.sel(relation="remove").values == STATUS_UNSUPPORTED).all()
        assert (d.status.sel(relation="add_remove").values == STATUS_OK).all()


def test_report_lists_a_planted_violation(quick_store, tmp_path):
    """Lower a copy's peer-or-rdp upper bound below pld's certified lower bound: the report must show it."""
    import shutil

    store, _, methods = quick_store
    copy = tmp_path / "copy.zarr"
    shutil.copytree(store, copy)
    ds = xr.open_zarr(str(copy), chunks=None)
    victim = methods[-1] if methods[-1] != "clt" else "pld"
    k = list(ds.indexes["method"]).index(victim)
    up = ds["eps_upper"].isel(method=slice(k, k + 1)).load()
    lo = ds["eps_lower"].sel({"method": "pld"}).values
    idx = np.argwhere(np.isfinite(up.values[..., 0]) & np.isfinite(lo))[0]
    vals = up.values.copy()
    vals[tuple(idx) + (0,)] = lo[tuple(idx)] * 0.5
    region = {d: slice(None) for d in DIMS}
    region["method"] = slice(k, k + 1)
    xr.Dataset({"eps_upper": up.copy(data=vals)}).drop_vars(list(up.coords)).to_zarr(
        str(copy), region=region, mode="r+", consolidated=False)
    out = tmp_path / "rep"
    assert main(["report", str(copy), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    key = f"{victim} upper < pld lower"
    assert summary["violations"]["counts"][key]["cells"] == 1
    assert summary["violations"]["counts"][key]["lower_certified"] is True
    assert f"`{victim}`" in (out / "REPORT.md").read_text().split("## Soundness")[1]
    if victim == "pld":
        assert summary["violations"]["ours_below_certified_lower"] >= 1


def test_sigma_for_inverts_a_power_law():
    sig = np.array([0.5, 1.0, 2.0, 4.0])
    ups = 4.0 / sig  # log-log linear: interpolation is exact
    assert _sigma_for(sig, ups, 1.5) == pytest.approx(4.0 / 1.5, rel=1e-12)
    assert math.isnan(_sigma_for(sig, ups, 10.0))   # the smallest grid sigma already suffices
    assert math.isnan(_sigma_for(sig, ups, 0.5))    # even the largest grid sigma is not enough
    assert _sigma_for(sig, np.array([8.0, np.nan, 2.0, 1.0]), 4.0) == pytest.approx(1.0, rel=1e-12)


def test_report_bad_input_exits_2(tmp_path, capsys):
    (tmp_path / "notastore").mkdir()
    before = tree_snapshot(tmp_path)
    assert main(["report", str(tmp_path / "notastore")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sweeps: error: store:")
    assert tree_snapshot(tmp_path) == before
