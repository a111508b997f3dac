"""Independent truths for the robustness families of issue 39 (``pldlib.testing.robust``).

Written here with mpmath from the case's double parameters (each converted exactly to an
mpf), without calling pldlib's profiles, pairs or exact code.  Every truth is returned as an
interval ``(lo, hi)`` of mpf that contains the true value:

* closed forms and finite sums: ``lo == hi`` (exact up to the 50-60 working digits);
* 1-D quadratures: the value widened by 10x mpmath's error estimate (plus the rounding of a
  difference of terms) and a relative 1e-25 (a reference value at ~30 digits, not a verified
  enclosure);
* the negative-eps identity: [1 - e^eps, 1 - e^eps + e^eps UB] with UB a Chernoff (RDP-type)
  upper bound on the reversed composed divergence, itself computed by a finite sum or a 1-D
  quadrature.

Conventions (docs/MATH.md 0.3, 2.3): delta_{P||Q}(eps) = sup_A P(A) - e^eps Q(A); the remove pair of
the Poisson-subsampled Gaussian is P = (1-q) N(0, s^2) + q N(1, s^2), Q = N(0, s^2), the add
pair its reverse, add_remove the maximum of the two; WOR add/remove is the Poisson pair at s/2.
"""
from __future__ import annotations

import mpmath as mp

DPS = 50


def _m(x):
    return mp.mpf(float(x))


def _quad(f, pts):
    """mpmath quadrature over consecutive points; (value, error estimate)."""
    v, e = mp.quad(f, pts, error=True, maxdegree=10)
    return v, abs(e)


def _widen(v, e):
    w = 10 * e + abs(v) * mp.mpf(10) ** -25
    return (max(v - w, mp.mpf(0)), v + w)


# ---------------------------------------------------------------------------------------------
# (a) random allocation, one epoch
# ---------------------------------------------------------------------------------------------
def gaussian_delta(mu, eps):
    """Hockey-stick divergence of the Gaussian pair (N(mu, 1), N(0, 1)) at eps (closed form)."""
    mu, eps = mp.mpf(mu), mp.mpf(eps)
    return mp.ncdf(-eps / mu + mu / 2) - mp.exp(eps) * mp.ncdf(-eps / mu - mu / 2)


def allocation_delta(sigma, t, eps, direction):
    """delta(eps) of one epoch of random allocation: t steps (q = 1/t), Gaussian noise sigma,
    sensitivity 1, the record in exactly one uniformly chosen step (docs/MATH.md 13).

    Epoch pair (remove): P = (1/t) sum_i N(e_i, sigma^2 I_t), Q = N(0, sigma^2 I_t) (e_i unit vectors);
    add is the reversed pair, add_remove the maximum of the two (``direction`` in
    add / remove / add_remove).  The loss is L(x) = log((1/t) sum_i exp((x_i - 1/2)/sigma^2)).

    t = 1: the Gaussian pair at mu = 1/sigma (closed form).  t = 2: with a = (x1 + x2)/2,
    b = (x1 - x2)/2 (independent N(0, sigma^2/2) under Q), L = (a - 1/2)/sigma^2 + log cosh(b/sigma^2)
    is linear in a, so the inner expectation over a is a Black-Scholes closed form and the outer
    one over b is a 1-D mpmath quadrature.  Returns an interval (lo, hi).
    """
    if direction == "add_remove":
        r = allocation_delta(sigma, t, eps, "remove")
        a = allocation_delta(sigma, t, eps, "add")
        return (max(r[0], a[0]), max(r[1], a[1]))
    if direction not in ("add", "remove"):
        raise ValueError(direction)
    with mp.workdps(45):
        s, eps = _m(sigma), _m(eps)
        if t == 1:
            v = gaussian_delta(1 / s, eps)
            return (v, v)
        if t != 2:
            raise ValueError("allocation_delta: t must be 1 or 2 (1-D quadrature)")
        tau = s / mp.sqrt(2)
        sx = 1 / (s * mp.sqrt(2))  # sd of (a - 1/2)/s^2
        k = 1 / s ** 2
        ee = mp.exp(eps)

        def logcosh(u):
            u = abs(u)
            return u + mp.log1p(mp.exp(-2 * u)) - mp.log(2)

        def inner(b):
            m = -k / 2 + logcosh(b * k)  # log-mean of exp(L) given b is m + sx^2/2
            F = mp.exp(m + sx ** 2 / 2)
            if direction == "remove":  # E[(e^L - e^eps)_+]
                d = (m - eps) / sx
                return F * mp.ncdf(d + sx) - ee * mp.ncdf(d)
            d = (m + eps) / sx  # E[(1 - e^eps e^L)_+]
            return mp.ncdf(-d) - ee * F * mp.ncdf(-d - sx)

        def f(b):
            return 2 * mp.npdf(b, 0, tau) * inner(b)

        target = (eps if direction == "remove" else -eps) + k / 2  # log cosh(b k) at the kink
        pts = {mp.mpf(0)}
        for j in (1, 2, 4, 8, 16, 32):
            pts.add(j * tau)
        pts.add(mp.mpf(1) / 2)
        if target > 0:
            bstar = mp.acosh(mp.exp(target)) / k if target < 700 else (target + mp.log(2)) / k
            for j in (-4, -1, 0, 1, 4):
                if bstar + j * tau > 0:
                    pts.add(bstar + j * tau)
        pts = sorted(pts) + [mp.inf]
        v, e = _quad(f, pts)
        # each of the two terms integrates to at most 1 (remove: E[e^L] = 1; add: a probability),
        # so their difference carries an absolute rounding error of ~10^-dps: widened by 10^-(dps-5)
        return _widen(v, e + mp.mpf(10) ** -(mp.mp.dps - 5))


def allocation_power(sigma, alpha, direction):
    """Largest power at level alpha (Neyman-Pearson) of one epoch of t = 2 steps of random
    allocation (the pair of :func:`allocation_delta`); add_remove: the larger of the two.

    With a, b as in :func:`allocation_delta`, {L > c} = {a > A(b)}, A(b) = s^2 (c - log cosh(b/s^2)) + 1/2;
    under Q a, b ~ N(0, s^2/2), under P a ~ N(1/2, s^2/2) and |b| ~ |N(1/2, s^2/2)| (L is even in b).
    remove: reject L > c with Q(L > c) = alpha; add (the reversed pair): reject L < c with
    P(L < c) = alpha, power Q(L < c).  The level equation is solved on c; the answer is the
    interval [power at c_in, power at c_out] for thresholds bracketing the root with levels on
    either side of alpha (the curve is non-decreasing), each a 1-D quadrature."""
    if direction == "add_remove":
        r, a = allocation_power(sigma, alpha, "remove"), allocation_power(sigma, alpha, "add")
        return (max(r[0], a[0]), max(r[1], a[1]))
    with mp.workdps(25):
        s, al = _m(sigma), _m(alpha)
        if al <= 0 or al >= 1:
            v = mp.mpf(0) if al <= 0 else mp.mpf(1)
            return (v, v)
        tau, k = s / mp.sqrt(2), 1 / s ** 2

        def logcosh(u):
            u = abs(u)
            return u + mp.log1p(mp.exp(-2 * u)) - mp.log(2)

        def tail(c, under):  # (law "Q" or "P") of L > c
            mb = mp.mpf(0) if under == "Q" else mp.mpf(1) / 2

            def f(b):
                A = (c - logcosh(b * k)) / k + mp.mpf(1) / 2
                return mp.npdf(b, mb, tau) * mp.ncdf(-(A - mb) / tau)

            return mp.quad(f, [-mp.inf, -4 * tau, mb - tau, mb, mb + tau, 4 * tau + mb, mp.inf])

        if direction == "remove":
            level, power = (lambda c: tail(c, "Q")), (lambda c: tail(c, "P"))  # decreasing in c
        else:
            level, power = (lambda c: 1 - tail(c, "P")), (lambda c: 1 - tail(c, "Q"))  # increasing in c
        sign = -1 if direction == "remove" else 1  # level(c) - alpha has this sign's slope
        g = lambda c: sign * (mp.log(level(c)) - mp.log(al))  # noqa: E731  (increasing in c)
        lo, hi = mp.mpf(-1), mp.mpf(1)
        while g(lo) > 0:
            lo = 2 * lo - 1
        while g(hi) < 0:
            hi = 2 * hi + 1
        glo, ghi, side = g(lo), g(hi), 0
        for _ in range(200):  # Illinois (regula falsi with halving): both ends converge
            mid = hi - ghi * (hi - lo) / (ghi - glo)
            if not (lo < mid < hi):
                mid = (lo + hi) / 2
            gm = g(mid)
            if gm < 0:
                lo, glo = mid, gm
                if side == -1:
                    ghi /= 2
                side = -1
            else:
                hi, ghi = mid, gm
                if side == 1:
                    glo /= 2
                side = 1
            if hi - lo < mp.mpf(10) ** -14 * (1 + abs(mid)):
                break
        # bracket: level(lo) on one side of alpha, level(hi) on the other; power is monotone
        p1, p2 = power(lo), power(hi)
        return (min(p1, p2), max(p1, p2))


# ---------------------------------------------------------------------------------------------
# (b) the negative-eps identity for long, very private compositions
# ---------------------------------------------------------------------------------------------
def _log_mgf_remove(s, q, n):
    """log E_Q[r^n], r = P/Q of the Poisson remove pair, integer n >= 2: the exact binomial sum
    sum_j C(n, j) (1-q)^(n-j) q^j exp(j(j-1)/(2 s^2)) (moments of the lognormal)."""
    tot = mp.mpf(0)
    for j in range(n + 1):
        tot += mp.binomial(n, j) * (1 - q) ** (n - j) * q ** j * mp.exp(mp.mpf(j * (j - 1)) / (2 * s ** 2))
    return mp.log(tot)


def _log_mgf_add(s, q, lam):
    """log E_{N(0)}[(N(0)/P)^lam] for the add pair (P = N(0), Q = mixture reversed):
    log(1 + int phi_s(x) (r(x)^-lam - 1) dx), r = 1 + q (e^{(2x-1)/(2 s^2)} - 1)."""
    def f(x):
        g = (2 * x - 1) / (2 * s ** 2)
        lr = mp.log1p(q * mp.expm1(g))
        return mp.npdf(x, 0, s) * mp.expm1(-lam * lr)

    with mp.workdps(30):
        x0 = mp.mpf(1) / 2 + s ** 2 * mp.log(1 / q)
        pts = sorted({-12 * s, mp.mpf(0), 12 * s, x0})
        pts = [-mp.inf] + [p for p in pts if -12 * s <= p <= 12 * s] + [mp.inf]
        v, e = mp.quad(f, pts, error=True)
    return mp.log1p(v + 10 * abs(e) + abs(v) * mp.mpf(10) ** -20)  # (pessimistic: raised)


def _chernoff(logmgf, k, eps1, lams):
    """min over lam of exp(k log M(lam) - lam eps1): P_A(L > eps1) for the k-fold pair, >= delta."""
    best, arg = mp.mpf(1), None
    for lam in lams:
        v = mp.exp(k * logmgf(lam) - lam * eps1)
        if v < best:
            best, arg = v, lam
    return best, arg


def reversed_delta_upper(sigma, q, k, eps1, direction):
    """Upper bound on delta(eps1) (eps1 > 0) of k compositions of the Poisson-subsampled
    Gaussian pair in ``direction`` (remove / add / add_remove), by the Chernoff bound
    delta(eps1) <= P_A(L > eps1) <= E_A[e^{lam L}]^k e^{-lam eps1} at the best lam of a grid."""
    with mp.workdps(DPS):
        s, q, eps1 = _m(sigma), _m(q), _m(eps1)
        lams = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        out = mp.mpf(0)
        rem, lam_r = _chernoff(lambda lam: _log_mgf_remove(s, q, lam + 1), k, eps1, lams)
        if direction in ("remove", "add_remove"):
            out = max(out, rem)
        if direction in ("add", "add_remove"):
            # (the add pair's best order is near the remove pair's: three quadratures around it)
            lam_r = lam_r or 8
            near = sorted({max(1, lam_r // 2), lam_r, min(256, 2 * lam_r)})
            out = max(out, _chernoff(lambda lam: _log_mgf_add(s, q, lam), k, eps1, near)[0])
        return min(out * (1 + mp.mpf(10) ** -15), mp.mpf(1))


def negative_eps_delta(sigma, q, k, eps, relation, scheme="poisson"):
    """Truth interval of delta(eps), eps < 0, of k steps of the subsampled Gaussian: by the
    identity delta_{P||Q}(eps) = 1 - e^eps + e^eps delta_{Q||P}(-eps) (docs/MATH.md 2.4),
    [1 - e^eps, 1 - e^eps + e^eps UB] with UB :func:`reversed_delta_upper` of the reversed
    relation (add <-> remove; add_remove is its own reverse).  WOR: the Poisson pair at sigma/2."""
    assert eps < 0
    rev = {"add": "remove", "remove": "add", "add_remove": "add_remove"}[relation]
    s = sigma / 2 if scheme == "wor" else sigma
    with mp.workdps(DPS):
        e = _m(eps)
        base = -mp.expm1(e)
        ub = reversed_delta_upper(s, q, k, -eps, rev)
        return (base, base + mp.exp(e) * ub)


# ---------------------------------------------------------------------------------------------
# (c) randomized response
# ---------------------------------------------------------------------------------------------
def rr_delta(eps0, k, eps):
    """delta(eps) of k-fold randomized response with the double eps0 (exact binomial sum at 60
    digits): with p = e^eps0/(1 + e^eps0) the loss after k steps is (2j - k) eps0 with j ~
    Bin(k, p) under P, so delta = sum over (2j - k) eps0 > eps of
    C(k, j) (e^{j eps0} - e^{eps + (k-j) eps0}) / (1 + e^eps0)^k."""
    with mp.workdps(60):
        e0, eps = _m(eps0), _m(eps)
        lz = k * mp.log1p(mp.exp(e0)) if e0 < 40 else k * (e0 + mp.log1p(mp.exp(-e0)))
        tot = mp.mpf(0)
        jmin = max(0, int(mp.floor((eps / e0 + k) / 2)) - 1)
        for j in range(jmin, k + 1):
            if (2 * j - k) * e0 <= eps:
                continue
            lb = mp.loggamma(k + 1) - mp.loggamma(j + 1) - mp.loggamma(k - j + 1)
            tot += mp.exp(lb + j * e0 - lz) * -mp.expm1(eps + (k - 2 * j) * e0)
        return (tot, tot)


# ---------------------------------------------------------------------------------------------
# (d) Neyman-Pearson power of the subsampled Gaussian, one step
# ---------------------------------------------------------------------------------------------
def _bisect(f, lo, hi, it=400):
    """Root of an increasing f on [lo, hi] (bisection to the working precision)."""
    for _ in range(it):
        mid = (lo + hi) / 2
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= abs(mid) * mp.eps * 4 + mp.mpf(10) ** -(mp.mp.dps + 10):
            break
    return (lo + hi) / 2


def np_power(sigma, q, alpha, relation, scheme="poisson"):
    """Largest power (true-positive rate) of any test at level alpha for one step of the
    subsampled Gaussian (Neyman-Pearson, exact):

    remove: Q = N(0, s^2) rejected on x > s Phi^-1(1 - alpha): power (1-q) alpha + q Phi(Phi^-1(alpha) + 1/s);
    add: P = N(0), Q = (1-q) N(0) + q N(1): reject x < c with (1-q) Phi(c/s) + q Phi((c-1)/s) = alpha,
    power Phi(c/s); add_remove: max of the two; substitution (Poisson): Q = (1-q) N(0) + q N(-1),
    P = (1-q) N(0) + q N(1), L increasing: reject x > c with Q(x > c) = alpha.  WOR add/remove:
    the Poisson pairs at s/2."""
    with mp.workdps(40):
        s = _m(sigma) / (2 if scheme == "wor" else 1)
        q, a = _m(q), _m(alpha)
        if a <= 0:
            v = mp.mpf(0)
            return (v, v)
        if a >= 1:
            v = mp.mpf(1)
            return (v, v)
        if relation == "add_remove":
            r, d = np_power(sigma, q, alpha, "remove", scheme), np_power(sigma, q, alpha, "add", scheme)
            return (max(r[0], d[0]), max(r[1], d[1]))
        span = 60 * s + 10
        if relation == "remove":
            v = (1 - q) * a + q * mp.ncdf(mp.erfinv(2 * a - 1) * mp.sqrt(2) + 1 / s)
        elif relation == "add":
            c = _bisect(lambda c: (1 - q) * mp.ncdf(c / s) + q * mp.ncdf((c - 1) / s) - a, -span, span)
            v = mp.ncdf(c / s)
        elif relation == "substitution":
            c = _bisect(lambda c: a - ((1 - q) * mp.ncdf(-c / s) + q * mp.ncdf(-(c + 1) / s)), -span, span)
            v = (1 - q) * mp.ncdf(-c / s) + q * mp.ncdf(-(c - 1) / s)
        else:
            raise ValueError(relation)
        w = abs(v) * mp.mpf(10) ** -30
        return (v - w, v + w)


def poisson_gauss_delta1(sigma, q, eps, direction):
    """delta(eps) of one step of the Poisson-subsampled Gaussian (closed form, docs/MATH.md 2.4):
    remove: threshold x_eps with r(x_eps) = e^eps, r = 1 - q + q e^{(2x-1)/(2 s^2)}; add: the
    reversed pair directly (not through the identity, whose two terms cancel where delta is tiny):
    exactly 0 for eps >= -log(1-q), else Phi(x/s) - e^eps ((1-q) Phi(x/s) + q Phi((x-1)/s)) with
    r(x) = e^-eps."""
    with mp.workdps(DPS):
        s, q, eps = _m(sigma), _m(q), _m(eps)
        if direction == "add_remove":
            v = max(poisson_gauss_delta1(sigma, q, eps, "remove")[0], poisson_gauss_delta1(sigma, q, eps, "add")[0])
            return (v, v)

        def rem(e):
            if e <= mp.log1p(-q):
                return -mp.expm1(e)
            t = mp.log((mp.exp(e) - 1 + q) / q)
            x = s ** 2 * t + mp.mpf(1) / 2
            return (1 - q) * mp.ncdf(-x / s) + q * mp.ncdf(-(x - 1) / s) - mp.exp(e) * mp.ncdf(-x / s)

        if direction == "remove":
            v = rem(eps)
        elif eps >= -mp.log1p(-q):  # the add loss -log r(x) is at most -log(1 - q)
            v = mp.mpf(0)
        else:  # add: the pair (N(0), mixture) directly, {-log r > eps} = {x < x_eps}, r(x_eps) = e^-eps
            x = s ** 2 * mp.log((mp.exp(-eps) - 1 + q) / q) + mp.mpf(1) / 2
            v = mp.ncdf(x / s) - mp.exp(eps) * ((1 - q) * mp.ncdf(x / s) + q * mp.ncdf((x - 1) / s))
        return (v, v)
