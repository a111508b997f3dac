"""account(..., discretisation=...) and the matching sweep option of method ``pld``.

Truths: the k-fold Gaussian pair is one Gaussian pair with r = sqrt(k)/sigma
(closed form evaluated in mpmath, independent of the library); the subsampled
case is checked against connect-the-dots at a much finer grid (a different
discretisation of the same pair, whose interval must overlap).
"""
from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

import pldlib
from sweeps.config import ConfigError, parse_config
from sweeps.methods import run_block, validate_options
from sweeps.testing import small_config



def sweep_fn(params, steps, deltas, opts):
    """(eps_lower, eps_upper, notes) of the sweep task for one block of method pld."""
    out = run_block({"index": 0, "params": {**params, "method": "pld"}, "steps": steps, "deltas": deltas,
                     "options": opts})
    return out["eps_lower"], out["eps_upper"], [out["error"]] if out["error"] else []

def exact_delta(r, eps):
    with mp.workdps(40):
        r, eps = mp.mpf(r), mp.mpf(eps)
        return float(mp.ncdf(-eps / r + r / 2) - mp.exp(eps) * mp.ncdf(-eps / r - r / 2))


@pytest.mark.parametrize("sigma,k,h", [(1.0, 10, 1e-3), (2.0, 100, 5e-3), (0.7, 3, 2e-2)])
def test_privacy_buckets_bracket_the_gaussian_closed_form(sigma, k, h):
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma), steps=k, spacing=h, discretisation="privacy_buckets")
    r = math.sqrt(k) / sigma
    eps = np.array([-0.5, 0.0, 0.3, 1.0, 2.5])
    iv = acc.delta(eps)
    for e, lo, up in zip(eps, iv.lower, iv.upper):
        t = exact_delta(r, e)
        assert lo <= t <= up, (e, lo, t, up)
    # eps(delta): the truth's curve at the interval's ends straddles delta
    for d in [1e-8, 1e-5, 1e-2]:
        lo, up = acc.epsilon(d)
        assert exact_delta(r, up) <= d * (1 + 1e-12)
        assert exact_delta(r, lo) >= d * (1 - 1e-12)


def test_privacy_buckets_are_wider_than_connect_the_dots_at_the_same_interval():
    m = pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson")
    b = pldlib.account(m, steps=1000, spacing=2e-3, discretisation="privacy_buckets").epsilon(1e-5)
    c = pldlib.account(m, steps=1000, spacing=2e-3).epsilon(1e-5)
    fine = pldlib.account(m, steps=1000, spacing=2e-4).epsilon(1e-5)
    # all three are certified intervals of the same value: they overlap
    assert max(b.lower, c.lower, fine.lower) <= min(b.upper, c.upper, fine.upper)
    # buckets: width ~ k h, connect-the-dots: ~ k h^2
    assert b.upper - b.lower > 10 * (c.upper - c.lower)
    # buckets move each step's loss by up to h: the width is of that order
    assert b.upper - b.lower <= 1000 * 2e-3 * 1.5


@pytest.mark.parametrize("sampling,relation", [("poisson", "add_remove"), ("poisson", "substitution"),
                                               ("wor", "substitution"), ("none", "add")])
def test_privacy_buckets_overlap_connect_the_dots(sampling, relation):
    q = 1.0 if sampling == "none" else 0.05
    m = pldlib.Gaussian(sigma=1.2, q=q, sampling=sampling, relation=relation)
    b = pldlib.account(m, steps=50, spacing=2e-3, discretisation="privacy_buckets").epsilon([1e-6, 1e-3])
    c = pldlib.account(m, steps=50, spacing=5e-4).epsilon([1e-6, 1e-3])
    assert np.all(np.maximum(b.lower, c.lower) <= np.minimum(b.upper, c.upper))


def test_default_is_connect_the_dots_and_bad_names_are_refused():
    m = pldlib.Gaussian(sigma=1.0)
    a = pldlib.account(m, steps=20, spacing=1e-2).epsilon(1e-6)
    b = pldlib.account(m, steps=20, spacing=1e-2, discretisation="connect_the_dots").epsilon(1e-6)
    assert a == b
    for bad in ["buckets", "", None, 3]:
        with pytest.raises(ValueError, match=r"^discretisation: must be one of"):
            pldlib.account(m, steps=20, discretisation=bad)


def test_privacy_buckets_default_interval_is_certified_and_bounded():
    m = pldlib.Gaussian(sigma=2.0)
    acc = pldlib.account(m, steps=100, discretisation="privacy_buckets")
    ref = pldlib.account(m, steps=100)
    assert acc.spacing >= ref.spacing / 16 / 1.01  # at most 16x finer than the ctd rule (+ its probe)
    lo, up = acc.epsilon(1e-6)
    r = math.sqrt(100) / 2.0
    assert exact_delta(r, up) <= 1e-6 * (1 + 1e-12) and exact_delta(r, lo) >= 1e-6 * (1 - 1e-12)


# -- the sweep option ---------------------------------------------------------------
def _cfg(**opts):
    d = small_config("results/x.zarr")
    d["options"]["pld"].update(opts)
    return d


@pytest.mark.parametrize("bad", ["buckets", 3, None, ["privacy_buckets"]])
def test_sweep_option_is_validated(bad):
    with pytest.raises(ConfigError) as ei:
        parse_config(_cfg(discretisation=bad))
    assert ei.value.field == "options.pld.discretisation"
    assert "must be one of connect_the_dots, privacy_buckets" in str(ei.value)


def test_sweep_option_changes_fingerprint_only_when_given():
    base = parse_config(_cfg())
    assert "discretisation" not in base.options["pld"]
    pb = parse_config(_cfg(discretisation="privacy_buckets"))
    assert pb.options["pld"]["discretisation"] == "privacy_buckets"
    assert pb.fingerprint() != base.fingerprint()


def test_sweep_cells_equal_direct_calls_with_privacy_buckets():
    params = dict(mechanism="gaussian", sigma=1.5, q=0.02, sampling="poisson", relation="add_remove")
    steps, deltas = [10, 200], [1e-7, 1e-4]
    opts = validate_options("pld", "options.pld", {"spacing": 3e-3, "discretisation": "privacy_buckets"})
    lo, up, notes = sweep_fn(params, steps, deltas, opts)
    assert notes == []
    m = pldlib.Gaussian(sigma=1.5, q=0.02, sampling="poisson")
    for i, k in enumerate(steps):
        r = pldlib.account(m, steps=k, spacing=3e-3, discretisation="privacy_buckets").epsilon(deltas)
        np.testing.assert_array_equal(lo[i], r.lower)
        np.testing.assert_array_equal(up[i], r.upper)
        c = pldlib.account(m, steps=k, spacing=3e-3).epsilon(deltas)
        assert np.all(up[i] - lo[i] > c.upper - c.lower)  # it really used buckets


def test_automatic_coarsening_jumps_by_the_missing_factor():
    """A composition refused for size says how many points it needs; the automatic grid then
    coarsens at once by the power of 2 that fits (window points scale like 1/h), at most 2^8."""
    from pldlib import GridTooLargeError
    from pldlib.methods.pld_budget import _coarsen_factor

    assert _coarsen_factor(GridTooLargeError("x", need=1000, limit=100)) == 16.0   # 2^ceil(log2 10)
    assert _coarsen_factor(GridTooLargeError("x", need=201, limit=100)) == 4.0
    assert _coarsen_factor(GridTooLargeError("x", need=150, limit=100)) == 2.0
    assert _coarsen_factor(GridTooLargeError("x", need=10**12, limit=100)) == 256.0
    assert _coarsen_factor(GridTooLargeError("no sizes")) == 2.0
    assert _coarsen_factor(MemoryError()) == 2.0


def test_spacing_is_the_one_name_of_the_grid_spacing_and_interval_its_deprecated_alias():
    mech = pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson")
    new = pldlib.account(mech, steps=100, spacing=2e-3)
    assert new.spacing == 2e-3
    with pytest.warns(DeprecationWarning, match="use spacing="):
        old = pldlib.account(mech, steps=100, interval=2e-3)
    assert old.spacing == 2e-3 and tuple(old.epsilon(1e-5)) == tuple(new.epsilon(1e-5))
    assert old.interval == old.spacing  # (the attribute's older name reads the same)
    with pytest.raises(ValueError, match="spacing: given twice"):
        pldlib.account(mech, steps=100, spacing=2e-3, interval=1e-3)
    with pytest.warns(DeprecationWarning):
        assert pldlib.account_steps(mech, [10, 100], interval=2e-3)[1].spacing == 2e-3


def test_a_sweep_config_with_the_older_option_name_keeps_its_fingerprint():
    from sweeps.config import parse_config

    def cfg(opts):
        return parse_config({"name": "t", "methods": ["pld"], "grid": {"sigma": [1.0], "q": [0.01], "steps": [10], "sampling": ["poisson"],
                                                                        "delta": [1e-5]}, "options": {"pld": opts}})

    new, old = cfg({"spacing": 2e-3}), cfg({"interval": 2e-3})
    assert new.options["pld"]["spacing"] == old.options["pld"]["spacing"] == 2e-3
    assert new.fingerprint() == old.fingerprint() != cfg({"spacing": 1e-3}).fingerprint()
    # ... which is the hash that stores made before the rename carry: the canonical options
    # hashed under the older key
    import hashlib
    import json

    from sweeps.config import FINGERPRINT_EXCLUDED_OPTIONS

    c = new.canonical()
    opts = {m: {("interval" if k == "spacing" else k): v for k, v in o.items() if k not in FINGERPRINT_EXCLUDED_OPTIONS}
            for m, o in c["options"].items()}
    ident = {"format": c["format"], "mechanism": c["mechanism"], "methods": c["methods"], "grid": c["grid"],
             "options": opts}
    text = json.dumps(ident, sort_keys=True, separators=(",", ":"), allow_nan=False)
    assert new.fingerprint() == hashlib.sha256(text.encode()).hexdigest()
