"""The embedded cluster's worker environment (glibc mmap threshold next to Dask's trim threshold)."""
import dask
import distributed  # noqa: F401  (its config defaults must be loaded before any config.set below)
import pytest

from sweeps.execute import MMAP_THRESHOLD, _worker_environ

KEY = "distributed.nanny.pre-spawn-environ"


def test_mmap_threshold_added_next_to_dask_trim_threshold():
    with dask.config.set({KEY: {"MALLOC_TRIM_THRESHOLD_": 65536, "OTHER": "x"}}):
        env = _worker_environ()
    # (dask.config.set merges into Dask's defaults: other variables may be there too)
    assert env["MALLOC_TRIM_THRESHOLD_"] == 65536 and env["OTHER"] == "x"
    assert env["MALLOC_MMAP_THRESHOLD_"] == MMAP_THRESHOLD


def test_configured_values_win_and_no_trim_means_no_change():
    with dask.config.set({KEY: {"MALLOC_TRIM_THRESHOLD_": 65536, "MALLOC_MMAP_THRESHOLD_": 1234}}):
        assert _worker_environ()["MALLOC_MMAP_THRESHOLD_"] == 1234
    with dask.config.set({KEY: {"MALLOC_TRIM_THRESHOLD_": None}}):
        assert "MALLOC_MMAP_THRESHOLD_" not in _worker_environ()


def test_dask_default_sets_trim_so_the_embedded_workers_get_the_threshold():
    if dask.config.get(KEY, {}).get("MALLOC_TRIM_THRESHOLD_") is None:
        pytest.skip("this Dask version sets no trim threshold: nothing to fix")
    assert _worker_environ()["MALLOC_MMAP_THRESHOLD_"] == MMAP_THRESHOLD
