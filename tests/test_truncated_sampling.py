"""``sampling="truncated_poisson"`` as a sampling scheme name (a capped Poisson batch: docs/MATH.md 2.6).

The mechanism ``Gaussian(sigma, q=q, sampling="truncated_poisson", batch_size=B, dataset_size=n)``
builds :class:`pldlib.events.TruncatedPoissonGaussianEvent`; the name is a registered scheme (CLI
``--sampling``, sweep configs), with ``--batch-size`` / ``--dataset-size`` and the top-level
``batch_size:`` / ``dataset_size:`` of a sweep config.  The pair itself is tested in
tests/test_truncated_poisson.py.
"""
from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
import xarray as xr

import pldlib
from pldlib import GaussianEvent, PLDAccountant, Sampled, cli
from pldlib.events import TruncatedPoissonGaussianEvent
from pldlib.sampling import sampling_names, scheme_names

TP = "truncated_poisson"
SIGMA, Q, N, B = 1.0, 0.01, 10_000, 120


def capped(**kw):
    return pldlib.Gaussian(**{"sigma": SIGMA, "q": Q, "sampling": TP, "batch_size": B, "dataset_size": N, **kw})


# -- the mechanism ------------------------------------------------------------------------------
@pytest.mark.parametrize("relation", ["add_remove", "remove", "add"])
def test_the_mechanism_route_is_the_event_route(relation):
    m = capped(relation=relation)
    assert m.event == TruncatedPoissonGaussianEvent(SIGMA, Q, N, B)
    ours = pldlib.account(m, steps=500)
    ref = PLDAccountant(relation).compose(TruncatedPoissonGaussianEvent(SIGMA, Q, N, B), 500)
    for d in (1e-5, 1e-7):
        a, b = ours.epsilon(d), ref.epsilon(d)
        assert (a.lower, a.upper) == (b.lower, b.upper)
    a, b = ours.delta(1.0), ref.delta(1.0)
    assert (a.lower, a.upper) == (b.lower, b.upper)


def test_a_cap_that_never_cuts_is_poisson_sampling_exactly():
    m = capped(batch_size=N)  # (a batch never holds more than the n records)
    assert m.event.truncation_probability == 0.0
    ours = pldlib.account(m, steps=1000).epsilon([1e-6, 1e-5])
    ref = pldlib.account(pldlib.Gaussian(SIGMA, q=Q, sampling="poisson"), steps=1000).epsilon([1e-6, 1e-5])
    assert np.array_equal(ours.lower, ref.lower) and np.array_equal(ours.upper, ref.upper)


def test_the_name_is_a_registered_scheme():
    import sweeps.config

    assert TP in scheme_names() and TP in sampling_names()
    assert TP in cli.SAMPLINGS and TP in sweeps.config.SAMPLINGS
    # the pure-data Sampled form has no batch cap: refused, pointing to the mechanism's arguments
    with pytest.raises(pldlib.UnsupportedEventError, match="batch_size=B, dataset_size=n"):
        PLDAccountant().compose(Sampled(GaussianEvent(1.0), 0.1, TP), 10).epsilon(1e-5)
    from pldlib.web import compute

    assert TP not in compute.SAMPLINGS  # (the calculator page offers the atlas's schemes only)


@pytest.mark.parametrize("kw,name", [
    ({"batch_size": None}, "batch_size"), ({"dataset_size": None}, "dataset_size"),
    ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"), ({"batch_size": True}, "batch_size"),
    ({"dataset_size": 0}, "dataset_size"), ({"dataset_size": "100"}, "dataset_size"),
    ({"group": 2}, "group"),
])
def test_bad_or_missing_settings_are_refused_by_name(kw, name):
    with pytest.raises(ValueError, match=name):
        capped(**kw)


@pytest.mark.parametrize("sampling,q", [("poisson", 0.1), ("wor", 0.1), ("none", 1.0), ("shuffle", 0.1)])
def test_the_settings_are_refused_with_other_schemes(sampling, q):
    for name in ("batch_size", "dataset_size"):
        with pytest.raises(ValueError, match=f"{name}: only for sampling='truncated_poisson'"):
            pldlib.Gaussian(1.0, q=q, sampling=sampling, **{name: 10})


def test_non_gaussian_noise_and_substitution_are_refused():
    with pytest.raises(ValueError, match="Gaussian noise only"):
        pldlib.Laplace(1.0, q=Q, sampling=TP, batch_size=B, dataset_size=N)
    with pytest.raises(pldlib.UnsupportedEventError, match="substitution"):
        pldlib.account(capped(relation="substitution"), steps=10).epsilon(1e-5)
    # whole floats are integers (as YAML and command lines give them)
    assert capped(batch_size=120.0).batch_size == 120 and "batch_size=120" in repr(capped())
    assert "batch_size" not in repr(pldlib.Gaussian(1.0, q=Q, sampling="poisson"))


# -- the command line ---------------------------------------------------------------------------
ARGS = ["--mechanism", "gaussian", "--sigma", "1", "--q", "0.01", "--steps", "200", "--delta", "1e-5"]
TRUNC = ["--sampling", TP, "--batch-size", "120", "--dataset-size", "10000"]


def run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_epsilon_matches_the_api_and_reports_the_settings(capsys):
    code, out, err = run(["epsilon", *ARGS, *TRUNC, "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["params"]["sampling"] == TP and d["params"]["batch_size"] == B and d["params"]["dataset_size"] == N
    ref = pldlib.account(capped(), steps=200).epsilon(1e-5)
    assert (d["epsilon"][0]["lower"], d["epsilon"][0]["upper"]) == (ref.lower, ref.upper)


@pytest.mark.parametrize("cmd,argv,flag", [
    ("epsilon", ["--sampling", TP, "--batch-size", "120"], "--dataset-size"),
    ("epsilon", ["--sampling", TP, "--dataset-size", "10000"], "--batch-size"),
    ("epsilon", ["--sampling", "poisson", "--batch-size", "120"], "--batch-size"),
    ("epsilon", ["--dataset-size", "10000"], "--dataset-size"),
    ("epsilon", ["--sampling", TP, "--batch-size", "0", "--dataset-size", "10000"], "--batch-size"),
    ("epsilon", ["--sampling", TP, "--batch-size", "2.5", "--dataset-size", "10000"], "--batch-size"),
    ("epsilon", ["--sampling", TP, "--batch-size", "120", "--dataset-size", "0"], "--dataset-size"),
    ("calibrate", ["--sampling", TP, "--batch-size", "120"], "--dataset-size"),
    ("calibrate", ["--sampling", "wor", "--dataset-size", "10000"], "--dataset-size"),
    ("calibrate", ["--batch-size", "120"], "--batch-size"),
])
def test_cli_usage_errors_name_the_flag(cmd, argv, flag, capsys):
    base = ARGS if cmd == "epsilon" else ["--epsilon", "2", "--delta", "1e-5", "--q", "0.01", "--steps", "100"]
    code, out, err = run([cmd, *base, *argv], capsys)
    assert code == cli.EXIT_USAGE and out == ""
    assert err.startswith(f"pldlib: error: argument {flag}"), err


def test_cli_refuses_substitution_and_groups(capsys):
    for extra, word in ((["--relation", "substitution"], "substitution"), (["--group", "2"], "group")):
        code, _, err = run(["epsilon", *ARGS, *TRUNC, *extra], capsys)
        assert code == cli.EXIT_USAGE and word in err, err


def test_cli_calibrate(capsys):
    code, out, err = run(["calibrate", "--epsilon", "2", "--delta", "1e-5", "--q", "0.01", "--steps", "100",
                          *TRUNC, "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["params"]["batch_size"] == B and d["params"]["dataset_size"] == N and d["params"]["sampling"] == TP
    sigma = d["value"]
    iv = pldlib.account(capped(sigma=sigma, q=0.01), steps=100).epsilon(1e-5)
    assert iv.upper <= 2.0
    code, _, err = run(["calibrate", "--epsilon", "2", "--delta", "1e-5", "--q", "0.01", "--steps", "100",
                        *TRUNC, "--table", "x.npz"], capsys)
    assert code == cli.EXIT_USAGE and "--table" in err


# -- sweeps -------------------------------------------------------------------------------------
def tiny(store, **changes):
    data = {"name": "capped", "store": str(store), "methods": ["pld"], "sampling": ["poisson", TP],
            "batch_size": B, "dataset_size": N,
            "grid": {"sigma": [1.0, 2.0], "q": [0.01], "steps": [10, 100], "delta": [1e-5, 1e-7]}}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_a_tiny_sweep_runs_and_stores_the_mechanism_values(embedded_client, tmp_path):
    from sweeps.config import parse_config
    from sweeps.execute import run_sweep

    store = tmp_path / "c.zarr"
    cfg = parse_config(tiny(store))
    run_sweep(cfg, client=embedded_client, progress=False, stream=io.StringIO())
    ds = xr.open_zarr(str(store), chunks=None)
    assert ds.attrs["sweeps_fingerprint"] == cfg.fingerprint()
    for s in (1.0, 2.0):
        for samp in ("poisson", TP):
            kw = {"batch_size": B, "dataset_size": N} if samp == TP else {}
            for k in (10, 100):
                ref = pldlib.account(pldlib.Gaussian(s, q=0.01, sampling=samp, **kw), steps=k).epsilon([1e-5, 1e-7])
                cell = ds.sel({"sigma": s, "q": 0.01, "sampling": samp, "relation": "add_remove", "method": "pld",
                               "steps": k})
                np.testing.assert_array_equal(cell["eps_upper"].values, ref.upper)
                np.testing.assert_array_equal(cell["eps_lower"].values, ref.lower)
    # the cap costs privacy at sigma 1 (many batches are cut): not the Poisson numbers
    up = ds["eps_upper"].sel({"sigma": 1.0, "q": 0.01, "steps": 100, "delta": 1e-5, "relation": "add_remove",
                              "method": "pld"})
    assert float(up.sel(sampling=TP)) > float(up.sel(sampling="poisson"))


def test_sweep_config_settings_are_validated_by_name(tmp_path):
    from sweeps.config import ConfigError, parse_config

    for changes, field in [({"dataset_size": None}, "dataset_size"), ({"batch_size": None}, "batch_size"),
                           ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"),
                           ({"dataset_size": 0}, "dataset_size"), ({"batch_size": "many"}, "batch_size"),
                           ({"sampling": ["poisson"]}, "batch_size"),
                           ({"mechanism": "laplace"}, "sampling")]:
        with pytest.raises(ConfigError) as e:
            parse_config(tiny(tmp_path / "x.zarr", **changes))
        assert e.value.field == field, (changes, str(e.value))
    with pytest.raises(ConfigError, match="dataset_size: required"):
        parse_config(tiny(tmp_path / "x.zarr", dataset_size=None))
    # not a grid axis
    with pytest.raises(ConfigError, match="grid.batch_size: unknown axis"):
        d = tiny(tmp_path / "x.zarr")
        d["grid"]["batch_size"] = [B]
        parse_config(d)
    with pytest.raises(ConfigError, match="report.tradeoff_curve.sampling"):
        parse_config(tiny(tmp_path / "x.zarr", report={"tradeoff_curve": {"sampling": TP}}))


def test_sweep_fingerprints_change_only_when_the_settings_are_given(tmp_path):
    from sweeps.config import FINGERPRINT_EXCLUDED_OPTIONS, parse_config
    from sweeps.plan import make_plan

    def rebuilt(cfg, extra):  # the fingerprint as built before truncated_poisson existed, plus extra
        c = cfg.canonical()
        opts = {m: {("interval" if k == "spacing" else k): v for k, v in o.items()
                    if k not in FINGERPRINT_EXCLUDED_OPTIONS} for m, o in c["options"].items()}
        ident = {"format": c["format"], "mechanism": c["mechanism"], "methods": c["methods"], "grid": c["grid"],
                 "options": opts, **extra}
        return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    plain = parse_config(tiny(tmp_path / "x.zarr", sampling=["poisson"], batch_size=None, dataset_size=None))
    assert plain.fingerprint() == rebuilt(plain, {})
    assert "batch_size" not in plain.canonical() and plain.truncation() == {}
    cfg = parse_config(tiny(tmp_path / "x.zarr"))
    assert cfg.fingerprint() == rebuilt(cfg, {"batch_size": B, "dataset_size": N})
    assert cfg.canonical()["batch_size"] == B
    plan = make_plan(cfg)
    spec = plan.spec(plan.blocks[0])  # (what the task reads)
    assert spec["params"]["batch_size"] == B and spec["params"]["dataset_size"] == N
    assert parse_config(tiny(tmp_path / "x.zarr", batch_size=B + 1)).fingerprint() != cfg.fingerprint()
    # a quick variant without the scheme drops the settings; one with it keeps them
    quick = parse_config(tiny(tmp_path / "x.zarr", quick={"grid": {"sampling": ["poisson"]}}), quick=True)
    assert quick.truncation() == {} and quick.fingerprint() == rebuilt(quick, {})
    quick = parse_config(tiny(tmp_path / "x.zarr", quick={"grid": {"steps": [10]}}), quick=True)
    assert quick.truncation() == {"batch_size": B, "dataset_size": N}
