"""eps_floor: steps values whose certified Renyi-DP upper bound is at most the floor at every delta
are left out of a row's tables (final, not failures); the rest are the unfloored tables' cells."""
import numpy as np
import pytest

import pldlib
from pldlib.methods import make_accountant

DELTAS = [1e-10, 1e-6, 1e-3]
STEPS = [1, 3, 10, 30, 100, 300, 1000, 3000, 10000]


def _event(sampling="poisson", relation="add_remove", sigma=3.0, q=0.01):
    return pldlib.Gaussian(sigma=sigma, q=q, sampling=sampling, relation=relation).event


def test_floored_rows_are_below_the_floor_and_the_rest_equal_the_unfloored_rows():
    acc = make_accountant("pld", "add_remove", spacing=1e-3)
    ev = _event()
    floor = 0.3
    t = acc.tables_per_steps(ev, STEPS, DELTAS, eps_floor=floor)
    full = acc.tables_per_steps(ev, STEPS, DELTAS)
    left = t.capped.all(axis=1)
    assert left.any() and not left.all()
    assert not (t.capped & ~left[:, None]).any()          # whole steps values, nothing else
    # the truth lies below the floor where left out: the unfloored certified lower bounds say so too
    assert (full.eps_lower[left] <= floor).all()
    assert np.isnan(t.eps_upper[left]).all() and np.isnan(t.eps_lower[left]).all()
    # the steps values computed: their own tables at this explicit spacing, cell for cell
    kept = [k for k, m in zip(STEPS, left) if not m]
    alone = acc.tables_per_steps(ev, kept, DELTAS)
    np.testing.assert_array_equal(t.eps_upper[~left], alone.eps_upper)
    np.testing.assert_array_equal(t.eps_lower[~left], alone.eps_lower)
    assert any("eps_floor=0.3" in n and "Renyi" in n for n in t.notes)
    assert not t.failed().any()                           # left out is not a failure


def test_every_left_out_cell_has_its_own_rdp_certificate():
    from pldlib.methods.base import rdp_floor_mask

    ev = _event(sigma=8.0, q=0.001)
    mask, note = rdp_floor_mask(ev, "add_remove", STEPS, DELTAS, 0.05)
    rdp = make_accountant("rdp", "add_remove")
    for k, m in zip(STEPS, mask):
        up = rdp.fresh().compose(ev, k).epsilon(np.array(DELTAS)).upper
        assert bool(m) == bool(np.all(up <= 0.05))
    assert mask.any() and note


def test_events_rdp_cannot_take_are_computed_in_full():
    acc = make_accountant("pld", "substitution", spacing=2e-3)
    ev = _event("wor", "substitution", sigma=6.0, q=0.001)
    t = acc.tables_per_steps(ev, [1, 10, 100], DELTAS, eps_floor=10.0)
    assert not t.capped.any() if t.capped is not None else True
    assert np.isfinite(t.eps_upper).all()


def test_floor_and_cap_together_leave_a_band():
    acc = make_accountant("pld", "add_remove", spacing=2e-3)
    ev = _event(sigma=0.8, q=0.05)
    t = acc.tables_per_steps(ev, STEPS, DELTAS, eps_floor=0.3, eps_cap=6.0)
    full = acc.tables_per_steps(ev, STEPS, DELTAS)
    out = t.capped.all(axis=1)
    comp = ~out
    assert out.any() and comp.any()
    # cells left out are either certainly below the floor or certainly above the cap
    assert ((full.eps_lower[out] <= 0.3).all(axis=1) | (full.eps_lower[out] > 6.0).all(axis=1)).all()


@pytest.mark.parametrize("kw, word", [({"eps_floor": -1.0}, "eps_floor"), ({"eps_floor": 5.0, "eps_cap": 2.0}, "below eps_cap")])
def test_bad_floors_name_the_option(kw, word):
    acc = make_accountant("pld", "add_remove", spacing=2e-3)
    with pytest.raises(ValueError, match=word):
        acc.tables_per_steps(_event(), [1, 10], DELTAS, **kw)
    with pytest.raises(ValueError, match="eps_floor"):
        acc.tables_per_steps(_event(), [1, 10], DELTAS, [0.1], eps_floor=0.1)


def test_the_sweep_option_is_validated_and_reaches_the_task():
    from sweeps.errors import ConfigError
    from sweeps.methods import run_block, validate_options

    with pytest.raises(ConfigError, match="eps_floor"):
        validate_options("pld", "options.pld", {"eps_floor": 5.0, "eps_cap": 2.0})
    with pytest.raises(ConfigError, match="eps_floor"):
        validate_options("pld", "options.pld", {"eps_floor": -1})
    opts = validate_options("pld", "options.pld", {"spacing": 1e-3, "eps_floor": 0.3})
    params = dict(mechanism="gaussian", sigma=3.0, q=0.01, sampling="poisson", relation="add_remove", method="pld")
    out = run_block({"index": 0, "params": params, "steps": STEPS, "deltas": DELTAS, "options": opts})
    left = out["unsupported"].all(axis=1)
    assert left.any() and not left.all() and not (out["failed"] & ~out["unsupported"]).any()
    assert "eps_floor=0.3" in out["error"]
