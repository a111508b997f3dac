"""Baseline accountants to report against -- never the main answer (MATH.md section 7).

* :func:`account_rdp` -- the moments accountant / Renyi DP for the Gaussian
  mechanism, Poisson-subsampled or not, at integer orders alpha = 2 .. 1024:

      A_alpha = sum_{j=0..alpha} C(alpha, j) (1-q)^{alpha-j} q^j exp((j^2 - j) / (2 sigma^2)),
      RDP(alpha) = k ln(A_alpha) / (alpha - 1)                       (Mironov, Talwar, Zhang 2019),

  converted with the improved bound of Balle et al. 2020 (Thm 21; also
  Canonne-Kamath-Steinke 2020, Prop 12), the one TensorFlow Privacy uses:

      eps = min_alpha [RDP(alpha) + ln((alpha-1)/alpha) - (ln delta + ln alpha) / (alpha - 1)],
      delta(eps) = min_alpha exp((alpha-1)(RDP(alpha) - eps) + (alpha-1) ln(1 - 1/alpha) - ln alpha).

  It is an **upper bound** (a guarantee, loose by design): results are
  ``Estimate(lower=nan, estimate=x, upper=x)`` -- no lower bound is offered.
  The integer-order formula is the RDP of the Poisson *remove* pair; Mironov et
  al. show it also bounds the add direction for the sampled Gaussian, so it
  covers the relations add, remove and add_remove.  WOR sampling with
  add/remove uses the same pair with sensitivity 2 (sigma / 2, MATH.md
  section 2); plain Gaussian substitution likewise.  Anything else (Laplace,
  Poisson/WOR substitution, finite mechanisms) raises NotImplementedError.

* :func:`account_clt` -- the Gaussian-DP central-limit approximation of Bu,
  Dong, Long and Su (2020): mu = q sqrt(k (e^{1/sigma^2} - 1)) (per mechanism,
  mu^2 adding over a heterogeneous sequence), read through the Gaussian curve
  delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2).  It is an
  **estimate that under-reports** the privacy loss of DP-SGD (it is a limit,
  not a bound): results are always ``Estimate(lower=nan, estimate=x,
  upper=nan)``.  For the unsampled Gaussian (q = 1) mu = sqrt(k) / sigma,
  which happens to be exact, but it is labelled an estimate all the same.
  Same support as RDP.

Both also offer ``epsilon_grid(steps, deltas)`` for a single mechanism (the
sweep's (steps x delta) block in one vectorised pass).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from . import _validate as V
from .accountant import Estimate, _components
from .mechanisms import Gaussian

__all__ = ["account_rdp", "account_clt", "RDPAccountant", "CLTAccountant", "RDP_ORDERS"]

#: integer Renyi orders used by the RDP baseline
RDP_ORDERS = np.arange(2, 1025, dtype=float)


def _gaussian_params(mech, who: str) -> tuple[float, float]:
    """(effective sigma, q) of a supported Gaussian mechanism, or NotImplementedError."""
    if not isinstance(mech, Gaussian):
        raise NotImplementedError(
            f"{who}: only the Gaussian mechanism is supported (got {type(mech).__name__}); "
            "use the PLD or SPA accountant")
    sigma = mech.sigma  # noise multiplier: noise std / sensitivity
    sampling = "none" if mech.q == 1.0 else mech.sampling
    rel = mech.relation
    if sampling == "none":
        if rel == "substitution":
            sigma = sigma / 2.0  # pair (B_0, B_2D)
        return sigma, 1.0
    if rel == "substitution":
        raise NotImplementedError(
            f"{who}: {sampling} sampling with the substitution relation is not supported "
            "(no RDP/GDP formula for that dominating pair here); use the PLD or SPA accountant")
    if sampling == "wor":
        sigma = sigma / 2.0  # WOR add/remove = Poisson pair with sensitivity 2D (MATH.md section 2)
    return sigma, float(mech.q)


def rdp_single_step(sigma: float, q: float, orders=RDP_ORDERS) -> np.ndarray:
    """RDP epsilon of one step of the (Poisson-subsampled) Gaussian at integer orders."""
    orders = np.asarray(orders, dtype=float)
    if q == 1.0:
        return orders / (2.0 * sigma**2)
    if np.any(orders != np.round(orders)) or orders.min() < 2:
        raise ValueError("orders must be integers >= 2")
    amax = int(orders.max())
    a = orders[:, None]
    j = np.arange(amax + 1, dtype=float)[None, :]
    valid = j <= a
    with np.errstate(invalid="ignore"):
        logc = special.gammaln(a + 1) - special.gammaln(j + 1) - special.gammaln(np.maximum(a - j, 0) + 1)
        terms = logc + (a - j) * math.log1p(-q) + j * math.log(q) + (j * j - j) / (2.0 * sigma**2)
    terms = np.where(valid, terms, -np.inf)
    return special.logsumexp(terms, axis=1) / (orders - 1.0)


class RDPAccountant:
    """Moments accountant (integer orders, improved conversion): an upper bound only."""

    method = "rdp"

    def __init__(self, components, orders=RDP_ORDERS):
        self.components = components
        self.orders = np.asarray(orders, dtype=float)
        self._per_step = []
        for m, k in components:
            sigma, q = _gaussian_params(m, "rdp")
            self._per_step.append((rdp_single_step(sigma, q, self.orders), k))
        self.rdp = sum(k * r for r, k in self._per_step)

    def _eps(self, rdp, deltas):
        a = self.orders
        e = rdp[..., None, :] + np.log1p(-1.0 / a) - (np.log(deltas)[:, None] + np.log(a)) / (a - 1.0)
        return np.maximum(e.min(axis=-1), 0.0)

    def epsilon(self, delta) -> Estimate:
        """eps(delta): ``Estimate(lower=nan, estimate=x, upper=x)`` (x is an upper bound)."""
        scalar = np.ndim(delta) == 0
        deltas = V.delta_array("delta", delta)
        e = self._eps(self.rdp, deltas)
        nan = np.full_like(e, np.nan)
        if scalar:
            return Estimate(math.nan, float(e[0]), float(e[0]))
        return Estimate(nan, e, e)

    def delta(self, epsilon) -> Estimate:
        """delta(eps): ``Estimate(lower=nan, estimate=x, upper=x)`` (x is an upper bound)."""
        scalar = np.ndim(epsilon) == 0
        eps = V.epsilon_array("epsilon", epsilon)
        a = self.orders
        ld = (a - 1.0) * (self.rdp[None, :] - eps[:, None] + np.log1p(-1.0 / a)) - np.log(a)
        d = np.minimum(np.exp(ld.min(axis=1)), 1.0)
        nan = np.full_like(d, np.nan)
        if scalar:
            return Estimate(math.nan, float(d[0]), float(d[0]))
        return Estimate(nan, d, d)

    def epsilon_grid(self, steps, deltas):
        """(lower, estimate, upper) on a (steps x delta) grid for a single mechanism (lower is NaN)."""
        if len(self._per_step) != 1:
            raise ValueError("epsilon_grid: needs an accountant for a single mechanism")
        r1 = self._per_step[0][0]
        steps = np.array([V.steps("steps", s) for s in np.atleast_1d(steps).tolist()], dtype=float)
        deltas = V.delta_array("delta", deltas)
        e = np.stack([self._eps(k * r1, deltas) for k in steps])
        return np.full_like(e, np.nan), e, e


class CLTAccountant:
    """Gaussian-DP central-limit approximation: an estimate (under-reports), never a guarantee."""

    method = "clt"

    def __init__(self, components):
        self.components = components
        self._mu2 = []
        for m, k in components:
            sigma, q = _gaussian_params(m, "clt")
            if q == 1.0:
                self._mu2.append((1.0 / sigma**2, k))
            else:
                self._mu2.append((q * q * math.expm1(1.0 / sigma**2), k))
        self.mu = math.sqrt(sum(k * m2 for m2, k in self._mu2))

    @staticmethod
    def _log_delta(mu, eps):
        la = special.log_ndtr(-eps / mu + mu / 2)
        lb = special.log_ndtr(-eps / mu - mu / 2) + eps
        with np.errstate(divide="ignore", invalid="ignore"):
            return la + np.log(-np.expm1(np.minimum(lb - la, 0.0)))

    @classmethod
    def _eps(cls, mu, deltas):
        """Vectorised bisection of the decreasing Gaussian curve (mu, deltas broadcast)."""
        mu, deltas = np.broadcast_arrays(np.asarray(mu, float), np.asarray(deltas, float))
        target = np.log(deltas)
        lo = np.full(mu.shape, -1.0)
        hi = mu * mu / 2 + mu * (-special.ndtri(deltas)) + 1.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            above = cls._log_delta(mu, mid) > target
            lo = np.where(above, mid, lo)
            hi = np.where(above, hi, mid)
            if np.all(hi - lo <= 1e-13 * np.maximum(1.0, np.abs(hi))):
                break
        return hi

    def epsilon(self, delta) -> Estimate:
        """eps(delta): ``Estimate(lower=nan, estimate=x, upper=nan)`` -- an estimate only."""
        scalar = np.ndim(delta) == 0
        deltas = V.delta_array("delta", delta)
        e = self._eps(self.mu, deltas)
        nan = np.full_like(e, np.nan)
        if scalar:
            return Estimate(math.nan, float(e[0]), math.nan)
        return Estimate(nan, e, nan)

    def delta(self, epsilon) -> Estimate:
        """delta(eps): ``Estimate(lower=nan, estimate=x, upper=nan)`` -- an estimate only."""
        scalar = np.ndim(epsilon) == 0
        eps = V.epsilon_array("epsilon", epsilon)
        d = np.exp(self._log_delta(self.mu, eps))
        nan = np.full_like(d, np.nan)
        if scalar:
            return Estimate(math.nan, float(d[0]), math.nan)
        return Estimate(nan, d, nan)

    def epsilon_grid(self, steps, deltas):
        """(nan, estimate, nan) on a (steps x delta) grid for a single mechanism."""
        if len(self._mu2) != 1:
            raise ValueError("epsilon_grid: needs an accountant for a single mechanism")
        m2 = self._mu2[0][0]
        steps = np.array([V.steps("steps", s) for s in np.atleast_1d(steps).tolist()], dtype=float)
        deltas = V.delta_array("delta", deltas)
        mu = np.sqrt(steps * m2)[:, None]
        e = self._eps(mu, deltas[None, :])
        nan = np.full_like(e, np.nan)
        return nan, e, nan


def account_rdp(mechanism, steps: int | None = None, *, orders=RDP_ORDERS) -> RDPAccountant:
    """RDP / moments-accountant baseline (upper bound only; see the module docstring).

    Raises NotImplementedError for mechanisms other than the Gaussian
    (none / Poisson / WOR with add, remove or add_remove; plain substitution).
    """
    return RDPAccountant(_components(mechanism, steps), orders=orders)


def account_clt(mechanism, steps: int | None = None) -> CLTAccountant:
    """Gaussian-DP CLT baseline: an *estimate* (under-reports), never a guarantee."""
    return CLTAccountant(_components(mechanism, steps))
