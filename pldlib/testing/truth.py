"""High-precision "truth" for tests and benchmarks (docs/MATH.md sections 6 and 8).

This module is **slow and high precision**.  It is an independent reference
against which the fast accountants (PLD, PRV, SPA) are measured; it is never
used by them.  One value costs from ~0.01 s (plain Gaussian) to a few seconds
(subsampled, see the timings in the docstrings) of pure-Python ``mpmath``
arithmetic; it aims at a relative error of ``10**-dps`` (default 1e-30) and
raises :class:`ContourError` rather than return a value it cannot vouch for.

What it computes
----------------
For the k-fold composition of one single-step pair (P, Q) with privacy loss
L = ln dP/dQ and complex cumulant generating function
``K(z) = ln E_P[e^{z L}] = ln E_Q[(dP/dQ)^{1+z}]``, the hockey-stick curve is
(docs/MATH.md section 6)::

    delta(eps) = R(t) + (1 / 2 pi i) Integral_{t - i inf}^{t + i inf}
                        exp(k K(z) - z eps) / (z (z + 1)) dz

with ``R(t) = 0`` for ``t > 0``.  The line may also be placed at ``t < -1``,
left of both poles of the kernel; then ``R(t) = 1 - e^eps``, because there
1/(z(z+1)) is the two-sided Laplace transform of ``(e^{-u} - 1) 1{u < 0}`` and
``E_P[e^{-L}] = 1`` for mutually absolutely continuous pairs.

Numerics
--------
* **Single-step CGF.**  For the plain Gaussian (q = 1), ``K(z) = z (z + 1) /
  (2 sigma^2)`` in closed form.  For the Poisson-subsampled Gaussian (docs/MATH.md
  section 2, sensitivity 1, noise std sigma) with x = sigma u, u ~ N(0, 1) and
  ``l(u) = ln(1 - q + q exp(u / sigma - 1 / (2 sigma^2)))`` (real, increasing):

  - remove: ``M(z) = E_Q[(dP/dQ)^{1+z}] = E_u[exp((1 + z) l(u))]``,
  - add:    ``M(z) = E_P[(dP/dQ)^z]     = E_u[exp(-z l(u))]``.

  ``M(t + i y)`` is a composite Gauss-Legendre sum over u on the region where
  the integrand's modulus is within ``~e^-(wp ln 10 + 30)`` of its maximum.
  Panels are narrow enough for the Gaussian and for the complex singularities
  of ``l`` (at distance ``pi sigma`` from the real axis), and carry 48, 96 or
  192 nodes according to the phase ``y l(u)`` across them.  Along the
  equispaced y of the trapezoidal rule the phases ``exp(i y l_j)`` are advanced
  by exact integer fixed-point complex multiplication (40 guard bits).  The
  value at the largest y used is spot-checked against an independent denser
  rule evaluated with mpmath cos/sin.  ``k K = k ln M`` uses the principal
  logarithm: for integer k, ``exp(k ln M) = M^k`` exactly.

* **Contour integral.**  With ``z = t + i y`` and the conjugate symmetry of the
  integrand ``F``, ``delta = R + (1/pi) Integral_0^inf Re F(t + i y) dy``,
  evaluated as a trapezoidal sum with step ``Delta = 2 pi / T``.  By Poisson
  summation the sum equals ``delta`` plus the aliases
  ``sum_{n != 0} e^{-t n T} D_t(n T) >= 0``, where ``D_t(w)`` is the kernel
  expectation at ``eps - w``.  One side has a trivial bound (``t > 0``:
  ``D <= 1``); both sides have Chernoff bounds
  ``G(t2) exp(k K(t2) - t2 eps) e^{(t2 - t) n T}``
  (``G(t2) = sup_u g_t(u) e^{-t2 u}``).  When these give a reasonable T they
  are used (info ``alias="chernoff bound"``).  Otherwise T comes from a
  saddle-point estimate of the aliases, and the result is accepted only if the
  sum with step ``2 Delta`` (a sub-sum) agrees to the tolerance
  (``alias="halving check"``; this bounds the aliases when ``h(w)`` is monotone
  on each half-line).  The sum is truncated once the terms, times a 1/y^2 tail
  allowance, are negligible.  Working precision covers the digits lost to
  cancellation and to the k-th power; it is checked a posteriori.

* **Choice of the line t.**  Candidates are variations of the two saddle points
  of ``phi(t) = k K(t) - t eps - ln|t| - ln|1+t|`` (``t > 0`` and ``t < -1``,
  found in double precision).  They are ranked by predicted cost from
  double-precision estimates of the aliasing period and of how far in y
  ``|M(t + i y)|^k`` stays significant.  For large k the integrand is a narrow
  bump.  For small k and q < 1 the loss has a non-smooth concentration near its
  finite endpoint (``ln(1 - q)`` for remove, ``-ln(1 - q)`` for add), whose
  transform decays slowly in y.  Only lines that tilt that part away work
  (large t for remove, ``t < -1`` for add).  They cost many digits, so small
  k with small sigma can be out of reach: a work budget then raises
  :class:`ContourError`.  The answer does not depend on t (tested).

Public API
----------
:func:`delta_gaussian`, :func:`epsilon_gaussian`, :class:`ContourError`.
"""
from __future__ import annotations

import functools
import math
import numbers

import mpmath
import numpy as np

__all__ = ["delta_gaussian", "epsilon_gaussian", "ContourError"]

_DIRECTIONS = ("remove", "add", "add_remove")
_LN10 = math.log(10.0)
_SQRT_2PI_LN = 0.5 * math.log(2.0 * math.pi)


_GL_CACHE: dict = {}


def _gauss_legendre(degree: int):
    """Gauss-Legendre nodes and weights on [-1, 1], n = 3 * 2^(degree-1), at the current precision.

    Same rule as mpmath's ``GaussLegendre.calc_nodes`` (tested to agree), but
    Newton's iteration for the roots of P_n starts from numpy's double-precision
    nodes and evaluates the three-term recurrence in integer fixed point, so it
    is many times faster.
    """
    prec = mpmath.mp.prec
    key = (degree, prec)
    if key in _GL_CACHE:
        return _GL_CACHE[key]
    n = 3 * 2 ** (degree - 1)
    x0, _ = np.polynomial.legendre.leggauss(n)
    B = prec + 40
    one = 1 << B

    def legendre(R):
        # (P_n(r), P_{n-1}(r)) in fixed point, r = R / 2^B
        p1, p0 = one, 0
        for j1 in range(1, n + 1):
            p0, p1 = p1, (((2 * j1 - 1) * R * p1 >> B) - (j1 - 1) * p0) // j1
        return p1, p0

    nodes = []
    with mpmath.workprec(B):
        tol = mpmath.ldexp(1, -prec - 10)
        for xf in x0[n // 2:]:  # the positive roots
            r = mpmath.mpf(float(xf))
            for _ in range(12):
                p1, p0 = legendre(int(mpmath.ldexp(r, B)))
                p1 = mpmath.ldexp(p1, -B)
                p0 = mpmath.ldexp(p0, -B)
                dp = n * (r * p1 - p0) / (r**2 - 1)
                step = p1 / dp
                r -= step
                if abs(step) < tol:
                    break
            else:
                raise ContourError("Gauss-Legendre Newton iteration did not converge")
            w = 2 / ((1 - r**2) * dp**2)
            nodes.append((r, w))
            nodes.append((-r, w))
    with mpmath.workprec(prec):
        out = [(+x, +w) for x, w in nodes]
    _GL_CACHE[key] = out
    return out


class ContourError(RuntimeError):
    """The quadrature could not reach or verify its accuracy target (raised instead of a doubtful value)."""


class _TooSmall(ContourError):
    """delta is astronomically small (no saddle point within reach)."""


class _SlowDecay(Exception):
    """Internal: the integrand on this line decays too slowly; try another t."""


# ---------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------
def _check_common(sigma, steps, q, direction, dps):
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not (0 < float(sigma) < math.inf):
        raise ValueError(f"sigma must be a finite real > 0, got {sigma!r}")
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or int(steps) < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not (0 < float(q) <= 1):
        raise ValueError(f"q must be in (0, 1], got {q!r}")
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")
    if isinstance(dps, bool) or not isinstance(dps, numbers.Integral) or not (15 <= int(dps) <= 200):
        raise ValueError(f"dps must be an integer in [15, 200], got {dps!r}")


# ---------------------------------------------------------------------------
# one step: Poisson-subsampled Gaussian, one direction (q = 1: plain Gaussian)
# ---------------------------------------------------------------------------
class _Step:
    """Single-step pair of the Poisson-subsampled Gaussian in one direction.

    M(z) = E_u[exp((c0 + c1 z) l(u))], u ~ N(0, 1), with (c0, c1) = (1, 1) for
    remove and (0, -1) for add; K = ln M.  For q = 1 both directions are the
    pair (N(0, s^2), N(1, s^2)) and K(z) = z (z + 1) / (2 sigma^2).
    """

    def __init__(self, sigma: float, q: float, direction: str):
        self.sigma = float(sigma)
        self.q = float(q)
        self.direction = direction
        self.gaussian = self.q == 1.0
        self.c0, self.c1 = (1, 1) if direction == "remove" else (0, -1)
        # range of the single-step loss
        if self.gaussian:
            self.loss_inf, self.loss_sup = -math.inf, math.inf
        elif direction == "remove":
            self.loss_inf, self.loss_sup = math.log1p(-self.q), math.inf
        else:
            self.loss_inf, self.loss_sup = -math.inf, -math.log1p(-self.q)
        self._rules: dict = {}
        self._logm: dict = {}       # (t, y) -> (wp, ln M(t + i y))
        self._prog: dict = {}       # progression states of the phase recurrence
        self._windows: dict = {}
        self._checks: dict = {}

    # -- double precision: real CGF K, K', K'' ------------------------------
    def _ell_np(self, u):
        a = u / self.sigma - 0.5 / self.sigma**2
        q = self.q
        with np.errstate(over="ignore"):
            return np.where(a > 0, a + np.log(q + (1 - q) * np.exp(-np.maximum(a, 0))),
                            np.log1p(q * np.expm1(np.minimum(a, 0))))

    def _exponent_np(self, u, t):
        c = self.c0 + self.c1 * t
        return -0.5 * u * u - _SQRT_2PI_LN + c * self._ell_np(u)

    def _float_window(self, t, nats):
        """u-range covering where the integrand of M(t) is within e^-nats of its maximum (float)."""
        key = (t, nats)
        hit = self._windows.get(key)
        if hit is not None:
            return hit
        if not abs(t) <= 20000.0:
            raise ValueError(f"line t = {t!r} is too far out")
        c = self.c0 + self.c1 * t
        centre = c / self.sigma
        half = math.sqrt(2.0 * nats) + 8.0
        lo = min(0.0, centre) - half
        hi = max(0.0, centre) + half
        grid = np.arange(lo, hi + 0.05, 0.05)
        g = self._exponent_np(grid, t)
        keep = grid[g >= g.max() - nats]
        out = (float(keep[0]) - 0.5, float(keep[-1]) + 0.5)
        if len(self._windows) > 4096:
            self._windows.clear()
        self._windows[key] = out
        return out

    @functools.lru_cache(maxsize=4096)
    def cgf_real(self, t: float):
        """(K(t), K'(t), K''(t)) in double precision for real t (not 0 or -1 needed: any real t)."""
        if self.gaussian:
            s2 = self.sigma**2
            return t * (t + 1) / (2 * s2), (2 * t + 1) / (2 * s2), 1.0 / s2
        lo, hi = self._float_window(t, 60.0)
        # trapezoid in u: spectrally accurate (analytic integrand, poles at distance pi sigma)
        du = min(0.05, 0.15 * self.sigma)
        n = int(math.ceil((hi - lo) / du)) + 1
        u = np.linspace(lo, hi, n)
        du = u[1] - u[0]
        g = self._exponent_np(u, t)
        gm = g.max()
        w = np.exp(g - gm)
        s0 = w.sum()
        ell = self._ell_np(u)
        m1 = (w * ell).sum() / s0
        m2 = (w * (ell - m1) ** 2).sum() / s0
        K = gm + math.log(s0 * du)
        return K, self.c1 * m1, m2

    def log_abs_ratio_float(self, t: float, ys, stop=None):
        """ln |M(t + i y) / M(t)| in double precision for an increasing array of y.

        For predicting how far the contour integrand extends; values below the
        rounding floor (~1e-12) are returned as ln(1e-12).  ``stop(i, value)``
        may end the scan early (the result is then shorter).
        """
        ys = np.asarray(ys, dtype=float)
        if self.gaussian:
            s2 = self.sigma**2
            return -ys**2 / (2 * s2)
        lo, hi = self._float_window(t, 40.0)
        out = np.empty_like(ys)
        i = 0
        while i < len(ys):
            # one u-grid per factor-2 block of y, resolving the phase y l(u) (l' <= 1/sigma)
            yb = ys[i]
            jj = i
            while jj < len(ys) and ys[jj] <= 2 * max(yb, 1.0):
                jj += 1
            ymax = ys[jj - 1]
            du = min(0.05, 0.15 * self.sigma, 0.5 * self.sigma / max(ymax, 1e-9))
            u = np.arange(lo, hi, du)
            g = self._exponent_np(u, t)
            w = np.exp(g - g.max())
            ell = self._ell_np(u)
            s0 = w.sum()
            for k_ in range(i, jj):
                r = abs(np.dot(w, np.exp(1j * self.c1 * ys[k_] * ell))) / s0
                out[k_] = math.log(max(r, 1e-12))
                if stop is not None and stop(k_, out[k_]):
                    return out[:k_ + 1]
            i = jj
        return out

    def window_stats(self, t: float, wp: int):
        """(width of the u-window, range of l over it) for node-count predictions."""
        if self.gaussian:
            return 0.0, 0.0
        lo, hi = self._float_window(t, wp * _LN10 + 30.0)
        ell = self._ell_np(np.array([lo, hi]))
        return hi - lo, float(ell[1] - ell[0])

    # -- high precision: ln M(t + i y) ----------------------------------------
    def _ell_mp(self, u):
        a = u / self._mp_sigma - self._mp_off
        q = self._mp_q
        # only absolute accuracy of l matters (it enters as exp((c + i y) l))
        if a > 0:
            return a + mpmath.log(q + (1 - q) * mpmath.exp(-a))
        return mpmath.log(1 + q * (mpmath.exp(a) - 1))

    @staticmethod
    def _gl(degree):
        return _gauss_legendre(degree)

    def _rule(self, t: float, ycap: float, wp: int, fine: bool = False):
        """Composite Gauss-Legendre rule for M(t + i y), |y| <= ycap: list of (a_j, l_j).

        M(t + i y) = sum_j a_j exp(i c1 y l_j), a_j = w_j phi(u_j) exp((c0 + c1 t) l_j).
        Panels are at most 2 wide and 0.9 pi sigma wide (l has complex
        singularities at distance pi sigma from the real axis); each panel gets
        48, 96 or 192 Gauss-Legendre nodes according to the phase ycap * l'
        across it, so that the Chebyshev/Bessel truncation bound
        (theta/4)^(2n) / (2n)! of exp(i theta x / 2) stays below 10^-(wp+10)
        with a 0.7 safety factor.  ``fine=True`` builds an independent, denser
        rule (half the phase per panel, 0.6 times the width) for spot checks.
        """
        key = (t, ycap, wp, fine)
        if key in self._rules:
            return self._rules[key]
        self._mp_sigma = mpmath.mpf(self.sigma)
        self._mp_q = mpmath.mpf(self.q)
        self._mp_off = 1 / (2 * self._mp_sigma**2)
        nats = wp * _LN10 + 30.0
        lo, hi = self._float_window(t, nats)
        # keep only the cells where the modulus matters (there may be two bumps)
        grid = np.arange(lo, hi + 0.05, 0.05)
        g = self._exponent_np(grid, t)
        keep = g >= g.max() - nats
        runs = []
        start = None
        for i, kflag in enumerate(keep):
            if kflag and start is None:
                start = i
            if (not kflag or i == len(keep) - 1) and start is not None:
                runs.append([grid[start] - 0.5, grid[i] + 0.5])
                start = None
        merged = []
        for r in runs:
            if merged and r[0] <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], r[1])
            else:
                merged.append(r)
        hmax = min(2.0, 0.9 * math.pi * self.sigma) * (0.6 if fine else 1.0)
        # largest phase per panel for 48 / 96 / 192 nodes
        thetas = []
        for degree in (5, 6, 7):
            n2 = 2 * 3 * 2 ** (degree - 1)
            lf = math.lgamma(n2 + 1) / _LN10
            th = 0.7 * 4.0 * 10 ** ((lf - wp - 10) / n2)
            thetas.append((degree, th * (0.5 if fine else 1.0)))
        sig, q = self.sigma, self.q
        d_static = min(math.pi * sig, 3.0)

        def static_ok(degree, h):
            # Bernstein-ellipse bound rho^(-2n) for the non-oscillating factors: the
            # singularities of l at distance pi sigma; the Gaussian's growth off the
            # real axis is kept moderate by capping the distance at 3
            r = d_static / (h / 2)
            rho = r + math.sqrt(1 + r * r)
            return 2 * 3 * 2 ** (degree - 1) * math.log(rho) >= (wp + 10) * _LN10

        def dell(u):  # l'(u), increasing in u
            a = u / sig - 0.5 / sig**2
            if a > 0:
                return (1.0 / sig) * q / (q + (1 - q) * math.exp(-a))
            e = math.exp(a)
            return (1.0 / sig) * q * e / (1 - q + q * e)

        c = self.c0 + self.c1 * mpmath.mpf(t)
        out = []
        for a0, b0 in merged:
            u0 = a0
            while u0 < b0:
                phase = ycap * dell(u0 + hmax)  # radians per unit of u (upper bound on the panel)
                h = hmax
                for degree, th in thetas:
                    if phase * hmax <= th and static_ok(degree, hmax):
                        break
                else:
                    h = min(hmax, th / phase) if phase > 0 else hmax
                    while not static_ok(degree, h):
                        h *= 0.8
                u1 = min(b0, u0 + h)
                nodes = self._gl(degree)
                # endpoints are exact floats shared by neighbouring panels: exact tiling
                ua, ub = mpmath.mpf(u0), mpmath.mpf(u1)
                mid = (ua + ub) / 2
                half = (ub - ua) / 2
                for x, w in nodes:
                    u = mid + half * x
                    l_ = self._ell_mp(u)
                    out.append((w * half * mpmath.exp(c * l_ - u * u / 2), l_))
                u0 = u1
        scale = 1 / mpmath.sqrt(2 * mpmath.pi)
        out = [(a * scale, l_) for a, l_ in out]
        self._store_rule(key, out)
        return out

    @staticmethod
    def _sum_rule(rule, cy):
        """Direct mpmath evaluation of sum_j a_j exp(i cy l_j) (reference path)."""
        if cy == 0:
            return mpmath.mpc(mpmath.fsum(a for a, _ in rule), 0)
        re = []
        im = []
        for a, l_ in rule:
            cs, sn = mpmath.cos_sin(cy * l_)
            re.append(a * cs)
            im.append(a * sn)
        return mpmath.mpc(mpmath.fsum(re), mpmath.fsum(im))

    def _fixed(self, t: float, ycap: float, wp: int):
        """Fixed-point (integer) copy of the rule, weights normalised by their sum M(t)."""
        key = ("fx", t, ycap, wp)
        if key in self._rules:
            return self._rules[key]
        rule = self._rule(t, ycap, wp)
        P = mpmath.mp.prec + 40
        total = mpmath.fsum(a for a, _ in rule)
        A, L = [], []
        for a, l_ in rule:
            ai = int(mpmath.ldexp(a / total, P))
            if ai:
                A.append(ai)
                L.append(l_)
        out = (P, total, A, L)
        self._store_rule(key, out)
        return out

    def _store_rule(self, key, value):
        """Keep few rules (they are large): those of the current line t only, at most 6."""
        t = key[1] if key[0] == "fx" else key[0]
        stale = [k_ for k_ in self._rules if (k_[1] if k_[0] == "fx" else k_[0]) != t]
        if stale or len(self._rules) >= 6:
            for k_ in stale or list(self._rules)[:2]:
                del self._rules[k_]
            self._prog.clear()
        self._rules[key] = value

    def log_mgf_progression(self, t: float, y0: float, s: float, count: int, wp: int, ycap: float):
        """[ln M(t + i (y0 + n s)) for n in range(count)] at the current precision.

        The phases exp(i c1 y l_j) are advanced by exact integer fixed-point
        complex multiplication (40 guard bits, re-seeded from cos/sin every 256
        steps), ~20x faster than cos/sin per node.  Consecutive calls on the same
        progression continue the recurrence.
        """
        if self.gaussian:
            out = []
            two_s2 = 2 * mpmath.mpf(self.sigma) ** 2
            for n in range(count):
                z = mpmath.mpc(t, mpmath.mpf(y0) + n * mpmath.mpf(s))
                out.append(z * (z + 1) / two_s2)
            return out
        fkey = ("fx", t, ycap, wp)
        P, total, A, L = self._fixed(t, ycap, wp)
        c1 = self.c1

        def seed(y):
            X, Y = [], []
            cy = c1 * mpmath.mpf(y)
            for l_ in L:
                cs, sn = mpmath.cos_sin(cy * l_)
                X.append(int(mpmath.ldexp(cs, P)))
                Y.append(int(mpmath.ldexp(sn, P)))
            return X, Y

        pkey = (fkey, s)
        st = self._prog.get(pkey)
        if st is None:
            C, S = seed(s)
            st = [C, S, None, None, None, 0]
            if len(self._prog) >= 4:
                self._prog.clear()
            self._prog[pkey] = st
        C, S, y_next, X, Y, age = st
        SpC = [sn + c for sn, c in zip(S, C)]
        SmC = [sn - c for sn, c in zip(S, C)]
        if y_next != y0:
            X, Y, age = None, None, 0
        out = []
        scale = mpmath.ldexp(total, -2 * P)
        for n in range(count):
            if X is None or age >= 256:
                X, Y = seed(y0 + n * s)
                age = 0
            re = sum(map(int.__mul__, A, X))
            im = sum(map(int.__mul__, A, Y))
            out.append(mpmath.log(mpmath.mpc(re, im) * scale))
            # (X + iY)(C + iS) with three multiplications: k1 = C (X + Y)
            K1 = [c * (x + y) for x, y, c in zip(X, Y, C)]
            X, Y = ([(k1 - y * e) >> P for k1, y, e in zip(K1, Y, SpC)],
                    [(k1 + x * d) >> P for k1, x, d in zip(K1, X, SmC)])
            age += 1
        st[2:] = [y0 + count * s, X, Y, age]
        return out

    def nodes_predicted(self, t: float, ycap: float, wp: int) -> float:
        """Rough number of nodes of the rule for (t, ycap, wp), without building it."""
        if self.gaussian:
            return 1.0
        width, lrange = self.window_stats(t, wp)
        return 24.0 * width + 0.8 * ycap * lrange

    def nodes_count(self, t: float, ycap: float, wp: int) -> int:
        if self.gaussian:
            return 1
        return len(self._fixed(t, ycap, wp)[2])

    def check_rule(self, t: float, y: float, wp: int, ln_m):
        """|M(ln_m) - M_direct| / M(t) at y: spot check of rule, fixed-point copy and recurrence.

        M_direct uses an independent, denser rule and mpmath cos/sin.
        """
        if self.gaussian:
            return mpmath.mpf(0)
        key = (t, y, wp)
        if key not in self._checks:
            r2 = self._rule(t, max(y, 1.0), wp, fine=True)
            m2 = self._sum_rule(r2, self.c1 * mpmath.mpf(y))
            m0 = self._sum_rule(r2, 0)
            if len(self._checks) > 1000:
                self._checks.clear()
            self._checks[key] = abs(mpmath.exp(ln_m) - m2) / abs(m0)
        return self._checks[key]


@functools.lru_cache(maxsize=64)
def _get_step(sigma: float, q: float, direction: str) -> _Step:
    if q == 1.0:
        direction = "remove"  # the pair is symmetric: both directions coincide
    return _Step(sigma, q, direction)


# ---------------------------------------------------------------------------
# the contour integral
# ---------------------------------------------------------------------------
def _ln_gmax(t2: float) -> float:
    """ln sup_u g_t(u) e^{-t2 u} for the kernel g_t of t2's strip (t2 > 0 or t2 < -1)."""
    if t2 > 0:
        return -math.log1p(t2) + t2 * (math.log(t2) - math.log1p(t2))
    s = -t2
    return -math.log(s - 1) + s * (math.log(s - 1) - math.log(s))


class _Retry(Exception):
    """Internal: the delta hint was too optimistic; redo with the computed value."""

    def __init__(self, ln_val):
        super().__init__(ln_val)
        self.ln_val = ln_val


#: default limit on the work of one contour evaluation (node-steps of the inner sum)
_WORK_BUDGET = 2.5e7
#: largest inner rule (memory: each node holds a few multi-precision numbers)
_MAX_NODES = 150000


class _Composed:
    """k-fold composition of one step; evaluates the contour integral."""

    def __init__(self, step: _Step, k: int):
        self.step = step
        self.k = int(k)
        self._saddles: dict = {}

    # -- double-precision helpers -------------------------------------------
    def phi(self, t: float, eps: float):
        """phi(t) = k K(t) - t eps - ln|t| - ln|1+t| and its first two derivatives (floats)."""
        K, K1, K2 = self.step.cgf_real(t)
        k = self.k
        p = k * K - t * eps - math.log(abs(t)) - math.log(abs(1 + t))
        p1 = k * K1 - eps - 1 / t - 1 / (1 + t)
        p2 = k * K2 + 1 / t**2 + 1 / (1 + t) ** 2
        return float(p), float(p1), float(p2)

    def saddle(self, eps: float, side: int):
        """Root of phi'(t) on t > 0 (side=+1) or t < -1 (side=-1); None if none exists."""
        k, st = self.k, self.step
        if side > 0:
            if eps >= k * st.loss_sup:
                return None
            to_t = lambda s: math.exp(s)          # noqa: E731
        else:
            if eps <= k * st.loss_inf:
                return None
            to_t = lambda s: -1.0 - math.exp(s)   # noqa: E731
        sgn = 1.0 if side > 0 else -1.0           # sgn * phi'(to_t(s)) is increasing in s
        f = lambda s: sgn * self.phi(to_t(s), eps)[1]  # noqa: E731
        lo, hi = -1.0, 1.0
        for _ in range(60):
            if f(lo) < 0:
                break
            lo -= 2.0
        else:
            return None
        while f(hi) <= 0:
            hi += 1.0
            if hi > 8.0:  # |t| ~ 3000: no usable saddle
                return None
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            if f(mid) > 0:
                hi = mid
            else:
                lo = mid
            if hi - lo < 1e-10:
                break
        return to_t(0.5 * (lo + hi))

    def sp_estimate_ln(self, t: float, eps: float) -> float:
        """ln of the saddle-point approximation exp(phi) / sqrt(2 pi phi'') at t."""
        p, _, p2 = self.phi(t, eps)
        return p - 0.5 * math.log(2 * math.pi * p2)

    def alias_T(self, eps: float, t: float, ln_abs_tol: float):
        """(T_triv, T_chernoff): periods T = 2 pi / Delta whose aliasing bounds are <= e^ln_abs_tol.

        Poisson summation: trapezoid(Delta) - delta = sum_{n != 0} h(n T) >= 0,
        h(w) = e^{-t w} D_t(w).  One side has a trivial bound (t > 0: D <= 1 for
        w > 0; t < -1: D_t(w) <= e^{eps - w} for w < 0); both sides have the
        Chernoff bound G(t2) exp(k K(t2) - t2 eps) e^{(t2 - t) n T}.  T_triv
        bounds the trivial side only; T_chernoff both sides (rigorously, up to
        the double-precision CGF, to which one nat of slack is added).
        """
        k = self.k
        ln_half = ln_abs_tol - math.log(2.0)
        ln2 = math.log(2.0)

        def need(ln_C, a):
            # sum_{n>=1} C e^{-a n T} <= 2 C e^{-a T} when e^{-a T} <= 1/2
            return max(ln_C + ln2 - ln_half, ln2) / a

        fr = (0.01, 0.03, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)
        if t > 0:
            t_triv = need(0.0, t)
            chern_sides = {-1: [t + f * (1 + t) * m for f in fr for m in (0.3, 3.0)]}
        else:
            t_triv = need(eps, -1 - t)
            chern_sides = {+1: [t - f * (1 + abs(t)) * m for f in fr for m in (0.3, 3.0)]}
        best = math.inf
        for side, cands in chern_sides.items():
            for t2 in cands:
                if t2 == t or (t > 0 and t2 <= 0) or (t < -1 and t2 >= -1):
                    continue
                try:
                    K2 = self.step.cgf_real(t2)[0]
                except (OverflowError, ValueError):
                    continue
                ln_C = _ln_gmax(t2) + k * K2 - t2 * eps + 1.0
                if math.isfinite(ln_C):
                    best = min(best, need(ln_C, abs(t - t2)))
        return t_triv, max(t_triv, best)

    def saddle_cached(self, eps: float, side: int):
        key = (eps, side)
        if key not in self._saddles:
            if len(self._saddles) > 256:
                self._saddles.clear()
            self._saddles[key] = self.saddle(eps, side)
        return self._saddles[key]

    def alias_T_estimate(self, eps: float, t: float, ln_thr: float) -> float:
        """Estimated T beyond which the aliases on the non-trivial side are < e^ln_thr.

        Alias at w: ln h(w) = -t w + ln D_t(w), and D_t(w) is the kernel
        expectation at eps' = eps - w, approximated by the saddle-point formula
        parametrised by the tilt s (eps(s) = k K'(s) - 1/s - 1/(1+s)).  Along s
        (moving away from t) the value decreases; T is where it crosses ln_thr.
        An estimate only: the trapezoidal step is then verified by halving.
        """
        k = self.k
        if t > 0:
            sh = self.saddle_cached(eps, +1)
            s0 = max(t, sh)
            grid = (s0 * math.exp(0.04 * i) for i in range(1500))
        else:
            sh = self.saddle_cached(eps, -1)
            if sh is None:
                return 0.0
            s0 = min(t, sh)
            grid = (-1.0 - (-1.0 - s0) * math.exp(0.04 * i) for i in range(1500))
        for sv in grid:
            if abs(sv) > 5000.0:
                return math.inf
            try:
                K, K1, K2 = self.step.cgf_real(sv)
                e_s = k * K1 - 1 / sv - 1 / (1 + sv)
                p2 = k * K2 + 1 / sv**2 + 1 / (1 + sv) ** 2
                sp = k * K - sv * e_s - math.log(abs(sv)) - math.log(abs(1 + sv)) - 0.5 * math.log(2 * math.pi * p2)
            except (OverflowError, ValueError, ZeroDivisionError):
                return math.inf
            if not math.isfinite(sp):
                return math.inf
            if t * (e_s - eps) + sp < ln_thr - 3.0:
                return 1.1 * abs(e_s - eps) + 0.5
        return math.inf

    def plan(self, eps: float, t: float, dps: int, ln_hint: float):
        """Predicted cost and settings of the contour on the line Re z = t (floats only)."""
        p, _, p2 = self.phi(t, eps)
        ln_abs_tol = -(dps + 3) * _LN10 + ln_hint
        if t < -1:
            lnR = (math.log(-math.expm1(eps)) if eps < 0 else
                   (eps + math.log(-math.expm1(-eps)) if eps > 0 else -math.inf))
            ln_big = max(p, lnR)
        else:
            ln_big = p
        cancel = max(0.0, (ln_big - ln_hint) / _LN10)
        wp = int(math.ceil((dps + 12 + math.log10(self.k) + cancel) / 10.0) * 10)
        t_triv, t_ch = self.alias_T(eps, t, ln_abs_tol)
        t_est = max(t_triv, self.alias_T_estimate(eps, t, ln_abs_tol))
        rigorous = t_ch <= 1.5 * t_est
        T = t_ch if rigorous else t_est
        y_gauss = math.sqrt(2.0 * max(p - ln_abs_tol, 1.0) / p2)
        # predicted extent of the integrand from |M| in double precision
        Delta = 2.0 ** math.floor(math.log2(2 * math.pi / T)) if math.isfinite(T) else 0.0
        y_min = 3.0 / math.sqrt(p2)
        ys = y_min * 1.2 ** np.arange(0, 200)
        ys = ys[ys <= 1000.0]
        y_pred = y_min
        if Delta > 0:
            ln_cut = ln_abs_tol + math.log(math.pi) - 2.0
            ln_floor = math.log(1e-12) + 1e-9
            lnt = math.log(abs(t * (1 + t)))
            rec = []  # (y, excess, at_floor); excess > 0: the term is still needed

            def stop(i, lr):
                y = ys[i]
                lnF = p + self.k * lr + lnt - 0.5 * math.log((t * t + y * y) * ((1 + t) ** 2 + y * y))
                rec.append((y, lnF + math.log(y / Delta) - ln_cut, lr <= ln_floor))
                if rec[-1][2] and rec[-1][1] > 0:
                    return True  # below the float floor but possibly needed: extrapolate
                last = max((j for j, r in enumerate(rec) if r[1] > 0), default=-1)
                return len(rec) - 1 - last >= 10  # 10 grid points (a factor 6 in y) not needed

            self.step.log_abs_ratio_float(t, ys, stop)
            if rec and rec[-1][2] and rec[-1][1] > 0:
                # extrapolate the excess as a power of y from the last points above the floor
                good = [r for r in rec if not r[2]]
                if len(good) >= 2 and good[-1][1] > good[-2][1] - 50:
                    (y1, e1, _), (y2, e2, _) = good[-2], good[-1]
                    alpha = (e1 - e2) / math.log(y2 / y1)
                    y_pred = y2 * math.exp(e2 / alpha) * 1.2 if alpha > 0.5 else math.inf
                else:
                    y_pred = math.inf
            else:
                needed = [r[0] for r in rec if r[1] > 0]
                if needed:
                    y_pred = needed[-1] * 1.2
                if rec and len(rec) == len(ys) and rec[-1][1] > 0:
                    y_pred = math.inf
        y_pred = max(y_pred, y_gauss)
        width, lrange = self.step.window_stats(t, wp)
        nodes = 1.0 if self.step.gaussian else 24.0 * width + 0.8 * y_pred * lrange
        if nodes > _MAX_NODES:
            y_pred = math.inf
        terms = y_pred / Delta if Delta > 0 else math.inf
        cost = (terms + 10) * (nodes + 50) * (wp / 50.0) ** 1.5
        return dict(p=p, p2=p2, wp=wp, cancel=cancel, T=T, rigorous=rigorous, y_gauss=y_gauss,
                    y_pred=y_pred, ln_abs_tol=ln_abs_tol, cost=cost)

    # -- one contour evaluation on a given line -----------------------------
    def contour(self, eps, t: float, dps: int, ln_hint: float, work_budget: float = _WORK_BUDGET, spent=None):
        """delta(eps) on the line Re z = t; raises _SlowDecay, _Retry or ContourError."""
        k, st = self.k, self.step
        epsf = float(eps)
        tol_digits = dps + 3
        pl = self.plan(epsf, t, dps, ln_hint)
        p, p2, wp = pl["p"], pl["p2"], pl["wp"]
        if pl["cancel"] > 120:
            raise _SlowDecay(f"line t = {t:.6g} would cancel {pl['cancel']:.0f} digits")
        ln_abs_tol = pl["ln_abs_tol"]
        rigorous, T = pl["rigorous"], pl["T"]
        if not math.isfinite(T):
            raise _SlowDecay(f"no usable trapezoidal step on t = {t:.6g}")
        j = math.floor(math.log2(2 * math.pi / T))  # Delta = 2^j <= 2 pi / T
        y_min = 3.0 / math.sqrt(p2)
        ycap0 = max(2.0 * pl["y_gauss"], 1.25 * pl["y_pred"]) if math.isfinite(pl["y_pred"]) else 2.0 * pl["y_gauss"]
        work = spent if spent is not None else [0.0]
        work_budget = work[0] + work_budget
        built = set()

        with mpmath.workdps(wp):
            tt = mpmath.mpf(t)
            e = mpmath.mpf(eps)
            R = mpmath.mpf(0) if t > 0 else -mpmath.expm1(e)
            thresh_ln = ln_abs_tol  # per-term tail allowance, see below

            def lnM_many(ys, cap):
                """ln M at the given y's (floats, increasing), from the cache or computed."""
                out = {}
                missing = []
                for y in ys:
                    hit = st._logm.get((t, y))
                    if hit is not None and hit[0] >= wp:
                        out[y] = hit[1]
                    else:
                        missing.append(y)
                i = 0
                while i < len(missing):
                    # longest arithmetic run starting at missing[i]
                    if i + 1 < len(missing):
                        d = missing[i + 1] - missing[i]
                        r = i + 1
                        while r + 1 < len(missing) and missing[r + 1] - missing[r] == d:
                            r += 1
                    else:
                        d, r = 1.0, i
                    cnt = r - i + 1
                    if cap not in built and st.nodes_predicted(t, cap, wp) > _MAX_NODES:
                        raise _SlowDecay(f"inner rule would need too many nodes (y up to {cap:.3g}, t = {t:.6g})")
                    vals = st.log_mgf_progression(t, missing[i], d, cnt, wp, cap)
                    nn = st.nodes_count(t, cap, wp)
                    if cap not in built:
                        built.add(cap)
                        work[0] += 20 * nn  # building the rule
                    work[0] += cnt * nn
                    for n in range(cnt):
                        out[missing[i + n]] = vals[n]
                        if len(st._logm) > 200000:
                            st._logm.clear()
                        st._logm[(t, missing[i + n])] = (wp, vals[n])
                    i = r + 1
                return out

            def walk(jj, ycap):
                D = 2.0**jj
                Dm = mpmath.mpf(D)
                thresh = mpmath.exp(thresh_ln) * mpmath.pi / Dm  # on the scale of sum F
                F = []
                small = 0
                m = 0
                B = 32
                while True:
                    ms = list(range(m, m + B))
                    if ms[-1] * D > ycap:
                        # grow the resolved y-range, unless the integrand has stopped decaying
                        tail_now = max((abs(F[i]) * i for i in range(len(F)) if i * D > ycap / 2), default=0)
                        tail_prev = max((abs(F[i]) * i for i in range(len(F))
                                         if ycap / 4 < i * D <= ycap / 2), default=0)
                        if tail_now > thresh * 1e3 and tail_prev > 0 and tail_now > 0.3 * tail_prev:
                            raise _SlowDecay(f"integrand decays slowly near y = {ycap:.3g} on t = {t:.6g}")
                        if work[0] + 20 * st.nodes_predicted(t, 2 * ycap, wp) > work_budget:
                            raise _SlowDecay(f"work budget exhausted at y = {ycap:.3g} on t = {t:.6g}")
                        ycap *= 2.0
                        continue
                    if work[0] > work_budget:
                        raise _SlowDecay(f"work budget exhausted at y = {ms[0] * D:.3g} on t = {t:.6g}")
                    lm = lnM_many([i * D for i in ms], ycap)
                    for i in ms:
                        z = mpmath.mpc(tt, i * Dm)
                        Fi = mpmath.exp(k * lm[i * D] - z * e) / (z * (z + 1))
                        F.append(Fi)
                        if i == 0:
                            continue
                        if abs(Fi) * i <= thresh and i * D >= y_min:
                            small += 1
                        else:
                            small = 0
                        if small >= max(4, i // 8):
                            return F, ycap
                    m += B

            def total(F, D, stride=1):
                Dm = mpmath.mpf(D) * stride
                s = mpmath.fsum([F[0].real / 2] + [F[i].real for i in range(stride, len(F), stride)])
                return R + s * Dm / mpmath.pi

            ycap = ycap0
            for _ in range(8):
                D = 2.0**j
                F, ycap = walk(j, ycap)
                val = total(F, D)
                alias_gap = None
                if not rigorous:
                    # the aliases are >= 0; the gap to the 2*Delta sum bounds them when
                    # h(w) = e^{-tw} D_t(w) is monotone on each half-line
                    alias_gap = total(F, D, 2) - val
                    if abs(alias_gap) > mpmath.exp(ln_abs_tol) and abs(alias_gap) > 10.0 ** (-tol_digits) * abs(val):
                        j -= 1
                        continue
                break
            else:
                raise ContourError(f"trapezoidal step did not converge on t = {t:.6g}")

            # --- a-posteriori checks ---------------------------------------
            if val <= 0:
                raise _Retry(ln_hint - 10.0)
            ln_val = float(mpmath.log(val))
            if ln_val < ln_hint - 2.0:
                raise _Retry(ln_val)
            absS = mpmath.fsum(abs(f) for f in F) * mpmath.mpf(D) / mpmath.pi
            scale_digits = float(mpmath.log10(max(absS, abs(R)) / val))
            short = tol_digits - (wp - scale_digits - math.log10(k) - 5)
            if short > 0:
                raise _Retry(ln_val - short * _LN10)
            y_last = (len(F) - 1) * D
            if not st.gaussian:
                hit = st._logm.get((t, y_last))
                lm_last = hit[1] if hit is not None else lnM_many([y_last], ycap)[y_last]
                err_rule = st.check_rule(t, y_last, wp, lm_last)
                if err_rule * k * (1 + abs(t)) * math.exp(p - ln_val) > 10.0 ** (-tol_digits):
                    raise ContourError(f"inner quadrature spot check failed (err {mpmath.nstr(err_rule, 3)})")
            else:
                err_rule = 0
            info = dict(t=t, Delta=D, terms=len(F), wp=wp, y_last=y_last, ycap=ycap,
                        cancel_digits=scale_digits, alias="chernoff bound" if rigorous else "halving check",
                        alias_gap=None if alias_gap is None else float(alias_gap),
                        inner_err=float(err_rule), work=work[0])
            return +val, info


def _candidate_lines(comp: _Composed, eps: float, dps: int, ln_hint: float):
    """Lines to try, best first: variations of the two saddles ranked by predicted cost.

    Small saddles need a very fine trapezoidal step; for slowly decaying
    integrands (small k, q < 1) lines that suppress the non-smooth end of the
    loss distribution (larger t for remove, t < -1 for add) are the ones that
    work; lines whose integrand is found to decay slowly are skipped.
    """
    tp = comp.saddle_cached(eps, +1)
    tm = comp.saddle_cached(eps, -1)
    cands = set()
    if tp is not None:
        cands |= {tp, tp + 0.5, tp + 1, tp + 2}
        cands |= {tp * f for f in (1.5, 2, 3, 4, 6, 8, 12, 16)}
    if tm is not None:
        cands |= {tm, tm - 0.5, tm - 1, tm - 2}
        cands |= {-1 + (tm + 1) * f for f in (1.5, 2, 3, 4, 6, 8, 12, 16)}
    ranked = []
    for t in sorted(cands):
        try:
            if (comp.phi(t, eps)[0] - ln_hint) / _LN10 > 100:
                continue
            c = comp.plan(eps, t, dps, ln_hint)
        except (OverflowError, ValueError, ZeroDivisionError):
            continue
        if c["cancel"] <= 100 and math.isfinite(c["cost"]):
            ranked.append((c["cost"], t))
    ranked.sort()
    return [t for _, t in ranked], tp, tm


def _delta_one(comp: _Composed, eps, dps: int, t=None, lines=None, work_budget: float = _WORK_BUDGET):
    """delta(eps) for one direction, with line selection and retries; returns (mpf, info)."""
    st, k = comp.step, comp.k
    epsf = float(eps)
    # exact values outside the support of the composed loss
    if epsf >= k * st.loss_sup:
        return mpmath.mpf(0), dict(exact=True)
    if epsf <= k * st.loss_inf:
        with mpmath.workdps(dps + 10):
            return +(-mpmath.expm1(mpmath.mpf(eps))), dict(exact=True)
    ts = comp.saddle_cached(epsf, +1)
    if ts is None:
        # the saddle lies beyond t ~ 3000: delta is astronomically small (eps close
        # to the largest possible composed loss); out of this method's reach
        raise _TooSmall(f"no usable saddle point for eps={epsf}, k={k}, q={st.q}, sigma={st.sigma}, "
                           f"direction={st.direction}: delta is astronomically small")
    ln_hint = comp.sp_estimate_ln(ts, epsf) - 2.0
    if t is not None:
        t = float(t)
        if not (t > 0 or t < -1):
            raise ValueError(f"t must be > 0 or < -1 (the kernel has poles at 0 and -1), got {t!r}")
        lines = [t]
    elif lines is None:
        lines = _candidate_lines(comp, epsf, dps, ln_hint)[0]
    last = "no integration line passed the cost and cancellation screen"
    spent = [0.0]
    for tl in lines[:6]:
        hint = ln_hint
        for _ in range(5):
            left = work_budget - spent[0]
            if left <= 0:
                break
            try:
                return comp.contour(eps, tl, dps, hint, left, spent)
            except _Retry as r:
                hint = min(hint - 5.0, r.ln_val - 3.0)
            except _SlowDecay as s:
                last = s
                break
        else:
            last = ContourError(f"could not reach the accuracy target on t = {tl}")
    raise ContourError(f"contour integral failed for eps={epsf}, k={k}, q={st.q}, "
                       f"sigma={st.sigma}, direction={st.direction}: {last} (out of reach: "
                       "small k*q or small k with small sigma, or a tiny delta; see the module docstring)")


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------
def delta_gaussian(eps, sigma, steps, q=1.0, direction="remove", dps=30, t=None, return_info=False):
    """High-precision delta(eps) of the k-fold (Poisson-subsampled) Gaussian mechanism.

    **Slow, high-precision reference**, for tests and benchmarks only.  It
    evaluates the inverse-Laplace contour integral of docs/MATH.md section 6 in
    ``mpmath`` (see the module docstring).  Typical costs: plain Gaussian ~0.02 s;
    sigma=1, q=0.01, 10,000 steps ~0.8 s; sigma=0.8, q=0.001, 10,000 steps
    ~1-4 s; one step with q < 1 and sigma=4 ~2-3 s.  Repeated calls with the
    same (sigma, q, direction) and line reuse the single-step CGF values.

    Parameters
    ----------
    eps : float or mpmath.mpf
        Any real epsilon.
    sigma : float
        Noise multiplier (noise std = sigma * sensitivity; sensitivity 1).
    steps : int
        Number of compositions k >= 1.
    q : float, optional
        Poisson sampling probability in (0, 1]; q = 1 is the plain Gaussian.
    direction : {"remove", "add", "add_remove"}
        Neighbouring relation (docs/MATH.md section 2).  ``"remove"``: P = (1-q) N(0, s^2)
        + q N(1, s^2), Q = N(0, s^2); ``"add"``: the reversed roles; ``"add_remove"``:
        the maximum of the two composed curves.
    dps : int, optional
        Target decimal digits in [15, 200]: the result aims at a relative error of
        ``10**-dps`` (default 30, i.e. 1e-30); the working precision is higher
        (at least dps + 12 digits, plus the digits lost to cancellation).
    t : float, optional
        Real part of the integration line (t > 0, or t < -1).  Default: chosen
        automatically (see the module docstring).  Exposed to test that the
        result does not depend on it.
    return_info : bool, optional
        Also return a dict with diagnostics: line ``t``, step ``Delta``, number of
        ``terms``, working precision ``wp``, last ``y`` used, how the aliasing
        error was controlled (``alias``), the inner-rule spot-check error.

    Returns
    -------
    mpmath.mpf
        delta(eps) (use ``float()`` for a float); with ``return_info`` a tuple
        ``(delta, info)``.  Exact values are returned outside the support of the
        composed loss: 0 for add with eps >= -k ln(1-q), 1 - e^eps for remove
        with eps <= k ln(1-q).

    Raises
    ------
    ContourError
        If the accuracy target cannot be reached or verified within the work
        budget.  This happens for small k*q (e.g. q=0.001 with 100 steps), for
        small k with small sigma, and for astronomically small delta.  The
        function raises in these cases; it does not return a doubtful number.
    """
    _check_common(sigma, steps, q, direction, dps)
    if direction == "add_remove":
        r = delta_gaussian(eps, sigma, steps, q, "remove", dps, t, True)
        a = delta_gaussian(eps, sigma, steps, q, "add", dps, t, True)
        best = r if r[0] >= a[0] else a
        return best if return_info else best[0]
    comp = _Composed(_get_step(float(sigma), float(q), direction), int(steps))
    val, info = _delta_one(comp, eps, int(dps), t)
    with mpmath.workdps(int(dps)):
        val = +val
    return (val, info) if return_info else val


def epsilon_gaussian(delta, sigma, steps, q=1.0, direction="remove", dps=30, xtol=None):
    """High-precision eps(delta) of the k-fold (Poisson-subsampled) Gaussian mechanism.

    **Slow, high-precision reference** (seconds per value; e.g. ~1 s for
    sigma=1, q=0.01, 10,000 steps and 1-6 s per direction for sigma=0.8,
    q=0.001, 10,000 steps).  The first guess comes from the double-precision
    saddle-point approximation.  Then ``delta_gaussian(eps) = delta`` is solved
    by bracketing and Illinois (regula falsi) iteration on ``ln delta(eps)``,
    which is decreasing in eps.  The integration line chosen at the first guess
    is kept during the search, so the single-step CGF values are computed once
    and reused.  The iteration stops when ``|ln delta(eps) - ln delta|`` reaches
    the accuracy of delta itself or the bracket is shorter than ``xtol``.

    Parameters
    ----------
    delta : float
        Target delta in (0, 1).
    sigma, steps, q, direction, dps
        As for :func:`delta_gaussian`.  ``"add_remove"`` returns the max of the
        two directions' epsilons (= eps of the max of the two delta curves).
    xtol : float, optional
        Absolute tolerance on eps; default ``10**-(dps // 2)``.

    Returns
    -------
    mpmath.mpf
        eps with delta(eps) = delta (the smallest such eps; delta is strictly
        decreasing where positive).

    Raises
    ------
    ContourError
        As for :func:`delta_gaussian`, or if no bracket is found.
    """
    _check_common(sigma, steps, q, direction, dps)
    if isinstance(delta, bool) or not (0 < float(delta) < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if direction == "add_remove":
        return max(epsilon_gaussian(delta, sigma, steps, q, "remove", dps, xtol),
                   epsilon_gaussian(delta, sigma, steps, q, "add", dps, xtol))
    dps = int(dps)
    xtol = float(xtol) if xtol is not None else 10.0 ** (-(dps // 2))
    comp = _Composed(_get_step(float(sigma), float(q), direction), int(steps))
    ln_target = math.log(float(delta))
    with mpmath.workdps(dps + 10):
        ln_target_mp = mpmath.log(mpmath.mpf(delta))

    # 1) first guess from the double-precision saddle-point approximation,
    #    parametrised by t: eps(t) = k K'(t) - 1/t - 1/(1+t)
    def eps_of_t(t):
        K, K1, _ = comp.step.cgf_real(t)
        return comp.k * K1 - 1 / t - 1 / (1 + t)

    def ln_sp(s):
        t = math.exp(s)
        return comp.sp_estimate_ln(t, eps_of_t(t))

    lo, hi = -12.0, 8.0
    for _ in range(70):
        mid = 0.5 * (lo + hi)
        try:
            v = ln_sp(mid)
        except (ValueError, OverflowError):
            v = -math.inf
        if v > ln_target:
            lo = mid
        else:
            hi = mid
    t0 = math.exp(0.5 * (lo + hi))
    eps0 = eps_of_t(t0)
    # 2) choose a working line at the first guess and keep it (the single-step
    #    CGF values on it are then reused); fall back to the automatic choice
    val0, info0 = _delta_one(comp, eps0, dps)
    line = [info0.get("t")]

    def f(x):
        val = None
        if line[0] is not None:
            try:
                val, _ = _delta_one(comp, x, dps, line[0])
            except _TooSmall:
                return -mpmath.inf  # delta(x) is astronomically below the target
            except ContourError:
                val = None
        if val is None:
            val, info = _delta_one(comp, x, dps)
            if "t" in info:
                line[0] = info["t"]
        if val <= 0:
            return -mpmath.inf
        with mpmath.workdps(dps + 10):
            return mpmath.log(val) - ln_target_mp

    # 3) bracket
    step = 0.02 * (1 + abs(eps0))
    a = b = eps0
    if val0 <= 0:
        fa = fb = -mpmath.inf
    else:
        with mpmath.workdps(dps + 10):
            fa = fb = mpmath.log(val0) - ln_target_mp
    for _ in range(60):
        if fa > 0:
            break
        a -= step
        step *= 2
        fa = f(a)
    step = 0.02 * (1 + abs(eps0))
    for _ in range(60):
        if fb < 0:
            break
        b += step
        step *= 2
        fb = f(b)
    if not (fa > 0 > fb):
        raise ContourError("could not bracket eps(delta)")
    # 4) Illinois iteration (regula falsi with halving), bisection when f = -inf
    ftol = mpmath.mpf(10) ** (-(dps - 2))
    with mpmath.workdps(dps + 10):
        a, b = mpmath.mpf(a), mpmath.mpf(b)
        side = 0
        for _ in range(200):
            if b - a <= xtol:
                break
            if fb == -mpmath.inf or fa == mpmath.inf:
                c = (a + b) / 2
            else:
                c = (a * fb - b * fa) / (fb - fa)
                if not (a < c < b):
                    c = (a + b) / 2
            fc = f(c)
            if abs(fc) <= ftol:  # as accurate as delta itself
                a = b = c
                break
            if fc > 0:
                a, fa = c, fc
                if side == +1:
                    fb = fb / 2
                side = +1
            else:
                b, fb = c, fc
                if side == -1:
                    fa = fa / 2
                side = -1
        res = (a + b) / 2 if b - a > 0 else a
    with mpmath.workdps(dps):
        return +res


def lognormal_call_put(sigma):
    """(call, put): K -> E(Y - K)_+ and K -> E(K - Y)_+ for the likelihood ratio Y = exp(Z / s - 1 / (2 s^2))
    of the Gaussian pair (N(1, s^2) against N(0, s^2)) under Q (Z ~ N(0, 1), E Y = 1), in closed form at
    the current mpmath precision (set ``mp.mp.dps`` first): Black's formula with zero rate.  Used by the
    quadrature truths of random allocation (docs/MATH.md 13.2, 13.8)."""
    import mpmath as mp

    s = mp.mpf(sigma)
    c = 1 / (2 * s)

    def call(K):
        if K <= 0:
            return 1 - K
        z = s * mp.log(K)
        return mp.ncdf(c - z) - K * mp.ncdf(-c - z)

    def put(K):
        if K <= 0:
            return mp.mpf(0)
        z = s * mp.log(K)
        return K * mp.ncdf(z + c) - mp.ncdf(z - c)

    return call, put

