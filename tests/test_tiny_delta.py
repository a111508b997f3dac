"""Certified answers at tiny delta (1e-8 ... 1e-15) for DP-SGD shapes.

Truth: pldlib.truth, the contour integral of docs/MATH.md section 6 evaluated with
mpmath (independent of the discretisation and of the FFT).
"""
from __future__ import annotations

import functools

import pytest

import pldlib
from pldlib.testing import truth
from pldlib.methods.prv import account_prv

SHAPES = [(1.0, 0.01, 10_000), (1.5, 0.004, 20_000), (0.7, 0.05, 2_000), (2.0, 0.1, 1_000)]
# the two ends of the range (each truth costs seconds; a delta in between, 1e-12, went through the
# same calls and cost a third of the module's time)
DELTAS = [1e-8, 1e-15]


@functools.lru_cache(maxsize=None)
def _truth(sigma, q, steps, delta):
    # (20 digits: eps to 1e-10, the same floats as at the default 30, and a fifth less work; the
    # certified intervals' ends lie >= 1e-3 from it)
    return float(truth.epsilon_gaussian(delta, sigma, steps, q=q, direction="add_remove", dps=20))


@pytest.mark.parametrize("sigma,q,steps", SHAPES)
def test_pld_brackets_truth_at_tiny_delta(sigma, q, steps):
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma, q=q, sampling="poisson"), steps=steps)
    iv = acc.epsilon(DELTAS)
    for d, lo, up in zip(DELTAS, iv.lower, iv.upper):
        t = _truth(sigma, q, steps, d)
        assert lo <= t <= up, (d, lo, t, up)
        assert (up - lo) / t < 0.01


@pytest.mark.parametrize("sigma,q,steps", SHAPES[:1])
def test_prv_brackets_truth_at_tiny_delta(sigma, q, steps):
    acc = account_prv(pldlib.Gaussian(sigma=sigma, q=q, sampling="poisson"), steps=steps,
                      eps_error=0.02, delta_error=1e-18)
    for d in DELTAS:
        r = acc.epsilon(d)
        t = _truth(sigma, q, steps, d)
        assert r.lower <= t <= r.upper, (d, r, t)
