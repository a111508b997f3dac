"""Issue 40 (command line): nothing lost, nothing silent.

Every answer that is trivial, accuracy-limited or on a too coarse grid says so (a
``pldlib: note:`` line on stderr and the JSON fields ``notes`` / ``trivial`` /
``accuracy_limited``); a trivial answer exits with its own status (4); messages carry
neither a doubled method prefix (``rdp: rdp:``) nor numpy 2 reprs (``np.float64(2.0)``);
an unexpected exception is one line with a hint to rerun with ``--debug``.

The real command is run as a subprocess where the issue was seen; the numbers are
checked against closed forms and test-statistic bounds written here, independent of
the code under test.
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
from scipy import stats
from scipy.special import log_ndtr, logsumexp, ndtr

import pldlib
from pldlib import cli
from pldlib.attack import calibrate_attack
from pldlib.exact import GaussianExact

EXE = Path(sys.executable).with_name("pldlib")
CMD = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "pldlib"]


def pldlib_cli(*argv, timeout=60):
    """The real command line, as a user runs it (fresh process, default environment)."""
    env = {k: v for k, v in os.environ.items() if k != "PLDLIB_DEBUG"}
    return subprocess.run([*CMD, *argv], capture_output=True, text=True, timeout=timeout, env=env)


def strict(text):
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=bad)


def note_lines(err):
    lines = err.splitlines()
    assert lines and all(l.startswith(("pldlib: note: ", "pldlib: warning: ")) for l in lines), err
    assert "Traceback" not in err
    return lines


# -- independent references (the unsampled Gaussian's closed form, shared with test_cli) -----
from test_cli import gauss_eps, gauss_log_delta  # noqa: E402


def poisson_gauss_delta_one_step(eps, q, sigma):
    """delta(eps) of ONE Poisson-subsampled Gaussian step under add_remove (max of the two
    directions), from the monotone likelihood ratio in x: P = (1-q) N(0,s^2) + q N(1,s^2), Q = N(0,s^2)."""
    mu = 1.0 / sigma

    def remove(e):  # P vs Q: L(x) = ln(1 - q + q exp(mu x - mu^2/2)) > e  <=>  x > x*
        x = (math.log((math.exp(e) - (1 - q)) / q) + mu * mu / 2) / mu if math.exp(e) > 1 - q else -math.inf
        sf = lambda t: 1.0 - ndtr(t) if np.isfinite(t) else 1.0  # noqa: E731
        return (1 - q) * sf(x) + q * sf(x - mu) - math.exp(e) * sf(x)

    def add(e):  # Q vs P: -L(x) > e  <=>  x < x*(-e)
        if math.exp(-e) <= 1 - q:
            return 0.0
        x = (math.log((math.exp(-e) - (1 - q)) / q) + mu * mu / 2) / mu
        return ndtr(x) - math.exp(e) * ((1 - q) * ndtr(x) + q * ndtr(x - mu))

    return max(remove(eps), add(eps), 0.0)


def sum_test_eps_lower(delta, q, sigma, k):
    """A certified LOWER bound on eps(delta) for k Poisson-subsampled Gaussian steps (remove
    direction, hence add_remove too), from the one test S = {sum of the k outputs > t}:
    delta(eps) >= P(S) - e^eps Q(S) for every event S, so eps(delta) >= ln((P(S) - delta) / Q(S)).
    Under Q the sum is N(0, k sigma^2); under P it is B + N(0, k sigma^2), B ~ Binomial(k, q)."""
    sd = sigma * math.sqrt(k)
    m, s = k * q, math.sqrt(k * q * (1 - q))
    b = np.arange(max(0, int(m - 12 * s)), int(m + 12 * s) + 1, dtype=float)
    logw = stats.binom.logpmf(b, k, q)
    tot = math.sqrt(s * s + sd * sd)

    def eps_at(t):
        log_p = logsumexp(logw + log_ndtr((b - t) / sd))  # ln P(S)
        if log_p <= math.log(delta):
            return -math.inf
        return log_p + math.log1p(-delta / math.exp(log_p)) - log_ndtr(-t / sd)

    ts = np.linspace(m - 2 * tot, m + 8 * tot, 101)
    for _ in range(3):  # any t gives a valid bound: a grid, refined twice around its best point
        vals = [eps_at(t) for t in ts]
        i = int(np.argmax(vals))
        ts = np.linspace(ts[max(i - 1, 0)], ts[min(i + 1, len(ts) - 1)], 41)
    return max(vals)


def rdp_eps_upper(delta, q, sigma, k, orders=range(2, 257)):
    """A certified UPPER bound on eps(delta): the moments accountant (integer orders,
    Mironov-Talwar-Zhang) with the conversion of Balle et al. 2020, written out here."""
    best = math.inf
    for a in orders:
        j = np.arange(a + 1, dtype=float)
        logc = stats.binom.logpmf(j, a, q)  # C(a, j) q^j (1-q)^(a-j)
        rdp = k * logsumexp(logc + (j * j - j) / (2 * sigma * sigma)) / (a - 1)
        best = min(best, rdp + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1))
    return best


# -- the reproducers --------------------------------------------------------------
SAMPLED = ["--mechanism", "gaussian", "--sigma", "1", "--q", "0.01"]


def test_trivial_answer_has_note_status_4_and_json_fields():
    """10^10 steps of users of up to 3 records: no grid fits the budgets and the analytic bounds
    certify nothing, the answer is the trivial interval.  (Without --group this was printed as
    `-inf inf` with exit 0 and nothing on stderr; it now has an answer, next test.)"""
    r = pldlib_cli("epsilon", *SAMPLED, "--group", "3", "--steps", "10000000000", "--delta", "1e-5", "--json",
                   "--time-budget", "3")  # (trivial at the default 10 s too; at 3 s it was refused, exit 3)
    assert r.returncode == cli.EXIT_TRIVIAL == 4, r.stderr
    lines = note_lines(r.stderr)
    assert any("trivial answer at delta 1e-05" in l and "exit status 4" in l for l in lines)
    assert any("accuracy-limited" in l for l in lines)
    obj = strict(r.stdout)
    assert obj["trivial"] is True and obj["accuracy_limited"] is True
    assert obj["notes"] == [l.split(": ", 2)[2] for l in lines]
    row, = obj["epsilon"]
    assert row["trivial"] is True and row["upper"] is None
    # trivial = no better than eps >= ln(1 - delta), the bound of every pair (delta(eps) >= 1 - e^eps)
    assert row["lower"] is None or row["lower"] <= math.log1p(-1e-5) * (1 - 1e-9)


def test_trivial_answer_table_and_delta():
    # (users of up to 3 records: no grid fits the budgets)
    r = pldlib_cli("delta", *SAMPLED, "--group", "3", "--steps", "10000000000", "--epsilon", "1", "-1",
                   "--time-budget", "0.5")  # (no time for the analytic bounds, which stop 0.5 s before the
    # deadline: at 10 s the Chernoff lower bound of delta near 1 answers both, [1 - 8u, 1])
    assert r.returncode == 4, r.stderr
    lines = note_lines(r.stderr)
    assert any("trivial answer at epsilon 1, -1" in l for l in lines)
    # the printed intervals contain the trivial range's ends: [max(0, 1 - e^eps), 1]
    rows = [l.split() for l in r.stdout.splitlines()[2:]]
    for (e, lo, up, *_), eps in zip(rows, (1.0, -1.0)):
        assert float(up) == 1.0 and float(lo) <= max(0.0, -math.expm1(eps)) * (1 + 1e-9)


def test_no_grid_fits_but_the_analytic_bounds_answer():
    """10^10 steps: no grid fits the budgets; an eps answer with no finite upper end is asked of the
    analytic bounds (Renyi-DP conversion, saddle point with its Berry-Esseen terms), which answer it
    (it was the trivial [ln(1 - delta), inf]).  Both ends checked by independent bounds."""
    delta, q, sigma, k = 1e-5, 0.01, 1.0, 10**10
    r = pldlib_cli("epsilon", *SAMPLED, "--steps", str(k), "--delta", str(delta), "--json")
    assert r.returncode == 0, r.stderr
    assert all(l.startswith("pldlib: note: accuracy-limited: ") for l in note_lines(r.stderr))
    obj = strict(r.stdout)
    assert obj["accuracy_limited"] is True and obj["trivial"] is False
    row, = obj["epsilon"]
    assert row["upper"] - row["lower"] <= 1e-3 * row["upper"], row
    assert sum_test_eps_lower(delta, q, sigma, k) <= row["upper"]
    assert row["lower"] <= rdp_eps_upper(delta, q, sigma, k, orders=range(2, 8))


def test_accuracy_limited_answer_says_so():
    """10^8 steps: the automatic grid is coarsened to fit the budget (wider, still certified)."""
    delta, q, sigma, k = 1e-5, 0.01, 1.0, 10**8
    r = pldlib_cli("epsilon", *SAMPLED, "--steps", str(k), "--delta", str(delta), "--json")
    assert r.returncode == 0, r.stderr
    lines = note_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("pldlib: note: accuracy-limited: ")
    obj = strict(r.stdout)
    assert obj["accuracy_limited"] is True and obj["trivial"] is False
    assert obj["notes"] == [lines[0].removeprefix("pldlib: note: ")]
    row, = obj["epsilon"]
    assert row["trivial"] is False
    # certified, checked from both sides by independent bounds on the truth
    lower_ref = sum_test_eps_lower(delta, q, sigma, k)
    upper_ref = rdp_eps_upper(delta, q, sigma, k, orders=range(2, 8))
    assert 4000 < lower_ref <= row["upper"]
    assert row["lower"] <= upper_ref
    assert row["lower"] <= row["upper"]


def test_budget_flags_reach_the_accountant_and_are_checked(capsys):
    """--time-budget / --memory-budget: a small budget gives a wider answer, flagged, still
    containing the independent bounds; bad values and methods that do not take them exit 2."""
    delta, q, sigma, k = 1e-5, 0.01, 1.0, 10**8
    r = pldlib_cli("epsilon", *SAMPLED, "--steps", str(k), "--delta", str(delta), "--json",
                   "--time-budget", "1", "--memory-budget", "64M")
    assert r.returncode == 0, r.stderr
    obj = strict(r.stdout)
    assert obj["accuracy_limited"] is True
    assert "67,108,864 bytes" in obj["notes"][0] and "1.0 s" in obj["notes"][0], obj["notes"]
    row, = obj["epsilon"]
    assert sum_test_eps_lower(delta, q, sigma, k) <= row["upper"]
    assert row["lower"] <= rdp_eps_upper(delta, q, sigma, k, orders=range(2, 8))
    for extra, says in ((["--time-budget", "0"], "--time-budget: must be > 0"),
                        (["--time-budget", "nan"], "--time-budget"),
                        (["--memory-budget", "12x"], "is not a byte count"),
                        (["--memory-budget", "1k"], "at least 1M"),
                        (["--method", "spa", "--time-budget", "5"], "applies to --method pld only"),
                        (["--method", "spa", "--memory-budget", "1G"], "applies to --method pld / prv only")):
        code = cli.main(["epsilon", *SAMPLED, "--steps", "10", "--delta", "1e-5", *extra])
        err = capsys.readouterr().err
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (extra, err)


def test_normal_answer_no_note_exit_0():
    """Unsampled Gaussian: mu = sqrt(50)/2; the printed interval contains the closed form."""
    deltas = [1e-3, 1e-6]
    r = pldlib_cli("epsilon", "--mechanism", "gaussian", "--sigma", "2", "--steps", "50", "--delta",
                   *map(str, deltas), "--json")
    assert r.returncode == 0 and r.stderr == ""
    obj = strict(r.stdout)
    assert obj["notes"] == [] and obj["trivial"] is False and obj["accuracy_limited"] is False
    mu = math.sqrt(50) / 2
    for row, d in zip(obj["epsilon"], deltas):
        assert row["trivial"] is False
        assert row["lower"] <= gauss_eps(d, mu) <= row["upper"]


def test_normal_subsampled_answer_no_note(capsys):
    """One Poisson-subsampled Gaussian step: delta(eps) in closed form (monotone likelihood ratio)."""
    eps = [0.25, 0.5, 1.0]
    code = cli.main(["delta", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.5", "--steps", "1",
                     "--epsilon", *map(str, eps), "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    obj = strict(out)
    assert obj["notes"] == [] and obj["trivial"] is False and obj["accuracy_limited"] is False
    for row, e in zip(obj["delta"], eps):
        truth = poisson_gauss_delta_one_step(e, 0.5, 1.0)
        assert 0.01 < truth and row["lower"] <= truth <= row["upper"] and row["trivial"] is False


def test_reference_formulas_are_right():
    """The test's own references against each other: the one-step closed form at q = 1 is the
    Gaussian closed form; the sum test is exactly the optimal test then (k = 1, q = 1)."""
    for e in (0.1, 1.0, 3.0):
        assert poisson_gauss_delta_one_step(e, 1.0 - 1e-12, 0.7) == pytest.approx(
            math.exp(gauss_log_delta(e, 1 / 0.7)), rel=1e-6)
    mu = 2.0
    assert sum_test_eps_lower(1e-5, 1.0 - 1e-12, 1 / mu, 1) == pytest.approx(gauss_eps(1e-5, mu), rel=2e-3)
    assert rdp_eps_upper(1e-5, 1.0, 1 / mu, 1) >= gauss_eps(1e-5, mu)


# -- trade-off and calibration ---------------------------------------------------------
def test_tradeoff_trivial_and_normal(capsys):
    # rdp at sigma 0.5, q 0.5, 100 steps certifies nothing on the trade-off curve
    code = cli.main(["tradeoff", "--mechanism", "gaussian", "--sigma", "0.5", "--q", "0.5", "--steps", "100",
                     "--method", "rdp", "--alpha", "0", "0.1", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 4
    obj = strict(out)
    assert [r["trivial"] for r in obj["tradeoff"]] == [True, True, False]  # beta(1) = 0 is exact
    assert obj["advantage"]["trivial"] and obj["gdp_mu"]["trivial"] and obj["trivial"]
    assert len(note_lines(err)) == 3 and all("trivial answer" in n for n in obj["notes"])
    # Gaussian-DP with mu = sqrt(4)/2 = 1: beta(alpha) = Phi(Phi^-1(1 - alpha) - 1)
    a = [0.001, 0.1]
    code = cli.main(["tradeoff", "--mechanism", "gaussian", "--sigma", "2", "--steps", "4", "--alpha",
                     *map(str, a), "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    obj = strict(out)
    assert obj["notes"] == [] and obj["trivial"] is False and not obj["advantage"]["trivial"]
    for row, x in zip(obj["tradeoff"], a):
        assert row["lower"] <= stats.norm.cdf(stats.norm.ppf(1 - x) - 1.0) <= row["upper"]
        assert row["trivial"] is False


def test_calibrate_json_has_the_fields(capsys):
    code = cli.main(["calibrate", "--epsilon", "1", "--delta", "1e-6", "--steps", "10", "--no-table", "--json"])
    out, err = capsys.readouterr()
    obj = strict(out)
    assert code == 0 and {"notes", "trivial", "accuracy_limited"} <= set(obj)
    assert obj["trivial"] is False and obj["accuracy_limited"] is False
    assert (obj["notes"] == []) == (obj["sigma_lower"] is not None) == (err == "")
    # the calibrated sigma meets the target: closed form of the unsampled Gaussian, mu = sqrt(10)/sigma
    assert gauss_eps(1e-6, math.sqrt(10) / obj["sigma"]) <= 1.0


def test_coarse_interval_is_a_json_note_too(capsys):
    code = cli.main(["epsilon", *SAMPLED, "--steps", "1000", "--delta", "1e-5", "--spacing", "0.1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and err.startswith("pldlib: warning: --spacing 0.1 is too coarse here")
    obj = strict(out)
    assert obj["notes"] == [err.strip().removeprefix("pldlib: warning: ")]
    assert obj["trivial"] is False and obj["accuracy_limited"] is False


def test_help_documents_the_status_and_fields():
    r = pldlib_cli("epsilon", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "4 answer printed, but at least one interval is trivial" in text
    assert '"notes", "trivial" and "accuracy_limited"' in text and "--debug" in text


# -- messages: no doubled prefix, no numpy reprs, one line --------------------------------------
def test_rdp_doubled_prefix_real_cli():
    r = pldlib_cli("epsilon", "--mechanism", "laplace", "--scale", "1", "--steps", "10", "--delta", "1e-5",
                   "--method", "rdp")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("pldlib: error: rdp: only the Gaussian mechanism is supported (got LaplaceEvent); "
                        "use the PLD or SPA accountant\n")


EDGE = [
    (["epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.001", "--sampling", "shuffle", "--steps",
      "1000", "--delta", "1e-5", "--method", "clt"], 2, "clt: no formula for 'shuffle' sampling"),
    (["epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.1", "--steps", "10", "--group", "2",
      "--delta", "1e-5", "--method", "rdp"], 2, "rdp: no formula for user-level accounting"),
    (["epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.1", "--sampling", "wor", "--relation",
      "substitution", "--steps", "10", "--delta", "1e-5", "--method", "clt"], 2, "clt: wor sampling"),
    (["epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.3", "--sampling", "random_allocation",
      "--steps", "10", "--delta", "1e-5"], 2, "got q=0.3"),
    (["tradeoff", "--mechanism", "gaussian", "--sigma", "1", "--steps", "10", "--alpha", "2"], 2, "--alpha"),
    (["calibrate", "--epsilon", "1", "--delta", "1e-5", "--steps", "10", "--table", __file__], 2,
     "not a pldlib atlas"),
]


@pytest.mark.parametrize("argv, code, needle", EDGE, ids=[" ".join(a[:1] + a[-3:]) for a, _, _ in EDGE])
def test_messages_clean(capsys, argv, code, needle):
    got = cli.main(argv)
    out, err = capsys.readouterr()
    assert got == code and out == "" and needle in err and err.count("\n") == 1
    assert "np.float64" not in err and "np.int64" not in err
    method = argv[argv.index("--method") + 1] if "--method" in argv else None
    assert method is None or err.count(f"{method}:") == 1


@pytest.mark.parametrize("call, text", [
    (lambda: pldlib.account(pldlib.Gaussian(1.0), steps=3).max_tpr(np.float64(2.0)),
     "fpr: must lie in [0, 1], got 2.0"),
    (lambda: pldlib.account(pldlib.Gaussian(1.0), steps=3).tradeoff([0.5, np.float64(2.0)]),
     "alpha: must lie in [0, 1], got 2.0"),
    (lambda: pldlib.account(pldlib.Gaussian(1.0), steps=3).gdp_mu(np.float64(0.7)),
     "alpha_min: must lie in (0, 0.5), got 0.7"),
    (lambda: pldlib.make_accountant("rdp").compose(pldlib.Laplace(np.float64(2.0)), 3),
     "rdp: only the Gaussian mechanism is supported"),
    (lambda: GaussianExact(np.float64(np.inf)), "mu must be positive and finite, got inf"),
    (lambda: calibrate_attack(steps=10, tpr_at_fpr=(np.float64(0.1), np.float64(0.2))),
     "got (0.1, 0.2)"),
])
def test_library_messages_have_no_numpy_repr(call, text):
    with pytest.raises(Exception) as info:
        call()
    msg = str(info.value)
    assert text in msg and "np.float64" not in msg and "rdp: rdp:" not in msg


# -- unexpected exceptions: one line and a --debug hint ---------------------------------------------
class _Broken:
    """An accountant whose query fails the way a bug does: numpy's own ValueError."""

    interval = None

    def compose(self, *a):
        return self

    def epsilon(self, x):
        return np.zeros(-1)  # ValueError raised inside numpy: raw text, not for users


def test_unexpected_exception_is_one_line_with_debug_hint(capsys, monkeypatch):
    monkeypatch.setattr(cli, "make_method_accountant", lambda *a: _Broken())
    argv = ["epsilon", "--mechanism", "gaussian", "--sigma", "1", "--steps", "10", "--delta", "1e-5"]
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("pldlib: error: internal error: ValueError at tests/test_cli_notes.py:")
    assert "--debug" in err and "negative dimensions" not in err  # no raw numpy text
    with pytest.raises(ValueError):
        cli.main(["--debug", *argv])
    with pytest.raises(ValueError):
        cli.main([*argv, "--debug"])


def test_bare_overflow_is_a_limit_without_raw_text(capsys, monkeypatch):
    class Overflowing(_Broken):
        def epsilon(self, x):
            return math.exp(1e6)  # OverflowError('math range error') from a built-in

    monkeypatch.setattr(cli, "make_method_accountant", lambda *a: Overflowing())
    code = cli.main(["epsilon", "--mechanism", "gaussian", "--sigma", "1", "--steps", "10", "--delta", "1e-5"])
    out, err = capsys.readouterr()
    assert code == 3 and out == "" and err.count("\n") == 1
    assert "overflowed double precision" in err and "math range error" not in err
