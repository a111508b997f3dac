"""Cumulant generating functions of single-step privacy losses (docs/MATH.md section 6).

For one dominating pair (P, Q) with privacy loss L = ln dP/dQ the *CGF* is

    K(t) = ln E_P[e^{t L}] = ln E_Q[(dP/dQ)^{1+t}],

and its derivatives are the cumulants of the t-tilted loss L_t (density
proportional to e^{t l} dP_L(l)):

    K'(t) = E[L_t],  K''(t) = Var L_t,  K'''(t) = E[(L_t - K')^3],
    K''''(t) = E[(L_t - K')^4] - 3 K''(t)^2.

The saddle-point accountant (:mod:`pldlib.methods.spa`) also needs the tilted third
*absolute* central moment ``rho(t) = E|L_t - K'(t)|^3`` for its Berry-Esseen
error bound.  Composition adds CGFs (and rhos), so a k-fold composition costs
the same as one step, and heterogeneous sequences are sums.

Every object here exposes :meth:`StepCGF.cumulants` (vectorised over t) which
returns the array ``[K, K', K'', K''', K'''', rho, K^(5)]`` of shape ``(7,) + t.shape``
(the fifth cumulant only serves the accountant's interpolation between t-nodes).

How each single-step pair is handled
------------------------------------
* :class:`GaussianCGF` -- the plain Gaussian pair (sampling 'none', any
  relation): L ~ N(r^2/2, r^2) under P, closed form
  ``K(t) = r^2 t (t + 1) / 2``, ``K' = r^2 (t + 1/2)``, ``K'' = r^2``,
  ``K''' = K'''' = 0``, ``rho = 2 sqrt(2/pi) r^3``.
* :class:`FiniteCGF` -- pairs on finitely many outputs (randomized response,
  (eps0, delta0)-DP, lattice noises): exact sums in log space.  An atom of L at
  +inf (``p_inf > 0``) makes K infinite for t > 0, so the CGF describes the
  loss *conditioned on being finite* and carries ``p_inf`` separately; the
  accountant recombines them exactly:
  delta(eps) = P_inf + (1 - P_inf) delta_finite(eps), with P_inf the composed
  +inf mass.
* :class:`MixtureCGF` -- Poisson / WOR subsampled Gaussian and Laplace in the
  remove, add and substitution directions, and the plain Laplace pair.  The
  expectation is an integral over the *output* x of the mechanism,

      E_P[f(L)] = sum_i a_i Integral B(x - c_i) f(L(x)) dx,

  with L(x) smooth and monotone between the kinks of the noise density
  (Laplace: at the shifts).  Integrals are composite Gauss-Legendre rules
  (16 nodes per panel) evaluated in log space: for each t a coarse scan finds
  the x-window where the tilted integrand is within e^-70 of its maximum, and
  the panels are narrower than the Gaussian width s/2, than half the distance
  pi s^2 / |c_i - c_j| to the complex singularities of L, and (Laplace) than
  the scale on which the tilt e^{tL} changes by a factor e^1.5.  Laplace
  outputs beyond the outermost kink have constant L: they are exact atoms.
  Moments are two-pass (mean first, then central moments), so K'' ... K''''
  suffer no cancellation.  The rule is checked against a twice-finer rule and
  against independent mpmath/scipy quadrature in ``tests/test_cgf.py``.
* :class:`MaxProfileCGF` -- WOR substitution, upper branch.  The dominating
  "pair" is only known through its hockey-stick curve, the point-wise maximum
  of the add and remove curves at sensitivity 2D (:class:`~pldlib.profiles.mixtures.MaxProfile`).
  The law of its loss is read off that curve (docs/MATH.md section 0):
  P(L > e) = delta(e) - delta'(e), i.e. on each e-interval where one branch
  is the larger, L is distributed as that branch's loss, and where the
  selected branch switches (at e*), the kink of the max-curve is an atom of
  mass sf_left(e*) - sf_right(e*) >= 0.  Quadrature over this loss
  distribution via the branches' survival functions is the only generic
  route (no density of the max-pair exists in output space); we carry it
  out exactly by integrating each e-interval through the selected branch's
  own output-space parametrisation (x-range {e_lo < L <= e_hi}) and adding
  the atoms.  Crossing points are located on the log-delta curves in double
  precision (where both curves agree to 1e-9 relatively, the add branch is
  taken, as :class:`~pldlib.profiles.mixtures.MaxProfile` does).  Beyond the add
  branch's bounded support (L_add <= -ln(1 - q)) only the remove branch
  remains, so the right tail needed for large tilts is exact.

Which CGF belongs to which mechanism: :func:`profile_cgf` (one profile) and
:func:`mechanism_cgfs` (one mechanism -> its branches, as in
:meth:`pldlib.mechanisms.Mechanism.branches`).  :class:`ComposedCGF` sums
``k_i K_i`` for a heterogeneous sequence.

Domain: for every pair supported here K(t) is finite for every real t
(Gaussian-tailed or bounded losses), so there is no finite edge of the
domain; the numerical edges are t -> 0 and t -> infinity (``loss_sup``: the
essential supremum of L, finite for the add direction and for Laplace, where
the tilted law degenerates to the upper end).  The quadrature is meant for
1e-8 <= |t| <= 1e6; the accountant uses a t-grid inside that range.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import time
from fractions import Fraction
from typing import Sequence

import numpy as np
from scipy import optimize, special

from .. import _deadline
from ..profiles.mixtures import GaussianNoise, LaplaceNoise, MaxProfile, MixtureProfile, _logsumexp_weighted
from ..profiles.base import FiniteProfile, GaussianProfile, LaplaceProfile, PrivacyProfile

__all__ = [
    "StepCGF",
    "GaussianCGF",
    "FiniteCGF",
    "MixtureCGF",
    "MaxProfileCGF",
    "ComposedCGF",
    "profile_cgf",
    "mechanism_cgfs",
    "moments_from_points",
    "sum_up",
    "mul_up",
]

_GL_N = 16
_GL_X, _GL_W = np.polynomial.legendre.leggauss(_GL_N)
_LOG_2PI_HALF = 0.5 * math.log(2.0 * math.pi)
#: nats below the maximum of the tilted integrand that the x-window keeps
_WINDOW_NATS = 70.0


class CGFDeadline(TimeoutError):
    """Tabulating cumulants ran past the deadline of :func:`deadline` (the work is abandoned; no
    answer depends on it)."""


_DEADLINE: contextvars.ContextVar = contextvars.ContextVar("pldlib_cgf_deadline", default=None)


@contextlib.contextmanager
def deadline(at: float | None):
    """Within the block, tabulating cumulants raises :class:`CGFDeadline` once
    ``time.perf_counter()`` passes ``at`` (None: no deadline)."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _as_t(t) -> np.ndarray:
    return np.asarray(t, dtype=float)


def moments_from_points(values: np.ndarray, logw: np.ndarray) -> np.ndarray:
    """[K, K', K'', K''', K'''', rho, K^(5)] of the measure sum_n e^{logw_n} delta_{values_n}.

    ``K = ln sum e^{logw}``; the rest are cumulants (and the third absolute
    central moment) of the normalised measure, computed in two passes.
    """
    ok = np.isfinite(logw)
    v = values[ok]
    lw = logw[ok]
    if v.size == 0:
        return np.array([-np.inf, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan])
    m = lw.max()
    w = np.exp(lw - m)
    s0 = w.sum()
    w /= s0
    # weighted sums by numpy's pairwise summation, not BLAS ddot: a multithreaded ddot on ~1e5
    # points was 100x slower on a loaded machine (thread wake-ups), and pairwise sums round less
    mean = float(np.sum(w * v))
    d = v - mean
    d2 = d * d
    wd2 = w * d2
    k2 = float(np.sum(wd2))
    k3 = float(np.sum(wd2 * d))
    m4 = float(np.sum(wd2 * d2))
    rho = float(np.sum(wd2 * np.abs(d)))
    m5 = float(np.sum(wd2 * d2 * d))
    return np.array([m + math.log(s0), mean, k2, k3, m4 - 3.0 * k2 * k2, rho, m5 - 10.0 * k3 * k2])


class StepCGF:
    """The CGF of one step's privacy loss (abstract; see the module docstring).

    Attributes
    ----------
    p_inf : P(L = +inf); the cumulants describe L conditioned on L < inf.
    loss_sup : essential supremum of the finite part of L (inf if unbounded).
    loss_inf : essential infimum of L under P.
    """

    p_inf: float = 0.0
    loss_sup: float = math.inf
    loss_inf: float = -math.inf

    def _cumulants_scalar(self, t: float) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def cumulants(self, t) -> np.ndarray:
        """``[K, K', K'', K''', K'''', rho, K^(5)]`` at t, shape ``(7,) + shape(t)``."""
        t = _as_t(t)
        flat = t.ravel()
        out = np.empty((7, flat.size))
        stop = _DEADLINE.get()  # (:func:`deadline`: past it, CGFDeadline)
        for i, ti in enumerate(flat):
            if stop is not None and time.perf_counter() > stop:
                raise CGFDeadline("the cumulant tables ran past their deadline")
            _deadline.check("tabulating cumulants")
            out[:, i] = self._cumulants_scalar(float(ti))
        return out.reshape((7,) + t.shape)

    # convenience accessors
    def K(self, t):
        """K(t) = ln E_P[e^{tL}]."""
        return self.cumulants(t)[0]

    def derivatives(self, t, order: int = 4):
        """(K, K', ..., K^(order)) at t (order <= 4)."""
        c = self.cumulants(t)
        return tuple(c[: order + 1])

    def rho(self, t):
        """Tilted third absolute central moment E|L_t - K'(t)|^3."""
        return self.cumulants(t)[5]


class GaussianCGF(StepCGF):
    """Plain Gaussian pair with r = sensitivity / noise: closed form, any real t."""

    def __init__(self, r: float):
        self.r = float(r)
        self.p_inf = 0.0

    def cumulants(self, t) -> np.ndarray:
        t = _as_t(t)
        r2 = self.r**2
        one = np.ones_like(t)
        return np.stack([
            0.5 * r2 * t * (t + 1.0),
            r2 * (t + 0.5),
            r2 * one,
            0.0 * one,
            0.0 * one,
            2.0 * math.sqrt(2.0 / math.pi) * self.r**3 * one,
            0.0 * one,
        ])

    def _cumulants_scalar(self, t: float) -> np.ndarray:
        return self.cumulants(np.array(t))


class FiniteCGF(StepCGF):
    """Finitely many loss atoms (exact); conditioned on L < inf when p_inf > 0."""

    def __init__(self, losses, p_masses, p_inf: float = 0.0):
        self.losses = np.asarray(losses, dtype=float)
        p = np.asarray(p_masses, dtype=float)
        keep = p > 0
        self.losses, p = self.losses[keep], p[keep]
        self.p_inf = float(p_inf)
        if self.p_inf >= 1.0 or p.size == 0:
            raise ValueError("the privacy loss is +inf with probability 1: no CGF")
        with np.errstate(divide="ignore"):
            self._logp = np.log(p) - math.log1p(-self.p_inf) if self.p_inf > 0 else np.log(p)
        self.loss_sup = float(self.losses.max())
        self.loss_inf = float(self.losses.min())

    def _cumulants_scalar(self, t: float) -> np.ndarray:
        return moments_from_points(self.losses, self._logp + t * self.losses)


# ---------------------------------------------------------------------------------------------
# output-space quadrature for mixtures of shifted Gaussian / Laplace noises
# ---------------------------------------------------------------------------------------------
class _MixSpec:
    """P' = sum a_i B(x - c_i), Q' = sum b_j B(x - d_j), loss L(x) = ln dP'/dQ'(x).

    ``kind`` is 'gauss' (scale = s) or 'laplace' (scale = b).  The loss is
    computed with the x^2 terms cancelled analytically (Gaussian), so it stays
    accurate far out in x where large tilts put their mass.
    """

    def __init__(self, kind: str, scale: float, pw, pc, qw, qd):
        self.kind = kind
        self.scale = float(scale)
        pw, pc = np.asarray(pw, float), np.asarray(pc, float)
        qw, qd = np.asarray(qw, float), np.asarray(qd, float)
        kp, kq = pw > 0, qw > 0
        self.pw, self.pc, self.qw, self.qd = pw[kp], pc[kp], qw[kq], qd[kq]
        self.log_pw, self.log_qw = np.log(self.pw), np.log(self.qw)
        s = self.scale
        if kind == "gauss":
            # slope bounds of L(x): d/dx ln p in [(cmin - x)/s^2, (cmax - x)/s^2]
            self.slope_lo = (self.pc.min() - self.qd.max()) / s**2
            self.slope_hi = (self.pc.max() - self.qd.min()) / s**2
            spread = max(np.ptp(self.pc), np.ptp(self.qd))
            self.feature = min(s, math.pi * s**2 / spread) if spread > 0 else s
            self.breaks = np.array([])
        elif kind == "laplace":
            self.slope_lo, self.slope_hi = -2.0 / s, 2.0 / s
            self.feature = 0.5 * math.pi * s
            self.breaks = np.unique(np.concatenate([self.pc, self.qd]))
        else:  # pragma: no cover - internal
            raise ValueError(kind)

    # log densities (up to the common normalising constant for the loss)
    def _log_mix_terms(self, x, logw, shifts):
        s = self.scale
        if self.kind == "gauss":
            # -(x - c)^2 / 2 s^2 = -x^2/2s^2 + (2 x c - c^2)/2s^2: drop the common -x^2/2s^2
            terms = logw[:, None] + (2.0 * np.outer(shifts, x) - (shifts**2)[:, None]) / (2 * s * s)
        else:
            terms = logw[:, None] - np.abs(x[None, :] - shifts[:, None]) / s
        if terms.shape[0] == 1:
            return terms[0]
        if terms.shape[0] == 2:  # (a sampled step's mixture: one pass, about 3x quicker)
            return np.logaddexp(terms[0], terms[1])
        m = terms.max(axis=0)
        m = np.where(np.isfinite(m), m, 0.0)
        return m + np.log(np.exp(terms - m).sum(axis=0))

    def loss(self, x):
        x = np.asarray(x, dtype=float)
        return self._log_mix_terms(x, self.log_pw, self.pc) - self._log_mix_terms(x, self.log_qw, self.qd)

    def log_density_p(self, x):
        x = np.asarray(x, dtype=float)
        s = self.scale
        if self.kind == "gauss":
            return self._log_mix_terms(x, self.log_pw, self.pc) - x * x / (2 * s * s) - math.log(s) - _LOG_2PI_HALF
        return self._log_mix_terms(x, self.log_pw, self.pc) - math.log(2 * s)

    def p_mass(self, a: float, b: float) -> float:
        """P'(a < x <= b)."""
        s = self.scale
        tot = 0.0
        for w, c in zip(self.pw, self.pc):
            if self.kind == "gauss":
                lo, hi = (a - c) / s, (b - c) / s
                # difference of the smaller tails
                if lo >= 0:
                    m = special.ndtr(-lo) - special.ndtr(-hi)
                else:
                    m = special.ndtr(hi) - special.ndtr(lo)
            else:
                m = _lap_cdf((b - c) / s) - _lap_cdf((a - c) / s) if (a - c) < 0 else \
                    _lap_sf((a - c) / s) - _lap_sf((b - c) / s)
            tot += w * max(m, 0.0)
        return tot

    # -- the quadrature rule for the tilted measure on one x-interval ---------------------
    def _window(self, a: float, b: float, t: float, spacing: float, slope_bound: float):
        """Sub-interval of [a, b] where log(p e^{tL}) is within _WINDOW_NATS of its max.

        Returns (lo, hi, step) with ``step`` the largest change of the log
        integrand between neighbouring scan points inside the window (used to
        size the panels), or None if the integrand vanishes.
        """
        n = int(min(200000, max(33, math.ceil((b - a) / spacing) + 1)))
        x = np.linspace(a, b, n)
        f = self.log_density_p(x) + t * self.loss(x)
        fmax = f.max()
        if not np.isfinite(fmax):
            return None
        dx = x[1] - x[0]
        keep = np.nonzero(f >= fmax - _WINDOW_NATS - slope_bound * dx)[0]
        i0, i1 = max(keep[0] - 2, 0), min(keep[-1] + 2, n - 1)
        lo = max(a, x[i0])
        hi = min(b, x[i1])
        seg = f[i0:i1 + 1]
        seg = seg[np.isfinite(seg)]
        step = float(np.abs(np.diff(seg)).max()) if seg.size > 1 else 0.0
        return lo, hi, dx, step

    def _gl_nodes(self, a: float, b: float, panel: float, refine: int = 1):
        n_pan = int(min(400000, max(1, math.ceil((b - a) / panel)))) * refine
        edges = np.linspace(a, b, n_pan + 1)
        half = 0.5 * np.diff(edges)
        mid = 0.5 * (edges[1:] + edges[:-1])
        x = (mid[:, None] + half[:, None] * _GL_X[None, :]).ravel()
        w = (half[:, None] * _GL_W[None, :]).ravel()
        return x, w

    def tilted_points(self, t: float, xa: float = -math.inf, xb: float = math.inf, refine: int = 1):
        """Loss values and log-weights of a rule for the measure e^{tL} dP' on (xa, xb].

        Panels: at most half the distance to the nearest complex singularity of
        L (``feature``), at most s/2 (Gaussian), and such that the log
        integrand changes by at most ~8 nats across a panel (measured on the
        scan, whose spacing is itself at most 8 / (slope bound) for Laplace);
        16-point Gauss-Legendre is then accurate to ~1e-13 per panel.
        """
        s = self.scale
        vals, logws = [], []
        if self.kind == "gauss":
            sh = sorted((t * s * s * self.slope_lo, t * s * s * self.slope_hi))
            lo_br = self.pc.min() + sh[0] - 11 * s
            hi_br = self.pc.max() + sh[1] + 11 * s
            a, b = max(xa, lo_br), min(xb, hi_br)
            if a >= b:  # the restriction lies outside the bracket: mass sits at its near end
                if xb <= lo_br:
                    a, b = max(xa, xb - 11 * s), xb
                else:
                    a, b = xa, min(xb, xa + 11 * s)
            if not (a < b):
                return np.array([]), np.array([])
            # the tilted bump is at least as wide as the noise (L is convex near the mass)
            win = self._window(a, b, t, s / 2.0, 0.0)
            if win is None:
                return np.array([]), np.array([])
            lo, hi, dx, step = win
            panel = min(0.5 * self.feature, 0.5 * s, dx * 8.0 / max(step, 8.0))
            x, w = self._gl_nodes(lo, hi, panel, refine)
            vals.append(self.loss(x))
            logws.append(np.log(w) + self.log_density_p(x) + t * vals[-1])
        else:
            br = self.breaks
            # outer regions: L is constant, the mass is exact (atoms)
            left_l = float(self.loss(np.array([br[0] - s]))[0])
            right_l = float(self.loss(np.array([br[-1] + s]))[0])
            for lo_, hi_, lval in ((-math.inf, br[0], left_l), (br[-1], math.inf, right_l)):
                a, b = max(xa, lo_), min(xb, hi_)
                if a < b:
                    m = self.p_mass(a, b)
                    if m > 0:
                        vals.append(np.array([lval]))
                        logws.append(np.array([math.log(m) + t * lval]))
            slope = 1.0 / s + abs(t) * max(abs(self.slope_lo), abs(self.slope_hi))
            for lo_, hi_ in zip(br[:-1], br[1:]):
                a, b = max(xa, lo_), min(xb, hi_)
                if not a < b:
                    continue
                win = self._window(a, b, t, min((b - a) / 64.0, 8.0 / slope), slope)
                if win is None:
                    continue
                lo, hi, dx, step = win
                panel = min(0.5 * self.feature, dx * 8.0 / max(step, 8.0))
                x, w = self._gl_nodes(lo, hi, panel, refine)
                vals.append(self.loss(x))
                logws.append(np.log(w) + self.log_density_p(x) + t * vals[-1])
        if not vals:
            return np.array([]), np.array([])
        return np.concatenate(vals), np.concatenate(logws)


def _lap_sf(z):
    return 0.5 * math.exp(-z) if z >= 0 else 1.0 - 0.5 * math.exp(z)


def _lap_cdf(z):
    return _lap_sf(-z)


def _spec_of_mixture(prof: MixtureProfile) -> _MixSpec:
    noise = prof.noise
    if isinstance(noise, GaussianNoise):
        kind, scale = "gauss", noise.s
    elif isinstance(noise, LaplaceNoise):
        kind, scale = "laplace", noise.b
    else:  # pragma: no cover - no other noises exist
        raise NotImplementedError(f"no CGF for noise {type(noise).__name__}")
    if prof.reverse:
        return _MixSpec(kind, scale, prof.qb, prof.qd, prof.pa, prof.pc)
    return _MixSpec(kind, scale, prof.pa, prof.pc, prof.qb, prof.qd)


def _loss_range(prof) -> tuple[float, float]:
    lo, hi = prof._range
    if getattr(prof, "reverse", False):
        lo, hi = -hi, -lo
    return float(lo), float(hi)


class MixtureCGF(StepCGF):
    """CGF of a :class:`~pldlib.profiles.mixtures.MixtureProfile` (subsampled Gaussian / Laplace)."""

    def __init__(self, profile: MixtureProfile | None = None, *, spec: _MixSpec | None = None,
                 loss_range=(-math.inf, math.inf), refine: int = 1):
        self.spec = spec if spec is not None else _spec_of_mixture(profile)
        self.loss_inf, self.loss_sup = _loss_range(profile) if profile is not None else loss_range
        self.refine = int(refine)
        self.p_inf = 0.0

    def tilted_points(self, t: float):
        return self.spec.tilted_points(t, refine=self.refine)

    def _cumulants_scalar(self, t: float) -> np.ndarray:
        v, lw = self.tilted_points(t)
        return moments_from_points(v, lw)


def _log_delta_mixture(prof: MixtureProfile, eps: np.ndarray) -> np.ndarray:
    """ln delta(eps) of a mixture profile (MixtureProfile.delta in log space)."""
    pw, ps, qw, qs, _, _, log_up = prof._sides()
    x = prof._x(eps)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        A = _logsumexp_weighted(pw, [log_up(x - c) for c in ps])
        B = eps + _logsumexp_weighted(qw, [log_up(x - d) for d in qs])
        out = A + np.log(-np.expm1(np.minimum(B - A, 0.0)))
    return np.where(np.isfinite(A), out, -np.inf)


class MaxProfileCGF(StepCGF):
    """CGF of the point-wise maximum of two mixture profiles (WOR substitution, upper).

    See the module docstring: the loss law of the max-curve is, on each
    e-interval, the selected branch's loss law, plus atoms at the switches.
    """

    #: relative tolerance below which the two curves count as equal (branch a is taken)
    TIE = 1e-9

    def __init__(self, profile: MaxProfile, n_scan: int = 4000, refine: int = 1):
        a, b = profile.a, profile.b
        if not (isinstance(a, MixtureProfile) and isinstance(b, MixtureProfile)):
            raise NotImplementedError("SPA/CGF: a max-profile is supported for two mixture profiles only")
        self.a, self.b = a, b
        self.refine = int(refine)
        self.p_inf = 0.0
        ra, rb = _loss_range(a), _loss_range(b)
        self.loss_inf = min(ra[0], rb[0])
        self.loss_sup = max(ra[1], rb[1])
        self.specs = {id(a): _spec_of_mixture(a), id(b): _spec_of_mixture(b)}
        self.pieces, self.atoms = self._decompose(n_scan, ra, rb)

    def _decompose(self, n_scan, ra, rb):
        a, b = self.a, self.b
        lo = min(a.eps_bounds(1e-30)[0], b.eps_bounds(1e-30)[0])
        hi_a = ra[1] if math.isfinite(ra[1]) else a.eps_bounds(1e-300)[1]
        hi_b = rb[1] if math.isfinite(rb[1]) else b.eps_bounds(1e-300)[1]
        hi = min(hi_a, hi_b)  # beyond the smaller support end only one branch is positive
        e = np.linspace(lo, hi, n_scan)

        def diff(x):
            return _log_delta_mixture(a, np.asarray(x, float)) - _log_delta_mixture(b, np.asarray(x, float))

        with np.errstate(invalid="ignore"):
            d = diff(e)
        use_a = ~(d < -self.TIE)  # ties and NaN (both zero) -> a
        switches = []
        for i in np.nonzero(use_a[1:] != use_a[:-1])[0]:
            e0, e1 = e[i], e[i + 1]
            try:
                f0, f1 = float(diff(e0)), float(diff(e1))
                root = optimize.brentq(lambda x: float(diff(x)), e0, e1, xtol=1e-14) \
                    if np.isfinite(f0) and np.isfinite(f1) and f0 * f1 < 0 else 0.5 * (e0 + e1)
            except (ValueError, RuntimeError):
                root = 0.5 * (e0 + e1)
            switches.append(root)
        # selections: one per interval between switches; the right tail beyond `hi`
        first = a if use_a[0] else b
        sel = [first]
        for _ in switches:
            sel.append(b if sel[-1] is a else a)
        # beyond the smaller support end the branch with the larger support wins
        if hi_a != hi_b:
            tail_branch = a if hi_a > hi_b else b
            if sel[-1] is not tail_branch:
                switches.append(hi)
                sel.append(tail_branch)
        cuts = [-math.inf] + switches + [math.inf]
        pieces = [(sel[j], cuts[j], cuts[j + 1]) for j in range(len(sel))]
        atoms = []
        for j, e_s in enumerate(switches):
            left, right = sel[j], sel[j + 1]
            m = float(left.sf_p(np.nextafter(e_s, -np.inf))) - float(right.sf_p(e_s))
            if m > 0:
                atoms.append((e_s, m))
        return pieces, atoms

    @staticmethod
    def _x_range(prof: MixtureProfile, e_lo: float, e_hi: float):
        def x_of(e):
            if e == -math.inf:
                return math.inf if prof.reverse else -math.inf
            if e == math.inf:
                return -math.inf if prof.reverse else math.inf
            return float(prof._x(np.array(e)))

        xa, xb = x_of(e_lo), x_of(e_hi)
        return (xb, xa) if prof.reverse else (xa, xb)

    def tilted_points(self, t: float):
        vals, logws = [], []
        for prof, e_lo, e_hi in self.pieces:
            xa, xb = self._x_range(prof, e_lo, e_hi)
            if not xa < xb:
                continue
            v, lw = self.specs[id(prof)].tilted_points(t, xa, xb, refine=self.refine)
            vals.append(v)
            logws.append(lw)
        for e_s, m in self.atoms:
            vals.append(np.array([e_s]))
            logws.append(np.array([math.log(m) + t * e_s]))
        return np.concatenate(vals), np.concatenate(logws)

    def _cumulants_scalar(self, t: float) -> np.ndarray:
        v, lw = self.tilted_points(t)
        return moments_from_points(v, lw)


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------
def profile_cgf(profile: PrivacyProfile, refine: int = 1) -> StepCGF:
    """The :class:`StepCGF` of one single-step profile (dominating pair).

    Raises NotImplementedError for profiles without a known loss law in closed
    form or output space (custom profiles other than finite ones).
    """
    if isinstance(profile, GaussianProfile):
        return GaussianCGF(profile.r)
    if isinstance(profile, LaplaceProfile):
        # pair (Lap(0, b), Lap(D, b)): P = B_0, Q = B_D
        spec = _MixSpec("laplace", profile.scale, [1.0], [0.0], [1.0], [profile.sensitivity])
        return MixtureCGF(spec=spec, loss_range=(-profile.a, profile.a), refine=refine)
    if isinstance(profile, FiniteProfile):
        return FiniteCGF(profile.losses, profile.p_masses, profile.p_inf)
    if isinstance(profile, MixtureProfile):
        return MixtureCGF(profile, refine=refine)
    if isinstance(profile, MaxProfile):
        return MaxProfileCGF(profile, refine=refine)
    raise NotImplementedError(
        f"no CGF for a {type(profile).__name__}: the saddle-point accountant supports Gaussian, "
        "Laplace (plain or subsampled), finite pairs and the WOR-substitution max-profile")


def mechanism_cgfs(mechanism) -> list[tuple[str, StepCGF, StepCGF]]:
    """(label, upper CGF, lower CGF) for every branch of ``mechanism``.

    The two CGFs are the same object except for WOR substitution, whose upper
    branch is the max-profile and whose lower branch is the remove pair.
    """
    out = []
    for br in mechanism.branches():
        up = profile_cgf(br.upper)
        lo = up if br.lower is br.upper else profile_cgf(br.lower)
        out.append((br.label, up, lo))
    return out


def sum_up(terms) -> float:
    """The smallest double >= sum k_i x_i (exact rational arithmetic): k * ess sup L of a composition,
    rounded up so that "delta = 0 for eps >= k ess sup L" is never claimed below the true supremum."""
    xs = [float(x) for _, x in terms]
    if any(not math.isfinite(x) for x in xs):
        return sum(xs)
    exact = sum(Fraction(int(k)) * Fraction(x) for (k, _), x in zip(terms, xs))
    f = float(exact)
    return math.nextafter(f, math.inf) if Fraction(f) < exact else f


def mul_up(k, x) -> float:
    """The smallest double >= k x (k a whole number of steps), see :func:`sum_up`."""
    return sum_up([(k, x)])


class ComposedCGF:
    """K_Y = sum_i k_i K_i for a sequence of (StepCGF, count); p_inf and loss_sup combined."""

    def __init__(self, parts: Sequence[tuple[StepCGF, int]]):
        self.parts = [(c, int(k)) for c, k in parts]
        log_fin = sum(k * math.log1p(-c.p_inf) for c, k in self.parts if c.p_inf > 0)
        self.p_inf = -math.expm1(log_fin)
        self.loss_sup = sum_up([(k, c.loss_sup) for c, k in self.parts])
        self.identical = len(self.parts) == 1

    def cumulants(self, t) -> np.ndarray:
        """Composed ``[K, K', K'', K''', K'''', sum_i k_i rho_i, K^(5)]`` at t."""
        out = None
        for c, k in self.parts:
            v = k * c.cumulants(t)
            out = v if out is None else out + v
        return out


def log_gmax(t):
    """ln max_w psi_t(w) = -ln(1 + t) + t ln(t / (1 + t)) (docs/MATH.md 6.5)."""
    t = np.asarray(t, float)
    return -np.log1p(t) - t * np.log1p(1.0 / t)


#: the tilts the quick Chernoff bound tries (8 per decade), before refining around the best
CHERNOFF_T = np.geomspace(1e-3, 1e6, 73)


def chernoff_log_delta(parts: Sequence[tuple[StepCGF, int]], eps, t=CHERNOFF_T) -> np.ndarray:
    """ln of a certified upper bound on delta(eps) of the composition ``parts`` ((CGF, count) of
    one branch, no +inf mass): Chernoff, delta(eps) <= e^{K(t) - t eps} g_max(t) for every t > 0
    (docs/MATH.md 6.5), minimised over the tilts ``t`` and then over 8 tilts between the best one's
    neighbours; widened by 1e-9 (|K| + t |eps|) + 1e-6 in the log for the quadratures' error.
    +inf where no tilt gives a finite K."""
    eps = np.atleast_1d(np.asarray(eps, float))
    if any(c.p_inf > 0 for c, _ in parts):
        raise ValueError("chernoff_log_delta: a step with +inf mass (recombine it first)")

    def at(ts):
        with np.errstate(over="ignore", invalid="ignore"):
            K = sum(k * c.cumulants(ts)[0] for c, k in parts)
            lg = K[None, :] - ts[None, :] * eps[:, None] + log_gmax(ts)[None, :]
            lg = lg + 1e-9 * (np.abs(K)[None, :] + ts[None, :] * np.abs(eps)[:, None]) + 1e-6
        return np.where(np.isfinite(lg), lg, np.inf)

    t = np.asarray(t, float)
    lg = at(t)
    best = lg.min(axis=1)
    for j in np.unique(np.argmin(lg, axis=1)):
        fine = np.geomspace(t[max(j - 1, 0)], t[min(j + 1, t.size - 1)], 10)[1:-1]
        best = np.minimum(best, at(fine).min(axis=1))
    return best


#: the tilts (K at -t) and the shifts s of the Chernoff lower bound
CHERNOFF_LOWER_T = np.geomspace(1e-4, 1e3, 57)
CHERNOFF_LOWER_S = np.geomspace(1e-3, 60.0, 48)


def chernoff_lower_delta(parts: Sequence[tuple[StepCGF, int]], eps, t=CHERNOFF_LOWER_T,
                         s=CHERNOFF_LOWER_S) -> np.ndarray:
    """A certified lower bound on delta(eps) of the composition ``parts`` ((CGF, count) of one
    branch's *lower* pairs): for every s > 0 and t > 0 (docs/MATH.md 6.5),

        delta(eps) >= (1 - e^-s) P(L > eps + s) >= (1 - e^-s) (1 - e^{K(-t) + t (eps + s)}),

    the second by Markov's inequality for e^{-tL}, and for t <= 1, as min(1, x) <= x^t,

        delta(eps) = 1 - E min(1, e^{eps - L}) >= 1 - e^{K(-t) + t eps};

    maximised over the grids ``t`` and ``s``.  The
    exponent is widened as the upper bound's, plus 1e-14 per step for the quadratures' absolute
    error, and the result rounded down.  A +inf mass only raises delta (the CGFs describe the finite
    part).  0 where nothing is certified: the bound is meant for delta near 1 (long compositions,
    whose loss lies far above eps), where the grids' lower ends are loosest."""
    eps = np.atleast_1d(np.asarray(eps, float))
    t, s = np.asarray(t, float), np.asarray(s, float)
    with np.errstate(over="ignore", invalid="ignore"):
        K = np.zeros(t.shape)
        absK = np.zeros(t.shape)
        for c, k in parts:
            v = k * c.cumulants(-t)[0]
            K, absK = K + v, absK + np.abs(v)
        n = sum(k for _, k in parts)
        K = np.where(np.isfinite(K), K, np.inf)
        a = eps[:, None, None] + s[None, :, None]
        lg = K + t * a + 1e-9 * (absK + t * np.abs(a)) + 1e-6 + 1e-14 * n
        lg = np.where(np.isfinite(lg), lg, np.inf).min(axis=2)
        lb = -np.expm1(-s)[None, :] * -np.expm1(np.minimum(lg, 0.0))
        # and for t <= 1: 1 - delta(eps) = E min(1, e^{eps - L}) <= E e^{t (eps - L)} = e^{K(-t) + t eps}
        lg1 = np.where(t <= 1.0, K + t * eps[:, None] + 1e-9 * (absK + t * np.abs(eps[:, None])) + 1e-6 + 1e-14 * n,
                       np.inf)
        lb1 = -np.expm1(np.minimum(np.where(np.isfinite(lg1), lg1, np.inf).min(axis=1), 0.0))
    lb = np.maximum(np.nan_to_num(lb, nan=0.0).max(axis=1), np.nan_to_num(lb1, nan=0.0))
    return np.maximum(lb * (1.0 - 8.0 * np.finfo(float).eps), 0.0)


def chernoff_delta(parts, eps) -> np.ndarray:
    """:func:`chernoff_log_delta` as a delta: a bound that underflows is the smallest positive
    double (5e-324), never 0; at most 1."""
    lg = chernoff_log_delta(parts, eps)
    with np.errstate(under="ignore", over="ignore"):
        d = np.minimum(np.exp(lg), 1.0)
    return np.where(d > 0, d, 5e-324)
