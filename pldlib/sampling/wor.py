"""Sampling without replacement: a batch of fixed size q n drawn uniformly.

For add, remove and add_remove the dominating pairs are the Poisson ones with
sensitivity 2D (a substituted record can move the output by 2D).  For
substitution the upper bound uses the point-wise maximum of the add and
remove curves at 2D (a valid upper curve, not known to be tight after
composition) and the lower bound the remove pair at 2D, which real datasets
realise (seed 002 section 8; docs/MATH.md section 2).

User-level (``group`` = g > 1, Gaussian; docs/MATH.md 13.1): a fixed batch of b records;
the user's up to g records are removed (or added).  Here **q = b / (m + 1)**, m = the
number of records of all the *other* users (at g = 1: q = b / n, the example-level rate).
The number of the user's records in the batch is hypergeometric and stochastically at most
Bin(g, q), each moves the output by at most 2D, so the remove pair is
P = sum_k Bin(g, q)(k) B_{2kD}, Q = B_0 (add: its reverse).  :func:`user_rate` gives a
safe q from the dataset size.
"""
from __future__ import annotations

from ..profiles.mixtures import MaxProfile
from ..profiles.pairs import Branch, family_of
from .base import SamplingScheme, binomial_weights, directions, register, user_level_branches


class WithoutReplacement(SamplingScheme):
    name = "wor"
    summary = "a fixed-size batch drawn without replacement (rate q = batch / n)"

    def branches(self, event, q, relation):
        fam = family_of(event, 2.0)
        if relation == "substitution":
            rem = fam.remove_pair(q)
            return [Branch("substitution", MaxProfile(fam.add_pair(q), rem), rem)]
        return directions(fam, q, relation)

    def group_branches(self, event, q, relation, group):
        return user_level_branches(event, binomial_weights(group, q), 2.0, relation, self.name)


def user_rate(batch: int, n: int, group: int) -> float:
    """A safe user-level WOR rate q = batch / (n - group + 1) for a dataset of n records (the
    protected user's up to ``group`` included) and a fixed batch size ``batch``
    (docs/MATH.md 13.1: q = b / (m + 1) with m >= n - group the other users' records)."""
    from .. import _validate as V

    batch, n, group = V.positive_int("batch", batch), V.positive_int("n", n), V.positive_int("group", group)
    if n - group + 1 <= batch:
        raise ValueError(f"batch: needs batch < n - group + 1, got batch={batch}, n={n}, group={group}")
    return batch / (n - group + 1)


register(WithoutReplacement())
