"""A few summands: the PLD accountant's certified ends beside another method's (docs/MATH.md 0.9).

The PRV accountant's error bounds and the saddle-point accountant's Berry-Esseen bounds are made
for many summands; for a handful of them (one epoch of random allocation or shuffling, a few
releases) they certify little (a lower end of 0, a PRV mesh far coarser than the loss).  The PLD
accountant composes a few summands on a fine grid for little cost.  Both answers bound the same
quantity, so their intersection -- the larger lower end, the smaller upper end -- is certified
too, and never looser than either.

:func:`companion` builds (once per composition) a PLD accountant of the same relation and steps
where the composition has at most :data:`FEW` summands (an epoch of a per-epoch scheme is one
summand) and the PLD accountant can take every step, with its time budget capped at
:data:`BUDGET_SECONDS` (a budget-limited PLD answer is still certified, only wider).  The
``*_bounds`` functions return its ends, or NaN (which :func:`~.single_step.intersect` ignores)
where it refuses.  Guarantee: certified (both ends); estimates of the calling method are unchanged.
"""
from __future__ import annotations

import threading
import warnings

import numpy as np

from .single_step import _SKIP, exact_of_accountant, of_accountant

#: compositions of at most this many summands get the PLD accountant's ends
FEW = 8
#: the PLD companion's time budget (seconds): it coarsens its grid rather than run longer
BUDGET_SECONDS = 2.0
#: the PLD accountant's class, registered by :mod:`.pld` when it is imported (``import pldlib``
#: does); this module imports no accountant, so the accountants that use it import no circle
_PLD = None
#: set while a companion answers: a companion's own sharpening (which may ask the saddle-point
#: accountant) never builds another companion
_READING = threading.local()


def register(cls) -> None:
    """Make ``cls`` (the PLD accountant) the companion's class."""
    global _PLD
    _PLD = cls


def summands(components) -> int:
    """The number of independent summands of a composition [(step, count)]: ``count`` for a step
    accounted per step, ``count / t`` for a per-epoch scheme (one summand per epoch of t steps)."""
    from .. import events as E
    from ..sampling.base import get_scheme, scheme_kw

    n = 0
    for s, k in components:
        ev, k = s.event, int(k)
        if isinstance(ev, E.Sampled) and ev.q < 1.0:
            try:
                k //= max(int(get_scheme(ev.sampling).steps_multiple(ev.q, **scheme_kw(ev))), 1)
            except (ValueError, KeyError):  # (not a known scheme: count its steps)
                pass
        n += k
    return n


def companion(acc):
    """The PLD accountant of ``acc``'s composition (cached on ``acc`` while its steps are
    unchanged), or None: ``acc``'s method does not ask for one (its class attribute
    ``few_summands_pld``: the PRV and saddle-point accountants), the composition has more than
    :data:`FEW` summands, it is one step composed once or has a closed form (read exactly already,
    docs/MATH.md 0.8), or the PLD accountant cannot take one of its steps."""
    key = tuple((id(s), int(k)) for s, k in acc.components)
    hit = acc.__dict__.get("_few_summands")
    if hit is None or hit[0] != key:
        hit = (key, _make(acc))
        acc.__dict__["_few_summands"] = hit
    return hit[1]


def _make(acc):
    if _PLD is None or isinstance(acc, _PLD) or not getattr(acc, "few_summands_pld", False) \
            or not acc.components or summands(acc.components) > FEW:
        return None
    if of_accountant(acc) is not None or exact_of_accountant(acc) is not None:
        return None  # (one step composed once, or a closed form: read exactly already, MATH 0.8)
    try:
        pld = _PLD(acc.relation, time_budget=BUDGET_SECONDS)
        for s, k in acc.components:
            pld.compose(s.event, int(k))
    except _SKIP + (TypeError,):
        return None
    return pld


def _read(acc, fn, shape):
    nan = np.full(shape, np.nan)
    if getattr(_READING, "on", False):
        return nan, nan.copy()
    pld = companion(acc)
    if pld is None:
        return nan, nan.copy()
    _READING.on = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a budget-limited answer is certified, only wider)
            lo, up = fn(pld)
        return (np.broadcast_to(np.asarray(lo, dtype=float), shape).copy(),
                np.broadcast_to(np.asarray(up, dtype=float), shape).copy())
    except _SKIP + (TimeoutError,):
        return nan, nan.copy()
    finally:
        _READING.on = False


def _ends(iv):
    return iv.lower, iv.upper


def delta_bounds(acc, eps):
    """Certified (lower, upper) of delta(eps) from ``acc``'s PLD companion; NaN if it has none or
    it refuses."""
    return _read(acc, lambda pld: _ends(pld.delta(np.asarray(eps, dtype=float))), np.shape(eps))


def epsilon_bounds(acc, deltas):
    """Certified (lower, upper) of eps(delta) from ``acc``'s PLD companion; NaN if it has none or
    it refuses."""
    return _read(acc, lambda pld: _ends(pld.epsilon(np.asarray(deltas, dtype=float))), np.shape(deltas))


def power_bounds(acc, alpha):
    """Certified (lower, upper) of the power 1 - beta(alpha) (the trade-off curve, docs/MATH.md
    10) from ``acc``'s PLD companion; NaN if it has none or it refuses."""
    def fn(pld):
        pld._ensure_built()
        return pld._power(np.asarray(alpha, dtype=float))
    return _read(acc, fn, np.shape(alpha))
