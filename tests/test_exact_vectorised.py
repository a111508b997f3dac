"""The exact Gaussian profile's inversion over many deltas at once takes, for every delta, the
same bracket and the same bisection steps as the one-delta path (so the same certified ends),
and both ends bracket the mpmath truth."""
import math

import mpmath as mp
import numpy as np
import pytest

from pldlib.exact import GaussianExact


@pytest.mark.parametrize("mu", [1e-3, 0.05, 0.7, 1.0, 3.3, 40.0, 250.0])
def test_many_deltas_equal_one_at_a_time(mu):
    rng = np.random.default_rng(int(mu * 1000))
    deltas = np.concatenate([np.geomspace(1e-300, 0.999, 40), rng.uniform(0, 1, 15)])
    g = GaussianExact(mu)
    lo, hi = g.epsilon_bounds(deltas)
    for i, d in enumerate(deltas):
        l1, h1 = g._eps_one(float(d))
        assert lo[i] == l1 and hi[i] == h1, (mu, d)
    lo2, hi2 = g.epsilon_bounds(deltas.reshape(5, 11))  # shape kept
    assert np.array_equal(lo2.ravel(), lo) and np.array_equal(hi2.ravel(), hi)


def _delta_mp(mu, eps):
    mp.mp.dps = 50
    mu, eps = mp.mpf(mu), mp.mpf(eps)
    return mp.ncdf(-eps / mu + mu / 2) - mp.e ** eps * mp.ncdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("mu", [0.3, 2.0, 12.0])
def test_vectorised_ends_bracket_mpmath(mu):
    deltas = np.geomspace(1e-12, 1e-3, 10)
    lo, hi = GaussianExact(mu).epsilon_bounds(deltas)
    for d, l, h in zip(deltas, lo, hi):
        # delta(eps) decreases in eps: delta(upper) <= d <= delta(lower)
        assert _delta_mp(mu, h) <= d <= _delta_mp(mu, l)
        assert h - l <= 1e-9 * max(1.0, abs(h))
        assert math.isfinite(h)


def test_pair_many_equals_one_at_a_time():
    from pldlib.exact import gaussian_exact

    pair = gaussian_exact(1.7, 1.0, 3)
    deltas = np.geomspace(1e-15, 0.5, 23)
    lo, hi = pair.epsilon_bounds(deltas)
    for i, d in enumerate(deltas):
        l1, h1 = pair.epsilon_bounds(np.array([d]))
        assert lo[i] == l1[0] and hi[i] == h1[0]
