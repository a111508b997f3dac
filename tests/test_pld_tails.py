"""The discounted tail sums behind every eps(delta)/delta(eps) read-out, against exact
high-precision sums (mpmath, 50 digits)."""
import mpmath
import numpy as np
import pytest

from pldlib.pld.grid import GridMeasure, _discounted_tail_sums


def _exact(m, h):
    mpmath.mp.dps = 50
    out, acc = [], mpmath.mpf(0)
    r = mpmath.exp(-mpmath.mpf(h))
    for x in reversed([mpmath.mpf(float(v)) for v in m]):
        acc = x + r * acc
        out.append(acc)
    return np.array([float(v) for v in reversed(out)])


@pytest.mark.parametrize("n,h", [(1, 0.1), (17, 1e-4), (300, 0.05), (300, 0.3), (64, 3.0), (20, 40.0),
                                 (2000, 0.07)])
def test_discounted_tail_sums_match_exact_sums(n, h):
    rng = np.random.default_rng(n)
    m = rng.random(n) * np.exp(-rng.random(n) * 60)
    m[::5] = 0.0
    m[-1] = 1e-280  # a tiny last mass stays exact (no block boundary makes it underflow)
    got, want = _discounted_tail_sums(m, h), _exact(m, h)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    assert (got >= 0).all()


def test_several_blocks_carry_across_boundaries():
    # L h <= 30 forces ~10 blocks here; the exact recursion runs over all of them
    h, n = 0.5, 600
    m = np.exp(-np.linspace(0, 20, n))
    np.testing.assert_allclose(_discounted_tail_sums(m, h), _exact(m, h), rtol=1e-13)


@pytest.mark.parametrize("n,h", [(3000, 16.0), (2000, 40.0), (20000, 0.5), (1500, 250.0)])
def test_many_blocks_use_the_doubling_scan_and_match_exact_sums(n, h):
    """Coarse grids have one block per ~30/h points: beyond 256 blocks their carries are a
    vectorised doubling scan (a Python loop over a million blocks took a minute); checked
    against the 50-digit recursion, with masses spanning 120 orders of magnitude."""
    from pldlib.pld import grid as G

    rng = np.random.default_rng(int(h * 10) + n)
    m = rng.random(n) * np.exp(-rng.random(n) * 280)
    m[::7] = 0.0
    assert -(-n // max(1, min(n, int(30.0 / h)))) > G._SCAN_FROM
    got, want = _discounted_tail_sums(m, h), _exact(m, h)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    assert (got >= 0).all()


def test_grid_measure_curve_matches_its_definition():
    # curve(eps) = const + sum_i m_i (1 - e^{eps - eps_i})_+ , checked in mpmath at off-grid eps
    rng = np.random.default_rng(3)
    m = rng.random(50) * 1e-3
    g = GridMeasure(0.02, -10, m, 1e-9)
    mpmath.mp.dps = 40
    for eps in (-0.3, -0.011, 0.0, 0.2345, 0.7):
        want = mpmath.mpf(1e-9) + sum(mpmath.mpf(float(mi)) * max(mpmath.mpf(0), 1 - mpmath.exp(
            mpmath.mpf(eps) - mpmath.mpf((-10 + i) * 0.02))) for i, mi in enumerate(m))
        assert float(g.delta(eps)) == pytest.approx(float(want), rel=1e-12)
