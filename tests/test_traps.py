"""The silent traps a new user hits (issue 18): each is now a clear error, a required
argument, or a warning that names the problem."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import pldlib
from pldlib.methods import method_info
from pldlib.cli import main

SGD = pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson")


def _cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# -- steps is required where a user could forget it ------------------------------------------------
@pytest.mark.parametrize("fn", [pldlib.account, pldlib.account_prv, pldlib.account_spa, pldlib.account_rdp,
                                pldlib.account_clt])
def test_account_of_one_mechanism_needs_steps(fn):
    mech = pldlib.Gaussian(sigma=1.0)
    with pytest.raises(TypeError, match=r"steps: required .* pass steps=1 for a single release"):
        fn(SGD)
    assert fn(mech, 1) is not None and fn(mech, steps=1) is not None  # explicit: accepted
    # a list of (mechanism, steps) pairs carries its counts
    assert fn([(mech, 2), (pldlib.Gaussian(sigma=2.0), 3)]) is not None


def test_calibrate_needs_steps():
    with pytest.raises(TypeError, match=r"steps: required"):
        pldlib.calibrate(epsilon=6, delta=1e-5, q=0.01)
    with pytest.raises(TypeError, match=r"steps: required"):
        pldlib.calibrate(6.0, 1e-5, 0.01)


# -- no bare OverflowError for huge epsilon targets ---------------------------------------------------
def test_calibrate_huge_epsilon_is_a_clear_error(capsys):
    for eps in (1e6, 1e3, 201.0):
        with pytest.raises(ValueError, match=r"^epsilon: must be <= 200 for calibration, got"):
            pldlib.calibrate(eps, 1e-5, 0.01, 100)
    code, out, err = _cli(capsys, "calibrate", "--epsilon", "1e6", "--delta", "1e-5", "--q", "0.01",
                          "--steps", "100", "--no-table")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("pldlib: error: argument --epsilon: must be <= 200")
    assert "OverflowError" not in err


def test_gdp_seed_does_not_overflow_for_large_epsilon():
    # e^eps overflowed in the Gaussian-DP seed for eps > 709; the seed is now computed in log space
    from pldlib.calibrate import _gdp_sigma

    s = _gdp_sigma(1e6, 1e-5, 0.01, 100)
    assert math.isfinite(s) and s > 0
    assert _gdp_sigma(150.0, 1e-5, 1.0, 1) < _gdp_sigma(50.0, 1e-5, 1.0, 1)


def test_calibrate_at_epsilon_150_is_certified():
    # a large target near the cap still answers, certified (one unsampled step: fast)
    r = pldlib.calibrate(150.0, 1e-5, 1.0, 1, table=None, tol=1e-2, certify_lower=False)
    check = pldlib.account(pldlib.Gaussian(sigma=r.sigma), steps=1, spacing=r.spacing).epsilon(1e-5)
    assert check.upper <= 150.0
    # and the closed form of one Gaussian step agrees (Balle and Wang 2018): delta(150) <= 1e-5
    from scipy.special import log_ndtr

    mu = 1.0 / r.sigma
    d = math.exp(log_ndtr(-150 / mu + mu / 2)) - math.exp(150 + log_ndtr(-150 / mu - mu / 2))
    assert d <= 1e-5


# -- options that are ignored or make no sense ---------------------------------------------------------
def test_eps_error_with_pld_is_a_usage_error(capsys):
    code, out, err = _cli(capsys, "epsilon", "--mechanism", "gaussian", "--sigma", "1", "--steps", "10",
                          "--delta", "1e-5", "--method", "pld", "--eps-error", "0.1")
    assert code == 2 and out == ""
    assert err == ("pldlib: error: argument --eps-error: applies to --method prv / prv_accountant only, "
                   "not to --method pld\n")


@pytest.mark.parametrize("tol", ["5", "0.5", "1e-12"])
def test_tolerance_outside_its_range_is_refused(capsys, tol):
    code, out, err = _cli(capsys, "calibrate", "--epsilon", "1", "--delta", "1e-5", "--q", "0.01",
                          "--steps", "100", "--tol", tol, "--no-table")
    assert code == 2 and out == ""
    assert err.startswith("pldlib: error: argument --tol: must be in [1e-08, 0.1]") and err.count("\n") == 1
    with pytest.raises(ValueError, match=r"^tol: must be in \[1e-08, 0.1\]"):
        pldlib.calibrate(1.0, 1e-5, 0.01, 100, tol=float(tol))


def test_meaningless_interval_is_refused(capsys):
    # a subsampled Gaussian (the unsampled one is answered in closed form, where no grid is used)
    code, out, err = _cli(capsys, "epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.5",
                          "--steps", "10", "--delta", "1e-5", "--interval", "100")
    assert code == 2 and out == ""
    assert err.startswith("pldlib: error: spacing: 100.0 is wider than half the whole single-step "
                          "privacy-loss range")
    assert "meaningless" in err and err.count("\n") == 1
    with pytest.raises(ValueError, match=r"^spacing: 100.0 is wider"):
        pldlib.account(pldlib.Gaussian(sigma=1.0, q=0.5, sampling="poisson"), steps=10, spacing=100.0).epsilon(1e-5)
    # Laplace (loss range [-1, 1]): h = 2 keeps one cell; h = 0.5 is coarse but still informative
    with pytest.raises(ValueError, match="spacing"):
        pldlib.account(pldlib.Laplace(scale=1.0), steps=10, spacing=2.0).epsilon(1e-5)
    iv = pldlib.account(pldlib.Laplace(scale=1.0), steps=10, spacing=0.5).epsilon(1e-5)
    assert 9.98 < iv.lower <= iv.upper < 10.0


def test_too_coarse_interval_warns_on_the_command_line(capsys):
    code, out, err = _cli(capsys, "epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.01",
                          "--steps", "1000", "--delta", "1e-5", "--spacing", "0.1", "--json")
    assert code == 0 and out.count("\n") == 1
    assert err.startswith("pldlib: warning: --spacing 0.1 is too coarse here: at delta 1e-05")
    code, out, err = _cli(capsys, "epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.01",
                          "--steps", "1000", "--delta", "1e-5", "--spacing", "0.002")
    assert code == 0 and err == ""


# -- reprs and error messages a user reads ---------------------------------------------------------------
def _accountants():
    ev = pldlib.Sampled(pldlib.GaussianEvent(np.float64(1.0)), np.float64(0.01))
    names = [n for n in pldlib.method_names() if str(method_info(n).target).startswith("pldlib.")]
    out = [pldlib.make_accountant(n) for n in names]
    out += [pldlib.make_accountant(n, "remove" if n == "prv_accountant" else "add_remove").compose(ev, np.int64(10))
            for n in names]
    return out


def test_every_accountant_and_result_has_a_readable_repr():
    from pldlib.interop.opacus import OpacusAccountant

    objs = _accountants() + [OpacusAccountant()]
    for a in objs[len(objs) // 2:-1]:
        objs.append(a.epsilon(1e-5))
        objs.append(a.epsilon([1e-5, 1e-6]))
    objs.append(pldlib.calibrate(2.0, 1e-5, 0.01, 10, table=None, tol=1e-2))
    objs += [pldlib.Gaussian(np.float64(1.0), q=np.float64(0.5), sampling="poisson"),
             pldlib.GaussianEvent(np.float64(2.0)), pldlib.GaussianProfile(np.float64(1.0))]
    for o in objs:
        r = repr(o)
        assert " at 0x" not in r, r                     # not the default object repr
        assert "np.float64" not in r and "np.int64" not in r, r
        assert len(r) < 700, r                          # no 1023-entry arrays or 20-entry histories
    assert "orders=<1023 values 2.0..1024.0>" in repr(pldlib.make_accountant("rdp"))
    assert "history" not in repr(objs[-4])              # the CalibrationResult


@pytest.mark.parametrize("call,words", [
    (lambda: pldlib.account(pldlib.Gaussian(1.0), steps=3).epsilon([np.float64(1.5)]),
     "delta must be in (0, 1), got 1.5"),
    (lambda: pldlib.account(pldlib.Gaussian(1.0), steps=3).delta(np.array([np.nan])),
     "epsilon must be finite, got nan"),
    (lambda: pldlib.FiniteProfile([0.0, 1.0], [np.float64(0.5), np.float64(0.6)]),
     "P-masses must sum to 1 (with p_inf), got 1.1"),
    (lambda: pldlib.make_accountant("spa", t_range=(np.float64(1.0), np.float64(0.5))),
     "t_range must satisfy 0 < lo < hi < inf, got (1.0, 0.5)"),
    (lambda: pldlib.make_accountant("prv", max_bins=np.float64(2.0)), "max_bins must be an integer >= 16, got 2.0"),
    (lambda: pldlib.make_accountant("rdp", orders=[np.float64(0.5)]),
     "orders must be a list of integers >= 2 (Renyi orders), got 0.5"),
    (lambda: pldlib.Gaussian(np.float64(-1.5)), "sigma must be > 0, got -1.5"),
    (lambda: pldlib.calibrate(np.float64(1.0), np.float64(1.5), 0.1, 10), "delta must be in (0, 1), got 1.5"),
])
def test_error_messages_print_numbers_not_numpy_reprs(call, words):
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    msg = str(info.value)
    assert words in msg, msg
    assert not re.search(r"np\.(float|int)\d+\(", msg), msg
