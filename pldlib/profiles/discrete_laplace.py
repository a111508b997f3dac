"""The discrete Laplace mechanism (two-sided geometric noise on the integers).

Noise X with pmf p(x) = (1-a)/(1+a) a^|x|, a = e^(-1/t) (``scale`` t), added to
an integer query of sensitivity D.  Its pairs are exact finite profiles
(docs/MATH.md sections 1.6 and 2.2): for shifted copies B_s(x) = p(x - s) the ratio
B_s1 / B_s2 is constant for x <= min(s) and for x >= max(s), so the output
clamped to [min shift, max shift] is a sufficient statistic of every mixture
that sampling produces, and the clamped pair has the same privacy profile.
Every sampling scheme and relation therefore works through the shift family
below, with no approximation.
"""
from __future__ import annotations

import math

import numpy as np

from .. import events as E
from .base import FiniteProfile
from .mixtures import ShiftFamily, finite_pair
from .pairs import register


class DiscreteLaplaceNoise(ShiftFamily):
    """Discrete Laplace noise of scale ``t`` with integer shift ``D`` (exact finite pairs)."""

    def __init__(self, t: float, D: int):
        self.t, self.D = float(t), int(D)
        self.log_a = -1.0 / self.t

    def _log_le(self, k) -> np.ndarray:
        """ln P(X <= k) for integers k: |k| ln a - ln(1+a) for k <= 0, else
        ln(1 - a^(k+1) / (1+a))."""
        k = np.asarray(k, dtype=float)
        la, l1pa = self.log_a, math.log1p(math.exp(self.log_a))
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(k <= 0, np.abs(k) * la - l1pa, np.log1p(-np.exp((np.maximum(k, 0) + 1) * la - l1pa)))

    def _clamped(self, s: int, lo: int, hi: int) -> np.ndarray:
        """Masses of clamp(X + s, lo, hi) on lo..hi."""
        y = np.arange(lo, hi + 1)
        la, l1pa = self.log_a, math.log1p(math.exp(self.log_a))
        m = np.exp(math.log(-math.expm1(la)) - l1pa + np.abs(y - s) * la)
        m[0] = math.exp(float(self._log_le(np.array([lo - s]))[0]))
        m[-1] = math.exp(float(self._log_le(np.array([s - hi]))[0]))  # P(X >= hi - s) = P(X <= s - hi)
        return m

    def _pair(self, p_mix: dict, q_mix: dict) -> FiniteProfile:
        shifts = [s for s, w in {**p_mix, **q_mix}.items()]
        lo, hi = min(shifts), max(shifts)
        P = sum(w * self._clamped(s, lo, hi) for s, w in p_mix.items() if w > 0)
        Q = sum(w * self._clamped(s, lo, hi) for s, w in q_mix.items() if w > 0)
        return finite_pair(P, Q)  # (disjoint supports, scale -> 0: L = +inf P-surely)

    def remove_pair(self, q: float) -> FiniteProfile:
        return self._pair({0: 1 - q, self.D: q}, {0: 1.0})

    def add_pair(self, q: float) -> FiniteProfile:
        return self._pair({0: 1.0}, {0: 1 - q, self.D: q})

    def substitution_pair(self, q: float) -> FiniteProfile:
        return self._pair({0: 1 - q, self.D: q}, {0: 1 - q, -self.D: q})


register(E.DiscreteLaplaceEvent,
         pair=lambda e, c: DiscreteLaplaceNoise(e.scale, int(e.sensitivity * c)).remove_pair(1.0),
         family=lambda e, c: DiscreteLaplaceNoise(e.scale, int(e.sensitivity * c)))
