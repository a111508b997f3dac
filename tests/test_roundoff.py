"""The round-off allowance of a composed upper curve (docs/MATH.md 4.4) against worst-case errors.

``upper_masses`` is given the computed tilted output y_hat = y + e of an exact output y >= 0 and
only the promise ||e||_2 <= E.  For a fixed eps the error of the untilted curve is
sum_j e_j u_j g_j(eps) (g_j = (1 - e^{eps - eps_j})_+), which is largest, over all e of 2-norm
E, at e = -E w / ||w||_2 with w = u * g(eps) (Cauchy-Schwarz equality).  The tests build exactly
that adversarial error for many eps and check that the upper curve still dominates the exact
curve there; the exact curve is summed with math.fsum.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from pldlib.pld.compose import _RO_BLOCK_MIN, _U, UntiltBlocks, _roundoff_block, untilt_factor, upper_masses
from pldlib.pld.grid import GridMeasure


def exact_curve(y, u, eps_grid, eps):
    g = np.maximum(1.0 - np.exp(eps - eps_grid), 0.0)
    return math.fsum(y * u * g)


CASES = [  # (theta, h, N, E)
    (0.0, 1e-3, 5000, 1e-12),
    (5.0, 1e-4, 40000, 1e-13),
    (30.0, 2e-5, 60000, 3e-14),
    (200.0, 1e-5, 20000, 1e-12),
    (0.7, 1e-2, 3000, 1e-10),
]


@pytest.mark.parametrize("lattice", [False, True, "factored"])
@pytest.mark.parametrize("theta,h,N,E", CASES)
def test_block_allowance_dominates_worst_case_error(theta, h, N, E, lattice):
    rng = np.random.default_rng(int(theta * 1000 + N))
    start = -N // 3
    eps_grid = (start + np.arange(N)) * h
    log_total = 2.0 + theta * float(eps_grid[N // 2])  # untilted masses of order e^2 at the centre
    u = (untilt_factor(log_total, theta, None, 1, "up", start=start, h=h, n=N) if lattice
         else untilt_factor(log_total, theta, eps_grid, 1, "up"))
    # ("factored": the product form handed to upper_masses as is, never written out)
    factors = untilt_factor(log_total, theta, None, 1, "up", start=start, h=h, n=N, factored=True)
    if lattice == "factored" and not isinstance(factors, UntiltBlocks):
        pytest.skip("the product form does not apply here (an overflowing factor)")
    # an exact tilted output: a bump plus a floor of E (so y - e can stay >= 0)
    y = np.exp(-0.5 * ((np.arange(N) - N / 2) / (N / 10)) ** 2) / N + E * rng.uniform(0, 1, N)
    # true untilted masses are probabilities: keep them <= 1/2 (where u overflows, y is 0)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.where(y * u > 0.5, 0.5 / u, y)
    B = _roundoff_block(theta, h, N)
    for eps in np.concatenate([eps_grid[rng.integers(0, N, 12)], eps_grid[[0, N // 2, N - 2]] + h / 3]):
        g = np.maximum(1.0 - np.exp(eps - eps_grid), 0.0)
        w = u * g
        nw = math.sqrt(math.fsum(w * w))
        if nw == 0.0:
            continue
        e = -E * w / nw  # the worst error of 2-norm E at this eps
        masses, ro = upper_masses(y + e, E, factors if lattice == "factored" else u, theta, h)
        # (made in y's own array: the same numbers)
        y_own = y + e
        m_own, ro_own = upper_masses(y_own, E, factors if lattice == "factored" else u, theta, h, overwrite_y=True)
        assert np.array_equal(m_own, masses) and np.array_equal(ro_own, ro)
        up = GridMeasure(h, start, masses, 0.0).delta(np.array([eps]))[0]
        truth = exact_curve(y, u, eps_grid, eps)
        assert truth <= up * (1 + 1e-12), (theta, eps, truth, up)
        # and the allowance is no looser than the entrywise one (it is the smaller of the two
        # per block, up to the block-end shift) on the bulk of the curve
        ent = GridMeasure(h, start, E * u, 0.0).delta(np.array([eps]))[0]
        ro_curve = GridMeasure(h, start, ro, 0.0).delta(np.array([eps]))[0]
        if B >= _RO_BLOCK_MIN and eps < eps_grid[N // 2]:
            assert ro_curve <= ent


def test_block_allowance_is_much_smaller_than_entrywise_for_flat_untilting():
    """theta = 0: the untilting factor is flat, blocks of 2^14 points gain ~sqrt(2^14) / 2."""
    N, h, E = 200_000, 1e-4, 1e-13
    eps_grid = np.arange(N) * h
    u = untilt_factor(0.0, 0.0, eps_grid, 1, "up")
    masses, ro = upper_masses(np.full(N, 1.0 / N), E, u, 0.0, h)
    ent = GridMeasure(h, 0, E * u, 0.0).delta(np.array([0.0]))[0]
    blk = GridMeasure(h, 0, ro, 0.0).delta(np.array([0.0]))[0]
    assert blk <= ent / 30


def test_overflowing_untilting_keeps_the_capped_entrywise_form():
    N, h, theta = 4096, 1e-4, 1.0
    eps_grid = (np.arange(N) - N) * h * 1e4  # untilt e^{-theta eps} overflows on the left
    u = untilt_factor(0.0, theta, eps_grid, 1, "up")
    assert not np.all(np.isfinite(u))
    masses, ro = upper_masses(np.full(N, 1e-3), 1e-14, u, theta, h)
    assert np.all(np.isfinite(masses)) and np.all(masses <= 1.0) and np.all(ro <= 1.0)


def test_untilt_factor_rounds_outward():
    eps_grid = np.linspace(-3.0, 5.0, 101)
    up = untilt_factor(1.5, 40.0, eps_grid, 2, "up")
    lo = untilt_factor(1.5, 40.0, eps_grid, 2, "lo")
    import mpmath as mp
    mp.mp.dps = 40
    for e, a, b in zip(eps_grid, up, lo):
        t = mp.e ** (mp.mpf(1.5) - 40 * mp.mpf(float(e)))
        assert b <= t <= a


@pytest.mark.parametrize("log_total,theta,start,h,n", [
    (1.5, 40.0, -30000, 1e-4, 80000), (-30.0, 3.0, 1000, 1e-3, 5000), (20.0, 0.01, -10**6, 1e-5, 4096),
    (0.0, 150.0, 0, 1e-3, 30000),
])
def test_untilt_factor_on_a_lattice_rounds_outward(log_total, theta, start, h, n):
    """The product form e^{log_total - theta eps_b} e^{-theta h i} (blocks of 256) against 40-digit
    exponentials at 300 random points, the block edges among them: "up" is never below, "lo"
    never above."""
    import mpmath as mp

    up = untilt_factor(log_total, theta, None, 1, "up", start=start, h=h, n=n)
    lo = untilt_factor(log_total, theta, None, 1, "lo", start=start, h=h, n=n)
    assert up.size == lo.size == n
    # the product form itself: written out, the same numbers; applied to masses x (two roundings
    # per product), x u_up is never below x times the truth and x u_lo never above
    fu = untilt_factor(log_total, theta, None, 1, "up", start=start, h=h, n=n, factored=True)
    fl = untilt_factor(log_total, theta, None, 1, "lo", start=start, h=h, n=n, factored=True)
    rng = np.random.default_rng(n)
    x = rng.uniform(0.5, 2.0, n) * 2.0 ** rng.integers(-30, 30, n)
    if isinstance(fu, UntiltBlocks):
        assert np.array_equal(fu.array(), up) and np.array_equal(fl.array(), lo)
        xu, xl = fu.scale(x.copy()), fl.scale(x.copy())
    idx = np.concatenate([rng.integers(0, n, 300), [0, 255, 256, 257, n - 1]])
    mp.mp.dps = 40
    for j in idx:
        t = mp.e ** (mp.mpf(log_total) - mp.mpf(theta) * (mp.mpf(start + int(j)) * mp.mpf(h)))
        if t > mp.mpf("1e300") or t < mp.mpf("1e-300"):
            continue
        assert lo[j] <= t <= up[j], (j, float(t), lo[j], up[j])
        if isinstance(fu, UntiltBlocks) and mp.mpf("1e-290") < t * mp.mpf(float(x[j])) < mp.mpf("1e290"):
            assert xl[j] <= mp.mpf(float(x[j])) * t <= xu[j], (j, float(t), x[j], xl[j], xu[j])


@pytest.mark.parametrize("n", [256 * 40, 256 * 40 + 77, 5000, 3 * 2**14 + 1])
@pytest.mark.parametrize("g", [8, 64, 256, 2048, 2**14])
@pytest.mark.parametrize("theta", [0.0, 2.5, -1.0])
def test_untilt_blocks_statistics_match_the_written_out_factor(n, g, theta):
    """UntiltBlocks.block_stats(g) against the written-out factor's blocks of g points: maxima
    equal; sums of squares (the block norms of the round-off allowance) within 1e-13, and with the
    allowance (1 + 4 u (g + 2)) on the norm never below the norm of the exact products a_b w_i times
    (1 + 2 u) (80-bit sums: what the two roundings of scale() can apply at most)."""
    h = 1e-4
    f = untilt_factor(3.0, theta, None, 1, "up", start=-n // 3, h=h, n=n, factored=True)
    assert isinstance(f, UntiltBlocks)
    u = f.array()
    nb = -(-n // g)
    ub = np.concatenate([u, np.zeros(nb * g - n)]).reshape(nb, g)
    mx, sm, sq = f.block_stats(g)
    assert mx.shape == sm.shape == sq.shape == (nb,)
    np.testing.assert_array_equal(mx, ub.max(axis=1))
    np.testing.assert_allclose(sm, ub.sum(axis=1), rtol=1e-13)
    np.testing.assert_allclose(sq, np.einsum("ij,ij->i", ub, ub), rtol=1e-13)
    j = np.arange(n)
    exact = np.asarray(f.a, dtype=np.longdouble)[j // f.w.size] * np.asarray(f.w, dtype=np.longdouble)[j % f.w.size]
    exact = exact * (1 + 2 * np.longdouble(_U))
    ex_b = np.concatenate([exact, np.zeros(nb * g - n, dtype=np.longdouble)]).reshape(nb, g)
    true_norm = np.sqrt(np.sum(ex_b * ex_b, axis=1))
    assert np.all(np.sqrt(np.asarray(sq, dtype=np.longdouble)) * (1 + 4 * np.longdouble(_U) * (g + 2)) >= true_norm)


def test_block_roundoff_reads_the_curve_of_its_written_out_masses():
    """A composition's round-off part in block form (BlockRoundoff: masses at the blocks' last
    points, never written out for a few reads) gives the curve of the same masses written out
    (GridMeasure.delta summed in full), writes them out on request, and survives pickling."""
    import pickle

    from pldlib.pld.compose import BlockRoundoff

    rng = np.random.default_rng(5)
    N, B, h, start, shift = 10_000, 512, 1e-3, -3000, 0.25
    last = np.minimum(np.arange(-(-N // B)) * B + B - 1, N - 1)
    r = rng.uniform(0, 1e-12, last.size)
    dense = np.zeros(N)
    dense[last] = r
    ref = GridMeasure(h, start, dense, 0.0, shift)
    bro = BlockRoundoff(h, start, N, last, r, shift)
    eps = np.concatenate([ref.eps_grid[rng.integers(0, N, 20)] + rng.uniform(-h, h, 20),
                          ref.eps_grid[last[[0, 3, -1]]], [ref.eps_grid[0] - 1.0, ref.eps_grid[-1] + 1.0]])
    got = bro.delta_at_few(eps)
    assert "masses" not in bro.__dict__  # (read without writing the masses out)
    want = ref.delta(eps)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-28)
    assert bro.start == ref.start and np.array_equal(bro.masses, dense)
    np.testing.assert_allclose(bro.delta_at_few(eps), want, rtol=1e-12, atol=1e-28)
    again = pickle.loads(pickle.dumps(BlockRoundoff(h, start, N, last, r, shift)))
    np.testing.assert_array_equal(again.delta_at_few(eps), got)
