"""Certified calibration of any monotone parameter (pldlib.calibration): steps, sampling rate,
Laplace scale and randomized-response eps0 against closed forms, sigma against the fast
Gaussian path, the command line's --for, and the errors."""
from __future__ import annotations

import json

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib.calibration import TargetUnreachableError, calibrate_parameter
from pldlib.cli import main

mp.mp.dps = 30


def gauss_delta(mu, eps):
    """delta(eps) of N(0,1) vs N(mu,1), 30 digits (eps(delta) <= eps iff delta(eps) <= delta)."""
    mu, eps = mp.mpf(mu), mp.mpf(eps)
    return mp.ncdf(mu / 2 - eps / mu) - mp.exp(eps) * mp.ncdf(-mu / 2 - eps / mu)


def test_steps_of_an_unsampled_gaussian_against_the_closed_form():
    sigma, eps, delta = 100.0, 1.0, 1e-5
    # the largest k with eps(delta) <= eps for mu = sqrt(k) / sigma, by the 30-digit closed form
    k = 1
    while gauss_delta(mp.sqrt(k + 1) / sigma, eps) <= delta:
        k += 1
    assert k > 100
    r = calibrate_parameter(lambda n: (E.GaussianEvent(sigma), n), (1, 10**6), direction="larger_is_less_private",
                            epsilon=eps, delta=delta, integer=True, parameter="steps")
    assert r.interval.upper <= eps and r.value <= k  # sound: never beyond the true optimum
    assert r.value == k  # the exact Gaussian path certifies the optimum itself
    assert r.beyond == k + 1 and r.beyond_certified and r.beyond_interval.lower > eps


@pytest.mark.parametrize("sigma,q,eps", [(1.0, 256 / 60_000, 3.0), (1.0, 256 / 60_000, 8.0), (0.8, 0.01, 8.0)])
def test_steps_of_dp_sgd_are_certified_at_the_answer_and_not_one_step_beyond(sigma, q, eps):
    mech = pldlib.Gaussian(sigma=sigma, q=q, sampling="poisson")
    r = calibrate_parameter(lambda n: (mech, n), (1, 10**9), direction="larger_is_less_private", epsilon=eps,
                            delta=1e-5, integer=True, parameter="steps")
    at = pldlib.account(mech, steps=r.value).epsilon(1e-5)
    beyond = pldlib.account(mech, steps=r.value + 1).epsilon(1e-5)
    assert at.upper <= eps < beyond.upper  # the accountant itself, at the answer and one step beyond
    assert beyond.lower <= eps * 1.01  # and the answer is within the accountant's accuracy of the optimum


def test_sampling_rate_is_certified_and_within_tolerance():
    r = calibrate_parameter(lambda x: pldlib.Gaussian(sigma=0.8, q=x, sampling="poisson"), (1e-9, 1.0),
                            direction="larger_is_less_private", epsilon=8.0, delta=1e-5, steps=10_000,
                            parameter="q", tol=1e-3)
    assert r.interval.upper <= 8.0
    assert r.beyond / r.value - 1 <= 1.001e-3 and r.beyond_interval.upper > 8.0
    acc = pldlib.account(pldlib.Gaussian(sigma=0.8, q=r.value, sampling="poisson"), steps=10_000)
    assert acc.epsilon(1e-5).upper <= 8.0


def test_laplace_scale_against_its_closed_form():
    """One Laplace step (sensitivity 1, scale b): delta(eps) = max(0, 1 - exp((eps - 1/b) / 2)),
    so the smallest b with delta(1) <= 1e-5 is b* = 1 / (1 - 2 ln(1 - 1e-5))."""
    eps, delta = 1.0, 1e-5
    b_star = 1.0 / (eps - 2.0 * np.log1p(-delta))
    r = calibrate_parameter(lambda b: pldlib.Laplace(scale=b), (0.01, 100.0), direction="larger_is_more_private",
                            epsilon=eps, delta=delta, parameter="scale", tol=1e-4)
    assert r.value >= b_star * (1 - 1e-12)  # sound: a smaller scale fails the target
    assert r.value <= b_star * 1.01


def test_randomized_response_eps0_against_its_closed_form():
    """One step of eps0-RR: delta(eps) = (e^eps0 - e^eps) / (1 + e^eps0) for eps < eps0."""
    eps, delta = 1.0, 1e-5
    star = float(mp.log((mp.e + delta) / (1 - delta)))  # (e^x - e) / (1 + e^x) = delta
    r = calibrate_parameter(lambda x: pldlib.RandomizedResponse(eps0=x), (0.01, 20.0),
                            direction="larger_is_less_private", epsilon=eps, delta=delta, parameter="eps0",
                            tol=1e-4)
    assert r.value <= star * (1 + 1e-12) and r.value >= star * (1 - 2e-4)


def test_generic_sigma_agrees_with_the_fast_gaussian_path():
    fast = pldlib.calibrate(epsilon=2.0, delta=1e-5, q=0.01, steps=1000)
    r = calibrate_parameter(lambda s: pldlib.Gaussian(sigma=s, q=0.01, sampling="poisson"), (0.3, 50.0),
                            direction="larger_is_more_private", epsilon=2.0, delta=1e-5, steps=1000,
                            parameter="sigma", tol=1e-3)
    assert r.interval.upper <= 2.0 and fast.epsilon.upper <= 2.0
    assert abs(r.value / fast.sigma - 1) < 5e-3


def test_errors_name_the_argument_and_the_target():
    mech = pldlib.Gaussian(sigma=0.3, q=0.5, sampling="poisson")
    with pytest.raises(TargetUnreachableError, match=r"eps\(delta=1e-05\) <= 0.1.*steps=1"):
        calibrate_parameter(lambda n: (mech, n), (1, 100), direction="larger_is_less_private", epsilon=0.1,
                            delta=1e-5, integer=True, parameter="steps")
    with pytest.raises(ValueError, match="direction"):
        calibrate_parameter(lambda n: (mech, n), (1, 100), direction="up", epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="bounds"):
        calibrate_parameter(lambda n: (mech, n), (10, 1), direction="larger_is_less_private", epsilon=1.0,
                            delta=1e-5, integer=True)
    r = calibrate_parameter(lambda n: (pldlib.Gaussian(sigma=50.0), n), (1, 10), direction="larger_is_less_private",
                            epsilon=1.0, delta=1e-5, integer=True)
    assert r.trivially_met and r.value == 10 and r.beyond is None


def test_cli_for_steps_and_q(capsys):
    assert main(["calibrate", "--for", "steps", "--sigma", "1.0", "--q", "0.01", "--epsilon", "3", "--delta", "1e-5",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    k = out["value"]
    mech = pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson")
    assert pldlib.account(mech, steps=k).epsilon(1e-5).upper <= 3 < pldlib.account(mech, steps=k + 1).epsilon(1e-5).upper
    assert main(["calibrate", "--for", "q", "--sigma", "0.8", "--steps", "10000", "--epsilon", "8", "--delta",
                 "1e-5"]) == 0
    text = capsys.readouterr().out
    assert "q = 0.0082" in text and "the largest value" in text
    for argv, msg in ((["--for", "steps", "--epsilon", "3", "--delta", "1e-5"], "argument --sigma: required"),
                      (["--for", "steps", "--sigma", "1", "--steps", "5", "--epsilon", "3", "--delta", "1e-5"],
                       "argument --steps: not allowed"),
                      (["--for", "q", "--sigma", "1", "--epsilon", "3", "--delta", "1e-5"],
                       "argument --steps: required with --for q"),
                      (["--sigma", "1", "--steps", "5", "--epsilon", "3", "--delta", "1e-5"],
                       "argument --sigma: not allowed")):
        assert main(["calibrate", *argv]) == 2
        assert msg in capsys.readouterr().err


def test_cli_for_a_mechanisms_noise_parameter(capsys):
    """--for scale (Laplace) and --for eps0 (randomized response), against their closed forms."""
    eps, delta = 1.0, 1e-5
    assert main(["calibrate", "--for", "scale", "--mechanism", "laplace", "--steps", "1", "--epsilon", "1",
                 "--delta", "1e-5", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["value"]
    b_star = 1.0 / (eps - 2.0 * np.log1p(-delta))
    assert b_star <= b <= b_star * 1.01
    assert main(["calibrate", "--for", "eps0", "--mechanism", "randomized_response", "--steps", "1", "--epsilon",
                 "1", "--delta", "1e-5", "--json"]) == 0
    e0 = json.loads(capsys.readouterr().out)["value"]
    star = float(mp.log((mp.e + delta) / (1 - delta)))
    assert star * (1 - 2e-3) <= e0 <= star
    for argv, msg in ((["--for", "scale", "--steps", "1"], "scale is the noise of --mechanism laplace"),
                      (["--for", "scale", "--mechanism", "laplace", "--scale", "2", "--steps", "1"],
                       "argument --scale: not allowed with --for scale"),
                      (["--for", "steps", "--mechanism", "laplace", "--sigma", "2"],
                       "argument --sigma: not allowed with --mechanism laplace")):
        assert main(["calibrate", *argv, "--epsilon", "1", "--delta", "1e-5"]) == 2
        assert msg in capsys.readouterr().err


@pytest.mark.parametrize("method", ["clt", "dp_accounting"])
def test_methods_that_certify_no_upper_bound_cannot_calibrate(method):
    with pytest.raises(ValueError, match="certifies no upper bound"):
        calibrate_parameter(lambda n: (E.GaussianEvent(5.0), n), (1, 100), direction="larger_is_less_private",
                            epsilon=1.0, delta=1e-5, integer=True, method=method)
