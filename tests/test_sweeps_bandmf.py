"""Sweeps of banded matrix mechanisms (``mechanism: bandmf``): DP-SGD (one band) against BandMF
under each batch selection in one store, cell for cell equal to the library's own runs."""
import io

import numpy as np
import pytest
import xarray as xr

from pldlib.correlated import bandmf_run, bandmf_scheme_args, sqrt_toeplitz_coefs
from sweeps.config import ConfigError, parse_config
from sweeps.execute import run_sweep


def _cfg(store, **over):
    data = {"name": "bandmf_test", "store": str(store), "mechanism": "bandmf", "bands": [1, 3],
            "methods": ["pld"],
            "grid": {"sigma": [2.5], "q": [0.1], "steps": [30, 60], "delta": [1e-5, 1e-3],
                     "sampling": ["cyclic_poisson", "balls_in_bins", "b_min_sep"], "relation": "add_remove"}}
    for k, v in over.items():
        if k in data["grid"]:
            data["grid"][k] = v
        else:
            data[k] = v
    return data


def test_bandmf_config_expands_bands_into_method_variants():
    cfg = parse_config(_cfg("x.zarr"))
    assert cfg.methods == ("pld@b1", "pld@b3")
    assert cfg.options["pld@b3"]["bands"] == 3 and cfg.variants["pld@b3"] == "pld"
    assert cfg.bands == (1, 3)
    other = parse_config(_cfg("x.zarr", bands=[1, 4]))
    assert other.fingerprint() != cfg.fingerprint()


@pytest.mark.parametrize("over,field,text", [
    ({"bands": [1, 1]}, "bands", "duplicate"),
    ({"bands": 0}, "bands", ">= 1"),
    ({"sampling": ["poisson"]}, "grid.sampling[0]", "unknown value 'poisson'"),
    ({"relation": ["substitution"]}, "grid.relation[0]", "unknown value 'substitution'"),
    ({"q": [0.3]}, "grid.q", "balls-in-bins takes q = 1/bins"),
    ({"q": [0.5], "sampling": ["cyclic_poisson"]}, "grid.q", "cyclic Poisson over a cycle of 3 bands"),
    ({"methods": ["rdp"]}, "methods[0]", "certified methods only"),
    ({"grid": {"sigma": [1.0], "steps": [10], "delta": [1e-5]}}, "grid.q", "mechanism bandmf needs"),
])
def test_bandmf_config_errors_name_the_field(over, field, text):
    with pytest.raises(ConfigError) as e:
        parse_config(_cfg("x.zarr", **over))
    assert e.value.field == field and text in e.value.problem


def test_bands_only_with_bandmf():
    with pytest.raises(ConfigError, match="bands: only with mechanism bandmf"):
        parse_config({"name": "g", "mechanism": "gaussian", "bands": 4,
                      "grid": {"sigma": [1.0], "steps": [10], "delta": [1e-5]}})


def test_scheme_args_reach_the_batch_fraction():
    k = 4
    a = bandmf_scheme_args("cyclic_poisson", 0.05, k)
    assert a["q"] / k == pytest.approx(0.05)
    assert bandmf_scheme_args("balls_in_bins", 0.05, k) == {"bins": 20}
    b = bandmf_scheme_args("b_min_sep", 0.05, k)
    p = b["q"]
    assert p / (1 + (k - 1) * p) == pytest.approx(0.05) and b["min_sep"] == k
    assert np.linalg.norm(sqrt_toeplitz_coefs(5)) == pytest.approx(1.0)
    c = sqrt_toeplitz_coefs(4) / sqrt_toeplitz_coefs(4)[0]
    np.testing.assert_allclose(c, [1.0, 0.5, 0.375, 0.3125])


def test_bandmf_sweep_cells_equal_library_runs(embedded_client, tmp_path):
    cfg = parse_config(_cfg(tmp_path / "b.zarr"))
    rep = run_sweep(cfg, client=embedded_client, progress=False, stream=io.StringIO())
    assert rep is not None
    ds = xr.open_zarr(str(tmp_path / "b.zarr"))
    assert int((ds["status"] == 1).sum()) == ds["status"].size  # every cell answered
    for s in cfg.sampling:
        for m, bands in (("pld@b1", 1), ("pld@b3", 3)):
            for k in cfg.steps:
                iv = bandmf_run(2.5, k, bands, s, 0.1).epsilon(np.array(cfg.delta))
                cell = ds.sel({"sigma": 2.5, "q": 0.1, "steps": k, "sampling": s, "relation": "add_remove",
                               "method": m})
                np.testing.assert_array_equal(cell["eps_upper"].values, iv.upper)
                np.testing.assert_array_equal(cell["eps_lower"].values, iv.lower)
    # one band is DP-SGD: cyclic Poisson over one band is Poisson sampling at q
    one = ds.sel({"sigma": 2.5, "q": 0.1, "steps": 60, "sampling": "cyclic_poisson", "relation": "add_remove",
                  "method": "pld@b1"})
    import pldlib
    dpsgd = pldlib.account(pldlib.Gaussian(sigma=2.5, q=0.1, sampling="poisson"), steps=60).epsilon(1e-5)
    assert float(one["eps_upper"].sel(delta=1e-5)) == pytest.approx(dpsgd.upper, rel=1e-9)
    # the campaign report compares a method only with methods of its own band count: different band
    # counts are different mechanisms, so one band's upper end below four bands' lower end is no violation
    from sweeps.campaign import analyse

    res, _, _ = analyse(str(tmp_path / "b.zarr"))
    assert res["grouped_by_bands"] is True
    assert res["violations"]["ours_below_certified_lower"] == 0 and res["violations"]["counts"] == {}
    assert res["tightness"] == {}
    assert np.any(ds["eps_upper"].sel({"method": "pld@b1"}).values
                  < ds["eps_lower"].sel({"method": "pld@b3"}).values)  # (which a flat comparison would flag)
