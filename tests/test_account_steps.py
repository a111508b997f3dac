"""account_steps: one discretisation shared by several steps counts, and the sweep method on it.

Every accountant it returns must be the accountant ``account(mech, steps=k,
spacing=h)`` at the shared spacing h (same answers, bit for bit), so it keeps
that accountant's certificate; the shared spacing must never be coarser than
what the interval rule gives a steps value on its own.
"""
from __future__ import annotations

import numpy as np
import pytest

import pldlib
from pldlib.methods.pld import account_steps
from pldlib.methods.pld_grid import _rule_interval, _step_stats
from sweeps.methods import run_block, validate_options

DELTAS = np.array([1e-9, 1e-6, 1e-3])
SGD = pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson")



def sweep_fn(params, steps, deltas, opts):
    """(eps_lower, eps_upper, notes) of the sweep task for one block of method pld."""
    out = run_block({"index": 0, "params": {**params, "method": "pld"}, "steps": steps, "deltas": deltas,
                     "options": opts})
    return out["eps_lower"], out["eps_upper"], [out["error"]] if out["error"] else []

def _same(acc, direct):
    a, b = acc.epsilon(DELTAS), direct.epsilon(DELTAS)
    np.testing.assert_array_equal(a.lower, b.lower)
    np.testing.assert_array_equal(a.upper, b.upper)
    eps = np.array([0.1, 1.0])
    a, b = acc.delta(eps), direct.delta(eps)
    np.testing.assert_array_equal(a.lower, b.lower)
    np.testing.assert_array_equal(a.upper, b.upper)


@pytest.mark.parametrize("mech", [SGD, pldlib.Laplace(scale=3.0, q=0.1, sampling="poisson", relation="substitution"),
                                  pldlib.Gaussian(sigma=2.0)], ids=["sgd", "laplace-sub", "gauss"])
def test_explicit_interval_equals_direct_calls(mech):
    steps = [300, 7, 300, 40]  # unsorted, with a repeat
    accs = account_steps(mech, steps, spacing=4e-3)
    assert [a.total_steps for a in accs] == steps
    for a, k in zip(accs, steps):
        assert a.spacing == 4e-3
        _same(a, pldlib.account(mech, steps=k, spacing=4e-3))
    # the discretisation really is shared (an unsampled Gaussian has none: closed form)
    if accs[0]._exact is None:
        assert accs[0]._branches[0].uppers[0] is accs[1]._branches[0].uppers[0]


def test_default_interval_rule():
    steps = [1, 10, 100, 1000, 10000]
    accs = account_steps(SGD, steps)
    stats = _step_stats([(SGD, 1)], [SGD.branches()])
    for a, k in zip(accs, steps):
        # never coarser than the steps value's own rule
        assert a.spacing <= _rule_interval(stats, [k])[0]
        _same(a, pldlib.account(SGD, steps=k, spacing=a.spacing))
    # the largest steps value gets exactly the spacing account() picks for it
    assert accs[-1].spacing == pldlib.account(SGD, steps=10000).spacing
    # a steps value whose own rule is coarser than the shared spacing joins the group
    assert accs[2].spacing == accs[-1].spacing
    # 1 step: a finer rule than the group's spacing, so it gets its own
    assert accs[0].spacing < accs[-1].spacing


def test_errors_are_isolated_or_raised():
    # one step needs a ~30,000-point grid at its own spacing, 10,000 steps ~7,000
    with pytest.raises(pldlib.GridTooLargeError):
        pldlib.account(SGD, steps=1, max_bins=20_000)
    accs = account_steps(SGD, [1, 10_000], max_bins=20_000, errors="return")
    assert isinstance(accs[0], pldlib.GridTooLargeError)
    assert isinstance(accs[1], pldlib.PLDAccountant)
    with pytest.raises(pldlib.GridTooLargeError):
        account_steps(SGD, [1, 10_000], max_bins=20_000)


@pytest.mark.parametrize("bad,exc", [([], ValueError), ([10, 0], ValueError), ([2.5], (TypeError, ValueError))])
def test_bad_steps_lists(bad, exc):
    with pytest.raises(exc):
        account_steps(SGD, bad)


def test_rejects_sequences_and_bad_errors_mode():
    with pytest.raises(TypeError):
        account_steps([(SGD, 10)], [10])
    with pytest.raises(ValueError, match="errors"):
        account_steps(SGD, [10], errors="ignore")


def test_sweep_method_cells_equal_direct_calls_at_the_shared_interval():
    params = dict(mechanism="gaussian", sigma=1.0, q=0.01, sampling="poisson", relation="add_remove")
    steps, deltas = [100, 1000, 3000], [1e-8, 1e-5]
    lo, up, notes = sweep_fn(params, steps, deltas, validate_options("pld", "options.pld", {}))
    assert notes == []
    h = pldlib.account(SGD, steps=max(steps)).spacing
    for i, k in enumerate(steps):
        r = pldlib.account(SGD, steps=k, spacing=h).epsilon(deltas)
        np.testing.assert_array_equal(lo[i], r.lower)
        np.testing.assert_array_equal(up[i], r.upper)


def test_sweep_method_isolates_a_failing_steps_value():
    params = dict(mechanism="gaussian", sigma=3.0, q=0.1, sampling="poisson", relation="add_remove")
    mech = pldlib.Gaussian(sigma=3.0, q=0.1, sampling="poisson")
    opts = validate_options("pld", "options.pld", {"max_bins": 3200})
    # one step at its own (finer) spacing needs ~3,240 grid points: refused on its own
    with pytest.raises(pldlib.GridTooLargeError):
        pldlib.account(mech, steps=1, max_bins=3200)
    lo, up, notes = sweep_fn(params, [1, 100], [1e-5, 1e-3], opts)
    assert np.isnan(up[0]).all() and np.isnan(lo[0]).all()
    assert len(notes) == 1 and notes[0].startswith("steps=1: GridTooLargeError")
    direct = pldlib.account(mech, steps=100, max_bins=3200).epsilon([1e-5, 1e-3])
    np.testing.assert_array_equal(up[1], direct.upper)
    np.testing.assert_array_equal(lo[1], direct.lower)


def test_sweep_option_eps_cap_stops_a_row_only_where_eps_exceeds_the_cap():
    # sigma 0.6, q 0.05: eps passes 8 somewhere inside the steps axis (at every delta)
    params = dict(mechanism="gaussian", sigma=0.6, q=0.05, sampling="poisson", relation="add_remove")
    steps, deltas, cap = [1, 3, 10, 30, 100, 300, 1000, 3000, 10000], [1e-8, 1e-5, 1e-3], 8.0
    opts = validate_options("pld", "options.pld", {"spacing": 2e-3, "eps_cap": cap})
    lo, up, notes = sweep_fn(params, steps, deltas, opts)
    full_lo, full_up, _ = sweep_fn(params, steps, deltas, validate_options("pld", "options.pld", {"spacing": 2e-3}))
    skipped = np.isnan(up).all(axis=1)
    assert skipped.any() and not skipped.all()
    first = int(np.argmax(skipped))
    assert skipped[first:].all()                        # a tail of the steps axis, nothing else
    # computed cells are the uncapped row's (same spacing), cell for cell
    np.testing.assert_array_equal(up[:first], full_up[:first])
    np.testing.assert_array_equal(lo[:first], full_lo[:first])
    # every cell left out really has eps above the cap (the uncapped certified lower bounds)
    assert (full_lo[first:] > cap).all()
    assert any(n.startswith(f"steps > {steps[first - 1]} not computed: eps > eps_cap=8") for n in notes)
    # the task stores the cells left out as final (status 3), not as failures to recompute
    out = run_block({"index": 0, "params": {**params, "method": "pld"}, "steps": steps, "deltas": deltas,
                     "options": opts})
    np.testing.assert_array_equal(out["unsupported"], np.isnan(up))
    np.testing.assert_array_equal(out["failed"], np.isnan(up))
    with pytest.raises(Exception, match="eps_cap"):
        validate_options("pld", "options.pld", {"eps_cap": -1})
