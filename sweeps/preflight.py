"""Checks before anything is allocated, written or submitted.

* :func:`estimate_data` / :func:`estimate_config` count cells and blocks and
  estimate the store size and the driver's memory from the config alone (the
  raw YAML data: a ``{linspace: [0, 1, 1000000000]}`` axis is counted, never
  expanded); :func:`check_size` refuses a grid beyond ``max_cells``
  (:class:`sweeps.config.ConfigError` naming the numbers; CLI exit 2).
* :func:`check_workers` waits (bounded) for workers, asks every worker to
  import pldlib and sweeps and describe itself (:mod:`sweeps.provenance`), and
  refuses workers that cannot run the code or run other code than the driver
  (:class:`ClusterError`), or only warns with ``allow_mismatch``.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass

from .config import AXES, ConfigError

__all__ = ["Estimate", "estimate_data", "estimate_config", "check_size", "DEFAULT_MAX_CELLS",
           "ClusterError", "check_workers", "DEFAULT_WORKER_TIMEOUT"]

#: default limit on the cells of one sweep (``--max-cells``)
DEFAULT_MAX_CELLS = 10**8
#: seconds to wait for workers before submitting, and without workers while running
DEFAULT_WORKER_TIMEOUT = 120.0
#: bytes per cell in the store, uncompressed (eps_lower, eps_upper, eps_estimate, seconds, status)
CELL_BYTES = 4 * 8 + 1
#: bytes per TPR cell (grid.fpr: tpr_lower, tpr_upper, tpr_status)
TPR_CELL_BYTES = 2 * 8 + 1
#: bytes per block in the store (run, finished_at, error and host text, chunk keys)
BLOCK_BYTES = 2 + 8 + 64 + 64
#: driver bytes per cell (the status array read on resume) and per block (states, numbers)
DRIVER_CELL_BYTES = 1
DRIVER_BLOCK_BYTES = 1 + 8 + 8
#: driver bytes per submitted-but-unfinished block (future, task spec, result) beyond its cells
DRIVER_INFLIGHT_BYTES = 20_000
#: at most this many blocks in flight (submitted, result not yet written)
MAX_INFLIGHT = 1000


class ClusterError(Exception):
    """The cluster cannot run the sweep (no workers, workers without the code, other code).

    ``exit_code``: 2 when raised before anything was written (CLI), 1 while running.
    """

    def __init__(self, problem: str, exit_code: int = 2):
        self.exit_code = exit_code
        super().__init__(f"cluster: {problem}")


@dataclass(frozen=True)
class Estimate:
    cells: int
    blocks: int
    cells_per_block: int
    store_bytes: int
    driver_bytes: int

    def text(self) -> str:
        return (f"{self.cells:,} cells in {self.blocks:,} blocks of {self.cells_per_block:,} "
                f"(store ~{_size(self.store_bytes)} uncompressed, driver ~{_size(self.driver_bytes)})")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"  # pragma: no cover


def _make(sizes: dict, n_fpr: int = 0) -> Estimate:
    cpb = sizes["steps"] * sizes["delta"]
    blocks = math.prod(v for k, v in sizes.items() if k not in ("steps", "delta"))
    cells = blocks * cpb
    tpr_cells = blocks * sizes["steps"] * n_fpr  # the TPR metric (grid.fpr)
    inflight = min(blocks, MAX_INFLIGHT)
    return Estimate(cells=cells, blocks=blocks, cells_per_block=cpb,
                    store_bytes=cells * CELL_BYTES + tpr_cells * TPR_CELL_BYTES + blocks * BLOCK_BYTES,
                    driver_bytes=(cells + tpr_cells) * DRIVER_CELL_BYTES + blocks * DRIVER_BLOCK_BYTES
                    + inflight * (DRIVER_INFLIGHT_BYTES + 8 * 8 * cpb + 3 * 8 * sizes["steps"] * n_fpr))


def _axis_len(spec) -> int | None:
    """Length of one axis as written (a generator's ``num``, never expanded); None if unclear."""
    if isinstance(spec, dict):
        if len(spec) != 1:
            return None
        (_, args), = spec.items()
        if isinstance(args, (list, tuple)) and len(args) == 3:
            num = args[2]
            if isinstance(num, numbers.Integral) and not isinstance(num, bool) and num >= 0:
                return int(num)
        return None
    if isinstance(spec, (list, tuple)):
        return len(spec)
    return None if spec is None else 1


def estimate_data(data, quick: bool = False) -> Estimate | None:
    """Estimate from raw config data (before validation); None when the data is too malformed
    to count (validation then names the problem)."""
    if not isinstance(data, dict):
        return None
    if quick:
        if not isinstance(data.get("quick"), dict):
            return None
        from .config import _quick_variant

        try:
            data = _quick_variant(data)
        except Exception:
            return None
    grid = data.get("grid")
    if not isinstance(grid, dict):
        return None
    grid = dict(grid)
    for k in ("sampling", "relation"):
        if k in data and k not in grid:
            grid[k] = data[k]
    sizes = {}
    for a in AXES:
        n = _axis_len(grid[a]) if a in grid else (1 if a in ("q", "sampling", "relation") else None)
        if n is None:
            return None
        sizes[a] = n
    methods = data.get("methods", ["pld"])
    sizes["method"] = 1 if isinstance(methods, str) else (len(methods) if isinstance(methods, list) else 1)
    return _make(sizes, (_axis_len(grid["fpr"]) or 0) if "fpr" in grid else 0)


def estimate_config(cfg) -> Estimate:
    return _make({d: len(cfg.axis(d)) for d in AXES + ("method",)}, len(cfg.fpr))


def check_size(est: Estimate | None, max_cells: int | None = None) -> None:
    """Raise ConfigError naming the numbers when the grid has more than ``max_cells`` cells."""
    limit = DEFAULT_MAX_CELLS if max_cells is None else int(max_cells)
    if est is not None and est.cells > limit:
        raise ConfigError("grid", f"{est.text()} exceeds --max-cells {limit:,}; split the sweep into "
                                  "smaller configs or raise --max-cells")


# -- workers ---------------------------------------------------------------------------
def _make_probe():
    """A function pickled by value (a closure), so a worker that cannot import sweeps
    can still run it and say why."""
    def probe():
        import os
        import socket

        out = {"host": socket.gethostname(), "pid": os.getpid()}
        for mod in ("pldlib", "sweeps.methods", "sweeps.provenance"):
            try:
                __import__(mod)
            except BaseException as e:  # noqa: BLE001 (anything: report it)
                out["error"] = f"import {mod.split('.')[0]} failed: {type(e).__name__}: {e}"
                return out
        import sweeps.provenance as prov

        try:
            out.update(prov.environment(git=False))
        except BaseException as e:  # noqa: BLE001
            out["error"] = f"cannot describe its environment: {type(e).__name__}: {e}"
        return out
    return probe


def n_workers(client) -> int:
    try:
        return len(client.scheduler_info(n_workers=-1)["workers"])
    except TypeError:  # older distributed: no n_workers argument
        return len(client.scheduler_info()["workers"])


def _run_with_timeout(client, fn, timeout: float):
    import concurrent.futures as cf

    ex = cf.ThreadPoolExecutor(1)
    try:
        return ex.submit(client.run, fn, on_error="return").result(timeout=timeout)
    except cf.TimeoutError:
        raise ClusterError(f"workers did not answer a version check within {timeout:.0f} s") from None
    finally:
        ex.shutdown(wait=False)


def check_workers(client, where: str, driver_env: dict, *, timeout: float = DEFAULT_WORKER_TIMEOUT,
                  allow_mismatch: bool = False, say=None) -> dict:
    """Wait up to ``timeout`` s for a worker, then probe every worker.  Returns
    ``{worker address: environment}``; raises :class:`ClusterError` (or only warns through
    ``say`` with ``allow_mismatch``) when a worker cannot import pldlib / sweeps or runs
    other code than the driver (:data:`sweeps.provenance.MUST_MATCH`)."""
    from .provenance import MUST_MATCH

    say = say or (lambda m: None)
    t0 = time.monotonic()
    if n_workers(client) == 0:
        say(f"waiting up to {timeout:.0f} s for workers on {where}")
        try:
            client.wait_for_workers(1, timeout=timeout)
        except (TimeoutError, OSError) as e:
            raise ClusterError(f"no workers joined {where} within {timeout:.0f} s (--worker-timeout); "
                               f"start some (dask worker ADDRESS) or check the scheduler address "
                               f"[{type(e).__name__}]") from None
    left = max(10.0, timeout - (time.monotonic() - t0))
    envs = _run_with_timeout(client, _make_probe(), left)
    broken, differ = [], []
    for addr, env in sorted(envs.items()):
        if isinstance(env, BaseException):
            broken.append(f"{addr}: {type(env).__name__}: {env}")
        elif env.get("error"):
            broken.append(f"{addr}: {env['error']}")
        else:
            diffs = [f"{k} {env.get(k)} (driver {driver_env.get(k)})" for k in MUST_MATCH
                     if env.get(k) != driver_env.get(k)]
            if diffs:
                differ.append(f"{addr}: " + ", ".join(d if "_code" not in d else
                                                       d.split(" ")[0] + " differs" for d in diffs))
    if broken:
        raise ClusterError(f"{len(broken)} of {len(envs)} workers cannot run the sweep code; first: "
                           f"{broken[0]} (install pldlib and sweeps in the workers' environment)")
    if differ:
        msg = (f"{len(differ)} of {len(envs)} workers run other code than the driver; first: {differ[0]}")
        if not allow_mismatch:
            raise ClusterError(msg + " (install the same versions, or --allow-mismatch to run anyway)")
        say(f"warning: {msg}; running anyway (--allow-mismatch)")
    return {a: e for a, e in envs.items()}


def summarize_workers(envs: dict, keys=None) -> list:
    """Group workers by identical environments: ``[{"workers": [...], ...env}]``."""
    keys = keys or ("pldlib", "pldlib_code", "sweeps_code", "python", "numpy", "scipy", "dask",
                    "distributed", "xarray", "zarr")
    groups = {}
    for addr, env in sorted(envs.items()):
        if not isinstance(env, dict):
            continue
        k = tuple(env.get(x) for x in keys)
        groups.setdefault(k, {"workers": [], **{x: env.get(x) for x in keys}})["workers"].append(addr)
    return list(groups.values())
