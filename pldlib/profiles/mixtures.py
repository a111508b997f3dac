"""Profiles of subsampled pairs: mixtures of shifted base noises (docs/MATH.md section 2).

Poisson subsampling of an additive-noise mechanism with base noise B_c (B
centred at c) gives pairs whose densities are mixtures of shifted copies of B:

    remove:        P = (1-q) B_0 + q B_D,        Q = B_0
    add:           the reversed pair of remove  (P = B_0, Q = (1-q) B_0 + q B_D)
    substitution:  P = (1-q) B_0 + q B_D,        Q = (1-q) B_0 + q B_{-D}

For Gaussian and Laplace noise the privacy loss L(x) is a non-decreasing
function of the output x, so {L > eps} = {x > x_eps} for a threshold x_eps and

    P(L > eps) = sum_i a_i sf_B(x_eps - c_i),   Q(L > eps) = sum_j b_j sf_B(x_eps - d_j),

which keeps full relative accuracy in both tails.  For remove the threshold is
closed form: with g(x) = ln dB_D/dB_0 (x) and t = ln((e^eps - (1-q))/q),
x_eps = g^{-1}(t) (docs/MATH.md section 2); for substitution it is found by
bisection.  :class:`MaxProfile` is the point-wise maximum of two curves (WOR
substitution, an upper bound); :func:`finite_mixture_profile` does the same
constructions exactly for a finite (lattice) noise, for brute-force checks.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from .. import _deadline
from .base import MAX_SINGLE_LOSS, FiniteProfile, LossRangeError, PrivacyProfile, _as_array

__all__ = [
    "ShiftFamily",
    "GaussianNoise",
    "LaplaceNoise",
    "LatticeNoise",
    "MixtureProfile",
    "MaxProfile",
    "SymmetricGaussianMixtureProfile",
    "poisson_remove",
    "poisson_add",
    "poisson_substitution",
    "shift_mixture_remove",
    "finite_mixture_profile",
    "finite_pair",
]


# -- base noises: sf/cdf of B_0 and the log-likelihood ratio g(x) = ln dB_D/dB_0 ----------

class ShiftFamily:
    """A noise B with shift D, as sampling schemes see it (docs/MATH.md section 2).

    ``remove_pair(q)`` is P = (1-q) B_0 + q B_D against Q = B_0, ``add_pair(q)`` its
    reverse, ``substitution_pair(q)`` is (1-q) B_0 + q B_D against (1-q) B_0 + q B_{-D}.
    Continuous noises (``sf``, ``cdf``, ``g``, ``g_inv``) inherit these constructions;
    :class:`LatticeNoise` overrides them with exact finite ones.
    """

    def remove_pair(self, q: float) -> PrivacyProfile:
        return poisson_remove(self, q)

    def add_pair(self, q: float) -> PrivacyProfile:
        return poisson_add(self, q)

    def substitution_pair(self, q: float) -> PrivacyProfile:
        return poisson_substitution(self, q)


class GaussianNoise(ShiftFamily):
    """N(0, s^2) with shift D: g(x) = (2 x D - D^2) / (2 s^2) (increasing, unbounded)."""

    #: g is strictly increasing (linear), so every mixture loss ln(sum a_i e^{g(x - c_i)}) - ...
    #: is analytic and non-decreasing in x, hence strictly increasing off a null set: no atoms
    continuous_loss = True

    def __init__(self, s: float, D: float):
        s, D = float(s), float(D)
        if not (1e-100 <= s <= 1e100):
            # s^2 would overflow or underflow: the pair depends on D / s only, so the same pair
            # is described in units of s (outputs x / s; every profile value is unchanged)
            s, D = 1.0, D / s
        if not abs(D) / s <= 1e150:
            # g(x) = (2 x D - D^2) / (2 s^2) reaches D^2 / (2 s^2) = inf at x = D
            raise LossRangeError(f"single-step privacy loss reaches about (D/sigma)^2 / 2 with D/sigma = "
                                 f"{abs(D) / s:.3g}, beyond floating point (the supported {MAX_SINGLE_LOSS:g}); "
                                 "use more noise")
        self.s, self.D = s, D
        self.g_min, self.g_max = -np.inf, np.inf

    def _tail(self, x):
        """(t, x > 0): t = ndtr(-|x| / s), the smaller of sf(x) and cdf(x); the larger is 1 - t
        (t <= 1/2, so within ~3 ulp; scipy's ndtr itself takes 1 - erfc/2 on that side)."""
        z = _as_array(x) / self.s
        if not (isinstance(z, np.ndarray) and z.ndim and z.dtype == np.float64):
            return special.ndtr(-np.abs(z)), z > 0
        pos = z > 0
        np.abs(z, out=z)
        np.negative(z, out=z)  # (in place: the numbers of ndtr(-|z|))
        return special.ndtr(z, out=z), pos

    def sf(self, x):
        t, pos = self._tail(x)
        return np.where(pos, t, 1.0 - t)

    def cdf(self, x):
        t, pos = self._tail(x)
        return np.where(pos, 1.0 - t, t)

    def log_sf(self, x):
        return special.log_ndtr(-_as_array(x) / self.s)

    def sf_cdf(self, x):
        """(sf(x), cdf(x)) from one tail evaluation (the same numbers as the two functions)."""
        t, pos = self._tail(x)
        other = 1.0 - t
        if not (isinstance(t, np.ndarray) and t.ndim):
            return np.where(pos, t, other), np.where(pos, other, t)
        cdf = np.where(pos, other, t)
        np.copyto(other, t, where=pos)  # (in place: the sf, where(pos, t, other))
        return other, cdf

    def log_cdf(self, x):
        return special.log_ndtr(_as_array(x) / self.s)

    def isf(self, p):
        """x with sf(x) = p (0 < p < 1)."""
        return -self.s * special.ndtri(_as_array(p))

    def icdf(self, p):
        """x with cdf(x) = p (0 < p < 1)."""
        return self.s * special.ndtri(_as_array(p))

    def g(self, x):
        with np.errstate(over="ignore", invalid="ignore"):
            return (2 * _as_array(x) * self.D - np.float64(self.D) ** 2) / (2 * np.float64(self.s) ** 2)

    def g_inv(self, t, overwrite_t: bool = False):
        """x with g(x) = t (``overwrite_t``: in t's own array, when t is a float64 array)."""
        with np.errstate(over="ignore", invalid="ignore"):
            if overwrite_t and isinstance(t, np.ndarray) and t.ndim and t.dtype == np.float64:
                t *= self.s**2 / self.D  # (the same operations, in place)
                t += self.D / 2
                return t
            return self.s**2 / self.D * _as_array(t) + self.D / 2

    def sample(self, rng, n):
        return rng.normal(0.0, self.s, n)

    @property
    def scale(self) -> float:
        return self.s

    def scalar_tail(self, right: bool):
        """sf (``right``) or cdf as a function of one Python float (math.erfc: relative accuracy
        ~1e-15, as scipy's ndtr; for searches whose result is checked with :meth:`sf`/:meth:`cdf`)."""
        k = (1.0 if right else -1.0) / (self.s * math.sqrt(2.0))
        return lambda x: 0.5 * math.erfc(k * x)

    def expectation_nodes(self):
        """(x_j, w_j) with E f(X) ~ sum_j w_j f(x_j) for X ~ N(0, s^2): Gauss-Hermite
        quadrature (QUAD_NODES nodes, exact for polynomials of degree < 2 QUAD_NODES)."""
        t, w = _hermite_nodes()
        return self.s * t, w

    def shifts_remove_pair(self, weights) -> "MixtureProfile":
        """User-level remove pair: P = sum_k weights[k] B_{kD}, Q = B_0 (docs/MATH.md 13.1)."""
        return shift_mixture_remove(self, weights)


class LaplaceNoise(ShiftFamily):
    """Lap(0, b) with shift D: g(x) = clip((2x - D)/b, -D/b, D/b) (non-decreasing)."""

    def __init__(self, b: float, D: float):
        self.b, self.D = float(b), float(D)
        self.g_min, self.g_max = -self.D / self.b, self.D / self.b

    def sf(self, x):
        x = _as_array(x) / self.b
        with np.errstate(over="ignore"):
            return np.where(x >= 0, 0.5 * np.exp(-np.abs(x)), 1.0 - 0.5 * np.exp(-np.abs(x)))

    def cdf(self, x):
        x = _as_array(x) / self.b
        with np.errstate(over="ignore"):
            return np.where(x < 0, 0.5 * np.exp(-np.abs(x)), 1.0 - 0.5 * np.exp(-np.abs(x)))

    def log_sf(self, x):
        x = _as_array(x) / self.b
        with np.errstate(over="ignore", divide="ignore"):
            return np.where(x >= 0, math.log(0.5) - np.abs(x), np.log1p(-0.5 * np.exp(-np.abs(x))))

    def log_cdf(self, x):
        return self.log_sf(-_as_array(x))

    def g(self, x):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.clip((2 * _as_array(x) - self.D) / self.b, self.g_min, self.g_max)

    def g_inv(self, t):
        """Right end of {x : g(x) <= t}: so that {g > t} = {x > g_inv(t)}."""
        t = _as_array(t)
        with np.errstate(invalid="ignore", over="ignore"):
            x = (t * self.b + self.D) / 2
        return np.where(t < self.g_min, -np.inf, np.where(t >= self.g_max, np.inf, x))

    def sample(self, rng, n):
        return rng.laplace(0.0, self.b, n)


class LatticeNoise(ShiftFamily):
    """Integer noise with pmf ``pmf`` on offsets 0..m-1 and integer shift ``D``: every pair
    is a finite profile computed exactly (:func:`finite_mixture_profile`)."""

    def __init__(self, pmf, D: int):
        self.pmf = np.asarray(pmf, dtype=float)
        self.D = int(D)

    def remove_pair(self, q: float) -> FiniteProfile:
        return finite_mixture_profile(self.pmf, {0: 1 - q, self.D: q}, {0: 1.0})

    def add_pair(self, q: float) -> FiniteProfile:
        return finite_mixture_profile(self.pmf, {0: 1.0}, {0: 1 - q, self.D: q})

    def substitution_pair(self, q: float) -> FiniteProfile:
        return finite_mixture_profile(self.pmf, {0: 1 - q, self.D: q}, {0: 1 - q, -self.D: q})


#: Gauss-Hermite nodes of :meth:`GaussianNoise.expectation_nodes`
QUAD_NODES = 96


@functools.lru_cache(maxsize=None)
def _hermite_nodes():
    t, w = np.polynomial.hermite_e.hermegauss(QUAD_NODES)  # weight e^{-t^2/2}
    return t, w / math.sqrt(2.0 * math.pi)


def _log_mix(q, t):
    """ln(1 - q + q e^t), stable for all t (t may be +-inf)."""
    t = _as_array(t)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        big = t + np.log(q) + np.log1p((1 - q) / q * np.exp(-t))
        small = np.log1p(q * np.expm1(t))
    return np.where(t > 0, big, small)


def _logsumexp_weighted(weights, values):
    """ln sum_i w_i e^{v_i} over the terms with w_i > 0 (values: list of arrays)."""
    terms = [math.log(w) + v for w, v in zip(weights, values) if w > 0]
    out = terms[0]
    for t in terms[1:]:
        out = np.logaddexp(out, t)
    return out


class MixtureProfile(PrivacyProfile):
    """P = sum_i a_i B_{c_i}, Q = sum_j b_j B_{d_j}, with L(x) non-decreasing in x.

    ``threshold(eps)`` must return x_eps with {L > eps} = {x > x_eps}
    (-inf / +inf where the set is everything / empty).  With ``reverse=True``
    the profile is that of the reversed pair (Q, P): its loss is -L(x) and
    {-L > eps} = {x < x_{-eps}}.  delta(eps) is evaluated in log space,

        delta = e^A (1 - e^{B - A}),  A = ln P(L > eps),  B = eps + ln Q(L > eps),

    from log-survival functions, so it keeps its relative accuracy far into the
    right tail (the naive difference cancels there).
    """

    def __init__(self, noise, p_weights, p_shifts, q_weights, q_shifts, threshold, loss, eps_range,
                 reverse: bool = False):
        self.noise = noise
        self.pa, self.pc = np.asarray(p_weights, float), np.asarray(p_shifts, float)
        self.qb, self.qd = np.asarray(q_weights, float), np.asarray(q_shifts, float)
        self._threshold = threshold
        self._loss = loss
        self._range = eps_range  # (inf L, sup L) of the unreversed pair
        self.reverse = reverse
        self.p_inf = 0.0

    @property
    def atomless(self) -> bool:
        return bool(getattr(self.noise, "continuous_loss", False))

    def reversed(self) -> "MixtureProfile":
        return MixtureProfile(self.noise, self.pa, self.pc, self.qb, self.qd, self._threshold,
                              self._loss, self._range, reverse=not self.reverse)

    # x-threshold and which tail of x is {L' > eps}
    def _x(self, eps):
        eps = _as_array(eps)
        if self.reverse:
            if isinstance(eps, np.ndarray) and eps.ndim:  # (in place in one fresh array)
                t = np.negative(eps)
                return self._threshold(np.nextafter(t, -np.inf, out=t))
            return self._threshold(np.nextafter(-eps, -np.inf))
        return self._threshold(eps)

    def _sides(self):
        """(P weights, P shifts, Q weights, Q shifts, fn for {L'>eps}, fn for {L'<=eps}, logs)."""
        n = self.noise
        if self.reverse:
            return self.qb, self.qd, self.pa, self.pc, n.cdf, n.sf, n.log_cdf
        return self.pa, self.pc, self.qb, self.qd, n.sf, n.cdf, n.log_sf

    @staticmethod
    def _mix(fn, weights, shifts, x):
        return MixtureProfile._weighted(weights, shifts, lambda c: fn(x - c), x)

    @staticmethod
    def _weighted(weights, shifts, value, like):
        """sum of w * value(c) over the components with w > 0 (in order, from zeros like ``like``)."""
        out = scratch = None
        for w, c in zip(weights, shifts):
            if w > 0:
                v = value(c)
                if out is None:  # (0 + term, in place: the numbers of a sum from zeros)
                    term = w * v
                    out = np.add(term, 0.0, out=term) if isinstance(term, np.ndarray) else 0.0 + term
                elif isinstance(out, np.ndarray) and isinstance(v, np.ndarray) and v.shape == out.shape:
                    # (later terms in one scratch array: the numbers of out += w * v)
                    scratch = np.multiply(v, w, out=scratch)
                    out += scratch
                else:
                    out += w * v
        return np.zeros_like(like) if out is None else out

    def sf_p(self, eps):
        pw, ps, _, _, up, _, _ = self._sides()
        return self._mix(up, pw, ps, self._x(eps))

    def cdf_p(self, eps):
        pw, ps, _, _, _, down, _ = self._sides()
        return self._mix(down, pw, ps, self._x(eps))

    def sf_q(self, eps):
        _, _, qw, qs, up, _, _ = self._sides()
        return self._mix(up, qw, qs, self._x(eps))

    def cdf_q(self, eps):
        _, _, qw, qs, _, down, _ = self._sides()
        return self._mix(down, qw, qs, self._x(eps))

    def grid_values(self, eps):
        """(sf_p, cdf_p, sf_q, cdf_q) at eps with one threshold evaluation (and, for noises with
        ``sf_cdf``, one tail evaluation per distinct shift: P and Q share the unshifted one)."""
        pw, ps, qw, qs, up, down, _ = self._sides()
        x = self._x(eps)
        pair = getattr(self.noise, "sf_cdf", None)
        if pair is None:
            return self._mix(up, pw, ps, x), self._mix(down, pw, ps, x), self._mix(up, qw, qs, x), \
                self._mix(down, qw, qs, x)
        tails: dict = {}  # shift -> ({L' > eps}, its complement) at x - shift

        def tail(c, k):
            c = float(c)
            if c not in tails:
                sf, cdf = pair(x - c)
                tails[c] = (cdf, sf) if self.reverse else (sf, cdf)
            return tails[c][k]

        return tuple(self._weighted(w, sh, lambda c, k=k: tail(c, k), x)
                     for w, sh, k in ((pw, ps, 0), (pw, ps, 1), (qw, qs, 0), (qw, qs, 1)))

    def delta(self, eps):
        eps = _as_array(eps)
        return self._delta_at(eps, self._x(eps))

    def delta_and_sf_q(self, eps):
        """(delta(eps), sf_q(eps)) with one threshold evaluation: the same numbers as the two
        methods (the optimistic hull's tangents need both at the same points)."""
        eps = _as_array(eps)
        _, _, qw, qs, up, _, _ = self._sides()
        x = self._x(eps)
        return self._delta_at(eps, x), self._mix(up, qw, qs, x)

    def _delta_at(self, eps, x):
        """delta(eps) in log space from the threshold x = _x(eps); each shift's log tail once
        (P and Q share the unshifted one)."""
        pw, ps, qw, qs, _, _, log_up = self._sides()
        logs: dict = {}

        def lu(c):
            c = float(c)
            if c not in logs:
                logs[c] = log_up(x - c)
            return logs[c]

        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            A = _logsumexp_weighted(pw, [lu(c) for c in ps])
            B = eps + _logsumexp_weighted(qw, [lu(d) for d in qs])
            d = np.exp(A) * -np.expm1(np.minimum(B - A, 0.0))
        return np.clip(np.where(np.isfinite(A), d, 0.0), 0.0, 1.0)

    def loss_moments(self) -> tuple[float, float] | None:
        """Mean and variance of L under P by quadrature over the noise (for noises with
        ``expectation_nodes``: Gauss-Hermite for the Gaussian); None for other noises.
        Guarantee: an estimate (see :meth:`PrivacyProfile.loss_moments`)."""
        nodes = getattr(self.noise, "expectation_nodes", None)
        if nodes is None:
            return None
        t, w = nodes()
        pw, ps, *_ = self._sides()
        pw, ps = pw[pw > 0], ps[pw > 0]
        x = (ps[:, None] + t[None, :]).ravel()
        ww = (pw[:, None] * w[None, :]).ravel() / pw.sum()
        with np.errstate(over="ignore", invalid="ignore"):
            L = self._loss(x)
        L = -L if self.reverse else L
        if not np.all(np.isfinite(L)):
            return None
        mean = float(ww @ L)
        return mean, float(ww @ (L - mean) ** 2)

    def sample_p(self, rng, n: int) -> np.ndarray:
        """n samples of L under P (for Monte Carlo validation)."""
        pw, ps, *_ = self._sides()
        comp = rng.choice(pw.size, size=n, p=pw / pw.sum())
        x = self.noise.sample(rng, n) + ps[comp]
        return -self._loss(x) if self.reverse else self._loss(x)

    def support_edges(self) -> tuple[float, float]:
        lo_l, hi_l = self._range
        return (-hi_l, -lo_l) if self.reverse else (lo_l, hi_l)

    def loss_sup(self) -> float:
        # (the loss is monotone in x: its range over every output bounds it under P)
        return math.inf if self.p_inf > 0 else float(self.support_edges()[1])

    def eps_bounds(self, tail: float) -> tuple[float, float]:
        lo_l, hi_l = self.support_edges()
        lo, hi = super().eps_bounds(tail) if (np.isinf(lo_l) or np.isinf(hi_l)) else (lo_l, hi_l)
        return max(lo, lo_l - 1e-12), min(hi, hi_l)

    def _eps_bounds_search(self, tail: float, want_lo: bool = True, want_hi: bool = True):
        # only the unbounded ends need a search (the base class caches the result per tail)
        lo_l, hi_l = self.support_edges()
        want_lo, want_hi = want_lo and bool(np.isinf(lo_l)), want_hi and bool(np.isinf(hi_l))
        lo, hi = -math.inf, math.inf
        if getattr(self.noise, "scalar_tail", None) is not None and self.p_inf == 0.0 and 0.0 < tail < 1e-3:
            pw, ps, *_ = self._sides()
            # {L' > eps} is {x > x_eps} (a sf of x - c) unless reversed ({x < x_{-eps}}: a cdf)
            # (like the generic search, the ends are never on the far side of 0: a law whose mass
            # all lies right of 0 gets lo = 0, which still has P(L <= lo) <= tail)
            if want_hi:
                hi = self._checked(self._x_end(pw, ps, tail, right=not self.reverse), tail, hi_end=True)
                hi = hi if math.isnan(hi) else max(hi, 0.0)
            if want_lo:
                lo = self._checked(self._x_end(pw, ps, tail, right=self.reverse), tail, hi_end=False)
                lo = lo if math.isnan(lo) else min(lo, 0.0)
        if (want_hi and math.isnan(hi)) or (want_lo and math.isnan(lo)):
            lo2, hi2 = super()._eps_bounds_search(tail, want_lo=want_lo and math.isnan(lo),
                                                  want_hi=want_hi and math.isnan(hi))
            lo, hi = (lo2 if math.isnan(lo) else lo), (hi2 if math.isnan(hi) else hi)
        return lo, hi

    def _x_end(self, weights, shifts, tail: float, right: bool) -> float:
        """For a noise with ``isf``/``icdf`` and ``scalar_tail``: the output x beyond which the
        mixture sum_i w_i B_{c_i} has mass <= tail (``right``: the smallest x with sum_i w_i
        sf(x - c_i) <= tail; else the largest x with sum_i w_i cdf(x - c_i) <= tail), to 1e-7 of
        the noise's ``scale``, on the safe side.  Bracketed in closed form (each term at tail / k,
        k terms: the sum is <= tail; one term at tail: it is >= tail), then bisected on Python
        floats (~1 us per step where a numpy call costs ~10 us); the caller checks the end with
        the profile's own functions.  NaN if it cannot bracket."""
        n = self.noise
        w = [(float(a), float(c)) for a, c in zip(weights, shifts) if a > 0]
        k = len(w)
        if any(tail / a >= 0.5 for a, _ in w):
            return math.nan
        sign = 1.0 if right else -1.0
        inv = n.isf if right else n.icdf
        # safe (sum <= tail) and unsafe (sum >= tail) ends, as sign * x
        safe = max(sign * (c + float(inv(tail / (k * a)))) for a, c in w)
        unsafe = max(sign * (c + float(inv(tail / a))) for a, c in w)
        if not (math.isfinite(safe) and math.isfinite(unsafe)) or unsafe > safe:
            return math.nan
        f1, tol = n.scalar_tail(right), 1e-7 * n.scale
        for _ in range(200):
            if not safe - unsafe > tol:
                break
            mid = 0.5 * (unsafe + safe)
            if sum(a * f1(sign * mid - c) for a, c in w) <= tail:
                safe = mid
            else:
                unsafe = mid
        return sign * safe

    def _checked(self, x: float, tail: float, hi_end: bool) -> float:
        """The loss end at output x (L' = L or -L), checked against the tail condition with the
        profile's own functions (nudged outward a little if rounding needs it); NaN if it fails."""
        if not math.isfinite(x):
            return math.nan
        e = float(self._loss(np.array([x]))[0])
        e = -e if self.reverse else e
        if not math.isfinite(e):
            return math.nan
        for _ in range(4):
            val = float(self.sf_p(e) - self.p_inf) if hi_end else float(self.cdf_p(e))
            if val <= tail:
                return e
            e += (1.0 if hi_end else -1.0) * 1e-9 * max(1.0, abs(e))
        return math.nan


def _one_run(mask: np.ndarray) -> tuple[int, int] | None:
    """(a, b) when the True entries of a 1-d boolean array are exactly mask[a:b] and that run
    touches one end (as {eps > 0} on a sorted grid, either order), else None."""
    if mask.ndim != 1 or mask.size == 0:
        return None
    n = mask.size
    if mask[-1]:  # a suffix
        a = n - int(np.argmin(mask[::-1])) if not mask.all() else 0
        return (a, n) if not mask[:a].any() else None
    if mask[0]:  # a prefix
        b = int(np.argmin(mask))
        return (0, b) if not mask[b:].any() else None
    return (0, 0) if not mask.any() else None


def poisson_remove(noise, q: float) -> MixtureProfile:
    """Remove direction: P = (1-q) B_0 + q B_D, Q = B_0; L = ln(1 - q + q e^{g(x)})."""
    log1mq = math.log1p(-q)

    log_q = math.log(q)

    def threshold(eps):
        eps = np.asarray(eps, dtype=float)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            # t = ln((e^eps - (1-q)) / q), computed without cancellation (each branch only where
            # it is used: grids are mostly eps > 0)
            pos = eps > 0
            # the eps > 0 as one slice of the flat array: all of it, or a run at one end (a sorted
            # grid); then worked in place, else element-wise by masks
            run = None if not eps.ndim else (0, eps.size) if pos.all() else (
                _one_run(pos) if eps.ndim == 1 else None)
            if run is not None:
                flat = eps.reshape(-1)
                t = np.empty(flat.size)
                a, b = run
                e1, t1 = flat[a:b], t[a:b]
                # (in place: the numbers of eps + log1p(-(1 - q) e^-eps) - ln q)
                np.negative(e1, out=t1)
                np.exp(t1, out=t1)
                t1 *= -(1 - q)
                np.log1p(t1, out=t1)
                np.add(e1, t1, out=t1)
                t1 -= log_q
                for lo, hi in ((0, a), (b, flat.size)):
                    if hi > lo:  # (the few eps <= 0, copied: numpy's log and expm1 may round
                        # a slice that starts inside an array differently from a fresh one)
                        t[lo:hi] = np.log(np.expm1(flat[lo:hi].copy()) + q) - log_q
                t = t.reshape(eps.shape)
            elif pos.all():
                t = eps + np.log1p(-(1 - q) * np.exp(-eps)) - log_q
            else:
                t = np.empty(eps.shape)
                e1, e2 = eps[pos], eps[~pos]
                t[pos] = e1 + np.log1p(-(1 - q) * np.exp(-e1)) - log_q
                t[~pos] = np.log(np.expm1(e2) + q) - log_q
        if isinstance(t, np.ndarray) and t.ndim:  # (t is a fresh array: in place)
            np.copyto(t, -np.inf, where=eps <= log1mq)
            return noise.g_inv(t, overwrite_t=True) if isinstance(noise, GaussianNoise) else noise.g_inv(t)
        t = np.where(eps <= log1mq, -np.inf, t)
        return noise.g_inv(t)

    def loss(x):
        return _log_mix(q, noise.g(x))

    lo = float(_log_mix(q, noise.g_min)) if np.isfinite(noise.g_min) else log1mq
    hi = float(_log_mix(q, noise.g_max)) if np.isfinite(noise.g_max) else np.inf
    return MixtureProfile(noise, [1 - q, q], [0.0, noise.D], [1.0], [0.0], threshold, loss, (lo, hi))


def poisson_add(noise, q: float) -> MixtureProfile:
    """Add direction: the reversed pair of remove (P = B_0, Q = (1-q) B_0 + q B_D)."""
    return poisson_remove(noise, q).reversed()


def poisson_substitution(noise, q: float) -> MixtureProfile:
    """Substitution: P = (1-q) B_0 + q B_D, Q = (1-q) B_0 + q B_{-D}.

    L(x) = ln(1 - q + q e^{g(x)}) - ln(1 - q + q e^{g(-x)}) is odd and
    non-decreasing; its threshold is found by vectorised bisection.
    """
    D = noise.D

    def loss(x):
        x = _as_array(x)
        return _log_mix(q, noise.g(x)) - _log_mix(q, noise.g(-x))

    if np.isfinite(noise.g_max):
        lmax = float(_log_mix(q, noise.g_max) - _log_mix(q, noise.g_min))
        span = 2 * D
    else:
        lmax = np.inf
        span = None

    def threshold(eps):
        eps = _as_array(eps)
        shape = eps.shape
        e = eps.ravel()
        out = np.empty_like(e)
        if span is None:
            # Gaussian: for large |x|, L ~ g(x) + ln q - ln(1-q); bracket by expanding
            a = np.full(e.size, -1.0)
            b = np.full(e.size, 1.0)
            for _ in range(2000):
                need = loss(b) <= e
                if not need.any():
                    break
                b = np.where(need, 2 * b, b)
            for _ in range(2000):
                need = loss(a) > e
                if not need.any():
                    break
                a = np.where(need, 2 * a, a)
        else:
            a = np.full(e.size, -span)
            b = np.full(e.size, span)
        for _ in range(200):
            _deadline.check("discretising a step")
            m = 0.5 * (a + b)
            le = loss(m) <= e
            a = np.where(le, m, a)
            b = np.where(le, b, m)
            if np.all(b - a <= 4 * np.finfo(float).eps * np.maximum(1.0, np.abs(m))):
                break
        out[:] = b  # right end: {L > eps} = {x > b} up to one ulp in x
        if span is not None:
            out = np.where(e >= lmax, np.inf, np.where(e < -lmax, -np.inf, out))
        return out.reshape(shape)

    return MixtureProfile(noise, [1 - q, q], [0.0, D], [1 - q, q], [0.0, -D], threshold, loss,
                          (-lmax, lmax))


def shift_mixture_remove(noise: GaussianNoise, weights, shifts=None) -> MixtureProfile:
    """Remove direction of a user-level step (docs/MATH.md section 13.1):
    P = sum_k w_k B_{kD} (k = 0..g, w = ``weights``), Q = B_0, Gaussian noise B = N(0, s^2);
    with ``shifts`` (c_k >= 0, any reals: a mixture of Gaussians, MATH.md section 13.6)
    P = sum_k w_k B_{c_k} instead of shifts k D.

    With a_k = kD/s^2 and b_k = (kD)^2/(2 s^2) the loss is L(x) = ln sum_k w_k e^{a_k x - b_k},
    a log-sum-exp of increasing affine functions: increasing and convex in x, from ln w_0
    (x -> -inf) to +inf.  Its threshold x_eps: {L > eps} = {h > T} with
    h(x) = ln sum_{k>=1} w_k e^{a_k x - b_k} (convex, slope between the smallest and largest
    a_k of positive weight: never flat) and T = ln(e^eps - w_0); Newton's method on h from the
    right of the root (h >= ln w_K + a_K x - b_K gives the start) decreases monotonically to
    the root, quadratically.

    With weights (1 - q, q) this is the pair of :func:`poisson_remove` (same law, computed
    numerically instead of by the closed form).
    """
    if not isinstance(noise, GaussianNoise):
        raise TypeError("shift_mixture_remove: Gaussian noise only")
    w = np.asarray(weights, dtype=float)
    if shifts is None:
        if w.ndim != 1 or w.size < 2 or np.any(w < 0) or not np.isfinite(w).all() or abs(w.sum() - 1) > 1e-9:
            raise ValueError("weights must be a probability vector over the shifts 0, D, 2D, ...")
        ks = np.nonzero(w > 0)[0]
        if ks[-1] == 0:
            raise ValueError("weights: some shift k >= 1 needs positive weight")
        wk, c = w[ks], ks * noise.D
        w0 = float(w[0])
    else:
        c_all = np.asarray(shifts, dtype=float)
        if (w.ndim != 1 or c_all.shape != w.shape or np.any(w < 0) or not np.isfinite(w).all()
                or abs(w.sum() - 1) > 1e-9):
            raise ValueError("weights must be a probability vector, one weight per shift")
        if not np.isfinite(c_all).all() or np.any(c_all < 0):
            raise ValueError("shifts must be finite and >= 0")
        keep = w > 0
        cu, inv = np.unique(c_all[keep], return_inverse=True)  # sorted, equal shifts merged
        wu = np.bincount(inv, weights=w[keep])
        w0 = float(wu[0]) if cu[0] == 0.0 else 0.0
        if cu[-1] == 0.0:
            raise ValueError("shifts: some shift > 0 needs positive weight")
        wk, c = wu, cu
        ks = np.arange(c.size)  # (positions only: which entries are the shift 0 below)
    lw = np.log(wk)
    s2 = noise.s ** 2
    a, b = c / s2, c * c / (2 * s2)
    log_w0 = math.log(w0) if w0 > 0 else -np.inf
    pos = c > 0
    lw1, a1, b1 = lw[pos], a[pos], b[pos]  # the terms of positive shift

    def h_slope(x):
        """(h(x), h'(x)) with h(x) = ln sum_{k>=1} w_k e^{a_k x - b_k}, for finite x (1-d array):
        convex, slope in [a_1, a_K] (never flat), and e^L = w_0 + e^h."""
        terms = lw1[:, None] + a1[:, None] * x[None, :] - b1[:, None]
        j = terms.argmax(axis=0)
        m = np.take_along_axis(terms, j[None, :], axis=0)[0]
        ex = np.exp(terms - m)
        slope = (a1[:, None] * ex).sum(axis=0) / ex.sum(axis=0)
        np.put_along_axis(ex, j[None, :], 0.0, axis=0)
        return m + np.log1p(ex.sum(axis=0)), slope  # log1p: full accuracy when one term dominates

    def loss(x):
        x = _as_array(x)
        flat = x.ravel()
        h = h_slope(np.where(np.isfinite(flat), flat, 0.0))[0]
        out = np.logaddexp(log_w0, h) if w0 > 0 else h
        out = np.where(flat == np.inf, np.inf, np.where(flat == -np.inf, log_w0, out))
        return out.reshape(x.shape)

    def threshold(eps):
        # {L > eps} = {h > T}, T = ln(e^eps - w_0); h convex increasing with slope >= a_1, so
        # Newton from a point right of the root decreases monotonically to it (quadratically).
        eps = _as_array(eps)
        shape = eps.shape
        e = eps.ravel().astype(float)
        inside = np.isfinite(e) & (e > log_w0)
        ee = np.where(inside, e, 1.0)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            if w0 > 0:
                T = np.where(ee > 0, ee + np.log1p(-w0 * np.exp(-ee)), np.log(np.expm1(ee) + (1 - w0)))
            else:
                T = ee
        T = np.where(inside, T, 0.0)
        # h(x) >= ln w_k + a_k x - b_k for every k: the least of their roots is a start right of
        # the root (for many components of tiny weight far closer than the last one's);
        # h(x) <= h(0) + a_K x (x >= 0) and h(x) <= h(0) + a_1 x (x <= 0): a bound left of it
        with np.errstate(over="ignore", invalid="ignore"):
            hi = np.min((T[None, :] - lw1[:, None] + b1[:, None]) / a1[:, None], axis=0)
            h0 = h_slope(np.zeros(1))[0][0]
            lo = np.where(T <= h0, (T - h0) / a1[0], (T - h0) / a1[-1])
        # beyond floating point (eps ~ 1e308 or a start that overflows): x_eps = +inf for all purposes
        huge = ~np.isfinite(hi) | (hi > 1e200) | (ee > 1e200)
        T, lo = np.where(huge, h0, T), np.where(huge, 0.0, lo)
        hi = np.where(huge, 0.0, np.maximum(hi, lo))
        x = hi.copy()
        tiny = 4 * np.finfo(float).eps
        for _ in range(200):
            _deadline.check("discretising a step")
            f, d = h_slope(x)
            nx = np.clip(x - (f - T) / d, lo, x)
            if np.all(np.abs(nx - x) <= tiny * np.maximum(1.0, np.abs(x))):
                x = nx
                break
            x = nx
        x = np.where(huge, np.inf, x)
        out = np.where(inside, x, np.where(e == np.inf, np.inf, -np.inf))
        out = np.where(np.isnan(e), np.nan, out)
        return out.reshape(shape)

    return MixtureProfile(noise, wk, c, [1.0], [0.0], threshold, loss, (log_w0, np.inf))


#: Gauss-Legendre nodes and weights on [0, 1] for :class:`SymmetricGaussianMixtureProfile`'s small
#: central masses (an entire integrand over |t b| <= 4: 24 nodes are exact to double precision)
_GL_X, _GL_W = (lambda x, w: ((x + 1) / 2, w / 2))(*np.polynomial.legendre.leggauss(24))


class SymmetricGaussianMixtureProfile(PrivacyProfile):
    """Pair P = (N(b, 1) + N(-b, 1)) / 2 against Q = N(0, 1) (remove direction; docs/MATH.md 13.13).

    The loss L(z) = ln cosh(b z) - b^2 / 2 depends on |z| and increases with it, so
    {L > eps} = {|z| > z_eps} with b z_eps = u + ln(1 + sqrt(1 - e^{-2u})), u = eps + b^2 / 2 >= 0
    (every eps <= -b^2/2 has z_eps = 0):

        Q(L > eps) = erfc(z / sqrt 2),     P(L > eps) = Phi(b - z) + Phi(-b - z),
        P(L <= eps) = Phi(z - b) - Phi(-z - b)

    the last by Gauss-Legendre quadrature of the Gaussian density over [-z, z] where z (b + 1) <= 4
    (the difference would cancel there) and from ``log_ndtr`` otherwise, so both tails keep their
    relative accuracy.  Random allocation of one record to one of t = 2 steps is exactly the
    composition of this pair at b = 1 / (sqrt(2) sigma) with the Gaussian pair at noise sqrt(2) sigma
    (MATH 13.13)."""

    atomless = True

    def __init__(self, b: float):
        b = float(b)
        if not (0.0 < b < math.inf):
            raise ValueError(f"b: the mixture's shift must be positive and finite, got {b!r}")
        if 0.5 * b * b > MAX_SINGLE_LOSS:
            raise LossRangeError(f"single-step privacy loss reaches about b^2 / 2 = {0.5 * b * b:.3g}, beyond "
                                 f"the supported {MAX_SINGLE_LOSS:g} (e^eps overflows); use more noise")
        self.b = b
        self.p_inf = 0.0
        c = 134217729.0 * b  # (Dekker's split: b^2 = p + e exactly)
        bh = c - (c - b)
        bl = b - bh
        p = b * b
        e = ((bh * bh - p) + 2.0 * bh * bl) + bl * bl
        self._half_b2 = (0.5 * p, 0.5 * e)

    def _z(self, eps):
        """z_eps >= 0 (0 where eps <= -b^2/2, +inf at eps = +inf)."""
        return self._zw(eps)[0]

    def _zw(self, eps):
        """(z_eps, b - z_eps), both to a few ulp: u = eps + b^2/2 and b^2/2 - eps are formed without
        rounding b^2 (Dekker's product, Knuth's two-sum), then b z = u + l and b (b - z) = (b^2/2 - eps)
        - l with l = ln(1 + sqrt(1 - e^{-2u})) in [0, ln 2].  Near the bottom of the loss z ~ sqrt(2 u)
        / b, so an absolute error in u would be a large relative one in z; near z = b the
        difference b - z would cancel."""
        eps = _as_array(eps)
        h, lo = self._half_b2
        with np.errstate(invalid="ignore"):
            s1 = eps + h  # two-sum of eps and h
            bb = s1 - eps
            u = s1 + (((eps - (s1 - bb)) + (h - bb)) + lo)
            s2 = h - eps  # two-sum of h and -eps
            bb = s2 - h
            a = s2 + (((h - (s2 - bb)) + (-eps - bb)) + lo)
        with np.errstate(over="ignore", invalid="ignore"):
            up = np.maximum(u, 0.0)
            l = np.log1p(np.sqrt(-np.expm1(-2.0 * up)))
            z = (up + l) / self.b
            w = (a - l) / self.b
        pos = u > 0
        top = eps == np.inf
        z = np.where(top, np.inf, np.where(pos, z, 0.0))
        w = np.where(top, -np.inf, np.where(pos, w, self.b))
        return z, w

    def loss(self, z):
        """L(z) = ln cosh(b z) - b^2 / 2."""
        x = np.abs(_as_array(z)) * self.b
        return x + np.log1p(np.exp(-2.0 * x)) - math.log(2.0) - 0.5 * self.b * self.b

    def sf_q(self, eps):
        return special.erfc(self._z(eps) / math.sqrt(2.0))

    def cdf_q(self, eps):
        return special.erf(self._z(eps) / math.sqrt(2.0))

    def sf_p(self, eps):
        z, w = self._zw(eps)
        return special.ndtr(w) + special.ndtr(-self.b - z)

    def cdf_p(self, eps):
        z, w = self._zw(eps)
        b = self.b
        scalar = np.ndim(z) == 0
        z, w = np.atleast_1d(z), np.atleast_1d(w)
        out = np.empty_like(z)
        with np.errstate(over="ignore"):
            small = z * (b + 1.0) <= 4.0
        if small.any():
            # Phi(z - b) - Phi(-z - b) = phi(b) Integral_{-z}^{z} e^{t b - t^2/2} dt
            #                        = 2 phi(b) z Integral_0^1 cosh(s z b) e^{-(s z)^2 / 2} ds
            zs = z[small][:, None] * _GL_X[None, :]
            integral = (np.cosh(zs * b) * np.exp(-0.5 * zs * zs)) @ _GL_W
            with np.errstate(divide="ignore"):
                out[small] = np.exp(np.log(2.0 * z[small] * integral) - 0.5 * b * b) / math.sqrt(2.0 * math.pi)
        big = ~small
        if big.any():
            zb, wb = z[big], w[big]
            la, lb = special.log_ndtr(-wb), special.log_ndtr(-zb - b)
            with np.errstate(divide="ignore", invalid="ignore"):
                diff = np.exp(la) * -np.expm1(lb - la)
                sf = special.ndtr(wb) + special.ndtr(-b - zb)
            out[big] = np.where(sf < 0.5, 1.0 - sf, diff)
        return out[0] if scalar else out

    def loss_moments(self):
        return None

    def _floor(self) -> float:
        """A double at or below the smallest loss -b^2/2 (rounded down)."""
        h, lo = self._half_b2
        return float(np.nextafter(-(h + lo), -np.inf))

    def support_edges(self) -> tuple[float, float]:
        return self._floor(), math.inf

    def eps_bounds(self, tail: float) -> tuple[float, float]:
        """Closed-form ends: P(L > hi) <= 2 Phi(b - z_hi) = tail at z_hi = b - Phi^-1(tail / 2);
        P(L <= lo) <= min(Phi(z - b), 2 z phi(0)) = tail at the larger of z = b + Phi^-1(tail) and
        z = tail sqrt(pi / 2); each end moved outward by 1e-12 relative for the rounding of L."""
        b = self.b
        z_hi = b - float(special.ndtri(0.5 * tail))
        z_lo = max(b + float(special.ndtri(tail)), tail * math.sqrt(0.5 * math.pi))
        lo, hi = float(self.loss(z_lo)), float(self.loss(z_hi))
        pad = 1e-12 * (1.0 + 0.5 * b * b)
        return max(lo - pad - 1e-12 * abs(lo), self._floor()), hi + pad + 1e-12 * abs(hi)


class MaxProfile(PrivacyProfile):
    """The point-wise maximum of two hockey-stick curves (a valid curve of some pair).

    Used for WOR substitution (seed 002 section 8): an UPPER bound only.
    Its loss distribution is read off the curve: Q(L > eps) = -e^{-eps} delta'(eps),
    P(L > eps) = delta(eps) - delta'(eps), taking at each eps the branch with the
    larger delta.
    """

    def __init__(self, a: PrivacyProfile, b: PrivacyProfile):
        self.a, self.b = a, b
        self.p_inf = max(a.p_inf, b.p_inf)

    def _pick(self, eps):
        eps = _as_array(eps)
        return eps, self.a.delta(eps) >= self.b.delta(eps)

    def delta(self, eps):
        return np.maximum(self.a.delta(eps), self.b.delta(eps))

    def sf_q(self, eps):
        eps, use_a = self._pick(eps)
        return np.where(use_a, self.a.sf_q(eps), self.b.sf_q(eps))

    def sf_p(self, eps):
        eps, use_a = self._pick(eps)
        return np.where(use_a, self.a.sf_p(eps), self.b.sf_p(eps))

    def cdf_p(self, eps):
        eps, use_a = self._pick(eps)
        return np.where(use_a, self.a.cdf_p(eps), self.b.cdf_p(eps))

    def cdf_q(self, eps):
        eps, use_a = self._pick(eps)
        return np.where(use_a, self.a.cdf_q(eps), self.b.cdf_q(eps))

    def eps_bounds(self, tail: float) -> tuple[float, float]:
        la, ha = self.a.eps_bounds(tail)
        lb, hb = self.b.eps_bounds(tail)
        return min(la, lb), max(ha, hb)


def finite_mixture_profile(pmf: np.ndarray, p_mix: dict, q_mix: dict) -> FiniteProfile:
    """Exact pair of mixtures of a lattice noise: P = sum_c p_mix[c] pmf(. - c), same for Q.

    ``pmf`` is the noise pmf on offsets 0..m-1; shifts are integers.  Outputs
    where Q has no mass become the +inf atom of L.
    """
    pmf = np.asarray(pmf, dtype=float)
    m = pmf.size
    # copies whose shifts differ by >= m do not overlap, so a gap wider than m between
    # consecutive distinct shifts is shortened to m: the same pair (outputs relabelled),
    # on at most (number of shifts + 1) m outputs however large the shift is
    at, pos = {}, 0
    ordered = sorted({int(c) for c in list(p_mix) + list(q_mix)})
    for i, c in enumerate(ordered):
        pos = 0 if i == 0 else pos + min(c - ordered[i - 1], m)
        at[c] = pos
    P = np.zeros(pos + m)
    Q = np.zeros(pos + m)
    for c, w in p_mix.items():
        P[at[int(c)] : at[int(c)] + m] += w * pmf
    for c, w in q_mix.items():
        Q[at[int(c)] : at[int(c)] + m] += w * pmf
    return finite_pair(P, Q)


def finite_pair(P: np.ndarray, Q: np.ndarray) -> FiniteProfile:
    """The exact profile of two pmfs on the same finite outputs: L = ln(P/Q) where both are
    positive, and the +inf atom P(Q = 0).  With disjoint supports L = +inf P-surely and
    delta(eps) = 1 for every eps: one atom of mass 0 keeps the profile's arrays non-empty
    and changes no value."""
    P, Q = np.asarray(P, dtype=float), np.asarray(Q, dtype=float)
    both = (P > 0) & (Q > 0)
    p_inf = float(P[(P > 0) & (Q == 0)].sum())
    if not both.any():
        return FiniteProfile([0.0], [0.0], p_inf=1.0)
    return FiniteProfile(np.log(P[both] / Q[both]), P[both], p_inf=p_inf)


class DisjointMixtureProfile(PrivacyProfile):
    """The pair that draws branch i with probability w_i and reveals it: P = sum_i w_i (i, P_i),
    Q = sum_i w_i (i, Q_i).  Its loss law under P is the w-mixture of the branches' laws and its
    curve is sum_i w_i delta_i(eps).  It dominates any pair P' = sum_i w_i P_i, Q' = sum_i w_i Q_i
    that mixes the branches with the same weights without revealing the branch (forgetting the
    branch is post-processing; docs/MATH.md 2.6)."""

    def __init__(self, parts, weights):
        self.parts = list(parts)
        w = np.asarray(weights, dtype=float)
        if len(self.parts) != w.size or w.size == 0 or np.any(w < 0) or abs(w.sum() - 1.0) > 1e-12:
            raise ValueError("weights: one weight >= 0 per branch, summing to 1")
        self.w = w
        self.p_inf = float(sum(wi * p.p_inf for wi, p in zip(w, self.parts)))
        self.atomless = all(getattr(p, "atomless", False) for p in self.parts)

    def _sum(self, name, eps):
        eps = _as_array(eps)
        return sum(wi * getattr(p, name)(eps) for wi, p in zip(self.w, self.parts))

    def sf_p(self, eps):
        return self._sum("sf_p", eps)

    def cdf_p(self, eps):
        return self._sum("cdf_p", eps)

    def sf_q(self, eps):
        return self._sum("sf_q", eps)

    def cdf_q(self, eps):
        return self._sum("cdf_q", eps)

    def delta(self, eps):
        return np.clip(self._sum("delta", eps), 0.0, 1.0)

    def reversed(self) -> "DisjointMixtureProfile":
        return DisjointMixtureProfile([p.reversed() for p in self.parts], self.w)

    def eps_bounds(self, tail: float) -> tuple[float, float]:
        # (m branches: one of weight w <= tail / (2m) is left out, together at most tail / 2 of
        # the mass; each other leaves max(tail / 4, tail / (4 m w)) of its own mass outside, together
        # at most tail / 2: so a branch of tiny weight does not stretch the range by its far tail;
        # never more than 1e-4, where the branches' own end searches are reliable -- less mass
        # outside only keeps the bound)
        m = len(self.parts)
        ends = [p.eps_bounds(min(1e-4, max(tail / 4.0, tail / (4.0 * m * wi))))
                for p, wi in zip(self.parts, self.w) if wi > tail / (2.0 * m)]
        return min(e[0] for e in ends), max(e[1] for e in ends)

    def support_edges(self) -> tuple[float, float]:
        ends = [p.support_edges() for p in self.parts]
        return min(e[0] for e in ends), max(e[1] for e in ends)

    def loss_sup(self) -> float:
        return max(p.loss_sup() for wi, p in zip(self.w, self.parts) if wi > 0)

    def sample_p(self, rng, n: int) -> np.ndarray:
        """n samples of L under P (for Monte Carlo validation; the branches must sample too)."""
        which = rng.choice(len(self.parts), size=n, p=self.w / self.w.sum())
        out = np.empty(n)
        for i, p in enumerate(self.parts):
            k = int(np.sum(which == i))
            if k:
                out[which == i] = p.sample_p(rng, k)
        return out
