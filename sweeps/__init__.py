"""sweeps: batch DP-accounting sweeps on Dask distributed, stored as zarr.

config (YAML) -> plan (blocks = zarr chunks) -> Dask tasks -> region writes.

Public API::

    from sweeps import load_config, make_plan, run_sweep
    report = run_sweep("configs/demo.yaml")            # embedded LocalCluster
    report = run_sweep(cfg, client=client)             # any Dask client

Nothing here starts a cluster or touches a store at import time (worker
processes re-import this package).
"""
from .config import ConfigError, SweepConfig, load_config, parse_config
from .methods import method_names
from .plan import BLOCK_DIMS, DIMS, Block, Plan, make_plan
from .store import STATUS_FAILED, STATUS_MISSING, STATUS_OK, StoreError, open_dataset


def run_sweep(*args, **kwargs):
    """See :func:`sweeps.execute.run_sweep` (imported lazily: it pulls in distributed)."""
    from .execute import run_sweep as _run

    return _run(*args, **kwargs)


__all__ = [
    "ConfigError", "SweepConfig", "load_config", "parse_config",
    "method_names",
    "DIMS", "BLOCK_DIMS", "Block", "Plan", "make_plan",
    "StoreError", "STATUS_MISSING", "STATUS_OK", "STATUS_FAILED", "open_dataset",
    "run_sweep",
]
