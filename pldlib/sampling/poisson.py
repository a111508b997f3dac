"""Poisson sampling: each record is in the batch independently with probability q.

| relation     | branches (docs/MATH.md section 2)                          |
|--------------|------------------------------------------------------------|
| remove       | P = (1-q) B_0 + q B_D, Q = B_0                             |
| add          | the reversed remove pair                                   |
| add_remove   | both, composed separately, maximum after composition       |
| substitution | P = (1-q) B_0 + q B_D, Q = (1-q) B_0 + q B_{-D}            |

User-level (``group`` = g > 1, Gaussian; docs/MATH.md 13.1): each of the user's up to g
records is in the batch independently with probability q, so their number is at most
Bin(g, q); remove pair P = sum_k Bin(g, q)(k) B_{kD}, Q = B_0, add its reverse.
"""
from __future__ import annotations

from ..profiles.pairs import Branch, family_of
from .base import SamplingScheme, binomial_weights, directions, register, user_level_branches


class Poisson(SamplingScheme):
    name = "poisson"
    summary = "each record independently with probability q"

    def branches(self, event, q, relation):
        fam = family_of(event, 1.0)
        if relation == "substitution":
            sub = fam.substitution_pair(q)
            return [Branch("substitution", sub, sub)]
        return directions(fam, q, relation)

    def group_branches(self, event, q, relation, group):
        return user_level_branches(event, binomial_weights(group, q), 1.0, relation, self.name)


register(Poisson())
