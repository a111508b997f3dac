"""Dominating pairs per sampling scheme x neighbouring relation (MATH.md section 2).

``branches_for(mechanism)`` returns the branches to compose; the final answer
is the maximum over branches *after* composition (add and remove curves can
cross after composition, seed 002 sections 5 and 7).
"""
from __future__ import annotations

from .mechanisms import Branch

__all__ = ["branches_for"]


def branches_for(mech) -> list[Branch]:
    sampling = "none" if mech.q == 1.0 else mech.sampling
    if not mech.subsamplable:
        p = mech.base_profile()
        return [Branch("pair", p, p)]
    if sampling == "none":
        # (B_0, B_D) for add/remove (the base noises are symmetric, so both
        # directions give the same curve); (B_0, B_2D) for substitution.
        factor = 2.0 if mech.relation == "substitution" else 1.0
        p = mech.base_profile(factor)
        return [Branch("pair", p, p)]
    raise NotImplementedError(f"q: sampling '{mech.sampling}' with q < 1 is not supported yet")
