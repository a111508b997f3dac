"""Bad input to the Python API: every rejection is a ValueError or TypeError whose message
names the offending argument (the CLI has its own tests)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import pldlib
from pldlib.profiles.base import FiniteProfile, approx_dp_profile, randomized_response_profile

NAN, INF = float("nan"), float("inf")
BAD_POSITIVE = [-1, -1.0, 0, 0.0, NAN, INF, -INF, np.nan, np.float64(-2.0)]
BAD_TYPE = ["1", None, True, 1j, [1.0]]


def rejects(fn, name):
    """Call fn, expect ValueError/TypeError naming ``name``; return the exception."""
    with pytest.raises((ValueError, TypeError)) as info:
        fn()
    assert name in str(info.value), f"message does not name {name!r}: {info.value}"
    return info.value


# ----------------------------------------------------------------------------
# mechanisms
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("value", BAD_POSITIVE + BAD_TYPE, ids=repr)
def test_gaussian_sigma(value):
    rejects(lambda: pldlib.Gaussian(sigma=value), "sigma")


@pytest.mark.parametrize("value", BAD_POSITIVE + BAD_TYPE, ids=repr)
def test_laplace_scale(value):
    rejects(lambda: pldlib.Laplace(scale=value), "scale")


@pytest.mark.parametrize("value", BAD_POSITIVE + BAD_TYPE, ids=repr)
def test_sensitivity(value):
    rejects(lambda: pldlib.Gaussian(sigma=1.0, sensitivity=value), "sensitivity")
    rejects(lambda: pldlib.Laplace(scale=1.0, sensitivity=value), "sensitivity")


@pytest.mark.parametrize("value", BAD_POSITIVE + BAD_TYPE, ids=repr)
def test_randomized_response_eps0(value):
    rejects(lambda: pldlib.RandomizedResponse(eps0=value), "eps0")
    rejects(lambda: randomized_response_profile(value), "eps0")


@pytest.mark.parametrize("value", [-1, NAN, INF, "1", None, True], ids=repr)
def test_approx_dp_eps0(value):
    rejects(lambda: pldlib.ApproxDP(eps0=value, delta0=0.1), "eps0")


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5, NAN, INF, "0.1", None, 1j], ids=repr)
def test_approx_dp_delta0(value):
    rejects(lambda: pldlib.ApproxDP(eps0=1.0, delta0=value), "delta0")
    rejects(lambda: approx_dp_profile(1.0, value), "delta0")


@pytest.mark.parametrize("q", [0, 0.0, -0.2, 1.5, 1.0000001, NAN, INF, "0.5", True], ids=repr)
@pytest.mark.parametrize("sampling", ["poisson", "wor"])
def test_sampling_rate_outside_unit_interval(q, sampling):
    rejects(lambda: pldlib.Gaussian(sigma=1.0, q=q, sampling=sampling), "q")
    rejects(lambda: pldlib.Laplace(scale=1.0, q=q, sampling=sampling), "q")


def test_sampling_rate_below_one_needs_a_sampling_scheme():
    rejects(lambda: pldlib.Gaussian(sigma=1.0, q=0.5), "q")


@pytest.mark.parametrize("value", ["bogus", "Poisson", "", None, 3], ids=repr)
def test_unknown_sampling(value):
    rejects(lambda: pldlib.Gaussian(sigma=1.0, sampling=value), "sampling")


@pytest.mark.parametrize("value", ["bogus", "Add", "add-remove", "", None], ids=repr)
def test_unknown_relation(value):
    rejects(lambda: pldlib.Gaussian(sigma=1.0, relation=value), "relation")


def test_custom_needs_a_profile():
    rejects(lambda: pldlib.Custom(profile=None), "profile")
    rejects(lambda: pldlib.Custom(profile=3.0), "profile")


def test_finite_profile_rejects_invalid_pairs():
    with pytest.raises(ValueError):
        FiniteProfile([0.0, 1.0], [0.5, 0.6])  # P-masses do not sum to 1
    with pytest.raises(ValueError):
        FiniteProfile([-1.0, 1.0], [0.5, 0.5])  # Q-masses 0.5 e + 0.5/e > 1: no such pair
    with pytest.raises(ValueError):
        FiniteProfile([0.0, INF], [0.5, 0.5])
    with pytest.raises(ValueError):
        FiniteProfile([0.0, 1.0], [1.5, -0.5])


# ----------------------------------------------------------------------------
# account(...)
# ----------------------------------------------------------------------------
G = pldlib.Gaussian(sigma=1.0)


@pytest.mark.parametrize("steps", [0, 1.5, -3, True, False, NAN, INF, -INF, "3", 2.5, -1.0], ids=repr)
def test_steps(steps):
    rejects(lambda: pldlib.account(G, steps=steps), "steps")


def test_steps_inside_a_list():
    rejects(lambda: pldlib.account([(G, 0)]), "steps")
    rejects(lambda: pldlib.account([(G, 1.5)]), "steps")
    rejects(lambda: pldlib.account([(G, 2)], steps=3), "steps")


@pytest.mark.parametrize("value", [0, -0.1, NAN, INF, "0.1", True], ids=repr)
def test_interval(value):
    rejects(lambda: pldlib.account(G, steps=1, spacing=value), "spacing")


@pytest.mark.parametrize("value", [0, -1, "many"], ids=repr)
def test_max_bins(value):
    """A cap on the FFT length that no composition can meet is a bad argument, not a
    'grid too large' condition discovered later."""
    rejects(lambda: pldlib.account(G, steps=1, max_bins=value), "max_bins")


def test_mechanism_argument():
    rejects(lambda: pldlib.account(None, steps=1), "mechanism")
    rejects(lambda: pldlib.account("gaussian"), "mechanism")
    rejects(lambda: pldlib.account([]), "mechanism")
    rejects(lambda: pldlib.account([(G,)]), "mechanism")
    rejects(lambda: pldlib.account([(1.0, 2)]), "mechanism")


# ----------------------------------------------------------------------------
# queries
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def acc():
    return pldlib.account(G, steps=3)


@pytest.mark.parametrize("delta", [0, 0.0, 1, 1.0, -0.1, 1.5, NAN, INF, -INF], ids=repr)
def test_epsilon_delta_outside_open_unit_interval(acc, delta):
    rejects(lambda: acc.epsilon(delta), "delta")
    rejects(lambda: acc.epsilon([1e-5, delta]), "delta")


@pytest.mark.parametrize("delta", [[], "a", None, [[1e-5]], [1e-5, "x"]], ids=repr)
def test_epsilon_delta_not_numbers(acc, delta):
    rejects(lambda: acc.epsilon(delta), "delta")


@pytest.mark.parametrize("eps", [NAN, INF, -INF, [0.0, NAN]], ids=repr)
def test_delta_epsilon_not_finite(acc, eps):
    rejects(lambda: acc.delta(eps), "epsilon")


@pytest.mark.parametrize("eps", [[], "a", None, [[0.5]]], ids=repr)
def test_delta_epsilon_not_numbers(acc, eps):
    rejects(lambda: acc.delta(eps), "epsilon")


def test_valid_edge_values_are_accepted(acc):
    """The boundaries of the valid ranges still work (q = 1, a whole-number float step count)."""
    pldlib.Gaussian(sigma=1.0, q=1.0, sampling="poisson")
    iv = pldlib.account(G, steps=2.0).epsilon(1e-5)
    assert iv.lower <= iv.upper
    assert math.isfinite(acc.epsilon(1e-6).upper)
    assert 0 <= acc.delta(-50.0).lower <= acc.delta(-50.0).upper <= 1
