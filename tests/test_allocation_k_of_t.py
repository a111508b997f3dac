"""k of t random allocation: every record in k of the t steps of each epoch (docs/MATH.md 13.8).

Pinned against independent truths: a 30-digit quadrature of one epoch at t = 3, k = 2 (computed by
benchmarks/k_of_t_truth.py, re-derived here in double precision by nested scipy quadrature), seeded
Monte Carlo of the exact pair (the likelihood ratio is the elementary symmetric polynomial e_k of
the coordinates' ratios, checked against brute-force enumeration of the subsets), and the exact
Gaussian closed forms of the unamplified bounds."""
from __future__ import annotations

import itertools
import json
import math
import pathlib

import numpy as np
import pytest
from scipy import integrate
from scipy.special import ndtr

import pldlib
from pldlib import events as E

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: one xdist worker for the module (make test: --dist loadgroup): its tests share the library's cached
#: epoch pairs (e.g. sigma 1, 2 of 100 steps: four tests), built once instead of once per worker
pytestmark = pytest.mark.xdist_group("test_allocation_k_of_t")


def _acc(sigma, t, k, epochs, relation="add_remove", method="pld"):
    ev = E.Sampled(E.GaussianEvent(sigma), k / t, "random_allocation", selections=k)
    return pldlib.make_accountant(method, relation).compose(ev, t * epochs)


# -- the event, the scheme's arithmetic, bad input -------------------------------------------------
def test_blocks_cover_the_epoch():
    from pldlib.sampling.allocation import allocation_blocks

    for t in range(2, 40):
        for k in range(1, t):
            b = allocation_blocks(t, k)
            assert sum(n for n in b.values()) == k and sum(s * n for s, n in b.items()) == t
            assert max(b) - min(b) <= 1 and min(b) >= 1


def test_bad_input_names_the_argument():
    g = E.GaussianEvent(1.0)
    with pytest.raises(ValueError, match="selections.*random_allocation"):
        E.Sampled(g, 0.02, "poisson", selections=2)
    with pytest.raises(ValueError, match="selections.*random_allocation"):
        E.Sampled(g, 0.02, "shuffle", selections=2)
    with pytest.raises(ValueError, match="selections"):
        E.Sampled(g, 1.0, "random_allocation", selections=2)
    with pytest.raises((TypeError, ValueError), match="selections"):
        E.Sampled(g, 0.02, "random_allocation", selections=0)
    with pytest.raises(ValueError, match="q: k of t"):  # t = k/q = 2/0.3 is not whole
        pldlib.PLDAccountant("add_remove").compose(E.Sampled(g, 0.3, "random_allocation", selections=2), 20)
    with pytest.raises(ValueError, match="steps.*t=100"):  # not a whole number of epochs
        pldlib.PLDAccountant("add_remove").compose(
            E.Sampled(g, 0.02, "random_allocation", selections=2), 150).epsilon(1e-5)
    with pytest.raises(ValueError, match="selections.*random_allocation"):
        pldlib.Gaussian(1.0, q=0.02, sampling="poisson", selections=2)
    with pytest.raises(ValueError, match="selections"):
        pldlib.calibrate(tpr_at_fpr=(0.5, 0.1), q=0.02, steps=100, sampling="random_allocation", selections=2)


def test_repr_and_describe():
    m = pldlib.Gaussian(1.0, q=0.02, sampling="random_allocation", selections=2)
    assert "selections=2" in repr(m) and m.describe()["selections"] == 2
    assert "selections" not in pldlib.Gaussian(1.0, q=0.02, sampling="random_allocation").describe()
    assert "selections=2" in repr(m.event)


# -- the exact likelihood ratio (Monte Carlo helper) against enumeration ------------------------------
def test_elementary_symmetric_against_enumeration():
    from pldlib.testing.montecarlo import _log_elementary_symmetric

    b = np.random.default_rng(3).normal(scale=3.0, size=(7, 6))
    for k in (1, 2, 3, 6):
        brute = np.log([sum(math.exp(sum(row[list(c)])) for c in itertools.combinations(range(6), k)) for row in b])
        assert np.allclose(_log_elementary_symmetric(b, k), brute, rtol=1e-13, atol=0)


# -- one epoch, t = 3, k = 2: the 30-digit truth ----------------------------------------------------
def _truth_double(sigma, eps, direction):
    """The same integral as benchmarks/k_of_t_truth.py, nested scipy quadrature in double precision."""
    s, c, g = sigma, 0.5 / sigma, math.exp(eps)

    def Y(z):
        return math.exp(z / s - 0.5 / (s * s))

    def price(K):
        if direction == "remove":
            if K <= 0:
                return 1.0 - K
            z = s * math.log(K)
            return ndtr(c - z) - K * ndtr(-c - z)
        if K <= 0:
            return 0.0
        z = s * math.log(K)
        return K * ndtr(z + c) - ndtr(z - c)

    def inner(z1):
        y1 = Y(z1)

        def f(z2):
            y2 = Y(z2)
            a = y1 + y2
            K = (3 * g - y1 * y2) / a if direction == "remove" else (3 / g - y1 * y2) / a
            w = a / 3 if direction == "remove" else g * a / 3
            return w * price(K) * math.exp(-0.5 * z2 * z2) / math.sqrt(2 * math.pi)

        return integrate.quad(f, -12, 12, points=[-3, 0, 3], epsabs=1e-14, epsrel=1e-12, limit=200)[0] \
            * math.exp(-0.5 * z1 * z1) / math.sqrt(2 * math.pi)

    return integrate.quad(inner, -12, 12, points=[-3, 0, 3], epsabs=1e-13, epsrel=1e-11, limit=200)[0]


def _truths():
    path = ROOT / "results" / "batches" / "k_of_t_truth.json"
    if not path.exists():
        return []
    return json.loads(path.read_text())["rows"]


def test_double_precision_truth_matches_the_30_digit_one():
    rows = _truths()
    if not rows:
        pytest.skip("results/batches/k_of_t_truth.json absent (python -m benchmarks.k_of_t_truth)")
    for r in rows[:4]:
        assert abs(_truth_double(r["sigma"], r["eps"], r["direction"]) - float(r["delta"])) <= 1e-9, r


@pytest.mark.parametrize("sigma", [1.0, 0.8])
def test_one_epoch_brackets_the_quadrature_truth(sigma):
    """One epoch of 2 of 3: certified lower <= 30-digit truth <= certified upper, each direction
    on its own (remove, add) and add_remove (their maximum)."""
    rows = [r for r in _truths() if r["sigma"] == sigma]
    if not rows:  # (the file is committed; without it, the double-precision quadrature)
        rows = [{"sigma": sigma, "eps": e, "direction": d, "delta": repr(_truth_double(sigma, e, d))}
                for e in (0.5, 1.5) for d in ("remove", "add")]
    for r in rows:
        iv = _acc(sigma, 3, 2, 1, relation=r["direction"]).delta([r["eps"]])
        truth = float(r["delta"])
        assert iv.lower[0] <= truth * (1 + 1e-12) and truth * (1 - 1e-12) <= iv.upper[0], (r, iv)
        # not vacuous: the interval is within 25% of the truth on both sides (measured: see MATH 13.8)
        assert iv.upper[0] <= 1.25 * truth and iv.lower[0] >= 0.75 * truth, (r, iv)


# -- many epochs: seeded Monte Carlo of the exact pair ---------------------------------------------
#: (results/BATCHES.md's 10^7-sample run also has (16, 4, 1.5, 10): left out here, it takes the path of
#: (20, 5, 1.0, 4) -- blocks of 4 steps, k > 1, many epochs -- and differs only in size, at twice its cost)
MC_CASES = [(3, 2, 1.0, 1), (4, 2, 0.8, 1), (6, 3, 1.5, 3), (8, 3, 0.8, 5), (20, 5, 1.0, 4)]


@pytest.mark.parametrize("t,k,sigma,epochs", MC_CASES)
def test_monte_carlo_inside_the_certified_interval(t, k, sigma, epochs):
    """Monte Carlo (3e5 samples per direction, the empirical Bernstein interval at beta = 1e-3 of
    test_allocation.mc_interval; the 10^7 run is in results/BATCHES.md) of the exact k of t pair: its
    confidence interval meets the certified one."""
    from pldlib.testing.montecarlo import allocation_delta

    from test_allocation import mc_interval

    eps = np.array([0.1, 0.4, 1.0]) * math.sqrt(epochs * k) / sigma
    mc = allocation_delta(sigma, t, epochs, eps, n_samples=300_000, seed=7000 + 100 * t + 10 * k + epochs,
                          selections=k)
    mc_lo, mc_up = mc_interval(mc)
    iv = _acc(sigma, t, k, epochs).delta(eps)
    assert np.all(iv.lower <= mc_up) and np.all(mc_lo <= iv.upper), (eps, iv, mc_lo, mc_up)


# -- structure: the reduction and the fallbacks -----------------------------------------------------
def test_upper_is_the_composition_of_the_blocks():
    """2 of 4: the upper bound is exactly two 1 of 2 epochs composed (MATH 13.8), the lower is the
    k of t pair's own, at most the upper."""
    up2 = _acc(1.0, 4, 2, 5).delta([0.5, 1.0, 2.0])
    blocks = pldlib.PLDAccountant("add_remove").compose(E.Sampled(E.GaussianEvent(1.0), 0.5, "random_allocation"), 20)
    ref = blocks.delta([0.5, 1.0, 2.0])
    assert np.allclose(up2.upper, ref.upper, rtol=2e-3, atol=0) and np.all(up2.upper >= ref.upper * (1 - 2e-3))
    assert np.all(up2.lower <= up2.upper)


def test_unamplified_bounds_are_the_gaussian_closed_forms():
    """The per-step pairs (other accountants; the PLD one where no lattice fits): upper = the Gaussian
    with mu^2 = k / sigma^2 per epoch (the record in k steps), lower = the epoch sums,
    mu^2 = k^2 / (t sigma^2); the PLD interval lies between those closed forms."""
    from pldlib.exact import GaussianPair
    from pldlib.sampling import dominating_pairs

    sigma, t, k, ep = 1.3, 10, 3, 4
    for b in dominating_pairs(E.Sampled(E.GaussianEvent(sigma), k / t, "random_allocation", selections=k),
                              "add_remove"):
        assert math.isclose(t * b.upper.r ** 2, k / sigma ** 2, rel_tol=1e-12)
        assert math.isclose(t * b.lower.r ** 2, k * k / (t * sigma ** 2), rel_tol=1e-12)
    up = GaussianPair(math.sqrt(ep * k) / sigma, 0.0).epsilon_bounds(np.array([1e-5]))[1][0]
    lo = GaussianPair(math.sqrt(ep * k * k / t) / sigma, 0.0).epsilon_bounds(np.array([1e-5]))[0][0]
    pld = _acc(sigma, t, k, ep).epsilon(1e-5)
    assert lo <= pld.lower <= pld.upper <= up * (1 + 1e-9)


def test_amplified_and_below_poisson_at_a_dp_sgd_shape():
    """sigma 1, 2 of 100 steps, 10 epochs, delta 1e-5: the certified interval is below Poisson's at
    the same rate (q = k/t) and far below the unamplified bound."""
    iv = _acc(1.0, 100, 2, 10).epsilon(1e-5)
    pois = pldlib.PLDAccountant("add_remove").compose(E.Sampled(E.GaussianEvent(1.0), 0.02, "poisson"), 1000).epsilon(1e-5)
    assert iv.upper < pois.lower and (iv.upper - iv.lower) / iv.upper < 0.03


# -- the interfaces ----------------------------------------------------------------------------------
def test_dp_accounting_random_allocation_event_by_its_fields():
    """dp_accounting's RandomAllocationDpEvent (pull request #414, not in a release) is read by its
    fields: one epoch, num_selected of num_steps."""
    attr = pytest.importorskip("attr")
    from dp_accounting import dp_event as D

    from pldlib.interop.dp_accounting import NeighboringRelation, PldlibAccountant

    @attr.define(frozen=True)
    class RandomAllocationDpEvent(D.DpEvent):
        event: D.DpEvent
        num_selected: int
        num_steps: int

    acc = PldlibAccountant().compose(RandomAllocationDpEvent(D.GaussianDpEvent(1.0), 2, 100), 10)
    ours = _acc(1.0, 100, 2, 10).epsilon(1e-5)
    assert acc.epsilon_interval(1e-5) == ours and acc.get_epsilon(1e-5) == ours.upper
    # k = t: every step; refusals name the reason
    full = PldlibAccountant().compose(RandomAllocationDpEvent(D.GaussianDpEvent(2.0), 3, 3), 1).get_epsilon(1e-5)
    gauss = PldlibAccountant().compose(D.GaussianDpEvent(2.0), 3).get_epsilon(1e-5)
    assert full == gauss
    for ev, what in ((RandomAllocationDpEvent(D.LaplaceDpEvent(1.0), 1, 10), "Gaussian"),
                     (RandomAllocationDpEvent(D.GaussianDpEvent(1.0), 5, 4), "num_selected"),
                     (RandomAllocationDpEvent(D.GaussianDpEvent(1.0), 0, 4), "num_selected")):
        with pytest.raises(Exception, match=what):
            PldlibAccountant().compose(ev, 1)
    with pytest.raises(Exception, match="REPLACE_SPECIAL"):
        PldlibAccountant(NeighboringRelation.REPLACE_SPECIAL).compose(
            RandomAllocationDpEvent(D.GaussianDpEvent(1.0), 1, 10), 1)


def test_cli_selections(capsys):
    from pldlib.cli import main

    args = ["epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.02", "--steps", "1000",
            "--delta", "1e-5", "--json"]
    assert main([*args, "--sampling", "random_allocation", "--selections", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    ours = _acc(1.0, 100, 2, 10).epsilon(1e-5)
    assert out["epsilon"][0]["lower"] == ours.lower and out["epsilon"][0]["upper"] == ours.upper
    assert out["params"]["selections"] == 2
    assert main([*args, "--selections", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--selections" in err


def test_calibrate_k_of_t():
    """The calibrated sigma certifies the target; sigma_lower is certified not to."""
    res = pldlib.calibrate(3.6, 1e-5, 0.02, 1000, sampling="random_allocation", selections=2)
    assert res.epsilon.upper <= 3.6
    assert _acc(res.sigma, 100, 2, 10).epsilon(1e-5).upper <= 3.6
    if res.sigma_lower is not None:
        assert _acc(res.sigma_lower, 100, 2, 10).epsilon(1e-5).lower > 3.6


# -- sweeps ------------------------------------------------------------------------------------------
def _tiny(store, **changes):
    data = {"name": "kt", "store": str(store), "methods": ["pld"], "sampling": ["poisson", "random_allocation"],
            "selections": 2, "grid": {"sigma": [1.0, 2.0], "q": [0.02], "steps": [100, 200], "delta": [1e-5]}}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_sweep_config_selections(tmp_path):
    from sweeps.config import ConfigError, parse_config
    from sweeps.plan import make_plan

    cfg = parse_config(_tiny(tmp_path / "x.zarr"))
    assert cfg.selections == 2 and cfg.canonical()["selections"] == 2
    plan = make_plan(cfg)
    assert all(plan.spec(b)["params"]["selections"] == 2 for b in plan.blocks)
    plain = parse_config(_tiny(tmp_path / "x.zarr", selections=None))
    assert "selections" not in plain.canonical() and plain.fingerprint() != cfg.fingerprint()
    assert parse_config(_tiny(tmp_path / "x.zarr", selections=1)).fingerprint() == plain.fingerprint()
    for changes, match in [({"selections": 0}, "selections"), ({"selections": 2.5}, "selections"),
                           ({"sampling": ["poisson"]}, "selections: k > 1 only with sampling random_allocation")]:
        with pytest.raises(ConfigError, match=match):
            parse_config(_tiny(tmp_path / "x.zarr", **changes))
    quick = parse_config(_tiny(tmp_path / "x.zarr", quick={"grid": {"sampling": ["poisson"]}}), quick=True)
    assert quick.selections is None


def test_a_tiny_sweep_stores_the_k_of_t_values(embedded_client, tmp_path):
    import io

    import xarray as xr

    from sweeps.config import parse_config
    from sweeps.execute import run_sweep

    store = tmp_path / "kt.zarr"
    cfg = parse_config(_tiny(store))
    run_sweep(cfg, client=embedded_client, progress=False, stream=io.StringIO())
    ds = xr.open_zarr(str(store), chunks=None)
    for s in (1.0, 2.0):
        for k in (100, 200):
            for samp, kw in (("poisson", {}), ("random_allocation", {"selections": 2})):
                ref = pldlib.account(pldlib.Gaussian(s, q=0.02, sampling=samp, **kw), steps=k).epsilon([1e-5])
                cell = ds.sel({"sigma": s, "q": 0.02, "sampling": samp, "relation": "add_remove", "method": "pld",
                               "steps": k})
                # (a sweep composes each steps value on the grid of its block: the same certified
                # interval up to the discretisation, so the two intervals meet and are as narrow)
                lo, up = float(cell["eps_lower"].values[0]), float(cell["eps_upper"].values[0])
                assert lo <= ref.upper[0] and ref.lower[0] <= up, (s, k, samp, lo, up, ref)
                assert up - lo <= 2 * (ref.upper[0] - ref.lower[0]) + 1e-3 * up
