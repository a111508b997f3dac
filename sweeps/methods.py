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

TPR metric (config ``grid.fpr``): a method registered with ``tradeoff=True``
is called with the keyword ``fprs`` (the false-positive rates) when the sweep
has them and returns a fourth element, a :class:`TprTable` (shape
``(len(steps), len(fprs))``); pldlib's methods do (one accountant per steps
value answers both tables: :meth:`pldlib.methods.Accountant.tables_per_steps`).
A method without it (the peers, test methods), or one whose TPRs are
unsupported (``clt``: no certified trade-off curve), gets NaN TPRs with status
3 (unsupported) and the reason in the block's error text (prefixed ``tpr:``).

:func:`run_block` is what a Dask task runs: it never raises for a block's own
errors, it returns them as data.  Only errors that may be transient on
another try (``OSError``, a ``MemoryError`` other than pldlib's
``GridTooLargeError``) are re-raised so that ``client.submit(retries=...)``
retries them.

``eps_cap: EPS`` (pldlib's methods; not with the TPR metric): a row computes its steps
values in ascending order and stops once a count's certified eps lower bound exceeds EPS at
every delta; the larger counts' cells, whose eps then exceeds EPS, are NaN with a note and
status 3 (final: a resumed sweep does not recompute them; :func:`capped_steps`).

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

__all__ = ["Method", "TprTable", "register", "get_method", "method_names", "make_mechanism", "run_block",
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
    tradeoff: bool = False  # takes ``fprs=`` and returns a TprTable as a 4th element (module doc)

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


@dataclass
class TprTable:
    """A method's answer for the TPR metric: certified ``lower``/``upper`` of the largest TPR at
    each false-positive rate, shape ``(len(steps), len(fprs))`` (NaN = not computed, ``notes``
    say why); ``unsupported`` (the reason) when the method has no certified trade-off curve."""

    lower: np.ndarray
    upper: np.ndarray
    notes: list = field(default_factory=list)
    unsupported: str = ""


def register(name: str, *, options: dict | None = None, defaults: dict | None = None,
             description: str = "", tradeoff: bool = False):
    """Decorator: make ``fn`` available as method ``name`` in configs (``tradeoff``: ``fn``
    answers the TPR metric, see the module doc)."""
    def deco(fn):
        _REGISTRY[name] = Method(name, fn, dict(options or {}), dict(defaults or {}), description, tradeoff)
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


def make_event(params: dict):
    """The pldlib event of one step of a block (the relation is the accountant's)."""
    return make_mechanism(params).event


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# -- pldlib's own methods, from its registry -----------------------------------------
#: sweep options per pldlib method with their defaults (kept as they were so that stored
#: sweeps keep their fingerprints; every constructor keyword of the accountant is accepted)
SWEEP_DEFAULTS = {"pld": {"interval": None, "max_bins": None},
                  "prv": {"eps_error": None, "delta_error": None, "max_bins": None}}
#: constructor settings a sweep always uses (not options: a cell must never raise for an edge)
SWEEP_FIXED = {"spa": {"on_edge": "flag"}}


def _constructor_options(cls) -> list[str]:
    import inspect

    return [n for n, p in inspect.signature(cls.__init__).parameters.items()
            if p.kind == p.KEYWORD_ONLY and not n.startswith("_")]


def _option_validator(name: str, opt: str):
    """Validate one option by building the accountant with it (pldlib validates once)."""
    def check(fld, v):
        from pldlib.methods import accountant_class

        from .config import ConfigError

        if v is None and SWEEP_DEFAULTS.get(name, {}).get(opt, ...) is None:
            return None  # an explicit null where the sweep's default is null
        if isinstance(v, list):
            v = tuple(v)
        try:
            accountant_class(name)("add_remove", **{opt: v})
        except (TypeError, ValueError) as e:
            raise ConfigError(fld, str(e)) from None
        return v
    return check


def accountant_for(name: str, params: dict, options: dict):
    """An empty accountant of the registered method ``name`` for one block."""
    from pldlib.methods import accountant_class

    cls = accountant_class(name)
    kw = {k: options[k] for k in _constructor_options(cls) if options.get(k) is not None}
    kw.update(SWEEP_FIXED.get(name, {}))
    return cls(params["relation"], **kw)


def _registry_method(name: str):
    def fn(params, steps, deltas, options, fprs=None):
        from pldlib.methods import UnsupportedEventError, method_info

        from .peers import Unsupported, record

        acc = accountant_for(name, params, options)
        event = make_event(params)
        if not acc.supports(event):
            try:
                acc.fresh().compose(event)
            except UnsupportedEventError as e:
                raise Unsupported(str(e)) from None
        ks = [int(k) for k in steps]
        tpr = None
        if fprs and options.get("eps_cap") is not None:
            raise ValueError("option eps_cap cannot be combined with the TPR metric (grid.fpr)")
        if fprs:
            t = acc.tables_per_steps(event, ks, deltas, fprs)
            lo, est, up, notes = t.eps_lower, t.eps_estimate, t.eps_upper, t.notes
            tpr = TprTable(t.tpr_lower, t.tpr_upper, list(t.tpr_notes), t.tpr_unsupported)
        elif options.get("eps_cap") is not None:
            lo, est, up, notes, capped = capped_steps(acc, event, ks, deltas, float(options["eps_cap"]))
            record(capped=capped)
        else:  # exactly the calls of a sweep without the TPR metric
            lo, est, up, notes = acc.epsilon_per_steps(event, ks, deltas)
        if np.isfinite(est).any():
            record(estimate=est)
        if method_info(name).kind == "estimate":
            lo = up = np.full(np.shape(est), np.nan)
        return (lo, up, notes) if tpr is None else (lo, up, notes, tpr)
    fn.__name__ = f"{name}_method"
    fn.__doc__ = (f"Sweep method {name!r}: the pldlib accountant registered under this name, "
                  "one accountant per block answering every steps value and delta of its row "
                  "(:meth:`pldlib.methods.Accountant.epsilon_per_steps`); with ``fprs`` also the "
                  "certified max TPR (:meth:`pldlib.methods.Accountant.tables_per_steps`).")
    return fn


#: steps values computed per call when a row stops at ``eps_cap`` (in ascending order)
CAP_CHUNK = 6


def capped_steps(acc, event, steps, deltas, cap: float):
    """``acc.epsilon_per_steps(event, steps, deltas)`` computed in ascending chunks of steps
    values, stopping after the first chunk whose largest count has certified lower bounds
    above ``cap`` at every delta (option ``eps_cap``).  eps(delta) does not decrease with the
    number of steps (more steps dominate fewer) nor increase with delta, so every cell left
    out has a true eps above ``cap``: those cells are NaN, with a note saying so.  Returns
    ``(lower, estimate, upper, notes, capped)``, ``capped`` the mask of the cells left out (the
    sweep stores them with status 3: final, not failures).  Atlases use it to skip rows' far
    ends, whose eps no query asks for and whose compositions cost the most."""
    ks = [int(k) for k in steps]
    S, D = len(ks), len(deltas)
    lo, est, up = (np.full((S, D), np.nan) for _ in range(3))
    notes: list = []
    order = sorted(range(S), key=lambda i: ks[i])
    done = 0
    while done < S:
        idx = order[done : done + CAP_CHUNK]
        l, e, u, n = acc.epsilon_per_steps(event, [ks[i] for i in idx], deltas)
        lo[idx], est[idx], up[idx] = l, e, u
        notes += list(n)
        done += len(idx)
        last = np.asarray(l, dtype=float)[-1]
        if np.all(np.isfinite(last)) and float(np.min(last)) > cap:
            break
    capped = np.zeros((S, D), dtype=bool)
    if done < S:
        k0 = ks[order[done - 1]]
        capped[order[done:]] = True
        notes.append(f"steps > {k0} not computed: eps > eps_cap={cap:g} there (certified lower bound "
                     f"{float(np.min(lo[order[done - 1]])):.4g} at steps={k0})")
    return lo, est, up, notes, capped


def _register_pldlib_methods() -> None:
    from pldlib.methods import accountant_class, method_info, method_names

    for name in method_names(("certified", "upper", "estimate")):
        cls = accountant_class(name)
        opts = {o: _option_validator(name, o) for o in _constructor_options(cls) if o not in SWEEP_FIXED.get(name, {})}
        opts["eps_cap"] = _opt_positive_or_none  # (not a constructor option: read by the task, capped_steps)
        register(name, options=opts, defaults=SWEEP_DEFAULTS.get(name, {}),
                 description=method_info(name).summary, tradeoff=True)(_registry_method(name))


_register_pldlib_methods()


# -- the task --------------------------------------------------------------------
def _transient(e: BaseException) -> bool:
    from pldlib.methods.base import transient

    return transient(e)


def run_block(spec: dict) -> dict:
    """Compute one block (runs on a worker).  Pure data in and out.

    ``spec``: ``{"index", "params", "steps", "deltas", "options"}`` and, with the
    TPR metric, ``"fprs"`` (see :meth:`sweeps.plan.Plan.spec`).  Returns
    ``{"index", "eps_lower", "eps_upper", "failed" (bool mask), "error" (text, ""
    if none), "seconds" (method time), "host", "finished_at"}``; with ``fprs`` also
    ``"tpr_lower", "tpr_upper", "tpr_failed", "tpr_unsupported"`` (steps x fprs;
    the masks: not computed, and not computed because the method has no
    certified trade-off curve).
    """
    params, options = spec["params"], spec["options"]
    shape = (len(spec["steps"]), len(spec["deltas"]))
    fprs = list(spec.get("fprs") or [])
    tshape = (len(spec["steps"]), len(fprs))
    tpr = None
    out = {"index": spec["index"], "host": f"{socket.gethostname()}:{os.getpid()}"}
    import pldlib  # noqa: F401  (first use in a fresh worker: keep the import out of ``seconds``)

    _tune_allocator_once()

    if options.get("sleep"):
        time.sleep(options["sleep"])  # test-only: make blocks slow
    if _selected(options.get("crash"), params):
        os._exit(13)  # test-only: kill the worker process (as a segfault or OOM kill would)
    t0 = time.perf_counter()
    try:
        if _selected(options.get("fail"), params):
            raise RuntimeError("test-only 'fail' option selected this block")
        method = get_method(params["method"])
        if fprs and method.tradeoff:
            res = method.fn(params, list(spec["steps"]), list(spec["deltas"]), options, fprs=fprs)
        else:
            res = method.fn(params, list(spec["steps"]), list(spec["deltas"]), options)
        lo, up = np.asarray(res[0], dtype=float), np.asarray(res[1], dtype=float)
        notes = list(res[2]) if len(res) > 2 else []
        if lo.shape != shape or up.shape != shape:
            raise ValueError(f"method {params['method']!r} returned shape {lo.shape}/{up.shape}, expected {shape}")
        failed = np.isnan(up)
        lo = np.where(failed, np.nan, lo)
        if failed.any() and not notes:
            notes = [f"{int(failed.sum())} cells not computed (no reason given)"]
        error = "; ".join(dict.fromkeys(notes))  # dedupe, keep order
        if fprs:
            tpr = res[3] if len(res) > 3 else TprTable(
                np.full(tshape, np.nan), np.full(tshape, np.nan), [],
                f"method {params['method']!r} gives no certified trade-off curve (no TPR metric)")
            tpr = _tpr_cells(tpr, tshape)
    except Exception as e:
        if _transient(e):
            raise  # let Dask retry it (client.submit(..., retries=N))
        lo = np.full(shape, np.nan)
        up = np.full(shape, np.nan)
        failed = np.ones(shape, dtype=bool)
        tb = traceback.extract_tb(e.__traceback__)
        where = f" [at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}]" if tb else ""
        error = _short(e) + where
        tpr = None
    if fprs:
        tl, tu, tf, tn, note = tpr if tpr is not None else _tpr_cells(None, tshape)
        out.update(tpr_lower=tl, tpr_upper=tu, tpr_failed=tf, tpr_unsupported=tn, tpr_note=note)
        error = "; ".join(t for t in (error, note) if t)
    out.update(eps_lower=lo, eps_upper=up, failed=failed, error=error[:ERROR_TEXT_MAX],
               seconds=time.perf_counter() - t0, finished_at=time.time())
    _trim_heap()
    return out


def _tune_allocator_once() -> None:
    """Raise glibc's malloc thresholds in this worker (:mod:`pldlib.allocator`) unless its
    ``PLDLIB_TUNE_MALLOC`` is 0.  Dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, which hands
    every freed block back at once, so a fine-grid block faulted its temporaries in again and
    again (a DP-SGD call at h = 1e-4: ~2,000 page faults, 28 ms; tuned 0 faults, 19 ms).  The
    memory a block frees still goes back to the OS when it ends (:func:`_trim_heap`).  Set once
    per process, on any cluster (the setting is in-process, not in the worker's environment)."""
    global _TUNED
    if _TUNED is None:
        from pldlib import allocator

        try:
            _TUNED = allocator.enabled(default=True) and allocator.tune_allocator()
        except ValueError as e:  # a bad PLDLIB_TUNE_MALLOC on this worker: say so, leave malloc alone
            import warnings

            warnings.warn(f"{e}; malloc thresholds left as they are", RuntimeWarning, stacklevel=2)
            _TUNED = False


_TUNED = None


def _trim_heap() -> None:
    """Hand the heap memory a block freed back to the OS (:func:`pldlib.allocator.release_free_memory`,
    glibc ``malloc_trim``; a no-op elsewhere).  Workers take arrays up to 64 MB from the heap
    (:data:`pldlib.allocator.MMAP_THRESHOLD`); freed, they stay in the process, fragmented
    across threads' arenas, and after a few large PLD rows (8.5 GB measured after one atlas
    row at sigma 0.56, q 2e-4) Dask would see unmanaged memory and pause the worker for good."""
    from pldlib import allocator

    allocator.release_free_memory()


def _tpr_cells(tpr, tshape):
    """``(lower, upper, failed, unsupported, note)`` of the TPR metric from a method's
    :class:`TprTable` (None: the block failed, every TPR cell failed with it); ``note`` is the
    text that joins the block's error ("" if none)."""
    if tpr is None:
        nan = np.full(tshape, np.nan)
        return nan, nan.copy(), np.ones(tshape, bool), np.zeros(tshape, bool), ""
    tl = np.asarray(tpr.lower, dtype=float)
    tu = np.asarray(tpr.upper, dtype=float)
    if tl.shape != tshape or tu.shape != tshape:
        raise ValueError(f"TPR table of shape {tl.shape}/{tu.shape}, expected {tshape}")
    tnotes = list(tpr.notes)
    if tpr.unsupported:
        tl = tu = np.full(tshape, np.nan)
        tfailed = np.ones(tshape, bool)
        tunsup = np.ones(tshape, bool)
        tnotes = [tpr.unsupported]
    else:
        tfailed = ~(np.isfinite(tu) & np.isfinite(tl))
        tunsup = np.zeros(tshape, bool)
        if tfailed.any() and not tnotes:
            tnotes = [f"{int(tfailed.sum())} TPR cells not computed (no reason given)"]
    tl = np.where(tfailed, np.nan, tl)
    tu = np.where(tfailed, np.nan, tu)
    note = "tpr: " + "; ".join(dict.fromkeys(tnotes)) if tnotes else ""
    return tl, tu, tfailed, tunsup, note


from . import peers as _peers  # noqa: E402,F401  (registers dp_accounting, prv_accountant, clt; spa estimates)
