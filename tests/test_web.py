"""The privacy calculator (``pldlib serve``): its checks, its JSON API, and the page in a real browser.

Independent references: the command line's own error lines (run as a subprocess), ``pldlib.calibrate``
and ``pldlib.account`` called directly, and, for the static copy, the atlas's certified sigma checked
against the accountant.  The browser tests drive the system's headless Chromium over the DevTools
protocol (tests/chromium.py); they are skipped, with the reason printed, where Chromium is not
installed.  Screenshots go to $PLDLIB_SCREENSHOTS when set (``make screenshots``: results/web/).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pldlib
from pldlib.web.app import BackgroundServer
from pldlib.web.compute import QueryError, parse_query

from pldlib.testing.chromium import Browser, find_chromium

pytestmark = pytest.mark.xdist_group("web")  # (one server and one browser for the module)

HEADLINE = {"dataset_size": "60000", "batch_size": "600", "epochs": "100", "sampling": "poisson",
            "relation": "add_remove", "delta": "1e-5", "epsilon": "6", "sigma": "", "q": "", "steps": "",
            "fprs": "0.001, 0.01, 0.1"}
#: ten shapes (q, steps, delta, epsilon, sampling, relation) for the page-vs-calibrate check
SHAPES = [(0.01, 10_000, 1e-5, 6.0, "poisson", "add_remove"), (0.01, 1_000, 1e-5, 2.0, "poisson", "add_remove"),
          (0.004, 25_000, 1e-6, 3.0, "poisson", "add_remove"), (0.02, 500, 1e-5, 1.0, "poisson", "add_remove"),
          (0.001, 50_000, 1e-5, 0.5, "poisson", "add_remove"), (0.01, 2_000, 1e-5, 4.0, "wor", "add_remove"),
          (0.05, 200, 1e-7, 8.0, "poisson", "add_remove"), (0.01, 1_000, 1e-5, 2.0, "poisson", "remove"),
          (0.01, 1_000, 1e-5, 2.0, "poisson", "substitution"), (1.0, 10, 1e-5, 3.0, "poisson", "add_remove")]


def _cli_error(*argv) -> str:
    """The error line the command line prints (without its 'pldlib: error: ' prefix)."""
    r = subprocess.run([sys.executable, "-m", "pldlib", *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("pldlib: error: ")
    return line.removeprefix("pldlib: error: ")


CLI_BASE = ["calibrate", "--q", "0.01", "--steps", "100", "--delta", "1e-5", "--epsilon", "2"]


@pytest.mark.parametrize("field,value,flag", [("delta", "2", "--delta"), ("delta", "0", "--delta"),
                                              ("epsilon", "-1", "--epsilon"), ("q", "1.5", "--q"),
                                              ("steps", "1.5", "--steps"), ("epsilon", "abc", "--epsilon")])
def test_the_form_gets_the_command_lines_messages(field, value, flag):
    form = {"q": "0.01", "steps": "100", "delta": "1e-5", "epsilon": "2", field: value}
    argv = list(CLI_BASE)
    argv[argv.index(flag) + 1] = value
    with pytest.raises(QueryError) as ei:
        parse_query(form)
    assert ei.value.field == field
    assert str(ei.value) == _cli_error(*argv)


def test_form_fields_become_the_query():
    q = parse_query(HEADLINE)
    assert (q.q, q.steps, q.delta, q.epsilon, q.sigma) == (0.01, 10_000, 1e-5, 6.0, None)
    assert parse_query({**HEADLINE, "epochs": "", "steps": "777"}).steps == 777
    assert parse_query({**HEADLINE, "dataset_size": "", "batch_size": "", "q": "0.5"}).q == 0.5
    with pytest.raises(QueryError, match="not both"):
        parse_query({**HEADLINE, "sigma": "1"})
    with pytest.raises(QueryError, match="at most the dataset size") as ei:
        parse_query({**HEADLINE, "batch_size": "70000"})
    assert ei.value.field == "batch_size"
    with pytest.raises(QueryError, match="invalid choice"):
        parse_query({**HEADLINE, "relation": "swap"})


# -- the server -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    with BackgroundServer() as s:
        yield s


def _form(q, steps, delta, eps, sampling, relation):
    return {"q": str(q), "steps": str(steps), "delta": str(delta), "epsilon": str(eps), "sampling": sampling,
            "relation": relation}


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[4]}-{s[5]}-q{s[0]}-k{s[1]}-e{s[3]}" for s in SHAPES])
def test_the_pages_certified_sigma_is_calibrates(server, shape):
    q, steps, delta, eps, sampling, relation = shape
    status, job = server.request("POST", "/api/jobs", _form(*shape))
    assert status == 201
    j = server.wait_job(job["id"])
    assert j["state"] == "done", j
    res = j["result"]
    ref = pldlib.calibrate(eps, delta, q, steps, sampling=sampling, relation=relation)
    assert res["calibration"]["sigma"] == ref.sigma
    # and it is certified: the accountant, asked directly, bounds eps at that sigma below the target
    mech = pldlib.Gaussian(sigma=ref.sigma, q=q, sampling=sampling if q < 1 else "none", relation=relation)
    check = pldlib.account(mech, steps=steps, spacing=ref.spacing).epsilon(delta)
    assert check.upper <= eps
    assert res["epsilon"]["lower"] == check.lower and res["epsilon"]["upper"] == check.upper
    band = res["band"]
    assert band["steps"][-1] == steps and band["upper"][-1] == check.upper
    assert all(lo <= up for lo, up in zip(band["lower"], band["upper"]))
    # the atlas answer, where it covers the query, is certified too (at least the exact optimum)
    status, a = server.request("POST", "/api/atlas", _form(*shape))
    assert status == 200
    if a["atlas"]["sigma"] is not None:
        assert a["atlas"]["sigma"] >= ref.sigma_lower if ref.sigma_lower else True
        at = pldlib.account(pldlib.Gaussian(sigma=a["atlas"]["sigma"], q=q, sampling=sampling if q < 1 else "none",
                                            relation=relation), steps=steps).epsilon(delta)
        assert at.upper <= eps * (1 + 1e-9)


def test_a_given_sigma_and_the_attack_bounds(server):
    status, job = server.request("POST", "/api/jobs", {**HEADLINE, "epsilon": "", "sigma": "1"})
    assert status == 201
    r = server.wait_job(job["id"])["result"]
    acc = pldlib.account(pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson"), steps=10_000)
    iv = acc.epsilon(1e-5)
    assert (r["epsilon"]["lower"], r["epsilon"]["upper"]) == (iv.lower, iv.upper)
    tpr = acc.max_tpr([0.001, 0.01, 0.1])
    assert r["tpr"]["lower"] == list(tpr.lower) and r["tpr"]["upper"] == list(tpr.upper)
    assert "calibration" not in r


def test_bad_input_is_a_400_naming_the_field(server):
    status, body = server.request("POST", "/api/atlas", {**HEADLINE, "delta": "2"})
    assert status == 400 and body["field"] == "delta"
    assert body["error"] == _cli_error("calibrate", "--q", "0.01", "--steps", "100", "--delta", "2", "--epsilon", "2")
    status, body = server.request("POST", "/api/jobs", {**HEADLINE, "epochs": "-1"})
    assert status == 400 and body["field"] == "epochs"
    assert server.request("GET", "/api/jobs/99999")[0] == 404


def test_a_long_job_reports_progress_and_is_cancelled(server):
    # 10^8 steps at a small q: far longer than the test waits
    status, job = server.request("POST", "/api/jobs", {"q": "0.0001", "steps": "100000000", "delta": "1e-9",
                                                       "epsilon": "0.3", "sampling": "wor", "relation": "substitution"})
    assert status == 201
    time.sleep(1.0)
    _, j = server.request("GET", f"/api/jobs/{job['id']}")
    assert j["state"] == "running" and j["stages"], j
    proc = server.app.pldlib_state["jobs"]._jobs[job["id"]]._proc
    _, j = server.request("DELETE", f"/api/jobs/{job['id']}")
    assert j["state"] == "cancelled"
    proc.join(10)
    assert not proc.is_alive()


# -- in the browser ---------------------------------------------------------------------------------
needs_chromium = pytest.mark.skipif(find_chromium() is None,
                                    reason="Chromium is not installed here (apt-get install chromium)")


def _shots(tmp_path) -> Path:
    d = Path(os.environ.get("PLDLIB_SCREENSHOTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _fill(b, form):
    for k, v in form.items():
        b.type(k, v)


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        pytest.skip("Chromium is not installed here (apt-get install chromium)")
    with Browser() as b:
        yield b


@needs_chromium
def test_the_page_on_the_dpsgd_headline(server, browser, tmp_path):
    b = browser
    b.goto(server.url)
    _fill(b, HEADLINE)
    b.click("compute")
    atlas_s = b.wait_for("document.body.dataset.atlas === 'done'", timeout=30)
    exact_s = b.wait_for("document.body.dataset.exact === 'done'", timeout=120)
    ref = pldlib.calibrate(6.0, 1e-5, 0.01, 10_000)
    shown = float(b.js("document.getElementById('exact-sigma').dataset.value"))
    assert shown == ref.sigma
    assert "sigma = " in b.js("document.getElementById('exact-sigma').textContent")
    lo = float(b.js("document.getElementById('exact-eps').dataset.lower"))
    up = float(b.js("document.getElementById('exact-eps').dataset.upper"))
    iv = pldlib.account(pldlib.Gaussian(sigma=ref.sigma, q=0.01, sampling="poisson"), steps=10_000,
                        spacing=ref.spacing).epsilon(1e-5)
    assert (lo, up) == (iv.lower, iv.upper) and up <= 6.0
    atlas_sigma = float(b.js("document.getElementById('atlas-sigma').dataset.value"))
    assert atlas_sigma >= ref.sigma_lower  # certified: never below the certified-infeasible sigma
    assert b.js("document.querySelectorAll('#tpr tbody tr').length") == 3
    assert b.js("document.querySelector('#band path') !== null && document.querySelector('#curve path') !== null")
    assert b.js("document.getElementById('error').textContent") == ""
    assert b.console == []
    b.screenshot(_shots(tmp_path) / "calculator_headline.png")
    print(f"atlas answer after {atlas_s:.2f} s, exact after {exact_s:.2f} s")


@needs_chromium
def test_the_page_on_bad_input_shows_the_cli_message(server, browser, tmp_path):
    b = browser
    b.goto(server.url)
    _fill(b, {**HEADLINE, "delta": "2"})
    b.click("compute")
    b.wait_for("document.getElementById('error').textContent !== ''", timeout=30)
    msg = b.js("document.getElementById('error').textContent")
    assert msg == _cli_error("calibrate", "--q", "0.01", "--steps", "100", "--delta", "2", "--epsilon", "2")
    assert b.js("document.getElementById('delta').classList.contains('bad')")
    assert b.js("document.getElementById('exact-sigma').dataset.value") == ""
    b.screenshot(_shots(tmp_path) / "calculator_bad_input.png")


@needs_chromium
def test_cancel_from_the_page(server, browser):
    b = browser
    b.goto(server.url)
    _fill(b, {**HEADLINE, "dataset_size": "", "batch_size": "", "q": "0.0001", "epochs": "", "steps": "100000000",
              "delta": "1e-9", "epsilon": "0.3", "sampling": "wor", "relation": "substitution"})
    b.click("compute")
    b.wait_for("!document.getElementById('cancel').disabled && document.getElementById('status').textContent !== ''",
               timeout=30)
    b.click("cancel")
    b.wait_for("document.body.dataset.exact === 'cancelled'", timeout=30)
    assert b.js("document.getElementById('status').textContent") == "cancelled"
    assert not any(j._proc.is_alive() for j in server.app.pldlib_state["jobs"]._jobs.values() if j._proc)


@needs_chromium
def test_the_static_export_answers_from_disk(browser, tmp_path):
    from pldlib.web.export import export, lookup

    out = tmp_path / "site"
    files = export(out)
    assert sorted(Path(f).name for f in files) == ["atlas_slice.js", "index.html"]
    data = json.loads((out / "atlas_slice.js").read_text().removeprefix("window.PLDLIB_ATLAS = ").rstrip(";\n"))
    b = browser
    b.goto((out / "index.html").as_uri())
    assert b.js("document.getElementById('mode').textContent") == "static"
    for form, (q, steps, delta, eps) in [(HEADLINE, (0.01, 10_000, 1e-5, 6.0)),
                                         ({**HEADLINE, "batch_size": "256", "epochs": "30", "epsilon": "3"},
                                          (256 / 60000, 7032, 1e-5, 3.0))]:
        _fill(b, form)
        b.click("compute")
        b.wait_for("document.body.dataset.atlas === 'done'", timeout=30)
        shown = float(b.js("document.getElementById('atlas-sigma').dataset.value"))
        assert shown == lookup(data, eps, delta, q, steps)
        # certified: the accountant bounds eps at the page's sigma below the target
        assert pldlib.account(pldlib.Gaussian(sigma=shown, q=q, sampling="poisson"), steps=steps).epsilon(delta).upper \
            <= eps
    _fill(b, {**HEADLINE, "delta": "2"})
    b.click("compute")
    b.wait_for("document.getElementById('error').textContent !== ''", timeout=30)
    assert b.js("document.getElementById('error').textContent") == \
        _cli_error("calibrate", "--q", "0.01", "--steps", "100", "--delta", "2", "--epsilon", "2")


def test_the_browser_closes_in_a_thread_without_an_event_loop():
    """Closing the DevTools connection works whatever event loop the thread has (a test that
    ran before may have left the main thread with none)."""
    import asyncio

    if find_chromium() is None:
        pytest.skip("Chromium is not installed here (apt-get install chromium)")
    asyncio.set_event_loop(None)
    with Browser() as b:
        assert b.js("6 * 7") == 42
    assert b.proc.poll() is not None
