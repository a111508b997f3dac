"""Random allocation ("balls in bins") and shuffling: every record in exactly one of
the t = 1/q batches of an epoch (docs/MATH.md section 13).

``steps`` counts steps and must be a whole number of epochs of t = 1/q steps
(:meth:`SamplingScheme.steps_multiple`, checked by every accountant's ``compose``).

Gaussian noise only (sum query of sensitivity 1, noise sigma per step).  Per step:

| side  | profile per step                    | composed over E epochs (t E steps)        |
|-------|-------------------------------------|-------------------------------------------|
| upper | unsampled Gaussian, sigma sqrt(t)   | Gaussian at sigma / sqrt(E): no amplification, certified |
| lower | unsampled Gaussian, sigma t         | Gaussian at sigma sqrt(t / E): the exact law of the sum of the t noisy batch sums of each epoch, a post-processing, certified |

Both per-step profiles compose *exactly* to the per-epoch statements (Gaussian
pairs compose by adding mu^2), which is why the per-step bounds are only valid at
whole epochs.  The upper bound has no amplification; the honest range is wide.
"""
from __future__ import annotations

import math

import numpy as np

from .. import events as E
from ..profiles.pairs import Branch, UnsupportedEventError, unsampled_branches
from .base import SamplingScheme, register


def epoch_length(q: float) -> int:
    """t = 1/q, which must be a whole number (ValueError naming q otherwise)."""
    t = round(1.0 / q)
    if t < 2 or abs(t * q - 1.0) > 1e-9:
        raise ValueError(f"q: random allocation / shuffle need q = 1/t for a whole number t >= 2 "
                         f"(batches per epoch), got q={q!r}")
    return t


class RandomAllocation(SamplingScheme):
    name = "random_allocation"
    summary = "each record in exactly one of the t = 1/q steps of an epoch, uniformly"
    relations = ("add", "remove", "add_remove", "substitution")

    def steps_multiple(self, q: float) -> int:
        return epoch_length(q)

    def branches(self, event, q, relation):
        t = epoch_length(q)
        if not isinstance(event, E.GaussianEvent):
            raise UnsupportedEventError(f"sampling {self.name!r} is implemented for Gaussian noise only, "
                                        f"got {type(event).__name__}")
        s = event.sigma
        up = unsampled_branches(E.GaussianEvent(s * math.sqrt(t), event.sensitivity), relation)
        lo = unsampled_branches(E.GaussianEvent(s * t, event.sensitivity), relation)
        return [Branch(f"{u.label}", u.upper, l.lower) for u, l in zip(up, lo)]


class Shuffle(RandomAllocation):
    """Fixed-size batches of a shuffled epoch.  Under add / remove the absent record's
    slot is left empty (the others keep their batches); substitution is the natural
    relation.  Same certified range as random allocation: the upper bound uses only
    "in exactly one batch per epoch", the lower bound only the sum over the epoch."""

    name = "shuffle"
    summary = "fixed-size batches from a shuffled epoch (t = 1/q batches)"


register(RandomAllocation())
register(Shuffle())


# -- the stronger per-epoch lower bound: the largest noisy coordinate -----------------------
from ..profiles.base import PrivacyProfile  # noqa: E402


class MaxCoordinateProfile(PrivacyProfile):
    """Remove-direction pair of M = max of the t noisy batch sums of one epoch (one record,
    sensitivity 1, noise s = sigma): P(M <= m) = Phi(m/s)^(t-1) Phi((m-1)/s) against
    Q(M <= m) = Phi(m/s)^t (docs/MATH.md section 13).  An exact post-processing of the
    random-allocation (or shuffled-epoch) pair, so composing it (optimistic PLD side) over
    epochs certifies a **lower** bound.  The loss L(m) = log(((t-1)/t) Phi((m-1)/s)/Phi(m/s)
    + exp((2m-1)/(2 s^2))/t) is increasing in m (Phi log-concave); it is inverted by
    bisection to float precision."""

    def __init__(self, sigma: float, t: int):
        self.s, self.t = float(sigma), int(t)

    def _loss(self, m):
        from scipy.special import log_ndtr

        s, t = self.s, self.t
        a = math.log((t - 1) / t) + log_ndtr((m - 1) / s) - log_ndtr(m / s)
        b = -math.log(t) + (2 * m - 1) / (2 * s * s)
        return np.logaddexp(a, b)

    def _m(self, eps):
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        s2, w = self.s ** 2, 10 * self.s ** 2 * (1 + math.log(self.t)) + 10
        e = np.clip(eps, -700, 700)
        lo, hi = s2 * e - w, s2 * e + w
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            big = self._loss(mid) > e
            hi = np.where(big, mid, hi)
            lo = np.where(big, lo, mid)
            if np.all(hi - lo <= 2 * np.finfo(float).eps * np.maximum(1.0, np.abs(mid))):
                break  # float precision reached: further halvings change nothing
        m = 0.5 * (lo + hi)
        return np.where(eps == np.inf, np.inf, np.where(eps == -np.inf, -np.inf, m))

    @staticmethod
    def _shape(eps, r):
        return r.reshape(np.shape(eps)) if np.ndim(eps) else float(r[0])

    def _logcdf(self, m, under_p):
        from scipy.special import log_ndtr

        s, t = self.s, self.t
        if under_p:
            return (t - 1) * log_ndtr(m / s) + log_ndtr((m - 1) / s)
        return t * log_ndtr(m / s)

    def cdf_p(self, eps):
        return self._shape(eps, np.exp(self._logcdf(self._m(eps), True)))

    def cdf_q(self, eps):
        return self._shape(eps, np.exp(self._logcdf(self._m(eps), False)))

    def sf_p(self, eps):
        return self._shape(eps, -np.expm1(self._logcdf(self._m(eps), True)))

    def sf_q(self, eps):
        return self._shape(eps, -np.expm1(self._logcdf(self._m(eps), False)))


def max_coordinate_accountant(sigma: float, t: int, epochs: int, relation: str = "add_remove"):
    """The PLD accountant of the E-fold composition of :class:`MaxCoordinateProfile` (remove;
    add: reversed; add_remove: both).  Only its **lower** ends are bounds for random allocation
    or shuffling (``.epsilon(delta).lower``, ``.delta(eps).lower``)."""
    from .. import PLDAccountant

    V_t = epoch_length(1.0 / t)
    prof = MaxCoordinateProfile(sigma, V_t)
    ev = E.ProfileEvent(prof, prof.reversed()) if relation == "add_remove" else \
        E.ProfileEvent(prof if relation == "remove" else prof.reversed())
    return PLDAccountant(relation).compose(ev, epochs)


def max_coordinate_lower(sigma: float, t: int, epochs: int, delta: float, relation: str = "add_remove"):
    """Certified lower bound on epsilon(delta) of ``epochs`` epochs of random allocation or
    shuffling with t batches (Gaussian noise multiplier ``sigma``): the PLD optimistic side of
    the E-fold composition of :class:`MaxCoordinateProfile` (remove; add: reversed; add_remove:
    the larger)."""
    return max_coordinate_accountant(sigma, t, epochs, relation).epsilon(delta).lower
