"""Sampling without replacement: a batch of fixed size q n drawn uniformly.

For add, remove and add_remove the dominating pairs are the Poisson ones with
sensitivity 2D (a substituted record can move the output by 2D).  For
substitution the upper bound uses the point-wise maximum of the add and
remove curves at 2D (a valid upper curve, not known to be tight after
composition) and the lower bound the remove pair at 2D, which real datasets
realise (seed 002 section 8; docs/MATH.md section 2).
"""
from __future__ import annotations

from ..profiles.mixtures import MaxProfile
from ..profiles.pairs import Branch, family_of
from .base import SamplingScheme, directions, register


class WithoutReplacement(SamplingScheme):
    name = "wor"
    summary = "a fixed-size batch drawn without replacement (rate q = batch / n)"

    def branches(self, event, q, relation):
        fam = family_of(event, 2.0)
        if relation == "substitution":
            rem = fam.remove_pair(q)
            return [Branch("substitution", MaxProfile(fam.add_pair(q), rem), rem)]
        return directions(fam, q, relation)


register(WithoutReplacement())
