"""The PRV accountant (seed 003, Gopi, Lee & Wutschitz; docs/MATH.md section 5), with certified bounds.

``account_prv(mechanism, steps, eps_error=..., delta_error=...)`` follows the
paper's algorithm -- truncate each step's privacy random variable (PRV, the
privacy loss Y = ln dP/dQ under P), discretise it on a mesh h with a
*mean-preserving* shift, compose by FFT, read delta~(eps) off the composed pmf
and widen it to

    delta~(eps + t) - eta  <=  delta(eps)  <=  delta~(eps - t) + eta

-- but every term of (t, eta) is bounded rigorously, so ``lower <= truth <=
upper`` holds for every mechanism, sampling scheme and neighbouring relation
that :func:`pldlib.account` supports (the PRV of each branch comes from the
profile's sf/cdf; branches are composed separately and the answers are the
maximum over branches).  Answers are :class:`~pldlib.Interval` answers with an ``estimate``
(lower, estimate, upper); the estimate is the paper's delta~ itself and
carries no guarantee.

What the bounds cover (per branch; K = total number of steps)
--------------------------------------------------------------
1. **+inf atom, exactly.**  delta(eps) = P_inf + (1 - P_inf) delta_fin(eps) with
   P_inf = 1 - prod_m (1 - p_inf,m)^{k_m}; the PRVs below are the finite parts.
2. **Truncation.**  Step m is conditioned on S = (a_m, b_m] (bins covering the
   profile's eps_bounds at tail delta_error / (8K)).  Coupling each step with
   its conditioned version gives |delta_fin - delta_T| <= eta_T =
   1 - prod_m (1 - tau_m)^{k_m}, tau_m = P(Y_m not in S | Y_m finite) computed
   from the tails of the profile (not assumed).
3. **Discretisation with mean preservation.**  Bin i is (c_i - h/2, c_i + h/2];
   the discrete step puts mass P(bin)/P(S) at c_i + s_m.  With the
   quantile coupling, D = Y^T - Y~ lies in an interval of length h, and
   E[D] = E[Y^T - c(Y^T)] - s_m.  The paper sets s_m so that E[D] = 0; we
   cannot compute E[Y^T] exactly, so we *bracket* it per bin from the bin's
   P-mass and Q-mass (dQ = e^{-Y} dP): Jensen gives E[u] >= ln(P/R) and the
   chord of e^{-u} gives an upper bound (u = Y - c_i, R = e^{c_i} Q(bin)).  The
   bracket is about h^2/8 wide; s_m is its midpoint and beta_m its half-width
   (plus floating-point error bounds), so |E[D]| <= beta_m.  Hoeffding for the
   K independent D's (range h, the paper's Lemma 5.3 with the sharper range):
   P(sum D > t) <= exp(-2 (t - B)^2 / (K h^2)), B = sum_m k_m beta_m, and the
   same for the lower tail.  Hence, for every t > B, with
   eta_H(t) = exp(-2 (t - B)^2 / (K h^2)):
       delta_T(eps) <= delta~(eps - t) + eta_H(t),  delta_T(eps) >= delta~(eps + t) - eta_H(t).
   The mesh is the paper's choice (Theorem 5.5 with Hoeffding's constant):
   t = eps_error at eta_H = delta_error / 2, i.e.
   h ~= eps_error / sqrt(K ln(2 / delta_error) / 2).  Each query then uses the
   best t of a fixed ladder of (t, eta_H) pairs (every pair is a valid bound),
   so a query at delta >> delta_error gets a smaller eps-widening than
   eps_error.
4. **Floating point in the masses.**  Under the library's model of a
   profile's sf/cdf values (:func:`~pldlib.profiles.base.value_error`: relative
   accuracy ``SF_REL_ACCURACY`` of order-1 values, growing with |ln v| in the tails:
   at worst that of the smallest value read, ~6e-14 at a 1e-14 truncation), the
   computed bin masses telescope: a right tail sum T_j of the computed pmf is within
   kappa T_j + b of the exact one, with kappa ~ 1e-13 relative and b ~ 1e-14
   absolute only left of the
   median bin (tail sums right of it are differences of accurate sf values),
   whatever the number of bins.  Scaling the pmf by (1 + kappa) and adding
   b at the bin left of the median (and a p_inf-related speck at the top)
   gives a pmf whose right tail sums dominate the exact ones at every grid
   point, so its composition dominates the exact one in delta (the composed
   delta~ is, in each step's value, a non-decreasing function): the upper
   bound needs no extra term.  For the lower bound, summation by parts
   bounds the excess by sum_m k_m [2 kappa_m U(e) + 2 b_m delta_rest(e - c_m)],
   U the certified upper curve of the same composition and c_m the bin of
   the extra mass; delta_rest(e - c_m) <= U(e - c_m + c') / T(c') for any bin
   c' of the step (T its tail mass from c'; c' = c_m gives about 2 U(e)): a
   *relative* term, so tiny deltas stay reachable at any number of steps.
5. **FFT: wrap-around and round-off.**  The composition is the certified
   construction of :func:`pldlib.pld.compose.compose` (one pass per side,
   :func:`_compose_one`): windows from Chernoff bounds on the (tilted)
   composed pmf (mass beyond the right edge goes to the upper curve's
   constant, the aliased mass is subtracted from the lower curve), an
   entrywise FFT round-off bound (added to the upper curve, subtracted from
   the lower), and exponential tilting centred at the answer so that small
   deltas keep their relative accuracy.  The paper's algorithm has neither:
   its domain must be wide enough for wrap-around to be negligible, and its
   round-off is absolute (about 1e-16 times log N per bin).

The reported bounds use the certified terms (t, eta_H(t), eta_T, the
float-dominance correction and the composition's own), which are at most the
requested (eps_error, delta_error) for t and eta_H at the design point and
usually far below for the others; ``error_budget()`` lists them.  Nothing
rests on an unproved assumption except the accuracy model of the profile's
sf/cdf (item 4, the library-wide ``value_error``) and the FFT round-off
bound of :mod:`pldlib.pld.compose` (item 5).  Answers whose round-off cannot
be pushed below half the answer, or whose certified delta-error reaches the
queried delta, raise :class:`~pldlib.PrecisionLimitError`; a mesh or a
composition beyond ``max_bins``, or one that cannot fit ``memory_budget`` (sized
before it allocates; cached compositions are dropped first, see
:class:`PRVAccountant`), raises :class:`~pldlib.GridTooLargeError`.

Cost.  The mesh is ~ eps_error / sqrt(K), so the FFT length grows like
K / eps_error (times the composed spread): the widening is linear in h,
unlike connect-the-dots PLDs whose width is quadratic in their interval.
At matched width the PLD accountant is usually cheaper; the PRV accountant
is the paper's method, with its (lower, estimate, upper) answers.

The public implementation (``prv_accountant``) offers the remove direction of
the Poisson-subsampled Gaussian only and sizes its domain with an RDP bound;
here every branch of every supported mechanism is composed.
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import scipy.fft as sfft

from .. import _validate as V
from .._validate import PrecisionLimitError
from . import sharpen as S
from . import few_summands as FS
from . import single_step as SS
from .base import Accountant, Interval, branch_labels, components_of
from .schedule import exact_epoch_components
from ..pld import compose as _C
from .pld import DEFAULT_MEMORY_BUDGET, DEFAULT_TIME_BUDGET
from ..pld.compose import DEFAULT_MAX_BINS, Composition, GridTooLargeError, estimate_tilt, solve_tilt
from ..profiles.base import SF_REL_ACCURACY, TAIL_LOG_ACCURACY, VALUE_ABS_FLOOR, loss_range, value_error
from ..profiles.mixtures import MaxProfile, MixtureProfile
from ..pld.grid import DiscretePLD, GridMeasure

__all__ = ["account_prv", "PRVAccountant", "DiscretePRV", "discretise_prv", "DEFAULT_DELTA_ERROR"]

_U = np.finfo(float).eps / 2
#: default delta_error: 1e-3 of delta = 1e-9, the smallest delta most users query
DEFAULT_DELTA_ERROR = 1e-12
#: default eps_error: the widening in eps the mesh is designed for
DEFAULT_EPS_ERROR = 0.01
#: with the automatic accuracy, sharpening a wide answer (finer meshes, analytic bounds) ends
#: within this many seconds of the query's start (the PLD accountant's default time budget)
SHARPEN_SECONDS = DEFAULT_TIME_BUDGET
#: round-off share of an answer above which it is recomputed with a tilt
RETILT_SHARE = 1e-4
#: round-off share above which an answer is refused
REFUSE_SHARE = 0.5
#: bins per chunk when discretising (bounds memory)
_CHUNK = 1 << 20
#: eta_H ladder: each (t, eta_H(t)) pair is a valid widening; queries take the best
_ETA_LADDER = np.concatenate([10.0 ** -np.arange(0.5, 40.01, 0.125), 10.0 ** -np.arange(42.0, 301.0, 4.0)])
#: largest exponential tilt tried (beyond it a tilted window degenerates)
THETA_CAP = 1e4
#: compositions kept per branch (each holds a few arrays of the FFT length)
_CACHE_SIZE = 1
#: peak bytes per FFT point while a composition is made and its answers read (window,
#: transforms, untilting factors, the three curves and their answer tables: measured 136)
BYTES_PER_BIN = 160
#: bytes a composition keeps per FFT point once its answers were read (its three curves with
#: their tail-sum tables: measured 128)
RETAINED_BYTES_PER_BIN = 136
#: peak bytes per single-step bin while a step is discretised and composed (its pmf, tail sums
#: and the composition's per-step arrays; the chunked work arrays are bounded by _CHUNK)
STEP_BYTES_PER_BIN = 64


# ----------------------------------------------------------------------------
# single-step discretisation
# ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DiscretePRV:
    """One step's discretised PRV: masses at (start + i) * h + shift, with certified error terms.

    ``pmf`` is the *dominating* float pmf (module docstring, item 4): the
    computed bin probabilities scaled by (1 + ``kappa``) plus the small masses
    of ``extra`` (pairs (mass, distance above the bottom grid point)), so that
    its right tail sums are >= those of the exact binned PRV at every grid
    point, and exceed them by at most 2 kappa (its own tail sum) + 2 (extra
    masses at or above).  ``beta`` bounds |E[Y^T - Y~]| (the mean mismatch
    left after the shift), ``tau`` is the truncated probability
    P(Y not in (a, b] | Y finite), ``width`` the length of the interval in
    which Y^T - Y~ lies (h up to rounding), ``mass_lo`` <= total mass of
    ``pmf`` <= ``mass_hi``.
    """

    h: float
    start: int
    pmf: np.ndarray
    shift: float
    beta: float
    tau: float
    kappa: float
    extra: tuple
    p_inf: float
    width: float
    mass_lo: float
    mass_hi: float
    edge_abs: float  # max |edge| (for eps-axis rounding slack)

    def as_pld(self) -> DiscretePLD:
        return DiscretePLD(h=self.h, start=self.start, masses=self.pmf, p_inf=0.0, pessimistic=True)

    @property
    def n_bins(self) -> int:
        return int(self.pmf.size)


def _edge_values(profile, x):
    """(cdf_p, sf_p, cdf_q, sf_q) at x, sharing the threshold computations where possible."""
    if isinstance(profile, MixtureProfile):
        xt = profile._x(x)
        pw, ps, qw, qs, up, down, _ = profile._sides()
        mix = profile._mix
        return mix(down, pw, ps, xt), mix(up, pw, ps, xt), mix(down, qw, qs, xt), mix(up, qw, qs, xt)
    if isinstance(profile, MaxProfile):
        use_a = profile.a.delta(x) >= profile.b.delta(x)
        va = _edge_values(profile.a, x)
        vb = _edge_values(profile.b, x)
        return tuple(np.where(use_a, a, b) for a, b in zip(va, vb))
    return profile.cdf_p(x), profile.sf_p(x), profile.cdf_q(x), profile.sf_q(x)


def _sp_scalar(profile, x: float) -> float:
    return float(profile.sf_p(np.array([x]))[0]) - profile.p_inf


def discretise_prv(profile, h: float, tail: float, max_bins: int = DEFAULT_MAX_BINS,
                   memory_budget: int | None = None) -> DiscretePRV:
    """Truncate, bin and mean-shift the PRV of ``profile`` on mesh ``h`` (seed 003, Algorithm 2).

    The truncation domain covers ``profile.eps_bounds(tail)``; the truncated
    probability is then computed from the tails (not assumed).  See the module
    docstring for the certified terms.  A step of more than ``max_bins`` bins, or
    (given ``memory_budget``) of more than memory_budget / STEP_BYTES_PER_BIN,
    raises :class:`~pldlib.GridTooLargeError` before any array is made.
    """
    lo, hi = loss_range(profile, tail)
    i_lo = int(math.floor(lo / h)) - 1
    i_hi = int(math.ceil(hi / h)) + 1
    n = i_hi - i_lo + 1  # bins
    if n > max_bins:
        raise GridTooLargeError(
            f"one step needs {n:,} PRV bins at mesh {h:.3g} (limit max_bins={max_bins:,}); "
            "use a larger eps_error", need=n, limit=max_bins
        )
    if memory_budget is not None and n * STEP_BYTES_PER_BIN > memory_budget:
        raise GridTooLargeError(
            f"one step needs {n:,} PRV bins at mesh {h:.3g}, about {n * STEP_BYTES_PER_BIN / 2**20:,.0f} MiB "
            f"({STEP_BYTES_PER_BIN} bytes per bin), beyond memory_budget={memory_budget:,} bytes; "
            "use a larger eps_error or a larger memory_budget",
            need=n, limit=memory_budget // STEP_BYTES_PER_BIN)
    p_inf = float(profile.p_inf)

    def edge(j):  # x_j = (i_lo + j - 1/2) h, j = 0..n
        return (i_lo + np.asarray(j, dtype=float) - 0.5) * h

    # the single switch between cdf- and sf-differencing of the P-masses: first edge with sf < 1/2
    lo_j, hi_j = 0, n + 1  # answer in [0, n+1]: edges >= answer have sp < 1/2
    while lo_j < hi_j:
        mid = (lo_j + hi_j) // 2
        if _sp_scalar(profile, float(edge(mid))) < 0.5:
            hi_j = mid
        else:
            lo_j = mid + 1
    jstar = lo_j

    pmf = np.empty(n)
    clip = 0.0
    off_lo = off_hi = off_abs = 0.0
    cp_star = sp_star = sp_n = None
    vmin = 1.0  # smallest positive sf/cdf value read: the worst relative accuracy (value_error)
    for b0 in range(0, n, _CHUNK):
        b1 = min(n, b0 + _CHUNK)
        j = np.arange(b0, b1 + 1)
        x = edge(j)
        cp, sp_raw, cq, sq = (np.asarray(v, dtype=float) for v in _edge_values(profile, x))
        sp = sp_raw - p_inf
        # the sf values right of the switch telescope in the right tail sums (relative bound
        # below); left of it the cdf values' errors are absolute terms, largest at cp_star
        right = sp_raw[(j >= jstar) & (sp_raw > 0)]
        if right.size:
            vmin = min(vmin, float(right.min()))
        if b0 <= jstar <= b1:
            cp_star, sp_star = float(cp[jstar - b0]), float(sp[jstar - b0])
        if b1 == n:
            sp_n = max(float(sp[-1]), 0.0)
        # P-masses: cdf differences left of the switch, sf differences right of it
        use_sf = j[:-1] >= jstar
        P = np.where(use_sf, sp[:-1] - sp[1:], cp[1:] - cp[:-1])
        vP = np.where(use_sf, sp[:-1] + p_inf, cp[1:])  # size of the larger value differenced
        # Q-masses (only for the mean bracket): per bin, the accurate side
        use_sq = sq[:-1] < 0.5
        Qm = np.where(use_sq, sq[:-1] - sq[1:], cq[1:] - cq[:-1])
        vQ = np.where(use_sq, sq[:-1], cq[1:])
        neg = P < 0
        if neg.any():
            clip += float(-P[neg].sum())
            P = np.where(neg, 0.0, P)
        Qm = np.maximum(Qm, 0.0)
        pmf[b0:b1] = P
        # ---- mean bracket per bin: off_i = E_P[(Y - c_i) 1_bin] -------------------
        c = (i_lo + np.arange(b0, b1, dtype=float)) * h
        l = x[:-1] - c  # exact (Sterbenz) for the grids used here
        r = x[1:] - c
        # (value_error grows as v falls: the smaller value differenced is within it too)
        eP = 2.0 * (value_error(vP) + _U * vP) + 2.0 * _U * P
        eQ = 2.0 * value_error(vQ) + 2.0 * _U * Qm
        with np.errstate(over="ignore", under="ignore"):
            ec = np.exp(c)
        R = ec * Qm
        eR = ec * eQ + 2.0 * _U * R
        Pp = P + eP
        triv_lo = l * Pp
        triv_hi = r * Pp
        good = (P > 0) & (R > 0) & np.isfinite(R)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            u0 = np.where(good, np.clip(np.log(np.where(good, P, 1.0) / np.where(good, R, 1.0)), l, r), 0.0)
            e0 = np.exp(u0)
            t1 = P * (1.0 + u0)
            t2 = R * e0
            jl = t1 - t2 - (np.abs(1.0 + u0) * eP + e0 * eR + 4.0 * _U * (np.abs(t1) + t2))
            em_l, em_r = np.exp(-l), np.exp(-r)
            A = r * em_l - l * em_r  # >= 0 since l <= 0 <= r
            W = em_l * -np.expm1(l - r)  # e^{-l} - e^{-r} > 0
            wd = r - l
            num = A * P - wd * R
            jh = (num + (A * eP + wd * eR + 4.0 * _U * (A * P + wd * R))) / W * (1.0 + 4.0 * _U)
        jl = np.where(good & np.isfinite(jl), np.maximum(jl, triv_lo), triv_lo)
        jh = np.where(good & np.isfinite(jh), np.minimum(jh, triv_hi), triv_hi)
        jl = np.minimum(jl, jh)
        off_lo += float(jl.sum())
        off_hi += float(jh.sum())
        off_abs += float(np.abs(jl).sum() + np.abs(jh).sum())
    if cp_star is None:  # jstar == n + 1 cannot happen (the last edge is beyond hi); be safe
        cp_star, sp_star = 1.0, 0.5
    nlog = math.ceil(math.log2(max(n, 2))) + 2
    off_slack = nlog * _U * off_abs * 2.0
    off_lo -= off_slack
    off_hi += off_slack
    # ---- truncation mass (relative to the finite part) --------------------------
    x0, xn = float(edge(0)), float(edge(n))
    below = float(profile.cdf_p(np.array([x0]))[0])
    above = max(float(profile.sf_p(np.array([xn]))[0]) - p_inf, 0.0)
    fin = 1.0 - p_inf
    if fin <= 0:
        raise PrecisionLimitError("the profile puts all its mass at +inf; nothing to discretise")
    tau = min(1.0, (below + above + 4.0 * float(value_error(below) + value_error(above))) / fin * (1.0 + 4.0 * _U)
              + 4.0 * _U * (p_inf / fin))
    # ---- normalisation and the dominating pmf (module docstring, item 4) -------------
    # Right tail sums T_j = sum_{i>=j} P_i of the computed masses telescope: for j >= jstar
    # (sf differences) |T^_j - T_j| <= alpha T^_j + b_R, for j < jstar (cdf differences on
    # the left) |T^_j - T_j| <= alpha T^_j + b_L, with alpha covering the relative error of
    # the values differenced and the subtractions' rounding.
    Zh = float(pmf.sum())
    if not Zh > 0:
        raise PrecisionLimitError("no probability mass inside the truncation domain")
    # every value read is within (SF_REL_ACCURACY + TAIL_LOG_ACCURACY |ln v|) v + floor of the truth,
    # a relative accuracy that is worst at the smallest one (value_error; underflows: the floor)
    rel = (SF_REL_ACCURACY + TAIL_LOG_ACCURACY * min(abs(math.log(vmin)), 745.0) + _U) * 1.01
    alpha = 2.0 * rel + 2.0 * _U
    b_R = rel * 2.0 * (sp_n + p_inf) + clip + 2.0 * VALUE_ABS_FLOOR
    b_L = rel * (2.0 * abs(cp_star) + abs(sp_star) + sp_n + 2.0 * p_inf) + clip + 4.0 * VALUE_ABS_FLOOR
    eZ = b_L + b_R + (alpha + nlog * _U) * Zh  # |Z - Zh|, Z = exact total of the bins
    pmf /= Zh
    # normalised: H_j <= (1 + kappa) H^_j + bL' [j < jstar] + bR'  for the exact H, computed H^
    zr = eZ / Zh
    kappa = (alpha + (1.0 + alpha) * zr + 4.0 * _U) * 1.01
    bLn = b_L * (1.0 + 2.0 * zr) / Zh * 1.01
    bRn = b_R * (1.0 + 2.0 * zr) / Zh * 1.01
    pmf *= 1.0 + kappa + 2.0 * _U
    jl_bin = max(jstar - 1, 0)
    pmf[jl_bin] += bLn
    pmf[n - 1] += bRn
    # ---- shift and bias --------------------------------------------------------------
    Zl, Zu = max(Zh - eZ, 1e-300), Zh + eZ
    m_lo = off_lo / Zl if off_lo < 0 else off_lo / Zu
    m_hi = off_hi / Zu if off_hi < 0 else off_hi / Zl
    shift = 0.5 * (m_lo + m_hi)
    beta = 0.5 * (m_hi - m_lo) + 8.0 * _U * (abs(m_lo) + abs(m_hi))
    edge_abs = max(abs(x0), abs(xn))
    width = h + 8.0 * _U * edge_abs
    # trim empty bins on the left (the top bin stays: it carries bR')
    nz = np.nonzero(pmf)[0]
    a0 = int(nz[0])
    pmf = pmf[a0:].copy()
    msum = float(pmf.sum())
    # for each extra mass at grid index j: bounds delta_rest(e - c_j) <= U(e - (c_j - c_j')) / T_j'
    # for reference bins j' (the bottom, the median bin, j itself), T_j' = tail mass from j'
    tails = np.cumsum(pmf[::-1])[::-1] * (1.0 - 4.0 * (pmf.size + 2) * _U)  # sequential sums
    jm = max(jl_bin - a0, 0)

    def options(j):
        refs = {0, jm, j}
        return tuple(((j - r) * h * (1.0 + 8.0 * _U) if j >= r else (j - r) * h * (1.0 - 8.0 * _U),
                      float(tails[r])) for r in sorted(refs) if tails[r] > 0)

    extra = ((bLn, options(jm)), (bRn, options(pmf.size - 1)))
    return DiscretePRV(h=float(h), start=i_lo + a0, pmf=pmf, shift=float(shift), beta=float(beta),
                       tau=float(tau), kappa=float(kappa), extra=extra, p_inf=p_inf, width=float(width),
                       mass_lo=msum * (1.0 - nlog * _U), mass_hi=msum * (1.0 + nlog * _U),
                       edge_abs=float(edge_abs))


def mesh_for(eps_error: float, delta_error: float, total_steps: int) -> float:
    """The mesh h making the certified widening t equal eps_error at eta_H = delta_error / 2.

    Solves eps_error = h sqrt(K ln(2/delta_error) / 2) + K h^2 / 16 * 1.05 (the
    second term bounds the mean-bracket bias B, about K h^2 / 16).
    """
    K = float(total_steps)
    b = math.sqrt(K * math.log(2.0 / delta_error) / 2.0)
    a = 1.05 * K / 16.0
    return 2.0 * eps_error / (b + math.sqrt(b * b + 4.0 * a * eps_error)) * (1.0 - 1e-9)


# ----------------------------------------------------------------------------
# the accountant
# ----------------------------------------------------------------------------
def account_prv(mechanism, steps=None, *, eps_error: float | None = None, delta_error: float | None = None,
                max_bins: int = DEFAULT_MAX_BINS, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                sharpen: bool | None = None) -> "PRVAccountant":
    """PRV accounting (seed 003) for ``steps`` compositions of ``mechanism`` or a list of (mechanism, steps).

    Parameters
    ----------
    mechanism : Mechanism or list of (Mechanism, steps)
    steps : number of compositions (single mechanism)
    eps_error : the widening in eps the mesh is designed for (the paper's eps_error; default
        0.01): the mesh is h ~= eps_error / sqrt(K ln(2 / delta_error) / 2).
    delta_error : the additive delta error the mesh and the truncation are designed for
        (default :data:`DEFAULT_DELTA_ERROR` = 1e-12, i.e. 1e-3 of delta = 1e-9; pass about
        1e-3 of the smallest delta you will query if that is smaller).
    max_bins : cap on the bins of one step and on the FFT length.
    memory_budget : bytes the accountant's compositions may use (default 1 GB,
        :data:`~pldlib.methods.pld.DEFAULT_MEMORY_BUDGET`): about BYTES_PER_BIN per FFT
        point while one is made and read, RETAINED_BYTES_PER_BIN per point for each one kept.
        Cached compositions are dropped to stay inside it; a composition (or a step) that
        cannot fit raises :class:`~pldlib.GridTooLargeError` before it allocates.
    sharpen : with neither error given (the automatic accuracy; ``None``, the default), an answer
        wider than 1% is asked again on meshes 4 and 16 times finer (eps_error / f,
        delta_error / f^4) while that fits in :data:`SHARPEN_SECONDS`, then of the analytic
        Chernoff and saddle-point bounds at tiny scales, and the intersection of the certified
        intervals is returned (docs/MATH.md 5.9).  With an error given the mesh is the one
        asked for, unless ``sharpen=True``.

    Returns
    -------
    PRVAccountant with ``.epsilon(delta)`` and ``.delta(epsilon)`` returning
    :class:`~pldlib.Interval` (lower, upper, estimate); lower and upper are certified.
    """
    return PRVAccountant.for_mechanism(mechanism, steps, eps_error=eps_error, delta_error=delta_error,
                                       max_bins=max_bins, memory_budget=memory_budget, sharpen=sharpen)


class _Side:
    """The discretised PRVs of one side of a branch (upper- or lower-profile), with aggregated terms.

    Compositions of these pmfs are cached per tilt.
    """

    def __init__(self, prvs: list, counts: list):
        self.prvs = prvs
        self.counts = [int(k) for k in counts]
        ks = self.counts
        self.K = sum(ks)
        #: total shift of the composed grid
        self.S = float(math.fsum(k * p.shift for p, k in zip(prvs, ks)))
        #: bound on |E sum D| (mean-bracket bias)
        self.B = float(sum(k * p.beta for p, k in zip(prvs, ks))) * (1 + 8 * _U)
        #: Hoeffding range per step
        self.width = max(p.width for p in prvs)
        #: truncation coupling 1 - prod (1 - tau)^k
        self.eta_T = min(1.0, -math.expm1(sum(k * math.log1p(-min(p.tau, 1.0 - 1e-16))
                                              for p, k in zip(prvs, ks))) * (1 + 1e-12))
        #: mass at +inf of the composition (carried exactly)
        self.p_inf = max(0.0, -math.expm1(sum(k * math.log1p(-min(p.p_inf, 1.0 - 1e-16))
                                              for p, k in zip(prvs, ks))))
        #: eps-axis rounding (grid values, shifts)
        self.slack = 16 * _U * (sum(k * p.edge_abs for p, k in zip(prvs, ks)) + abs(self.S) + 1.0)
        #: lower-curve correction for the dominating pmfs (module docstring, item 4):
        #: corr_rel U(e) + sum_j corr_coef_j U(e - corr_dist_j)
        self.corr_rel = float(sum(k * (2.0 * p.kappa + 4.0 * _U) for p, k in zip(prvs, ks))) * (1 + 8 * _U)
        self.corr_terms = [(2.0 * k * m * (1 + 8 * _U), opts)
                           for p, k in zip(prvs, ks) for m, opts in p.extra if m > 0]
        #: bound on the total mass of the composed pmfs
        self.mass_total = math.exp(sum(k * math.log(p.mass_hi) for p, k in zip(prvs, ks))) * (1 + 1e-12)
        self.plds = [p.as_pld() for p in prvs]
        self.cache: OrderedDict = OrderedDict()

    def ladder(self):
        """(t_c, eta_c): every pair certifies P(sum D > t_c) <= eta_c (and the same for the lower tail)."""
        eta = _ETA_LADDER
        t = self.B + self.width * np.sqrt(self.K * np.log(1.0 / eta) / 2.0) * (1 + 1e-12) + self.slack
        return t, eta

    def fp_terms(self) -> tuple[float, float]:
        """(relative, absolute) size of the float-dominance correction."""
        return self.corr_rel, float(sum(c for c, _ in self.corr_terms))


@dataclass
class _Branch:
    label: str
    up: _Side
    lo: _Side  # the same object when the branch's two profiles coincide


def _compose_one(plds, counts, theta: float, alias_tol: float, max_bins: int, cap: float = 1.0,
                 before_alloc=None) -> Composition:
    """:func:`pldlib.pld.compose.compose` for one list of pmfs used for both curves.

    The same certified construction (Chernoff windows, entrywise round-off
    bound, alias term, tilt) with a single FFT pass: the PRV's upper and lower
    curves come from the same composed pmf (when the branch's two profiles
    coincide), so composing it twice would only double the cost.  ``cap`` bounds
    the total mass of the composed measure (entries are capped there, never lower).
    ``before_alloc(N)`` is called with the FFT length before any array of that
    length is made (the accountant's memory budget: it may raise).
    """
    h = plds[0].h
    sides = [_C._Side(h, p.start, p.masses, int(k)) for p, k in zip(plds, counts)]
    log_tol = math.log(alias_tol)
    _, var = _C._moments(sides, theta)
    sd_total = math.sqrt(max(var, 0.0)) + h
    ch = _C._Chernoff(sides, theta, sd_total)
    left_e, right_e = ch.edges(log_tol)
    base = sum(sd.count * sd.start for sd in sides)
    top = sum(sd.count * (sd.start + sd.masses.size - 1) for sd in sides)
    w_lo = max(int(math.floor(left_e / h)) - 1, base)
    w_hi = min(int(math.ceil(right_e / h)) + 2, top + 1)
    need = max(w_hi - w_lo, 2)
    if need > max_bins:
        raise GridTooLargeError(f"composition needs {need:,} grid points (limit max_bins={max_bins:,}) -- "
                                "for the PRV accountant: use a larger eps_error", need=need, limit=max_bins)
    N = sfft.next_fast_len(need, real=True)
    if before_alloc is not None:
        before_alloc(N)
    y, E, log_total, log_left, log_right = _C._compose_side(sides, theta, w_lo, N, ch)
    eps_win = (w_lo + np.arange(N)) * h
    untilt = _C.untilt_factor(log_total, theta, eps_win, len(sides), "up")
    untilt_lo = _C.untilt_factor(log_total, theta, eps_win, len(sides), "lo")
    const_up = 0.0
    if log_right > -np.inf:
        const_up += math.exp(min(700.0, log_right + log_total - theta * (w_lo + N) * h))
    if theta == 0.0 and log_left > -np.inf:
        const_up += math.exp(min(700.0, log_left + log_total))
    m_up, m_ro = _C.upper_masses(y, E, untilt, theta, h, cap)
    upper = GridMeasure(h, w_lo, m_up, const_up)
    roundoff = GridMeasure(h, w_lo, m_ro, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        m_lo = np.maximum(y - E, 0.0) * untilt_lo
    lower = GridMeasure(h, w_lo, np.where(np.isfinite(m_lo), np.minimum(m_lo, cap), 0.0), 0.0)
    del m_lo, y, untilt, untilt_lo
    alias_log = float(np.logaddexp(log_left, log_right) + log_total)
    valid_from = -np.inf if theta == 0.0 else w_lo * h
    return Composition(upper, lower, roundoff, float(theta), float(valid_from), alias_log, int(N), float(E))


class _Comp:
    """A composition of one side's pmfs (curves with cached tails) and the curves read from it."""

    def __init__(self, comp: Composition, side: _Side):
        self.comp = comp
        self.side = side

    def est_delta(self, e: np.ndarray) -> np.ndarray:
        """The paper's delta~ at grid coordinate e: the composed pmf without the round-off
        allowance (upper curve - its constant - round-off curve).  No guarantee."""
        c = self.comp
        with np.errstate(invalid="ignore", over="ignore"):
            v = c.upper.delta(e) - c.upper.const - c.roundoff.delta(e)
        return np.maximum(np.where(np.isnan(v), 0.0, v), 0.0)

    def est_epsilon(self, d: np.ndarray) -> np.ndarray:
        """inf{e : est_delta(e) <= d} by bisection (est_delta is non-increasing).  No guarantee."""
        c = self.comp
        d = np.asarray(d, dtype=float)
        hi = c.upper.epsilon(d + c.upper.const)  # est <= upper - const: est(hi) <= d
        fin = np.isfinite(hi)
        hi = np.where(fin, hi, 0.0)
        lo = hi - 1.0
        for _ in range(60):  # expand down until est(lo) > d
            need = fin & (self.est_delta(lo) <= d)
            if not need.any():
                break
            lo = np.where(need, hi - 2.0 * (hi - lo), lo)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            le = self.est_delta(mid) <= d
            hi = np.where(le, mid, hi)
            lo = np.where(le, lo, mid)
        return np.where(fin, hi, np.inf)

    def upper(self, e: np.ndarray) -> np.ndarray:
        """>= delta of the composed exact binned PRVs at grid coordinate e (inf where not certified)."""
        c = self.comp
        with np.errstate(invalid="ignore"):
            v = c.upper.delta(e)
        return np.where((e >= c.valid_from) & ~np.isnan(v), v, np.inf)

    def lower(self, e: np.ndarray) -> np.ndarray:
        """<= delta of the composed exact binned PRVs at grid coordinate e (-inf where not certified).

        The composed dominating pmfs exceed the exact ones in delta by at most
        sum_m k_m [2 kappa_m U(e) + sum_j 2 x_mj delta_rest(e - c_mj)] (extra masses x_mj at
        grid points c_mj), and delta_rest(e - c_mj) <= U(e - (c_mj - c')) / T(c') for any grid
        point c' of the step (T(c') its tail mass from c'), with U the certified upper curve of
        the same composition (module docstring, item 4).
        """
        c = self.comp
        sd = self.side
        e = np.asarray(e, dtype=float)
        with np.errstate(invalid="ignore", over="ignore"):
            v = c.lower.delta(e) - c.alias_term(e)
            ue = c.upper.delta(e)
            ue = np.where((e >= c.valid_from) & ~np.isnan(ue), np.minimum(ue, sd.mass_total), sd.mass_total)
            corr = sd.corr_rel * ue
            for coef, opts in sd.corr_terms:
                best = np.full(e.shape, sd.mass_total)
                for shift, tail in opts:
                    x = e - shift
                    ux = np.where(x >= c.valid_from, c.upper.delta(x), np.inf)
                    ux = np.where(np.isnan(ux), np.inf, ux) / tail
                    best = np.minimum(best, ux)
                corr = corr + coef * best
            v = v - corr
        return np.where((e >= c.valid_from) & ~np.isnan(v), v, -np.inf)


class PRVAccountant(Accountant):
    """PRV accounting (docs/MATH.md section 5.2; see :func:`account_prv` and the module docstring).

    ``PRVAccountant(relation, eps_error=0.01, delta_error=None, max_bins=..., memory_budget=...)
    .compose(event, count)``; answers are :class:`Interval`: certified lower and upper, with an ``estimate``
    around the PRV central estimate (no guarantee).

    Memory: every composition is sized before it allocates (its FFT length N is known from
    its window): it needs about BYTES_PER_BIN * N bytes, each composition kept (cached, or
    held by the query) about RETAINED_BYTES_PER_BIN per point.  The cached ones are dropped
    when together with the new one they would exceed ``memory_budget`` (only work depends on
    the cache, never an answer); when the new one and those in use alone exceed it, the query
    raises :class:`~pldlib.GridTooLargeError` naming the budget.  numpy running out below the
    budget (a process limit smaller than it) is reported as GridTooLargeError too.
    """

    method = "prv"
    #: a few summands also read the PLD accountant's certified ends (:mod:`.few_summands`)
    few_summands_pld = True
    kind = "certified"

    def __init__(self, relation: str = "add_remove", *, eps_error: float | None = None, delta_error: float | None = None,
                 max_bins: int = DEFAULT_MAX_BINS, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                 sharpen: bool | None = None):
        super().__init__(relation)
        if sharpen is not None and not isinstance(sharpen, (bool, np.bool_)):
            raise TypeError(f"sharpen must be True, False or None, got {V.fmt(sharpen)}")
        # automatic accuracy (neither error given): answers wider than 1% are asked again on finer meshes
        self.sharpen = (eps_error is None and delta_error is None) if sharpen is None else bool(sharpen)
        self.eps_error = V.positive_finite("eps_error", DEFAULT_EPS_ERROR if eps_error is None else eps_error)
        self.delta_error = V.probability_open("delta_error", DEFAULT_DELTA_ERROR if delta_error is None
                                              else delta_error)
        if isinstance(max_bins, bool) or not isinstance(max_bins, (int, np.integer)) or max_bins < 16:
            raise ValueError(f"max_bins must be an integer >= 16, got {V.fmt(max_bins)}")
        self.max_bins = int(max_bins)
        self.memory_budget = V.positive_int("memory_budget", memory_budget)

    def _options(self) -> dict:
        out = {"eps_error": self.eps_error, "delta_error": self.delta_error, "max_bins": self.max_bins}
        if self.memory_budget != DEFAULT_MEMORY_BUDGET:
            out["memory_budget"] = self.memory_budget
        if self.sharpen:
            out["sharpen"] = True
        return out

    # -- sharpening wide answers (docs/MATH.md 5.9) -------------------------------------------
    def _finer(self, f: float) -> "PRVAccountant":
        acc = PRVAccountant(self.relation, eps_error=self.eps_error / f, delta_error=self.delta_error / f ** 4,
                            max_bins=self.max_bins, memory_budget=self.memory_budget, sharpen=False)
        for s, k in self._steps:
            acc.compose(s.event, k)
        return acc

    def _sharpened(self, kind: str, x: np.ndarray, lo, up, t_start: float):
        """With the automatic accuracy (``sharpen``), answers wider than 1% asked again on meshes 4
        and 16 times finer (eps_error / f, delta_error / f^4), then the analytic bounds at tiny
        scales, the intersection kept (:func:`pldlib.methods.sharpen.sharpen`), all within
        SHARPEN_SECONDS of the query's start."""
        if not self.sharpen:
            return lo, up

        def finer(f, xs):
            acc = self._finer(f)
            return acc.epsilon(xs) if kind == "eps" else acc.delta(xs)

        deadline = t_start + SHARPEN_SECONDS
        if self.__dict__.get("_deadline_at") is not None:  # (a reversed answer inside another query)
            deadline = min(deadline, self.__dict__["_deadline_at"])
        return S.sharpen(kind, x, lo, up, took=time.perf_counter() - t_start, deadline=deadline,
                         finer=finer, relation=self.relation, components=self.components,
                         events=[(s.event, k) for s, k in self._steps])

    def _tradeoff_top(self) -> float:
        # (only the eps grid of the power bounds depends on it: the mesh's own upper eps(1e-12),
        # neither sharpened nor read off exact curves, so that the grid does not depend on the time
        # sharpening found, and costs one read of the mesh)
        try:
            self._ensure_built()
            d = np.array([1e-12])
            return float(max(self._branch_epsilon(br, d)[2][0] for br in self._branches))
        except (ArithmeticError, ValueError):
            return math.nan

    def _power(self, alpha: np.ndarray):
        """The generic certified power bounds (:meth:`Accountant._power`), sharpened like the
        answers (finer meshes only) where wider than 1%."""
        t_start = time.perf_counter()
        lo, up = super()._power(alpha)
        # a few summands: the PLD accountant's certified power too (docs/MATH.md 0.9)
        lo, up = SS.intersect(lo, up, *FS.power_bounds(self, alpha))
        if not self.sharpen or SS.of_accountant(self) is not None:
            # (one step composed once reads its own curve: a finer mesh would not change it)
            return lo, up

        def finer(f, xs):
            plo, pup = self._finer(f)._power(xs)
            return Interval(plo, pup)

        return S.sharpen("delta", np.asarray(alpha, dtype=float), lo, up, took=time.perf_counter() - t_start,
                         deadline=t_start + SHARPEN_SECONDS, finer=finer, relation=self.relation,
                         components=(), events=(), analytic=False)

    def _build(self):
        t0 = time.perf_counter()
        # random allocation over 2 steps: the epoch's exact pairs (MATH 13.13) instead of the per-step ones
        components = exact_epoch_components(self.components)
        K = sum(k for _, k in components)
        self.h = mesh_for(self.eps_error, self.delta_error, K)
        self.tail = self.delta_error / (8.0 * K)
        per_comp = [m.branches() for m, _ in components]
        labels = branch_labels(per_comp)
        disc: dict[int, DiscretePRV] = {}

        def prv_of(profile):
            key = id(profile)
            if key not in disc:
                try:
                    disc[key] = discretise_prv(profile, self.h, self.tail, self.max_bins, self.memory_budget)
                except GridTooLargeError:
                    raise
                except MemoryError as exc:  # numpy under a process limit below the budget
                    raise self._out_of_memory("discretising a step") from exc
            return disc[key]

        counts = [k for _, k in components]
        sides: dict[tuple, _Side] = {}

        def side_of(profiles):
            key = tuple(id(p) for p in profiles)
            if key not in sides:
                sides[key] = _Side([prv_of(p) for p in profiles], counts)
            return sides[key]

        self._branches: list[_Branch] = []
        seen = set()
        for label in labels:
            chosen = [next((b for b in bl if b.label == label), bl[0]) for bl in per_comp]
            key = tuple((id(b.upper), id(b.lower)) for b in chosen)
            if key in seen:  # the same sequence of pairs: the same answers
                continue
            seen.add(key)
            self._branches.append(_Branch(label, side_of([b.upper for b in chosen]),
                                          side_of([b.lower for b in chosen])))
        self._per_comp = per_comp  # keeps the profiles (and their ids) alive
        self.setup_seconds = time.perf_counter() - t0

    # -- diagnostics ------------------------------------------------------------
    def error_budget(self) -> list[dict]:
        """Certified error terms per branch (upper-profile side), at the design point eta_H = delta_error / 2."""
        out = []
        for br in self._branches:
            s = br.up
            th = s.B + s.width * math.sqrt(s.K * math.log(2.0 / self.delta_error) / 2.0) + s.slack
            out.append({
                "branch": br.label, "mesh": self.h, "bins_per_step": [p.n_bins for p in s.prvs],
                "eps_widening_t": float(th), "eta_H": self.delta_error / 2, "mean_bias_B": float(s.B),
                "truncation_eta_T": s.eta_T, "float_correction_rel_abs": tuple(map(float, s.fp_terms())),
                "p_inf_total": s.p_inf,
                "shift_total_S": s.S,
            })
        return out

    # -- compositions -------------------------------------------------------------
    def _out_of_memory(self, what: str) -> GridTooLargeError:
        """numpy's MemoryError below the budget (this process has less), said in our words;
        the cached compositions are dropped first."""
        self._release()
        return GridTooLargeError(
            f"ran out of memory {what} within memory_budget={self.memory_budget:,} bytes (this process "
            "may have less): use a larger eps_error or a smaller memory_budget")

    def _sides(self):
        """Every distinct side of every branch."""
        seen = {}
        for br in getattr(self, "_branches", None) or []:
            for sd in (br.up, br.lo):
                seen.setdefault(id(sd), sd)
        return list(seen.values())

    def _release(self, keep=()) -> None:
        """Drop the cached compositions (except those in ``keep``, held by the caller)."""
        for sd in self._sides():
            for key in [k for k, c in sd.cache.items() if not any(c is q for q in keep)]:
                del sd.cache[key]

    def _make_room(self, n_bins: int, pinned=()) -> None:
        """Before a composition of ``n_bins`` FFT points (class docstring, Memory): raise
        :class:`GridTooLargeError` when it and the compositions the caller holds (``pinned``)
        cannot fit the memory budget; drop the cached ones when with them it would not."""
        held_pinned = sum(c.comp.n_bins for c in pinned)
        need = n_bins * BYTES_PER_BIN + held_pinned * RETAINED_BYTES_PER_BIN
        if need > self.memory_budget:
            also = (f" with the composition in use ({held_pinned:,} points)" if pinned else "")
            raise GridTooLargeError(
                f"composition needs {n_bins:,} grid points, about {need / 2**20:,.0f} MiB{also} "
                f"({BYTES_PER_BIN} bytes per point), beyond memory_budget={self.memory_budget:,} bytes "
                "-- for the PRV accountant: use a larger eps_error or a larger memory_budget",
                need=n_bins, limit=max(0, (self.memory_budget - held_pinned * RETAINED_BYTES_PER_BIN))
                // BYTES_PER_BIN)
        cached = sum(c.comp.n_bins for sd in self._sides() for c in sd.cache.values()
                     if not any(c is q for q in pinned))
        if need + cached * RETAINED_BYTES_PER_BIN > self.memory_budget:
            self._release(keep=pinned)

    def _compose(self, side: _Side, theta: float, pinned=()) -> _Comp:
        """The composition of ``side`` at tilt ``theta`` (cached); ``pinned``: compositions the
        caller holds while this one is made (they count against the memory budget)."""
        key = round(float(theta), 12)
        if key in side.cache:
            side.cache.move_to_end(key)
            return side.cache[key]
        alias_tol = min(1e-15, 1e-3 * self.delta_error)
        sizes = []

        def before_alloc(n):
            sizes.append(n)
            self._make_room(n, pinned)

        try:
            comp = _compose_one(side.plds, side.counts, float(theta), alias_tol, self.max_bins,
                                cap=max(1.0, side.mass_total), before_alloc=before_alloc)
        except GridTooLargeError:
            raise
        except MemoryError as exc:  # numpy under a process limit below the budget
            what = f"composing {sizes[-1]:,} grid points" if sizes else "composing"
            raise self._out_of_memory(what) from exc
        c = _Comp(comp, side)
        side.cache[key] = c
        while len(side.cache) > _CACHE_SIZE:
            side.cache.popitem(last=False)
        return c

    # -- reading one tilt ---------------------------------------------------------
    def _at_tilt(self, br: _Branch, theta: float):
        """(upper composition, lower composition, upper side, lower side, upper ladder, lower
        ladder) of a branch at one tilt (the lower composition is the upper one when the
        sides coincide)."""
        cu = self._compose(br.up, theta)
        cl = cu if br.lo is br.up else self._compose(br.lo, theta, pinned=(cu,))
        return cu, cl, br.up, br.lo, br.up.ladder(), br.lo.ladder()

    def _delta_at(self, br: _Branch, theta: float, eps: np.ndarray):
        """(lower, estimate, upper, round-off share) of delta(eps) from the compositions at one tilt."""
        cu, cl, up, lo, (tu, etau), (tl, etal) = self._at_tilt(br, theta)
        n = eps.size
        # upper: min_c U(eps - S - t_c) + eta_c
        e_u = (eps - up.S)[:, None] - tu[None, :]
        val = cu.upper(e_u.ravel()).reshape(e_u.shape) + etau[None, :]
        jb = np.argmin(val, axis=1)
        best = val[np.arange(n), jb]
        ro = cu.comp.roundoff.delta(e_u[np.arange(n), jb])
        fin_up = np.minimum(best + up.eta_T, 1.0)
        d_up = (up.p_inf * (1 + 8 * _U) + (1.0 - up.p_inf) * fin_up) * (1 + 8 * _U)
        d_up = np.where(np.isfinite(best), np.minimum(d_up, 1.0), np.inf)
        # lower: max_c L(eps - S + t_c) - eta_c
        e_l = (eps - lo.S)[:, None] + tl[None, :]
        lv = cl.lower(e_l.ravel()).reshape(e_l.shape) - etal[None, :]
        lbest = lv.max(axis=1)
        fin_lo = np.maximum(lbest - lo.eta_T, 0.0)
        d_lo = (lo.p_inf * (1 - 8 * _U) + (1.0 - lo.p_inf) * fin_lo) * (1 - 8 * _U)
        # estimate: the paper's delta~(eps)
        d_est = up.p_inf + (1.0 - up.p_inf) * np.minimum(cu.est_delta(eps - up.S), 1.0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            share = np.where(np.isfinite(best), ro / np.maximum(d_up, 1e-320), np.inf)
        return d_lo, d_est, d_up, share

    def _eps_at(self, br: _Branch, theta: float, deltas: np.ndarray):
        """(lower, estimate, upper, round-off share) of eps(delta) from the compositions at one tilt."""
        cu, cl, up, lo, (tu, etau), (tl, etal) = self._at_tilt(br, theta)
        n = deltas.size
        vf = cu.comp.valid_from
        # ---- upper: eps_c = max(e_c, valid_from) + t_c + S with U(e_c) <= delta'_c
        base = (deltas - up.p_inf * (1 + 8 * _U)) / (1.0 - up.p_inf) * (1 - 8 * _U) - up.eta_T
        dprime = base[:, None] * (1 - 1e-12) - etau[None, :]
        ok = dprime > 0
        ec = np.full(dprime.shape, np.inf)
        if ok.any():
            ec[ok] = cu.comp.upper.epsilon(dprime[ok])
        ec = np.where(np.isfinite(ec), np.maximum(ec, vf), ec)
        cand = ec + tu[None, :]
        jb = np.argmin(cand, axis=1)
        e_up_grid = ec[np.arange(n), jb]
        eps_up = cand[np.arange(n), jb] + up.S
        fin = np.isfinite(e_up_grid)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            ro = cu.comp.roundoff.delta(np.where(fin, e_up_grid, 0.0))
            share = np.where(fin, ro / np.maximum(dprime[np.arange(n), jb], 1e-320), np.inf)
        # ---- lower: any e0 with L(e0) > delta''_c certifies eps >= e0 - t_c + S
        dl = (deltas - lo.p_inf * (1 - 8 * _U)) / (1.0 - lo.p_inf) * (1 + 8 * _U) + lo.eta_T
        d2 = dl[:, None] * (1 + 1e-12) + etal[None, :]
        e0 = self._lower_point(cl, d2.ravel()).reshape(d2.shape)
        eps_lo = (e0 - tl[None, :]).max(axis=1) + lo.S
        eps_lo = np.where(deltas < lo.p_inf * (1 - 8 * _U), np.inf, eps_lo)
        # ---- estimate: the paper's delta~ inverted
        dest = (deltas - up.p_inf) / (1.0 - up.p_inf)
        eps_est = np.where(dest > 0, cu.est_epsilon(np.where(dest > 0, dest, 1.0)), np.inf) + up.S
        return eps_lo, eps_est, eps_up, share

    @staticmethod
    def _lower_point(c: _Comp, d: np.ndarray) -> np.ndarray:
        """A large e0 with c.lower(e0) > d, i.e. delta > d at e0 and (by monotonicity) left of it; -inf if none."""
        out = np.full(d.shape, -np.inf)
        small = d < 1.0
        if not small.any():
            return out
        dd = d[small]
        ef = c.comp.lower.epsilon(dd)  # the curve without the subtracted terms
        res = np.full(dd.shape, -np.inf)
        for _ in range(3):
            fin = np.isfinite(ef)
            e0 = np.where(fin, ef - 1e-9 * np.maximum(1.0, np.abs(np.where(fin, ef, 0.0))), -np.inf)
            phi = c.lower(np.where(fin, e0, 0.0))
            good = fin & (phi > dd) & ~np.isfinite(res)
            res = np.where(good, e0, res)
            if np.all(np.isfinite(res) | ~fin):
                break
            # retry further left: ask the raw curve for the shortfall as well
            gap = np.where(np.isfinite(phi), c.comp.lower.delta(np.where(fin, e0, 0.0)) - phi, np.inf)
            ef = np.where(np.isfinite(res), ef, c.comp.lower.epsilon(dd + 2.0 * np.maximum(gap, 0.0)))
        out[small] = res
        return out

    # -- per-branch drivers -----------------------------------------------------
    @staticmethod
    def _next_theta(theta: float, tried: list):
        """Cap a proposed tilt; fall back to 0 (the untilted composition) once a tilt repeats."""
        theta = float(min(max(theta, 0.0), THETA_CAP)) if math.isfinite(theta) else THETA_CAP
        if any(abs(theta - th) <= 1e-9 * max(1.0, th) for th in tried):
            return None if 0.0 in tried else 0.0
        return theta

    def _retilt(self, br: _Branch, at, x: np.ndarray, theta: float, floor: float, propose, pending_extra=None):
        """The re-tilt loop of both queries: evaluate ``at(br, theta, x)`` -> (lower, estimate,
        upper, round-off share) at a tilt, keep the tightest certified bounds over tilts
        (each tilt's bounds are certified, so their intersection is), keep the estimate of the
        smallest share, and re-tilt at ``propose(pending, up)`` while some answer's round-off
        share exceeds RETILT_SHARE (or ``pending_extra(lo, up)`` says it is not done)."""
        n = x.size
        lo = np.full(n, floor)
        up = np.full(n, np.inf)
        est = np.full(n, np.nan)
        share = np.full(n, np.inf)
        tried: list = []
        todo = np.arange(n)
        for _ in range(8):
            try:
                l, e, u, sh = at(br, theta, x[todo])
            except GridTooLargeError:
                raise
            except MemoryError as exc:  # reading the answers, under a process limit below the budget
                raise self._out_of_memory("reading a composition's answers") from exc
            tried.append(theta)
            lo[todo] = np.maximum(lo[todo], l)
            up[todo] = np.minimum(up[todo], u)
            better = (sh < share[todo]) | np.isnan(est[todo])
            idx = todo[better]
            est[idx], share[idx] = e[better], sh[better]
            pending = ~(share <= RETILT_SHARE)
            if pending_extra is not None:
                pending |= pending_extra(lo, up)
            todo = np.arange(n)[pending]
            if todo.size == 0:
                break
            theta = self._next_theta(propose(todo, up), tried)
            if theta is None:
                break
        return lo, est, up, share

    def _branch_epsilon(self, br: _Branch, deltas: np.ndarray):
        plds, counts = br.up.plds, br.up.counts

        def propose(todo, up):  # tilt at the pending answer with the smallest delta
            j = todo[np.argmin(deltas[todo])]
            if np.isfinite(up[j]):
                return solve_tilt(plds, counts, float(up[j] - br.up.S))
            return estimate_tilt(plds, counts, float(max(deltas[j], 1e-300)))

        first = self._next_theta(estimate_tilt(plds, counts, float(max(deltas.min(), 1e-300))), [])
        return self._retilt(br, self._eps_at, deltas, first, -np.inf, propose,
                            pending_extra=lambda lo, up: np.isfinite(up) & ~np.isfinite(lo))

    def _branch_delta(self, br: _Branch, eps: np.ndarray):
        plds, counts = br.up.plds, br.up.counts

        def propose(todo, up):  # tilt at the pending answer with the largest eps
            j = todo[np.argmax(eps[todo])]
            return solve_tilt(plds, counts, float(eps[j] - br.up.S))

        return self._retilt(br, self._delta_at, eps, 0.0, 0.0, propose)

    # -- public queries -----------------------------------------------------------
    def epsilon(self, delta) -> Interval:
        """Certified (lower, upper) and the PRV estimate of eps(delta), vectorised over delta."""
        scalar = np.ndim(delta) == 0
        deltas = V.delta_array("delta", delta)
        t_start = time.perf_counter()
        self._ensure_built()
        lo = np.full(deltas.size, -np.inf)
        up = np.full(deltas.size, -np.inf)
        est = np.full(deltas.size, -np.inf)
        for br in self._branches:
            l, e, u, sh = self._branch_epsilon(br, deltas)
            bad = ~np.isfinite(u) & ~(deltas < br.lo.p_inf * (1 - 8 * _U))
            if bad.any():
                j = int(np.nonzero(bad)[0][0])
                raise PrecisionLimitError(
                    f"delta={deltas[j]:.3g}: the certified delta-error of the PRV bounds (truncation "
                    f"{br.up.eta_T:.2g} from delta_error={self.delta_error:.3g}, Hoeffding, FFT round-off) "
                    "reaches the queried delta; use a smaller delta_error or a larger delta"
                )
            refuse = np.isfinite(u) & (sh > REFUSE_SHARE)
            if refuse.any():
                j = int(np.nonzero(refuse)[0][0])
                raise PrecisionLimitError(
                    f"delta={deltas[j]:.3g}: cannot certify eps with the PRV accountant (floating-point "
                    f"round-off bound exceeds {REFUSE_SHARE:.0%} of delta even with exponential tilting); "
                    "use a larger delta"
                )
            lo, up, est = np.maximum(lo, l), np.maximum(up, u), np.maximum(est, e)
        lo = np.minimum(lo, up)
        # one step composed once, a closed form: read exactly (docs/MATH.md 0.8, 12)
        lo, up = SS.known_ends(self, "eps", deltas, lo, up)
        # a few summands: the PLD accountant's certified ends too (docs/MATH.md 0.9)
        lo, up = SS.intersect(lo, up, *FS.epsilon_bounds(self, deltas))
        # a wide answer that reaches below 0: bracketed on the reversed accountant's unsharpened
        # answers (MATH 0.5; a finer mesh for each of the bracket's points would not fit the time)
        lo, up = SS.bracket_negative_epsilon(lambda e: self._reversed_delta(e, t_start, sharpen=False),
                                             deltas, lo, up, S.WIDTH)
        lo, up = self._sharpened("eps", deltas, lo, up, t_start)
        est = np.clip(est, lo, up)
        if scalar:
            return Interval(float(lo[0]), float(up[0]), estimate=float(est[0]))
        return Interval(lo, up, estimate=est)

    def _reversed_delta(self, eps: np.ndarray, t_start: float, sharpen: bool = True):
        """Certified (lower, upper) of delta at ``eps`` < 0 from the reversed relation's curve at
        -eps (docs/MATH.md 0.5), or None: building the reversed accountant (remove and add; about
        as dear as this one) would not fit in half of the query's time, or it refuses.  Its
        sharpening (``sharpen=False``: none) shares this query's time (both end by t_start +
        SHARPEN_SECONDS)."""
        if not self._reversal_applies():
            return None
        rev = self._reversed()
        if rev is not self and not rev._built and \
                time.perf_counter() - t_start + 2.0 * getattr(self, "setup_seconds", 0.0) > SHARPEN_SECONDS / 2:
            return None
        keep = rev.__dict__.get("_deadline_at"), rev.sharpen
        rev.__dict__["_deadline_at"] = t_start + SHARPEN_SECONDS
        rev.sharpen = rev.sharpen and sharpen
        try:
            r = rev.delta(-np.asarray(eps, dtype=float))
            return SS.from_reverse(eps, r.lower, r.upper)
        except SS._SKIP + (TimeoutError,):  # (the reversed answer refused or too large: keep this one)
            return None
        finally:
            rev.__dict__["_deadline_at"], rev.sharpen = keep

    def _direction_deltas(self, eps: np.ndarray) -> list:
        """Certified (lower, upper) of each branch's own delta(eps) (trade-off curves, docs/MATH.md
        10.5): the relation's power is the maximum of the branches' powers, each from its own curve."""
        out = []
        one = SS.of_accountant(self)
        for br in self._branches:
            pair = SS.branch_of(one, br.label) if one is not None else None
            if pair is not None:  # one step composed once: its own curve (docs/MATH.md 0.8) ...
                l2, u2 = SS.branch_delta_bounds(pair[0], pair[1], eps)
                with np.errstate(invalid="ignore"):
                    need = ~(np.isfinite(l2) & np.isfinite(u2)) | (u2 - l2 > 1e-3 * np.abs(u2))
            else:
                l2 = u2 = None
                need = np.ones(eps.shape, dtype=bool)
            l, u = (l2.copy(), u2.copy()) if l2 is not None else (np.zeros(eps.shape), np.ones(eps.shape))
            if need.any():  # ... and the mesh only where that curve is unread or looser than 0.1%
                lm, _e, um, _sh = self._branch_delta(br, eps[need])
                um = np.minimum(um, 1.0)
                lm = np.minimum(lm, um)
                if l2 is not None:
                    lm, um = SS.intersect(lm, um, l2[need], u2[need])
                l[need], u[need] = lm, um
            out.append((l, u))
        return out

    def delta(self, epsilon) -> Interval:
        """Certified (lower, upper) and the PRV estimate of delta(eps), vectorised over eps."""
        scalar = np.ndim(epsilon) == 0
        eps = V.epsilon_array("epsilon", epsilon)
        t_start = time.perf_counter()
        self._ensure_built()
        lo = np.zeros(eps.size)
        up = np.zeros(eps.size)
        est = np.zeros(eps.size)
        for br in self._branches:
            l, e, u, sh = self._branch_delta(br, eps)
            lo, up, est = np.maximum(lo, l), np.maximum(up, u), np.maximum(est, e)
        up = np.minimum(up, 1.0)
        lo = np.minimum(lo, up)
        # one step composed once, a closed form: read exactly (docs/MATH.md 0.8, 12)
        lo, up = SS.known_ends(self, "delta", eps, lo, up)
        # a few summands: the PLD accountant's certified ends too (docs/MATH.md 0.9)
        lo, up = SS.intersect(lo, up, *FS.delta_bounds(self, eps))
        neg = np.nonzero(eps < 0)[0]
        got = self._reversed_delta(eps[neg], t_start) if neg.size else None
        if got is not None:  # eps < 0: 1 - e^eps + e^eps delta_rev(-eps) (MATH 0.5)
            lo[neg], up[neg] = SS.intersect(lo[neg], up[neg], *got)
        lo, up = self._sharpened("delta", eps, lo, up, t_start)
        est = np.clip(est, lo, up)
        if scalar:
            return Interval(float(lo[0]), float(up[0]), estimate=float(est[0]))
        return Interval(lo, up, estimate=est)
