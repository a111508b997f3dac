"""Dominating pairs of one unsampled step, and the maths registered per event type.

A base mechanism's maths is two functions of its event (docs/MATH.md section 2):

* ``pair(event, c)`` -- the profile of (B_0, B_{cD}): the mechanism's output
  distributions on neighbours whose query values differ by c times the
  sensitivity (c = 1 for add/remove, 2 for substitution);
* ``family(event, c)`` (optional) -- the noise as a *shift family*: an object
  with ``remove_pair(q)``, ``add_pair(q)`` and ``substitution_pair(q)`` that
  build the mixtures sampling produces (:mod:`pldlib.profiles.mixtures`).  A
  mechanism without a family cannot be subsampled.

:func:`register` records them for an event type; :func:`unsampled_branches`
gives the branches (directions) to compose for an unsampled step, and
:func:`family_of` what a sampling scheme (:mod:`pldlib.sampling`) needs.
Adding a mechanism = an event class in :mod:`pldlib.events` + a module that
calls :func:`register` (imported at the bottom of this one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from .. import events as E
from .base import PrivacyProfile, approx_dp_profile, randomized_response_profile, GaussianProfile, LaplaceProfile
from .mixtures import (DisjointMixtureProfile, GaussianNoise, LaplaceNoise, LatticeNoise, MaxProfile,
                       poisson_remove, shift_mixture_remove)

__all__ = ["Branch", "MechanismMaths", "register", "maths_of", "family_of", "unsampled_branches",
           "UnsupportedEventError"]


class UnsupportedEventError(NotImplementedError):
    """An accountant (or a sampling scheme) does not support this event."""


class Branch(NamedTuple):
    """One direction to compose: ``upper`` certifies the upper bound, ``lower`` the lower."""

    label: str
    upper: PrivacyProfile
    lower: PrivacyProfile


@dataclass(frozen=True)
class MechanismMaths:
    """What pldlib knows about a base mechanism event type (see the module docstring)."""

    pair: Callable[[object, float], PrivacyProfile]
    family: Callable[[object, float], object] | None = None
    #: True: the pair is the same for add and remove (symmetric noise), one branch suffices
    symmetric: bool = True
    #: False: the pair is relation-free (a worst-case pair given by the user or by (eps0, delta0))
    relation_aware: bool = True
    #: optional override: (event, relation) -> the branches of the unsampled step
    branches: Callable | None = None


_MATHS: dict[type, MechanismMaths] = {}


def register(event_type: type, *, pair, family=None, symmetric: bool = True, relation_aware: bool = True,
             branches=None):
    """Record the maths of ``event_type`` (a subclass of :class:`pldlib.events.BaseEvent`)."""
    if not (isinstance(event_type, type) and issubclass(event_type, E.BaseEvent)):
        raise TypeError(f"event_type must be a BaseEvent subclass, got {event_type!r}")
    _MATHS[event_type] = MechanismMaths(pair, family, symmetric, relation_aware, branches)


def maths_of(event) -> MechanismMaths:
    for cls in type(event).__mro__:
        if cls in _MATHS:
            return _MATHS[cls]
    if isinstance(event, E.ZCDPEvent):
        raise UnsupportedEventError("a zCDP guarantee bounds Renyi divergences only and has no privacy-loss "
                                    "distribution; account it with method='rdp' (an upper bound)")
    if isinstance(event, E.RepeatAndSelectEvent):
        raise UnsupportedEventError("the best of a random number of runs is bounded in Renyi DP only here; "
                                    "account it with method='rdp' (an upper bound)")
    raise UnsupportedEventError(f"no privacy profile is registered for {type(event).__name__}")


def family_of(event, factor: float = 1.0):
    """The shift family of ``event``'s noise at sensitivity ``factor`` x D, or
    :class:`UnsupportedEventError` when the mechanism cannot be subsampled."""
    m = maths_of(event)
    if m.family is None:
        raise UnsupportedEventError(f"{type(event).__name__} cannot be subsampled (it is composed as given: "
                                    "its pair is not a family of shifted noise)")
    return m.family(event, factor)


def unsampled_branches(event, relation: str) -> list[Branch]:
    """The branches of one unsampled step under ``relation`` (docs/MATH.md section 2).

    Symmetric noise: one pair (B_0, B_D) for add, remove and add_remove (the two
    directions give the same curve), (B_0, B_2D) for substitution.  A lattice
    noise gives its two directions separately.  A relation-free pair (custom
    profile, randomized response, (eps0, delta0)-DP) is composed as given.
    """
    m = maths_of(event)
    if m.branches is not None:
        return m.branches(event, relation)
    if not m.relation_aware:
        p = m.pair(event, 1.0)
        return [Branch("pair", p, p)]
    if relation == "substitution":
        p = m.pair(event, 2.0)
        return [Branch("pair" if m.symmetric else "substitution", p, p)]
    if m.symmetric:
        p = m.pair(event, 1.0)
        return [Branch("pair", p, p)]
    # asymmetric (lattice) noise: the two directions from its family at q = 1
    fam = family_of(event, 1.0)
    rem, add = fam.remove_pair(1.0), fam.add_pair(1.0)
    return {"remove": [Branch("remove", rem, rem)], "add": [Branch("add", add, add)],
            "add_remove": [Branch("add", add, add), Branch("remove", rem, rem)]}[relation]


# -- the built-in mechanisms ----------------------------------------------------------
register(E.GaussianEvent, pair=lambda e, c: GaussianProfile(sigma=e.sigma / c),
         family=lambda e, c: GaussianNoise(e.sigma, c))
register(E.LaplaceEvent, pair=lambda e, c: LaplaceProfile(scale=e.scale, sensitivity=e.sensitivity * c),
         family=lambda e, c: LaplaceNoise(e.scale, e.sensitivity * c))
register(E.LatticeEvent, pair=lambda e, c: LatticeNoise(e.pmf, int(e.shift * c)).remove_pair(1.0),
         family=lambda e, c: LatticeNoise(e.pmf, int(e.shift * c)), symmetric=False)
register(E.RandomizedResponseEvent, pair=lambda e, c: randomized_response_profile(e.eps0), relation_aware=False)
register(E.ApproxDPEvent, pair=lambda e, c: approx_dp_profile(e.eps0, e.delta0), relation_aware=False)
def _profile_branches(e, relation: str) -> list[Branch]:
    if e.add_profile is None:
        return [Branch("pair", e.profile, e.profile)]
    rem, add = e.profile, e.add_profile
    if relation == "substitution":
        raise UnsupportedEventError("a ProfileEvent with separate add and remove pairs has no substitution pair; "
                                    "give the substitution pair as its profile")
    return {"remove": [Branch("remove", rem, rem)], "add": [Branch("add", add, add)],
            "add_remove": [Branch("add", add, add), Branch("remove", rem, rem)]}[relation]


register(E.ProfileEvent, pair=lambda e, c: e.profile, relation_aware=False, branches=_profile_branches)


def _mog_remove(e) -> PrivacyProfile:
    """P = sum_i p_i N(c_i, sigma^2) against Q = N(0, sigma^2) (MATH.md section 13.6)."""
    return shift_mixture_remove(GaussianNoise(e.sigma, max(e.sensitivities)), e.probabilities, e.sensitivities)


def _remove_and_reverse(rem: PrivacyProfile, relation: str, what: str) -> list[Branch]:
    """The branches of a step known by its remove pair ``rem`` (add: its reverse); substitution refused."""
    if relation == "substitution":
        raise UnsupportedEventError(f"{what} has dominating pairs for add and remove only; substitution is not "
                                    "supported")
    add = rem.reversed()
    return {"remove": [Branch("remove", rem, rem)], "add": [Branch("add", add, add)],
            "add_remove": [Branch("add", add, add), Branch("remove", rem, rem)]}[relation]


def _mog_branches(e, relation: str) -> list[Branch]:
    return _remove_and_reverse(_mog_remove(e), relation, "a mixture of Gaussians (as in dp_accounting)")


register(E.MixtureOfGaussiansEvent, pair=lambda e, c: _mog_remove(e), symmetric=False, branches=_mog_branches)


def _truncated_remove(e) -> PrivacyProfile:
    """Remove pair of a truncated Poisson Gaussian step (docs/MATH.md 2.6): with probability 1 - t
    the Poisson subsampled Gaussian (rate q, sensitivity 1), with probability t the Poisson one of
    rate q B / (B + 1) and sensitivity 2, the branch revealed."""
    t = e.truncation_probability
    plain = poisson_remove(GaussianNoise(e.sigma, 1.0), e.q) if e.q < 1.0 else GaussianProfile(sigma=e.sigma)
    if t <= 0.0:
        return plain
    cut = poisson_remove(GaussianNoise(e.sigma, 2.0), e.truncated_rate)
    return DisjointMixtureProfile([plain, cut], [1.0 - t, t]) if t < 1.0 else cut


def _truncated_branches(e, relation: str) -> list[Branch]:
    return _remove_and_reverse(_truncated_remove(e), relation, "truncated Poisson sampling")


register(E.TruncatedPoissonGaussianEvent, pair=lambda e, c: _truncated_remove(e), symmetric=False,
         branches=_truncated_branches)


#: the draws k = 1, 2, ... are kept while a shift of 2k noise multipliers has a loss below this
#: 12 standard deviations above its centre, (2k/sigma)^2/2 + 12 (2k/sigma) + ln P(K = k), so that
#: the discretisation's loss range stays in floating point (docs/MATH.md 2.7)
WR_LOSS_CAP = 600.0
#: ... and while the weight of the draws after them is above this fraction of P(K >= 1)
WR_TAIL = 1e-30


def _wr_cut(e) -> tuple[np.ndarray, int]:
    """(weights of K ~ Bin(B, 1/n), kc): the draws k <= kc are kept as they are; the weight of
    k > kc (0 when kc is the last draw of positive weight) is moved to the pessimistic side."""
    w = e.draw_weights()
    r = 2.0 / e.sigma
    eta = e.hit_probability
    tail = np.cumsum(w[::-1])[::-1]  # tail[k] = P(K >= k) (up to rounding)
    kc = 1
    for k in range(2, w.size):
        # (a weight that underflows to 0, e.g. few draws of a record drawn ~B/2 times, adds no loss)
        log_w = math.log(w[k]) if w[k] > 0.0 else -math.inf
        if (k * r) ** 2 / 2 + 12.0 * k * r + log_w > WR_LOSS_CAP or tail[k] <= WR_TAIL * eta:
            break
        kc = k
    return w, kc


def _perfect() -> PrivacyProfile:
    """The perfectly distinguishing pair (L = +inf under P): it dominates every pair."""
    from .base import FiniteProfile

    return FiniteProfile([0.0], [0.0], p_inf=1.0)


def _with_replacement_remove(e, side: str = "upper") -> PrivacyProfile:
    """Remove pair of a step whose batch is B draws with replacement from n records (docs/MATH.md
    2.7): P = sum_k Bin(B, 1/n)(k) N(2k, sigma^2) against Q = N(0, sigma^2), exact (realised by
    the record at +1, every other record at -1).  B = 1 is the WOR pair at rate 1/n.  Draws beyond
    :func:`_wr_cut` reveal themselves as a perfectly distinguishing part on the upper side, and
    count as the last kept draw on the lower side (a smaller shift: a dominated pair, 13.1's lemma)."""
    if e.batch_size == 1:
        return poisson_remove(GaussianNoise(e.sigma, 2.0), 1.0 / e.dataset_size)
    w, kc = _wr_cut(e)
    noise = GaussianNoise(e.sigma, 2.0)
    rest = float(np.sum(w[kc + 1:]))
    if rest <= 0.0:
        return noise.shifts_remove_pair(w)
    if side == "lower":
        return noise.shifts_remove_pair(np.concatenate([w[:kc], [w[kc] + rest]]))
    kept = w[: kc + 1] / np.sum(w[: kc + 1])
    return DisjointMixtureProfile([noise.shifts_remove_pair(kept), _perfect()], [1.0 - rest, rest])


def _with_replacement_substitution_upper(e) -> PrivacyProfile:
    """Upper side under substitution (docs/MATH.md 2.7): the point-wise maximum of the add and
    remove curves of the pair that reveals K given K >= 1, a Poisson pair of rate
    eta = P(K >= 1) and shift 2K (advanced joint convexity; K = 0 is the part the two data sets
    share); the draws beyond :func:`_wr_cut` as a perfectly distinguishing part."""
    w, kc = _wr_cut(e)
    eta = e.hit_probability
    # (a part per draw count of positive weight; at eta = 1 in floating point the record is always
    # drawn, and the Poisson pair of rate 1 is the unsampled Gaussian of shift 2k)
    ks = [k for k in range(1, kc + 1) if w[k] > 0.0]
    parts = [poisson_remove(GaussianNoise(e.sigma, 2.0 * k), eta) if eta < 1.0 else
             GaussianProfile(sigma=e.sigma / (2.0 * k)) for k in ks]
    ws = [w[k] for k in ks]
    rest = float(np.sum(w[kc + 1:]))
    if rest > 0.0:
        parts.append(_perfect())
        ws.append(rest)
    ws = np.asarray(ws) / np.sum(ws)
    rem = parts[0] if len(parts) == 1 else DisjointMixtureProfile(parts, ws)
    return MaxProfile(rem.reversed(), rem)


def _with_replacement_branches(e, relation: str) -> list[Branch]:
    up, lo = _with_replacement_remove(e), _with_replacement_remove(e, "lower")
    if relation == "substitution":
        return [Branch("substitution", _with_replacement_substitution_upper(e), lo)]
    if relation == "remove":
        return [Branch("remove", up, lo)]
    add = Branch("add", up.reversed(), lo.reversed())
    return [add] if relation == "add" else [add, Branch("remove", up, lo)]


register(E.WithReplacementGaussianEvent, pair=lambda e, c: _with_replacement_remove(e), symmetric=False,
         branches=_with_replacement_branches)
