"""sweeps runs on an in-process Dask cluster: values, layout, resume, failures, retries."""
import io
import json
import threading

import dask
import numpy as np
import pytest
import xarray as xr
import yaml

from pldlib.methods import register_method
from sweeps.config import parse_config
from sweeps.execute import run_sweep
from sweeps.plan import BLOCK_DIMS, DIMS, make_plan
from sweeps.lease import prepare_store
from sweeps.store import BlockWriter, StoreError
from sweeps.testing import CodedAccountant, direct_eps, small_config, tree_snapshot


def quiet():
    return {"progress": False, "stream": io.StringIO()}


@pytest.fixture(scope="module")
def cluster(embedded_cluster):  # tests/conftest.py: the shared in-process cluster
    return embedded_cluster


@pytest.fixture(scope="module")
def client(embedded_client):
    return embedded_client


@pytest.fixture(scope="module")
def small_run(client, tmp_path_factory):
    store = tmp_path_factory.mktemp("small") / "s.zarr"
    cfg = parse_config(small_config(store))
    rep = run_sweep(cfg, client=client, **quiet())
    return cfg, str(store), rep


def open_(store):
    return xr.open_zarr(store, chunks=None)


# -- test-only methods (this process only: the cluster runs in-process) ----------------
FLAKY_CALLS = {}
_lock = threading.Lock()


class Fake(CodedAccountant):
    """test: eps = code of the cell's coordinates; one cell of the sigma = 2 blocks unanswered"""

    def __init__(self, relation="add_remove", *, negate=False, bad_sigma=2.0):
        super().__init__(relation, negate=negate, bad_sigma=bad_sigma)


class Fake2(CodedAccountant):
    """test: like fake, negated"""

    def __init__(self, relation="add_remove", *, negate=True, bad_sigma=None):
        super().__init__(relation, negate=negate, bad_sigma=bad_sigma)


class Flaky(Fake2):
    """test: OSError on the first call per block"""

    def epsilon_per_steps(self, event, steps, deltas):
        base = getattr(event, "event", event)
        key = (base.sigma, self.relation)
        with _lock:
            FLAKY_CALLS[key] = FLAKY_CALLS.get(key, 0) + 1
            n = FLAKY_CALLS[key]
        if n == 1:
            raise ConnectionResetError("transient: connection reset by peer")
        return super().epsilon_per_steps(event, steps, deltas)


register_method("fake", Fake, kind="certified", summary="test: eps = code of the cell's coordinates")
register_method("fake2", Fake2, kind="certified", summary="test: like fake, negated")
register_method("flaky", Flaky, kind="certified", summary="test: OSError on the first call per block")


# -- tests -----------------------------------------------------------------------------
def test_cells_equal_direct_library_calls(small_run):
    cfg, store, rep = small_run
    assert rep.submitted == 4 and rep.ok == 4 and rep.failed == 0 and rep.complete
    ds = open_(store)
    assert (ds.status.values == 1).all()
    lo, up = direct_eps(cfg)  # the calls a block makes: one accountant per steps, all deltas
    np.testing.assert_array_equal(ds.eps_lower.transpose(*DIMS).values, lo)
    np.testing.assert_array_equal(ds.eps_upper.transpose(*DIMS).values, up)
    # one full accounting per cell agrees as a certified interval
    lo1, up1 = direct_eps(cfg, per_cell=True)
    assert (np.maximum(lo, lo1) <= np.minimum(up, up1)).all()
    np.testing.assert_allclose(up, up1, rtol=1e-3)


def test_store_layout_and_attrs(small_run):
    cfg, store, _ = small_run
    ds = open_(store)
    assert set(ds.dims) == set(DIMS)
    for v in ("eps_lower", "eps_upper", "seconds", "status"):
        assert ds[v].dims == DIMS
        assert ds[v].encoding["chunks"] == (1, 1, 3, 2, 1, 1, 1)
    assert ds.eps_upper.dtype == np.float64 and ds.status.dtype == np.int8
    for v in ("error", "run", "finished_at", "host"):
        assert ds[v].dims == BLOCK_DIMS
    assert (ds.error.values == "").all() and (ds.run.values == 1).all()
    assert (ds.seconds.values > 0).all()
    a = ds.attrs
    assert a["sweeps_fingerprint"] == cfg.fingerprint()
    assert yaml.safe_load(a["sweeps_config"])["grid"]["steps"] == [1, 10, 100]
    from sweeps.provenance import package_version

    assert a["pldlib_version"] == package_version()
    assert a["created"] and a["started"] and a["finished"] and a["complete"] is True
    assert json.loads(a["machine"])["cores"] >= 1
    assert "0 = missing" in a["status_codes"] and "2 = failed" in a["status_codes"]
    runs = json.loads(a["runs"])
    assert len(runs) == 1 and runs[0]["state"] == "finished" and runs[0]["submitted"] == 4


def test_resume_complete_store_is_noop(small_run, client):
    cfg, store, _ = small_run
    before = tree_snapshot(store)
    rep = run_sweep(cfg, client=client, **quiet())
    assert rep.submitted == 0 and rep.already_done == 4 and rep.complete
    assert tree_snapshot(store) == before


def test_other_config_refused_store_untouched(small_run, client):
    cfg, store, _ = small_run
    before = tree_snapshot(store)
    other = parse_config(small_config(store, delta=[1e-5, 1e-9]))
    with pytest.raises(StoreError, match="different config"):
        run_sweep(other, client=client, **quiet())
    assert tree_snapshot(store) == before


def test_failed_blocks_recorded_others_finish(small_run, client, tmp_path):
    cfg0, store0, _ = small_run
    d = small_config(tmp_path / "f.zarr")
    d["options"]["pld"]["fail"] = {"sigma": 2.0}  # test-only: raise in the sigma=2 blocks
    cfg = parse_config(d)
    rep = run_sweep(cfg, client=client, **quiet())
    assert rep.submitted == 4 and rep.ok == 2 and rep.failed == 2 and not rep.complete
    ds, ref = open_(cfg.store), open_(store0)
    bad = ds.sel(sigma=2.0)
    assert (bad.status.values == 2).all()
    assert np.isnan(bad.eps_upper.values).all() and np.isnan(bad.eps_lower.values).all()
    assert all("RuntimeError: test-only 'fail'" in str(t) for t in bad.error.values.ravel())
    good = ds.sel(sigma=1.0)
    assert (good.status.values == 1).all() and (good.error.values == "").all()
    np.testing.assert_array_equal(good.eps_upper.values, ref.sel(sigma=1.0).eps_upper.values)
    # a second run retries the failed blocks only
    rep2 = run_sweep(cfg, client=client, **quiet())
    assert rep2.submitted == 2 and rep2.already_done == 2 and rep2.failed == 2
    assert open_(cfg.store).attrs["complete"] is False
    assert sorted(int(v) for v in open_(cfg.store).run.values.ravel()) == [1, 1, 2, 2]


def test_values_land_in_their_cells_and_cell_failures(client, tmp_path):
    d = small_config(tmp_path / "m.zarr", methods=["fake", "fake2"], sigma=[1.0, 2.0, 3.0],
                     q=[0.5, 1.0], sampling=["poisson"], relation=["add", "substitution"],
                     steps=[1, 10, 100, 1000], delta=[1e-5, 1e-8, 1e-12])
    d["options"] = {}
    cfg = parse_config(d)
    rep = run_sweep(cfg, client=client, **quiet())
    assert rep.submitted == 3 * 2 * 2 * 2
    ds = open_(cfg.store)
    rel = {"add": 0.1, "substitution": 0.3}
    for s in cfg.sigma:
        for q in cfg.q:
            for r in cfg.relation:
                for k in cfg.steps:
                    for dl in cfg.delta:
                        c = ds.sel(sigma=s, q=q, relation=r, steps=k, delta=dl, sampling="poisson")
                        want = s * 1e6 + q * 1e4 + k + dl + rel[r]
                        f = c.sel({"method": "fake"})
                        if s == 2.0 and k == 10 and dl == 1e-8:
                            assert int(f.status) == 2 and np.isnan(f.eps_upper) and np.isnan(f.eps_lower)
                        else:
                            assert int(f.status) == 1
                            assert float(f.eps_lower) == want and float(f.eps_upper) == want + 0.5
                        g = c.sel({"method": "fake2"})
                        want2 = 1e6 + q * 1e4 + k + dl + rel[r]
                        assert int(g.status) == 1 and float(g.eps_upper) == -want2
    err = ds.error.sel({"method": "fake"})
    assert all(str(t) == "steps=10: fake precision limit" for t in err.sel(sigma=2.0).values.ravel())
    assert (err.sel(sigma=[1.0, 3.0]).values == "").all()
    assert (ds.error.sel({"method": "fake2"}).values == "").all()


def test_transient_errors_are_retried(client, tmp_path):
    FLAKY_CALLS.clear()
    d = small_config(tmp_path / "r.zarr", methods=["flaky"])
    d["options"] = {"flaky": {}}
    cfg = parse_config(d)
    rep = run_sweep(cfg, client=client, retries=2, **quiet())
    assert rep.ok == 4 and rep.failed == 0
    assert sorted(FLAKY_CALLS.values()) == [2, 2, 2, 2]
    assert (open_(cfg.store).status.values == 1).all()
    # without retries the transient error is recorded as a failure
    FLAKY_CALLS.clear()
    d["store"] = str(tmp_path / "r0.zarr")
    rep = run_sweep(parse_config(d), client=client, retries=0, **quiet())
    assert rep.failed == 4
    ds = open_(d["store"])
    assert (ds.status.values == 2).all()
    assert all("ConnectionResetError" in str(t) and "retries" in str(t) for t in ds.error.values.ravel())


def test_retry_never_overwrites_good_cells(tmp_path):
    cfg = parse_config(small_config(tmp_path / "w.zarr"))
    plan = make_plan(cfg)
    prepare_store(cfg.store, plan)
    w = BlockWriter(cfg.store, plan)
    b = plan.blocks[0]
    good = {"eps_lower": np.full((3, 2), 1.0), "eps_upper": np.full((3, 2), 2.0),
            "failed": np.zeros((3, 2), bool), "error": "", "seconds": 6.0}
    failed = np.zeros((3, 2), bool)
    failed[0, 0] = True
    first = dict(good, failed=failed, eps_upper=np.where(failed, np.nan, 2.0), error="x")
    w.write(b, first, run=1)
    bad = {"eps_lower": np.full((3, 2), np.nan), "eps_upper": np.full((3, 2), np.nan),
           "failed": np.ones((3, 2), bool), "error": "KilledWorker", "seconds": None}
    st = w.write(b, bad, run=2, keep_ok=~failed)
    assert (st == np.where(failed, 2, 1)).all()
    ds = open_(cfg.store)
    reg = plan.region(b)
    blk = ds.isel(reg)
    up = blk.eps_upper.transpose(*DIMS).values.reshape(3, 2)
    assert np.isnan(up[0, 0]) and (up.ravel()[1:] == 2.0).all()
    assert str(blk.error.values.ravel()[0]) == "KilledWorker" and int(blk.run.values.ravel()[0]) == 2


def test_scheduler_address_and_dask_config(cluster, tmp_path):
    d = small_config(tmp_path / "a.zarr", methods=["fake2"])
    d["options"] = {}
    rep = run_sweep(parse_config(d), scheduler=cluster.scheduler_address, **quiet())
    assert rep.ok == 4
    d["store"] = str(tmp_path / "b.zarr")
    with dask.config.set({"scheduler-address": cluster.scheduler_address}):  # = DASK_SCHEDULER_ADDRESS
        out = io.StringIO()
        rep = run_sweep(parse_config(d), progress=False, stream=out)
    assert rep.ok == 4 and f"scheduler {cluster.scheduler_address}" in out.getvalue()


def test_laplace_mechanism(client, tmp_path):
    d = small_config(tmp_path / "l.zarr", mechanism="laplace", sigma=[2.0], q=[0.1],
                     sampling=["poisson"], relation=["add_remove"], steps=[1, 10])
    cfg = parse_config(d)
    run_sweep(cfg, client=client, **quiet())
    ds = open_(cfg.store)
    assert (ds.status.values == 1).all()
    lo, up = direct_eps(cfg)
    np.testing.assert_array_equal(ds.eps_upper.transpose(*DIMS).values, up)
    assert "Laplace" in ds.sigma.attrs["long_name"]


def test_fsspec_url_store(client):
    d = small_config("memory://sweeps-test/u.zarr", methods=["fake2"])
    d["options"] = {}
    cfg = parse_config(d)
    assert run_sweep(cfg, client=client, **quiet()).ok == 4
    assert run_sweep(cfg, client=client, **quiet()).submitted == 0  # resumed: nothing to do
    ds = xr.open_zarr(cfg.store, chunks=None)
    assert (ds.status.values == 1).all()


@pytest.mark.parametrize("layout", ["blocks", "sharded"])
def test_file_url_store_runs_and_resumes(client, tmp_path, layout):
    """A store given as a file:// URL (the fsspec form of object-store URLs): both layouts write,
    read back equal to the direct calls, and resume as a no-op.  The block layout's region
    writes used to fail there (fsspec's local filesystem creates no chunk directories)."""
    url = (tmp_path / f"u_{layout}.zarr").as_uri()
    cfg = parse_config(small_config(url, layout=layout))
    rep = run_sweep(cfg, client=client, **quiet())
    assert rep.ok == rep.n_blocks and rep.failed == 0
    ds = xr.open_zarr(str(tmp_path / f"u_{layout}.zarr"))
    lo, up = direct_eps(cfg)
    np.testing.assert_array_equal(ds.eps_upper.transpose(*DIMS).values, up)
    np.testing.assert_array_equal(ds.eps_lower.transpose(*DIMS).values, lo)
    again = run_sweep(cfg, client=client, **quiet())
    assert again.submitted == 0 and again.already_done == rep.n_blocks
