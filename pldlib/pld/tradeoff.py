"""Certified trade-off curves (f-DP) from composed PLDs (docs/MATH.md section 10).

Convention (MATH.md 10): a test rejects on a set A; its type I error is alpha = Q(A)
and its power (true-positive rate) is P(A); the trade-off function is
beta(alpha) = 1 - max{P(A) : Q(A) <= alpha} (randomised tests allowed).  It is the
convex conjugate of the hockey-stick curve delta(eps) = delta_{P||Q}(eps):

    power(alpha) = 1 - beta(alpha) = min(1, inf_eps [delta(eps) + e^eps alpha]).

For a curve of a non-negative measure (masses m_i at eps_i, constant c),
curve(eps) = c + sum_i m_i (1 - e^{eps - eps_i})_+, the infimum is the piecewise-linear
interpolation of the Neyman-Pearson points

    (alpha_i, power_i) = (B'_i, c + A_i),  A_i = sum_{j >= i} m_j,  B'_i = sum_{j >= i} m_j e^{-eps_j},

with (0, c) first and the constant c + A_0 beyond B'_0: exact (the curve is convex
and piecewise linear in e^eps, and its slopes are -B'_i).

Guarantees, for a :class:`~pldlib.pld.compose.Composition` (upper curve U, lower curve
L, alias term chi, valid for eps >= valid_from = v):

* **power upper bound** (= certified LOWER bound on beta; pessimistic, no attack is
  stronger): delta <= U on eps >= v, so power <= inf_{eps >= v} [U(eps) + e^eps alpha];
  for v = -inf this is the interpolation above, otherwise its last piece is replaced by
  the line U(v) + e^v alpha;
* **power lower bound** (= certified UPPER bound on beta; optimistic, some attack is at
  least this strong): for any split s >= v, delta(eps) >= L(eps) - chi(s) for eps >= s (chi
  decreases) and delta(eps) >= delta(s) >= L(s) - chi(s) for eps < s; hence
  power >= min(phi_L(alpha), L(s)) - chi(s) (the best of 64 splits is kept), and
  power >= alpha (the random test).

Floating point: the tail sums are sums of non-negative terms (relative error at most
n u, n the number of points), so the upper ends are raised and the lower ends lowered
by a relative margin of 16 n u, and 1 - power is rounded outward.

Several directions (add_remove: remove and add): the relation's power is the point-wise
MAXIMUM of the directions' powers (a fixed pair of neighbours is one direction), so the
bounds are computed per direction, each from that direction's own curve, and combined by
the maximum of the lower ends and the maximum of the upper ends (:func:`max_directions`).
Conjugating the maximum of the directions' curves instead would give the power of the
convex envelope of min_b beta_b, which can exceed every direction's power: its lower end
is then not certified (docs/MATH.md section 10.5).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from .compose import Composition
from .grid import GridMeasure

__all__ = ["power_bounds", "np_power", "gdp_mu_bounds", "gaussian_tradeoff", "implied_tradeoff",
           "alpha_array", "DEFAULT_ALPHA_MIN", "profile_power", "pinf_power", "max_directions"]

_U = np.finfo(float).eps / 2
#: default smallest alpha over which a Gaussian-DP mu is certified (see :func:`gdp_mu_bounds`)
DEFAULT_ALPHA_MIN = 1e-12


def alpha_array(name: str, alpha) -> np.ndarray:
    """alpha as a 1-d float array in [0, 1]; ValueError naming ``name`` otherwise."""
    try:
        a = np.atleast_1d(np.asarray(alpha, dtype=float)).ravel()
    except (TypeError, ValueError):
        raise TypeError(f"{name}: must be a number or an array of numbers in [0, 1], got {alpha!r}") from None
    if a.size == 0:
        raise ValueError(f"{name}: empty")
    bad = ~((a >= 0.0) & (a <= 1.0))
    if bad.any():
        raise ValueError(f"{name}: must lie in [0, 1], got {float(a[bad][0])!r}")
    return a


def _np_points(meas: GridMeasure, first: int = 0):
    """(x, y) of the Neyman-Pearson points of ``meas`` restricted to indices >= first,
    ascending in x, with (0, c) first; plus (x_0, y_0) = (B'_first, c + A_first)."""
    grid, A, B, _, _, _ = meas._table
    grid, A, B = grid[first:], A[first:], B[first:]
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        x = np.where(B > 0, np.exp(np.log(np.where(B > 0, B, 1.0)) - grid), 0.0)
    y = meas.const + A
    xs = np.concatenate([[0.0], x[::-1]])
    ys = np.concatenate([[meas.const], y[::-1]])
    # x and y are non-decreasing in exact arithmetic; enforce it against round-off (a
    # monotone cumulative max changes each value by at most its round-off)
    xs = np.maximum.accumulate(xs)
    ys = np.maximum.accumulate(ys)
    return xs, ys, grid


def np_power(meas: GridMeasure, alpha: np.ndarray, valid_from: float = -np.inf) -> np.ndarray:
    """inf over eps >= valid_from of [meas.curve(eps) + e^eps alpha] (exact, see module doc),
    without floating-point margins."""
    alpha = np.asarray(alpha, dtype=float)
    grid_all = meas.eps_grid
    if grid_all.size == 0:
        return np.full(alpha.shape, float(meas.const))
    first = 0
    if valid_from > -np.inf:
        first = int(np.searchsorted(grid_all, valid_from, side="left"))
        if first >= grid_all.size:
            # only the constant is to the right of v: U(v) + e^v alpha with U(v) = const
            with np.errstate(over="ignore"):
                return meas.const + math.exp(min(valid_from, 700.0)) * alpha
    xs, ys, grid = _np_points(meas, first)
    out = np.interp(alpha, xs, ys)
    beyond = alpha > xs[-1]
    if valid_from > -np.inf and beyond.any():
        # the minimiser would lie left of the first valid point: use the line at eps_first
        e0 = float(grid[0])
        u0 = float(meas.delta(np.array([e0]))[0])
        with np.errstate(over="ignore"):
            out = np.where(beyond, u0 + math.exp(min(e0, 700.0)) * alpha, out)
    return out


def vertex_eps(meas: GridMeasure, alpha: float) -> float:
    """The eps at which inf_eps [curve(eps) + e^eps alpha] is attained (a grid point): where a
    tilted composition should be centred to read the power at ``alpha`` accurately."""
    grid, _, B, _, _, _ = meas._table
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        x = np.where(B > 0, np.exp(np.log(np.where(B > 0, B, 1.0)) - grid), 0.0)
    # x is non-increasing in i: the first index with x_i <= alpha
    i = int(np.searchsorted(-x, -alpha, side="left"))
    return float(grid[min(i, grid.size - 1)])


def _chi(comp: Composition) -> float:
    if comp.alias_log_bound == -np.inf:
        return 0.0
    if comp.theta == 0.0:
        return float(math.exp(min(comp.alias_log_bound, 700.0)))
    return float(comp.alias_term(np.array([comp.valid_from]))[0])


def power_bounds(comp: Composition, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Certified (lower, upper) bounds on the power 1 - beta(alpha) of the pair whose curve
    ``comp`` brackets (module doc; docs/MATH.md section 10).  ``lower`` is alpha (the
    random test) when ``comp`` has no lower curve."""
    alpha = np.asarray(alpha, dtype=float)
    v = float(comp.valid_from)
    up = np_power(comp.upper, alpha, v)
    n = comp.upper.masses.size
    rho = 16.0 * _U * (n + 2)
    up = np.minimum(up * (1.0 + rho) + 4.0 * _U * alpha, 1.0)
    if comp.lower is None:
        lo = alpha.copy()
    else:
        phi = np_power(comp.lower, alpha)
        rho_l = 16.0 * _U * (comp.lower.masses.size + 2)
        if v > -np.inf:
            # split at any s >= v: power >= min(phi_L(alpha), L(s)) - chi(s) (chi decreases in
            # eps, so a split further right pays a smaller alias term); best of 64 splits
            g = comp.lower.eps_grid
            splits = np.linspace(v, max(float(g[-1]), v), 64)
            ls = comp.lower.delta(splits)
            chis = comp.alias_term(splits)
            cand = np.minimum(phi[:, None], ls[None, :]) * (1.0 - rho_l) - chis[None, :]
            lo = np.max(cand, axis=1)
        else:
            lo = phi * (1.0 - rho_l) - _chi(comp)
        lo = np.maximum(lo, alpha)
    lo = np.minimum(lo, up)
    return lo, up


def profile_power(eps: np.ndarray, d_lo: np.ndarray, d_up: np.ndarray, alpha: np.ndarray):
    """Certified (lower, upper) power of ONE pair from bounds d_lo <= delta <= d_up of its own
    curve at increasing points e_0 < ... < e_K (docs/MATH.md 10.2, 10.5):

        power <= min_k [d_up(e_k) + e^{e_k} alpha]           (every eps is a witness),
        power >= min(d_lo(e_0), min_k [d_lo(e_{k+1}) + e^{e_k} alpha], e^{e_K} alpha)

    (delta non-increasing, e^eps increasing: on [e_k, e_{k+1}] the objective is at least
    d_lo(e_{k+1}) + e^{e_k} alpha), and power >= alpha (the random test).  ``d_lo`` must bound
    the curve of one pair, never a maximum over pairs (module doc).  NaN ends count as the
    trivial bounds (d_up = 1, d_lo = 0)."""
    eps = np.asarray(eps, dtype=float)
    alpha = np.asarray(alpha, dtype=float)
    du = np.asarray(d_up, dtype=float)
    dl = np.asarray(d_lo, dtype=float)
    du = np.where(np.isnan(du), 1.0, np.minimum(du, 1.0))
    dl = np.where(np.isnan(dl), 0.0, np.clip(dl, 0.0, 1.0))
    with np.errstate(over="ignore"):
        E = np.exp(eps)
    up = np.empty(alpha.shape)
    lo = np.empty(alpha.shape)
    for j0 in range(0, alpha.size, 256):  # bounded memory
        a = alpha[j0:j0 + 256, None]
        with np.errstate(over="ignore", invalid="ignore"):
            up[j0:j0 + 256] = np.min(du[None, :] + E[None, :] * a, axis=1)
            if eps.size > 1:
                cells = np.min(dl[None, 1:] + E[None, :-1] * a, axis=1)
            else:
                cells = np.full(a.shape[0], np.inf)
            lo[j0:j0 + 256] = np.minimum(np.minimum(cells, dl[0]), E[-1] * a[:, 0])
    # round-off of these few operations (one exp, one product, one sum): a relative 8u each way
    up = np.minimum(up * (1 + 8 * _U), 1.0)
    lo = np.maximum(lo * (1 - 8 * _U), alpha)
    return np.minimum(lo, up), up


def profile_argmins(eps: np.ndarray, d_lo: np.ndarray, d_up: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """The grid indices where the two minima of :func:`profile_power` are attained, and the (at
    most 16 lowest) cells whose lower value is still below the upper minimum -- the cells that
    can hold the true minimum, where refining narrows the lower bound (for refining the eps grid
    there; only the work depends on them, never the bounds)."""
    du = np.where(np.isnan(d_up), 1.0, np.minimum(d_up, 1.0))
    dl = np.where(np.isnan(d_lo), 0.0, np.clip(d_lo, 0.0, 1.0))
    with np.errstate(over="ignore"):
        E = np.exp(eps)
    out = []
    for j0 in range(0, alpha.size, 256):
        a = alpha[j0:j0 + 256, None]
        with np.errstate(over="ignore", invalid="ignore"):
            ups = du[None, :] + E[None, :] * a
            out.append(np.argmin(ups, axis=1))
            if eps.size > 1:
                cells = dl[None, 1:] + E[None, :-1] * a
                out.append(np.argmin(cells, axis=1))
                k = min(16, cells.shape[1])
                low = np.argpartition(np.nan_to_num(cells, nan=np.inf), k - 1, axis=1)[:, :k]
                keep = np.take_along_axis(cells, low, axis=1) < np.min(ups, axis=1)[:, None]
                out.append(low[keep])
    return np.unique(np.concatenate(out)) if out else np.zeros(0, dtype=int)


def pinf_power(D_bounds, power_fn, alpha: np.ndarray):
    """Power bounds of a pair whose curve is D + (1 - D) delta'(eps) (a +inf mass D in
    [D_lo, D_hi], as taken out of (eps0, delta0) steps), from ``power_fn(x) -> (lower, upper)``,
    certified power bounds p' of the pair of delta' (docs/MATH.md 10.5):

        power(alpha) = D + (1 - D) p'(alpha / (1 - D)),

    non-decreasing in D and in the argument; so the lower end takes D_lo and the argument
    rounded down, the upper end D_hi and the argument rounded up (p' = 1 beyond 1)."""
    D_lo, D_hi = float(D_bounds[0]), float(D_bounds[1])
    alpha = np.asarray(alpha, dtype=float)
    if D_hi >= 1.0:
        return np.ones(alpha.shape), np.ones(alpha.shape)
    a_lo = np.minimum(alpha / (1.0 - D_lo) * (1 - 4 * _U), 1.0)
    a_hi = np.minimum(alpha / (1.0 - D_hi) * (1 + 4 * _U), 1.0)
    n = alpha.size
    l, u = power_fn(np.concatenate([a_lo, a_hi]))
    l, u = np.asarray(l, dtype=float)[:n], np.asarray(u, dtype=float)[n:]
    lo = (D_lo + (1.0 - D_lo) * l) * (1 - 4 * _U)
    up = np.where(a_hi >= 1.0, 1.0, np.minimum((D_hi + (1.0 - D_hi) * u) * (1 + 4 * _U), 1.0))
    lo = np.maximum(np.maximum(lo, alpha), D_lo * (1 - 4 * _U))
    return np.minimum(lo, up), up


def max_directions(bounds) -> tuple[np.ndarray, np.ndarray]:
    """(max_b lower_b, max_b upper_b) of per-direction power bounds [(lower_b, upper_b), ...]: the
    relation's power is the point-wise maximum of its directions' powers (module doc)."""
    bounds = list(bounds)
    lo = np.max([np.asarray(b[0], dtype=float) for b in bounds], axis=0)
    up = np.max([np.asarray(b[1], dtype=float) for b in bounds], axis=0)
    return np.minimum(lo, up), up


def beta_from_power(lo_power, up_power):
    """(beta lower, beta upper) = (1 - up_power, 1 - lo_power), rounded outward."""
    up_power = np.asarray(up_power, float)
    lo_power = np.asarray(lo_power, float)
    # 1 - x is exact for x in [1/2, 1] (Sterbenz); round outward below
    b_lo = 1.0 - up_power
    b_lo = np.maximum(np.where(up_power < 0.5, np.nextafter(b_lo, -np.inf), b_lo), 0.0)
    b_up = 1.0 - lo_power
    b_up = np.minimum(np.where(lo_power < 0.5, np.nextafter(b_up, np.inf), b_up), 1.0)
    return b_lo, b_up


def _mu_grid(alpha_min: float, symmetric: bool, n: int = 4000) -> np.ndarray:
    """Increasing alphas covering [alpha_min, 1/2] (symmetric) or [alpha_min, 1 - alpha_min],
    log-spaced towards the ends."""
    left = np.geomspace(alpha_min, 0.5, n)
    if symmetric:
        return left
    right = 1.0 - left[::-1]
    return np.unique(np.concatenate([left, right]))


def gdp_mu_bounds(power_fn, alpha_min: float = DEFAULT_ALPHA_MIN, symmetric: bool = True, n: int = 4000):
    """Certified bounds on the smallest mu with beta(alpha) >= G_mu(alpha) for alpha in
    [alpha_min, 1/2] (``symmetric``: a relation whose trade-off is symmetric, beta = beta^-1,
    as add_remove and substitution; then G_mu <= beta on [alpha_min, 1/2] carries over to the
    mirrored range, since G_mu is symmetric too) or [alpha_min, 1 - alpha_min],
    G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu) (docs/MATH.md 10).

    beta >= G_mu at alpha  <=>  mu >= m(alpha) := Phi^-1(power(alpha)) - Phi^-1(alpha).
    ``power_fn(alpha) -> (lower, upper)`` gives certified power bounds.  Lower end: the
    maximum of m over grid points with the power's lower bound (any alpha is a valid
    witness).  Upper end: on a cell [a, b], Phi^-1(power(alpha)) <= Phi^-1(power_up(b))
    and -Phi^-1(alpha) <= -Phi^-1(a) (both monotone), so the maximum over cells of
    Phi^-1(power_up(b)) - Phi^-1(a) bounds the supremum.  +inf means no mu is certified
    (for the lower end: certified that no mu holds on the range).
    """
    a = _mu_grid(alpha_min, symmetric, n)
    plo, pup = power_fn(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        za = special.ndtri(a)
        m_lo = special.ndtri(plo) - za
        m_up = special.ndtri(pup[1:]) - za[:-1]
    lower = float(np.nanmax(m_lo))
    upper = float(np.nanmax(m_up))
    # a margin for ndtri's own round-off (a few ulps of values up to ~40)
    return max(lower - 1e-12, 0.0), max(upper + 1e-12, 0.0)


def gaussian_tradeoff(mu: float, alpha) -> np.ndarray:
    """G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu) (the mu-GDP curve, an exact closed form)."""
    alpha = np.asarray(alpha, dtype=float)
    return special.ndtr(-special.ndtri(alpha) - mu)


def implied_tradeoff(epsilon: float, delta: float, alpha) -> np.ndarray:
    """f_{eps,delta}(alpha) = max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)):
    the trade-off implied by a single (eps, delta)-DP guarantee under a symmetric relation."""
    alpha = np.asarray(alpha, dtype=float)
    return np.maximum.reduce([np.zeros_like(alpha), 1.0 - delta - math.exp(epsilon) * alpha,
                              math.exp(-epsilon) * (1.0 - delta - alpha)])
