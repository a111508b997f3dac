"""The Gaussian-DP central-limit approximation: an estimate (docs/MATH.md section 8).

:func:`account_clt` -- the Gaussian-DP central-limit approximation of Bu,
Dong, Long and Su (2020): mu = q sqrt(k (e^{1/sigma^2} - 1)) (per mechanism,
mu^2 adding over a heterogeneous sequence), read through the Gaussian curve
delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2).  It is an
**estimate that under-reports** the privacy loss of DP-SGD (it is a limit,
not a bound): results are always ``Interval(lower=nan, upper=nan, estimate=x,
upper=nan)``.  For the unsampled Gaussian (q = 1) mu = sqrt(k) / sigma,
which happens to be exact, but it is labelled an estimate all the same.
Same support as RDP.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from .. import _validate as V
from .base import Interval, components_of
from .rdp import GaussianFormulaAccountant, gaussian_params

__all__ = ["account_clt", "CLTAccountant"]


class CLTAccountant(GaussianFormulaAccountant):
    """Gaussian-DP central-limit approximation: an estimate (under-reports), never a guarantee.

    ``CLTAccountant(relation).compose(event, count)``; answers are
    ``Interval(lower=nan, upper=nan, estimate=x, upper=nan)``.
    """

    method = "clt"
    kind = "estimate"

    def _build(self):
        self._mu2 = []
        for m, k in self.components:
            sigma, q = gaussian_params(m, "clt")
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

    def epsilon(self, delta) -> Interval:
        """eps(delta): ``Interval(lower=nan, upper=nan, estimate=x, upper=nan)`` -- an estimate only."""
        scalar = np.ndim(delta) == 0
        deltas = V.delta_array("delta", delta)
        e = self._eps(self.mu, deltas)
        nan = np.full_like(e, np.nan)
        if scalar:
            return Interval(math.nan, math.nan, estimate=float(e[0]), kind="estimate")
        return Interval(nan, nan, estimate=e, kind="estimate")

    def delta(self, epsilon) -> Interval:
        """delta(eps): ``Interval(lower=nan, upper=nan, estimate=x, upper=nan)`` -- an estimate only."""
        scalar = np.ndim(epsilon) == 0
        eps = V.epsilon_array("epsilon", epsilon)
        d = np.exp(self._log_delta(self.mu, eps))
        nan = np.full_like(d, np.nan)
        if scalar:
            return Interval(math.nan, math.nan, estimate=float(d[0]), kind="estimate")
        return Interval(nan, nan, estimate=d, kind="estimate")

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


def account_clt(mechanism, steps: int | None = None) -> CLTAccountant:
    """Gaussian-DP CLT baseline: an *estimate* (under-reports), never a guarantee."""
    return CLTAccountant.for_mechanism(mechanism, steps)
