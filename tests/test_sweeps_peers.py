"""Peer accountants, clt/spa estimates, variants, unsupported cells and --quick configs in sweeps."""
import importlib.util
import io

import numpy as np
import pytest

import pldlib
from sweeps.cli import main
from sweeps.config import ConfigError, load_config, parse_config
from sweeps.execute import run_sweep
from sweeps.store import STATUS_OK, STATUS_UNSUPPORTED, open_dataset
from sweeps.testing import write_config


def cfg(store, **changes):
    data = {"name": "peers", "store": str(store), "mechanism": "gaussian", "methods": ["pld"],
            "grid": {"sigma": [1.0], "q": [0.01], "steps": [10, 100], "delta": [1e-5, 1e-8],
                     "sampling": ["poisson"], "relation": ["add_remove"]},
            "options": {"pld": {"spacing": 2e-3}}}
    for k, v in changes.items():
        if k in data["grid"]:
            data["grid"][k] = v
        else:
            data[k] = v
    return data


@pytest.fixture(scope="module")
def client(embedded_client):  # tests/conftest.py: the shared in-process cluster
    return embedded_client


def run(client, data):
    return run_sweep(parse_config(data), client=client, progress=False, stream=io.StringIO())


def block(ds, **sel):
    return ds.sel({k: v for k, v in sel.items()}).squeeze()


# -- config-time errors ------------------------------------------------------------
def test_peer_not_installed_is_a_config_error(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "prv_accountant" else real(name, *a))
    data = cfg(tmp_path / "s.zarr", methods=["pld", "prv_accountant"])
    with pytest.raises(ConfigError) as ei:
        parse_config(data)
    assert ei.value.field == "methods[1]"
    assert "prv_accountant" in str(ei.value) and "pip install 'pldlib[peers]'" in str(ei.value)
    path = write_config(tmp_path / "c.yaml", data)
    assert main(["run", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "methods[1]" in err[0] and "pldlib[peers]" in err[0]
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("method,options,field", [
    ("dp_accounting", {"value_discretization_interval": -1}, "options.dp_accounting.value_discretization_interval"),
    ("dp_accounting", {"value_discretization_interval": 2.0}, "options.dp_accounting.value_discretization_interval"),
    ("dp_accounting", {"use_connect_dots": "yes"}, "options.dp_accounting.use_connect_dots"),
    ("dp_accounting", {"interval": 1e-3}, "options.dp_accounting.interval"),
    ("prv_accountant", {"eps_error": 0}, "options.prv_accountant.eps_error"),
    ("prv_accountant", {"delta_error": 1.5}, "options.prv_accountant.delta_error"),
    ("prv_accountant", {"max_points": 0.5}, "options.prv_accountant.max_points"),
    ("clt", {"interval": 1e-3}, "options.clt.interval"),
])
def test_bad_peer_options_name_the_field(tmp_path, method, options, field, capsys):
    if method in ("dp_accounting", "prv_accountant"):
        importlib.import_module(method)  # a test dependency (extra "test"): never skipped
    data = cfg(tmp_path / "s.zarr", methods=["pld", method], options={method: options})
    with pytest.raises(ConfigError) as ei:
        parse_config(data)
    assert ei.value.field == field
    assert main(["run", write_config(tmp_path / "c.yaml", data)]) == 2
    assert field in capsys.readouterr().err


def test_variants_and_quick_validation(tmp_path, capsys):
    bad = [
        (dict(variants={"pld": "pld"}), "variants.pld"),
        (dict(variants={"fine": "nosuch"}), "variants.fine"),
        (dict(methods=["pld", "fine"]), "methods[1]"),
        (dict(methods=["pld", "fine"], variants={"fine": "pld"},
              options={"pld": {"spacing": 2e-3}, "fine": {"spacing": -1}}), "options.fine.spacing"),
        (dict(quick={"grid": {"temperature": [1]}}), "quick.grid.temperature"),
        (dict(quick={"grid": {"sigma": [-1.0]}}), "quick.grid.sigma[0]"),
        (dict(quick={"steps": [1]}), "quick.steps"),
        (dict(report={"eps_targets": [0]}), "report.eps_targets[0]"),
    ]
    for changes, field in bad:
        with pytest.raises(ConfigError) as ei:
            parse_config(cfg(tmp_path / "s.zarr", **changes))
        assert ei.value.field == field, (changes, str(ei.value))
    # --quick without a quick: section
    path = write_config(tmp_path / "noquick.yaml", cfg(tmp_path / "s.zarr"))
    assert main(["run", path, "--quick"]) == 2
    assert "quick" in capsys.readouterr().err
    # the quick variant: its own name and store, the overridden axes, the rest kept
    q = load_config(write_config(tmp_path / "q.yaml", cfg(tmp_path / "s.zarr", quick={"grid": {"steps": [5]}})),
                    quick=True)
    assert q.name == "peers-quick" and q.store == str(tmp_path / "s_quick.zarr")
    assert q.steps == (5,) and q.delta == (1e-5, 1e-8) and q.options["pld"]["spacing"] == 2e-3


# -- results ------------------------------------------------------------------------
def test_clt_is_an_estimate_and_spa_stores_its_estimate(client, tmp_path):
    from pldlib.methods.clt import account_clt
    from pldlib.methods.spa import account_spa

    data = cfg(tmp_path / "e.zarr", methods=["pld", "clt", "spa"])
    rep = run(client, data)
    assert rep.complete
    ds = open_dataset(str(tmp_path / "e.zarr"))
    steps, deltas = [10, 100], [1e-5, 1e-8]
    mech = pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson")
    c = block(ds, method="clt")
    assert (c.status.values == STATUS_OK).all()
    assert np.isnan(c.eps_lower.values).all() and np.isnan(c.eps_upper.values).all()
    want = np.array([[account_clt(mech, steps=k).epsilon(d).estimate for d in deltas] for k in steps])
    np.testing.assert_allclose(c.eps_estimate.transpose("steps", "delta").values, want, rtol=1e-9)
    s = block(ds, method="spa")
    lo, est, up = account_spa(mech, 1, on_edge="flag").epsilon_grid(np.array(steps), np.array(deltas))
    np.testing.assert_allclose(s.eps_estimate.transpose("steps", "delta").values, est, rtol=1e-12)
    np.testing.assert_allclose(s.eps_upper.transpose("steps", "delta").values, up, rtol=1e-12)
    p = block(ds, method="pld")
    assert np.isnan(p.eps_estimate.values).all()  # pld gives no estimate
    # clt never shows up as a bound in the tables: every cell reads "~x (estimate)"
    from sweeps.report import show_text

    text = show_text(str(tmp_path / "e.zarr"), {"method": ["clt"]})
    assert text.count("(estimate)") == 4 and "failed" not in text


def test_dp_accounting_cells_and_unsupported(client, tmp_path):
    import dp_accounting  # noqa: F401  (a test dependency: never skipped)
    from dp_accounting.pld import privacy_loss_distribution as dpl

    store = tmp_path / "d.zarr"
    data = cfg(store, methods=["pld", "dp_accounting"], sampling=["poisson", "wor"],
               relation=["add_remove", "remove", "substitution"],
               options={"pld": {"spacing": 2e-3}, "dp_accounting": {"value_discretization_interval": 2e-3}})
    rep = run(client, data)
    assert rep.complete and rep.failed == 0  # unsupported cells are answers, not failures
    ds = open_dataset(str(store))
    steps, deltas = [10, 100], [1e-5, 1e-8]
    for rel, nr in (("add_remove", dpl.NeighborRel.ADD_OR_REMOVE_ONE), ("substitution", dpl.NeighborRel.REPLACE_ONE)):
        b = block(ds, method="dp_accounting", sampling="poisson", relation=rel)
        assert (b.status.values == STATUS_OK).all(), str(b.error.values)
        pes = dpl.from_gaussian_mechanism(1.0, sampling_prob=0.01, value_discretization_interval=2e-3,
                                          neighboring_relation=nr)
        opt = dpl.from_gaussian_mechanism(1.0, sampling_prob=0.01, value_discretization_interval=2e-3,
                                          pessimistic_estimate=False, use_connect_dots=False,
                                          neighboring_relation=nr)
        up = [[pes.self_compose(k).get_epsilon_for_delta(d) for d in deltas] for k in steps]
        lo = [[opt.self_compose(k).get_epsilon_for_delta(d) for d in deltas] for k in steps]
        np.testing.assert_allclose(b.eps_upper.transpose("steps", "delta").values, up, rtol=1e-12)
        np.testing.assert_allclose(b.eps_lower.transpose("steps", "delta").values, lo, rtol=1e-12)
        ours = block(ds, method="pld", sampling="poisson", relation=rel)
        assert (b.eps_upper.values >= ours.eps_lower.values).all()
    for smp, rel, words in (("wor", "add_remove", "without replacement"),
                            ("poisson", "remove", "'remove' direction")):
        b = block(ds, method="dp_accounting", sampling=smp, relation=rel)
        assert (b.status.values == STATUS_UNSUPPORTED).all()
        assert np.isnan(b.eps_upper.values).all() and np.isnan(b.eps_lower.values).all()
        assert words in str(b.error.values)
    # our own method answers every combination
    assert (block(ds, method="pld").status.values == STATUS_OK).all()
    # a second run has nothing to do: unsupported cells are final
    rep2 = run(client, data)
    assert rep2.submitted == 0 and rep2.complete


def test_prv_accountant_cells_and_unsupported(client, tmp_path):
    import prv_accountant  # noqa: F401  (a test dependency: never skipped)
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    store = tmp_path / "p.zarr"
    data = cfg(store, methods=["pld", "prv_accountant"], relation=["add_remove", "remove"], steps=[100],
               options={"pld": {"spacing": 2e-3}, "prv_accountant": {"eps_error": 0.05}})
    rep = run(client, data)
    assert rep.complete
    ds = open_dataset(str(store))
    b = block(ds, method="prv_accountant", relation="remove")
    assert (b.status.values == STATUS_OK).all(), str(b.error.values)
    acc = PRVAccountant([PoissonSubsampledGaussianMechanism(0.01, 1.0)], eps_error=0.05, delta_error=1e-8 / 1000,
                        max_self_compositions=[100])
    comp = acc.compute_composition([100])
    for j, d in enumerate([1e-5, 1e-8]):
        lo, est, up = comp.compute_epsilon(d, 1e-8 / 1000, 0.05)
        assert b.eps_lower.values[j] == pytest.approx(lo, rel=1e-12)
        assert b.eps_estimate.values[j] == pytest.approx(est, rel=1e-12)
        assert b.eps_upper.values[j] == pytest.approx(up, rel=1e-12)
    a = block(ds, method="prv_accountant", relation="add_remove")
    assert (a.status.values == STATUS_UNSUPPORTED).all() and "remove pair" in str(a.error.values)


def test_prv_accountant_refusal_is_a_recorded_failure(client, tmp_path):
    import prv_accountant  # noqa: F401  (a test dependency: never skipped)
    store = tmp_path / "r.zarr"
    data = cfg(store, methods=["prv_accountant"], relation=["remove"], steps=[100],
               options={"prv_accountant": {"max_points": 1000}})
    rep = run(client, data)
    assert rep.failed == 1 and not rep.complete
    b = block(open_dataset(str(store)), method="prv_accountant")
    assert (b.status.values == 2).all() and "refused" in str(b.error.values)


def test_variants_run_their_method_with_their_options(client, tmp_path):
    store = tmp_path / "v.zarr"
    data = cfg(store, methods=["pld", "pld_coarse"], variants={"pld_coarse": "pld"},
               options={"pld": {"spacing": 1e-3}, "pld_coarse": {"spacing": 4e-3}})
    assert run(client, data).complete
    ds = open_dataset(str(store))
    fine, coarse = block(ds, method="pld"), block(ds, method="pld_coarse")
    wf = (fine.eps_upper - fine.eps_lower).values
    wc = (coarse.eps_upper - coarse.eps_lower).values
    assert (wc > 2 * wf).all()  # width ~ h^2: a 4x coarser grid is much wider
    assert (np.maximum(fine.eps_lower, coarse.eps_lower) <= np.minimum(fine.eps_upper, coarse.eps_upper)).all()
    for k, i in ((100, 1), (10, 0)):
        r = pldlib.account(pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson"), steps=k,
                           spacing=4e-3).epsilon([1e-5, 1e-8])
        c = coarse.isel(steps=i)
        assert (c.eps_lower.values <= r.upper).all() and (r.lower <= c.eps_upper.values).all()


def test_prv_cells_are_answered_at_the_mesh_asked_never_sharpened():
    # a PRV cell must not depend on the time that sharpening found (the PRV accountant's automatic
    # accuracy sharpens wide answers for direct users), so sweeps build it with sharpen=False: its
    # cells equal the unsharpened accountant's at the default mesh
    from pldlib import events as E
    from pldlib.methods.prv import PRVAccountant
    from sweeps.methods import accountant_for

    acc = accountant_for("prv", "remove", {"eps_error": None, "delta_error": None, "max_bins": None})
    assert acc.sharpen is False
    ev = E.Sampled(E.GaussianEvent(2.0), 0.01, "poisson")
    lo, _est, up, _ = acc.epsilon_per_steps(ev, [1000], [1e-5])
    plain = PRVAccountant("remove", sharpen=False).compose(ev, 1000).epsilon(1e-5)
    assert (lo[0, 0], up[0, 0]) == (plain.lower, plain.upper)
    assert (up[0, 0] - lo[0, 0]) / up[0, 0] > 0.01  # (wide enough that sharpening would have changed it)
