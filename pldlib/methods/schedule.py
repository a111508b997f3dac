"""Certified grouping of long schedules of distinct steps (docs/MATH.md 5.8).

A schedule of many distinct subsampled-Gaussian steps (a noise-multiplier schedule, per-step
sampling rates) would need one discretisation and one spectrum per distinct step.  Steps whose
noise multipliers (and, for Poisson sampling, rates) fall in one cell of a fine geometric grid
are composed as one component whose **upper** profile is that of (the smallest sigma, the largest
q) of the cell and whose **lower** profile is that of (the largest sigma, the smallest q):

* less noise dominates more noise (adding independent noise is a post-processing), for any
  sampling scheme;
* under Poisson sampling a larger rate dominates a smaller one (keep each output with
  probability q / q', otherwise replace it by a fresh draw of the null component: a
  post-processing mapping the q' pair to the q pair, in both directions of every relation);
  used for example-level steps only (user-level steps, ``group`` > 1, are merged only at equal q).

So the grouped upper bound is certified (pessimistic) and the grouped lower bound is certified
(optimistic); the grid's effect lies inside the interval.  Guarantee: as the PLD accountant.
"""
from __future__ import annotations

import math

from .. import events as E
from .base import Step
from ..profiles.pairs import Branch

#: distinct subsampled-Gaussian steps from which a schedule is grouped
GROUP_FROM = 64
#: relative width of a grid cell in sigma
GROUP_RATIO = 2e-3
#: relative width of a grid cell in q (Poisson sampling), as a multiple of the sigma cells': eps
#: moves less with q than with sigma (near sigma 1, d ln eps / d ln q ~ 1 against ~1.6 for sigma;
#: measured on 10,000-step schedules: each 1e-3 of cell width adds ~0.12% to the interval's
#: relative width in q, ~0.19% in sigma)
GROUP_Q_FACTOR = 2.0


class GroupedStep(Step):
    """Several steps composed as one: upper profiles from ``upper_step``, lower profiles from
    ``lower_step`` (both dominate / are dominated by every member, see the module docstring)."""

    __slots__ = ("upper_step", "lower_step", "members")

    def __init__(self, upper_step: Step, lower_step: Step, members: list):
        super().__init__(upper_step.event, upper_step.relation)
        self.upper_step = upper_step
        self.lower_step = lower_step
        self.members = members

    def branches(self):
        if self._br is None:
            ups, lows = self.upper_step.branches(), self.lower_step.branches()
            if [b.label for b in ups] != [b.label for b in lows]:  # the same scheme and relation: never
                raise AssertionError("grouped steps with different branch labels")
            self._br = [Branch(u.label, u.upper, lo.lower) for u, lo in zip(ups, lows)]
        return list(self._br)

    def __repr__(self) -> str:
        return f"GroupedStep({len(self.members)} steps: upper {self.upper_step.event!r}, lower {self.lower_step.event!r})"


def _groupable(step: Step) -> bool:
    ev = step.event
    # (per-epoch schemes such as random allocation are left alone: their per-step pairs hold
    # only for whole epochs of one component)
    return isinstance(ev, E.Sampled) and ev.sampling in ("poisson", "wor") and isinstance(ev.event, E.GaussianEvent)


def group_schedule(components: list, relation: str, ratio: float = GROUP_RATIO,
                   group_from: int = GROUP_FROM, q_ratio: float | None = None) -> list:
    """``components`` [(Step, count)] with the subsampled-Gaussian steps grouped into cells of
    relative width ``ratio`` in sigma and ``q_ratio`` (default GROUP_Q_FACTOR * ratio) in q when
    there are at least ``group_from`` of them; others unchanged."""
    cand = [i for i, (s, _k) in enumerate(components) if _groupable(s)]
    if len(cand) < group_from:
        return components
    lr = math.log1p(ratio)
    lq = math.log1p(GROUP_Q_FACTOR * ratio if q_ratio is None else q_ratio)
    cells: dict = {}
    for i in cand:
        s, k = components[i]
        ev = s.event
        g = ev.event
        group = getattr(ev, "group", 1)
        # rates are merged only for example-level Poisson sampling (the thinning channel of the
        # module docstring moves one record; a user's several records cannot be thinned after the noise)
        qkey = math.floor(math.log(ev.q) / lq) if (ev.sampling == "poisson" and group == 1) else ev.q
        key = (ev.sampling, group, g.sensitivity, math.floor(math.log(g.sigma) / lr), qkey)
        cells.setdefault(key, []).append((s, k))
    keep = set(cand)
    out = [c for i, c in enumerate(components) if i not in keep]
    for (scheme, group, sens, _sk, _qk), members in cells.items():
        if len(members) == 1:
            out.append(members[0])
            continue
        sig = [s.event.event.sigma for s, _ in members]
        qs = [s.event.q for s, _ in members]
        up = Step(E.Sampled(E.GaussianEvent(min(sig), sens), max(qs), scheme, group=group), relation)
        lo = Step(E.Sampled(E.GaussianEvent(max(sig), sens), min(qs), scheme, group=group), relation)
        out.append((GroupedStep(up, lo, members), sum(k for _, k in members)))
    return out


class EpochStep(Step):
    """One whole epoch of a per-epoch sampling scheme (random allocation), composed as one step
    with the scheme's :meth:`~pldlib.sampling.base.SamplingScheme.epoch_branches`; ``t`` steps
    of ``event`` each (docs/MATH.md 13.2)."""

    __slots__ = ("t", "_epoch_branches")

    def __init__(self, step: Step, t: int, branches: list):
        super().__init__(step.event, step.relation)
        self.t = int(t)
        self._epoch_branches = branches

    def branches(self):
        return self._epoch_branches

    def __repr__(self) -> str:
        return f"EpochStep({self.event!r}, t={self.t})"


def epoch_components(components: list) -> list:
    """``components`` [(Step, count)] with the steps of a per-epoch scheme replaced by
    (EpochStep, count / t) where the scheme offers per-epoch branches (several such components when
    the scheme bounds an epoch by a composition, :meth:`~pldlib.sampling.base.SamplingScheme.epoch_pieces`) (counts are whole epochs:
    checked before every build, :func:`pldlib.sampling.base.check_steps`); others unchanged."""
    return _with_epochs(components, "epoch_pieces")


def exact_epoch_components(components: list) -> list:
    """As :func:`epoch_components`, replacing only the steps whose scheme has the epoch's exact
    pairs (:meth:`~pldlib.sampling.base.SamplingScheme.exact_epoch_pieces`: random allocation over
    t = 2 steps, docs/MATH.md 13.13); the others unchanged."""
    return _with_epochs(components, "exact_epoch_pieces")


def _with_epochs(components: list, method: str) -> list:
    """The steps of per-epoch schemes replaced by the pieces the scheme's ``method`` gives (None: kept)."""
    from ..sampling.base import get_scheme, scheme_kw

    out = []
    for s, k in components:
        ev = s.event
        if isinstance(ev, E.Sampled) and ev.q < 1.0 and ev.group == 1 and not isinstance(s, GroupedStep):
            scheme = get_scheme(ev.sampling)
            kw = scheme_kw(ev)
            t = scheme.steps_multiple(ev.q, **kw)
            if t > 1 and k % t == 0:
                pieces = getattr(scheme, method)(ev.event, ev.q, s.relation, **kw)
                if pieces is not None:
                    out.extend((EpochStep(s, t, br), (k // t) * c) for br, c in pieces)
                    continue
        out.append((s, k))
    return out
