"""Exact answers where the composed maths is closed-form (docs/MATH.md section 12).

Three parts of a composition are handled here without any discretisation:

* **Unsampled Gaussian steps** (any sigmas, any counts): the privacy loss of
  ``k_i`` runs of ``N(0, sigma_i^2)`` vs ``N(c, sigma_i^2)`` is Gaussian, so the
  composition is one Gaussian pair with ``mu^2 = c^2 sum_i k_i / sigma_i^2``
  (c = 2 for substitution, 1 otherwise) and

      delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2),

  evaluated in log space (``log_ndtr``) with a floating-point error bound, so
  the answer is an interval ``[lower, upper]`` as narrow as round-off allows.
* **The delta0 of (eps0, delta0)-DP steps**: the dominating pair of
  (eps0, delta0)-DP puts mass delta0 at loss +inf and is otherwise the pair of
  eps0-randomized response.  The +inf masses of all steps combine exactly:
  ``D = 1 - prod_i (1 - delta0_i)^{k_i}`` and the composed curve is
  ``D + (1 - D) delta_rest(eps)`` for the rest of the composition.
* **Randomized response / (eps0, delta0)-DP of one eps0** (``K`` steps): the loss
  is ``(2J - K) eps0`` with ``J ~ Binomial(K, p)``, ``p = e^eps0 / (1 + e^eps0)``;
  its curve is summed exactly over the binomial terms that matter (log-space
  pmf by Loader's saddle-point form, error bounded term by term), and the
  mass left out is bounded by Hoeffding's inequality.  Enumeration is used
  while the window fits ``MAX_TERMS`` terms (K up to about 10^10 at eps0 near 0,
  any K at large eps0); beyond that the steps go to the PLD discretisation.

Every function returns certified bounds (lower <= truth <= upper).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from . import _validate as V
from . import events as E
from .pld.grid import _discounted_tail_sums

__all__ = ["GaussianExact", "BinomialExact", "IdentityExact", "split_exact", "ExactSplit", "MAX_TERMS"]

U = 2.0 ** -53
TINY = 5e-324  # the smallest positive (subnormal) double
#: largest number of binomial terms enumerated for one randomized-response group
MAX_TERMS = 4_000_000
_LOG_TINY = -740.0


def _widen(x, rel, absolute=0.0):
    """(x - err, x + err) with err = rel |x| + absolute (arrays)."""
    err = rel * np.abs(x) + absolute
    return x - err, x + err


# -- Gaussian -----------------------------------------------------------------------
class GaussianExact:
    """The pair N(0, 1) vs N(mu, 1) (the composition of unsampled Gaussian steps).

    ``log_delta_bounds(eps)`` gives certified (lower, upper) bounds on ln delta(eps):
    the central value is computed with ``log_ndtr`` and widened by a bound on the
    propagated round-off: the arguments ``a = -eps/mu +- mu/2`` carry an absolute
    error of at most 4u(|eps|/mu + mu) (u = 2^-53), which ``log Phi`` amplifies by at
    most ``max(1, |a| + 1)`` (its derivative), plus 16u relative in each ``log_ndtr``;
    an absolute error e of ``d = lb - la`` moves ``ln(-expm1(d))`` by at most
    ``e * e^d / (1 - e^d)`` (its derivative; docs/MATH.md section 12).
    """

    def __init__(self, mu: float):
        self.mu = float(mu)
        if not (self.mu > 0 and math.isfinite(self.mu)):
            raise ValueError(f"mu must be positive and finite, got {V.fmt(mu)}")

    def log_delta_bounds(self, eps):
        eps = np.asarray(eps, dtype=float)
        mu = self.mu
        a1 = -eps / mu + mu / 2
        a2 = -eps / mu - mu / 2
        err_a = 4 * U * (np.abs(eps) / mu + mu) + 1e-300
        la = special.log_ndtr(a1)
        lb = special.log_ndtr(a2) + eps
        err_la = err_a * (np.maximum(-a1, 0) + 1.0) + 16 * U * np.abs(la) + 4 * U
        err_lb = err_a * (np.maximum(-a2, 0) + 1.0) + 16 * U * np.abs(lb) + 8 * U * np.abs(eps) + 4 * U
        d = np.minimum(lb - la, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            em = -np.expm1(d)
            amp = np.where(d < 0, np.exp(d) / np.maximum(em, 1e-300), np.inf)
            log_em = np.log(em)
            c = la + log_em
        err = err_la + (err_la + err_lb) * amp + 8 * U * (np.abs(c) + 1)
        lo = np.where(np.isfinite(c), c - err, -np.inf)
        with np.errstate(invalid="ignore"):
            hi = np.where(np.isfinite(err) & np.isfinite(c), c + err, np.minimum(la + err_la, 0.0))
        hi = np.where(np.isnan(hi), 0.0, hi)  # no bound: the trivial ln 1
        return lo, np.minimum(hi, 0.0)

    def delta_bounds(self, eps):
        lo, hi = self.log_delta_bounds(eps)
        with np.errstate(under="ignore"):
            up = np.minimum(np.exp(hi) * (1 + 4 * U), 1.0)
            # delta(eps) > 0 for every finite eps: an upper bound that underflows to 0 is
            # carried up to the smallest positive double (never below the truth)
            up = np.where(up > 0, up, TINY)
            return np.exp(lo) * (1 - 4 * U), up

    def epsilon_bounds(self, deltas):
        """Certified (lower, upper) of eps(delta): the largest eps with
        lower-bound delta >= delta and the smallest with upper-bound delta <= delta
        (delta is strictly decreasing in eps), found by bisection on the bounds."""
        deltas = np.asarray(deltas, dtype=float)
        if deltas.size > 1:  # all deltas at once: the same bisections, vectorised
            lo, hi = self._eps_many(deltas.ravel())
            return lo.reshape(deltas.shape), hi.reshape(deltas.shape)
        lo = np.empty(deltas.shape)
        hi = np.empty(deltas.shape)
        for i, d in np.ndenumerate(deltas):
            lo[i], hi[i] = self._eps_one(float(d))
        return lo, hi

    def _eps_many(self, deltas, lower: bool = True):
        """:meth:`_eps_one` for a 1-d array of deltas, step for step (the same brackets, the same
        midpoints, the same predicates: the same answers), each bisection an array operation;
        ``lower=False``: the upper ends alone (the lower ends are None)."""
        # (the scalar path's math.log / math.log1p, element by element: numpy's may differ in an ulp)
        ld = np.array([math.log(x) for x in deltas.tolist()])
        l1p = np.array([-math.log1p(-x) for x in deltas.tolist()])
        mu = self.mu

        def f_hi(e):
            return self.log_delta_bounds(e)[1] - ld

        def f_lo(e):
            return self.log_delta_bounds(e)[0] - ld

        c = mu * mu / 2
        top = c + mu * np.sqrt(2 * np.maximum(-ld, 0.0) + 2) + 1.0
        bot = c - mu * np.sqrt(2 * np.maximum(l1p, 1e-300) + 2 * np.abs(ld) + 50) - 1.0
        bot = np.minimum(bot, -1.0)
        grow = np.ones(deltas.size, bool)
        for _ in range(64):
            grow &= f_hi(top) > 0
            if not grow.any():
                break
            top = np.where(grow, top + np.abs(top) + 1.0, top)
        grow = np.ones(deltas.size, bool)
        for _ in range(64):
            grow &= f_lo(bot) < 0
            if not grow.any():
                break
            bot = np.where(grow, bot - np.abs(bot) - 1.0, bot)
        bad = ~(np.isfinite(top) & np.isfinite(bot)) | (f_hi(top) > 0)
        if bad.any():
            j = int(np.nonzero(bad)[0][0])
            raise V.PrecisionLimitError(f"delta={deltas[j]:.3g}: the Gaussian profile with mu={mu:.3g} cannot be "
                                        "inverted in floating point (floor: eps up to 1.8e308)")
        e_hi = _bisect_many(lambda e, i: self.log_delta_bounds(e)[1] - ld[i], bot, top, want_le=True)
        if not lower:
            return None, e_hi
        e_lo = _bisect_many(lambda e, i: self.log_delta_bounds(e)[0] - ld[i], bot, top, want_le=False)
        return np.minimum(e_lo, e_hi), e_hi

    def _eps_one(self, delta):
        ld = math.log(delta)
        mu = self.mu

        def f_hi(e):  # upper bound on ln delta(e) minus ln delta
            return float(self.log_delta_bounds(e)[1]) - ld

        def f_lo(e):
            return float(self.log_delta_bounds(e)[0]) - ld

        # bracket: delta(eps) <= exp(-(eps - mu^2/2)^2 / (2 mu^2)) for eps >= mu^2/2
        c = mu * mu / 2
        top = c + mu * math.sqrt(2 * max(-ld, 0.0) + 2) + 1.0
        bot = c - mu * math.sqrt(2 * max(-math.log1p(-delta), 1e-300) + 2 * abs(ld) + 50) - 1.0
        bot = min(bot, -1.0)
        for _ in range(64):
            if not f_hi(top) > 0:
                break
            top = top + abs(top) + 1.0
        for _ in range(64):
            if not f_lo(bot) < 0:
                break
            bot = bot - abs(bot) - 1.0
        if not (math.isfinite(top) and math.isfinite(bot)) or f_hi(top) > 0:
            raise V.PrecisionLimitError(f"delta={delta:.3g}: the Gaussian profile with mu={mu:.3g} cannot be "
                                        "inverted in floating point (floor: eps up to 1.8e308)")
        # upper: smallest e with f_hi(e) <= 0 (f_hi non-increasing up to round-off; the
        # returned point itself satisfies the predicate, which is all the certificate needs)
        e_hi = _bisect(f_hi, bot, top, want_le=True)
        e_lo = _bisect(f_lo, bot, top, want_le=False)
        return min(e_lo, e_hi), e_hi


def _bisect_many(f, a, b, want_le):
    """:func:`_bisect` for arrays of brackets ``[a, b]``: ``f(x, i)`` evaluates the predicate's
    function at the points x of the brackets still open (indices i).  Each bracket takes the
    same steps as :func:`_bisect` would take for it alone."""
    a, b = np.array(a, dtype=float), np.array(b, dtype=float)
    open_ = np.arange(a.size)
    for _ in range(200):
        if open_.size == 0:
            break
        aa, bb = a[open_], b[open_]
        m = 0.5 * (aa + bb)
        stop = (m <= aa) | (m >= bb)
        go = ~stop
        idx, m = open_[go], m[go]
        if idx.size:
            fm = f(m, idx)
            take_b = fm <= 0 if want_le else ~(fm >= 0)
            b[idx] = np.where(take_b, m, b[idx])
            a[idx] = np.where(take_b, a[idx], m)
            narrow = b[idx] - a[idx] <= 2 * U * np.maximum(np.abs(a[idx]), np.abs(b[idx]))
            idx = idx[~narrow]
        open_ = idx
    return b if want_le else a


def _bisect(f, a, b, want_le):
    """want_le: the smallest x in [a, b] found with f(x) <= 0 (b satisfies it);
    otherwise the largest x with f(x) >= 0 (a satisfies it).  Returns a point where the
    predicate was verified."""
    for _ in range(200):
        m = 0.5 * (a + b)
        if m <= a or m >= b:
            break
        fm = f(m)
        if want_le:
            if fm <= 0:
                b = m
            else:
                a = m
        else:
            if fm >= 0:
                a = m
            else:
                b = m
        if b - a <= 2 * U * max(abs(a), abs(b)):
            break
    return b if want_le else a


# -- identity (nothing but +inf masses) -------------------------------------------------
class IdentityExact:
    """The pair P = Q: delta(eps) = (1 - e^eps)_+, eps(delta) = ln(1 - delta) (<= 0)."""

    def delta_bounds(self, eps):
        eps = np.asarray(eps, dtype=float)
        v = np.where(eps < 0, -np.expm1(np.minimum(eps, 0.0)), 0.0)
        return v * (1 - 4 * U), np.minimum(v * (1 + 4 * U), 1.0)

    def epsilon_bounds(self, deltas):
        e = np.log1p(-np.asarray(deltas, dtype=float))
        return e - 4 * U * np.abs(e), np.minimum(e + 4 * U * np.abs(e), 0.0)


# -- randomized response ----------------------------------------------------------------
#: largest eps0 the binomial enumeration takes: e^-eps0 / (1 + e^-eps0) is then a normal
#: double (its logarithm, and Loader's bd0 at K q, keep their relative accuracy)
MAX_RR_EPS0 = 708.0


def _split(a):
    """Veltkamp's split a = hi + lo with hi, lo of at most 26 significant bits (exact)."""
    c = 134217729.0 * a  # 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _outward_product(n, x: float):
    """(lo, hi) doubles with lo <= n x <= hi for exact integers n (|n| < 2^53, array) and a
    double x: the rounded product and, where it is not exact, its neighbour on the other side
    of the exact value.  The sign of the rounding error comes from Dekker's exact product
    (n x = fl(n x) + err exactly while nothing under- or overflows; for |x| < 1e-250 both
    neighbours are taken instead).  docs/MATH.md 12.3."""
    n = np.asarray(n, dtype=float)
    prod = n * x
    if not (1e-250 <= abs(x) <= 1e250):
        return np.nextafter(prod, -np.inf), np.nextafter(prod, np.inf)
    nh, nl = _split(n)
    xh, xl = _split(x)
    err = ((nh * xh - prod) + nh * xl + nl * xh) + nl * xl
    lo = np.where(err < 0, np.nextafter(prod, -np.inf), prod)
    hi = np.where(err > 0, np.nextafter(prod, np.inf), prod)
    return lo, hi


def _sub_down(a, b):
    """A double <= a - b (exact a, b): the rounded difference stepped one ulp down."""
    return np.nextafter(np.subtract(a, b), -np.inf)


def _sub_up(a, b):
    """A double >= a - b (exact a, b)."""
    return np.nextafter(np.subtract(a, b), np.inf)


def _stirlerr(n):
    """ln(n!) - ln(sqrt(2 pi n) (n/e)^n) for n >= 1 (Loader 2000), vectorised."""
    n = np.asarray(n, dtype=float)
    out = np.empty(n.shape)
    small = n <= 15
    if small.any():
        ns = n[small]
        out[small] = special.gammaln(ns + 1) - (ns + 0.5) * np.log(ns) + ns - 0.5 * math.log(2 * math.pi)
    big = ~small
    if big.any():
        nn = n[big] * n[big]
        x = n[big]
        out[big] = (1 / 12 - (1 / 360 - (1 / 1260 - (1 / 1680 - 1 / (1188 * nn)) / nn) / nn) / nn) / x
    return out


def _bd0(x, M):
    """x ln(x / M) + M - x >= 0, accurate also when x is near M (series in v = (x-M)/M)."""
    x = np.asarray(x, dtype=float)
    M = np.asarray(M, dtype=float) + 0 * x
    v = (x - M) / M
    out = np.empty(x.shape)
    s = np.abs(v) < 0.1
    if s.any():
        vs = v[s]
        acc = np.zeros(vs.shape)
        term = vs * vs
        for n in range(2, 40):
            acc += term / (n * (n - 1)) * (1 if n % 2 == 0 else -1)
            term = term * vs
        out[s] = M[s] * acc
    b = ~s
    if b.any():
        xb, Mb = x[b], M[b]
        with np.errstate(divide="ignore", invalid="ignore"):
            out[b] = np.where(xb > 0, xb * np.log(xb / Mb), 0.0) + Mb - xb
    return out


def binom_logpmf(j, K: int, p: float, q: float, log_p: float | None = None, log_q: float | None = None):
    """(ln b_j, bound on its absolute error) for j ~ Binomial(K, p) (q = 1 - p given
    separately for accuracy; the products Kp, Kq to relative 5u, 7u), by Loader's saddle-point form
    ln b = stirlerr(K) - stirlerr(j) - stirlerr(K-j) - bd0(j, Kp) - bd0(K-j, Kq)
           + 0.5 ln(K / (2 pi j (K - j)))   (0 < j < K).
    The error bound: 16u times the sum of the magnitudes, plus 12u |j - Kp| (the
    rounding of Kp (5u) and of Kq (7u) moves bd0 by at most |d bd0/dM| r M = r |j - M|).
    ``log_p`` / ``log_q`` (to relative 6u) serve the end terms K ln q, K ln p (default:
    the logarithms of p, q)."""
    j = np.asarray(j, dtype=float)
    Kf = float(K)
    M1, M2 = Kf * p, Kf * q
    out = np.empty(j.shape)
    err = np.empty(j.shape)
    inner = (j > 0) & (j < Kf)
    if inner.any():
        ji = j[inner]
        s0 = _stirlerr(np.array([Kf]))[0] if Kf >= 1 else 0.0
        sj, sk = _stirlerr(ji), _stirlerr(Kf - ji)
        b1, b2 = _bd0(ji, M1), _bd0(Kf - ji, M2)
        lg = 0.5 * (math.log(Kf) - np.log(2 * math.pi * ji) - np.log(Kf - ji))
        out[inner] = s0 - sj - sk - b1 - b2 + lg
        err[inner] = 16 * U * (abs(s0) + np.abs(sj) + np.abs(sk) + b1 + b2 + np.abs(lg) + 1) \
            + 12 * U * np.abs(ji - M1) + 1e-15
    # end terms K ln q, K ln p: ln q to relative 6u (given) or, from q itself (relative 5u),
    # to absolute 5u + u |ln q|; the product adds u
    for mask, x, lx in ((j == 0, q, log_q), (j == Kf, p, log_p)):
        if lx is None:
            lx = math.log(x) if x > 0 else -math.inf
            e_one = 6 * U * (1 + abs(lx)) if x > 0 else 0.0
        else:
            e_one = 6 * U * abs(lx)
        out[mask] = Kf * lx
        err[mask] = Kf * e_one + 2 * U * abs(Kf * lx) + 4 * U if math.isfinite(lx) else 0.0
    return out, err


class BinomialExact:
    """K steps of eps0-randomized response: loss (2J - K) eps0, J ~ Binomial(K, p).

    delta(eps) = sum_j b_j (1 - e^{eps - l_j})_+  summed over the window
    [j_lo, j_hi] around the mean (beyond it at most ``tail`` of the mass: Hoeffding,
    P(|J - Kp| >= t) <= 2 exp(-2 t^2 / K)); the upper bound adds ``tail``.  Terms whose
    log pmf is below ``_LOG_TINY`` relative to 1 are dropped into the same bound.
    """

    def __init__(self, eps0: float, K: int, log_tail: float = 700.0):
        self.eps0 = float(eps0)
        self.K = int(K)
        e0 = self.eps0
        if not 0 < e0 <= MAX_RR_EPS0:
            from .profiles.base import LossRangeError
            raise LossRangeError(f"eps0={e0!r}: randomized-response and (eps0, delta0)-DP steps are "
                                 f"supported up to eps0 = {MAX_RR_EPS0:g} (beyond, e^-eps0 leaves the "
                                 "normal double range)")
        # p = 1 / (1 + e^-eps0), q = e^-eps0 / (1 + e^-eps0) (no cancellation, no overflow: to
        # relative 4u and 6u; times K: 5u, 7u) and their logarithms (ln p = -log1p(e^-eps0) to
        # relative 4u, ln q = -eps0 + ln p to 5u)
        w = math.exp(-e0)
        self.p = 1.0 / (1.0 + w)
        self.q = w / (1.0 + w)
        self.log_p = -math.log1p(w)
        self.log_q = -e0 + self.log_p
        K = self.K
        mean = K * self.p
        # window half-width t: Hoeffding bound 2 exp(-2 t^2 / K) <= 2 e^-log_tail
        t = math.ceil(math.sqrt(0.5 * K * log_tail)) + 2
        j_lo = max(0, int(math.floor(mean - t)))
        j_hi = min(K, int(math.ceil(mean + t)))
        self.tail = 0.0 if (j_lo == 0 and j_hi == K) else 2 * math.exp(-log_tail)
        j = np.arange(j_lo, j_hi + 1, dtype=float)
        lp, le = binom_logpmf(j, K, self.p, self.q, self.log_p, self.log_q)
        keep = lp + le > _LOG_TINY
        if keep.any():  # (the pmf is unimodal: keep one run, so that j stays consecutive)
            kept = np.flatnonzero(keep)
            keep[kept[0]:kept[-1] + 1] = True
        if not keep.all():
            # dropped terms: fewer than K+1, each below e^_LOG_TINY
            self.tail += (K + 1) * math.exp(_LOG_TINY)
            j, lp, le = j[keep], lp[keep], le[keep]
        self.j = j
        # the losses (2j - K) eps0 rounded outward (2j - K exact, |2j - K| < 2^53): the upper
        # bound takes each atom at loss_hi >= its loss, the lower at loss_lo <= it (MATH 12.3)
        self.loss_lo, self.loss_hi = _outward_product(2 * j - K, e0)
        self.loss = (2 * j - K) * e0  # the rounded losses (an estimate; bounds use lo / hi)
        with np.errstate(under="ignore"):
            self.m_lo = np.exp(lp - le) * (1 - 4 * U)
            self.m_hi = np.exp(lp + le) * (1 + 4 * U)
        self._suffix = {}

    @staticmethod
    def n_terms(eps0: float, K: int, log_tail: float = 700.0) -> int:
        t = math.ceil(math.sqrt(0.5 * K * log_tail)) + 2
        return min(K + 1, 2 * t + 1)

    def _sums(self, m):
        """Suffix sums A_i = sum_{j>=i} m_j, and B_i = sum_{j>=i} m_j e^{l_i - l_j}, via
        discounted blocks (no overflow)."""
        key = id(m)
        if key not in self._suffix:
            A = np.cumsum(m[::-1])[::-1]
            h = 2 * self.eps0
            # B_i = m_i + e^{-h} B_{i+1}: blocks as in GridMeasure
            B = _discounted_tail_sums(m, h)
            self._suffix[key] = (A, B)
        return self._suffix[key]

    def _delta_with(self, m, eps, upper):
        """sum_{j >= i} m_j (1 - e^{eps - l_j}) with i the first atom whose loss, rounded
        outward on the bound's side (loss_hi for the upper bound, loss_lo for the lower), is
        above eps, and l_j = l'_i + 2 eps0 (j - i) (l'_i that rounded loss): every term is
        >= (upper) or <= (lower, and >= 0) the atom's exact term (1 - e^{eps - l_j})_+."""
        A, B = self._sums(m)
        n = m.size
        loss = self.loss_hi if upper else self.loss_lo
        i = np.searchsorted(loss, eps, side="right")  # first loss > eps
        ii = np.minimum(i, n - 1)
        with np.errstate(over="ignore", invalid="ignore"):
            val = A[ii] - np.exp(eps - loss[ii]) * B[ii]
        val = np.where(i >= n, 0.0, val)
        # rounding: sums of non-negative terms (relative n u), the exponent (u (|eps| + |l|))
        nerr = 2 * (math.log2(n + 1) + 4) * U
        if upper:
            val = val * (1 + nerr) + np.where(i < n, 4 * U * (np.abs(eps) + np.abs(loss[ii]) + 1) * A[ii], 0)
            return np.minimum(val + self.tail, 1.0)
        val = val * (1 - nerr) - np.where(i < n, 4 * U * (np.abs(eps) + np.abs(loss[ii]) + 1) * A[ii], 0)
        return np.maximum(val, 0.0)

    def delta_bounds(self, eps):
        eps = np.asarray(eps, dtype=float)
        lo = self._delta_with(self.m_lo, eps, False)
        hi = self._delta_with(self.m_hi, eps, True)
        # for eps < -K eps0 the truth is 1 - e^eps (every loss is above eps)
        rlo, rhi = self._boundary_refined(eps)
        return np.maximum(lo, rlo), np.minimum(hi, rhi)

    def _boundary_refined(self, eps):
        """Bounds that treat the boundary atom (the first whose outward-rounded loss exceeds
        eps) in double-double: its loss l_i = n eps0 = prod + err exactly (Dekker), so
        d = l_i - eps = s + e2 + err with (s, e2) Knuth's exact two-sum of prod and -eps; its
        term m_i (1 - e^{-d})_+ is bounded through d +- r (r covers the two roundings of
        summing the three doubles; a further 1e-320 absolute covers products below the
        normal range).  The atoms after it (losses above eps by at least one
        step 2 eps0 minus an ulp, checked) use the suffix-sum formula.  Where the refinement
        does not apply, the trivial bounds (0, 1) are returned (the caller keeps the better)."""
        n = self.j.size
        shape = eps.shape
        e = eps.ravel()
        lo = np.zeros(e.shape)
        hi = np.ones(e.shape)
        if not (1e-250 <= self.eps0 <= 1e250) or n == 0:
            return lo.reshape(shape), hi.reshape(shape)
        i = np.searchsorted(self.loss_hi, e, side="right")
        for idx in range(e.size):
            ii, x = int(i[idx]), float(e[idx])
            if ii >= n or not math.isfinite(x):
                continue
            if ii + 1 < n and not self.loss_lo[ii + 1] > x:
                continue
            c = float(2 * self.j[ii] - self.K)
            prod = c * self.eps0
            ch, cl = _split(c)
            xh, xl = _split(self.eps0)
            err = ((ch * xh - prod) + ch * xl + cl * xh) + cl * xl  # exact: c eps0 = prod + err
            s = prod - x
            bp = s + x
            e2 = (prod - bp) + (-x - (s - bp))  # exact: prod - x = s + e2
            t = e2 + err
            d = s + t
            r = 4 * U * (abs(d) + abs(e2) + abs(err)) + 1e-300
            d_lo, d_hi = d - r, d + r
            f_hi = -math.expm1(-d_hi) * (1 + 4 * U) if d_hi > 0 else 0.0
            f_lo = max(-math.expm1(-d_lo) * (1 - 4 * U), 0.0) if d_lo > 0 else 0.0
            up_i = self.m_hi[ii] * f_hi * (1 + 2 * U)
            lo_i = self.m_lo[ii] * f_lo * (1 - 2 * U)
            if ii + 1 < n:
                rest_hi = float(self._rest(self.m_hi, ii + 1, x, True))
                rest_lo = float(self._rest(self.m_lo, ii + 1, x, False))
            else:
                rest_hi = rest_lo = 0.0
            # (1e-320: the absolute rounding of the few products that may fall below the
            # normal range)
            hi[idx] = min((up_i + rest_hi) * (1 + 2 * U) + 1e-320 + self.tail, 1.0)
            lo[idx] = max((lo_i + rest_lo) * (1 - 2 * U) - 1e-320, 0.0)
        return lo.reshape(shape), hi.reshape(shape)

    def _rest(self, m, i, eps, upper):
        """sum_{j >= i} m_j (1 - e^{eps - l_j}) bounded as in :meth:`_delta_with`, from atom i
        (whose outward-rounded losses on both sides are above eps)."""
        A, B = self._sums(m)
        loss = self.loss_hi if upper else self.loss_lo
        val = A[i] - math.exp(eps - loss[i]) * B[i]
        nerr = 2 * (math.log2(m.size + 1) + 4) * U
        pad = 4 * U * (abs(eps) + abs(loss[i]) + 1) * A[i]
        return val * (1 + nerr) + pad if upper else max(val * (1 - nerr) - pad, 0.0)

    def epsilon_bounds(self, deltas):
        deltas = np.asarray(deltas, dtype=float)
        lo = np.empty(deltas.shape)
        hi = np.empty(deltas.shape)
        for idx, d in np.ndenumerate(deltas):
            lo[idx] = self._eps_one(float(d), upper=False)
            hi[idx] = self._eps_one(float(d), upper=True)
        return np.minimum(lo, hi), hi

    def _eps_one(self, d, upper):
        """upper: smallest eps with delta_hi(eps) <= d; else largest eps with delta_lo(eps) >= d."""
        f = (lambda e: float(self._delta_with(self.m_hi, np.array([e]), True)[0]) - d) if upper else \
            (lambda e: float(self._delta_with(self.m_lo, np.array([e]), False)[0]) - d)
        top = float(self.loss_hi[-1]) + 1.0
        if upper and f(top) > 0:
            return math.inf  # the bound never drops to d (tail term)
        bot = float(self.loss_lo[0]) - 1.0
        while f(bot) < 0:
            if bot < -1e300:
                return -math.inf
            bot = bot * 2 - 1.0
        if not upper and f(top) >= 0:
            return top
        return _bisect(f, bot, top, want_le=upper)


# -- splitting a composition ---------------------------------------------------------------
@dataclass
class ExactSplit:
    """A composition split into exact parts and the rest (docs/MATH.md section 12).

    ``gauss_inv_var``: sum k / sigma^2 over unsampled Gaussian steps (0: none; the
    relation's factor c is applied by the caller: mu = c sqrt(gauss_inv_var));
    ``log_keep``: sum k ln(1 - delta0) over (eps0, delta0)-DP steps (the +inf mass is
    D = 1 - e^log_keep); ``rr``: {eps0: count} of randomized-response pairs (from RR
    events and from (eps0 > 0, delta0) steps); ``rest``: the other (event, count) pairs.
    """

    gauss_inv_var: float = 0.0
    gauss_terms: int = 0
    gauss_steps: list = field(default_factory=list)
    log_keep: float = 0.0
    keep_terms: int = 0
    rr: dict = field(default_factory=dict)
    rest: list = field(default_factory=list)

    def pinf_bounds(self):
        """Certified (lower, upper) of D = 1 - prod (1 - delta0)^k."""
        if self.keep_terms == 0:
            return 0.0, 0.0
        D = -math.expm1(self.log_keep)
        rel = (4 * self.keep_terms + 8) * U
        err = rel * abs(self.log_keep) * max(1.0, 1 - D) + 4 * U * D
        return max(D - err, 0.0), min(D + err, 1.0)


def split_exact(components, relation: str) -> ExactSplit:
    """Split ``components`` ([(step_event, count)]) into the parts of :class:`ExactSplit`."""
    out = ExactSplit()
    for ev, k in components:
        if isinstance(ev, E.GaussianEvent):
            s2 = ev.sigma * ev.sigma  # (inf or 0 beyond floating point: combined_sigma then rescales)
            out.gauss_inv_var += k / s2 if s2 > 0 else math.inf
            out.gauss_terms += 1
            out.gauss_steps.append((ev.sigma, k))
        elif isinstance(ev, E.ApproxDPEvent):
            if ev.delta0 > 0:
                out.log_keep += k * math.log1p(-ev.delta0)
                out.keep_terms += 1
            if ev.eps0 > 0:
                out.rr[ev.eps0] = out.rr.get(ev.eps0, 0) + k
        elif isinstance(ev, E.RandomizedResponseEvent):
            out.rr[ev.eps0] = out.rr.get(ev.eps0, 0) + k
        else:
            out.rest.append((ev, k))
    return out


def combined_sigma(split: ExactSplit) -> float:
    """sigma of the one Gaussian step equal to all unsampled Gaussian steps:
    1 / sqrt(sum k / sigma^2) (a single step with count 1 is kept as given, so that
    composing by hand and composing the list give the same float)."""
    if len(split.gauss_steps) == 1 and split.gauss_steps[0][1] == 1:
        return float(split.gauss_steps[0][0])
    v = split.gauss_inv_var
    if 0.0 < v < math.inf and all(1e-150 < s < 1e150 for s, _ in split.gauss_steps):
        return 1.0 / math.sqrt(v)
    # sigma^2 beyond floating point (sigma ~ 1e300 or 1e-300): m / sqrt(sum k (m / sigma)^2),
    # m the smallest sigma (every ratio <= 1; the same rounding bound)
    m = min(float(s) for s, _ in split.gauss_steps)
    return m / math.sqrt(math.fsum(k * (m / s) ** 2 for s, k in split.gauss_steps))


def gaussian_exact(sigma: float, c: float, terms: int) -> "GaussianPair":
    """The combined Gaussian pair, mu = c / sigma, with its rounding folded into the
    bounds: the sum of ``terms`` positive terms, the square root and the divisions carry
    a relative error below (terms + 8) u; the margin used is the same for every list of
    up to 56 terms, (max(terms, 56) + 8) 2u, so hand-combined and listed steps agree."""
    return GaussianPair(c / sigma, (max(terms, 56) + 8) * 2 * U)


class GaussianPair:
    """The Gaussian pair with mu known to relative accuracy ``rel``: delta(eps) is
    increasing in mu, so the bounds are those of mu(1 - rel) (lower) and mu(1 + rel)
    (upper)."""

    def __init__(self, mu: float, rel: float):
        self.mu = mu
        self.lo = GaussianExact(mu * (1 - rel))
        self.hi = GaussianExact(mu * (1 + rel))

    def delta_bounds(self, eps):
        return self.lo.delta_bounds(eps)[0], self.hi.delta_bounds(eps)[1]

    def epsilon_bounds(self, deltas):
        deltas = np.asarray(deltas, dtype=float)
        if deltas.size > 1:  # (each pair's one needed end: the upper end costs the lower nothing)
            up = self.hi._eps_many(deltas.ravel(), lower=False)[1].reshape(deltas.shape)
            return self.lo._eps_many(deltas.ravel())[0].reshape(deltas.shape), up
        return self.lo.epsilon_bounds(deltas)[0], self.hi.epsilon_bounds(deltas)[1]


class PinfWrapped:
    """``D + (1 - D) curve(eps)`` for a +inf mass D in [D_lo, D_hi] and a base pair with
    certified ``delta_bounds`` / ``epsilon_bounds``, or a callable pair of those."""

    def __init__(self, D_bounds, delta_fn, eps_fn):
        self.D_lo, self.D_hi = D_bounds
        self._delta, self._eps = delta_fn, eps_fn

    def delta_bounds(self, eps):
        lo, hi = self._delta(eps)
        lo = self.D_lo + (1 - self.D_lo) * lo
        hi = self.D_hi + (1 - self.D_hi) * hi
        return np.maximum(lo * (1 - 4 * U), 0.0), np.minimum(hi * (1 + 4 * U), 1.0)

    @staticmethod
    def _t_big(deltas, D_lo):
        """Upper bound on t(delta, D) = (delta - D) / (1 - D) over D >= D_lo (rounded up)."""
        return (deltas - D_lo) / (1 - D_lo) * (1 + 4 * U) + 4 * U * D_lo

    @classmethod
    def certainly_infinite(cls, deltas, D_lo) -> bool:
        """Whether eps(delta) = +inf is certified for every delta given: each lies below the
        +inf mass D >= D_lo (no base pair is needed: both ends of ``epsilon_bounds`` are +inf)."""
        return D_lo > 0 and bool(np.all(cls._t_big(np.asarray(deltas, dtype=float), D_lo) <= 0))

    def epsilon_bounds(self, deltas):
        deltas = np.asarray(deltas, dtype=float)
        if self.D_hi == 0.0:
            return self._eps(deltas)
        # t(delta, D) = (delta - D) / (1 - D) is decreasing in D; eps is decreasing in t
        t_small = (deltas - self.D_hi) / (1 - self.D_hi) * (1 - 4 * U) - 4 * U * self.D_hi
        t_big = self._t_big(deltas, self.D_lo)
        up = np.full(deltas.shape, np.inf)
        lo = np.full(deltas.shape, np.inf)
        ok_u = t_small > 0
        ok_l = t_big > 0
        if ok_u.any():
            up[ok_u] = self._eps(np.minimum(t_small[ok_u], 1.0))[1]
        if ok_l.any():
            lo[ok_l] = self._eps(np.minimum(t_big[ok_l], np.nextafter(1.0, 0)))[0]
        return np.minimum(lo, up), up


def whole_exact(components, relation: str):
    """The certified closed form of a whole composition ``components`` ([(step_event, count)]) under
    ``relation``, or None when some part has none (docs/MATH.md section 12): unsampled Gaussians
    (one pair, mu = c sqrt(sum k / sigma^2), c = 2 under substitution), randomized response
    (binomial sums), one of each, and (eps0, delta0) steps (their +inf mass D).  The object has
    certified ``delta_bounds(eps)`` and ``epsilon_bounds(deltas)`` (both ends).  Every method
    reads a composition that has one off it."""
    sp = split_exact(components, relation)
    if sp.rest:
        return None
    c = 2.0 if relation == "substitution" else 1.0
    gauss = gaussian_exact(combined_sigma(sp), c, sp.gauss_terms) if sp.gauss_terms else None
    if not sp.rr:
        base = gauss if gauss is not None else IdentityExact()
    elif gauss is None and len(sp.rr) == 1:
        (eps0, K), = sp.rr.items()
        base = BinomialExact(eps0, K) if BinomialExact.n_terms(eps0, K) <= MAX_TERMS else None
    elif len(sp.rr) == 1 and GaussRRExact.fits(*next(iter(sp.rr.items()))):
        (eps0, K), = sp.rr.items()
        base = GaussRRExact(gauss, eps0, K)
    else:
        base = None
    return None if base is None else PinfWrapped(sp.pinf_bounds(), base.delta_bounds, base.epsilon_bounds)


class GaussRRExact:
    """An unsampled Gaussian pair (mu) composed with K steps of eps0-randomized response:
    the loss is L_G + (2J - K) eps0, so delta(eps) = sum_j b_j delta_G(eps - l_j)
    exactly (docs/MATH.md section 12).  Bounds: the binomial window of
    :class:`BinomialExact` (masses bounded term by term, left-out mass <= its ``tail``,
    added to the upper bound since delta_G <= 1) times the Gaussian bounds."""

    def __init__(self, gauss: "GaussianPair", eps0: float, K: int):
        self.g = gauss
        # left-out binomial mass <= 2 e^-120 (1e-52): negligible against any delta >= 1e-40
        self.b = BinomialExact(eps0, K, log_tail=GAUSS_RR_LOG_TAIL)

    def delta_bounds(self, eps):
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        lo = np.empty(eps.shape)
        hi = np.empty(eps.shape)
        n = self.b.loss.size
        for idx, e in np.ndenumerate(eps):
            # delta_G is decreasing: its argument eps - l_j rounded up for the lower bound
            # (from l_j >= loss_lo) and down for the upper (from l_j <= loss_hi)
            gl = self.g.delta_bounds(_sub_up(e, self.b.loss_lo))[0]
            gh = self.g.delta_bounds(_sub_down(e, self.b.loss_hi))[1]
            s_lo = float(np.sum(self.b.m_lo * gl))
            s_hi = float(np.sum(self.b.m_hi * gh))
            nerr = (n + 4) * U
            lo[idx] = max(s_lo * (1 - nerr), 0.0)
            hi[idx] = min(s_hi * (1 + nerr) + self.b.tail, 1.0)
        return lo, hi

    def epsilon_bounds(self, deltas):
        deltas = np.asarray(deltas, dtype=float)
        lo = np.empty(deltas.shape)
        hi = np.empty(deltas.shape)
        mu = self.g.mu
        for idx, d in np.ndenumerate(deltas):
            d = float(d)
            fu = lambda e: float(self.delta_bounds(e)[1][0]) - d  # noqa: E731
            fl = lambda e: float(self.delta_bounds(e)[0][0]) - d  # noqa: E731
            top = float(self.b.loss_hi[-1]) + mu * mu / 2 + 40 * mu + 40
            bot = float(self.b.loss_lo[0]) - mu * mu / 2 - 40 * mu - 40
            for _ in range(64):
                if not fu(top) > 0:
                    break
                top += abs(top) + 1
            for _ in range(64):
                if not fl(bot) < 0:
                    break
                bot -= abs(bot) + 1
            if fu(top) > 0:
                hi[idx] = math.inf
                lo[idx] = _bisect(fl, bot, top, want_le=False) if fl(top) < 0 else top
                continue
            hi[idx] = _bisect(fu, bot, top, want_le=True)
            lo[idx] = _bisect(fl, bot, top, want_le=False)
        return np.minimum(lo, hi), hi

    @staticmethod
    def fits(eps0, K) -> bool:
        return BinomialExact.n_terms(eps0, K, GAUSS_RR_LOG_TAIL) <= 60_000


GAUSS_RR_LOG_TAIL = 120.0
