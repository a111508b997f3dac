"""Tests of the command-line interface (pldlib/cli.py).

The library's numerical correctness is tested elsewhere; here the closed forms
only check that the CLI passes the right parameters through and reports the
interval the right way round.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import log_ndtr

import pldlib
from pldlib import cli
from pldlib.methods.pld import Interval

ROOT = Path(__file__).resolve().parents[1]


# -- closed forms -------------------------------------------------------------
def gauss_log_delta(eps, mu):
    """ln delta(eps) of the Gaussian pair N(0,1) vs N(mu,1) (stable in the tail)."""
    la = log_ndtr(-eps / mu + mu / 2)
    lb = log_ndtr(-eps / mu - mu / 2)
    return la + np.log1p(-np.exp(eps + lb - la))


def gauss_eps(delta, mu):
    return brentq(lambda e: gauss_log_delta(e, mu) - math.log(delta), -0.999 * mu * mu,
                  mu * mu / 2 + 60 * mu + 60, xtol=1e-13, rtol=1e-15)


def laplace_delta(eps, b, sens=1.0):
    return max(0.0, -math.expm1((eps - sens / b) / 2))


# -- helpers ------------------------------------------------------------------
def run_main(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def json_strict(text):
    """json.loads that refuses NaN / Infinity (the output must be strict JSON)."""
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=bad)


GAUSS = ["--mechanism", "gaussian", "--sigma", "2", "--steps", "50"]
SGAUSS = GAUSS + ["--q", "0.5", "--sampling", "poisson"]


# -- successful runs ------------------------------------------------------------
def test_epsilon_json_structure_and_values(capsys):
    deltas = [1e-3, 1e-6, 1e-9]
    code, out, err = run_main(["epsilon", *GAUSS, "--delta", *map(str, deltas), "--json"], capsys)
    assert code == 0 and err == ""
    assert out.count("\n") == 1  # exactly one line: one JSON object
    obj = json_strict(out)
    # (issue 40: every answer says whether it is trivial or accuracy-limited, with its notes)
    assert set(obj) == {"epsilon", "method", "seconds", "params", "notes", "trivial", "accuracy_limited"}
    assert obj["notes"] == [] and obj["trivial"] is False and obj["accuracy_limited"] is False
    assert obj["method"] == "pld"
    assert isinstance(obj["seconds"], float) and 0 < obj["seconds"] < 60
    p = obj["params"]
    assert p["mechanism"] == "gaussian" and p["sigma"] == 2.0 and p["steps"] == 50
    assert p["q"] == 1.0 and p["sampling"] == "none" and p["relation"] == "add_remove"
    assert p["sensitivity"] == 1.0 and p["spacing"] > 0
    assert [set(r) for r in obj["epsilon"]] == [{"delta", "lower", "upper", "trivial"}] * 3
    mu = math.sqrt(50) / 2.0
    for r, d in zip(obj["epsilon"], deltas):
        assert r["delta"] == d
        truth = gauss_eps(d, mu)
        assert r["lower"] <= truth <= r["upper"]
        assert (r["upper"] - r["lower"]) / truth < 0.02


def test_delta_json_structure_and_values(capsys):
    eps = [0.5, 2.0, 10.0]
    code, out, err = run_main(["delta", *GAUSS, "--epsilon", *map(str, eps), "--json"], capsys)
    assert code == 0 and err == ""
    obj = json_strict(out)
    assert set(obj) == {"delta", "method", "seconds", "params", "notes", "trivial", "accuracy_limited"}
    assert [set(r) for r in obj["delta"]] == [{"epsilon", "lower", "upper", "trivial"}] * 3
    mu = math.sqrt(50) / 2.0
    for r, e in zip(obj["delta"], eps):
        assert r["epsilon"] == e
        truth = math.exp(gauss_log_delta(e, mu))
        assert 0 <= r["lower"] <= truth <= r["upper"] <= 1


def test_laplace_single_step_and_sensitivity(capsys):
    # Laplace(b) with sensitivity s: delta(eps) = 1 - exp((eps - s/b)/2) on [0, s/b]
    eps = [0.0, 0.25, 1.0]
    code, out, _ = run_main(["delta", "--mechanism", "laplace", "--scale", "2", "--sensitivity", "3",
                             "--steps", "1", "--epsilon", *map(str, eps), "--json"], capsys)
    assert code == 0
    obj = json_strict(out)
    assert obj["params"]["scale"] == 2.0 and "sigma" not in obj["params"]
    for r, e in zip(obj["delta"], eps):
        truth = laplace_delta(e, 2.0, 3.0)
        assert r["lower"] <= truth + 1e-12 and truth - 1e-12 <= r["upper"]
        assert r["upper"] - r["lower"] < 1e-3


def test_relation_substitution_doubles_sensitivity(capsys):
    code, out, _ = run_main(["epsilon", *GAUSS, "--relation", "substitution", "--delta", "1e-6",
                             "--json"], capsys)
    assert code == 0
    r = json_strict(out)["epsilon"][0]
    truth = gauss_eps(1e-6, 2 * math.sqrt(50) / 2.0)
    assert r["lower"] <= truth <= r["upper"]


def test_negative_scientific_epsilon_is_a_value(capsys):
    code, out, _ = run_main(["delta", *GAUSS, "--epsilon", "-1e-3", "-2", "--json"], capsys)
    assert code == 0
    assert [r["epsilon"] for r in json_strict(out)["delta"]] == [-1e-3, -2.0]


def test_interval_knob_is_passed_through(capsys):
    code, out, _ = run_main(["epsilon", *GAUSS, "--delta", "1e-5", "--interval", "0.01", "--json"], capsys)
    assert code == 0
    assert json_strict(out)["params"]["spacing"] == 0.01


def test_table_output(capsys):
    code, out, err = run_main(["epsilon", *GAUSS, "--delta", "1e-5", "1e-6"], capsys)
    assert code == 0 and err == ""
    lines = out.strip().splitlines()
    assert lines[0].startswith("epsilon") and "sigma=2" in lines[0]
    assert lines[1].split() == ["delta", "lower", "upper", "width", "rel.width"]
    assert len(lines) == 4
    assert lines[2].split()[0] == "1e-05"
    assert len({len(l) for l in lines[1:]}) == 1  # aligned columns


def test_version(capsys):
    code, out, _ = run_main(["--version"], capsys)
    assert code == 0 and out.strip() == f"pldlib {pldlib.__version__}"


# -- registry, defaults and non-finite output (fake accountant) -----------------------
class _FakeAccountant(pldlib.Accountant):
    """A registered method that answers what the test tells it to."""

    method = "fake"
    made: list = []
    answer: dict = {}

    def __init__(self, relation="add_remove", *, spacing=None, max_bins=None):
        super().__init__(relation)
        self.lo, self.hi, self.exc = self.answer.get("lo", -math.inf), self.answer.get("hi", math.inf), \
            self.answer.get("exc")
        self.spacing = 0.5
        self.made.append(self)

    @property
    def event(self):
        return self.components[0][0].event

    def _answer(self, x):
        if self.exc is not None:
            raise self.exc
        n = np.size(x)
        return Interval(np.full(n, self.lo), np.full(n, self.hi))

    epsilon = delta = _answer


@pytest.fixture
def fake_method(monkeypatch):
    from pldlib import methods

    def install(**kw):
        made = []
        monkeypatch.setattr(_FakeAccountant, "made", made)
        monkeypatch.setattr(_FakeAccountant, "answer", kw)
        monkeypatch.setitem(methods._METHODS, "fake", methods.MethodInfo("fake", "certified", _FakeAccountant))
        return made
    return install


def test_nonfinite_values_are_null_with_note(capsys, fake_method):
    fake_method()
    code, out, err = run_main(["epsilon", *GAUSS, "--delta", "1e-5", "--method", "fake", "--json"], capsys)
    assert code == cli.EXIT_TRIVIAL == 4  # (issue 40: [-inf, inf] is the trivial interval: its own status)
    obj = json_strict(out)
    assert obj["epsilon"] == [{"delta": 1e-5, "lower": None, "upper": None, "trivial": True}]
    assert obj["method"] == "fake" and "null" in obj["note"]
    assert obj["trivial"] is True and "trivial answer" in obj["notes"][0] and "trivial answer" in err


def test_q_below_one_defaults_to_poisson(capsys, fake_method):
    made = fake_method(lo=1.0, hi=2.0)
    code, out, _ = run_main(["epsilon", *GAUSS, "--q", "0.01", "--delta", "1e-5", "--method", "fake",
                             "--json"], capsys)
    assert code == 0
    assert made[0].event.scheme == "poisson" and made[0].event.q == 0.01
    assert json_strict(out)["params"]["sampling"] == "poisson"
    code, _, _ = run_main(["epsilon", *GAUSS, "--q", "0.01", "--sampling", "wor", "--delta", "1e-5",
                           "--method", "fake"], capsys)
    assert code == 0 and made[1].event.scheme == "wor"


@pytest.mark.parametrize("exc, code, word", [
    (ValueError("sigma: something is wrong\nsecond line"), 2, "sigma"),
    (TypeError("steps must be an integer"), 2, "steps"),
    (NotImplementedError("q: sampling 'wor' with q < 1 is not supported yet"), 2, "q"),
    (pldlib.PrecisionLimitError("delta=1e-300: cannot certify"), 3, "PrecisionLimitError"),
    (pldlib.GridTooLargeError("composition needs 10 grid points"), 3, "GridTooLargeError"),
    (ZeroDivisionError("oops"), 1, "internal error"),
])
def test_library_errors_map_to_exit_codes(capsys, fake_method, exc, code, word):
    fake_method(exc=exc)
    got, out, err = run_main(["epsilon", *GAUSS, "--delta", "1e-5", "--method", "fake"], capsys)
    assert got == code and out == ""
    assert len(err.splitlines()) == 1 and word in err


# -- real limits -> exit 3 ------------------------------------------------------------
@pytest.mark.parametrize("extra, word", [
    (["--interval", "0.01", "--max-bins", "100", "--delta", "1e-6"], "GridTooLargeError"),
    (["--delta", "1e-300"], "PrecisionLimitError"),
])
def test_real_limits_exit_3(capsys, extra, word):
    # (a subsampled Gaussian: the unsampled one is answered in closed form, docs/MATH.md section 12)
    code, out, err = run_main(["epsilon", *SGAUSS, *extra], capsys)
    assert code == 3 and out == ""
    assert len(err.splitlines()) == 1 and word in err


# -- bad input -> exit 2, one line naming the argument ------------------------------------
BASE = {"mechanism": "gaussian", "sigma": "1", "steps": "10", "delta": "1e-6"}


def _argv(cmd="epsilon", drop=(), **over):
    d = {k: v for k, v in {**BASE, **over}.items() if k not in drop}
    if cmd == "delta":
        d.pop("delta", None)
        d.setdefault("epsilon", "1")
    argv = [cmd]
    for k, v in d.items():
        argv.append("--" + k.replace("_", "-"))
        argv += v.split() if isinstance(v, str) else list(v)
    return argv


BAD = [
    (_argv(sigma="-1"), "--sigma"),
    (_argv(sigma="0"), "--sigma"),
    (_argv(sigma="nan"), "--sigma"),
    (_argv(sigma="inf"), "--sigma"),
    (_argv(sigma="-inf"), "--sigma"),
    (_argv(sigma="abc"), "--sigma"),
    (_argv(steps="0"), "--steps"),
    (_argv(steps="1.5"), "--steps"),
    (_argv(steps="-3"), "--steps"),
    (_argv(steps="ten"), "--steps"),
    (_argv(delta="0"), "--delta"),
    (_argv(delta="1"), "--delta"),
    (_argv(delta="1.5"), "--delta"),
    (_argv(delta="-1e-6"), "--delta"),
    (_argv(delta="1e-6 nan"), "--delta"),
    (_argv(delta=[]), "--delta"),
    (_argv("delta", epsilon="nan"), "--epsilon"),
    (_argv("delta", epsilon="1 inf"), "--epsilon"),
    (_argv("delta", epsilon="-inf"), "--epsilon"),
    (_argv(q="0"), "--q"),
    (_argv(q="1.5"), "--q"),
    (_argv(q="0.1", sampling="none"), "--q"),
    (_argv(mechanism="cauchy"), "--mechanism"),
    (_argv(sampling="bernoulli"), "--sampling"),
    (_argv(relation="neighbour"), "--relation"),
    (_argv(method="magic"), "--method"),
    (_argv(scale="1"), "--scale"),  # --scale with gaussian
    (_argv(mechanism="laplace"), "--sigma"),  # --sigma with laplace
    (_argv(mechanism="laplace", drop=("sigma",)), "--scale"),  # laplace without --scale
    (_argv(drop=("sigma",)), "--sigma"),
    (_argv(drop=("steps",)), "--steps"),
    (_argv(spacing="0"), "--interval"),
    (_argv(sensitivity="-2"), "--sensitivity"),
]


@pytest.mark.parametrize("argv, name", BAD, ids=[" ".join(a[1:]) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(capsys, argv, name):
    code, out, err = run_main(argv, capsys)
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert name in lines[0]


def test_no_command_exits_2(capsys):
    code, _, err = run_main([], capsys)
    assert code == 2 and len(err.splitlines()) == 1


# -- as a real process ------------------------------------------------------------------
def _proc(args):
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    return subprocess.run([sys.executable, "-m", "pldlib.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def test_subprocess_json():
    r = _proc(["epsilon", *GAUSS, "--delta", "1e-5", "--json"])
    assert r.returncode == 0 and r.stderr == ""
    obj = json_strict(r.stdout)
    truth = gauss_eps(1e-5, math.sqrt(50) / 2.0)
    assert obj["epsilon"][0]["lower"] <= truth <= obj["epsilon"][0]["upper"]


def test_subprocess_bad_input():
    r = _proc(["epsilon", *GAUSS, "--delta", "0"])
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "--delta" in r.stderr


def test_subprocess_precision_limit_no_traceback_or_warning():
    r = _proc(["epsilon", *SGAUSS, "--delta", "1e-300"])
    assert r.returncode == 3 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr


def test_console_script_version():
    script = Path(sys.executable).parent / "pldlib"
    if not script.exists():
        pytest.skip("console script not installed next to this interpreter")
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"pldlib {pldlib.__version__}"
