"""add_remove answers skip a direction only when a certified coarse bound shows it cannot matter.

The accountant answers max(add, remove).  It computes the direction with the larger
coarse bound at full accuracy first and the other only at queries where that
direction's coarse *upper* bound exceeds the lower bound found so far.  These tests
check (i) that the skip happens where it should (DP-SGD: the add direction lies far
below), (ii) that the answer then agrees with computing both directions in full, and
(iii) where the directions cross (subsampled Laplace, docs/MATH.md section 2), that both
are used and each direction's own certified bounds are respected.
"""
import numpy as np
import pytest

import pldlib
import pldlib.methods.pld_grid as pld_grid
from pldlib.methods.pld_grid import COARSE_FACTOR


def _full(acc):
    """Force the full computation: build every direction's PLDs (no coarse test then)."""
    for st in acc._branches:
        st.source.fine()
    return acc


def _label(acc, name):
    return next(st for st in acc._branches if st.label == name)


@pytest.mark.parametrize("delta", [1e-5, 1e-9])
def test_dominated_add_direction_is_skipped_and_changes_nothing(delta):
    mech = pldlib.Gaussian(sigma=1.0, q=0.02, sampling="poisson", relation="add_remove")
    h = 2e-3
    acc = pldlib.account(mech, steps=1000, spacing=h)
    got = acc.epsilon(delta)
    assert not _label(acc, "add").source.built          # never discretised at h
    assert _label(acc, "remove").source.built
    full = _full(pldlib.account(mech, steps=1000, spacing=h)).epsilon(delta)
    assert got.lower == full.lower                       # the skipped branch had no say
    assert got.upper <= full.upper
    # each direction accounted on its own (independent accountants)
    rem = pldlib.account(pldlib.Gaussian(sigma=1.0, q=0.02, sampling="poisson", relation="remove"),
                         steps=1000, spacing=h).epsilon(delta)
    add = pldlib.account(pldlib.Gaussian(sigma=1.0, q=0.02, sampling="poisson", relation="add"),
                         steps=1000, spacing=h).epsilon(delta)
    assert add.upper < rem.lower                         # why skipping was allowed
    assert got.upper >= max(rem.lower, add.lower)
    assert got.lower == pytest.approx(rem.lower, rel=1e-12)


def test_default_grid_keeps_the_dominated_direction_coarse():
    # the automatic grid's size check must not build the add direction's fine PLDs (that
    # would turn off its coarse screen: the DP-SGD default call then composed it in full)
    mech = pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson", relation="add_remove")
    acc = pldlib.account(mech, steps=10000)
    got = acc.epsilon(1e-5)
    assert not _label(acc, "add").source.built
    full = _full(pldlib.account(mech, steps=10000, spacing=acc.spacing)).epsilon(1e-5)
    assert got.lower == full.lower
    assert got.upper <= full.upper


def test_coarse_bound_is_a_certified_upper_bound():
    """The coarse pessimistic bound used for the test is itself >= the full lower bound."""
    mech = pldlib.Gaussian(sigma=0.9, q=0.05, sampling="poisson", relation="add_remove")
    acc = pldlib.account(mech, steps=200, spacing=4e-3)
    deltas = np.array([1e-3, 1e-6, 1e-10])
    eps_grid = np.array([0.5, 1.0, 2.0])
    for st in acc._branches:
        ce = acc._coarse_upper(st, deltas, "eps")
        cd = acc._coarse_upper(st, eps_grid, "delta")
        l, u = acc._branch_epsilon(st, deltas)
        dl, du = acc._branch_delta(st, eps_grid)
        assert np.all(ce >= l) and np.all(cd >= dl)
        # and it is looser than (or equal to) nothing finer than COARSE_FACTOR allows:
        assert st.source.coarse()[0].h == pytest.approx(COARSE_FACTOR * acc.spacing)


def test_crossing_directions_both_used_and_bounds_respected():
    """Subsampled Laplace, k = 2: add and remove cross; max after composing."""
    kw = dict(scale=1.0, q=0.5, sampling="poisson")
    eps = np.linspace(0.0, 1.9, 40)
    ar = pldlib.account(pldlib.Laplace(relation="add_remove", **kw), steps=2, spacing=1e-3)
    got = ar.delta(eps)
    rem = pldlib.account(pldlib.Laplace(relation="remove", **kw), steps=2, spacing=1e-3).delta(eps)
    add = pldlib.account(pldlib.Laplace(relation="add", **kw), steps=2, spacing=1e-3).delta(eps)
    assert (add.lower > rem.upper).any() and (rem.lower > add.upper).any()  # they cross
    assert all(st.source.built for st in ar._branches)
    truth_lo = np.maximum(rem.lower, add.lower)
    assert np.all(got.lower >= truth_lo - 1e-15)
    assert np.all(got.upper >= truth_lo)
    assert np.all(got.upper <= np.maximum(rem.upper, add.upper) + 1e-12)
    full = _full(pldlib.account(pldlib.Laplace(relation="add_remove", **kw), steps=2, spacing=1e-3)).delta(eps)
    np.testing.assert_allclose(got.lower, full.lower, rtol=0, atol=1e-15)
    np.testing.assert_allclose(got.upper, full.upper, rtol=0, atol=1e-15)


@pytest.mark.parametrize("lower_bound", [True, False])
def test_nearly_symmetric_directions_are_composed_without_a_coarse_screen(lower_bound, monkeypatch):
    # at small q the add and remove directions' normal scores agree to 1e-4: the coarse bound
    # of the second (8x the spacing) cannot fall below the first's answer, so no coarse
    # composition is made; forcing the screen gives the same interval, after a wasted one
    import pldlib.methods.pld as A

    mech = pldlib.Gaussian(sigma=2.18, q=1.8e-4, sampling="poisson", relation="add_remove")

    def run():
        acc = pldlib.account(mech, steps=5950, spacing=1e-4, lower_bound=lower_bound)
        calls = []
        orig = acc._coarse_upper
        monkeypatch.setattr(acc, "_coarse_upper", lambda *a, **k: calls.append(1) or orig(*a, **k))
        return acc.epsilon(1.9e-7), len(calls), acc

    got, n_coarse, acc = run()
    assert n_coarse == 0 and all(st.source.built for st in acc._branches)
    # ... nor any coarse discretisation: the scores come from the steps' loss moments and the
    # tilts from the (small) fine PLDs carried to the coarse spacing
    assert not any(st.source._coarse for st in acc._branches)
    monkeypatch.setattr(A, "SCREEN_CLOSE", -1.0)  # every branch but none screened-out by score
    forced, n_forced, _ = run()
    assert n_forced >= 1
    assert (got.lower, got.upper) == (forced.lower, forced.upper)


def _schedule(relation, n=40):
    return [(pldlib.Gaussian(float(s), q=0.02, sampling="poisson", relation=relation), 1)
            for s in np.linspace(0.9, 1.3, n)]


@pytest.mark.parametrize("kind", ["eps", "delta"])
def test_later_branch_gets_its_lower_side_only_where_it_could_matter(kind):
    # a schedule of 40 distinct steps has no coarse screen: both directions are composed, the
    # one a normal approximation puts lower (add) on its pessimistic side only -- its upper
    # bound is below the other's lower bound, so its own lower bound could not raise the
    # maximum's -- and the answer is the one computed with both sides of both directions
    h = 2e-3
    x = np.array([1e-5, 1e-9]) if kind == "eps" else np.array([1.0, 2.0])

    def ask(acc):
        return acc.epsilon(x) if kind == "eps" else acc.delta(x)

    acc = pldlib.account(_schedule("add_remove"), spacing=h)
    got = ask(acc)
    add, rem = _label(acc, "add"), _label(acc, "remove")
    assert add.source.uppers_built and not add.source.built   # no optimistic hull for add
    assert rem.source.built
    full = ask(_full(pldlib.account(_schedule("add_remove"), spacing=h)))
    np.testing.assert_array_equal(got.lower, full.lower)
    np.testing.assert_array_equal(got.upper, full.upper)
    # each direction on its own (independent accountants): why the hull could be skipped
    a = ask(pldlib.account(_schedule("add"), spacing=h))
    r = ask(pldlib.account(_schedule("remove"), spacing=h))
    assert np.all(a.upper < r.lower)
    np.testing.assert_allclose(got.lower, r.lower, rtol=1e-12)
    np.testing.assert_allclose(got.upper, np.maximum(a.upper, r.upper), rtol=1e-12)


def test_later_branch_that_may_be_the_largest_gets_its_lower_side(monkeypatch):
    # the wrong direction first (forced): the later one's upper bound exceeds the lower bound
    # found so far, so its optimistic side is computed and the interval is the full one
    import pldlib.methods.pld as A

    h = 2e-3
    monkeypatch.setattr(A.PLDAccountant, "_likely_first",
                        lambda self, x, kind, fine=False: (self._labels.index("add"), [0.0, 0.0]))
    acc = pldlib.account(_schedule("add_remove"), spacing=h)
    got = acc.epsilon(np.array([1e-5, 1e-9]))
    assert all(st.source.built for st in acc._branches)
    full = _full(pldlib.account(_schedule("add_remove"), spacing=h)).epsilon(np.array([1e-5, 1e-9]))
    np.testing.assert_array_equal(got.lower, full.lower)
    assert np.all(got.upper <= full.upper)                # (the smaller of two certified uppers)
    np.testing.assert_allclose(got.upper, full.upper, rtol=1e-9)


def test_tilt_estimated_from_the_coarsened_fine_plds_matches_the_coarse_discretisation(monkeypatch):
    """A branch estimates its tilt on its fine PLDs carried to 8h (DiscretePLD.coarsened)
    instead of a coarse connect-the-dots of its profile: both are
    connect-the-dots curves at 8h of nearly the same curve, so the estimates agree closely,
    and the answer is the same to round-off (the composition's tilt moves by that much).
    (Upper-only queries on large grids estimate it on coarse PLDs that also choose the points
    of thinned ones instead: that route is switched off here, and tested in test_discretize.)"""
    import pldlib.methods.pld as A
    from pldlib.pld.compose import estimate_tilt

    monkeypatch.setattr(pld_grid, "THIN_FROM", 10**9)

    mech = pldlib.Gaussian(sigma=1.22, q=4.3e-4, sampling="poisson", relation="add_remove")
    steps, delta = 22592, 5.6e-8
    acc = pldlib.account(mech, steps=steps, spacing=9.9e-5, lower_bound=False)
    got = acc.epsilon(delta)
    cut = A._cut_scale(np.array([delta]))
    for st in acc._branches:
        level = st.source.level_for(cut, st.counts)
        assert level not in st.source._coarse
        via_fine = estimate_tilt(st.source.fine_coarsened(level), st.counts, delta, cut)
        via_profile = estimate_tilt(st.coarse_at(cut), st.counts, delta, cut)
        assert via_fine == pytest.approx(via_profile, rel=1e-3)
    # the same accountant with the tilts estimated on coarse discretisations of the profiles
    monkeypatch.setattr(A, "_tilt_plds", lambda st, cut=None: st.coarse_at(cut))
    old = pldlib.account(mech, steps=steps, spacing=9.9e-5, lower_bound=False)
    ref = old.epsilon(delta)
    assert all(st.source._coarse for st in old._branches)
    assert got.upper == pytest.approx(ref.upper, rel=1e-9)


@pytest.mark.parametrize("lower_bound", [True, False])
def test_far_direction_is_screened_at_a_wider_spacing_first_and_changes_nothing(lower_bound, monkeypatch):
    """A direction whose normal score lies SCREEN_SPREAD_GAP below the first's is screened at
    SCREEN_SPREAD times the cheap spacing first; the cheap screen follows only where that one
    cannot skip it.  Either way the interval is the one without the wider screen, and the wider
    screen's bound lies above the direction's own certified lower bound.  Grids too coarse for it
    (fewer than SCREEN_SPREAD_POINTS points at the wider spacing) go to the cheap screen directly."""
    import pldlib.methods.pld as A

    mech = pldlib.Gaussian(sigma=1.0, q=0.02, sampling="poisson", relation="add_remove")
    h, delta = 1e-4, 1e-5  # (the add direction's grid: ~36k points, >= 512 at 32 h)

    def run():
        acc = pldlib.account(mech, steps=1000, spacing=h, lower_bound=lower_bound)
        calls = []
        orig = acc._coarse_upper

        def spy(*a, **k):
            out = orig(*a, **k)
            calls.append((k.get("spread", 1), float(out[0])))
            return out

        monkeypatch.setattr(acc, "_coarse_upper", spy)
        return acc.epsilon(delta), calls, acc

    got, calls, acc = run()
    assert [s for s, _ in calls] == [A.SCREEN_SPREAD]    # the wider screen sufficed
    assert not _label(acc, "add").source.built
    add = pldlib.account(pldlib.Gaussian(sigma=1.0, q=0.02, sampling="poisson", relation="add"),
                         steps=1000, spacing=h).epsilon(delta)
    assert calls[0][1] >= add.lower                      # a certified upper bound of the add direction
    assert calls[0][1] <= (got.lower if lower_bound else got.upper)  # why it was skipped
    # without the wider screen (or with one too wide to skip anything): the cheap one decides,
    # and the interval is the same
    monkeypatch.setattr(A, "SCREEN_SPREAD_GAP", np.inf)
    plain, calls2, _ = run()
    assert [s for s, _ in calls2] == [1]
    monkeypatch.setattr(A, "SCREEN_SPREAD_GAP", 0.02)
    orig = A.PLDAccountant._coarse_upper  # (a wider screen that cannot skip: +inf, as when it fails)
    monkeypatch.setattr(A.PLDAccountant, "_coarse_upper", lambda self, st, x, kind, strict=False, spread=1:
                        np.full(x.size, np.inf) if spread > 1 else orig(self, st, x, kind, strict, spread))
    wide, calls3, acc3 = run()
    assert [s for s, _ in calls3] == [A.SCREEN_SPREAD, 1] and calls3[0][1] == np.inf
    assert not _label(acc3, "add").source.built  # (the cheap screen skipped it)
    for other in (plain, wide):
        assert (got.lower, got.upper) == (other.lower, other.upper)


def test_coarse_grids_skip_the_wider_screen():
    mech = pldlib.Gaussian(sigma=1.0, q=0.02, sampling="poisson", relation="add_remove")
    acc = pldlib.account(mech, steps=1000, spacing=2e-3)  # (~1,800 points: 56 at 32 h)
    acc.epsilon(1e-5)
    assert [len(k) for k in _label(acc, "add").coarse_cache] == [2]  # the cheap screen alone


def test_long_schedules_get_no_wider_screen_either(monkeypatch):
    # (schedules of SCREEN_MAX_COMPONENTS distinct steps or more are composed in full: no screen at
    # any spacing, even where the wider one would be allowed)
    import pldlib.methods.pld as A

    monkeypatch.setattr(pld_grid, "SCREEN_SPREAD_POINTS", 1)
    acc = pldlib.account(_schedule("add_remove"), spacing=2e-3)
    acc.epsilon(1e-5)
    assert all(st.source.uppers_built and not st.coarse_cache for st in acc._branches)
