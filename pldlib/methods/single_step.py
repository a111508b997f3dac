"""One step composed once: its curve read off the step's own pair (docs/MATH.md 0.8).

A composition of a single step needs no composition machinery: delta(eps) of each branch is the
hockey-stick of its pair, delta(eps) = P(L > eps) - e^eps Q(L > eps), from the profile's sf values.
With the library's accuracy model of those values (:func:`~pldlib.profiles.base.value_error`) and
the rounding of the product and the difference,

    |computed - delta(eps)| <= err(sf_p) + e^eps err(sf_q) + 4 u (sf_p + e^eps sf_q),

so ``computed +- that`` are certified bounds (the upper end from the branch's upper pair, the
lower end from its lower pair; a max-profile upper pair is the larger of its two curves).  The
lower end is also at least 1 - e^eps (every pair, MATH 0.3).  eps(delta) is bracketed by
bisection that keeps a certificate at each end: an eps_u with upper(eps_u) <= delta (so
eps(delta) <= eps_u) and an eps_l with lower(eps_l) > delta (so eps(delta) >= eps_l), whatever
the computed curves' monotonicity.

The PRV and saddle-point accountants intersect their own certified answers with these where the
whole composition is one step (single releases, one-step trade-off curves), where their
machinery is loosest (a mesh of one step, Berry-Esseen for one summand).  Guarantee: certified
(both ends), to the accuracy of the profile's sf values.

A whole composition with a closed form (unsampled Gaussians, randomized response, one of each,
(eps0, delta0) steps: :func:`pldlib.exact.whole_exact`, docs/MATH.md section 12) is read off it
the same way (:func:`exact_of_accountant`, :func:`exact_delta_bounds`, :func:`exact_epsilon_bounds`):
the PLD accountant answers from it alone; the PRV and saddle-point accountants intersect with it,
where a lattice loss (randomized response) is what their own certificates bound worst.
"""
from __future__ import annotations

import math

import numpy as np

from ..profiles.base import value_error

_U = np.finfo(float).eps / 2
#: bisection steps of eps(delta) (an interval of 64 halved 80 times: below 1e-22)
ITERATIONS = 80


def single_step_branches(components) -> list | None:
    """[(label, upper profile, lower profile)] when ``components`` ([(step, count)]) is one step
    composed once, else None."""
    if len(components) != 1 or int(components[0][1]) != 1:
        return None
    try:
        return [(b.label, b.upper, b.lower) for b in components[0][0].branches()]
    except Exception:  # (a step without per-step pairs: nothing to read)
        return None


def _parts(profile) -> list:
    from ..profiles.mixtures import MaxProfile

    if isinstance(profile, MaxProfile):
        return _parts(profile.a) + _parts(profile.b)
    return [profile]


def _profile_delta_bounds(profile, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Certified (lower, upper) of ``profile``'s delta at ``eps`` (array), from its sf values (a
    max-profile: the larger of its parts' bounds)."""
    eps = np.asarray(eps, dtype=float)
    lo = np.zeros(eps.shape)
    up = np.zeros(eps.shape)
    for p in _parts(profile):
        sp = np.asarray(p.sf_p(eps), dtype=float)
        sq = np.asarray(p.sf_q(eps), dtype=float)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            # e^eps times sf_q and its error, in log space where e^eps alone would overflow
            esq = np.where(sq > 0, np.exp(eps + np.log(np.where(sq > 0, sq, 1.0))), 0.0)
            eerr = np.exp(eps + np.log(value_error(sq)))
            d = sp - esq
            err = value_error(sp) + eerr + 4.0 * _U * (sp + esq)
            u = np.minimum(d + err, 1.0)
            l_ = np.maximum(d - err, 0.0)
        u = np.where(np.isnan(u), 1.0, u)
        l_ = np.where(np.isnan(l_), 0.0, l_)
        up = np.maximum(up, u)
        lo = np.maximum(lo, l_)
    with np.errstate(over="ignore"):
        floor = np.maximum(-np.expm1(np.minimum(eps, 0.0)) * (1.0 - 4.0 * _U), 0.0)
    return np.maximum(lo, floor), up


def _branch_delta_bounds(upper, lower, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Certified (lower, upper) of one branch's delta(eps): the upper end from its upper pair, the
    lower end from its lower pair (never above the upper end)."""
    _, up = _profile_delta_bounds(upper, eps)
    lo = _profile_delta_bounds(lower, eps)[0] if lower is not upper else _profile_delta_bounds(upper, eps)[0]
    return np.minimum(lo, up), up


def _delta_bounds(branches, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Certified (lower, upper) of the relation's delta(eps): the maximum over the branches."""
    eps = np.asarray(eps, dtype=float)
    lo = np.zeros(eps.shape)
    up = np.zeros(eps.shape)
    for _, u_prof, l_prof in branches:
        l_, u = _branch_delta_bounds(u_prof, l_prof, eps)
        lo, up = np.maximum(lo, l_), np.maximum(up, u)
    return lo, up


def _upper_start(branches, deltas: np.ndarray) -> np.ndarray:
    """An eps per delta where the certified upper end is at most delta (NaN where none was found):
    the largest of the branches' loss ranges at tail delta / 4 (0 where a range is not finite),
    pushed right while the bound is still above."""
    hi = np.full(deltas.shape, -np.inf)
    for _, u_prof, _l in branches:
        for p in _parts(u_prof):
            sup = float(p.loss_sup())
            for j, d in enumerate(deltas):
                try:
                    e = float(p.eps_bounds(float(d) / 4.0)[1])
                except (ArithmeticError, ValueError):
                    e = math.nan
                if math.isfinite(sup):
                    e = sup if not math.isfinite(e) else min(e, sup)
                hi[j] = max(hi[j], e if math.isfinite(e) else 0.0)
    base = hi
    found = np.full(deltas.shape, np.nan)
    for step in (0.0, 0.5, 2.0, 8.0, 32.0, 128.0):
        todo = np.isfinite(base) & np.isnan(found)
        if not todo.any():
            break
        trial = np.where(todo, base + step, 0.0)
        fits = todo & (_delta_bounds(branches, trial)[1] <= deltas)
        found = np.where(fits, trial, found)
    return found


def _epsilon_bounds(branches, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Certified (lower, upper) of eps(delta) (docstring above); NaN where no certificate was found
    (the caller keeps its own answer there)."""
    deltas = np.asarray(deltas, dtype=float)
    hi = _upper_start(branches, deltas)
    ok = np.isfinite(hi)
    with np.errstate(divide="ignore"):
        a0 = np.log1p(-deltas)  # 1 - e^a0 = delta: a little left of it the floor exceeds delta
    a0 = a0 - 1e-9 * np.maximum(np.abs(a0), 1.0) - 1e-12
    a0 = np.where(np.isfinite(a0), a0, -745.0)
    lo_ok = ok & (_delta_bounds(branches, np.where(ok, a0, 0.0))[0] > deltas)
    # upper end: keep b with upper(b) <= delta; lower end: keep a with lower(a) > delta
    ua, ub = a0.copy(), np.where(ok, hi, 0.0)
    la, lb = a0.copy(), np.where(ok, hi, 0.0)
    for _ in range(ITERATIONS):
        um = 0.5 * (ua + ub)
        lm = 0.5 * (la + lb)
        lo_m, _ = _delta_bounds(branches, lm)
        _, up_m = _delta_bounds(branches, um)
        good_u = up_m <= deltas
        ub, ua = np.where(good_u, um, ub), np.where(good_u, ua, um)
        good_l = lo_m > deltas
        la, lb = np.where(good_l, lm, la), np.where(good_l, lb, lm)
    upper = np.where(ok, ub, np.nan)
    lower = np.where(lo_ok, la, np.where(ok, -np.inf, np.nan))
    return lower, upper


def of_accountant(acc) -> list | None:
    """:func:`single_step_branches` of an accountant's composition (cached on it while its steps
    are unchanged)."""
    key = tuple((id(s), int(k)) for s, k in acc.components)
    hit = acc.__dict__.get("_single_step")
    if hit is None or hit[0] != key:
        hit = (key, single_step_branches(acc.components))
        acc.__dict__["_single_step"] = hit
    return hit[1]


def branch_of(branches, label: str):
    """The (upper, lower) profiles of the branch ``label`` (None if absent)."""
    return next(((u, l_) for lab, u, l_ in branches if lab == label), None)


def intersect(lo, up, l2, u2):
    """(lower, upper) of two certified intervals of the same quantities: the larger lower end and
    the smaller upper end, NaN ends ignored; where they would cross (round-off) the first is kept."""
    lo, up = np.asarray(lo, dtype=float), np.asarray(up, dtype=float)
    nl = np.maximum(lo, np.nan_to_num(np.asarray(l2, dtype=float), nan=-np.inf))
    nu = np.minimum(up, np.nan_to_num(np.asarray(u2, dtype=float), nan=np.inf))
    ok = nl <= nu
    return np.where(ok, nl, lo), np.where(ok, nu, up)


#: what reading a curve may raise (a profile beyond floating point, a search that cannot bracket):
#: the answer is then NaN, which :func:`intersect` ignores
_SKIP = (ArithmeticError, ValueError, NotImplementedError, MemoryError)


def _guarded(fn, shape, *args):
    try:
        return fn(*args)
    except _SKIP:
        nan = np.full(shape, np.nan)
        return nan, nan.copy()


def profile_delta_bounds(profile, eps):
    """Certified (lower, upper) of ``profile``'s delta at ``eps`` (array), from its sf values (a
    max-profile: the larger of its parts' bounds); NaN where the values cannot be read."""
    return _guarded(_profile_delta_bounds, np.shape(eps), profile, eps)


def branch_delta_bounds(upper, lower, eps):
    """Certified (lower, upper) of one branch's delta(eps): the upper end from its upper pair, the
    lower end from its lower pair (never above the upper end); NaN where they cannot be read."""
    return _guarded(_branch_delta_bounds, np.shape(eps), upper, lower, eps)


def delta_bounds(branches, eps):
    """Certified (lower, upper) of the relation's delta(eps): the maximum over the branches; NaN
    where the curves cannot be read."""
    return _guarded(_delta_bounds, np.shape(eps), branches, eps)


def epsilon_bounds(branches, deltas):
    """Certified (lower, upper) of eps(delta) (module docstring); NaN where no certificate was
    found (the caller keeps its own answer there)."""
    return _guarded(_epsilon_bounds, np.shape(deltas), branches, deltas)


def exact_of_accountant(acc):
    """The closed form of an accountant's whole composition (:func:`pldlib.exact.whole_exact`), or
    None (cached on it while its steps are unchanged)."""
    from ..exact import whole_exact

    key = tuple((id(s), int(k)) for s, k in acc.components)
    hit = acc.__dict__.get("_whole_exact")
    if hit is None or hit[0] != key:
        try:
            ex = whole_exact([(s.event, int(k)) for s, k in acc.components], acc.relation)
        except _SKIP:
            ex = None
        hit = (key, ex)
        acc.__dict__["_whole_exact"] = hit
    return hit[1]


def exact_delta_bounds(ex, eps):
    """Certified (lower, upper) of delta(eps) from a closed form ``ex``; NaN where it cannot be read."""
    return _guarded(lambda e: ex.delta_bounds(np.asarray(e, dtype=float)), np.shape(eps), eps)


def exact_epsilon_bounds(ex, deltas):
    """Certified (lower, upper) of eps(delta) from a closed form ``ex``; NaN where it cannot be read."""
    return _guarded(lambda d: ex.epsilon_bounds(np.asarray(d, dtype=float)), np.shape(deltas), deltas)


def known_ends(acc, kind: str, x, lo, up):
    """(lo, up), an accountant's certified answers to ``x`` (``kind`` "delta": epsilons asked;
    "eps": deltas asked), intersected with what is read exactly: the step's own curve where the
    composition is one step composed once, and the closed form of a composition that has one
    (docs/MATH.md 0.8, 12)."""
    one = of_accountant(acc)
    if one is not None:
        lo, up = intersect(lo, up, *(delta_bounds(one, x) if kind == "delta" else epsilon_bounds(one, x)))
    ex = exact_of_accountant(acc)
    if ex is not None:
        lo, up = intersect(lo, up, *(exact_delta_bounds(ex, x) if kind == "delta" else exact_epsilon_bounds(ex, x)))
    return lo, up


def from_reverse(eps, r_lo, r_up):
    """Certified (lower, upper) of delta(eps) at eps < 0 from certified ends (r_lo, r_up) of the
    reversed relation's delta at -eps: delta(eps) = 1 - e^eps + e^eps delta_rev(-eps) (docs/MATH.md
    0.5), rounded outward.  At eps < 0 the curve is 1 - e^eps plus a term that is often far below
    the accuracy of a mesh or a Berry-Esseen bound; read this way it keeps the reversed answer's
    relative accuracy.  NaN ends stay NaN (ignored by :func:`intersect`)."""
    eps = np.asarray(eps, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        a = -np.expm1(eps)
        b = np.exp(eps)
        # (expm1, exp, the product, the scaling and the sum: at most 5 roundings of each term)
        lo = (a * (1.0 - 8.0 * _U) + b * np.asarray(r_lo, dtype=float) * (1.0 - 8.0 * _U)) * (1.0 - 2.0 * _U)
        up = (a * (1.0 + 8.0 * _U) + b * np.asarray(r_up, dtype=float) * (1.0 + 8.0 * _U)) * (1.0 + 2.0 * _U)
    return np.maximum(lo, 0.0), np.minimum(up, 1.0)


def bracket_epsilon(delta_bounds_at, deltas, lo, up, points: int = 32, rounds: int = 3):
    """Certified (lower, upper) of eps(delta) inside a certified bracket [lo, up] (arrays), from
    certified bounds of delta at any eps in it: ``delta_bounds_at(eps_1d) -> (lower, upper)`` or
    None (refused).  On ``points`` interior points of each bracket, an eps whose upper delta is
    <= delta certifies eps(delta) <= eps, and one whose lower delta exceeds delta certifies
    eps(delta) >= eps (the true curve does not increase); the bracket shrinks to the tightest
    certified points, ``rounds`` times (about 2 / (points + 1) of it each time), whatever the
    monotonicity of the computed bounds.  Where no point certifies anything the end is kept."""
    lo, up = np.array(lo, dtype=float), np.array(up, dtype=float)
    d = np.asarray(deltas, dtype=float)[:, None]
    t = np.linspace(0.0, 1.0, points + 2)[1:-1]
    for _ in range(rounds):
        grid = lo[:, None] + (up - lo)[:, None] * t[None, :]
        got = delta_bounds_at(grid.ravel())
        if got is None:
            break
        dl, du = (np.asarray(v, dtype=float).reshape(grid.shape) for v in got)
        with np.errstate(invalid="ignore"):
            ok_u, ok_l = du <= d, dl > d
        nu = np.where(ok_u, grid, np.inf).min(axis=1)
        nl = np.where(ok_l, grid, -np.inf).max(axis=1)
        lo, up = np.maximum(lo, nl), np.minimum(up, nu)
    return lo, up


def bracket_negative_epsilon(delta_bounds_at, deltas, lo, up, width: float = 0.01):
    """(lower, upper) of eps(delta) answers ``lo``, ``up`` (arrays) where those wider than ``width``
    (relative to at least 1e-3, an infinite end included) that reach below 0 are bracketed by
    :func:`bracket_epsilon` on ``delta_bounds_at`` (certified delta at eps < 0, e.g. read off the
    reversed curve, docs/MATH.md 0.5) from [max(lower, ln(1 - delta)), min(upper, 0)]: eps(delta)
    >= ln(1 - delta) for every pair (0.7), rounded down here.  The upper end is replaced only where
    a bracket point certified it (never by the search's top of 0)."""
    deltas = np.asarray(deltas, dtype=float)
    lo, up = np.array(lo, dtype=float), np.array(up, dtype=float)
    with np.errstate(invalid="ignore"):
        neg = np.nonzero((lo < 0) & ((up - lo) > width * np.maximum(np.abs(up), 1e-3)))[0]
    if not neg.size:
        return lo, up
    with np.errstate(divide="ignore"):
        floor = np.log1p(-deltas[neg]) * (1 + 1e-12) - 1e-300
    top = np.minimum(up[neg], 0.0)
    start = np.maximum(lo[neg], floor)
    ok = np.isfinite(start) & (start < top)
    if not ok.any():
        return lo, up
    l2, u2 = np.full(neg.size, np.nan), np.full(neg.size, np.nan)
    l2[ok], u2[ok] = bracket_epsilon(delta_bounds_at, deltas[neg][ok], start[ok], top[ok])
    lo[neg], up[neg] = intersect(lo[neg], up[neg], l2, np.where(u2 < top, u2, np.nan))
    return lo, up
