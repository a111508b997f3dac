"""Dominating pairs per sampling scheme x neighbouring relation (MATH.md section 2).

``branches_for(mechanism)`` returns the branches to compose; the final answer
is the maximum over branches *after* composition (add and remove curves can
cross after composition, seed 002 sections 5 and 7).

| sampling | relation      | branches (upper profile / lower profile)                 |
|----------|---------------|----------------------------------------------------------|
| none     | add/remove    | (B_D, B_0) and its reverse (one branch if B is symmetric)|
| none     | substitution  | (B_2D, B_0)                                              |
| poisson  | remove        | P=(1-q)B_0+qB_D, Q=B_0                                   |
| poisson  | add           | the reversed remove pair                                 |
| poisson  | add_remove    | both of the above, composed separately, max after        |
| poisson  | substitution  | P=(1-q)B_0+qB_D, Q=(1-q)B_0+qB_{-D}                      |
| wor      | add/remove/ar | as Poisson with sensitivity 2D                           |
| wor      | substitution  | upper: point-wise max of add and remove at 2D;           |
|          |               | lower: remove at 2D (realised by real datasets)          |

q = 1 means every record is used: it is treated as sampling 'none' for both
schemes.  WOR substitution intervals can be wide: the max-profile is an upper
bound that is not known to be tight after composition, while the lower bound
uses one direction only (seed 002 section 8).
"""
from __future__ import annotations

from .mechanisms import Branch
from .mixtures import MaxProfile, finite_mixture_profile, poisson_add, poisson_remove, poisson_substitution

__all__ = ["branches_for"]


def _directions(mech, sampling: str, relation: str) -> list[Branch]:
    factor = 2.0 if sampling == "wor" else 1.0
    if getattr(mech, "lattice_pmf", None) is not None:
        return _lattice_directions(mech, sampling, relation, int(factor))
    noise = mech.noise(factor)
    q = mech.q
    if relation in ("remove", "add_remove"):
        rem = poisson_remove(noise, q)
    if relation in ("add", "add_remove"):
        add = poisson_add(noise, q)
    if relation == "remove":
        return [Branch("remove", rem, rem)]
    if relation == "add":
        return [Branch("add", add, add)]
    if relation == "add_remove":
        return [Branch("add", add, add), Branch("remove", rem, rem)]
    # substitution
    if sampling == "poisson":
        sub = poisson_substitution(noise, q)
        return [Branch("substitution", sub, sub)]
    rem = poisson_remove(noise, q)
    return [Branch("substitution", MaxProfile(poisson_add(noise, q), rem), rem)]


def _lattice_directions(mech, sampling, relation, factor) -> list[Branch]:
    pmf, D, q = mech.lattice_pmf, mech.shift * factor, mech.q

    def rem():
        return finite_mixture_profile(pmf, {0: 1 - q, D: q}, {0: 1.0})

    def add():
        return finite_mixture_profile(pmf, {0: 1.0}, {0: 1 - q, D: q})

    if relation == "remove":
        return [Branch("remove", rem(), rem())]
    if relation == "add":
        return [Branch("add", add(), add())]
    if relation == "add_remove":
        return [Branch("add", add(), add()), Branch("remove", rem(), rem())]
    if sampling == "poisson":
        sub = finite_mixture_profile(pmf, {0: 1 - q, D: q}, {0: 1 - q, -D: q})
        return [Branch("substitution", sub, sub)]
    return [Branch("substitution", MaxProfile(add(), rem()), rem())]


def branches_for(mech) -> list[Branch]:
    """The branches (dominating pairs) to compose for one mechanism spec."""
    if not mech.subsamplable:
        p = mech.base_profile()
        return [Branch("pair", p, p)]
    sampling = "none" if mech.q == 1.0 else mech.sampling
    if sampling == "none":
        if getattr(mech, "lattice_pmf", None) is not None:
            pmf, D = mech.lattice_pmf, mech.shift
            if mech.relation == "substitution":
                p = finite_mixture_profile(pmf, {2 * D: 1.0}, {0: 1.0})
                return [Branch("substitution", p, p)]
            rem = finite_mixture_profile(pmf, {D: 1.0}, {0: 1.0})
            add = finite_mixture_profile(pmf, {0: 1.0}, {D: 1.0})
            out = {"remove": [Branch("remove", rem, rem)], "add": [Branch("add", add, add)],
                   "add_remove": [Branch("add", add, add), Branch("remove", rem, rem)]}
            return out[mech.relation]
        # symmetric base noise: add and remove give the same curve
        factor = 2.0 if mech.relation == "substitution" else 1.0
        p = mech.base_profile(factor)
        return [Branch("pair", p, p)]
    return _directions(mech, sampling, mech.relation)
