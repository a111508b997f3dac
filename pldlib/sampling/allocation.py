"""Random allocation ("balls in bins") and shuffling: every record in exactly one of
the t = 1/q batches of an epoch (docs/MATH.md section "Random allocation and shuffling").

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
