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

from sweeps.campaign import MATCH_RTOL, _matched, _sigma_for
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
def quick_store(tmp_path_factory, embedded_client):
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
    rep = run_sweep(cfg, client=embedded_client, progress=False, stream=io.StringIO())
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
    # ... and as one HTML page with every plot embedded (nothing fetched from elsewhere)
    page = (out / "REPORT.html").read_text()
    assert page.count("data:image/png;base64,") == len(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md))
    assert 'src="http' not in page and ".png\"" not in page
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


# -- matched comparisons: ties within MATCH_RTOL count ---------------------------------------
def _row(method, kind, width, excess, sec):
    return {"method": method, "kind": kind, "width_median": width, "excess_median": excess,
            "seconds_per_cell_median": sec, "seconds_sum": sec}


def test_matched_counts_ties_within_the_relative_tolerance():
    assert MATCH_RTOL == 1e-4
    peer = _row("peer", "peer", 0.10, 6.2e-4, 0.1)
    tie = _row("ours_tie", "certified", 0.001, 6.2e-4 * (1 + 0.8e-4), 0.05)  # 8e-5 relative above: a tie
    lines = _matched({"rows": [tie, peer]}, {}).splitlines()
    assert len(lines) == 2
    width, excess = lines
    assert "matched interval width" in width and "`ours_tie` 0.1%" in width and "a tie" not in width
    assert "matched upper-bound excess" in excess and "`ours_tie`" in excess
    assert "a tie: 8e-05 relative above the peer's, within the 1e-4 tolerance" in excess
    assert "none of our certified methods" not in excess

    # 2e-4 relative above: not a tie, not matched
    loose = _row("ours_loose", "certified", 0.001, 6.2e-4 * (1 + 2e-4), 0.05)
    excess = _matched({"rows": [loose, peer]}, {}).splitlines()[1]
    assert "`peer`" in excess and "none of our certified methods here is as tight" in excess
    assert "not even within 1e-4 relative" in excess

    # strictly tighter: matched, no tie label; the cheapest of the matching ones is named
    tighter = _row("ours_tight", "certified", 0.001, 5e-4, 0.2)
    excess = _matched({"rows": [loose, tighter, tie, peer]}, {}).splitlines()[1]
    assert "`ours_tie`" in excess  # cheaper (0.05 s) than ours_tight (0.2 s), and a tie
    excess = _matched({"rows": [loose, tighter, peer]}, {}).splitlines()[1]
    assert "`ours_tight`" in excess and "a tie" not in excess and "peer time / our time = 0.5" in excess


# -- the WOR and dots campaigns' --quick variants, run end to end ----------------------------
def _run_quick(name: str, d: Path, client) -> tuple[str, Path]:
    """Run configs/<name>.yaml --quick into d/quick.zarr on an in-process cluster and report it into d/report."""
    src = ROOT / "configs" / f"{name}.yaml"
    cfg = parse_config(yaml.safe_load(src.read_text()), source=str(src), quick=True)
    cfg = cfg.with_store(str(d / "quick.zarr"))
    rep = run_sweep(cfg, client=client, progress=False, stream=io.StringIO())
    assert rep.complete
    out = d / "report"
    assert main(["report", str(d / "quick.zarr"), "--out", str(out)]) == 0
    return str(d / "quick.zarr"), out


def _loglog_sigma(sigmas, ups, target) -> float:
    """Independent of _sigma_for: smallest grid sigma with ups <= target, interpolated with np.interp in log-log."""
    order = np.argsort(sigmas)
    s, u = np.asarray(sigmas, float)[order], np.asarray(ups, float)[order]
    good = np.isfinite(u) & (u > 0)
    s, u = s[good], u[good]
    below = np.flatnonzero(u <= target)
    if s.size < 2 or not below.size or below[0] == 0:
        return math.nan
    j = below[0]
    # eps decreases with sigma; np.interp wants increasing x: interpolate log sigma over -log eps
    x = np.interp(-math.log(target), [-math.log(u[j - 1]), -math.log(u[j])], [math.log(s[j - 1]), math.log(s[j])])
    return float(math.exp(x))


def _md_section_table(md: str, heading: str, first_col: str) -> list[dict]:
    """Rows of the first table after `heading` whose header starts with `first_col`."""
    part = md.split(heading, 1)[1]
    lines = part.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_col} |"))
    head = [h.strip() for h in lines[start].strip("|").split("|")]
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))))
    return rows


@pytest.fixture(scope="module")
def wor_quick(tmp_path_factory, embedded_client):
    """configs/campaign_wor.yaml --quick (pld only: 3 sigmas x poisson/wor x add_remove/substitution)."""
    return _run_quick("campaign_wor", tmp_path_factory.mktemp("wor"), embedded_client)


def test_wor_quick_report_has_the_sampling_section(wor_quick):
    store, out = wor_quick
    md = (out / "REPORT.md").read_text()
    assert "## Poisson vs sampling without replacement: noise for a target epsilon" in md
    assert (out / "wor_vs_poisson.png").read_bytes()[:4] == b"\x89PNG"
    assert "![WOR vs Poisson](wor_vs_poisson.png)" in md
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sampling"]["method"] == "pld"
    assert set(summary["sampling"]["ratio_by_relation"]) == {"add_remove", "substitution"}


def test_wor_quick_sigma_ratios_match_the_store(wor_quick):
    """Every sigma_Poisson, sigma_WOR and ratio of the report, recomputed from the raw store."""
    store, out = wor_quick
    ds = xr.open_zarr(store, chunks=None).transpose(*DIMS)
    assert (ds.status.values == STATUS_OK).all()
    sig = np.asarray(ds.indexes["sigma"], float)
    cfg = yaml.safe_load((ROOT / "configs" / "campaign_wor.yaml").read_text())
    targets = cfg["report"]["eps_targets"]
    summary = json.loads((out / "summary.json").read_text())
    md = (out / "REPORT.md").read_text()
    table = _md_section_table(md.split("<details>", 1)[1], "all cases", "relation")
    srows = summary["sampling"]["rows"]
    assert len(srows) == len(table) == ds.sizes["q"] * ds.sizes["steps"] * ds.sizes["delta"] * \
        ds.sizes["relation"] * len(targets)
    ratios = {}
    for row, trow in zip(srows, table):
        sel = {"q": row["q"], "steps": row["steps"], "delta": row["delta"], "relation": row["relation"],
               "method": "pld"}
        direct = {}
        for smp in ("poisson", "wor"):
            ups = ds.eps_upper.sel(sel).sel(sampling=smp).values
            direct[smp] = _loglog_sigma(sig, ups, row["target"])
        for smp in ("poisson", "wor"):
            got = row[f"sigma_{smp}"]
            if math.isnan(direct[smp]):
                assert got is None or math.isnan(got)
                assert trow[f"sigma {'Poisson' if smp == 'poisson' else 'WOR'}"] == "n/a"
            else:
                assert got == pytest.approx(direct[smp], rel=1e-9)
                assert _num(trow[f"sigma {'Poisson' if smp == 'poisson' else 'WOR'}"]) == \
                    pytest.approx(direct[smp], rel=5e-4)
        if math.isnan(direct["poisson"]) or math.isnan(direct["wor"]):
            assert trow["ratio"] == "n/a"
            continue
        r = direct["wor"] / direct["poisson"]
        assert row["ratio"] == pytest.approx(r, rel=1e-9) and _num(trow["ratio"]) == pytest.approx(r, rel=5e-4)
        ratios.setdefault(row["relation"], []).append(r)
    # WOR add/remove is Poisson at sensitivity 2D, i.e. at sigma/2: on this grid (sigmas a factor 2 apart)
    # the WOR curve is the Poisson one shifted by one grid step, so the ratio is 2
    assert len(ratios["add_remove"]) >= 1
    assert ratios["add_remove"] == pytest.approx([2.0] * len(ratios["add_remove"]), rel=2e-3)
    # ... which the store shows directly: eps_WOR(sigma) = eps_Poisson(sigma / 2)
    ar = ds.eps_upper.sel({"relation": "add_remove", "method": "pld"}).isel(q=0, steps=0, delta=0)
    pairs = [s for s in sig if s / 2 in sig]
    assert pairs
    for s in pairs:
        assert float(ar.sel(sigma=s, sampling="wor")) == pytest.approx(
            float(ar.sel(sigma=s / 2, sampling="poisson")), rel=2e-3)
    # the summary table: median/min/max per relation over the finite ratios
    by_rel = _md_section_table(md, "## Poisson vs sampling", "relation")
    for brow in by_rel:
        rs = ratios.get(brow["relation"], [])
        assert int(brow["cases"]) == len(rs)
        assert summary["sampling"]["ratio_by_relation"][brow["relation"]]["median"] == pytest.approx(
            float(np.median(rs)), rel=1e-9)
        assert _num(brow["min"]) == pytest.approx(min(rs), rel=5e-4)
        assert _num(brow["max"]) == pytest.approx(max(rs), rel=5e-4)
    # substitution under WOR needs more noise than under Poisson, but less than add_remove's factor 2 here
    assert all(1.0 < r < 2.0 for r in ratios["substitution"])


def test_dots_quick_report_matches_ties_with_the_peer(tmp_path, embedded_client):
    """configs/campaign_dots.yaml --quick: pld_h1 vs dp_accounting_h1 at equal h; the excess tie is matched."""
    import dp_accounting  # noqa: F401  (a test dependency: never skipped)
    store, out = _run_quick("campaign_dots", tmp_path, embedded_client)
    ds = xr.open_zarr(store, chunks=None).transpose(*DIMS)
    md = (out / "REPORT.md").read_text()
    assert "## Tightness and cost, side by side" in md and "1 + 1e-4" in md

    def excess(m):
        s = ds.sel({"method": m, "relation": "add_remove"})
        L = np.fmax(ds.eps_lower.sel({"method": "pld_h1", "relation": "add_remove"}).values,
                    ds.eps_lower.sel({"method": "pld_buckets_h1", "relation": "add_remove"}).values)
        return float(np.median((s.eps_upper.values - L) / L))

    ours, peer = excess("pld_h1"), excess("dp_accounting_h1")
    line = next(ln for ln in md.splitlines() if "upper-bound excess" in ln and "`dp_accounting_h1`" in ln)
    # the statement follows the store's numbers, ties within MATCH_RTOL included
    if ours <= peer * (1 + MATCH_RTOL):
        assert line.startswith("- matched upper-bound excess") and "`pld_h1`" in line
        assert ("a tie:" in line) == (ours > peer)
    else:
        assert "none of our certified methods here is as tight" in line
    # equal h, equal discretisation: the same excess up to a tie (2e-6 relative with dp_accounting 0.6), so matched
    assert abs(ours - peer) <= MATCH_RTOL * peer
    assert "none of our certified methods" not in md.split("## Tightness", 1)[1].split("## Failures", 1)[0]
