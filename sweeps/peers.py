"""Peer accountants as sweep methods, estimates, variants and unsupported cells.

Imported at the end of :mod:`sweeps.methods` (so every worker registers the
same methods).  It adds:

* ``dp_accounting`` -- Google's PLD accountant (``dp_accounting.pld``):
  ``eps_upper`` from its pessimistic PLD, ``eps_lower`` from its optimistic
  PLD (``optimistic: false`` skips it).  Options:
  ``value_discretization_interval`` (default 1e-4, its own default),
  ``use_connect_dots`` (default true, its own default: connect-the-dots for
  the pessimistic PLD; false = privacy buckets), ``optimistic``.  Its
  optimistic PLD is always built by privacy buckets (dp_accounting has no
  optimistic connect-the-dots).
* ``prv_accountant`` -- Microsoft's PRV accountant 0.2: ``eps_lower``,
  ``eps_upper`` and its central ``eps_estimate``.  Options ``eps_error``
  (default 0.01), ``delta_error`` (default: the block's smallest delta /
  1000, the convention of its ``Accountant`` class) and ``max_points`` (its
  discretisation domain is refused above this many points, default 2^24,
  instead of exhausting memory).

pldlib's own methods (``pld``, ``prv``, ``spa``, ``rdp``, ``clt``) are sweep
methods registered from pldlib's method registry in :mod:`sweeps.methods`;
their estimates (PRV's central value, SPA's SP-MSD1) go to ``eps_estimate``
through :func:`record`, and a method of kind ``estimate`` (``clt``) stores
NaN bounds so that it can never be read as a bound.

What each peer supports (checked against their code, dp_accounting 0.6 and
prv_accountant 0.2; everything else is status 3 = unsupported, not an
error and not a number):

============== ============================ =====================================
peer           mechanism / sampling          relations
============== ============================ =====================================
dp_accounting  gaussian, laplace: none,     add_remove; substitution (gaussian
               poisson                      only: its REPLACE_ONE); add and remove
                                            only without sampling (the unsampled
                                            mechanisms are symmetric, so they equal
                                            add_remove); no WOR sampling
prv_accountant gaussian: none, poisson;     without sampling: add, remove,
               laplace: none                add_remove (symmetric); Poisson: remove
                                            only (its PoissonSubsampledGaussian is
                                            the remove pair); no substitution, no WOR
============== ============================ =====================================

A method signals "unsupported" by raising :class:`Unsupported` (a
``NotImplementedError``) for the block; :func:`run_block` -- the task that
:mod:`sweeps.execute` submits -- wraps :func:`sweeps.methods.run_block` and
turns a block that failed with ``Unsupported`` or ``NotImplementedError``
(e.g. ``rdp`` for Laplace) into status 3, keeping the reason as the block's
error text.  Methods attach per-cell estimates with :func:`record` (read back
by :func:`run_block`, same thread).  A config *variant* (``variants:
{alias: method}``) runs ``method`` with the alias's options.  Infinite answers and peer exceptions are
per-cell failures with their text; they never stop the sweep.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import threading
import warnings

import numpy as np

from .methods import _opt_int_ge1_or_none, _opt_positive_or_none, _short, _transient, get_method
from .methods import make_mechanism, register
from .methods import run_block as _base_run_block

__all__ = ["Unsupported", "record", "run_block", "PEERS", "check_available", "PEER_EXTRA",
           "ESTIMATE_ONLY"]

#: peer method -> the module it needs
PEERS = {"dp_accounting": "dp_accounting", "prv_accountant": "prv_accountant"}
PEER_EXTRA = "pip install 'pldlib[peers]'"
#: methods whose answer is an estimate only (bounds always NaN)
def _estimate_only() -> tuple:
    from pldlib.methods import method_names

    return method_names("estimate")


ESTIMATE_ONLY = _estimate_only()
#: prefixes of a block error that mean "this method does not support the combination"
UNSUPPORTED_PREFIXES = ("Unsupported: ", "NotImplementedError: ")


class Unsupported(NotImplementedError):
    """The method does not support this block's combination (status 3, not an error)."""


def check_available(fld: str, method: str) -> None:
    """ConfigError naming ``fld`` when ``method`` is a peer whose package is not installed."""
    from .config import ConfigError

    mod = PEERS.get(method)
    if mod is not None and importlib.util.find_spec(mod) is None:
        raise ConfigError(fld, f"method {method!r} needs the optional package {mod!r}, which is not "
                               f"installed ({PEER_EXTRA})")


# -- per-cell extras, passed from a method to run_block on the same thread ------
_local = threading.local()


def record(*, estimate=None, notes=None, capped=None) -> None:
    """Attach ``estimate`` (steps x delta) to the block being computed on this thread, and
    ``capped``: a mask of the cells the option ``eps_cap`` left out (status 3, final)."""
    box = getattr(_local, "box", None)
    if box is not None:
        if estimate is not None:
            box["estimate"] = np.asarray(estimate, dtype=float)
        if capped is not None:
            box["capped"] = np.asarray(capped, dtype=bool)
        if notes is not None:
            box["notes"] = list(notes)


def run_block(spec: dict) -> dict:
    """:func:`sweeps.methods.run_block` plus ``eps_estimate`` and ``unsupported`` (see module doc)."""
    method = spec["options"].get("variant_of") or spec["params"]["method"]
    if method != spec["params"]["method"]:  # a variant (config ``variants:``): run its method
        spec = {**spec, "params": {**spec["params"], "method": method}}
    _local.box = box = {}
    try:
        out = _base_run_block(spec)
    finally:
        _local.box = None
    shape = (len(spec["steps"]), len(spec["deltas"]))
    failed = np.asarray(out["failed"], dtype=bool)
    if failed.all() and out["error"].startswith(UNSUPPORTED_PREFIXES):
        out["unsupported"] = np.ones(shape, dtype=bool)
        if "tpr_failed" in out:  # an unsupported block has no TPRs either
            out["tpr_unsupported"] = np.ones(np.shape(out["tpr_failed"]), dtype=bool)
        return out
    capped = box.get("capped")
    if capped is not None and capped.shape == shape and capped.any():
        # cells left out by eps_cap: final (a resumed run does not recompute them), not failures
        out["unsupported"] = capped & failed
    est = box.get("estimate")
    if est is None or est.shape != shape:
        return out
    if method in ESTIMATE_ONLY:
        # no bounds by design: a cell is ok when its estimate is finite
        failed = ~np.isfinite(est)
        out["failed"] = failed
        out["eps_lower"] = np.full(shape, np.nan)
        out["eps_upper"] = np.full(shape, np.nan)
        notes = box.get("notes") or ([f"{int(failed.sum())} cells without an estimate"] if failed.any() else [])
        notes += [out["tpr_note"]] if out.get("tpr_note") else []  # the TPR metric's own note
        out["error"] = "; ".join(dict.fromkeys(notes))
    out["eps_estimate"] = np.where(failed, np.nan, est)
    return out


# -- option validators -----------------------------------------------------------
def _opt_bool(fld, v):
    from .config import ConfigError

    if not isinstance(v, bool):
        raise ConfigError(fld, f"must be true or false, got {v!r}")
    return v


def _opt_interval(fld, v):
    from .config import ConfigError, _positive

    x = _positive(fld, v)
    if x > 1.0:
        raise ConfigError(fld, f"must be in (0, 1] (a privacy-loss grid spacing), got {v!r}")
    return x


def _opt_fraction_or_none(fld, v):
    from .config import ConfigError, _positive

    if v is None:
        return None
    x = _positive(fld, v)
    if x >= 1.0:
        raise ConfigError(fld, f"must be in (0, 1), got {v!r}")
    return x


# -- helpers -----------------------------------------------------------------------
def _need(module: str, method: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:  # a worker without the extra: a clear per-block error
        raise ImportError(f"method {method!r} needs {module!r} on the workers ({PEER_EXTRA}): {e}") from None



def _per_steps(steps, deltas, one_steps):
    """Run ``one_steps(k) -> (lower, estimate, upper) arrays over deltas`` for every steps value.

    Exceptions (other than transient ones) and non-finite answers become
    per-cell notes; the cells stay NaN (failed).
    """
    S, D = len(steps), len(deltas)
    lo, est, up = (np.full((S, D), np.nan) for _ in range(3))
    notes = []
    for i, k in enumerate(steps):
        try:
            lo[i], est[i], up[i] = one_steps(int(k))
        except Unsupported:
            raise
        except MemoryError as e:  # the peer's own allocation: a refusal, not transient
            notes.append(f"steps={k}: MemoryError: {e}")
        except Exception as e:
            if _transient(e):
                raise
            notes.append(f"steps={k}: {_short(e)}")
    bad = ~np.isfinite(up)
    for i, j in zip(*np.nonzero(bad & ~np.isnan(up))):
        notes.append(f"steps={steps[i]} delta={deltas[j]:g}: eps_upper = {up[i, j]!r} (not finite)")
    up = np.where(bad, np.nan, up)
    lo = np.where(bad, np.nan, lo)
    est = np.where(bad, np.nan, est)
    return lo, est, up, notes


# -- dp_accounting -----------------------------------------------------------------
def _dp_support(params):
    mech, samp, rel, q = params["mechanism"], params["sampling"], params["relation"], params["q"]
    if samp == "wor":
        raise Unsupported("dp_accounting's PLD accountant has no sampling without replacement (Poisson only)")
    sampled = samp == "poisson" and q < 1.0
    if rel == "substitution":
        if mech != "gaussian":
            raise Unsupported("dp_accounting's Laplace PLD has no neighbouring-relation option "
                              "(add-or-remove only)")
        return "REPLACE_ONE"
    if rel in ("add", "remove") and sampled:
        raise Unsupported(f"dp_accounting's public PLD API has no single {rel!r} direction for subsampled "
                          "mechanisms (it takes the max of add and remove: relation add_remove)")
    return "ADD_OR_REMOVE_ONE"


@register("dp_accounting",
          options={"value_discretization_interval": _opt_interval, "use_connect_dots": _opt_bool,
                   "optimistic": _opt_bool},
          defaults={"value_discretization_interval": 1e-4, "use_connect_dots": True, "optimistic": True},
          description="peer: dp_accounting PLD (pessimistic upper; optimistic lower, privacy buckets)")
def dp_accounting_method(params, steps, deltas, options):
    rel_name = _dp_support(params)
    _need("dp_accounting", "dp_accounting")
    from dp_accounting.pld import privacy_loss_distribution as dpl

    h = options["value_discretization_interval"]
    q = params["q"] if params["sampling"] == "poisson" else 1.0

    def pld(pessimistic):
        # dp_accounting has no optimistic connect-the-dots (it warns and falls back): ask for buckets
        ctd = options["use_connect_dots"] and pessimistic
        if params["mechanism"] == "gaussian":
            return dpl.from_gaussian_mechanism(params["sigma"], sampling_prob=q, value_discretization_interval=h,
                                               pessimistic_estimate=pessimistic, use_connect_dots=ctd,
                                               neighboring_relation=getattr(dpl.NeighborRel, rel_name))
        return dpl.from_laplace_mechanism(params["sigma"], sampling_prob=q, value_discretization_interval=h,
                                          pessimistic_estimate=pessimistic, use_connect_dots=ctd)

    base = {True: pld(True), False: pld(False) if options["optimistic"] else None}
    notes_d = []

    def one(k):
        up = _eps_list(base[True].self_compose(k), deltas, k, notes_d)
        lo = (_eps_list(base[False].self_compose(k), deltas, k, notes_d) if base[False] is not None
              else np.full(len(deltas), np.nan))
        return lo, np.full(len(deltas), np.nan), up

    lo, _est, up, notes = _per_steps(steps, deltas, one)
    return lo, up, notes_d + notes


def _eps_list(composed, deltas, k, notes):
    out = np.full(len(deltas), np.nan)
    for j, d in enumerate(deltas):
        try:
            out[j] = composed.get_epsilon_for_delta(float(d))
        except Exception as e:
            if _transient(e):
                raise
            notes.append(f"steps={k} delta={d:g}: {_short(e)}")
    return out


# -- prv_accountant ------------------------------------------------------------------
def _prv_variable(params, prv):
    mech, samp, rel, q = params["mechanism"], params["sampling"], params["relation"], params["q"]
    if samp == "wor":
        raise Unsupported("prv_accountant 0.2 has no sampling without replacement")
    if rel == "substitution":
        raise Unsupported("prv_accountant 0.2 has no substitution relation")
    sampled = samp == "poisson" and q < 1.0
    if mech == "gaussian":
        if not sampled:
            return prv.GaussianMechanism(noise_multiplier=params["sigma"])
        if rel != "remove":
            raise Unsupported(f"prv_accountant 0.2 models the remove pair of the Poisson-subsampled Gaussian "
                              f"only (relation {rel!r} needs the add direction too)")
        return prv.PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=params["sigma"])
    if sampled:
        raise Unsupported("prv_accountant 0.2 has no subsampled Laplace mechanism")
    return prv.LaplaceMechanism(mu=1.0 / params["sigma"])  # privacy loss in [-1/b, 1/b]


@register("prv_accountant",
          options={"eps_error": _opt_positive_or_none, "delta_error": _opt_fraction_or_none,
                   "max_points": _opt_int_ge1_or_none},
          defaults={"eps_error": 0.01, "delta_error": None, "max_points": 2**24},
          description="peer: prv_accountant 0.2 (lower, estimate, upper)")
def prv_accountant_method(params, steps, deltas, options):
    prv = _need("prv_accountant", "prv_accountant")
    variable = _prv_variable(params, prv)
    from prv_accountant.accountant import compute_safe_domain_size

    eps_error = options["eps_error"] or 0.01
    delta_error = options["delta_error"] or min(deltas) / 1000.0
    notes_d = []

    def one(k):
        # the domain the accountant would allocate (its own formulas): refuse it when too big
        L = compute_safe_domain_size([variable], [k], eps_error=eps_error, delta_error=delta_error)
        mesh = eps_error / math.sqrt(k / 2 * math.log(12 / delta_error))
        points = 2 * L / mesh
        if points > options["max_points"]:
            raise MemoryError(f"refused: prv_accountant would discretise {points:.3g} points "
                              f"(max_points {options['max_points']})")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            acc = prv.PRVAccountant([variable], eps_error=eps_error, delta_error=delta_error,
                                    max_self_compositions=[k])
            composed = acc.compute_composition([k])
        out = np.full((3, len(deltas)), np.nan)
        for j, d in enumerate(deltas):
            try:
                out[:, j] = composed.compute_epsilon(float(d), delta_error, eps_error)
            except Exception as e:
                if _transient(e):
                    raise
                notes_d.append(f"steps={k} delta={d:g}: {_short(e)}")
        return out[0], out[1], out[2]

    lo, est, up, notes = _per_steps(steps, deltas, one)
    record(estimate=est)
    return lo, up, notes_d + notes


