"""The saddle-point accountant (SPA; seed 004, docs/MATH.md section 6).

For the composition Y = L_1 + ... + L_k of independent single-step privacy
losses (one dominating pair per step), with composed CGF K_Y = sum_i K_i
(:mod:`pldlib.methods.cgf`), the hockey-stick curve has the exact representation, for
every tilt t > 0,

    delta(eps) = e^{K_Y(t) - t eps} E[psi_t(Y_t - eps)],
    psi_t(w)   = (1 - e^{-w}) e^{-t w} 1{w > 0},                            (*)

where Y_t is the t-tilted sum (a sum of independent tilted steps, mean
K_Y'(t), variance K_Y''(t)).  The saddle point t_hat > 0 solves
K_Y'(t) = eps + 1/t + 1/(1 + t).  Approximations (all at t_hat):

* **SP-MSD0**  exp(phi) / sqrt(2 pi phi2)
* **SP-MSD1**  SP-MSD0 * (1 + phi4 / (8 phi2^2) - 5 phi3^2 / (24 phi2^3))   -- the estimate
* **SP-CLT**   (*) with Y_t replaced by a Gaussian of the same mean and variance
  (closed form with Phi, evaluated in log space with the scaled complementary
  error function so nothing overflows)

with phi(t) = K_Y(t) - t eps - ln t - ln(1 + t) and phi2, phi3, phi4 its
derivatives (docs/MATH.md section 6).  These carry **no guarantee**.

Certified bounds (``lower``/``upper`` of every result)
-----------------------------------------------------
* **Berry-Esseen around SP-CLT** (the seed's Theorem 5).  For any t > 0,
  psi_t is unimodal on w > 0 with maximum g_max(t) = (1/(1+t)) (t/(1+t))^t,
  so E psi_t(X) = Integral_0^{g_max} P(psi_t(X) > u) du and each level set is
  an interval; hence |E psi_t(X) - E psi_t(W)| <= 2 g_max(t) sup_w |F_X - F_W|.
  The Berry-Esseen theorem for the (standardised) sum of independent tilted
  steps bounds the Kolmogorov distance by C * sum_i rho_i(t) / K_Y''(t)^{3/2}
  with rho_i the tilted third absolute central moments, C = 0.4748 for
  identically distributed steps (Shevtsova 2011) and C = 0.5600 for
  heterogeneous sequences (Shevtsova 2010).  Therefore

      |delta(eps) - SPCLT_t(eps)| <= e^{K_Y(t) - t eps} 2 g_max(t) C sum_i rho_i / K_Y''^{3/2}.

  *Assumptions*: the steps are independent (true for the product dominating
  pairs composed here, adaptive composition included, docs/MATH.md section 0);
  each tilted step has a finite third moment (every supported loss is
  bounded or Gaussian-tailed, so the CGF is finite for all t); the cumulants
  and rho are computed accurately -- they come from the quadratures of
  :mod:`pldlib.methods.cgf` (relative error ~1e-12, verified in the tests), and the
  bounds are widened by a relative 1e-6 in delta (``SAFETY``) to cover that
  and floating point.  The bound holds for *every* t, so it is evaluated at
  exact grid nodes t_j near the saddle point (no interpolation enters a
  certified number) and the best node is kept.  A node where the tilted law is
  numerically degenerate (a lattice or bounded loss at a large tilt: all but
  e^-700 of the tilted mass on the top atom, so the tilted variance or rho is
  0 or below 1e-250 without relative accuracy) certifies nothing there.
* **Chernoff / improved moments accountant** (an upper bound needing no
  CLT): delta(eps) <= e^{K_Y(t) - t eps} g_max(t) for every t > 0 (since
  psi_t <= g_max); minimised over all grid nodes.  It keeps the upper bound
  honest when Berry-Esseen is useless (few steps).
* Trivial bounds: 1 - e^eps <= delta(eps) <= 1, delta(eps) = 0 for
  eps >= k * ess sup L (bounded losses: the add direction, Laplace; k * ess sup L
  is rounded up to the next double, :func:`~pldlib.methods.cgf.sum_up`), and
  delta >= P(Y = +inf).  When Berry-Esseen cannot certify a lower bound (its
  error exceeds the SP-CLT value, typically for few steps or strongly
  skewed tilted steps) the lower end falls back to these trivial bounds: the
  interval is wide but never wrong.

eps(delta) is found by monotone root finding: the estimates by following the
saddle-point curve t -> (eps(t), delta(t)) (eps(t) = K_Y'(t) - 1/t - 1/(1+t)
is increasing in t), the certified bounds by bisection in eps of each node's
bound, which is monotone in eps (for the lower bound the bisection keeps a
point where the bound exceeds delta, so the result is valid even where it is
not monotone).

The single-step CGF is tabulated once on a log-spaced t-grid (default 1e-5 to
1e4, 32 nodes per decade) with K, K', ..., K^(5) and rho; between nodes K,
K', K'' and K''' are quintic Hermite interpolants (exact derivatives at both
ends) and the fourth cumulant cubic Hermite.  The grid is refined where an
a-posteriori check at interval midpoints finds an interpolant off by more than
a relative 1e-10 (K), 1e-8 (K'), 1e-5 (K''; third and fourth cumulants relative
to K''^(3/2), K''^2): sharp transitions of the tilted law (small sigma, small q)
get many nodes, within 1500 nodes and 5 s of the build (what is left unchecked
is marked: an estimate there is flagged, the certified bounds use nodes only).
Composition scales or sums these
tables, so a grid of (steps, delta) cells costs microseconds per cell after
the one-off CGF work (:meth:`SPAAccountant.epsilon_grid`).

Edges.  Where the saddle point falls outside the t-grid (delta close to 1, or
eps close to k * ess sup L where delta is astronomically small) or the MSD1
correction factor is not positive, the estimates are NaN and the cell is
flagged; by default (``on_edge="raise"``) :meth:`SPAAccountant.delta` and
:meth:`SPAAccountant.epsilon` then raise :class:`~pldlib.PrecisionLimitError`;
with ``on_edge="flag"`` (or ``return_flags=True``) they return NaN estimates
with certified bounds and the flags.

Branches (add/remove, WOR substitution's max-profile) are composed
separately and the answers maximised afterwards (docs/MATH.md section 2).  For WOR
substitution the estimate and the upper bound use the max-profile (an upper
bound of the true curve), the lower bound the remove pair.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np
from scipy import special

from .. import _validate as V
from .. import events as E
from .._validate import PrecisionLimitError
from . import few_summands as FS
from . import single_step as SS
from .base import Accountant, Interval, branch_labels, components_of
from .cgf import ComposedCGF, log_gmax, mechanism_cgfs, mul_up

__all__ = [
    "account_spa",
    "SPAAccountant",
    "C_BE_IID",
    "C_BE",
    "FLAG_T_LOW",
    "FLAG_T_HIGH",
    "FLAG_MSD1",
    "FLAG_NO_LOWER",
    "FLAG_INTERP",
    "sp_log_delta",
]

#: Berry-Esseen constants: identically distributed steps / independent heterogeneous steps
C_BE_IID = 0.4748
C_BE = 0.5600
#: relative widening of certified deltas (quadrature and floating-point error allowance)
SAFETY = 1e-6

FLAG_T_LOW = 1    # saddle point below the t-grid (delta close to 1 / eps very negative)
FLAG_T_HIGH = 2   # saddle point above the t-grid (eps near k * ess sup L)
FLAG_MSD1 = 4     # MSD1 correction factor not positive
FLAG_NO_LOWER = 8  # Berry-Esseen gave no lower bound: the lower end is the trivial bound
FLAG_INTERP = 16  # saddle point in a t-interval where the CGF interpolation could not be resolved
_EST_FLAGS = FLAG_T_LOW | FLAG_T_HIGH | FLAG_MSD1 | FLAG_INTERP

_METHODS = ("msd0", "msd1", "clt")
#: offsets (in sd of the composed tilted loss) around a node's saddle eps, scanned for a lower bound
_LOWER_CANDIDATES = np.array([2.5, 1.5, 1, 0.6, 0.35, 0.2, 0.1, 0.0, -0.2, -0.6, -1.5], dtype=float)
_LOG_2PI = math.log(2 * math.pi)
#: tilted variances / third absolute moments below this are treated as degenerate (no relative accuracy)
_TINY_MOMENT = 1e-250
_SQRT2 = math.sqrt(2.0)


# ---------------------------------------------------------------------------------------------
# formulas (vectorised numpy)
# ---------------------------------------------------------------------------------------------
_log_gmax = log_gmax  # (ln max_w psi_t(w), docs/MATH.md 6.5)


def _log_gauss_tilt(m, v, a, sd=None):
    """ln E[e^{-a W} 1{W > 0}], W ~ N(m, v), a > 0 (no overflow: Mills ratio form).

    E = exp(-a m + a^2 v / 2) Phi(-x) with x = (a v - m) / sd; for x >= 0 this is
    exp(-m^2 / 2v) erfcx(x / sqrt 2) / 2, which neither overflows nor cancels.
    """
    m, v, a = np.broadcast_arrays(np.asarray(m, float), np.asarray(v, float), np.asarray(a, float))
    if sd is None:
        sd = np.sqrt(v)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        x = (a * v - m) / sd
        out = np.log(0.5 * special.erfcx(np.maximum(x, 0.0) * (1.0 / _SQRT2))) - m * m / (2 * v)
        neg = x < 0
        if neg.any():
            mn, vn, an = m[neg], v[neg], a[neg]
            out[neg] = -an * mn + 0.5 * an * an * vn + special.log_ndtr(-x[neg])
        # v = 0 (a degenerate tilted law): W = m, E = e^{-a m} 1{m > 0}
        deg = ~(v > 0)
        if deg.any():
            out = np.where(deg, np.where(m > 0, -a * m, -np.inf), out)
    return out


def _log_ew(m, v, t):
    """ln E[(1 - e^{-W}) e^{-t W} 1{W > 0}], W ~ N(m, v)."""
    sd = np.sqrt(v)
    a1 = _log_gauss_tilt(m, v, t, sd)
    a2 = _log_gauss_tilt(m, v, t + 1.0, sd)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = a1 + np.log(-np.expm1(np.minimum(a2 - a1, 0.0)))
    return np.where(a1 == -np.inf, -np.inf, out)  # P(W > 0) = 0 (degenerate W <= 0)


def sp_log_delta(method: str, K, K1, K2, K3, K4, t, eps):
    """ln delta of SP-MSD0 / SP-MSD1 / SP-CLT at tilt t for composed cumulants (vectorised).

    The formulas of docs/MATH.md section 6; t is normally the saddle point (then
    K1 = eps + 1/t + 1/(1+t)), but any t > 0 is accepted.  MSD1 returns NaN
    where its correction factor is not positive.
    """
    t = np.asarray(t, float)
    if method == "clt":
        return K - t * eps + _log_ew(K1 - eps, K2, t)
    phi = K - t * eps - np.log(t) - np.log1p(t)
    phi2 = K2 + 1.0 / t**2 + 1.0 / (1.0 + t) ** 2
    out = phi - 0.5 * (_LOG_2PI + np.log(phi2))
    if method == "msd0":
        return out
    if method != "msd1":
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    phi3 = K3 - 2.0 / t**3 - 2.0 / (1.0 + t) ** 3
    phi4 = K4 + 6.0 / t**4 + 6.0 / (1.0 + t) ** 4
    corr = 1.0 + phi4 / (8.0 * phi2**2) - 5.0 * phi3**2 / (24.0 * phi2**3)
    with np.errstate(invalid="ignore", divide="ignore"):
        return out + np.where(corr > 0, np.log(np.where(corr > 0, corr, 1.0)), np.nan)


def _illinois(f, a, b, fa, fb, n_iter):
    """Vectorised Illinois (modified regula falsi) on brackets with f(a) > 0 >= f(b).

    Returns the final (a, b): the invariant f(a) > 0 >= f(b) is kept at every
    step, so a and b stay valid one-sided answers whatever the convergence.
    """
    side = np.zeros(np.shape(a), dtype=np.int8)
    for _ in range(n_iter):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            c = b - fb * (b - a) / (fb - fa)
        bad = ~((c > a) & (c < b)) | ~np.isfinite(c)
        c = np.where(bad, 0.5 * (a + b), c)
        fc = f(c)
        pos = fc > 0
        # Illinois: halve the stale end's value when the same end is kept twice
        fb = np.where(pos & (side == 1), 0.5 * fb, fb)
        fa = np.where(~pos & (side == -1), 0.5 * fa, fa)
        a = np.where(pos, c, a)
        fa = np.where(pos, fc, fa)
        b = np.where(pos, b, c)
        fb = np.where(pos, fb, fc)
        side = np.where(pos, 1, -1).astype(np.int8)
    return a, b


def _hermite5(u, h, f0, d0, s0, f1, d1, s1):
    u2 = u * u
    u3 = u2 * u
    u4 = u3 * u
    u5 = u4 * u
    H0 = 1 - 10 * u3 + 15 * u4 - 6 * u5
    H1 = u - 6 * u3 + 8 * u4 - 3 * u5
    H2 = 0.5 * (u2 - 3 * u3 + 3 * u4 - u5)
    H3 = 10 * u3 - 15 * u4 + 6 * u5
    H4 = -4 * u3 + 7 * u4 - 3 * u5
    H5 = 0.5 * (u3 - 2 * u4 + u5)
    return f0 * H0 + h * d0 * H1 + h * h * s0 * H2 + f1 * H3 + h * d1 * H4 + h * h * s1 * H5


def _hermite3(u, h, f0, d0, f1, d1):
    u2 = u * u
    u3 = u2 * u
    return f0 * (2 * u3 - 3 * u2 + 1) + h * d0 * (u3 - 2 * u2 + u) + f1 * (3 * u2 - 2 * u3) + h * d1 * (u3 - u2)


#: tolerances of the Hermite interpolants of K, K', K'' between t-nodes (relative to natural scales)
#: (plus absolute floors near the quadrature's own noise: K is a log of a sum ~ 1, so its absolute
#: error is ~1e-16 whatever its size)
_TOL_K, _TOL_K1, _TOL_K2 = 1e-10, 1e-8, 1e-5
_FLOOR_K = 1e-14
_TOL_K34 = 1e-5  # third and fourth cumulants only enter the MSD1 correction


def _interp_error_too_big(tab, mids, idx, exact, loose: bool = False) -> np.ndarray:
    """Whether the interpolants at the midpoints of intervals ``idx`` miss the exact cumulants."""
    f = 100.0 if loose else 1.0
    K, K1, K2, K3, K4 = tab.interp(mids, idx)
    eK, eK1, eK2, eK3, eK4 = exact[0], exact[1], exact[2], exact[3], exact[4]
    scale_k = np.abs(eK) + mids * np.abs(eK1) + mids**2 * np.abs(eK2) + 1e-300
    scale_k1 = np.abs(eK1) + mids * np.abs(eK2) + 1e-300
    with np.errstate(invalid="ignore"):
        return ~((np.abs(K - eK) <= f * _TOL_K * scale_k + _FLOOR_K)
                 & (np.abs(K1 - eK1) <= f * _TOL_K1 * scale_k1)
                 & (np.abs(K2 - eK2) <= f * _TOL_K2 * (np.abs(eK2) + 1e-300))
                 & (np.abs(K3 - eK3) <= f * _TOL_K34 * (np.abs(eK2) ** 1.5 + 1e-300))
                 & (np.abs(K4 - eK4) <= f * _TOL_K34 * (eK2**2 + 1e-300)))


class _Table:
    """Cumulants of one (composed) CGF on the t-grid: arrays of shape (N,)."""

    def __init__(self, tgrid: np.ndarray, cum: np.ndarray, p_inf: float, loss_sup: float, c_be: float,
                 log_fin_per_unit: float):
        self.t = tgrid
        self.K, self.K1, self.K2, self.K3, self.K4, self.rho, self.K5 = cum
        self.p_inf = p_inf
        self.loss_sup = loss_sup
        self.c_be = c_be
        self.log_fin = log_fin_per_unit  # ln P(Y finite) per unit of scale
        self.lgmax = _log_gmax(tgrid)
        self.lt = np.log(tgrid)

    def interp(self, t, j):
        """(K, K1, K2, K3, K4) at t in [t_j, t_{j+1}] (Hermite interpolation)."""
        t0, t1 = self.t[j], self.t[j + 1]
        h = t1 - t0
        u = (t - t0) / h
        K = _hermite5(u, h, self.K[j], self.K1[j], self.K2[j], self.K[j + 1], self.K1[j + 1], self.K2[j + 1])
        K1 = _hermite5(u, h, self.K1[j], self.K2[j], self.K3[j], self.K1[j + 1], self.K2[j + 1], self.K3[j + 1])
        K2 = _hermite5(u, h, self.K2[j], self.K3[j], self.K4[j], self.K2[j + 1], self.K3[j + 1], self.K4[j + 1])
        K3 = _hermite5(u, h, self.K3[j], self.K4[j], self.K5[j], self.K3[j + 1], self.K4[j + 1], self.K5[j + 1])
        K4 = _hermite3(u, h, self.K4[j], self.K5[j], self.K4[j + 1], self.K5[j + 1])
        return K, K1, K2, K3, K4


# ---------------------------------------------------------------------------------------------
# the accountant
# ---------------------------------------------------------------------------------------------
def account_spa(mechanism, steps: int | None = None, *, t_range=(1e-5, 1e4), nodes_per_decade: int = 32,
                on_edge: str = "raise") -> "SPAAccountant":
    """Saddle-point accountant for ``steps`` compositions of ``mechanism`` (or a list of (mechanism, steps)).

    Returns an :class:`SPAAccountant`; its ``delta(eps)`` / ``epsilon(delta)``
    give :class:`~pldlib.Interval` (lower, upper, estimate = SP-MSD1):
    ``lower``/``upper`` are certified (Berry-Esseen + Chernoff, see the
    module docstring), the estimate is an approximation.

    Examples
    --------
    >>> acc = account_spa(Gaussian(sigma=1.0, q=0.01, sampling="poisson"), steps=10_000)
    >>> acc.epsilon(1e-6)   # Interval(lower=..., upper=..., estimate=...)
    """
    return SPAAccountant.for_mechanism(mechanism, steps, t_range=t_range, nodes_per_decade=nodes_per_decade,
                                       on_edge=on_edge)


class SPAAccountant(Accountant):
    """Saddle-point accounting (docs/MATH.md section 7; see :func:`account_spa`).

    ``SPAAccountant(relation, t_range=..., nodes_per_decade=32, on_edge="raise")
    .compose(event, count)``; answers are :class:`Interval`: certified lower and
    upper (Berry-Esseen + Chernoff) around the SP-MSD1 estimate (no guarantee).
    """

    method = "spa"
    #: a few summands also read the PLD accountant's certified ends (:mod:`.few_summands`)
    few_summands_pld = True
    kind = "certified"

    def __init__(self, relation: str = "add_remove", *, t_range=(1e-5, 1e4), nodes_per_decade: int = 32,
                 on_edge: str = "raise"):
        super().__init__(relation)
        if on_edge not in ("raise", "flag"):
            raise ValueError(f"on_edge must be 'raise' or 'flag', got {on_edge!r}")
        t_lo, t_hi = float(t_range[0]), float(t_range[1])
        if not (0 < t_lo < t_hi < math.inf):
            got = ("(" + ", ".join(V.fmt(t) for t in t_range) + ")") if isinstance(t_range, (tuple, list)) \
                else V.fmt(t_range)
            raise ValueError(f"t_range must satisfy 0 < lo < hi < inf, got {got}")
        self.on_edge = on_edge
        # Berry-Esseen is evaluated at these node offsets from the saddle point (32 nodes per decade
        # by default: the lower bound is often best at a few times smaller t than the saddle point)
        self.upper_ratios = 10.0 ** (np.array([-6, -3, -1, 0, 1]) / 32.0)
        self.lower_ratios = 10.0 ** (np.array([-28, -16, -8, -3, 0]) / 32.0)
        self.n_iter = 14     # Illinois iterations for the certified eps
        self.max_refine = 6   # levels of grid refinement where the interpolants are not accurate
        self.max_nodes = 1500  # node budget for the refinement
        #: the refinement stops (marking what it has not checked) where its next level would end
        #: after this many seconds of the build, so that a call stays within the library's 10 s
        self.refine_seconds = 5.0
        self.t_range = (t_lo, t_hi)
        self.nodes_per_decade = nodes_per_decade

    def _unsupported(self, step):
        if isinstance(step.event, E.WithReplacementGaussianEvent):
            # (its pair mixes many shifted Gaussians, whose cumulant tables did not end within a minute)
            return ("sampling with replacement is accounted by the PLD accountant only (method 'pld'), not by "
                    "the saddle-point one")
        return super()._unsupported(step)

    def _options(self) -> dict:
        return {"t_range": self.t_range, "nodes_per_decade": self.nodes_per_decade, "on_edge": self.on_edge}

    def epsilon_per_steps(self, event, steps, deltas):
        """As :meth:`Accountant.epsilon_per_steps`, from one CGF table for all steps values
        (:meth:`epsilon_grid`); the estimate is SP-MSD1 clipped into the certified interval."""
        acc = self.fresh().compose(event, 1)
        acc._ensure_built()
        lo, est, up = acc.epsilon_grid(np.asarray(steps), np.asarray(deltas, dtype=float))
        return np.asarray(lo, float), np.asarray(est, float), np.asarray(up, float), []

    def _tables(self, event, steps, deltas, fprs):
        """As :meth:`Accountant._tables`, from one CGF table for all steps values: the
        epsilons by :meth:`epsilon_grid`, the TPRs from accountants whose composed tables are the
        one-step table scaled by the count (:meth:`_scaled`)."""
        from ..pld.tradeoff import alpha_array
        from .base import StepsTables

        fprs = alpha_array("fprs", fprs)
        ks = [V.steps(f"steps[{i}]", k) for i, k in enumerate(steps)]
        one = self.fresh().compose(event, 1)
        one._ensure_built()
        lo, est, up = one.epsilon_grid(np.asarray(ks), np.asarray(deltas, dtype=float))
        tlo, tup, tnotes, why = self._tpr_table(ks, fprs, one._scaled)
        return StepsTables(np.asarray(lo, float), np.asarray(est, float), np.asarray(up, float), [],
                           tlo, tup, tnotes, why)

    def _scaled(self, k: int) -> "SPAAccountant":
        """The accountant of ``k`` runs of this built one-step accountant's single mechanism,
        sharing its tables: identical to building it (the t-grid and its refinement depend on the
        one-step CGFs only; the composed cumulants are k times the one-step ones, P(Y finite) the
        k-th power, the loss supremum k times)."""
        if not self.single or self._steps[0][1] != 1:
            new = self.fresh().compose(self._steps[0][0].event, int(k))
            new._ensure_built()
            return new
        k = int(k)
        new = self.fresh()
        new._steps = [(self._steps[0][0], k)]

        def scale(tab):
            cum = np.array([tab.K, tab.K1, tab.K2, tab.K3, tab.K4, tab.rho, tab.K5])
            log_fin = k * tab.log_fin
            return _Table(tab.t, k * cum, -math.expm1(log_fin) if tab.p_inf > 0 else 0.0, mul_up(k, tab.loss_sup),
                          C_BE_IID, log_fin)

        branches = []
        for lab, sides in self._branches:
            ns = {3: sides[3], 4: sides[4], 1: scale(sides[3])}
            ns[2] = ns[1] if sides[2] is sides[1] else scale(sides[4])
            branches.append((lab, ns))
        new.tgrid, new.unresolved, new._labels, new.single = self.tgrid, self.unresolved, self._labels, True
        new._branches = branches
        new.setup_seconds = 0.0
        new._built = True
        new._built_keys = ("tgrid", "unresolved", "_labels", "single", "_branches", "setup_seconds")
        return new

    def _build(self):
        components = self.components
        t_lo, t_hi = self.t_range
        nodes_per_decade = self.nodes_per_decade
        t0 = time.perf_counter()
        n = int(math.ceil(math.log10(t_hi / t_lo) * nodes_per_decade)) + 1
        self.tgrid = np.geomspace(t_lo, t_hi, n)
        per_comp = [mechanism_cgfs(m) for m, _ in components]
        labels = branch_labels(per_comp)
        self._labels = labels
        # one shared t-grid for every CGF, refined where a cumulant table changes abruptly
        cgfs = {}
        for bl in per_comp:
            for _, up, lo in bl:
                cgfs[id(up)] = up
                cgfs[id(lo)] = lo
        tg = self.tgrid
        t_cum = time.perf_counter()
        cums = {key: c.cumulants(tg) for key, c in cgfs.items()}
        per_node = (time.perf_counter() - t_cum) / tg.size  # (seconds per node, every CGF)
        # a-posteriori check of the Hermite interpolants at every interval's midpoint; where one
        # is off by more than the tolerance the midpoint joins the grid and both halves are checked
        check = np.ones(tg.size - 1, dtype=bool)
        unresolved = np.zeros(tg.size - 1, dtype=bool)
        for level in range(self.max_refine + 1):
            idx = np.nonzero(check)[0]
            if idx.size == 0:
                break
            if time.perf_counter() - t0 + idx.size * per_node > self.refine_seconds:
                # out of time: the intervals still to check are marked unresolved (an estimate whose
                # saddle point falls in one is flagged; the certified bounds use nodes only)
                unresolved[idx] = True
                break
            mids = np.sqrt(tg[idx] * tg[idx + 1])
            t_cum = time.perf_counter()
            new_c = {key: cgfs[key].cumulants(mids) for key in cgfs}
            per_node = max(per_node, (time.perf_counter() - t_cum) / idx.size)
            last = level == self.max_refine or tg.size + idx.size > self.max_nodes
            bad = np.zeros(idx.size, dtype=bool)
            for key in cgfs:
                tab = _Table(tg, cums[key], 0.0, math.inf, C_BE, 0.0)
                bad |= _interp_error_too_big(tab, mids, idx, new_c[key], loose=last)
            if last:
                # out of budget: intervals still off by 100x the tolerance are marked, and an
                # estimate whose saddle point falls in one is flagged (bounds use nodes only)
                unresolved[idx[bad]] = True
                break
            add = idx[bad]
            if add.size == 0:
                break
            keep_mids = mids[bad]
            all_t = np.concatenate([tg, keep_mids])
            order = np.argsort(all_t, kind="stable")
            cums = {key: np.concatenate([cums[key], new_c[key][:, bad]], axis=1)[:, order] for key in cgfs}
            tg = all_t[order]
            # check the two halves of every refined interval next
            newpos = np.searchsorted(tg, keep_mids)
            check = np.zeros(tg.size - 1, dtype=bool)
            check[newpos - 1] = True
            check[newpos] = True
            unresolved = np.zeros(tg.size - 1, dtype=bool)
        self.tgrid = tg
        self.unresolved = unresolved

        def table(cgf):
            return cums[id(cgf)]

        self.single = len(components) == 1
        c_be = C_BE_IID if self.single else C_BE
        self._branches = []  # (label, sides): 1/2 = composed upper/lower, 3/4 = one step (single only)
        for lab in labels:
            parts = {1: [], 2: []}
            for (m, k), bl in zip(components, per_comp):
                b = next((b for b in bl if b[0] == lab), bl[0])
                parts[1].append((b[1], k))
                parts[2].append((b[2], k))
            same = all(a[0] is b[0] for a, b in zip(parts[1], parts[2]))
            sides = {}
            for which in (1, 2):
                if which == 2 and same:
                    sides[2] = sides[1]
                    if self.single:
                        sides[4] = sides[3]
                    continue
                pr = parts[which]
                comp = ComposedCGF(pr)
                cum = sum(k * table(c) for c, k in pr)
                log_fin = sum(k * math.log1p(-c.p_inf) for c, k in pr if c.p_inf > 0)
                sides[which] = _Table(self.tgrid, cum, comp.p_inf, comp.loss_sup, c_be, log_fin)
                if self.single:
                    c, k = pr[0]
                    sides[which + 2] = _Table(self.tgrid, table(c), c.p_inf, c.loss_sup, C_BE_IID,
                                              math.log1p(-c.p_inf) if c.p_inf > 0 else 0.0)
            self._branches.append((lab, sides))
        self.setup_seconds = time.perf_counter() - t0

    # -----------------------------------------------------------------------------------------
    # core: cells given by (scale, target) with tables scaled by `scale`
    # -----------------------------------------------------------------------------------------
    @staticmethod
    def _saddle_curve(tab: _Table, scale):
        """eps_j = scale K1_j - 1/t_j - 1/(1+t_j) at the nodes, shape (S, N)."""
        t = tab.t
        return scale[:, None] * tab.K1[None, :] - 1.0 / t - 1.0 / (1.0 + t)

    @staticmethod
    def _node_log_delta(tab: _Table, scale, method):
        t = tab.t
        s = scale[:, None]
        e = s * tab.K1 - 1.0 / t - 1.0 / (1.0 + t)
        return sp_log_delta(method, s * tab.K, s * tab.K1, s * tab.K2, s * tab.K3, s * tab.K4, t, e)

    @staticmethod
    def _interp_at(tab, scale, t, j):
        K, K1, K2, K3, K4 = tab.interp(t, j)
        return scale * K, scale * K1, scale * K2, scale * K3, scale * K4

    def _solve_t(self, tab, scale_c, j, fn, target, n_iter=14):
        """Root of fn(t) = target on [t_j, t_{j+1}], fn decreasing (Illinois in ln t)."""
        lo = tab.lt[j].copy()
        hi = tab.lt[j + 1].copy()

        def f(u):
            return fn(np.exp(u)) - target

        flo, fhi = f(lo), f(hi)
        # the caller's bracket comes from node values; guard against round-off at the ends
        flo = np.where(flo > 0, flo, np.inf)
        fhi = np.where(fhi <= 0, fhi, -np.inf)
        a, b = _illinois(f, lo, hi, flo, fhi, n_iter)
        fa, fb = f(a), f(b)
        with np.errstate(invalid="ignore", divide="ignore"):
            c = b - fb * (b - a) / (fb - fa)
        c = np.where(np.isfinite(c) & (c >= a) & (c <= b), c, 0.5 * (a + b))
        return np.exp(c)

    def _be_log_err(self, tab, scale_c, jj):
        """ln of 2 g_max C sum rho / v^{3/2} at nodes jj (cells x window).

        +inf (the node certifies nothing) where the tilted law is numerically degenerate: a lattice
        or bounded loss at a large tilt puts all but e^-700 of the mass on its top atom, and the
        tilted variance and rho underflow to 0 or to subnormal numbers without relative accuracy
        (0/0 would be NaN, and a rho rounded to 0 would claim no error at all).
        """
        s = scale_c[:, None]
        rho1, v1 = tab.rho[jj], tab.K2[jj]
        good = (rho1 > _TINY_MOMENT) & (v1 > _TINY_MOMENT) & np.isfinite(rho1) & np.isfinite(v1)
        rho = s * np.where(good, rho1, 1.0) * (1 + SAFETY)
        v = s * np.where(good, v1, 1.0)
        out = math.log(2 * tab.c_be) + tab.lgmax[jj] + np.log(rho) - 1.5 * np.log(v)
        return np.where(good, out, np.inf)

    @staticmethod
    def _nearest(grid, t):
        """Index of the grid node nearest to t in log scale."""
        j = np.clip(np.searchsorted(grid, t), 1, grid.size - 1)
        left = np.log(t) - np.log(grid[j - 1]) < np.log(grid[j]) - np.log(t)
        return np.where(left, j - 1, j)

    # -- eps(delta) for one side -----------------------------------------------------------------
    def _eps_side(self, tab: _Table, scale_rows, row_idx, deltas, methods, certify_lower: bool = True,
                  certify_upper: bool = True):
        """Per cell: scale = scale_rows[row_idx], delta = deltas.  Returns dict of arrays."""
        n = deltas.size
        N = tab.t.size
        scale_c = scale_rows[row_idx]
        p_inf = -np.expm1(tab.log_fin * scale_c)
        with np.errstate(divide="ignore", invalid="ignore"):
            dc = (deltas - p_inf) / (1.0 - p_inf)
        dead = dc <= 0  # delta below the +inf mass: eps = inf
        dc = np.where(dead, 0.5, dc)
        target = np.log(dc)
        out = {"flags": np.zeros(n, dtype=np.int64), "t": np.full(n, np.nan)}
        # k * ess sup L rounded up (never claim delta = 0 or eps <= sup just below the true supremum)
        sup = np.array([mul_up(s, tab.loss_sup) for s in scale_rows])[row_idx]
        # ---- estimates along the saddle-point curve
        for meth in methods:
            ld_rows = self._node_log_delta(tab, scale_rows, meth)  # (S, N)
            est = np.full(n, np.nan)
            t_hat = np.full(n, np.nan)
            j = np.empty(n, dtype=np.int64)
            flags = np.zeros(n, dtype=np.int64)
            for r in np.unique(row_idx):
                sel = row_idx == r
                row = ld_rows[r]
                finite = np.isfinite(row)
                # first node at which the curve drops to/below the target
                below = (row[None, :] <= target[sel][:, None]) & finite[None, :]
                has = below.any(axis=1)
                first = np.where(has, below.argmax(axis=1), N)
                jj = first - 1
                f = np.zeros(sel.sum(), dtype=np.int64)
                f[first == 0] |= FLAG_T_LOW
                f[first == N] |= FLAG_T_HIGH
                # a NaN node just before the crossing (MSD1 correction) makes the bracket unusable
                bad_left = (jj >= 0) & (jj < N) & ~finite[np.clip(jj, 0, N - 1)]
                f[bad_left] |= FLAG_MSD1
                j[sel] = np.clip(jj, 0, N - 2)
                flags[sel] = f
            ok = flags == 0
            if ok.any():
                s_ok = scale_c[ok]
                j_ok = j[ok]

                def fn(t, s_ok=s_ok, j_ok=j_ok, meth=meth):
                    K, K1, K2, K3, K4 = self._interp_at(tab, s_ok, t, j_ok)
                    e = K1 - 1.0 / t - 1.0 / (1.0 + t)
                    v = sp_log_delta(meth, K, K1, K2, K3, K4, t, e)
                    return np.where(np.isnan(v), -np.inf, v)

                th = self._solve_t(tab, s_ok, j_ok, fn, target[ok])
                K, K1, K2, K3, K4 = self._interp_at(tab, s_ok, th, j_ok)
                est[ok] = K1 - 1.0 / th - 1.0 / (1.0 + th)
                t_hat[ok] = th
                unres = np.nonzero(ok)[0][self.unresolved[j_ok]]
                flags[unres] |= FLAG_INTERP
                est[unres] = np.nan
                if meth == "msd1":
                    chk = sp_log_delta(meth, K, K1, K2, K3, K4, th, est[ok])
                    badm = ~np.isfinite(chk)
                    idx = np.nonzero(ok)[0][badm]
                    flags[idx] |= FLAG_MSD1
                    est[idx] = np.nan
            est = np.minimum(est, np.where(np.isfinite(sup), sup, np.inf))
            est[dead] = np.inf
            flags[dead] = 0
            out[meth] = est
            if meth == "msd1" or (meth == methods[0] and "msd1" not in methods):
                out["t"] = t_hat
                out["flags"] |= flags
        # ---- certified bounds
        if not (certify_lower or certify_upper):
            out["lower"] = np.full(n, np.nan)
            out["upper"] = np.full(n, np.nan)
            return out
        lower = np.full(n, -np.inf)
        upper = np.full(n, np.inf)
        t_row = tab.t
        # Chernoff over all nodes: eps <= (s K_j + ln gmax_j - ln delta_c) / t_j
        jstar = np.empty(n, dtype=np.int64)
        for r in np.unique(row_idx):
            sel = row_idx == r
            A = (scale_rows[r] * tab.K + tab.lgmax) / t_row  # (N,)
            ec = A[None, :] - (target[sel] - SAFETY)[:, None] / t_row[None, :]
            jm = np.argmin(ec, axis=1)
            upper[sel] = ec[np.arange(sel.sum()), jm]
            jstar[sel] = jm
        # Berry-Esseen at nodes near given multiples of the saddle point (Chernoff's best node where
        # there is none)
        th = out["t"]
        tc = np.where(np.isfinite(th), th, t_row[jstar])

        def at(ratios):
            jj = self._nearest(t_row, tc[:, None] * np.asarray(ratios)[None, :])
            s2 = scale_c[:, None]
            return (jj, s2 * tab.K[jj], s2 * tab.K1[jj], s2 * tab.K2[jj], t_row[jj],
                    self._be_log_err(tab, scale_c, jj))

        jj, Kw, K1w, K2w, tw, lerr = at(self.upper_ratios)
        tg_u = (target - SAFETY)[:, None] * np.ones_like(tw)
        if certify_upper:
            # U(e) = e^{K - t e} (E_W(e) + err) is decreasing; E_W in [0, gmax] brackets its root
            # (a node whose Berry-Esseen error is +inf -- degenerate tilted law -- certifies nothing)
            be_ok = np.isfinite(lerr)
            lerr_u = np.where(be_ok, lerr, 0.0)

            def fU(e):
                return Kw - tw * e + np.logaddexp(_log_ew(K1w - e, K2w, tw), lerr_u) - tg_u

            lo = (Kw + lerr_u - tg_u) / tw - 1e-9 * (1 + np.abs(Kw / tw))
            hi = (Kw + np.logaddexp(tab.lgmax[jj], lerr_u) - tg_u) / tw
            lo, hi = _illinois(fU, lo, hi, fU(lo), fU(hi), self.n_iter)
            upper = np.minimum(upper, np.where(be_ok, hi, np.inf).min(axis=1))
        upper = np.minimum(upper, np.where(np.isfinite(sup), sup, np.inf))
        if certify_lower:
            jj, Kw, K1w, K2w, tw, lerr = at(self.lower_ratios)
            tg_l = (target + SAFETY)[:, None] * np.ones_like(tw)
            # L(e) = e^{K - t e} (E_W(e) - err): a point with L > delta_c below the certified upper
            # end, then Illinois keeping a valid point (L(a) > delta_c  =>  eps(delta) >= a)
            def fL(e):
                with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                    lew = _log_ew(K1w - e, K2w, tw)
                    diff = np.where(lew > lerr, lew + np.log(-np.expm1(np.minimum(lerr - lew, 0.0))), -np.inf)
                    return np.expm1(np.minimum(Kw - tw * e + diff - tg_l, 700.0))

            top = np.where(np.isfinite(upper), upper, 0.0)[:, None] * np.ones_like(tw)
            # candidates around each node's own saddle eps, where E_W is largest, spread by the sd
            e_node = K1w - 1.0 / tw - 1.0 / (1.0 + tw)
            sd = np.sqrt(K2w)
            cands = np.minimum(e_node[..., None] + sd[..., None] * _LOWER_CANDIDATES, top[..., None])
            ok = np.zeros(cands.shape, dtype=bool)
            for i in range(cands.shape[-1]):
                ok[..., i] = fL(cands[..., i]) > 0
            has = ok.any(axis=-1)
            first = np.argmax(ok, axis=-1)  # candidates decrease along the last axis
            best = np.where(has, np.take_along_axis(cands, first[..., None], -1)[..., 0], np.nan)
            prev_idx = np.maximum(first - 1, 0)
            right = np.where(first > 0, np.take_along_axis(cands, prev_idx[..., None], -1)[..., 0], top)
            have = ~np.isnan(best)
            a0 = np.where(have, best, 0.0)
            b0 = np.where(have, right, 1.0)
            fa, fb = fL(a0), fL(b0)
            a1, _ = _illinois(fL, a0, b0, np.where(have, fa, 1.0), np.where(have, np.minimum(fb, 0.0), -1.0),
                              self.n_iter)
            a1 = np.where(have & (fL(a1) > 0), a1, np.where(have, a0, -np.inf))
            lower = np.max(a1, axis=1)
        no_lower = ~(lower > -np.inf)
        trivial = np.log1p(-deltas)
        lower = np.maximum(lower, trivial)
        out["flags"] |= np.where(no_lower & certify_lower, FLAG_NO_LOWER, 0)
        lower = np.where(dead, np.inf, lower)
        upper = np.where(dead, np.inf, upper)
        lower = np.minimum(lower, upper)
        out["lower"], out["upper"] = lower, upper
        return out

    # -- delta(eps) for one side -----------------------------------------------------------------
    def _delta_side(self, tab: _Table, eps, methods, certify_lower=True, certify_upper=True):
        n = eps.size
        N = tab.t.size
        one = np.ones(1)
        out = {"flags": np.zeros(n, dtype=np.int64), "t": np.full(n, np.nan)}
        p_inf = -np.expm1(tab.log_fin)
        sup = tab.loss_sup  # rounded up when it was composed (mul_up, ComposedCGF)
        zero = eps >= sup  # delta_c = 0 exactly
        # saddle point
        curve = self._saddle_curve(tab, one)[0]
        first = np.searchsorted(curve, eps, side="right")  # nodes with curve <= eps
        flags = np.zeros(n, dtype=np.int64)
        flags[first == 0] |= FLAG_T_LOW
        flags[first == N] |= FLAG_T_HIGH
        j = np.clip(first - 1, 0, N - 2)
        ok = (flags == 0) & ~zero
        t_hat = np.full(n, np.nan)
        if ok.any():
            def fn(t):
                K, K1, *_ = tab.interp(t, j[ok])
                return -(K1 - 1.0 / t - 1.0 / (1.0 + t))  # decreasing in t

            t_hat[ok] = self._solve_t(tab, one, j[ok], fn, -eps[ok])
        unres = ok & self.unresolved[j]
        flags[unres] |= FLAG_INTERP
        ests = {}
        for meth in methods:
            v = np.full(n, np.nan)
            if ok.any():
                K, K1, K2, K3, K4 = tab.interp(t_hat[ok], j[ok])
                v[ok] = np.exp(sp_log_delta(meth, K, K1, K2, K3, K4, t_hat[ok], eps[ok]))
            v[unres] = np.nan
            if meth == "msd1":
                flags[ok & np.isnan(v)] |= FLAG_MSD1
            v[zero] = 0.0
            ests[meth] = v
        flags[zero] = 0
        # certified
        lg = tab.K[None, :] - tab.t[None, :] * eps[:, None] + tab.lgmax[None, :]  # (n, N)
        jstar = np.argmin(lg, axis=1)
        log_up = lg[np.arange(n), jstar]
        tc = np.where(np.isfinite(t_hat), t_hat, tab.t[jstar])
        e2 = eps[:, None]

        def at(ratios):
            jj = self._nearest(tab.t, tc[:, None] * np.asarray(ratios)[None, :])
            Kw, K1w, K2w, tw = tab.K[jj], tab.K1[jj], tab.K2[jj], tab.t[jj]
            return Kw - tw * e2, _log_ew(K1w - e2, K2w, tw), self._be_log_err(tab, np.ones(n), jj)

        if certify_upper:
            base, lew, lerr = at(self.upper_ratios)
            log_up = np.minimum(log_up, (base + np.logaddexp(lew, lerr)).min(axis=1))
        with np.errstate(under="ignore"):
            upper = np.minimum(np.exp(log_up) * (1 + SAFETY), 1.0)
        # below the true support edge delta > 0: a bound that underflows is carried up to the
        # smallest positive double, never claimed 0 (exactly 0 only where eps >= k * ess sup L)
        upper = np.where((upper == 0) & ~zero, 5e-324, upper)
        if certify_lower:
            base, lew, lerr = at(self.lower_ratios)
            with np.errstate(invalid="ignore", divide="ignore"):
                diff = np.where(lew > lerr, lew + np.log(-np.expm1(np.minimum(lerr - lew, 0.0))), -np.inf)
            lower = np.exp((base + diff).max(axis=1)) * (1 - SAFETY)
        else:
            lower = np.zeros(n)
        no_lower = ~(lower > 0)
        upper = np.where(zero, 0.0, upper)
        lower = np.where(zero, 0.0, lower)
        # recombine with the +inf atom: delta = P_inf + (1 - P_inf) delta_c
        for meth in methods:
            ests[meth] = p_inf + (1 - p_inf) * ests[meth]
        upper = np.minimum(p_inf + (1 - p_inf) * upper, 1.0)
        lower = p_inf + (1 - p_inf) * lower
        # trivial lower bound valid for the whole pair
        with np.errstate(over="ignore"):
            lower = np.maximum(lower, np.maximum(-np.expm1(eps), 0.0))
        lower = np.minimum(lower, upper)
        out.update(ests)
        out["lower"], out["upper"], out["t"] = lower, upper, t_hat
        out["flags"] = flags | np.where(no_lower & certify_lower & ~zero, FLAG_NO_LOWER, 0)
        return out

    # -----------------------------------------------------------------------------------------
    # combining branches
    # -----------------------------------------------------------------------------------------
    @staticmethod
    def _combine(results, methods):
        """Max over branches; a NaN estimate matters only if that branch could be the max."""
        out = {}
        lows = np.array([r["lower"] for r in results])
        ups = np.array([r["upper"] for r in results])
        out["lower"] = lows.max(axis=0)
        out["upper"] = ups.max(axis=0)
        flags = np.zeros_like(results[0]["flags"])
        for r in results:
            flags |= r["flags"] & FLAG_NO_LOWER
        flags = np.where(np.all([(r["flags"] & FLAG_NO_LOWER) > 0 for r in results], axis=0), flags, 0)
        for meth in methods:
            vals = np.array([r[meth] for r in results])
            with np.errstate(invalid="ignore"):
                best = np.where(np.all(np.isnan(vals), axis=0), np.nan, np.nanmax(
                    np.where(np.isnan(vals), -np.inf, vals), axis=0))
            # a flagged branch can be ignored where its certified upper end is below the others' lower end
            for r, v in zip(results, vals):
                relevant = np.isnan(v) & ~(r["upper"] < out["lower"])
                if meth == "msd1":
                    flags |= np.where(relevant, r["flags"] & _EST_FLAGS, 0)
                best = np.where(relevant, np.nan, best)
            out[meth] = best
        out["flags"] = flags
        pick = np.argmax(ups, axis=0)
        ts = np.array([r["t"] for r in results])
        out["t"] = np.take_along_axis(ts, pick[None, :], axis=0)[0]
        return out

    def _finish(self, res, scalar, return_flags, what):
        flags = res["flags"]
        bad = (flags & _EST_FLAGS) > 0
        if bad.any() and self.on_edge == "raise" and not return_flags:
            i = int(np.nonzero(bad)[0][0])
            why = []
            if flags[i] & FLAG_T_LOW:
                why.append("saddle point below the t-grid (delta near 1 or eps very negative)")
            if flags[i] & FLAG_T_HIGH:
                why.append("saddle point above the t-grid (eps near k * ess sup of the loss, "
                           "delta astronomically small)")
            if flags[i] & FLAG_MSD1:
                why.append("SP-MSD1 correction factor not positive")
            if flags[i] & FLAG_INTERP:
                why.append("saddle point where the tabulated CGF changes too abruptly to interpolate "
                           "(sharp transition of the tilted loss law; SPA is unreliable there)")
            raise PrecisionLimitError(
                f"SPA: no saddle-point estimate for {what}[{i}]: {'; '.join(why)}; certified bounds "
                f"[{res['lower'][i]:.6g}, {res['upper'][i]:.6g}] (use on_edge='flag' to get them with NaN "
                "estimates, or widen t_range)")
        # an estimate outside the certified interval is moved to its nearest end
        est = Interval(res["lower"], res["upper"], estimate=np.clip(res["msd1"], res["lower"], res["upper"]))
        if scalar:
            est = Interval(float(est.lower[0]), float(est.upper[0]), estimate=float(est.estimate[0]))
            flags = int(flags[0])
        return (est, flags) if return_flags else est

    # -----------------------------------------------------------------------------------------
    # public API
    # -----------------------------------------------------------------------------------------
    def delta_all(self, epsilon, methods=_METHODS) -> dict:
        """All of: 'lower', 'upper' (certified), 'msd0', 'msd1', 'clt' (estimates), 'flags', 't'."""
        eps = V.epsilon_array("epsilon", epsilon)
        res = []
        for _, sides in self._branches:
            up = self._delta_side(sides[1], eps, methods, certify_lower=sides[1] is sides[2])
            if sides[2] is not sides[1]:
                lo = self._delta_side(sides[2], eps, (), certify_upper=False)
                up["lower"] = np.minimum(lo["lower"], up["upper"])
                up["flags"] = (up["flags"] & ~FLAG_NO_LOWER) | (lo["flags"] & FLAG_NO_LOWER)
            res.append(up)
        return self._with_own_curve(self._combine(res, methods), eps, "delta")

    def _with_own_curve(self, out: dict, x: np.ndarray, kind: str) -> dict:
        """``out``'s certified ends intersected with the step's own curve where the composition is one
        step composed once (:mod:`pldlib.methods.single_step`, docs/MATH.md 0.8), where Berry-Esseen
        for one summand certifies little, and with the closed form of a composition that has one
        (randomized response: Berry-Esseen on a lattice loss).  The estimates are unchanged, except
        where the certified ends meet to 1e-9: there they are the ends' midpoint."""
        # one step composed once, a closed form: read exactly (docs/MATH.md 0.8, 12)
        lo, up = SS.known_ends(self, kind, x, out["lower"], out["upper"])
        # a few summands: the PLD accountant's certified ends too (docs/MATH.md 0.9)
        l2, u2 = FS.delta_bounds(self, x) if kind == "delta" else FS.epsilon_bounds(self, x)
        lo, up = SS.intersect(lo, up, l2, u2)
        neg = np.nonzero(x < 0)[0] if kind == "delta" else np.zeros(0, dtype=int)
        if neg.size and self._reversal_applies() and self._reversed() is self:
            # eps < 0: 1 - e^eps + e^eps delta_reversed(-eps) (docs/MATH.md 0.5), for the relations
            # that are their own reverse (add_remove, substitution: no second build)
            try:
                r = self.delta_all(-x[neg], ())
                l2, u2 = SS.from_reverse(x[neg], r["lower"], r["upper"])
                lo, up = lo.copy(), up.copy()
                lo[neg], up[neg] = SS.intersect(lo[neg], up[neg], l2, u2)
            except SS._SKIP + (TimeoutError,):  # (the reversed answer refused or too large: keep this one)
                pass
        flags = np.where(lo > out["lower"], out["flags"] & ~FLAG_NO_LOWER, out["flags"])
        # where the certified ends meet (to 1e-9) the number is known: its estimates are their
        # midpoint, with no saddle point needed (the flags of a missing estimate are cleared)
        with np.errstate(invalid="ignore"):
            tight = np.isfinite(lo) & np.isfinite(up) & (up - lo <= 1e-9 * np.abs(up))
        if tight.any():
            mid = lo + 0.5 * (up - lo)
            for m in ("msd0", "msd1", "clt"):
                if m in out:
                    out[m] = np.where(tight, mid, out[m])
            flags = np.where(tight, flags & ~_EST_FLAGS, flags)
        out["flags"] = flags
        out["lower"], out["upper"] = lo, up
        return out

    def _power(self, alpha: np.ndarray):
        """The generic certified power bounds (:meth:`Accountant._power`), intersected with the PLD
        accountant's for a few summands (:mod:`.few_summands`, docs/MATH.md 0.9)."""
        lo, up = super()._power(alpha)
        return SS.intersect(lo, up, *FS.power_bounds(self, alpha))

    def _tradeoff_top(self) -> float:
        # the certified upper eps(1e-12) even where the estimate is flagged (only the grid of the
        # trade-off bounds depends on it: its own bound, not read off exact curves, which cost more)
        try:
            out = self._eps_generic(np.ones(1), np.zeros(1, dtype=np.int64), np.array([1e-12]), ())
            return float(out["upper"][0])
        except (ArithmeticError, ValueError):
            return math.nan

    def _direction_deltas(self, eps: np.ndarray) -> list:
        """Certified (lower, upper) of each branch's own delta(eps) (trade-off curves, docs/MATH.md
        10.5): the Berry-Esseen / Chernoff / trivial bounds only, never an estimate (so no edge
        flag applies); the relation's power is the maximum of the branches' powers."""
        out = []
        one = SS.of_accountant(self)
        for label, sides in self._branches:
            up = self._delta_side(sides[1], eps, (), certify_lower=sides[1] is sides[2])
            lower = up["lower"]
            if sides[2] is not sides[1]:
                lower = self._delta_side(sides[2], eps, (), certify_upper=False)["lower"]
            l_, u = np.minimum(lower, up["upper"]), up["upper"]
            pair = SS.branch_of(one, label) if one is not None else None
            if pair is not None:  # one step composed once: its own curve (docs/MATH.md 0.8)
                l_, u = SS.intersect(l_, u, *SS.branch_delta_bounds(pair[0], pair[1], eps))
            out.append((l_, u))
        return out

    def delta(self, epsilon, return_flags: bool = False):
        """Interval(lower, upper, estimate=SP-MSD1) of delta(eps), vectorised over eps; lower/upper certified.

        The estimate is SP-MSD1 moved into [lower, upper] where it falls outside
        (``delta_all`` gives the raw values).  Flagged cells raise
        PrecisionLimitError unless ``on_edge="flag"`` or ``return_flags=True``
        (then: NaN estimate, certified bounds, and an int flag array).
        """
        scalar = np.ndim(epsilon) == 0
        return self._finish(self.delta_all(epsilon, ("msd1",)), scalar, return_flags, "epsilon")

    def _eps_generic(self, scale_rows, row_idx, deltas, methods, which_side_up=1, which_side_lo=2,
                     certify: bool = True):
        res = []
        for _, sides in self._branches:
            tu, tl = sides[which_side_up], sides[which_side_lo]
            up = self._eps_side(tu, scale_rows, row_idx, deltas, methods, certify_lower=certify and tu is tl,
                                certify_upper=certify)
            if tl is not tu and certify:
                lo = self._eps_side(tl, scale_rows, row_idx, deltas, (), certify_upper=True)
                up["lower"] = np.minimum(lo["lower"], up["upper"])
                up["flags"] = (up["flags"] & ~FLAG_NO_LOWER) | (lo["flags"] & FLAG_NO_LOWER)
            res.append(up)
        return self._combine(res, methods)

    def epsilon_all(self, delta, methods=_METHODS) -> dict:
        """All of: 'lower', 'upper' (certified), 'msd0', 'msd1', 'clt' (estimates), 'flags', 't'."""
        deltas = V.delta_array("delta", delta)
        out = self._eps_generic(np.ones(1), np.zeros(deltas.size, dtype=np.int64), deltas, methods)
        return self._with_own_curve(out, deltas, "eps")

    def epsilon(self, delta, return_flags: bool = False):
        """Interval(lower, upper, estimate=SP-MSD1) of eps(delta), vectorised over delta; lower/upper certified.

        Same conventions as :meth:`delta`.  ``lower`` falls back to ln(1 - delta)
        where Berry-Esseen certifies nothing (flag FLAG_NO_LOWER, informational).
        """
        scalar = np.ndim(delta) == 0
        return self._finish(self.epsilon_all(delta, ("msd1",)), scalar, return_flags, "delta")

    def epsilon_grid(self, steps, deltas, return_flags: bool = False, methods=None, certify: bool = True):
        """eps on a (steps x delta) grid for this accountant's single mechanism.

        ``steps`` replaces the accountant's step count.  Returns
        ``(lower, estimate, upper)`` arrays of shape ``(len(steps), len(deltas))``
        (lower/upper certified, estimate = SP-MSD1), plus ``flags`` with
        ``return_flags=True``; with ``methods`` (e.g. ``("msd0", "msd1", "clt")``)
        a dict of all of them instead.  Cells whose estimate is flagged are
        NaN (never raised here).  The estimate is SP-MSD1 moved into the certified
        interval where it falls outside it (the ``methods`` dict holds the raw values).
        ``certify=False`` skips the certified bounds (NaN): estimates only, a few
        microseconds per cell on large grids.
        """
        if not self.single:
            raise ValueError("epsilon_grid: needs an accountant for a single mechanism (not a sequence)")
        steps = np.atleast_1d(np.asarray(steps))
        if steps.ndim != 1 or steps.size == 0:
            raise ValueError("steps must be a non-empty 1-d list of integers >= 1")
        scale_rows = np.array([V.steps("steps", s) for s in steps.tolist()], dtype=float)
        deltas = V.delta_array("delta", deltas)
        S, D = scale_rows.size, deltas.size
        row_idx = np.repeat(np.arange(S), D)
        dd = np.tile(deltas, S)
        meths = tuple(methods) if methods is not None else ("msd1",)
        res = self._eps_generic(scale_rows, row_idx, dd, meths, 3, 4, certify=certify)
        shaped = {k: v.reshape(S, D) for k, v in res.items()}
        if methods is not None:
            return shaped
        est = shaped["msd1"] if not certify else np.clip(shaped["msd1"], shaped["lower"], shaped["upper"])
        out = (shaped["lower"], est, shaped["upper"])
        return out + (shaped["flags"],) if return_flags else out
