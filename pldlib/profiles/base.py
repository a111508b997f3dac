"""Privacy profiles: the hockey-stick maths of single-step dominating pairs.

A *profile* describes one pair of distributions (P, Q) through its privacy
loss L = ln dP/dQ (docs/MATH.md section 0).  Everything downstream -- connect-the-dots
and convex-hull PLDs, composition, Monte Carlo, CGFs -- is derived from four
survival/distribution functions of L, which every profile implements
accurately in both tails:

    sf_p(eps)  = P(L > eps)        cdf_p(eps) = P(L <= eps)   (excludes L = +inf)
    sf_q(eps)  = Q(L > eps)        cdf_q(eps) = Q(L <= eps)   (includes L = -inf)

and ``p_inf = P(L = +inf)``.  From them:

    delta(eps)       = P(L > eps) - e^eps Q(L > eps)          (hockey stick, any real eps)
    delta'(eps)      = -e^eps Q(L > eps)
    h(alpha)         = delta(ln alpha)                          (alpha form, seed 000)

Profiles here are *exact* descriptions of a pair; discretisation error and
its direction (pessimistic / optimistic) are the business of
:mod:`pldlib.pld.discretize`.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np
from scipy import special

from .. import _validate as V

__all__ = [
    "PrivacyProfile",
    "GaussianProfile",
    "LaplaceProfile",
    "FiniteProfile",
    "randomized_response_profile",
    "approx_dp_profile",
]


#: largest single-step privacy loss the grid methods accept (e^eps must stay finite)
MAX_SINGLE_LOSS = 700.0

_U = np.finfo(float).eps / 2  # unit round-off
#: relative accuracy assumed of a profile's sf/cdf values of order 1 (scipy's ndtr: ~1e-15) ...
SF_REL_ACCURACY = 16 * _U
#: ... growing in the tails: a computed value v is within (SF_REL_ACCURACY + TAIL_LOG_ACCURACY
#: max(|ln v| - TAIL_FROM, 0)) v of the truth (docs/MATH.md 3.5).  A tail value is an exponential
#: of an argument that carries rounding, and ndtr(-z) itself is off by up to ~1.6 z^2 u (z = 37);
#: the subsampled Gaussian's values, threshold included, were measured within 3 z^2 u of mpmath,
#: against about 8 z^2 u here (|ln v| >= z^2 / 2 for v = ndtr(-z)), and within 9 u for z <= 3
TAIL_LOG_ACCURACY = 16 * _U
TAIL_FROM = 2.0
#: absolute floor of every value's error: values below ~1e-300 may underflow (to 0)
VALUE_ABS_FLOOR = 1e-300
_LN2 = math.log(2.0)


def value_error(v) -> np.ndarray:
    """Bound on the absolute error of a computed sf/cdf value ``v`` (array): (SF_REL_ACCURACY +
    TAIL_LOG_ACCURACY max(|ln v| - TAIL_FROM, 0)) |v| + VALUE_ABS_FLOOR, with |ln v| bounded
    from v's binary exponent (v = m 2^e, m in [1/2, 1): |ln v| <= |1 - e| ln 2 + ln 2 for every
    positive v, an overestimate by at most 2 ln 2, hence a larger bound; cheaper than a log)."""
    v = np.abs(np.asarray(v, dtype=float))
    scalar = v.ndim == 0
    v = np.atleast_1d(v)
    e = np.frexp(v)[1]
    # (in place: (SF + TAIL max(|1 - e| ln2 + ln2 - FROM, 0)) v + FLOOR)
    e = np.subtract(1, e, out=e)
    lv = np.abs(e, out=e) * _LN2  # + ln 2: >= |ln v| for every positive v (and v = 0: e = 0)
    lv += _LN2
    lv -= TAIL_FROM
    np.maximum(lv, 0.0, out=lv)
    lv *= TAIL_LOG_ACCURACY
    lv += SF_REL_ACCURACY
    lv *= v
    lv += VALUE_ABS_FLOOR
    return lv[0] if scalar else lv



def cell_errors(sf: np.ndarray, cdf: np.ndarray, p_inf: float = 0.0) -> np.ndarray:
    """Bounds on the evaluation error of the cell masses :meth:`PrivacyProfile._masses` takes
    from the values at consecutive points: the two values' :func:`value_error` on the side it
    differences (the sf where sf - p_inf < 1/2 at the cell's left end, else the cdf).  The
    subtraction's own rounding is the caller's."""
    use_sf = sf[:-1] - p_inf < 0.5
    n = use_sf.size
    k = int(np.argmax(use_sf)) if n and use_sf[-1] else n  # first cell on the sf side
    if n and use_sf[k:].all() and not use_sf[:k].any():
        # (sf is non-increasing, so the cells switch sides once, at k: the values needed are
        # the cdf at points 0..k and the sf at points k..n, each point's error taken once)
        v = value_error(np.concatenate([cdf[: k + 1], sf[k:]]))
        ec, es = v[: k + 1], v[k + 1 :]
        out = np.empty(n)  # (the two sides' sums written in place: the numbers of their concatenation)
        np.add(ec[:-1], ec[1:], out=out[:k])
        np.add(es[:-1], es[1:], out=out[k:])
        return out
    es, ec = value_error(sf), value_error(cdf)
    return np.where(use_sf, es[:-1] + es[1:], ec[:-1] + ec[1:])


class LossRangeError(V.PrecisionLimitError, OverflowError):
    """A single step's privacy loss is beyond what floating point can handle."""


def loss_range(profile, tail: float) -> tuple[float, float]:
    """(lo, hi): the loss range of ``profile`` up to ``tail`` mass on each side (the loss-range
    guard every discretiser uses): ValueError if it is not finite, :class:`LossRangeError`
    beyond :data:`MAX_SINGLE_LOSS`."""
    lo, hi = profile.eps_bounds(tail)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError("the privacy loss range of this profile is not finite at the requested tail")
    if max(abs(lo), abs(hi)) > MAX_SINGLE_LOSS:
        raise LossRangeError(
            f"single-step privacy loss reaches {max(abs(lo), abs(hi)):.3g}, beyond the "
            f"supported {MAX_SINGLE_LOSS:g} (e^eps overflows); use more noise"
        )
    return lo, hi


def _as_array(eps) -> np.ndarray:
    return np.asarray(eps, dtype=float)


class PrivacyProfile(ABC):
    """The privacy profile of one pair (P, Q); see the module docstring.

    Subclasses implement :meth:`sf_p`, :meth:`sf_q` and, where the naive
    complement loses accuracy in the left tail, :meth:`cdf_p` and
    :meth:`cdf_q`.  All methods are vectorised over ``eps``.
    """

    #: P(L = +inf): mass of outputs that Q cannot produce.
    p_inf: float = 0.0
    #: True only when L has no atom at a finite value (then Q(L >= eps) = Q(L > eps) and the
    #: left and right derivatives of the curve agree); False is always safe.
    atomless: bool = False

    # -- distribution of the privacy loss ---------------------------------
    @abstractmethod
    def sf_p(self, eps):
        """P(L > eps), the +inf atom included (so ``sf_p(large) -> p_inf``)."""

    @abstractmethod
    def sf_q(self, eps):
        """Q(L > eps)."""

    def cdf_p(self, eps):
        """P(L <= eps) (the +inf atom excluded)."""
        return 1.0 - self.sf_p(eps)

    def cdf_q(self, eps):
        """Q(L <= eps), including the Q-mass where P = 0 (L = -inf)."""
        return 1.0 - self.sf_q(eps)

    # -- hockey-stick curve -----------------------------------------------
    def delta(self, eps):
        """Hockey-stick divergence delta(eps) = H_{e^eps}(P || Q), any real eps."""
        eps = _as_array(eps)
        with np.errstate(over="ignore", invalid="ignore"):
            d = self.sf_p(eps) - np.exp(eps) * self.sf_q(eps)
        return np.clip(d, 0.0, 1.0)

    def delta_prime(self, eps):
        """Derivative d delta / d eps = -e^eps Q(L > eps) (right derivative at atoms)."""
        eps = _as_array(eps)
        with np.errstate(over="ignore"):
            return -np.exp(eps) * self.sf_q(eps)

    def interval_masses(self, a, b):
        """(P(a < L <= b), Q(a < L <= b)) for arrays a < b, accurate in both tails.

        Differences are taken of the survival function where it is small and
        of the distribution function otherwise, so tiny interval masses keep
        their relative accuracy.
        """
        a = _as_array(a)
        b = _as_array(b)
        return self._masses(self.sf_p(a), self.sf_p(b), self.cdf_p(a), self.cdf_p(b),
                            self.sf_q(a), self.sf_q(b), self.cdf_q(a), self.cdf_q(b))

    def _masses(self, sp_a, sp_b, cp_a, cp_b, sq_a, sq_b, cq_a, cq_b):
        p = np.where((sp_a - self.p_inf if self.p_inf else sp_a) < 0.5, sp_a - sp_b, cp_b - cp_a)
        q = np.where(sq_a < 0.5, sq_a - sq_b, cq_b - cq_a)
        if isinstance(p, np.ndarray) and p.ndim and isinstance(q, np.ndarray) and q.ndim:
            return np.maximum(p, 0.0, out=p), np.maximum(q, 0.0, out=q)  # (fresh arrays: in place)
        return np.maximum(p, 0.0), np.maximum(q, 0.0)

    def grid_values(self, eps):
        """(sf_p, cdf_p, sf_q, cdf_q) at the points eps, in one pass.

        The same numbers as the four functions (subclasses share the work they have in
        common, e.g. the loss-to-noise threshold of a mixture)."""
        eps = _as_array(eps)
        return self.sf_p(eps), self.cdf_p(eps), self.sf_q(eps), self.cdf_q(eps)

    def consecutive_masses(self, eps, values=None):
        """:meth:`interval_masses` of the cells (eps[i], eps[i+1]] of an increasing grid, from
        one :meth:`grid_values` pass (or the given one); identical numbers."""
        sp, cp, sq, cq = self.grid_values(eps) if values is None else values
        return self._masses(sp[:-1], sp[1:], cp[:-1], cp[1:], sq[:-1], sq[1:], cq[:-1], cq[1:])

    def loss_moments(self) -> tuple[float, float] | None:
        """Estimate of the mean and variance of the finite part of L under P, or None when
        the profile has no cheap way to it (callers then use a discretised PLD's moments).

        Guarantee: an estimate (it only steers work, e.g. which direction is computed
        first; never a bound)."""
        return None

    # -- support ----------------------------------------------------------
    def loss_sup(self) -> float:
        """A certified upper bound on the largest privacy loss P can produce: P(L > loss_sup) = 0
        (+inf where unknown, unbounded, or P(L = +inf) > 0).  Then delta(eps) = 0 exactly for
        eps >= loss_sup (docs/MATH.md 0.6), and a k-fold composition's losses are at most the
        sum of its steps' ``loss_sup``.  Generic version: +inf (no claim)."""
        return math.inf

    def support_edges(self) -> tuple[float, float]:
        """(lo, hi): the ends of the support of L (finite losses), -inf / +inf where unbounded.

        Generic version: :meth:`eps_bounds` at tail 1e-12 (ends within that mass of the true
        ones); profiles that know their support override it.  Used only to place lattices
        (docs/MATH.md 3.2), never for a bound."""
        return self.eps_bounds(1e-12)

    def eps_bounds(self, tail: float) -> tuple[float, float]:
        """(lo, hi) with P(L <= lo) <= tail and P(hi < L < inf) <= tail.

        Generic version: bracketing + vectorised grid search on the monotone sf/cdf
        (the returned ends satisfy the tail conditions; they are within 1e-7 of the
        tightest ones).  Subclasses with closed forms override it.  Results are cached
        per tail on the instance (profiles are immutable descriptions).
        """
        d = getattr(self, "__dict__", None)
        if d is None:
            return self._eps_bounds_search(tail)
        cache = d.setdefault("_eps_bounds_cache", {})
        if tail not in cache:
            cache[tail] = self._eps_bounds_search(tail)
        return cache[tail]

    def _eps_bounds_search(self, tail: float, want_lo: bool = True, want_hi: bool = True) -> tuple[float, float]:
        """The generic search of :meth:`eps_bounds`; a side not wanted is returned as -inf / +inf."""
        def find(fn, target, direction):
            # bracket: the first x = 2^k (k = 0..199) with fn(direction x) <= target,
            # 16 doublings per vectorised call
            x = None
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                for k0 in range(0, 200, 16):
                    xs = 2.0 ** np.arange(k0, k0 + 16)
                    ok = np.asarray(fn(direction * xs), dtype=float) <= target
                    if ok.any():
                        i = int(np.argmax(ok))
                        x = float(xs[i])
                        break
            if x is None:
                raise ValueError("could not bracket the support of the privacy loss")
            lo_, hi_ = (0.0 if x == 1.0 else 0.5 * x), x
            # refine on 64-point grids: fn(direction * hi_) <= target holds throughout
            for _ in range(20):
                if hi_ - lo_ <= 1e-7 * max(1.0, hi_):  # a support bound needs no precision
                    break
                pts = lo_ + (hi_ - lo_) * np.arange(1, 64) / 64.0
                ok = np.asarray(fn(direction * pts), dtype=float) <= target
                if ok.any():
                    j = int(np.argmax(ok))
                    hi_ = float(pts[j])
                    if j > 0:
                        lo_ = float(pts[j - 1])
                else:
                    lo_ = float(pts[-1])
            return direction * hi_

        hi = find(lambda e: self.sf_p(e) - self.p_inf, tail, +1.0) if want_hi else math.inf
        lo = find(lambda e: self.cdf_p(e), tail, -1.0) if want_lo else -math.inf
        return lo, hi

    def reversed(self) -> "PrivacyProfile":
        """The profile of the reversed pair (Q, P): delta_{Q||P}(eps) = 1 - e^eps + e^eps delta(-eps)."""
        return ReversedProfile(self)

    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class ReversedProfile(PrivacyProfile):
    """The pair (Q, P) of a given profile: its loss is -L with the roles of P, Q swapped.

    Under Q, -L > eps  <=>  L < -eps, so sf_Q'(eps) := P'(L' > eps) = Q(L < -eps).
    """

    def __init__(self, base: PrivacyProfile):
        self.base = base
        # P' = Q; L' = +inf where P = 0, i.e. Q-mass at L = -inf
        self.p_inf = float(base.cdf_q(-np.inf))

    def sf_p(self, eps):
        # P'(L' > eps) = Q(L < -eps) = Q(L <= -eps) - Q(L = -eps) ; continuous parts only
        eps = _as_array(eps)
        return self.base.cdf_q(np.nextafter(-eps, -np.inf))

    def cdf_p(self, eps):
        eps = _as_array(eps)
        return self.base.sf_q(np.nextafter(-eps, -np.inf))

    def sf_q(self, eps):
        eps = _as_array(eps)
        return self.base.cdf_p(np.nextafter(-eps, -np.inf))

    def cdf_q(self, eps):
        eps = _as_array(eps)
        return self.base.sf_p(np.nextafter(-eps, -np.inf))


class GaussianProfile(PrivacyProfile):
    """Pair (N(0, s^2), N(D, s^2)) with s = sigma * D; r = D / s = 1 / sigma.

    Under P, L ~ N(r^2/2, r^2); under Q, L ~ N(-r^2/2, r^2) (docs/MATH.md section 1):
        delta(eps) = Phi(-eps/r + r/2) - e^eps Phi(-eps/r - r/2),
    evaluated with ``log_ndtr`` so the tails keep their relative accuracy.
    k-fold composition is the same profile with r * sqrt(k).
    """

    def __init__(self, sigma: float, sensitivity: float = 1.0):
        self.sigma = V.positive_finite("sigma", sigma)
        self.sensitivity = V.positive_finite("sensitivity", sensitivity)
        # the pair depends only on the ratio noise / sensitivity
        self.r = 1.0 / self.sigma
        self.p_inf = 0.0

    @classmethod
    def from_r(cls, r: float) -> "GaussianProfile":
        return cls(sigma=1.0 / V.positive_finite("r", r))

    def _z(self, eps, under_p: bool):
        mu = 0.5 * self.r**2 if under_p else -0.5 * self.r**2
        return (_as_array(eps) - mu) / self.r

    def sf_p(self, eps):
        return special.ndtr(-self._z(eps, True))

    def cdf_p(self, eps):
        return special.ndtr(self._z(eps, True))

    def sf_q(self, eps):
        return special.ndtr(-self._z(eps, False))

    def cdf_q(self, eps):
        return special.ndtr(self._z(eps, False))

    def log_delta(self, eps):
        """ln delta(eps), accurate far into the right tail."""
        eps = _as_array(eps)
        la = special.log_ndtr(-self._z(eps, True))
        lb = special.log_ndtr(-self._z(eps, False)) + eps
        with np.errstate(divide="ignore", invalid="ignore"):
            return la + np.log(-np.expm1(np.minimum(lb - la, 0.0)))

    def delta(self, eps):
        with np.errstate(divide="ignore"):
            return np.exp(self.log_delta(eps))

    def eps_bounds(self, tail: float) -> tuple[float, float]:
        z = -special.ndtri(tail)
        mu = 0.5 * self.r**2
        return mu - z * self.r, mu + z * self.r


class LaplaceProfile(PrivacyProfile):
    """Pair (Lap(0, b), Lap(D, b)); a = D / b.

    L = a for x <= 0, -a for x >= D, (D - 2x)/b in between.  For |eps| < a:
        P(L > eps) = 1 - exp(-(a - eps)/2) / 2,   Q(L > eps) = exp(-(a + eps)/2) / 2,
    so delta(eps) = 1 - exp((eps - a)/2) for 0 <= eps <= a and 0 above a
    (docs/MATH.md section 1).  Atoms: P(L = a) = 1/2, P(L = -a) = e^{-a}/2.
    """

    def __init__(self, scale: float, sensitivity: float = 1.0):
        self.scale = V.positive_finite("scale", scale)
        self.sensitivity = V.positive_finite("sensitivity", sensitivity)
        self.a = self.sensitivity / self.scale
        self.p_inf = 0.0

    def _regions(self, eps):
        eps = _as_array(eps)
        a = self.a
        return eps, eps < -a, eps >= a

    def sf_p(self, eps):
        eps, below, above = self._regions(eps)
        with np.errstate(over="ignore"):
            mid = 1.0 - 0.5 * np.exp(-(self.a - eps) / 2.0)
        return np.where(below, 1.0, np.where(above, 0.0, mid))

    def cdf_p(self, eps):
        eps, below, above = self._regions(eps)
        with np.errstate(over="ignore"):
            mid = 0.5 * np.exp(-(self.a - eps) / 2.0)
        return np.where(below, 0.0, np.where(above, 1.0, mid))

    def sf_q(self, eps):
        eps, below, above = self._regions(eps)
        with np.errstate(over="ignore"):
            mid = 0.5 * np.exp(-(self.a + eps) / 2.0)
        return np.where(below, 1.0, np.where(above, 0.0, mid))

    def cdf_q(self, eps):
        eps, below, above = self._regions(eps)
        with np.errstate(over="ignore"):
            mid = 1.0 - 0.5 * np.exp(-(self.a + eps) / 2.0)
        return np.where(below, 0.0, np.where(above, 1.0, mid))

    def delta(self, eps):
        eps = _as_array(eps)
        a = self.a
        with np.errstate(over="ignore"):
            mid = -np.expm1((eps - a) / 2.0)
            low = -np.expm1(eps)
        return np.where(eps >= a, 0.0, np.where(eps >= -a, mid, low))

    def eps_bounds(self, tail: float) -> tuple[float, float]:
        return -self.a, self.a

    def loss_sup(self) -> float:
        return float(self.a)


#: whether numpy's long double carries more precision than double (x86: 64-bit mantissa)
_EXTENDED = np.finfo(np.longdouble).eps < np.finfo(float).eps


class FiniteProfile(PrivacyProfile):
    """A pair on finitely many outputs, given by its loss atoms.

    Parameters
    ----------
    losses : array of finite privacy-loss values l_j
    p_masses : P(L = l_j)
    p_inf : P(L = +inf)
    q_masses : Q(L = l_j), optional: the pair's own Q-masses where they are known more
        accurately than p_j e^{-l_j} (e.g. randomized response, whose Q is P swapped)

    The Q-masses follow: Q(L = l_j) = p_j e^{-l_j}; the rest of Q sits at L = -inf.
    """

    def __init__(self, losses, p_masses, p_inf: float = 0.0, q_masses=None):
        losses = np.asarray(losses, dtype=float)
        p = np.asarray(p_masses, dtype=float)
        if losses.shape != p.shape or losses.ndim != 1 or losses.size == 0:
            raise ValueError("losses and p_masses must be 1-d arrays of the same length")
        if not np.all(np.isfinite(losses)):
            raise ValueError("losses must be finite (use p_inf for the +inf atom)")
        if np.any(p < 0) or p_inf < 0:
            raise ValueError("masses must be >= 0")
        total = p.sum() + p_inf
        if abs(total - 1.0) > 1e-12:
            raise ValueError(f"P-masses must sum to 1 (with p_inf), got {V.fmt(total)}")
        order = np.argsort(losses)
        self.losses = losses[order]
        self.p_masses = p[order]
        if q_masses is not None:
            qm = np.asarray(q_masses, dtype=float)
            if qm.shape != p.shape or not np.all(qm >= 0):
                raise ValueError("q_masses must be >= 0, one per loss")
            self.q_masses = qm[order]
        else:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                qm = self.p_masses * np.exp(-self.losses)
                # e^{-l} beyond the double range (tiny p_j): ln p_j - l_j instead; p_j = 0: 0
                qm = np.where(np.isfinite(qm), qm, np.exp(np.log(self.p_masses) - self.losses))
            self.q_masses = np.where(self.p_masses > 0, qm, 0.0)
        if self.q_masses.sum() > 1.0 + 1e-12:
            raise ValueError("the atoms give Q more than total mass 1: not a valid pair")
        self.q_minus_inf = max(0.0, 1.0 - self.q_masses.sum())
        self.p_inf = float(p_inf)
        # right cumulative sums: index j -> mass of atoms with index >= j
        self._p_right = np.concatenate([np.cumsum(self.p_masses[::-1])[::-1], [0.0]])
        self._q_right = np.concatenate([np.cumsum(self.q_masses[::-1])[::-1], [0.0]])
        self._p_left = np.concatenate([[0.0], np.cumsum(self.p_masses)])
        self._q_left = np.concatenate([[0.0], np.cumsum(self.q_masses)])

    def _idx_gt(self, eps):
        # first atom with loss > eps
        return np.searchsorted(self.losses, _as_array(eps), side="right")

    def sf_p(self, eps):
        return self._p_right[self._idx_gt(eps)] + self.p_inf

    def cdf_p(self, eps):
        return self._p_left[self._idx_gt(eps)]

    def sf_q(self, eps):
        return self._q_right[self._idx_gt(eps)]

    def cdf_q(self, eps):
        return self._q_left[self._idx_gt(eps)] + self.q_minus_inf

    #: from this many atoms on, :meth:`delta` sums the atoms more than NEAR above eps through
    #: suffix sums (O(atoms + queries)) instead of atom by atom (O(atoms x queries))
    DIRECT_ATOMS = 2048
    NEAR = 1.0

    def delta(self, eps):
        """delta(eps) = P(+inf) + sum_{l_j > eps} p_j (1 - e^{eps - l_j}).

        With many atoms, the atoms with l_j > eps + NEAR enter as P_far - e^eps Q_far from
        suffix sums accumulated in extended precision (no cancellation: e^eps Q_far <= e^-NEAR
        P_far, and every term is >= 0, so the relative error stays within a few units of
        round-off, as the atom-by-atom sum); the atoms in (eps, eps + NEAR] are summed one by one."""
        eps = _as_array(eps)
        # (where long double is plain double, the suffix sums would lose the accuracy claimed)
        if self.losses.size < self.DIRECT_ATOMS or eps.size < 8 or not _EXTENDED:
            with np.errstate(over="ignore"):  # (e^{eps - l} = inf: the atom adds 0)
                w = np.maximum(0.0, -np.expm1(eps[..., None] - self.losses))
            return np.clip(self.p_inf + (self.p_masses * w).sum(axis=-1), 0.0, 1.0)
        flat = eps.ravel()
        if not hasattr(self, "_suffix_ld"):
            ld = np.longdouble
            self._suffix_ld = (np.concatenate([np.cumsum(self.p_masses[::-1].astype(ld))[::-1], [ld(0)]]),
                               np.concatenate([np.cumsum(self.q_masses[::-1].astype(ld))[::-1], [ld(0)]]))
        p_suf, q_suf = self._suffix_ld
        i0 = np.searchsorted(self.losses, flat, side="right")            # first atom > eps
        i1 = np.searchsorted(self.losses, flat + self.NEAR, side="right")  # first atom > eps + NEAR
        with np.errstate(over="ignore", invalid="ignore"):
            far = (p_suf[i1] - np.exp(flat.astype(np.longdouble)) * q_suf[i1]).astype(float)
        far = np.where(i1 < self.losses.size, np.maximum(far, 0.0), 0.0)
        near = np.zeros(flat.size)
        cnt = i1 - i0
        for c0 in range(0, flat.size, 256):  # the near atoms, one by one, a block of queries at a time
            sl = slice(c0, min(c0 + 256, flat.size))
            n = cnt[sl]
            tot = int(n.sum())
            if tot == 0:
                continue
            owner = np.repeat(np.arange(n.size), n)
            start = np.repeat(i0[sl] - np.concatenate([[0], np.cumsum(n)[:-1]]), n)
            j = start + np.arange(tot)
            terms = self.p_masses[j] * -np.expm1(flat[sl][owner] - self.losses[j])
            near[sl] = np.bincount(owner, weights=terms, minlength=n.size)
        out = np.clip(self.p_inf + near + far, 0.0, 1.0)
        return out.reshape(eps.shape)

    def eps_bounds(self, tail: float) -> tuple[float, float]:
        return float(self.losses[0]), float(self.losses[-1])

    def loss_sup(self) -> float:
        return math.inf if self.p_inf > 0 else float(self.losses[-1])


def randomized_response_profile(eps0: float) -> FiniteProfile:
    """Binary randomized response: P = (p, 1-p), Q = (1-p, p), p = e^eps0 / (1 + e^eps0).

    delta(eps) = (e^eps0 - e^eps)_+ / (1 + e^eps0) for eps >= 0.
    """
    eps0 = V.positive_finite("eps0", eps0)
    pm, pp = _rr_masses(eps0)
    return FiniteProfile([-eps0, eps0], [pm, pp], q_masses=[pp, pm])


def _rr_masses(eps0: float) -> tuple[float, float]:
    """(1 - p, p) for p = e^eps0 / (1 + e^eps0), each to a few units of round-off in relative
    terms: with w = e^-eps0, 1 - p = w / (1 + w) and p = 1 / (1 + w) (no cancellation in 1 - p,
    whose Q-mass (1 - p) e^eps0 = p must not exceed 1; no overflow for any eps0 > 0)."""
    w = math.exp(-eps0)
    return w / (1.0 + w), 1.0 / (1.0 + w)


def approx_dp_profile(eps0: float, delta0: float) -> FiniteProfile:
    """The dominating pair of any (eps0, delta0)-DP mechanism (docs/MATH.md section 1).

    L = +inf w.p. delta0, +eps0 w.p. (1 - delta0) e^eps0 / (1 + e^eps0), -eps0 otherwise.
    """
    eps0 = V.nonnegative_finite("eps0", eps0)
    delta0 = V.probability_closed_open("delta0", delta0)
    if eps0 == 0.0:
        return FiniteProfile([0.0], [1.0 - delta0], p_inf=delta0)
    pm, pp = _rr_masses(eps0)
    keep = 1 - delta0
    return FiniteProfile([-eps0, eps0], [keep * pm, keep * pp], p_inf=delta0, q_masses=[keep * pp, keep * pm])
