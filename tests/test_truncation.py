"""A query's fine PLDs are built only over the range its composition keeps (docs/MATH.md 4.3).

The composition of a query at delta cuts single-step tails of mass below CUT_REL * cut_scale /
steps anyway; the accountant therefore discretises each step on the grid points between where
its tails fall to a quarter of that (the same lattice points), connect-the-dots putting the mass
outside on the pessimistic side and the hull ending there.  These tests check that the
truncated PLDs are on the right side of the whole-range ones (pointwise, as curves), that the
answers match the whole-range answers and bracket the mpmath truth, and that a smaller delta
builds a deeper range.
"""
import numpy as np
import pytest

import pldlib
import pldlib.methods.pld_grid as pld_grid
from pldlib.pld.grid import GridMeasure
from pldlib.testing.truth import epsilon_gaussian


def _branch(acc, label):
    return next(st for st in acc._branches if st.label == label)


@pytest.mark.parametrize("relation", ["remove", "add"])
def test_truncated_plds_are_on_their_side_of_the_whole_ones(relation):
    sigma, q, steps, h = 1.2, 7e-4, 19044, 1e-4
    mech = pldlib.Gaussian(sigma, q=q, sampling="poisson", relation=relation)
    acc = pldlib.account(mech, steps=steps, spacing=h)
    acc.epsilon(3.7e-5)
    src = acc._branches[0].source
    (t, (ups, lows)), = src._levels.items()
    full_up, full_lo = src.fine()  # the whole range, built now
    up, lo, fu, fl = ups[0], lows[0], full_up[0], full_lo[0]
    assert up.masses.size < fu.masses.size / 4  # most of the range was never evaluated
    assert t > 1e6 * src.tail
    eps = np.concatenate([np.linspace(-6, 4, 1001), fu.eps_grid[::97]])
    true = acc._branches[0].source.pairs[0][0].delta(eps)  # the step's own curve

    def side(p, sign):  # the measure a composition uses: masses +- their round-off bounds
        return GridMeasure(p.h, p.start, np.maximum(p.masses + sign * p.mass_err, 0.0), p.p_inf, p.shift)

    # pessimistic: never below the true curve; optimistic: never above it (also left of the grid)
    assert np.all(side(up, +1).delta(eps) >= true * (1 - 1e-12))
    assert np.all(side(lo, -1).delta(eps) <= true)
    # the upper curve differs from the whole-range one only by the truncated mass (at most t per
    # side; curve round-off ~1e-15)
    assert np.max(np.abs(up.delta(eps) - fu.delta(eps))) <= 2 * t + 1e-13
    # fewer points, smaller round-off allowance: the lower side loses nothing right of its start
    assert lo.mass_err.sum() <= fl.mass_err.sum()
    right = eps >= lo.eps_grid[0]
    assert np.all(side(lo, -1).delta(eps)[right] >= side(fl, -1).delta(eps)[right] - 2 * t - 1e-13)


def _whole(monkeypatch, *args, **kw):
    """An accountant that never truncates (the reference)."""
    import pldlib.methods.pld as A

    with monkeypatch.context() as m:
        m.setattr(pld_grid, "TRUNCATE_FROM", 10**12)
        acc = pldlib.account(*args, **kw)
        for st in acc._branches:
            st.source.fine()
    return acc


def test_answers_match_the_whole_range_and_bracket_the_truth(monkeypatch):
    sigma, q, steps, delta = 1.2, 7e-4, 19044, 3.7e-5
    truth = float(epsilon_gaussian(delta, sigma, steps, q=q, direction="remove"))
    mech = pldlib.Gaussian(sigma, q=q, sampling="poisson", relation="remove")
    acc = pldlib.account(mech, steps=steps, spacing=1e-4)
    got = acc.epsilon(delta)
    assert acc._branches[0].source._levels
    import pldlib.methods.pld as A

    whole = _whole(monkeypatch, mech, steps=steps, spacing=1e-4)
    with monkeypatch.context() as m:
        m.setattr(pld_grid, "TRUNCATE_FROM", 10**12)
        ref = whole.epsilon(delta)
    assert not whole._branches[0].source._levels
    assert got.lower <= truth <= got.upper
    # (the truncated tails move each curve by at most 5e-7 delta_s: ~1e-7 of eps here)
    assert got.upper == pytest.approx(ref.upper, rel=1e-7)
    assert got.lower == pytest.approx(ref.lower, rel=1e-7)


@pytest.mark.parametrize("relation", ["add_remove"])
def test_smaller_delta_builds_a_deeper_range(relation, monkeypatch):
    mech = pldlib.Gaussian(1.2, q=7e-4, sampling="poisson", relation=relation)
    acc = pldlib.account(mech, steps=19044, spacing=1e-4)
    a = acc.epsilon(1e-5)
    b = acc.epsilon(1e-12)
    for st in acc._branches:
        src = st.source
        levels = sorted(src._levels)
        assert len(levels) == 2 and levels[0] < 1e-6 * levels[1]
        sizes = [src._levels[t][0][0].masses.size for t in levels]
        assert sizes[0] > sizes[1]  # deeper tail, more points
    assert b.lower > a.upper
    # the same answers as from the whole range (both directions, both sides)
    import pldlib.methods.pld as A

    whole = _whole(monkeypatch, mech, steps=19044, spacing=1e-4)
    with monkeypatch.context() as m:
        m.setattr(pld_grid, "TRUNCATE_FROM", 10**12)
        ref = whole.epsilon(np.array([1e-5, 1e-12]))
    # an answer does not depend on what earlier queries built (the whole range, by a delta(eps) read)
    fresh = pldlib.account(mech, steps=19044, spacing=1e-4)
    fresh.delta(np.array([0.3]))
    assert any(st.source._fine is not None for st in fresh._branches)
    for d, want in [(1e-5, a), (1e-12, b)]:  # (one delta per query, as above: a batch's cut is its smallest's)
        assert fresh.epsilon(d) == want
    np.testing.assert_allclose([a.lower, b.lower], ref.lower, rtol=1e-7)
    np.testing.assert_allclose([a.upper, b.upper], ref.upper, rtol=1e-7)


def test_coarse_screen_plds_are_truncated_too_and_stay_upper_bounds():
    mech = pldlib.Gaussian(1.2, q=7e-4, sampling="poisson", relation="add_remove")
    acc = pldlib.account(mech, steps=19044, spacing=1e-4)
    deltas = np.array([1e-5])
    got = acc.epsilon(deltas)
    for st in acc._branches:
        t = st.source.level_for(1e-5, st.counts)
        assert t is not None
        short, whole = st.coarse_at(1e-5)[0], st.source.coarse()[0]
        assert short.masses.size < whole.masses.size / 2
        # the coarse bound (truncated) still bounds this branch's certified lower bound from above
        assert acc._coarse_upper(st, deltas, "eps")[0] >= acc._branch_epsilon(st, deltas)[0][0]
    assert got.lower <= got.upper
