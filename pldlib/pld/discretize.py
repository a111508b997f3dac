"""From a privacy profile to a discrete PLD on a uniform grid (docs/MATH.md section 3).

Three discretisations, each with a stated direction:

* :func:`connect_the_dots` -- pessimistic, the best pessimistic PLD on the grid
  (seed 000, Algorithm 1).  Implemented from interval masses, which is the same
  algebra as the slope formula of docs/MATH.md 3.1 but avoids its second differences:
  the mass of L in each cell (eps_{i-1}, eps_i] is split between the two ends so
  that both its P-mass and its Q-mass are kept, i.e. the right end receives
  ``E / (1 - e^{-h})`` with ``E = P(cell) - e^{eps_{i-1}} Q(cell)``.  The curve of
  the result equals the true curve at every grid point and is linear in e^eps
  in between, hence lies above it (convexity).
* :func:`convex_hull_optimistic` -- optimistic: tangents at neighbouring grid
  points evaluated at each grid point, lower convex hull, then the
  connect-the-dots formulas on the hull values (Doroshenko et al., *Connect the Dots*, Algorithm 2).
  The hull lies under the true curve and is itself a valid hockey-stick curve.
* :func:`privacy_buckets` -- the classic rounding of losses up (pessimistic) or
  down (optimistic); a comparison baseline, and the optimistic side's fall-back:
* :func:`optimistic` -- the optimistic PLD the accountants use: the hull, or the losses
  rounded down where the pair's Q-mass lies left of the grid and the hull lost it.

Every function also returns, in ``DiscretePLD.mass_err``, a bound on the
floating-point error of each mass; the composition adds it on the pessimistic
side and subtracts it on the optimistic side, so round-off cannot push a
bound to the wrong side.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import _deadline
from .grid import DiscretePLD
from ..profiles.base import (MAX_SINGLE_LOSS, SF_REL_ACCURACY, TAIL_FROM, TAIL_LOG_ACCURACY,  # noqa: F401
                             VALUE_ABS_FLOOR, PrivacyProfile, cell_errors, loss_range, value_error)

__all__ = ["Grid", "grid_for", "hull_offset", "connect_the_dots", "lattice_points", "kept_points",
           "convex_hull_optimistic", "optimistic", "privacy_buckets"]

_U = np.finfo(float).eps / 2  # unit round-off
_N_TANGENTS = 512  # tangent points tried in the cell around 0 of an offset lattice


@dataclass(frozen=True)
class Grid:
    """Grid points eps_i = (start + i) * h + offset, i = 0..n (n + 1 points)."""

    h: float
    start: int
    n: int
    offset: float = 0.0

    @property
    def eps(self) -> np.ndarray:
        return (self.start + np.arange(self.n + 1)) * self.h + self.offset


def hull_offset(profile: PrivacyProfile, h: float) -> float:
    """Offset of the lattice for the optimistic hull at spacing h (docs/MATH.md 3.2).

    When the single-step loss support has an edge e (its end nearest to 0, e.g. ln(1 - q) for
    Poisson remove) with 0 < |e| < 2h, a lattice through 0 has no point strictly between 0 and
    e, and no optimistic PLD on it has delta(0) > 0.  The offset then puts a point at lam * e,
    for the lam in 2^-1 ... 2^-8 (29 values) or 1 - 2^-2 ... 1 - 2^-10 (a point just inside the
    edge, where a kink of the curve there loses least) whose cell around 0 admits a tangent line (see
    :func:`_middle_cell`) giving the largest delta(0), less what the lattice point next to the
    edge loses when it lies outside that cell.  0 otherwise (no such edge, or
    no admissible offset: the lattice through 0 stays sound, only looser).
    """
    try:
        lo, hi = profile.support_edges()
    except (ValueError, ArithmeticError):
        return 0.0
    edges = [e for e in (lo, hi) if e != 0.0 and math.isfinite(e)]
    if not edges:
        return 0.0
    e = min(edges, key=abs)
    if abs(e) >= 2.0 * h or h > 100.0:  # (h > 100: e^{eps} of the cell overflows)
        return 0.0
    # a point just inside the edge, at (1 - 2^-2 ... 1 - 2^-10) e: a kink of the curve at the edge
    # (mass of L piled up there, e.g. Poisson remove at small sigma) then sits between that point
    # and the next one out, whose tangent is the floor line 1 - alpha; the point itself keeps
    # all but about 2^-k of the curve's excess over that line (docs/MATH.md 3.2, 3.6)
    lams = np.concatenate([0.5 ** np.arange(1.0, 8.25, 0.25), 1.0 - 0.5 ** np.arange(2.0, 11.0)])
    offs = lams * e
    # per lam: the cell [e_a, e_b] of the lattice (i + s/h) h that contains 0, its outer
    # neighbours (whose tangents give the candidates there, as in convex_hull_optimistic)
    # and the tangent points of _middle_cell -- all evaluated in one call
    e_a = np.where(np.abs(offs) < h, np.where(offs < 0, offs, offs - h), offs + np.floor(-offs / h) * h)
    e_b = e_a + h
    tau = e_a[:, None] + (e_b - e_a)[:, None] * np.linspace(0.0, 1.0, _N_TANGENTS)[None, :]
    pts = np.concatenate([e_a - h, e_a, e_b, e_b + h, tau.ravel()])
    try:
        hv = np.asarray(profile.delta(pts), dtype=float)
        sv = np.asarray(profile.sf_q(pts), dtype=float)
        s_next = np.asarray(profile.sf_q(np.nextafter(e_b + h, -np.inf)), dtype=float)
    except (ValueError, ArithmeticError):
        return 0.0
    m = lams.size
    x = np.exp(pts[: 4 * m]).reshape(4, m)
    H, S = hv[: 4 * m].reshape(4, m), sv[: 4 * m].reshape(4, m)
    c_a = np.minimum(H[1], H[0] - S[0] * (x[1] - x[0]))
    c_b = np.minimum(H[2], H[3] + s_next * (x[3] - x[2]))
    h_t, s_t = hv[4 * m:].reshape(m, -1), sv[4 * m:].reshape(m, -1)
    # the lattice point next to the edge on the inside, when it lies outside that cell: its
    # candidate follows the floor (the tangent at its outer neighbour, beyond the edge), so the
    # curve's excess over the floor there, H(p) - max(0, 1 - e^p), is lost from it outwards
    if e < 0:
        p = e_a - np.floor((e_a - e) / h) * h
        p = np.where(p <= e, p + h, p)
        outside = p < e_a - 0.5 * h
    else:
        p = e_b + np.floor((e - e_b) / h) * h
        p = np.where(p >= e, p - h, p)
        outside = p > e_b + 0.5 * h
    loss = np.zeros(m)
    if outside.any():
        try:
            hp = np.asarray(profile.delta(p[outside]), dtype=float)
        except (ValueError, ArithmeticError):
            return 0.0
        loss[outside] = np.maximum(hp - np.maximum(-np.expm1(p[outside]), 0.0), 0.0)
    best, best_at1 = 0.0, -math.inf
    for j in range(m):
        try:
            _, _, at1 = _middle_cell_choice(e_a[j], e_b[j], c_a[j], c_b[j], tau[j], h_t[j], s_t[j])
        except (ValueError, ArithmeticError):
            continue
        score = at1 - loss[j]  # (delta(0) kept, less what the point next to the edge loses)
        if score > best_at1:
            # (a lattice point past +-h: its representative next to 0, e_a, keeps the shifts small)
            best, best_at1 = float(offs[j] if abs(offs[j]) < h else e_a[j]), score
    return best



def grid_for(profile: PrivacyProfile, h: float, tail: float, max_points: int | None = None,
             offset: float = 0.0) -> Grid:
    """The grid of spacing h (points (start + i) h + offset) covering the loss range of
    ``profile`` up to ``tail`` mass.

    The grid always has points on both sides of eps = 0 (with ``offset=0``: eps = 0 strictly
    inside), as the hull construction needs.  Raises :class:`~pldlib.GridTooLargeError`
    beyond ``max_points``.
    """
    lo, hi = loss_range(profile, tail)
    n_points = (max(hi, h) - min(lo, -h)) / h
    if max_points is not None and n_points > max_points:
        from .compose import GridTooLargeError

        raise GridTooLargeError(
            f"one step needs {n_points:,.0f} grid points at interval {h:.3g} (limit {max_points:,}); "
            "use a coarser interval", need=int(math.ceil(n_points)), limit=int(max_points)
        )
    start = min(int(math.floor((lo - offset) / h)), -1)
    stop = max(int(math.ceil((hi - offset) / h)), 1)
    return Grid(h=h, start=start, n=stop - start, offset=float(offset))


def _finite_pld(masses, grid: Grid, p_inf: float, pessimistic: bool, mass_err, own: bool = False) -> DiscretePLD:
    """The PLD of these masses (negative ones raised to 0) and errors on ``grid``, trimmed to
    its first and last point holding either; ``own``: both are float arrays of the caller's
    that may be changed in place (no fresh copies of the grid's size)."""
    masses = np.maximum(np.asarray(masses, dtype=float), 0.0, out=masses if own else None)
    mass_err = np.maximum(np.asarray(mass_err, dtype=float), 0.0, out=mass_err if own else None)
    # first and last index holding a mass or an error (what np.nonzero(masses + mass_err) finds)
    if masses.size and (masses[0] != 0 or mass_err[0] != 0) and (masses[-1] != 0 or mass_err[-1] != 0):
        i0, i1 = 0, masses.size  # (both ends hold something: no search)
    else:
        some = (masses != 0) | (mass_err != 0)
        if not some.any():  # all mass at +inf (or dropped)
            i0, i1 = 0, 1
        else:
            i0, i1 = int(np.argmax(some)), some.size - int(np.argmax(some[::-1]))
    whole = i0 == 0 and i1 == masses.size  # (then the fresh arrays themselves, no copy)
    return DiscretePLD(
        h=grid.h,
        start=grid.start + i0,
        masses=masses if whole else masses[i0:i1].copy(),
        p_inf=float(p_inf),
        pessimistic=pessimistic,
        mass_err=mass_err if whole else mass_err[i0:i1].copy(),
        shift=float(grid.offset),
    )


# (SF_REL_ACCURACY, the relative accuracy assumed of a profile's sf/cdf values of order 1, grows
# with |ln v| in the tails: pldlib.profiles.base.value_error, docs/MATH.md 4.3)
#: deltas evaluated as exp(log-space expression): relative error ~ this * (2 + |ln delta|)
#: (log_ndtr carries ~1e-14 relative error, amplified by |ln delta| through exp)
LOG_DELTA_REL_ACCURACY = 64 * _U


def connect_the_dots(profile: PrivacyProfile, grid: Grid, keep: np.ndarray | None = None) -> DiscretePLD:
    """Pessimistic PLD whose curve interpolates the true curve at the grid points.

    ``keep``: connect the dots at these grid points only (increasing indices into
    ``0..grid.n``, both ends included; the masses stay on the grid's lattice, zero at the
    points left out).  The curve then interpolates the true curve at the points kept and is
    linear in e^eps between them -- above the curve of the whole grid, so pessimistic as
    well, only looser where points are left out (docs/MATH.md 3.1).

    Guarantee: pessimistic.  Round-off in the split of a cell between its two
    ends is resolved towards the right end (pessimistic), so the masses
    themselves keep total 1; ``mass_err`` bounds the remaining round-off of
    the cell masses, which the composition adds on the pessimistic side.
    """
    _deadline.check("discretising a step")
    one_minus = -math.expm1(-grid.h)  # 1 - e^{-(b - a)} of a cell of one step
    if keep is None:
        eps = grid.eps
    else:
        keep = np.asarray(keep, dtype=np.int64)
        gaps = np.diff(keep) if keep.ndim == 1 else None
        if gaps is None or keep.size < 2 or keep[0] != 0 or keep[-1] != grid.n or np.any(gaps <= 0):
            raise ValueError("keep must be increasing grid indices from 0 to grid.n")
        # (the same numbers as grid.eps there: start + keep are exact integers as floats)
        eps = keep.astype(float)
        eps += grid.start
        eps *= grid.h
        eps += grid.offset
        wide = np.flatnonzero(gaps != 1)
        one_minus = np.full(gaps.size, one_minus)
        one_minus[wide] = -np.expm1(-grid.h * gaps[wide])
    x = np.exp(eps)
    vals = profile.grid_values(eps)  # one pass: sf/cdf of both sides at every point
    P, Q = profile.consecutive_masses(eps, vals)
    # errors of the sf/cdf values each cell mass was differenced from (value_error: relative
    # accuracy growing with |ln v| in the tails), and the subtraction's rounding
    sfp, cdp, sfq, cdq = vals
    # (below: each array made once and then worked in place, the operations of
    #  eP = ce_P + 2u P, eQ = ce_Q + 2u Q, eE = eP + e^a eQ + 2u (P + e^a Q),
    #  right = clip((E + eE) / (1 - e^-(b - a)), 0, P), left = P - right)
    buf = np.multiply(P, 2 * _U)
    eP = cell_errors(sfp, cdp, profile.p_inf)
    eP += buf
    eQ = cell_errors(sfq, cdq)
    eQ += np.multiply(Q, 2 * _U, out=buf)
    # E = P(cell) - e^{a} Q(cell) = int_cell (e^L - e^a) dQ  in [0, (e^b - e^a) Q(cell)]
    xQ = x[:-1] * Q
    E = P - xQ
    eE = np.multiply(x[:-1], eQ, out=eQ)
    eE += eP
    xQ += P
    xQ *= 2 * _U
    eE += xQ
    # e^{a} is a rounded exp of a rounded lattice point: off by (4 + 2|a|) u e^a (times Q), and
    # the quotient below rounds by 2u of |E| (docs/MATH.md 3.6)
    eE += (4.0 + 2.0 * np.abs(eps[:-1])) * _U * x[:-1] * Q
    eE += 4.0 * _U * np.abs(E)
    right = np.add(E, eE, out=E)
    right /= one_minus
    np.clip(right, 0.0, P, out=right)  # round the split to the right
    left = np.subtract(P, right, out=P)
    # each cell's right end, then its left end, on the whole grid (zero at points left out)
    ends = (slice(1, None), slice(None, -1)) if keep is None else (keep[1:], keep[:-1])
    masses, err = np.zeros((2, grid.n + 1))
    masses[ends[0]] = right
    masses[ends[1]] += left
    err[ends[0]] = eP
    err[ends[1]] += eP
    below = float(cdp[0])
    masses[0] += below
    d_n = float(profile.delta(eps[-1]))
    beyond = max(float(sfp[-1]) - d_n, 0.0)  # = e^{eps_n} Q(L > eps_n)
    masses[-1] += beyond
    ve = value_error(np.array([below, beyond + d_n]))  # (both ends in one call)
    err[0] += float(ve[0])
    err[-1] += float(ve[1])
    # the cells end at the rounded points fl(eps_i), the masses sit at the exact lattice points:
    # moving a mass m by u|eps_i| moves the curve by at most 2u|eps_i| m (docs/MATH.md 3.6)
    err += (2.0 * _U) * np.abs(eps if keep is None else grid.eps) * masses
    p_inf = d_n * (1 + SF_REL_ACCURACY + (LOG_DELTA_REL_ACCURACY * (2.0 + abs(math.log(d_n))) if d_n > 0 else 0.0))
    return _finite_pld(masses, grid, p_inf, True, err, own=True)


#: :func:`kept_points` thins only coarse cells between coarse points that together carry at most
#: this fraction of the tilted mass (the extra looseness of eps scales with it: at most 2.4e-7
#: relative on the 22 benchmark shapes)
THIN_REL = 1e-7


def lattice_points(grid: Grid, k: int) -> np.ndarray:
    """Indices of the grid points on the lattice of every k-th point ((start + i) % k == 0) and
    of both ends."""
    idx = np.arange((-grid.start) % k, grid.n + 1, k, dtype=np.int64)
    if idx.size == 0:
        return np.array([0, grid.n], dtype=np.int64) if grid.n > 0 else np.zeros(1, dtype=np.int64)
    head, tail = idx[0] != 0, idx[-1] != grid.n
    if not (head or tail):
        return idx
    out = np.empty(idx.size + head + tail, dtype=np.int64)
    out[0], out[-1] = 0, grid.n
    out[int(head): out.size - int(tail)] = idx
    return out


def kept_points(grid: Grid, coarse: DiscretePLD, theta: float, rel: float = THIN_REL) -> np.ndarray | None:
    """Grid points to connect the dots at (``connect_the_dots(..., keep=)``) for a composition
    tilted by ``theta``: all points near where the tilted law exp(theta L) P carries mass, every
    k-th point elsewhere (k = coarse.h / grid.h).

    ``coarse`` is a PLD of the same profile on the lattice of every k-th point of ``grid``'s
    (e.g. connect-the-dots at spacing k h).  Its points are ranked by tilted mass m_j
    exp(theta eps_j); the lightest ones that together carry at most ``rel`` of the total are
    light.  A coarse cell keeps only its two ends when both are light, every grid point
    otherwise; both ends of the grid are kept.  Any choice is pessimistic (see
    :func:`connect_the_dots`); this one only decides where the looser curve costs nothing that
    matters.  None when the lattices do not line up.
    """
    k = int(round(coarse.h / grid.h))
    if (k < 2 or abs(coarse.h - k * grid.h) > 1e-12 * coarse.h or grid.offset != 0.0 or coarse.shift != 0.0
            or not (math.isfinite(theta) and theta >= 0.0) or not 0.0 < rel < 1.0):
        return None
    n = grid.n
    with np.errstate(divide="ignore"):
        lw = np.log(coarse.masses) + theta * coarse.eps_grid
    top = float(np.max(lw, initial=-np.inf))
    if not math.isfinite(top):
        return None
    # busy: all but the lightest coarse points that together carry at most rel of the tilted mass
    w = np.exp(lw - top)
    ws = np.sort(w)
    j = int(np.searchsorted(np.cumsum(ws), rel * float(np.sum(w)), side="right"))  # the j lightest
    # (strictly below the lightest point left heavy: ties at the threshold stay busy)
    busy = w >= ws[j] if j < ws.size else np.zeros(w.size, dtype=bool)
    # coarse cell c (between coarse points c and c + 1) is kept whole when either end is busy
    cell = busy[:-1] | busy[1:]
    # grid position p lies in coarse cell floor((grid.start + p) / k) - coarse.start
    c = np.arange(grid.start // k, (grid.start + n) // k + 1) - coarse.start
    inside = (c >= 0) & (c < cell.size)
    whole = np.zeros(c.size, dtype=bool)
    whole[inside] = cell[c[inside]]
    first = grid.start - (grid.start // k) * k  # offset of position 0 in its coarse cell
    keep = np.repeat(whole, k)[first: first + n + 1]
    keep[lattice_points(grid, k)] = True  # the coarse lattice and both ends
    return np.flatnonzero(keep)


def _monotone_chain(xs: np.ndarray, ys: np.ndarray):
    """Lower hull by Andrew's monotone chain (fallback for long non-convex runs)."""
    hx: list[float] = []
    hy: list[float] = []
    for x, y in zip(xs.tolist(), ys.tolist()):
        while len(hx) >= 2 and (hy[-1] - hy[-2]) * (x - hx[-1]) >= (y - hy[-1]) * (hx[-1] - hx[-2]):
            hx.pop()
            hy.pop()
        hx.append(x)
        hy.append(y)
    return np.array(hx), np.array(hy)


def _above_far_chords(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Points above the chord joining a point on their left to one on their right: the
    left neighbour to the last point, the first point to the right neighbour, and the
    points 2, 8, 32, ... places away on both sides (none of them is a lower-hull vertex).
    Removes in one pass long concave runs that neighbour passes peel one point at a time."""
    n = xs.size
    bad = np.zeros(n, dtype=bool)
    if n < 3:
        return bad
    with np.errstate(divide="ignore", invalid="ignore"):
        sl = np.diff(ys) / np.diff(xs)  # slope (j-1, j) at sl[j-1]
        # (j-1, j) steeper than (j, last)  /  (0, j) steeper than (j, j+1)
        bad[1:-1] |= sl[:-1] > (ys[-1] - ys[1:-1]) / (xs[-1] - xs[1:-1])
        bad[1:-1] |= (ys[1:-1] - ys[0]) / (xs[1:-1] - xs[0]) > sl[1:]
        s = 2
        while 2 * s < n:
            mid = slice(s, n - s)
            left = (ys[mid] - ys[: n - 2 * s]) / (xs[mid] - xs[: n - 2 * s])
            right = (ys[2 * s :] - ys[mid]) / (xs[2 * s :] - xs[mid])
            bad[mid] |= left > right
            s *= 4
    return bad


#: vectorised passes of :func:`_lower_hull_values` before the (linear, exact) monotone chain
#: finishes what is left: pathological concave runs took ~50 passes of ~50 ms on 10^6 points
HULL_PASSES = 16
#: a pass flagging at most this many points hands them to :func:`_local_repair` (late passes
#: peel one or two points each: ~16 vectorised passes and a full monotone chain otherwise)
LOCAL_REPAIR_FROM = 48
#: removals :func:`_local_repair` may make before it hands back to the vectorised passes (for
#: good: a longer cascade is a concave run, which :func:`_above_far_chords` removes faster)
LOCAL_REPAIR_MAX = 128


def _local_repair(xs: np.ndarray, ys: np.ndarray, flagged: np.ndarray):
    """Remove, one at a time, points lying above the chord of their current neighbours,
    starting from the ``flagged`` indices and re-testing the neighbours of each removal
    (the neighbour test of the vectorised passes, on a linked list).  Returns the points
    kept and whether the sequence is now convex (False: LOCAL_REPAIR_MAX removals were made
    first; the points kept are still a superset of the hull's vertices)."""
    n = xs.size
    X, Y = xs, ys  # (scalar reads: the same IEEE operations as the vectorised test)
    prev = np.arange(-1, n - 1)
    nxt = np.arange(1, n + 1)
    alive = np.ones(n, dtype=bool)
    stack = flagged.tolist()
    removed = 0
    done = True
    while stack:
        j = stack.pop()
        if not alive[j] or j == 0 or j == n - 1:
            continue
        a, b = int(prev[j]), int(nxt[j])
        if (Y[j] - Y[a]) / (X[j] - X[a]) > (Y[b] - Y[j]) / (X[b] - X[j]):
            alive[j] = False
            nxt[a], prev[b] = b, a
            stack.append(a)
            stack.append(b)
            removed += 1
            if removed >= LOCAL_REPAIR_MAX:
                done = False
                break
    return xs[alive], ys[alive], done, alive


def _lower_hull_values(px: np.ndarray, py: np.ndarray, x_eval: np.ndarray, vertices: bool = False):
    """Lower convex hull of points (px, py) (px strictly increasing), evaluated at x_eval.

    Points lying above the chord of their neighbours are removed in vectorised
    passes (each removed point is provably not a vertex of the lower hull) until
    the remaining sequence is convex; when a pass removes few points, chords to
    farther points (:func:`_above_far_chords`) are tested too, and once a pass flags at
    most LOCAL_REPAIR_FROM points they are removed one at a time with their neighbours
    re-tested (:func:`_local_repair`, once).  After HULL_PASSES passes Andrew's monotone
    chain finishes on the points left.  ``vertices``: also return the hull's vertices (xs, ys)
    and their indices into px.
    """
    xs, ys = px, py
    ix = np.arange(px.size) if vertices else None  # (the kept points' indices into px)
    repair = True
    for it in range(HULL_PASSES):
        slope = np.diff(ys) / np.diff(xs)
        # point j violates convexity if slope[j-1] > slope[j]
        bad = np.zeros(xs.size, dtype=bool)
        bad[1:-1] = slope[:-1] > slope[1:]
        n_bad = int(np.count_nonzero(bad))
        if not n_bad:
            break
        if repair and it >= 1 and n_bad <= LOCAL_REPAIR_FROM:
            xs, ys, convex, alive = _local_repair(xs, ys, np.flatnonzero(bad))
            if ix is not None:
                ix = ix[alive]
            if convex:
                break
            repair = False  # a long cascade (a concave run): the far-chord passes are faster
            continue
        if it >= 2 and n_bad * 64 < xs.size:
            bad |= _above_far_chords(xs, ys)  # few removals per pass: a long concave run
        xs, ys = xs[~bad], ys[~bad]
        if ix is not None:
            ix = ix[~bad]
    else:
        xs, ys = _monotone_chain(xs, ys)
        xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        if ix is not None:
            ix = np.searchsorted(px, xs)
    if vertices:
        return np.interp(x_eval, xs, ys), xs, ys, ix
    return np.interp(x_eval, xs, ys)


def convex_hull_optimistic(profile: PrivacyProfile, grid: Grid) -> DiscretePLD:
    """Optimistic PLD from tangents + lower convex hull (*Connect the Dots*, Algorithm 2).

    In alpha form (alpha = e^eps): candidate values at each grid point are the
    tangent of h at the neighbouring grid point on the side away from alpha = 1
    (left neighbour for alpha < 1, right neighbour for alpha > 1, both at 1),
    (0, 1) at alpha = 0 and h(inf) = P(L = inf) at the last point.  Each
    candidate lies below h, so their lower convex hull does too; tangents of
    slope in [-1, 0] keep it >= max(0, 1 - alpha).  Guarantee: optimistic.
    """
    _deadline.check("discretising a step")
    eps = grid.eps
    x = np.exp(eps)
    n = grid.n
    hv, s = _delta_and_sf_q(profile, eps)  # s = -h'(alpha+) = Q(L > eps): the right derivative
    _deadline.check("discretising a step")
    # -h'(alpha-) = Q(L >= eps): the same as s without atoms
    s_left = s if getattr(profile, "atomless", False) else profile.sf_q(np.nextafter(eps, -np.inf))
    istar = -grid.start  # index of eps = 0
    c = np.empty(n + 1)
    # alpha < 1: tangent at the left neighbour (alpha_{-1} = 0 with h(0) = 1, h'(0+) = -Q(L > -inf))
    s_left0 = float(profile.sf_q(-np.inf))
    prev_h = np.concatenate([[1.0], hv[:-1]])
    prev_s = np.concatenate([[s_left0], s[:-1]])
    prev_x = np.concatenate([[0.0], x[:-1]])
    left_tan = prev_h - prev_s * (x - prev_x)
    # alpha > 1: tangent at the right neighbour, evaluated to its left: the left
    # derivative gives the higher (still supporting) line at atoms on the grid
    next_h = np.concatenate([hv[1:], [profile.p_inf]])
    next_s = np.concatenate([s_left[1:], [0.0]])
    next_x = np.concatenate([x[1:], [np.inf]])
    with np.errstate(invalid="ignore"):
        right_tan = next_h + next_s * (next_x - x)
    if grid.offset != 0.0:
        # offset lattice: no point at alpha = 1; the cell [x_lo, x_lo + 1] contains it
        ilo = int(np.searchsorted(eps, 0.0, side="left")) - 1
        if not 0 <= ilo < n - 1:
            raise ValueError("the offset grid must have points on both sides of eps = 0")
        c[: ilo + 1] = left_tan[: ilo + 1]
        c[ilo + 1 : n] = right_tan[ilo + 1 : n]
        c[n] = profile.p_inf
        ca, cb, _ = _middle_cell(profile, eps[ilo], eps[ilo + 1], c[ilo], c[ilo + 1])
        c[ilo], c[ilo + 1] = ca, cb
        ec = _candidate_errors(eps, x, hv, s, s_left, s_left0, grid.h, middle=(ilo, ilo + 1))
        return _hull_pld(x, c, hv, grid, profile, ec)
    c[:istar] = left_tan[:istar]
    c[istar] = min(left_tan[istar], right_tan[istar])
    c[istar + 1 : n] = right_tan[istar + 1 : n]
    c[n] = profile.p_inf
    # The two cells next to alpha = 1 use the best admissible tangent point instead of
    # their far ends (a kink of h inside such a cell, e.g. at ln(1-q) for Poisson
    # remove, would otherwise pull the candidate at alpha = 1 down to 0).  Each
    # candidate stays under the tangent of its cell, so chords stay under h.
    a, b = x[istar - 1], x[istar + 1]
    tau_l = _best_tangent(profile, eps[istar - 1], 0.0, lambda h_t, s_t, x_t: h_t - s_t * (a - x_t) >= 1.0 - a,
                          keep_high=True)
    tau_r = _best_tangent(profile, 0.0, eps[istar + 1], lambda h_t, s_t, x_t: h_t - s_t * (b - x_t) >= 0.0,
                          keep_high=False, left_derivative=True)
    c[istar - 1] = min(c[istar - 1], tau_l(a))
    c[istar] = min(tau_l(1.0), tau_r(1.0))
    # (when alpha_{i*+1} is the last point, its candidate p_inf must also sit under tau_r)
    c[istar + 1] = min(c[istar + 1], tau_r(b))
    ec = _candidate_errors(eps, x, hv, s, s_left, s_left0, grid.h, middle=(istar - 1, istar, istar + 1))
    return _hull_pld(x, c, hv, grid, profile, ec)


def optimistic(profile: PrivacyProfile, grid: Grid) -> DiscretePLD:
    """The optimistic PLD of ``profile`` on ``grid``: the tangents + hull PLD
    (:func:`convex_hull_optimistic`), or the losses rounded down (:func:`privacy_buckets`) where
    the hull has pushed a mass to the grid's first point and rounding down keeps a larger mean
    loss (docs/MATH.md 3.4, "Q-mass left of the grid").

    The hull is a curve under h drawn from the point (0, 1); where the pair's Q-mass lies far left
    of the grid (the loss range is cut at the P-tail, e.g. an add-direction pair with its Q-mass q
    near -1/(2 sigma^2)), its first chord must fall with slope -1, and the whole curve collapses
    to about 1 - alpha: a 2-step delta(0) of 2e-6 against 0.349.  Rounding every loss down to the
    grid (mass below the first point dropped to -inf) gives a stochastically smaller loss, hence a
    lower delta for every composition (each composed loss is lowered pointwise): optimistic as
    well, and there within h of the truth.  Either is certified; the choice is only a matter of
    tightness, and is made when the hull's first mass exceeds twice P(L <= eps_1) (elsewhere the
    hull, O(h^2), is kept without computing the other) and the rounded-down mean loss is more than
    one spacing above the hull's (a hull that kept its mass is within h of the truth's mean, and
    then stays: it is the tighter one).  Guarantee: optimistic."""
    hull = convex_hull_optimistic(profile, grid)
    first = float(hull.masses[0]) if hull.start == grid.start and hull.masses.size else 0.0
    if not first > 1e-9:
        return hull
    try:
        bottom = float(profile.cdf_p(grid.eps[min(1, grid.n - 1)]))
    except (ValueError, ArithmeticError):
        return hull
    if not first > 2.0 * bottom + 1e-9:
        return hull
    down = privacy_buckets(profile, grid, pessimistic=False)
    return down if _mean_loss(down) > _mean_loss(hull) + grid.h else hull


def _mean_loss(pld: DiscretePLD) -> float:
    """The mean of a finite-grid PLD's losses, mass missing from 1 counted one spacing below its
    first point, +inf mass one spacing above its last (a comparison of two PLDs on one grid)."""
    x = (pld.start + np.arange(pld.masses.size)) * pld.h + pld.shift
    m = np.asarray(pld.masses, dtype=float)
    missing = max(1.0 - float(m.sum()) - pld.p_inf, 0.0)
    return float(m @ x) + missing * (x[0] - pld.h) + pld.p_inf * (x[-1] + pld.h)


def _middle_cell(profile, e_a: float, e_b: float, c_a: float, c_b: float) -> tuple[float, float, float]:
    """Candidates at the ends of the cell [e^e_a, e^e_b] that contains alpha = 1 (offset lattice,
    docs/MATH.md 3.2): both are lowered onto one tangent line T of h at a point of the cell, so
    the hull's chord over the cell stays under T <= h.  T must be admissible: T(a) >= 1 - a
    (the floor of a pair's curve left of 1) and T(b) >= 0.  Among 512 tangent points (and
    only among those tested admissible) the one giving the largest chord value at alpha = 1
    is used; returns the two candidates and that value.  Raises ValueError when none is
    admissible (the caller falls back to a lattice through 0)."""
    tau = np.linspace(e_a, e_b, _N_TANGENTS)
    h_t, s_t = (np.asarray(v, dtype=float) for v in _delta_and_sf_q(profile, tau))  # -s_t: a subgradient
    return _middle_cell_choice(e_a, e_b, c_a, c_b, tau, h_t, s_t)


def _middle_cell_choice(e_a, e_b, c_a, c_b, tau, h_t, s_t) -> tuple[float, float, float]:
    """:func:`_middle_cell` given the curve h_t and slopes -s_t at the tangent points tau."""
    if not (-700.0 < e_a < e_b < 700.0):  # e^eps would overflow: no usable cell
        raise ValueError("the cell containing eps = 0 is too wide for floating point")
    a, b = math.exp(e_a), math.exp(e_b)
    x_t = np.exp(tau)
    ta = h_t - s_t * (a - x_t)
    tb = h_t - s_t * (b - x_t)
    margin = 8.0 * _U
    ok = (ta >= (1.0 - a) * (1.0 + margin) + margin * np.abs(h_t)) & (tb >= margin * np.abs(h_t)) \
        & np.isfinite(ta) & np.isfinite(tb)
    if not ok.any():
        raise ValueError("no admissible tangent in the cell containing eps = 0")
    na = np.minimum(c_a, ta)
    nb = np.minimum(c_b, tb)
    at1 = na + (nb - na) * (1.0 - a) / (b - a)
    j = int(np.argmax(np.where(ok, at1, -np.inf)))
    return float(na[j]), float(nb[j]), float(at1[j])


def _hull_pld(x, c, hv, grid, profile, ec=None) -> DiscretePLD:
    """The optimistic PLD from candidate values c (each under h, docs/MATH.md 3.2).

    ``ec`` bounds the absolute round-off of each candidate and of h there
    (:func:`_candidate_errors`): every candidate is lowered by it *before* the hull, so the
    hull is that of numbers each under the exact candidate -- under h, whatever the
    round-off -- and the masses' own error bound only covers the hull's and the slope
    formula's arithmetic (docs/MATH.md 3.6); a lowered candidate is raised back to the floor
    max(0, 1 - alpha), which keeps it under its cells' supporting lines."""
    c = np.minimum(c, hv)  # lowering a candidate keeps every chord under h
    if ec is not None:
        # (the last point's candidate p_inf is exact: ec = 0 there).  Every cell's supporting line
        # lies on or above the floor max(0, 1 - alpha) at both ends of the cell (slope >= -1 from
        # a point on or above it, or admissible), so a lowered candidate raised back to the floor
        # (rounded down) stays under that line, and the hull of points on or above the floor
        # stays a valid curve (docs/MATH.md 3.6)
        floor = np.maximum(-np.expm1(grid.eps), 0.0)
        floor *= 1.0 - 4.0 * _U
        c = np.maximum(c - ec, floor)
    px = np.concatenate([[0.0], x])
    py = np.concatenate([[1.0], c])
    v0, vx, vy, vix = _lower_hull_values(px, py, x, vertices=True)
    # A hull of points that dip below h(inf) rises again at the end; its running
    # minimum is still convex, under h, and non-increasing (the missing +inf mass
    # then sits at the last grid point: optimistic).
    v = np.minimum.accumulate(v0)
    # round-off of the curve values: relative u (2 + |ln d|) from log-space evaluation ...
    with np.errstate(divide="ignore"):
        dv_err = LOG_DELTA_REL_ACCURACY * (2.0 + np.abs(np.log(np.maximum(v, 1e-320)))) * v + SF_REL_ACCURACY * v
    # ... and the coordinates: alpha_i = fl(exp(fl(eps_i))) is off by (4 + 2|eps_i|) u alpha_i from
    # the lattice point's e^eps_i; a hull value between vertices a, b moves by at most the
    # segment's |slope| times the three points' coordinate errors (docs/MATH.md 3.6)
    dv_err += _hull_coordinate_errors(x, grid.eps, vx, vy, vix, v0, v)
    masses, p_inf, abs_err = _ctd_from_values(x, v, dv_err, h=grid.h, eps=grid.eps)
    return _finite_pld(masses, grid, p_inf, False, abs_err)


def _hull_coordinate_errors(xm, eps, vx, vy, vix, v0, v) -> np.ndarray:
    """Bound on how far each hull value v_i moves when the hull's coordinates xm_i = fl(exp(eps_i))
    are replaced by the exact e^{eps_i} of the lattice points (docs/MATH.md 3.6): at a vertex not
    at all (its value is its candidate's); between the vertices a < i < b of its segment by at
    most |slope| (ex_a + ex_b + ex_i), ex = (4 + 2|eps|) u xm the coordinate error ((0, 1) is
    exact).  Where alpha is near 1 and h is small this is u / h relative to the slopes, which the
    masses' bound then carries.  Points the running minimum lowered take the error of the point
    that set it."""
    n = xm.size
    err = np.zeros(n)
    if vx.size >= 2 and vx.size - 1 < n:  # (some points lie between vertices; vx[0]: the exact (0, 1))
        vi = vix[1:] - 1  # grid indices of the vertices
        is_v = np.zeros(n, dtype=bool)
        is_v[vi] = True
        nv = np.flatnonzero(~is_v)
        k = np.minimum(np.cumsum(is_v)[nv] + 1, vx.size - 1)  # segment [vx[k - 1], vx[k]] of each
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.abs((vy[k] - vy[k - 1]) / (vx[k] - vx[k - 1]))
        slope = np.where(np.isfinite(slope), slope, 0.0)
        ex = lambda j: (4.0 + 2.0 * np.abs(eps[j])) * _U * xm[j]  # noqa: E731
        ea = np.where(k - 1 == 0, 0.0, ex(vi[np.maximum(k - 2, 0)]))
        err[nv] = slope * (ea + ex(vi[k - 1]) + ex(nv)) * (1.0 + 8.0 * _U)
    lowered = v < v0
    if lowered.any():  # (the running minimum: the value and error of the point that set it)
        j = np.maximum.accumulate(np.where(~lowered, np.arange(n), 0))
        err = np.where(lowered, err[j], err)
    return err


def _candidate_errors(eps, x, hv, s, s_left, s_left0, h, middle=()) -> np.ndarray:
    """Bounds on the absolute round-off of the hull's candidate values (docs/MATH.md 3.6).

    A curve value h = P(L > eps) - e^eps Q(L > eps) is off by up to the two terms' own errors,
    value_error(P) + e^eps value_error(Q) (plus roundings): where h is much smaller than P
    (around eps = 0 for a very private pair, and everywhere left of 0, where h ~ 1 - e^eps), that
    is an absolute error of order u, not a relative one.  e^eps itself is a rounded exp of a
    rounded lattice point: off by (4 + 2|eps|) u e^eps.  A tangent value at a neighbour,
    h' - s' (alpha - alpha'), collects the neighbour's errors of h', of s' (times the step) and
    of both alphas (times s'), and the roundings of its two operations.  The candidates of the
    cells next to alpha = 1 (``middle``: tangent points inside those cells) take the same terms
    bounded over the span of those cells (P, Q and h are non-increasing, alpha increasing)."""
    n = x.size
    ex = (4.0 + 2.0 * np.abs(eps)) * _U * x
    xs = x * s
    P = np.maximum(hv + xs, 0.0)
    # value_error's relative factor SF + TAIL max(|ln v| - FROM, 0) (|ln v| rounded up by 4u of
    # itself) at P, Q(L > eps) and (with atoms) Q(L >= eps)
    rows = [P, s, hv] if s_left is s else [P, s, hv, s_left]
    with np.errstate(divide="ignore"):
        lv = np.abs(np.log(np.maximum(np.stack(rows), 1e-320)))
    lv *= 1.0 + 4.0 * _U
    rel = np.maximum(np.delete(lv, 2, axis=0) - TAIL_FROM, 0.0)
    rel *= TAIL_LOG_ACCURACY
    rel += SF_REL_ACCURACY
    es = rel[1] * s + VALUE_ABS_FLOOR
    esl = es if s_left is s else rel[2] * s_left + VALUE_ABS_FLOOR
    eh = rel[0] * P + x * es + 4.0 * _U * (P + xs)  # (+ the roundings of P - e^eps Q)
    eh += LOG_DELTA_REL_ACCURACY * (2.0 + lv[2]) * hv  # (the log-space evaluation, MATH 3.5)
    eh += VALUE_ABS_FLOOR
    ec = np.empty(n)
    dx = np.diff(x)
    # left tangents (at the left neighbour; alpha_{-1} = 0 with h = 1, slope -Q(L > -inf))
    ec[0] = float(value_error(np.array([s_left0]))[0]) * x[0] + s_left0 * ex[0] + 4.0 * _U * (1.0 + s_left0 * x[0])
    ec[1:] = eh[:-1] + es[:-1] * dx + s[:-1] * (ex[1:] + ex[:-1]) + 4.0 * _U * (hv[:-1] + s[:-1] * dx)
    # right tangents (at the right neighbour, left derivative)
    right = np.zeros(n)
    right[:-1] = eh[1:] + esl[1:] * dx + s_left[1:] * (ex[1:] + ex[:-1]) + 4.0 * _U * (hv[1:] + s_left[1:] * dx)
    out = np.maximum(np.maximum(ec, right), eh)  # (a candidate is one of the two, capped at h)
    if middle:
        # tangent points tau between the points lo and hi around the middle cells, evaluated at
        # an alpha there: P(L > tau), Q(L > tau), h(tau) are at most their values at lo and
        # e^tau, alpha at most x[hi], |alpha - e^tau| at most x[hi] - x[lo]
        lo, hi = max(min(middle) - 1, 0), min(max(middle) + 1, n - 1)
        span = x[hi] - x[lo]
        eh_t = (float(value_error(np.array([P[lo]]))[0]) + x[hi] * es[lo] + 4.0 * _U * (P[lo] + x[hi] * s[lo])
                + float(np.max(eh[lo:hi + 1])))
        out[list(middle)] = (eh_t + es[lo] * span + s[lo] * 2.0 * ex[hi]
                             + 4.0 * _U * (hv[lo] + s[lo] * span)) * (1.0 + 8.0 * _U)
    out[-1] = 0.0  # (the last point's candidate is p_inf itself)
    return out


def _delta_and_sf_q(profile, eps):
    """(profile.delta(eps), profile.sf_q(eps)), sharing the work where the profile can."""
    both = getattr(profile, "delta_and_sf_q", None)
    return both(eps) if both is not None else (profile.delta(eps), profile.sf_q(eps))


def _best_tangent(profile, e_lo: float, e_hi: float, admissible, keep_high: bool,
                  left_derivative: bool = False):
    """Tangent line of h at alpha = e^tau, tau in [e_lo, e_hi], as far towards alpha = 1 as
    ``admissible`` allows (admissibility is monotone in tau).  Returns T(alpha).
    Any subgradient gives a supporting line; ``left_derivative`` picks -Q(L >= tau).

    ``admissible(h_t, s_t, x_t)`` is vectorised over tangent points (value h_t, slope
    -s_t at alpha = x_t).  The search evaluates 127 points per round (9 rounds resolve
    2^63 steps, as fine as the bisection it replaces; the exact boundary matters where the
    best tangent sits at a kink of h, e.g. ln(1 - q)); only a line tested admissible (or
    ``good`` itself, admissible by the caller's contract) is ever returned.
    """

    def params(tau):
        tau = np.asarray(tau, dtype=float)
        left = left_derivative and not getattr(profile, "atomless", False)
        if left:
            h_t = profile.delta(tau)
            s_t = profile.sf_q(np.nextafter(tau, -np.inf))
        else:
            h_t, s_t = _delta_and_sf_q(profile, tau)
        return np.asarray(h_t, dtype=float), np.asarray(s_t, dtype=float), np.exp(tau)

    def line(tau):
        h_t, s_t, x_t = (float(np.asarray(v).reshape(-1)[0]) for v in params(np.array([tau])))
        return lambda alpha: h_t - s_t * (alpha - x_t)

    # keep_high: admissible at e_lo, look for the largest admissible tau; else mirror
    good, bad = (e_lo, e_hi) if keep_high else (e_hi, e_lo)
    if bool(np.asarray(admissible(*params(np.array([bad]))))[0]):
        return line(bad)
    frac = np.arange(1, 128) / 128.0
    tested = None  # (h_t, s_t, x_t) of ``good`` once a round has tested it admissible
    for _ in range(9):
        pts = good + (bad - good) * frac
        h_t, s_t, x_t = params(pts)
        ok = np.asarray(admissible(h_t, s_t, x_t), dtype=bool)
        first_bad = int(np.argmin(ok)) if not ok.all() else pts.size
        if first_bad > 0:
            good = float(pts[first_bad - 1])
            tested = (float(h_t[first_bad - 1]), float(s_t[first_bad - 1]), float(x_t[first_bad - 1]))
        if first_bad < pts.size:
            bad = float(pts[first_bad])
        if good == bad or abs(bad - good) <= 4 * np.finfo(float).eps * max(abs(good), abs(bad), 1e-300):
            break
    if tested is None:
        return line(good)
    h_g, s_g, x_g = tested  # the very line tested admissible
    return lambda alpha: h_g - s_g * (alpha - x_g)


def _ctd_from_values(x: np.ndarray, d: np.ndarray, d_err: np.ndarray, h: float | None = None,
                     eps: np.ndarray | None = None):
    """Connect-the-dots masses from curve values d_i at alpha_i = x_i (docs/MATH.md 3.1).

    B_{-1} = (1 - d_0)/x_0, B_{i-1} = (d_{i-1} - d_i)/(x_i - x_{i-1}), B_n = 0,
    m_i = x_i (B_{i-1} - B_i), p_inf = d_n.  Returns masses, p_inf and a bound on
    the absolute round-off of each mass given bounds ``d_err`` on the values.

    On a uniform lattice (``h`` and the points ``eps`` given) x_i - x_{i-1} is taken as
    x_{i-1} expm1(h): relative error (6 + 2|eps|) u against the exact e^{eps_i} - e^{eps_{i-1}},
    where the difference of two rounded exps would be off by ~4u x / (x h), i.e. u / h relative
    (docs/MATH.md 3.6); that relative error, and the x_i's own in m_i, enter the bound.
    """
    if h is not None and eps is not None and x.size > 1 and h < 1.0:
        # (for h >= 1 the plain difference is within ~2u relative, covered by the 4u B term)
        dx = x[:-1] * math.expm1(h)
        rx = (6.0 + 2.0 * np.abs(eps)) * _U  # relative error of x_i (and of dx_i: one more rounding)
    else:
        dx = np.diff(x)
        rx = None
    B = np.empty(x.size + 1)
    B[0] = (1.0 - d[0]) / x[0]
    B[1:-1] = (d[:-1] - d[1:]) / dx
    B[-1] = 0.0
    B = np.maximum(B, 0.0)
    m = x * (B[:-1] - B[1:])
    # |error of B_j| <= 4u (|d_j| + |d_{j+1}|) / dx_j + 2u B_j
    eB = np.empty_like(B)
    eB[0] = (4.0 * _U * (1.0 + d[0]) + d_err[0]) / x[0]
    eB[1:-1] = (d_err[:-1] + d_err[1:] + 2.0 * _U * (np.abs(d[:-1]) + np.abs(d[1:]))) / dx + 4.0 * _U * B[1:-1]
    eB[-1] = 0.0
    if rx is not None:
        eB[0] += B[0] * rx[0]
        eB[1:-1] += B[1:-1] * (rx[:-1] + rx[1:])
    abs_err = x * (eB[:-1] + eB[1:]) + 2.0 * _U * np.abs(m)
    if rx is not None:
        abs_err += rx * np.abs(m)
    return np.maximum(m, 0.0), max(float(d[-1]), 0.0), abs_err


def privacy_buckets(profile: PrivacyProfile, grid: Grid, pessimistic: bool) -> DiscretePLD:
    """Privacy buckets (baseline): round each loss up (pessimistic) or down (optimistic)."""
    eps = grid.eps
    P, _ = profile.interval_masses(eps[:-1], eps[1:])
    masses = np.zeros(grid.n + 1)
    beyond_finite = max(float(profile.sf_p(eps[-1])) - profile.p_inf, 0.0)
    if pessimistic:
        masses[1:] += P
        masses[0] += float(profile.cdf_p(eps[0]))
        p_inf = profile.p_inf + beyond_finite
    else:
        masses[:-1] += P
        masses[-1] += beyond_finite
        # mass strictly below eps_0 is dropped (rounded down to -inf); an atom at eps_0 stays
        masses[0] += max(float(profile.cdf_p(eps[0])) - float(profile.cdf_p(np.nextafter(eps[0], -np.inf))), 0.0)
        p_inf = profile.p_inf
    err = np.zeros(grid.n + 1)
    cells = cell_errors(profile.sf_p(eps), profile.cdf_p(eps), profile.p_inf) + 2 * _U * P
    if pessimistic:
        err[1:] += cells
    else:
        err[:-1] += cells
    err += value_error(masses)  # (the end terms; more than enough for the cells' own)
    return _finite_pld(masses, grid, p_inf, pessimistic, err)
