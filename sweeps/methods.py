"""The task that computes one block, and the sweep options of pldlib's methods.

A sweep's methods are pldlib's registered methods (:mod:`pldlib.methods`:
``pld``, ``prv``, ``spa``, ``rdp``, ``clt`` and the peers ``dp_accounting``,
``prv_accountant`` where installed); there is no second registry.  A block is
one row of the grid (mechanism, sigma, q, sampling, relation, method) over
every steps value and delta; :func:`run_block` computes it as::

    make_accountant(method, relation, **options).tables_per_steps(event, steps, deltas, fprs)

and returns the :class:`pldlib.methods.StepsTables` as plain data for the store:
the certified ends (NaN by design where the method's kind does not certify a
side), its estimate, which cells failed or are unsupported (status 3: the
method cannot take the event, or ``eps_cap`` left them out), and the notes.

:func:`run_block` never raises for a block's own errors, it returns them as
data.  Only errors that may be transient on another try (``OSError``, a
``MemoryError`` other than pldlib's ``GridTooLargeError``) are re-raised so
that ``client.submit(retries=...)`` retries them.

Sweep options of a method are its accountant's constructor keywords (validated by
building the accountant) plus ``eps_cap: EPS`` (not with the TPR metric; see
:meth:`pldlib.methods.Accountant.tables_per_steps`: cells whose eps is certified
above EPS are left out, status 3) and ``eps_floor: EPS`` (steps values whose certified
Renyi-DP upper bound is at most EPS at every delta are left out, status 3; not with the TPR
metric).  Test-only options accepted by every method
(documented as such): ``sleep: SECONDS`` (sleep before computing; left out of the
fingerprint), ``fail: true | {axis: value(s)}`` (raise in matching blocks),
``crash: {axis: value(s)}`` (kill the worker process in matching blocks).
A config *variant* (``variants: {alias: method}``) runs ``method`` with the
alias's options.

A config with ``sampling: truncated_poisson`` gives its top-level ``batch_size`` and
``dataset_size`` to every block with its parameters (:meth:`sweeps.plan.Plan.spec`); the task
passes them to the mechanism of the ``truncated_poisson`` blocks (:func:`make_mechanism`).
"""
from __future__ import annotations

import inspect
import math
import numbers
import os
import socket
import time
import traceback

import numpy as np

from .errors import ConfigError

__all__ = ["method_names", "validate_options", "check_available", "make_mechanism", "make_event", "run_block",
           "ERROR_TEXT_MAX", "SWEEP_DEFAULTS"]

#: longest error text kept per block (characters)
ERROR_TEXT_MAX = 2000

#: sweep option defaults per method (part of a sweep's fingerprint: kept as they were so that
#: stored sweeps keep their fingerprints); other methods default to their constructor's
SWEEP_DEFAULTS = {"pld": {"spacing": None, "max_bins": None},
                  "prv": {"eps_error": None, "delta_error": None, "max_bins": None},
                  "dp_accounting": {"value_discretization_interval": 1e-4, "use_connect_dots": True,
                                    "optimistic": True},
                  "prv_accountant": {"eps_error": 0.01, "delta_error": None, "max_points": 2**24}}
#: constructor settings a sweep always uses (not options): SPA flags an edge instead of raising (a
#: cell must never raise for one); PRV answers at the mesh its options ask for, never sharpened
#: (a cell must not depend on the time sharpening found, and stores made before sharpening resume
#: to the same cells)
SWEEP_FIXED = {"spa": {"on_edge": "flag"}, "prv": {"sharpen": False}}
#: the extra that installs the peers
PEER_EXTRA = "pip install 'pldlib[peers]'"


def method_names(installed: bool = False) -> tuple[str, ...]:
    """The methods a config may name (every registered method; ``installed``: only those whose
    package is installed here)."""
    from pldlib.methods import method_names as names

    return names(installed=installed)


def check_available(fld: str, method: str) -> None:
    """ConfigError naming ``fld`` when ``method`` needs a package that is not installed."""
    from pldlib.methods import method_info

    info = method_info(method)
    if not info.installed:
        raise ConfigError(fld, f"method {method!r} needs the optional package {info.requires!r}, which is not "
                               f"installed ({PEER_EXTRA})")


# -- options ---------------------------------------------------------------------------------
def _constructor_options(cls) -> list[str]:
    return [n for n, p in inspect.signature(cls.__init__).parameters.items()
            if p.kind == p.KEYWORD_ONLY and not n.startswith("_")]


def _number(fld, v) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
        raise ConfigError(fld, f"must be a finite number, got {v!r}")
    return float(v)


def _opt_sleep(fld, v):
    x = _number(fld, v)
    if x < 0:
        raise ConfigError(fld, f"must be >= 0 seconds, got {v!r}")
    return x


def _opt_eps_cap(fld, v):
    if v is None:
        return None
    x = _number(fld, v)
    if x <= 0:
        raise ConfigError(fld, f"must be > 0, got {v!r}")
    return x


def _opt_selector(fld, v):
    """``true`` (every block), ``false``, or ``{axis: value or [values]}``."""
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


#: options every method accepts (test-only: they make blocks slow, fail or crash), and eps_cap
COMMON_OPTIONS = {"sleep": _opt_sleep, "fail": _opt_selector, "crash": _opt_selector, "eps_cap": _opt_eps_cap,
                  "eps_floor": _opt_eps_cap}


def validate_options(method: str, fld: str, given: dict) -> dict:
    """The sweep options of ``method`` (defaults filled in) from a config's ``given`` mapping;
    :class:`ConfigError` naming ``fld.<option>`` for an unknown or bad one.  A constructor
    option is validated by building the accountant with it (pldlib validates once)."""
    from pldlib.methods import accountant_class, method_info

    cls = accountant_class(method)
    ctor = [o for o in _constructor_options(cls) if o not in SWEEP_FIXED.get(method, {})]
    if "interval" in ctor and "spacing" in ctor:
        ctor.remove("interval")  # (the grid spacing's older name: accepted below, stored as spacing)
    if method in SWEEP_DEFAULTS:
        out = dict(SWEEP_DEFAULTS[method])
    elif method_info(method).kind == "peer":
        sig = inspect.signature(cls.__init__).parameters
        out = {o: sig[o].default for o in ctor}
    else:
        out = {}
    for k, v in given.items():
        name = k  # (errors name the key as written)
        if k == "interval" and "spacing" in ctor:  # (the grid spacing's older name)
            if "spacing" in given:
                raise ConfigError(f"{fld}.spacing", "given twice (as spacing and as interval)")
            k = "spacing"
        if k in COMMON_OPTIONS:
            out[k] = COMMON_OPTIONS[k](f"{fld}.{k}", v)
            continue
        if k not in ctor:
            raise ConfigError(f"{fld}.{k}", f"unknown option for method {method!r} "
                                            f"(known: {', '.join(sorted([*ctor, *COMMON_OPTIONS]))})")
        if v is None and out.get(k, ...) is None:
            out[k] = None  # an explicit null where the sweep's default is null
            continue
        if isinstance(v, list):
            v = tuple(v)
        try:
            cls("add_remove", **{k: v})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{fld}.{name}", str(e).removeprefix(f"{k}: ")) from None
        out[k] = v
    if out.get("eps_floor") is not None and out.get("eps_cap") is not None and out["eps_floor"] >= out["eps_cap"]:
        raise ConfigError(f"{fld}.eps_floor", f"must be below eps_cap ({out['eps_cap']:g}), got {out['eps_floor']:g}")
    return out


def accountant_for(method: str, relation: str, options: dict):
    """An empty accountant of ``method`` for one block (its constructor options from ``options``)."""
    from pldlib.methods import accountant_class

    cls = accountant_class(method)
    kw = {k: options[k] for k in _constructor_options(cls) if options.get(k) is not None}
    kw.update(SWEEP_FIXED.get(method, {}))
    return cls(relation, **kw)


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
#: mechanism keywords a block's ``params`` may carry besides the grid's, per sampling scheme they apply to
MECHANISM_KEYWORDS = {"truncated_poisson": ("batch_size", "dataset_size"),
                      "with_replacement": ("batch_size", "dataset_size"), "random_allocation": ("selections",)}


def make_mechanism(params: dict):
    """The pldlib mechanism of one block (``sigma`` is the mechanism's noise parameter:
    :mod:`pldlib.mechanisms`' descriptor of ``params['mechanism']`` says which); ``batch_size``
    and ``dataset_size``, when ``params`` has them, are passed on to the ``truncated_poisson``
    blocks, ``selections`` to the ``random_allocation`` ones (the other blocks of the same sweep
    take none)."""
    from pldlib.mechanisms import mechanism_spec

    spec = mechanism_spec(params["mechanism"])
    extra = {k: params[k] for k in MECHANISM_KEYWORDS.get(params["sampling"], ()) if params.get(k) is not None}
    return spec.make(params["sigma"], q=params["q"], sampling=params["sampling"], relation=params["relation"],
                     **extra)


def make_event(params: dict):
    """The pldlib event of one step of a block (the relation is the accountant's)."""
    return make_mechanism(params).event


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# -- the task --------------------------------------------------------------------
def run_block(spec: dict) -> dict:
    """Compute one block (runs on a worker).  Pure data in and out.

    ``spec``: ``{"index", "params", "steps", "deltas", "options"}`` and, with the
    TPR metric, ``"fprs"`` (see :meth:`sweeps.plan.Plan.spec`).  Returns
    ``{"index", "eps_lower", "eps_upper", "eps_estimate", "failed" (bool mask),
    "unsupported" (bool mask, final cells), "error" (text, "" if none), "seconds"
    (method time), "host", "finished_at"}``; with ``fprs`` also ``"tpr_lower",
    "tpr_upper", "tpr_failed", "tpr_unsupported", "tpr_note"`` (steps x fprs).
    """
    from pldlib.methods.base import transient

    params, options = spec["params"], spec["options"]
    method = options.get("variant_of") or params["method"]
    steps, deltas = [int(k) for k in spec["steps"]], [float(d) for d in spec["deltas"]]
    shape = (len(steps), len(deltas))
    fprs = [float(f) for f in (spec.get("fprs") or [])]
    tshape = (len(steps), len(fprs))
    out = {"index": spec["index"], "host": f"{socket.gethostname()}:{os.getpid()}"}
    import pldlib  # noqa: F401  (first use in a fresh worker: keep the import out of ``seconds``)
    from pldlib.plugins import load_plugins

    _tune_allocator_once()

    if options.get("sleep"):
        time.sleep(options["sleep"])  # test-only: make blocks slow
    if _selected(options.get("crash"), params):
        os._exit(13)  # test-only: kill the worker process (as a segfault or OOM kill would)
    t0 = time.perf_counter()
    nan = np.full(shape, np.nan)
    try:
        load_plugins()  # a worker in another process: the mechanisms and methods of $PLDLIB_PLUGINS
        if _selected(options.get("fail"), params):
            raise RuntimeError("test-only 'fail' option selected this block")
        if fprs and options.get("eps_cap") is not None:
            raise ValueError("option eps_cap cannot be combined with the TPR metric (grid.fpr)")
        if params.get("mechanism") == "bandmf":
            t = _bandmf_tables(params, method, options, steps, deltas)
        else:
            acc = accountant_for(method, params["relation"], options)
            event = make_event(params)
            t = acc.tables_per_steps(event, steps, deltas, fprs, eps_cap=options.get("eps_cap"),
                                     eps_floor=options.get("eps_floor"))
        failed = t.failed()
        unsupported = (np.ones(shape, bool) if t.unsupported
                       else (np.asarray(t.capped, bool) if t.capped is not None else np.zeros(shape, bool)))
        lo = np.asarray(t.eps_lower, dtype=float)
        up = np.asarray(t.eps_upper, dtype=float)
        est = np.asarray(t.eps_estimate, dtype=float)
        failed |= unsupported
        notes = [t.unsupported] if t.unsupported else list(t.notes)
        if failed.any() and not notes:
            notes = [f"{int(failed.sum())} cells not computed (no reason given)"]
        lo, up, est = (np.where(failed, np.nan, x) for x in (lo, up, est))
        error = "; ".join(dict.fromkeys(notes))  # dedupe, keep order
        tpr = _tpr_cells(t, tshape) if fprs else None
    except Exception as e:
        if transient(e):
            raise  # let Dask retry it (client.submit(..., retries=N))
        lo, up, est = nan, nan.copy(), nan.copy()
        failed = np.ones(shape, dtype=bool)
        unsupported = np.zeros(shape, dtype=bool)
        tb = traceback.extract_tb(e.__traceback__)
        where = f" [at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}]" if tb else ""
        error = _short(e) + where
        tpr = _tpr_cells(None, tshape) if fprs else None
    if fprs:
        tl, tu, tf, tn, note = tpr
        out.update(tpr_lower=tl, tpr_upper=tu, tpr_failed=tf, tpr_unsupported=tn, tpr_note=note)
        error = "; ".join(x for x in (error, note) if x)
    out.update(eps_lower=lo, eps_upper=up, eps_estimate=est, failed=failed, unsupported=unsupported,
               error=error[:ERROR_TEXT_MAX], seconds=time.perf_counter() - t0, finished_at=time.time())
    _trim_heap()
    return out


def _bandmf_tables(params: dict, method: str, options: dict, steps: list, deltas: list):
    """The block of a ``mechanism: bandmf`` sweep: one run of each steps value
    (:func:`pldlib.correlated.bandmf_run`: BandMF has no per-step event, its privacy depends on
    the whole run's strategy), all deltas at once; a steps value that raises fails its cells, with
    the error as a note.  The method's constructor options apply; ``eps_cap`` / ``eps_floor`` do
    not (every cell is computed)."""
    from pldlib.correlated import bandmf_run
    from pldlib.methods import StepsTables

    shape = (len(steps), len(deltas))
    lo, up = np.full(shape, np.nan), np.full(shape, np.nan)
    notes = []
    from pldlib.methods import accountant_class

    # (the accountants' constructor options, and the settings a sweep always uses: PRV unsharpened
    # and SPA flagging edges, so that a cell never depends on timing; as :func:`accountant_for`)
    kw = {k: v for k, v in options.items() if k in _constructor_options(accountant_class(method)) and v is not None}
    kw.update(SWEEP_FIXED.get(method, {}))
    d = np.asarray(deltas, float)
    for i, k in enumerate(steps):
        try:
            iv = bandmf_run(params["sigma"], k, int(options.get("bands", 1)), params["sampling"], params["q"],
                            relation=params["relation"], method=method, **kw).epsilon(d)
            lo[i], up[i] = iv.lower, iv.upper
        except Exception as e:
            from pldlib.methods.base import transient

            if transient(e):
                raise
            notes.append(f"steps {k}: {_short(e)}")
    empty = np.zeros((len(steps), 0))
    return StepsTables(eps_lower=lo, eps_estimate=np.full(shape, np.nan), eps_upper=up, notes=notes,
                       tpr_lower=empty, tpr_upper=empty, tpr_notes=[])


def _tune_allocator_once() -> None:
    """Raise glibc's malloc thresholds in this worker (:mod:`pldlib.allocator`) unless its
    ``PLDLIB_TUNE_MALLOC`` is 0: Dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, which
    hands every freed block back at once, so fine-grid blocks fault their temporaries in again
    and again.  The memory a block frees still goes back to the OS when it ends
    (:func:`_trim_heap`).  Set once per process (the setting is in-process)."""
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
    glibc ``malloc_trim``; a no-op elsewhere): freed arrays otherwise stay in the worker,
    fragmented across threads' arenas, and Dask would see unmanaged memory and pause it."""
    from pldlib import allocator

    allocator.release_free_memory()


def _tpr_cells(t, tshape):
    """``(lower, upper, failed, unsupported, note)`` of the TPR metric from a block's
    :class:`~pldlib.methods.StepsTables` (None: the block failed, every TPR cell failed with
    it); ``note`` is the text that joins the block's error ("" if none)."""
    if t is None:
        nan = np.full(tshape, np.nan)
        return nan, nan.copy(), np.ones(tshape, bool), np.zeros(tshape, bool), ""
    why = t.unsupported or t.tpr_unsupported
    if why:  # (a block the method cannot take at all says so once, in its own error text)
        nan = np.full(tshape, np.nan)
        return nan, nan.copy(), np.ones(tshape, bool), np.ones(tshape, bool), "" if t.unsupported else "tpr: " + why
    tl = np.asarray(t.tpr_lower, dtype=float)
    tu = np.asarray(t.tpr_upper, dtype=float)
    if tl.shape != tshape or tu.shape != tshape:
        raise ValueError(f"TPR table of shape {tl.shape}/{tu.shape}, expected {tshape}")
    tnotes = list(t.tpr_notes)
    tfailed = ~(np.isfinite(tu) & np.isfinite(tl))
    if tfailed.any() and not tnotes:
        tnotes = [f"{int(tfailed.sum())} TPR cells not computed (no reason given)"]
    tl = np.where(tfailed, np.nan, tl)
    tu = np.where(tfailed, np.nan, tu)
    note = "tpr: " + "; ".join(dict.fromkeys(tnotes)) if tnotes else ""
    return tl, tu, tfailed, np.zeros(tshape, bool), note
