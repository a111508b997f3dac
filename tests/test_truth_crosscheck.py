"""pldlib.truth against independent references: the k-fold Gaussian closed form
(mpmath, 40 digits) and certified PLD intervals for a subsampled case."""
from __future__ import annotations

import mpmath as mp
import pytest

import pldlib
from pldlib.testing import truth


def _closed_form(eps, sigma, k):
    with mp.workdps(40):
        r = mp.sqrt(k) / sigma
        e = mp.mpf(eps)
        return mp.ncdf(-e / r + r / 2) - mp.exp(e) * mp.ncdf(-e / r - r / 2)


@pytest.mark.parametrize("sigma,k,eps", [(1.0, 1, 0.5), (2.0, 100, 3.0), (0.8, 1000, 80.0), (1.0, 10, 9.0)])
def test_truth_matches_gaussian_closed_form(sigma, k, eps):
    t = mp.mpf(truth.delta_gaussian(eps, sigma, k, q=1.0))
    ref = _closed_form(eps, sigma, k)
    assert abs(t - ref) <= 1e-10 * ref


def test_truth_inside_certified_pld_interval():
    acc = pldlib.account(pldlib.Gaussian(sigma=1.5, q=0.02, sampling="poisson", relation="remove"), steps=500)
    for eps in (0.5, 1.5):
        iv = acc.delta(eps)
        t = float(truth.delta_gaussian(eps, 1.5, 500, q=0.02, direction="remove"))
        assert iv.lower <= t <= iv.upper
