"""Sharpening a wide answer: asking again and keeping the intersection (docs/MATH.md 5.9).

Two certified intervals for the same quantity both contain it, so their intersection does too.
An answer wider than :data:`WIDTH` (relative to its upper end; eps answers relative to at least
1e-3) is asked again, and the intersection kept:

1. by the same method at a finer accuracy (the PLD grid's spacing, the PRV mesh), :data:`FACTORS`
   times finer, each only while the time the last answer took, times the factor and 2, fits what
   is left before the deadline;
2. by the analytic bounds of the steps' cumulant generating functions: the Renyi-DP conversion
   and the Chernoff bound (delta answers) and the saddle-point accountant's certified Chernoff and Berry-Esseen bounds
   (docs/MATH.md 6.5), which carry the tails analytically where a grid's floor is above the
   truth (answers below :data:`TINY`) and are tight for very long compositions (the central-limit
   regime, where a grid within the budgets is coarse).

Guarantee: each end is the better of certified ends, so the result is certified; an interval is
only kept where the two meet (certified intervals always do; a crossing would be round-off and is
never traded for an answer).
"""
from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import numpy as np

from .._validate import PrecisionLimitError
from .base import branch_labels

_U = np.finfo(float).eps / 2

__all__ = ["FACTORS", "LONG", "LONG_SECONDS", "MARGIN", "NEAR_ONE", "SPA_SECONDS", "SPA_T_RANGE", "TINY", "WIDTH",
           "chernoff_delta", "chernoff_lower_delta", "rdp_delta", "rdp_epsilon", "sharpen", "wide"]

#: answers wider than this (relative to the upper end; eps: at least 1e-3) are sharpened
WIDTH = 0.01
#: how much finer the accuracies asked again are (each only while its predicted time fits)
FACTORS = (4, 16)
#: delta answers (eps answers: deltas asked) below this also ask the analytic bounds
TINY = 1e-10
#: wide delta answers whose upper end is above this also ask the Chernoff lower bound (delta near 1)
NEAR_ONE = 0.5
#: compositions of at least this many steps (the central-limit regime) also ask the saddle-point
#: bounds for every wide answer, not only tiny ones, while the time is there
LONG = 10_000
#: ... for at most this many seconds (and never past the deadline)
LONG_SECONDS = 10.0
#: the saddle-point bounds get at most this many seconds (their cumulant tables stop there; for a
#: grid limited by its budgets, all the time left), and are asked only while at least half of it
#: is left before the deadline
SPA_SECONDS = 3.0
#: the tilts the saddle-point bounds range over (beyond its default 1e4: tiny deltas need large tilts)
SPA_T_RANGE = (1e-5, 1e6)
#: the analytic bounds give up this many seconds before the deadline
MARGIN = 0.5

#: what a re-asked answer may raise instead of answering (its interval is then simply not used);
#: TimeoutError: a cumulant-table deadline or the hard stop of :mod:`pldlib._deadline`
_SKIP = (MemoryError, ArithmeticError, ValueError, NotImplementedError, PrecisionLimitError, TimeoutError)


def wide(kind: str, lo: np.ndarray, up: np.ndarray, width: float = WIDTH) -> np.ndarray:
    """Where an answer is wider than ``width`` relative to its upper end (eps answers: relative to
    at least 1e-3), an eps answer with an infinite end included (not a certain eps = +inf, both
    ends +inf; NaN ends are not answers)."""
    with np.errstate(invalid="ignore"):
        scale = np.maximum(np.abs(up), 1e-3) if kind == "eps" else np.abs(up)
        out = np.isfinite(lo) & np.isfinite(up) & ((up - lo) > width * scale)
        if kind == "eps":
            return out | (~np.isnan(lo) & ~np.isnan(up) & ~(lo == up) & ~(np.isfinite(lo) & np.isfinite(up)))
        # (a delta bound of the smallest double cannot be narrowed in doubles)
        return out & (up > 5e-324)


def rdp_epsilon(relation: str, events: Sequence, deltas: np.ndarray) -> np.ndarray:
    """Certified upper bounds on eps(delta) from the Renyi-DP accountant's conversion (as
    :func:`rdp_delta`)."""
    from .rdp import RDPAccountant

    acc = RDPAccountant(relation)
    for ev, k in events:
        acc.compose(ev, k)
    return np.asarray(acc.epsilon(np.asarray(deltas, dtype=float)).upper, dtype=float)


def rdp_delta(relation: str, events: Sequence, eps: np.ndarray) -> np.ndarray:
    """Certified upper bounds on delta(eps) from the Renyi-DP accountant's conversion (docs/MATH.md
    8.1: closed-form Renyi curves, milliseconds); raises NotImplementedError for steps it does not
    take (noises other than Gaussian, substitution of sampled steps)."""
    from .rdp import RDPAccountant

    acc = RDPAccountant(relation)
    for ev, k in events:
        acc.compose(ev, k)
    return np.asarray(acc.delta(np.asarray(eps, dtype=float)).upper, dtype=float)


def _merge(lo, up, l2, u2, idx) -> None:
    l2, u2 = np.asarray(l2, dtype=float), np.asarray(u2, dtype=float)
    nl = np.maximum(lo[idx], np.nan_to_num(l2, nan=-np.inf))
    nu = np.minimum(up[idx], np.nan_to_num(u2, nan=np.inf))
    ok = nl <= nu  # (certified intervals always meet; never trade an answer for a crossing)
    lo[idx[ok]], up[idx[ok]] = nl[ok], nu[ok]


def chernoff_delta(components: Sequence, eps: np.ndarray) -> np.ndarray:
    """Certified upper bounds on delta(eps) of the composition of ``components`` ((mechanism,
    count) pairs): the maximum over branches of the Chernoff bound of each branch's composed CGF
    (:func:`pldlib.methods.cgf.chernoff_delta`, docs/MATH.md 6.5).  Raises NotImplementedError
    for steps without a CGF."""
    from .cgf import chernoff_delta as branch_chernoff, mechanism_cgfs

    per_comp = [mechanism_cgfs(m) for m, _ in components]
    out = np.zeros(np.shape(eps))
    for label in branch_labels(per_comp):
        parts = [(next((c for c in bl if c[0] == label), bl[0])[1], k) for bl, (_, k) in zip(per_comp, components)]
        out = np.maximum(out, branch_chernoff(parts, eps))
    return out


def chernoff_lower_delta(components: Sequence, eps: np.ndarray) -> np.ndarray:
    """Certified lower bounds on delta(eps) of the composition of ``components`` ((mechanism,
    count) pairs): the maximum over branches of the Chernoff lower bound of each branch's composed
    lower CGFs (:func:`pldlib.methods.cgf.chernoff_lower_delta`, docs/MATH.md 6.5).  A branch label
    that a step with several branches lacks is skipped.  Raises NotImplementedError for steps
    without a CGF."""
    from .cgf import chernoff_lower_delta as branch_lower, mechanism_cgfs

    per_comp = [mechanism_cgfs(m) for m, _ in components]
    out = np.zeros(np.shape(eps))
    for label in branch_labels(per_comp):
        parts = []
        for bl, (_, k) in zip(per_comp, components):
            c = next((c for c in bl if c[0] == label), bl[0] if len(bl) == 1 else None)
            if c is None:
                break
            parts.append((c[2], k))
        else:
            out = np.maximum(out, branch_lower(parts, eps))
    return out


def sharpen(kind: str, x: np.ndarray, lo, up, *, took: float, deadline: float | None,
            finer: Callable[[float, np.ndarray], object] | None, relation: str, components: Sequence,
            events: Sequence, analytic_everywhere: bool = False, analytic: bool = True,
            exact: Callable[[np.ndarray], tuple] | None = None, pinf: tuple[float, float] = (0.0, 0.0),
            part: Callable[[np.ndarray], tuple] | None = None, long_ok=None):
    """The sharpened (lower, upper) of answers ``lo``, ``up`` to queries ``x`` (``kind`` "eps":
    deltas asked; "delta": epsilons asked).

    ``took``: seconds the first answer took; ``deadline``: ``time.perf_counter()`` time by which
    the work must end (None: none); ``finer(f, xs)``: the method's Interval at xs at an accuracy
    f times finer (None: step 1 is skipped); ``components``: (mechanism, count) pairs (the
    Chernoff bound) and ``events``: (event, count) pairs (the saddle-point accountant) of the
    composition; ``analytic_everywhere``: ask the saddle-point bounds for every wide answer,
    not only tiny ones (a grid limited by its budgets: the central-limit regime; so are
    compositions of :data:`LONG` steps or more, with the time left up to :data:`LONG_SECONDS`);
    ``analytic=False``: step 1 only (answers that are not delta or eps, e.g. trade-off powers);
    ``exact(xs)``: certified (lower, upper) of a single step composed once read off its own curve
    (:mod:`.single_step`), asked after step 1; the saddle-point bounds are then not asked (for one
    summand their Berry-Esseen terms certify nothing narrower, and they read the same curve);
    ``pinf``: bounds (D_lo, D_hi) on a +inf mass D outside ``components`` (of (eps0, delta0)
    steps): the answers are D + (1 - D) delta_components, so the Chernoff bounds of
    ``components`` are wrapped so, and the Renyi-DP and saddle-point bounds (of ``events``, which
    do not take such steps) are not asked; ``part(xs)``: certified (lower, upper) of a part of the
    composition (its exact steps): a post-processing of the whole, so its lower ends bound the
    whole's from below (asked with ``exact``, whatever ``analytic``); ``long_ok``: where the rule of
    :data:`LONG` may apply (default everywhere; the PLD accountant leaves out answers that its
    reversed curve reads next, which it does tighter).
    """
    lo, up = np.array(lo, dtype=float), np.array(up, dtype=float)
    if not wide(kind, lo, up).any():
        return lo, up
    # (scipy.optimize comes with it: imported only when an answer is wide, never on the common
    # path -- in forked children the import alone costs about 0.1 s)
    from .cgf import deadline as cgf_deadline
    took = max(took, 1e-3)

    def left() -> float:
        return math.inf if deadline is None else deadline - time.perf_counter()

    for f in FACTORS if finer is not None else ():
        idx = np.nonzero(wide(kind, lo, up))[0]
        if idx.size == 0:
            return lo, up
        if 2.0 * f * took > left() - MARGIN:
            break
        t1 = time.perf_counter()
        try:
            iv = finer(f, x[idx])
        except _SKIP:
            break
        took = max(took, (time.perf_counter() - t1) / f)
        _merge(lo, up, iv.lower, iv.upper, idx)
    if exact is not None:
        idx = np.nonzero(wide(kind, lo, up))[0]
        if idx.size:
            try:
                l2, u2 = exact(x[idx])
                _merge(lo, up, l2, u2, idx)
            except _SKIP:
                pass
    if part is not None:
        idx = np.nonzero(wide(kind, lo, up))[0]
        if idx.size:
            try:  # (closed forms: milliseconds; the lower ends only)
                l2, _ = part(x[idx])
                _merge(lo, up, l2, np.full(idx.size, np.inf), idx)
            except _SKIP:
                pass
    if not analytic:
        return lo, up
    d_lo, d_hi = (float(v) for v in pinf)
    if d_hi > 0:
        events = []  # (the Renyi-DP and saddle-point accountants do not take (eps0, delta0) steps)

    def with_pinf(v, up_side):  # D + (1 - D) v, rounded outwards
        d = d_hi if up_side else d_lo
        if d == 0:
            return v
        w = d + (1 - d) * np.asarray(v, dtype=float)
        return np.minimum(w * (1 + 4 * _U), 1.0) if up_side else np.maximum(w * (1 - 4 * _U), 0.0)
    small = (up < TINY) if kind == "delta" else (x < TINY)
    idx = np.nonzero(wide(kind, lo, up) & ~np.isfinite(up))[0] if kind == "eps" and events else []
    if len(idx):
        try:  # no finite upper end: the Renyi-DP conversion's (closed-form curves, milliseconds)
            _merge(lo, up, np.full(idx.size, -np.inf), rdp_epsilon(relation, events, x[idx]), idx)
        except _SKIP:
            pass
    idx = np.nonzero(wide(kind, lo, up) & small)[0]
    if idx.size and kind == "delta" and events:
        try:  # the Renyi-DP conversion first (closed-form curves: milliseconds, Gaussian noise only)
            _merge(lo, up, np.full(idx.size, -np.inf), rdp_delta(relation, events, x[idx]), idx)
        except _SKIP:
            pass
        idx = np.nonzero(wide(kind, lo, up) & small)[0]
    if idx.size and kind == "delta":
        try:  # the quick Chernoff bound next (one cumulant per tilt, about 80 tilts)
            stop = time.perf_counter() + SPA_SECONDS
            with cgf_deadline(stop if deadline is None else min(stop, deadline - MARGIN)):
                u2 = with_pinf(chernoff_delta(components, x[idx]), True)
            _merge(lo, up, np.full(idx.size, -np.inf), u2, idx)
        except _SKIP:
            pass
    idx = np.nonzero(wide(kind, lo, up) & (up > NEAR_ONE))[0] if kind == "delta" else []
    if len(idx):
        try:  # delta near 1 (the loss far above eps): the Chernoff lower bound (about 60 cumulants)
            stop = time.perf_counter() + SPA_SECONDS
            with cgf_deadline(stop if deadline is None else min(stop, deadline - MARGIN)):
                l2 = with_pinf(chernoff_lower_delta(components, x[idx]), False)
            _merge(lo, up, l2, np.full(idx.size, np.inf), idx)
        except _SKIP:
            pass
    long = np.full(lo.shape, sum(int(k) for _, k in events) >= LONG)
    if long_ok is not None:
        long &= np.asarray(long_ok, dtype=bool)
    ask = wide(kind, lo, up) & (((up < TINY) if kind == "delta" else small) | analytic_everywhere | long)
    idx = np.nonzero(ask)[0]
    if idx.size and events and exact is None and left() > SPA_SECONDS / 2 + MARGIN:
        from .spa import SPAAccountant

        # (a grid limited by its budgets has nothing better to spend the time left on: the tables
        # may use all of it; a long composition all of it up to LONG_SECONDS; elsewhere SPA_SECONDS)
        seconds = SPA_SECONDS
        if analytic_everywhere:
            seconds = max(SPA_SECONDS, left() - MARGIN)
        elif long[idx].any():
            seconds = max(SPA_SECONDS, min(left(), LONG_SECONDS) - MARGIN)
        try:  # (its cumulant tables stop short of the deadline: CGFDeadline)
            stop = time.perf_counter() + seconds
            with cgf_deadline(stop if deadline is None else min(stop, deadline - MARGIN)):
                spa = SPAAccountant(relation, on_edge="flag", t_range=SPA_T_RANGE)
                for ev, k in events:
                    spa.compose(ev, k)
                iv = spa.epsilon(x[idx]) if kind == "eps" else spa.delta(x[idx])
        except _SKIP:
            return lo, up
        _merge(lo, up, iv.lower, iv.upper, idx)
    return lo, up
