"""Accounting methods by name, and the task that computes one block.

A method is a function::

    fn(params, steps, deltas, options) -> (eps_lower, eps_upper)            # or
                                       -> (eps_lower, eps_upper, notes)

``params`` holds one block's ``mechanism, sigma, q, sampling, relation``;
``steps`` and ``deltas`` are the full axes; the arrays have shape
``(len(steps), len(deltas))``.  A cell whose ``eps_upper`` is NaN counts as
failed (status 2) and ``notes`` (strings) say why; an exception fails the
whole block.  ``pld`` is built in; ``prv``, ``spa``, ``rdp``, ``clt`` plug in
with :func:`register` under their names (register them in a module that the
workers import too, e.g. here).

:func:`run_block` is what a Dask task runs: it never raises for a block's own
errors, it returns them as data.  Only errors that may be transient on
another try (``OSError``, a ``MemoryError`` other than pldlib's
``GridTooLargeError``) are re-raised so that ``client.submit(retries=...)``
retries them.

Test-only options accepted by every method (documented as such):
``sleep: SECONDS`` (sleep before computing; left out of the fingerprint),
``fail: true | {axis: value(s)}`` (raise in matching blocks),
``crash: {axis: value(s)}`` (kill the worker process in matching blocks).
"""
from __future__ import annotations

import math
import numbers
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["Method", "register", "get_method", "method_names", "make_mechanism", "run_block",
           "ERROR_TEXT_MAX"]

#: longest error text kept per block (characters)
ERROR_TEXT_MAX = 2000


@dataclass(frozen=True)
class Method:
    name: str
    fn: Callable
    options: dict = field(default_factory=dict)   # option -> validator(field, value) -> value
    defaults: dict = field(default_factory=dict)  # option -> default value
    description: str = ""

    def validate_options(self, fld: str, given: dict) -> dict:
        from .config import ConfigError

        checks = {**COMMON_OPTIONS, **self.options}
        out = dict(self.defaults)
        for k, v in given.items():
            if k not in checks:
                raise ConfigError(f"{fld}.{k}", f"unknown option for method {self.name!r} "
                                                f"(known: {', '.join(sorted(checks))})")
            out[k] = checks[k](f"{fld}.{k}", v)
        return out


_REGISTRY: dict[str, Method] = {}


def register(name: str, *, options: dict | None = None, defaults: dict | None = None,
             description: str = ""):
    """Decorator: make ``fn`` available as method ``name`` in configs."""
    def deco(fn):
        _REGISTRY[name] = Method(name, fn, dict(options or {}), dict(defaults or {}), description)
        return fn
    return deco


def get_method(name: str) -> Method:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r} (available: {', '.join(method_names())})") from None


def method_names() -> list[str]:
    return sorted(_REGISTRY)


# -- option validators ---------------------------------------------------------
def _opt_positive_or_none(fld, v):
    from .config import _positive

    if v is None:
        return None
    return _positive(fld, v)


def _opt_int_ge1_or_none(fld, v):
    from .config import ConfigError

    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ConfigError(fld, f"must be an integer >= 1, got {v!r}")
    return int(v)


def _opt_sleep(fld, v):
    from .config import ConfigError, _number

    x = _number(fld, v)
    if x < 0:
        raise ConfigError(fld, f"must be >= 0 seconds, got {v!r}")
    return x


def _opt_selector(fld, v):
    """``true`` (every block), ``false``, or ``{axis: value or [values]}``."""
    from .config import ConfigError

    if isinstance(v, bool):
        return v
    if not isinstance(v, dict) or not v:
        raise ConfigError(fld, f"must be true/false or a mapping axis -> value(s), got {v!r}")
    out = {}
    for k, vals in v.items():
        if k not in ("sigma", "q", "sampling", "relation"):
            raise ConfigError(f"{fld}.{k}", "unknown axis (use sigma, q, sampling, relation)")
        vals = vals if isinstance(vals, list) else [vals]
        out[k] = [x if isinstance(x, str) else float(x) for x in vals]
    return out


#: options every method accepts (test-only: they make blocks slow, fail or crash)
COMMON_OPTIONS = {"sleep": _opt_sleep, "fail": _opt_selector, "crash": _opt_selector}


def _selected(selector, params) -> bool:
    if selector is True:
        return True
    if not selector:
        return False
    for k, vals in selector.items():
        v = params[k]
        if isinstance(v, str):
            if v not in vals:
                return False
        elif not any(math.isclose(v, x, rel_tol=1e-9) for x in vals):
            return False
    return True


# -- mechanisms ----------------------------------------------------------------
def make_mechanism(params: dict):
    """The pldlib mechanism for one block (``sigma`` is Laplace's scale b for laplace)."""
    import pldlib

    common = dict(q=params["q"], sampling=params["sampling"], relation=params["relation"])
    if params["mechanism"] == "gaussian":
        return pldlib.Gaussian(sigma=params["sigma"], **common)
    if params["mechanism"] == "laplace":
        return pldlib.Laplace(scale=params["sigma"], **common)
    raise ValueError(f"mechanism: unknown {params['mechanism']!r}")


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# -- the PLD method --------------------------------------------------------------
def _opt_discretisation(fld, v):
    from pldlib.accountant import DISCRETISATIONS

    from .config import ConfigError

    if not isinstance(v, str) or v not in DISCRETISATIONS:
        raise ConfigError(fld, f"must be one of {', '.join(DISCRETISATIONS)}, got {v!r}")
    return v


@register("pld", options={"interval": _opt_positive_or_none, "max_bins": _opt_int_ge1_or_none,
                          "discretisation": _opt_discretisation},
          # (no default for discretisation: configs that leave it out keep their fingerprint)
          defaults={"interval": None, "max_bins": None},
          description="pldlib certified PLD accountant (lower, upper)")
def pld_method(params, steps, deltas, options):
    """One accountant per steps value, each answering all deltas in one call; the
    steps values share their discretisation (:func:`pldlib.accountant.account_steps`:
    each accountant equals ``pldlib.account(mech, steps=k, interval=h)`` at the
    shared spacing ``h``; with ``interval`` unset, ``h`` is the automatic spacing
    of the largest steps value, shared by the smaller ones whose own rule is not
    finer).

    Options: ``interval`` (grid spacing; default automatic), ``max_bins``,
    ``discretisation`` (``connect_the_dots``, the default, or ``privacy_buckets``).

    If a steps value raises, the other steps values still run; a
    ``PrecisionLimitError`` for the vectorised call is retried delta by delta
    so that the answerable deltas are kept.
    """
    from pldlib.accountant import account_steps

    kw = {k: options[k] for k in ("interval", "max_bins", "discretisation") if options.get(k) is not None}
    mech = make_mechanism(params)
    ks = [int(k) for k in steps]
    return _answer_per_steps(None, steps, deltas,
                             make_all=lambda: account_steps(mech, ks, errors="return", **kw))


def _answer_per_steps(make_accountant, steps, deltas, make_all=None):
    """(lower, upper, notes) arrays of shape (steps, deltas) from one accountant per steps value.

    ``make_accountant(k)`` builds one; or ``make_all()`` returns them all at once, in
    ``steps`` order, with an exception in place of one that could not be built.
    """
    import pldlib

    deltas = np.asarray(deltas, dtype=float)
    lo = np.full((len(steps), deltas.size), np.nan)
    up = np.full((len(steps), deltas.size), np.nan)
    notes = []
    built = make_all() if make_all is not None else None
    for i, k in enumerate(steps):
        try:
            if built is None:
                acc = make_accountant(int(k))
            elif isinstance(built[i], BaseException):
                raise built[i]
            else:
                acc = built[i]
        except Exception as e:
            if _transient(e) or (isinstance(e, (NotImplementedError, ValueError, TypeError)) and i == 0):
                raise  # transient: let Dask retry; a bad mechanism: fail the whole block
            notes.append(f"steps={k}: {_short(e)}")
            continue
        try:
            r = acc.epsilon(deltas)
            lo[i], up[i] = r.lower, r.upper
        except pldlib.PrecisionLimitError:
            for j, d in enumerate(deltas):
                try:
                    r = acc.epsilon(float(d))
                    lo[i, j], up[i, j] = r.lower, r.upper
                except pldlib.PrecisionLimitError as e:
                    notes.append(f"steps={k}: {_short(e)}")
        except Exception as e:
            if _transient(e):
                raise
            notes.append(f"steps={k}: {_short(e)}")
    return lo, up, notes


# -- the PRV method --------------------------------------------------------------
@register("prv", options={"eps_error": _opt_positive_or_none, "delta_error": _opt_positive_or_none,
                          "max_bins": _opt_int_ge1_or_none},
          defaults={"eps_error": None, "delta_error": None, "max_bins": None},
          description="pldlib PRV accountant (certified lower, upper; the estimate is not stored)")
def prv_method(params, steps, deltas, options):
    from pldlib.prv import account_prv

    kw = {k: options[k] for k in ("eps_error", "delta_error", "max_bins") if options.get(k) is not None}
    mech = make_mechanism(params)
    return _answer_per_steps(lambda k: account_prv(mech, steps=k, **kw), steps, deltas)


# -- SPA and the baselines ---------------------------------------------------------
def _grid_method(make):
    def fn(params, steps, deltas, options):
        acc = make(make_mechanism(params))
        lo, _est, up = acc.epsilon_grid(np.asarray(steps), np.asarray(deltas, dtype=float))
        return np.asarray(lo, dtype=float), np.asarray(up, dtype=float), []
    return fn


def _spa(mech):
    from pldlib.spa import account_spa

    return account_spa(mech, on_edge="flag")


def _rdp(mech):
    from pldlib.baselines import account_rdp

    return account_rdp(mech)


register("spa", description="saddle-point accountant: certified Berry-Esseen interval")(_grid_method(_spa))
register("rdp", description="RDP accountant: upper bound only (eps_lower is NaN)")(_grid_method(_rdp))


# -- the task --------------------------------------------------------------------
def _transient(e: BaseException) -> bool:
    try:
        from pldlib import GridTooLargeError
    except Exception:  # pragma: no cover
        GridTooLargeError = ()
    if isinstance(e, MemoryError):
        return not isinstance(e, GridTooLargeError)
    return isinstance(e, OSError)


def run_block(spec: dict) -> dict:
    """Compute one block (runs on a worker).  Pure data in and out.

    ``spec``: ``{"index", "params", "steps", "deltas", "options"}`` (see
    :meth:`sweeps.plan.Plan.spec`).  Returns ``{"index", "eps_lower",
    "eps_upper", "failed" (bool mask), "error" (text, "" if none), "seconds"
    (method time), "host", "finished_at"}``.
    """
    params, options = spec["params"], spec["options"]
    shape = (len(spec["steps"]), len(spec["deltas"]))
    out = {"index": spec["index"], "host": f"{socket.gethostname()}:{os.getpid()}"}
    import pldlib  # noqa: F401  (first use in a fresh worker: keep the import out of ``seconds``)

    if options.get("sleep"):
        time.sleep(options["sleep"])  # test-only: make blocks slow
    if _selected(options.get("crash"), params):
        os._exit(13)  # test-only: kill the worker process (as a segfault or OOM kill would)
    t0 = time.perf_counter()
    try:
        if _selected(options.get("fail"), params):
            raise RuntimeError("test-only 'fail' option selected this block")
        fn = get_method(params["method"]).fn
        res = fn(params, list(spec["steps"]), list(spec["deltas"]), options)
        lo, up = np.asarray(res[0], dtype=float), np.asarray(res[1], dtype=float)
        notes = list(res[2]) if len(res) > 2 else []
        if lo.shape != shape or up.shape != shape:
            raise ValueError(f"method {params['method']!r} returned shape {lo.shape}/{up.shape}, expected {shape}")
        failed = np.isnan(up)
        lo = np.where(failed, np.nan, lo)
        if failed.any() and not notes:
            notes = [f"{int(failed.sum())} cells not computed (no reason given)"]
        error = "; ".join(dict.fromkeys(notes))  # dedupe, keep order
    except Exception as e:
        if _transient(e):
            raise  # let Dask retry it (client.submit(..., retries=N))
        lo = np.full(shape, np.nan)
        up = np.full(shape, np.nan)
        failed = np.ones(shape, dtype=bool)
        tb = traceback.extract_tb(e.__traceback__)
        where = f" [at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}]" if tb else ""
        error = _short(e) + where
    out.update(eps_lower=lo, eps_upper=up, failed=failed, error=error[:ERROR_TEXT_MAX],
               seconds=time.perf_counter() - t0, finished_at=time.time())
    return out


from . import peers as _peers  # noqa: E402,F401  (registers dp_accounting, prv_accountant, clt; spa estimates)
