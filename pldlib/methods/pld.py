"""The PLD accountant: certified (lower, upper) answers for composed mechanisms.

``account(mechanism, steps)`` (or a list of ``(mechanism, steps)``) discretises
every branch of every mechanism twice on one grid -- connect-the-dots
(pessimistic) and tangents + convex hull (optimistic) -- composes them by FFT
(:mod:`pldlib.pld.compose`) and reads delta(eps) and eps(delta) off the two
curves.  ``upper`` is a certified bound; ``lower`` is a certified lower bound
(the optimistic PLD is dominated by the true pair).  Answers whose round-off
share is not negligible are recomputed with an exponential tilt centred at
the answer, so small deltas stay tight; what cannot be certified raises
:class:`PrecisionLimitError`.
"""
from __future__ import annotations

import contextlib
import math
import time
import warnings
from typing import NamedTuple, Sequence

import numpy as np

from .. import _validate as V
from .. import events as E
from .. import exact as X
from .._validate import GridTooLargeError, PrecisionLimitError
from ..mechanisms import Mechanism
from .base import (Accountant, Interval, Step, StepsTables, as_event,  # noqa: F401
                            branch_labels, components_of)
from .schedule import GROUP_RATIO, EpochStep, GroupedStep, epoch_components, group_schedule
from ..sampling.allocation import with_unamplified
from ..pld.compose import (CUT_REL, DEFAULT_MAX_BINS, Composition, UntiltError, _fft_threads, compose, estimate_tilt,
                      solve_tilt)
from ..pld.discretize import (Grid, connect_the_dots, convex_hull_optimistic, grid_for, hull_offset, kept_points,
                         privacy_buckets)
from ..profiles.base import loss_range

__all__ = ["Interval", "account", "account_steps", "PLDAccountant", "PrecisionLimitError", "GridTooLargeError",
           "DISCRETISATIONS", "AccuracyLimitedWarning", "DEFAULT_MEMORY_BUDGET", "DEFAULT_TIME_BUDGET"]


class AccuracyLimitedWarning(UserWarning):
    """The automatic grid was coarsened to fit the memory or time budget: the answer is still a
    certified interval, only wider than the accuracy the automatic rule aims at
    (``PLDAccountant.accuracy_limited`` is then True)."""


#: default memory budget of the automatic grid (bytes): 1 GB
DEFAULT_MEMORY_BUDGET = 2**30
#: default time budget (seconds) of one query (and of one build) on an automatic grid: a
#: composition predicted to end past it coarsens the grid (flagged) instead of running
DEFAULT_TIME_BUDGET = 10.0
#: compositions of at most this many points always run, past the deadline too (a few tenths
#: of a second each): coarsening for time ends there
TIME_MIN_BINS = 2**18
#: seconds per FFT point of a composition (both sides, with reading its answers) before one
#: was measured on this accountant (5e-7 to 1e-6 here)
RATE_PRIOR = 8e-7
#: reading a composition's answers (query tables) costs about this fraction of composing it
READ_FACTOR = 0.7
#: a composition may use at most 1 / TIME_SAFETY of the time left (the re-tilt loop may need
#: a few); the cap is never below TIME_MIN_BINS
TIME_SAFETY = 3.0
#: bytes per FFT bin of a composition (both sides, transforms and work arrays; measured
#: peak about 100 bytes per bin): the automatic grid uses at most budget / this many bins
BYTES_PER_BIN = 128
#: bytes a cached composition keeps per FFT point and side (its masses and, once read, its
#: answer table: grid, tail sums and curve values)
RETAINED_BYTES_PER_BIN = 56
#: peak bytes per single-step grid point while a branch is discretised (both sides: measured
#: 134 for connect-the-dots, 273 with the optimistic hull, on 3.4 million points)
GRID_BYTES_PER_POINT = 320
#: at most this many halvings of the automatic spacing to fit the budget
MAX_COARSEN = 24
#: the time budget of the automatic grid: a single-step grid has at most this many points
#: (discretising a subsampled pair costs a few microseconds per point: about 1 s here)
AUTO_STEP_POINTS = 2**18

#: spacing of the cheap pessimistic PLDs that test whether a branch can matter, in units of h ...
COARSE_FACTOR = 8
#: ... doubled while their smallest grid keeps at least this many points: on fine grids the cheap
#: PLDs (screens of other branches, tilt estimates, the choice of points to connect) then cost
#: what they cost at coarser h instead of growing with 1/h (DP-SGD headline: 8 h at h = 1e-4,
#: 64 h at h = 1.24e-5)
COARSE_POINTS = 4096
#: an upper-only accountant's eps(delta) query connects the dots of a branch of at most THIN_MAX_COMPONENTS
#: components at the points that matter at its tilt only (:func:`kept_points`, docs/MATH.md 3.1)
#: when its grids have at least THIN_FROM points (the cheap PLDs of :meth:`_Discretised.coarse` choose them)
THIN_FROM = 4096
THIN_MAX_COMPONENTS = 4
#: a component that would keep more than this fraction of its points keeps all of them (instruction
#: counts: keeping 78% of the points cost as much as keeping all, 84% 2% more)
THIN_MAX_KEPT = 0.9
#: thinned PLD lists kept per discretisation (each for one set of points; the oldest is dropped)
THIN_CACHE = 8
#: a screened branch whose normal-approximation score (``_likely_first``) lies at least this relative
#: distance below the first branch's is screened first at SCREEN_SPREAD times the cheap spacing (4x
#: fewer points, a 4x smaller composition), and at the cheap spacing only where that one cannot skip
#: it (on 24 benchmark cases every branch with such a gap was skipped at the wider spacing already)
SCREEN_SPREAD_GAP = 0.02
SCREEN_SPREAD = 4
#: ... provided its grids at that spacing keep at least this many points (DP-SGD headline: 1,001 at
#: h = 9.9e-5; on coarser ones the wider screen would rarely skip)
SCREEN_SPREAD_POINTS = 512
#: from this many distinct components on, every branch is composed in full (no coarse screening:
#: its discretisations would cost more than the branch it might skip)
SCREEN_MAX_COMPONENTS = 32
#: branches whose normal-approximation scores (``_likely_first``) are within this relative
#: distance of the highest are all composed in full, unscreened
SCREEN_CLOSE = 1e-3
#: the spacing rule's h^2 term: h <= sqrt(RULE_C * eps_typ / K) (docs/MATH.md 5.1)
RULE_C = 0.002
#: the automatic grid is refined when a probe's relative width exceeds this (aiming at 0.4%)
REFINE_ABOVE = 0.006
#: names accepted by ``account(..., discretisation=...)``
DISCRETISATIONS = ("connect_the_dots", "privacy_buckets")

#: round-off share of an answer above which it is recomputed with a tilt
RETILT_SHARE = 1e-4
#: round-off share above which an answer is refused as not certifiable
REFUSE_SHARE = 0.5
#: total P-mass of all steps' single-step losses truncated to +inf (pessimistic) is at most this
TAIL_TOTAL = 1e-32
#: the per-step truncated mass is TAIL_TOTAL / max(steps, TAIL_STEPS): the same for every steps
#: count up to 10^6, so one discretisation serves them all (:func:`account_steps`)
TAIL_STEPS = 10**6


def _cut_scale(deltas) -> float | None:
    """The power of ten at or below the smallest delta asked (a composition's ``cut_scale``:
    tails below CUT_REL of it are not worth a window; bucketed so that nearby queries share
    one composition)."""
    d = float(np.min(deltas)) if np.size(deltas) else 0.0
    if not d > 0.0:
        return None
    return 10.0 ** math.floor(math.log10(d))


def _tail_for(total_steps: int) -> float:
    return TAIL_TOTAL / max(int(total_steps), TAIL_STEPS)


def _discretisation(name) -> str:
    if not isinstance(name, str) or name not in DISCRETISATIONS:
        raise ValueError(f"discretisation: must be one of {', '.join(DISCRETISATIONS)}, got {name!r}")
    return name


def account(mechanism, steps: int | None = None, *, spacing: float | None = None, interval: float | None = None,
            max_bins: int = DEFAULT_MAX_BINS, discretisation: str = "connect_the_dots",
            lower_bound: bool = True, memory_budget: int = DEFAULT_MEMORY_BUDGET,
            time_budget: float | None = DEFAULT_TIME_BUDGET) -> "PLDAccountant":
    """Account for ``steps`` compositions of ``mechanism`` (or a heterogeneous list).

    Parameters
    ----------
    mechanism : Mechanism or list of (Mechanism, steps)
    steps : number of compositions: required for a single mechanism (no silent default of
        one step: ``TypeError`` names it), not given with a list of (mechanism, steps)
    spacing : grid spacing h of the privacy-loss discretisation (``interval`` is an older
        name of the same argument; the accountant's ``spacing`` attribute says which it used) (the accuracy
        knob); by default chosen from the composed loss distribution so that the
        relative width of eps intervals is well under 1% in typical use.
    max_bins : cap on FFT length (memory guard)
    discretisation : ``"connect_the_dots"`` (default: connect-the-dots for the
        upper bound, tangents + convex hull for the lower) or
        ``"privacy_buckets"`` (the classic baseline: losses rounded up for the
        upper bound and down for the lower; both stay certified, but the
        width shrinks only like h instead of h^2: the default interval is
        refined at that rate but at most 16x below the connect-the-dots rule,
        within ``max_bins``, so it is typically much wider there; pass
        ``interval`` to compare the two at matched accuracy).
    lower_bound : with False only the pessimistic side is built and composed
        (about half the work): answers keep their certified upper bounds and report
        lower bounds of -inf (eps) or 0 (delta).  Needs an explicit ``interval``.
    memory_budget : bytes the automatic grid may use (default 1 GB,
        :data:`DEFAULT_MEMORY_BUDGET`); the automatic grid also keeps each single-step
        grid within :data:`AUTO_STEP_POINTS` points (its time budget: a few seconds).
        When the automatic accuracy does not fit,
        the spacing is coarsened until it does: the answers stay certified but are
        wider, ``acc.accuracy_limited`` is True and an :class:`AccuracyLimitedWarning`
        is issued.  (:class:`GridTooLargeError` is raised only for an explicit
        ``interval`` that does not fit ``max_bins``.)
    time_budget : seconds one query (or the build) may spend on an automatic grid (default
        10, :data:`DEFAULT_TIME_BUDGET`; None: no limit).  A composition predicted (from the
        measured cost per FFT point) to end past it is not started: the grid is coarsened
        instead, or the re-tilt loop keeps the certified answers it has, with the same flag
        and warning as the memory budget.  The budget is soft (discretisation and the last
        composition are not interrupted) and never applies to an explicit ``interval``.

    Unsampled Gaussian, randomized-response and (eps0, delta0)-DP steps are answered
    exactly (:mod:`pldlib.exact`, docs/MATH.md section 12): all unsampled Gaussians
    are combined into one Gaussian step first, the delta0 masses are taken out
    exactly, and when nothing else is composed the answer is the closed form (or the
    exact binomial enumeration) with an interval as narrow as round-off allows.

    Examples
    --------
    >>> acc = account(Gaussian(sigma=0.8), steps=1000)
    >>> acc.epsilon(1e-6)            # Interval(lower=..., upper=...)
    """
    return PLDAccountant.for_mechanism(mechanism, steps, spacing=spacing, interval=interval, max_bins=max_bins,
                                       discretisation=discretisation, lower_bound=lower_bound,
                                       memory_budget=memory_budget, time_budget=time_budget)


def account_steps(mechanism: Mechanism, steps_list: Sequence[int], *, interval: float | None = None,
                  max_bins: int = DEFAULT_MAX_BINS, discretisation: str = "connect_the_dots",
                  errors: str = "raise") -> list:
    """Accountants for ``mechanism`` at several steps counts, sharing discretisations.

    Returns one :class:`PLDAccountant` per entry of ``steps_list`` (same order).
    Steps values that can share a grid are discretised once; each accountant then
    composes on its own, and is identical to
    ``account(mechanism, steps=k, interval=acc.interval, ...)`` (for k <= 10^6),
    so every answer keeps its certificate.

    Interval rule (``interval=None``): the steps values are taken from the largest
    down; a group is led by its largest K, whose spacing is the one
    ``account(mechanism, steps=K)`` would choose (rule of :func:`_rule_interval`
    plus the probe refinements); a smaller K joins the group when the group's
    spacing is at most the one the rule gives K itself (so it is never coarser
    than K's own rule), otherwise it leads a new group.  Typical DP-SGD sweeps
    (100..10,000 steps) need one group.  With an explicit ``interval`` all
    steps share it.

    ``errors="return"`` puts the exception in place of an accountant that cannot
    be built (after retrying it alone when its group's discretisation failed),
    so that one bad steps value does not lose the others.
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError("account_steps: mechanism must be a single Mechanism")
    return _account_steps(mechanism.relation, mechanism.event, steps_list, interval=interval, max_bins=max_bins,
                          discretisation=discretisation, errors=errors)


def _account_steps(relation, event, steps_list, *, interval=None, max_bins=DEFAULT_MAX_BINS,
                   discretisation="connect_the_dots", errors="raise") -> list:
    """:func:`account_steps` for an event under ``relation``."""
    if errors not in ("raise", "return"):
        raise ValueError(f"errors: must be 'raise' or 'return', got {errors!r}")
    ks = [V.steps(f"steps_list[{i}]", k) for i, k in enumerate(steps_list)]
    if not ks:
        raise ValueError("steps_list: empty")
    _discretisation(discretisation)
    kw = dict(max_bins=max_bins, discretisation=discretisation)

    def make(k, start=None, h=None):
        acc = PLDAccountant(relation, interval=h, **kw)
        acc._start = start
        acc.compose(event, k)
        acc._ensure_built()
        return acc

    out: list = [None] * len(ks)
    distinct = sorted(set(ks), reverse=True)
    rule = {}
    if interval is None:
        try:
            one = PLDAccountant(relation, **kw).compose(event, 1)
            per_comp = [s.branches() for s, _ in one.components]
            stats = _step_stats(one.components, per_comp)
            ef = _edge_factor(kw.get("discretisation", "connect_the_dots"))
            rule = {k: _rule_interval(stats, [k], edge_factor=ef)[0] for k in distinct}
            if any(_per_epoch(s) for s, _ in one.components):
                rule = {}  # per-epoch pairs (random allocation): each steps value built on its own
        except Exception:
            if errors == "raise":
                raise
            rule = {}  # build each on its own below
    built: dict[int, object] = {}
    todo = list(distinct)
    while todo:
        lead = todo.pop(0)
        try:
            if interval is None and lead in rule:
                acc = make(lead, start=rule[lead])
            else:
                acc = make(lead, h=interval)
        except Exception as e:
            if errors == "raise":
                raise
            built[lead] = e
            continue
        built[lead] = acc
        rest = []
        for k in todo:
            joins = _tail_for(k) == acc.tail and (interval is not None or k not in rule
                                                  or acc.interval <= rule[k])
            if joins and (interval is not None or k in rule):
                built[k] = acc._for_steps(k)
            else:
                rest.append(k)
        todo = rest
    for i, k in enumerate(ks):
        out[i] = built[k]
    return out


def _eps_floor(deltas: np.ndarray) -> np.ndarray:
    """ln(1 - delta) rounded down: a lower bound on eps(delta) for every pair, since delta(eps) >=
    1 - e^eps > delta left of it (docs/MATH.md 0.3: H(gamma) >= 1 - gamma)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.log1p(-np.asarray(deltas, dtype=float))
    return v - 4.0 * _U * np.abs(v)


def _delta_floor(eps: np.ndarray) -> np.ndarray:
    """(1 - e^eps)_+ rounded down: a lower bound on delta(eps) for every pair (docs/MATH.md 0.3);
    the whole of delta(eps) up to e^eps delta_reverse(-eps) where eps < 0 (0.5)."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = -np.expm1(np.minimum(np.asarray(eps, dtype=float), 0.0))
    return np.maximum(v * (1.0 - 4.0 * _U), 0.0)


def _ordered(lo: np.ndarray, up: np.ndarray, what: str, x: np.ndarray):
    """(lo, up), checked: two certified bounds of one number satisfy lo <= up, so a lower end
    above the upper one is a defect of one of them (docs/MATH.md 3.6): it is reported, never
    hidden by taking the minimum."""
    lo = np.asarray(lo, dtype=float)
    up = np.asarray(up, dtype=float)
    nan = np.isnan(lo) | np.isnan(up)
    if np.any(nan):
        j = int(np.flatnonzero(nan.ravel())[0])
        raise PrecisionLimitError(
            f"{what} at {np.ravel(x)[j]:.6g}: floating point was exceeded on this grid (a bound came out "
            "NaN: the composed privacy losses reach beyond e^eps's range), so no interval is returned; "
            "the composition is too long or too coarse for this accountant")
    bad = lo > up
    if np.any(bad):
        j = int(np.flatnonzero(bad.ravel())[0])
        raise PrecisionLimitError(
            f"{what} at {np.ravel(x)[j]:.6g}: the certified lower bound {lo.ravel()[j]:.17g} exceeds the certified "
            f"upper bound {up.ravel()[j]:.17g}; one of them is not a bound here (an internal defect: please report "
            "it), so no interval is returned")
    return lo, up


_U = np.finfo(float).eps / 2


def _per_epoch(step) -> bool:
    """Whether ``step`` belongs to a scheme accounted per epoch (its steps are composed as
    :class:`~pldlib.methods.schedule.EpochStep` s, so per-step statistics do not describe them)."""
    ev = step.event
    if not (isinstance(ev, E.Sampled) and ev.q < 1.0):
        return False
    from ..sampling.base import get_scheme

    return get_scheme(ev.scheme).steps_multiple(ev.q) > 1


class _Discretised:
    """The single-step PLDs of one branch (one direction) at spacing h, built on first use.

    The grids are laid out (and their size checked) at construction; the
    connect-the-dots and convex-hull PLDs are computed only when a query needs
    this branch at full accuracy.  ``coarse()`` gives pessimistic PLDs of the
    same profiles at the cheap spacing :meth:`coarse_factor` * h (for the dominance test of
    :meth:`PLDAccountant.epsilon`).  Shared by the accountants that
    :func:`account_steps` derives from one discretisation.
    """

    def __init__(self, pairs, h, tail, max_bins, discretisation, upper_only=False):
        self.pairs = pairs  # [(upper profile, lower profile)] per component
        self.h, self.tail, self.max_bins = h, tail, max_bins
        self.discretisation = discretisation
        self.upper_only = upper_only
        # the optimistic hull uses an offset lattice where a support edge lies within 2h of 0
        # (docs/MATH.md 3.2); buckets round losses down and need none
        hull = discretisation != "privacy_buckets"
        self.grids = [(grid_for(pu, h, tail, max_bins),
                       None if upper_only else grid_for(pl, h, tail, max_bins,
                                                        offset=hull_offset(pl, h) if hull else 0.0))
                      for pu, pl in pairs]
        self._whole = [None, None]    # [uppers, lowers] on the whole grids
        self._levels: dict = {}       # truncation tail -> [uppers, lowers] on truncated grids
        self._level_grids: dict = {}  # truncation tail -> [(upper grid, lower grid or None)]
        self._coarse: dict = {}       # truncation tail (None: whole) -> coarse pessimistic PLDs
        self._carried: dict = {}      # truncation tail -> fine pessimistic PLDs carried to the coarse spacing
        self._moments0 = None         # per component (mean, variance, p_inf) by quadrature; [] if none
        self._thinned: dict = {}      # (tail, points kept per component) -> (serial, thinned pessimistic PLDs)
        self._serial = 0

    def _slots(self):
        return [self._whole, *self._levels.values()]

    @property
    def _fine(self):
        """(uppers, lowers or None) on the whole grids, None until built."""
        u, lo = self._whole
        return None if u is None or (lo is None and not self.upper_only) else (u, lo)

    @property
    def built(self) -> bool:
        """Whether the fine PLDs of every side computed are built (at some range)."""
        return any(u is not None and (self.upper_only or lo is not None) for u, lo in self._slots())

    @property
    def uppers_built(self) -> bool:
        return any(u is not None for u, _ in self._slots())

    def level_for(self, cut_scale, counts) -> float | None:
        """The truncation tail of a query composed with ``cut_scale`` (None: the whole range):
        a power of ten at or below TRUNCATE_MARGIN * CUT_REL * cut_scale / steps."""
        if cut_scale is None or not cut_scale > 0.0:
            return None
        t = TRUNCATE_MARGIN * CUT_REL * float(cut_scale) / max(sum(int(k) for k in counts), 1)
        if not t > 10.0 * self.tail or max(g.n for g, _ in self.grids) < TRUNCATE_FROM:
            return None
        return 10.0 ** math.floor(math.log10(t))

    def _truncated(self, grid, profile, t: float):
        """The points of ``grid`` between where ``profile``'s tail masses fall to ``t`` (the same
        lattice points).  Connect-the-dots puts the mass left of its first point there and the
        curve left at its last point at +inf, and the optimistic hull stays under the curve on
        any grid, so a truncated grid is as sound as a whole one (docs/MATH.md 4.3)."""
        if grid is None:
            return None
        try:
            lo, hi = loss_range(profile, t)
        except (ValueError, ArithmeticError):
            return grid
        start = max(min(int(math.floor((lo - grid.offset) / grid.h)), -1), grid.start)
        stop = min(max(int(math.ceil((hi - grid.offset) / grid.h)), 1), grid.start + grid.n)
        if start == grid.start and stop == grid.start + grid.n:
            return grid
        return Grid(h=grid.h, start=start, n=stop - start, offset=grid.offset)

    def _grids_at(self, t):
        if t is None:
            return self.grids
        g = self._level_grids.get(t)
        if g is None:
            g = self._level_grids[t] = [(self._truncated(gu, pu, t), self._truncated(gl, pl, t))
                                        for (pu, pl), (gu, gl) in zip(self.pairs, self.grids)]
        return g

    def _one(self, pair, grids, t=None):
        """(upper PLD, lower PLD or None) of one component."""
        return self._one_upper(pair, grids), self._one_lower(pair, grids, t)

    def _one_upper(self, pair, grids):
        (pu, _pl), (gu, _gl) = pair, grids
        if self.discretisation == "privacy_buckets":
            return privacy_buckets(pu, gu, pessimistic=True)
        return connect_the_dots(pu, gu)

    def _one_lower(self, pair, grids, t=None):
        (_pu, pl), (_gu, gl) = pair, grids
        if gl is None:
            return None
        if self.discretisation == "privacy_buckets":
            return privacy_buckets(pl, gl, pessimistic=False)
        try:
            return convex_hull_optimistic(pl, gl)
        except ValueError:
            if gl.offset == 0.0:
                raise
            # no admissible tangent in the offset cell: the lattice through 0
            g0 = grid_for(pl, self.h, self.tail, self.max_bins)
            return convex_hull_optimistic(pl, g0 if t is None else self._truncated(g0, pl, t))

    def fine_uppers(self, t: float | None = None) -> list:
        """The pessimistic PLDs alone (a branch whose lower bound is not needed skips the
        optimistic ones: :meth:`PLDAccountant._combine`); ``t``: on grids truncated at that tail
        (:meth:`level_for`; a query's answer never depends on what earlier queries built)."""
        slot = self._whole if t is None else self._levels.setdefault(t, [None, None])
        if slot[0] is None:
            grids = self._grids_at(t)
            slot[0] = _map(self._one_upper, self.pairs, grids, points=_points(grids))
        return slot[0]

    def fine(self, t: float | None = None):
        """(pessimistic PLDs, optimistic PLDs or None), on grids truncated at ``t`` if given."""
        if self.upper_only:
            return self.fine_uppers(t), None
        slot = self._whole if t is None else self._levels.setdefault(t, [None, None])
        if slot[1] is None:
            grids = self._grids_at(t)
            if slot[0] is None:
                done = _map(lambda pair, g: self._one(pair, g, t), self.pairs, grids, points=_points(grids))
                slot[0], slot[1] = [u for u, _ in done], [lo for _, lo in done]
            else:
                slot[1] = _map(lambda pair, g: self._one_lower(pair, g, t), self.pairs, grids, points=_points(grids))
        return slot[0], slot[1]

    def coarse_factor(self, t: float | None = None) -> int:
        """k of the cheap PLDs' spacing k h on grids truncated at ``t``: COARSE_FACTOR, doubled
        while the smallest of those grids has at least 2 k COARSE_POINTS points."""
        n = min(gu.n for gu, _ in self._grids_at(t))
        k = COARSE_FACTOR
        while n // (2 * k) >= COARSE_POINTS:
            k *= 2
        return k

    def fits_wide_screen(self, t: float | None = None) -> bool:
        """Whether this branch's grids truncated at ``t`` keep at least SCREEN_SPREAD_POINTS
        points at SCREEN_SPREAD times the cheap spacing."""
        n = min(gu.n for gu, _ in self._grids_at(t))
        return n // (self.coarse_factor(t) * SCREEN_SPREAD) >= SCREEN_SPREAD_POINTS

    def coarse(self, t: float | None = None, spread: int = 1):
        """Pessimistic PLDs at spacing :meth:`coarse_factor` * ``spread`` * h (a cheap certified
        upper bound; any spacing is one); ``t``: on grids truncated at that tail
        (:meth:`level_for`, as the fine ones)."""
        key = t if spread == 1 else (t, spread)
        hit = self._coarse.get(key)
        if hit is None:
            k = self.coarse_factor(t) * spread
            hc = k * self.h
            tail = self.tail if t is None else max(self.tail, t)
            hit = self._coarse[key] = _map(
                lambda pair: connect_the_dots(pair[0], grid_for(pair[0], hc, tail, self.max_bins)),
                self.pairs, points=_points(self.grids) / k)
        return hit

    def fine_coarsened(self, t: float | None = None) -> list:
        """The fine pessimistic PLDs (on grids truncated at ``t``) carried to spacing
        :meth:`coarse_factor` * h (:meth:`DiscretePLD.coarsened`): inputs of estimates only."""
        if t not in self._carried:
            k = self.coarse_factor(t)
            self._carried[t] = [p.coarsened(k) for p in self.fine_uppers(t)]
        return self._carried[t]

    def thinnable(self, t: float | None) -> bool:
        """Whether :meth:`thinned_uppers` may pay on grids truncated at ``t``."""
        return (self.discretisation == "connect_the_dots" and len(self.pairs) <= THIN_MAX_COMPONENTS
                and min(gu.n for gu, _ in self._grids_at(t)) >= THIN_FROM)

    def thinned_uppers(self, t: float | None, theta: float) -> tuple[int, list] | None:
        """(serial, pessimistic PLDs) connecting the dots only at the points that matter for a
        composition tilted by ``theta`` (:func:`kept_points`, chosen from :meth:`coarse`), on
        grids truncated at ``t``; None when it does not pay (few points, many components, no
        connect-the-dots): then :meth:`fine_uppers` serve.  The points
        depend on ``t`` and ``theta`` alone, so a query's answer never depends on what earlier
        queries built; the serial names the list for caches of its compositions."""
        if not self.thinnable(t):
            return None
        grids = self._grids_at(t)
        keeps = [kept_points(gu, c, theta) for (gu, _), c in zip(grids, self.coarse(t))]
        keeps = [None if k is None or k.size > THIN_MAX_KEPT * (g.n + 1) else k for k, (g, _) in zip(keeps, grids)]
        if all(k is None for k in keeps):
            return None
        key = (t, tuple(None if k is None else k.tobytes() for k in keeps))
        hit = self._thinned.pop(key, None)
        if hit is None:
            self._serial += 1
            hit = (self._serial, [connect_the_dots(pu, gu, keep=k) for (pu, _), (gu, _), k
                                  in zip(self.pairs, grids, keeps)])
        self._thinned[key] = hit  # (most recently used last)
        while len(self._thinned) > THIN_CACHE:
            self._thinned.pop(next(iter(self._thinned)))
        return hit

    def step_moments(self) -> list | None:
        """Per component: (mean, variance, P(L = inf)) of one step's loss under its pessimistic
        profile, from the profile's quadrature (:meth:`PrivacyProfile.loss_moments`, an
        estimate); None when a profile has none (then callers use coarse PLDs)."""
        if self._moments0 is None:
            out = []
            for pu, _pl in self.pairs:
                try:
                    m = pu.loss_moments()
                except (ArithmeticError, ValueError):
                    m = None
                if m is None:
                    out = []
                    break
                out.append((m[0], m[1], float(pu.p_inf)))
            self._moments0 = out
        return self._moments0 or None


def _points(grids) -> float:
    """Average points of the (upper) grids of a list of components."""
    return sum(gu.n for gu, _ in grids) / max(len(grids), 1)


class TimeBudgetError(GridTooLargeError):
    """A composition of the automatic grid needs more points than the time left allows
    (internal: the automatic grid coarsens by :func:`_coarsen_factor`, or the re-tilt loop
    keeps the certified answers it has; never seen by users)."""


def _coarsen_factor(err) -> float:
    """How much coarser the next automatic grid is: 2, or at once the power of 2 (at most
    2^8) that brings a composition of ``err.need`` points within ``err.limit`` (the window's
    points scale like 1/h)."""
    need, limit = getattr(err, "need", None), getattr(err, "limit", None)
    if not need or not limit or need <= limit:
        return 2.0
    return float(2 ** min(8, max(1, math.ceil(math.log2(need / limit)))))


#: a query's fine PLDs end where a step's right tail falls below TRUNCATE_MARGIN times the per-step
#: threshold beyond which its composition cuts tails anyway (compose.CUT_REL * cut_scale / steps,
#: docs/MATH.md 4.3): the rest of the range (down to the accountant's own tail) is built only for
#: queries that need it.  Grids below TRUNCATE_FROM points are always built whole.
TRUNCATE_MARGIN = 0.25
TRUNCATE_FROM = 4096

#: from this many components on, their discretisations run on a thread pool ...
THREADS_FROM = 32
#: ... when their grids average at least this many points (measured on 2 cores: schedules of
#: ~350 components of 3,000-7,000 points ran 15-25% slower on two threads than on one)
THREADS_POINTS = 2**15


def _map(fn, *items, points: float = math.inf) -> list:
    """[fn(*args) for args in zip(*items)], on ``PLDLIB_FFT_WORKERS`` threads (default: the CPUs
    this process may use, at most 8) when there are at least THREADS_FROM items of ``points``
    >= THREADS_POINTS grid points on average (the profile evaluations are numpy loops that
    release the GIL, which pays on long arrays only).  Order kept; the first exception is raised."""
    n = len(items[0])
    workers = _fft_threads()
    if n < THREADS_FROM or workers < 2 or points < THREADS_POINTS:
        return [fn(*args) for args in zip(*items)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(workers, n)) as ex:
        return list(ex.map(fn, *items))


def _tilt_plds(st, cut=None) -> list:
    """PLDs to estimate a tilt on (it needs no precision), for a branch about to be composed
    at full accuracy (its fine pessimistic PLDs are built next anyway): those fine PLDs carried
    to the cheap spacing (:meth:`DiscretePLD.coarsened`: ~20 us on 3,000 points, where a
    coarse connect-the-dots of the profile costs ~0.5 ms); the fine PLDs themselves for long
    schedules (many components: the estimate's passes over them cost less than the carries)."""
    if len(st.counts) >= SCREEN_MAX_COMPONENTS:
        return st.uppers_at(cut)
    return st.source.fine_coarsened(st.source.level_for(cut, st.counts))


def _estimated_tilt(st, plds, delta: float, cut) -> float:
    """:func:`estimate_tilt` of ``plds`` (a branch's cached list) composed ``st.counts`` times,
    kept per (list, delta, cut) on the branch."""
    key = (id(plds), float(delta), cut)
    hit = st.tilts.get(key)
    if hit is None:
        hit = st.tilts[key] = estimate_tilt(plds, st.counts, float(delta), cut)
    return hit


class _BranchState:
    """One branch label of an accountant: its (lazily built) PLDs, counts and compositions."""

    def __init__(self, label: str, source: _Discretised, counts: list):
        self.label = label
        self.source = source
        self.counts = counts
        self.cache: dict = {}
        self.coarse_cache: dict = {}
        self.tilts: dict = {}  # (id of a PLD list, delta, cut) -> estimated tilt

    @property
    def uppers(self) -> list:
        return self.source.fine_uppers()

    def uppers_at(self, cut_scale) -> list:
        """The pessimistic PLDs a composition with this ``cut_scale`` needs (truncated beyond
        what it cuts: :meth:`_Discretised.level_for`)."""
        return self.source.fine_uppers(self.source.level_for(cut_scale, self.counts))

    def lowers_at(self, cut_scale) -> list:
        return self.source.fine(self.source.level_for(cut_scale, self.counts))[1]

    def coarse_at(self, cut_scale, spread: int = 1) -> list:
        return self.source.coarse(self.source.level_for(cut_scale, self.counts), spread)

    @property
    def lowers(self) -> list:
        return self.source.fine()[1]


def _check_interval(h: float, per_comp, tail: float) -> None:
    """Refuse an explicit spacing h wider than half of every step's whole privacy-loss range
    (down to the truncated tail mass): each grid would hold at most two cells, and the
    certified interval, still valid, would say nothing (e.g. [-1e-5, 999.8] for 10 Gaussian
    steps at h = 100)."""
    widths = []
    for bl in per_comp:
        for b in bl:
            try:
                lo, hi = loss_range(b.upper, tail)
            except (ValueError, ArithmeticError):
                return  # the discretiser reports these itself
            widths.append(hi - lo)
    if widths and all(h > w / 2.0 for w in widths):
        w = max(widths)
        raise ValueError(f"interval: {V.fmt(h)} is wider than half the whole single-step privacy-loss range "
                         f"({w:.3g}): the grid would hold at most two cells and the certified interval would "
                         f"be meaningless; use interval <= {w / 50:.2g} or leave it automatic")


# -- accuracy knob ------------------------------------------------------------------------
#: from this many components on (schedules), the spacing rule's moments and widths come from
#: STATS_SAMPLE of them, evenly spaced; every component still gives its support edges
STATS_LIGHT_FROM = 64
STATS_SAMPLE = 24


def _step_stats(components, per_comp):
    """Per branch label, per component: (mean, variance, support width, support edges) of
    one step's loss (from a cheap connect-the-dots PLD at 4000 points).

    Long schedules (>= STATS_LIGHT_FROM components, e.g. grouped ones) compute the moments and
    widths of STATS_SAMPLE evenly spaced components only and give the others the sample's
    count-weighted means (the rule's sums are then estimates, which is all the rule needs: it
    only chooses the spacing, never a bound); support edges are each component's own."""
    out = []
    n_labels = max(len(b) for b in per_comp)
    n = len(components)
    sample = set(np.linspace(0, n - 1, STATS_SAMPLE).round().astype(int).tolist()) if n >= STATS_LIGHT_FROM \
        else set(range(n))
    for j in range(n_labels):
        row = [None] * n
        for i, ((m, _k), bl) in enumerate(zip(components, per_comp)):
            if i not in sample:
                continue
            prof = bl[min(j, len(bl) - 1)].upper
            lo, hi = prof.eps_bounds(1e-12)
            # (the grid spans 0 as well: a loss range away from 0 -- one atom, e.g. a lattice
            # pair's single finite loss -- must not make the spacing 1e-9)
            h0 = max((max(hi, 0.0) - min(lo, 0.0)) / 4000.0, 1e-9)
            pld = connect_the_dots(prof, grid_for(prof, h0, 1e-12))
            mu, v = pld.moments()
            # an optimistic PLD cannot resolve mass between 0 and a support edge
            # closer than h (e.g. ln(1-q) for Poisson remove): keep h below half of it
            edges = [abs(e) for e in (lo, hi) if e != 0.0 and math.isfinite(e)]
            row[i] = (mu, v, hi - lo, edges)
        if len(sample) < n:
            ks = np.array([components[i][1] for i in sorted(sample)], dtype=float)
            st = [row[i] for i in sorted(sample)]
            mu_bar = float(np.dot(ks, [t[0] for t in st]) / ks.sum())
            v_bar = float(np.dot(ks, [t[1] for t in st]) / ks.sum())
            w_min = min(t[2] for t in st)
            for i, bl in enumerate(per_comp):
                if row[i] is None:
                    lo, hi = bl[min(j, len(bl) - 1)].upper.support_edges()
                    row[i] = (mu_bar, v_bar, w_min, [abs(e) for e in (lo, hi) if e != 0.0 and math.isfinite(e)])
        out.append(row)
    return out


def _edge_factor(discretisation: str) -> float:
    """The edge term of the spacing rule (docs/MATH.md 5.1): h <= edge / 2 for privacy buckets
    (their optimistic side needs lattice points inside the edge), h <= EDGE_FACTOR_CTD * edge
    otherwise: the hull's offset lattice puts a point inside the edge at any h, and the probe
    refines h where the width needs it, so the edge only caps h loosely (at 1x it bound at small
    sigma and small q and bought widths ~100x below the 0.6% aim at 2-7x the time)."""
    return 0.5 if discretisation == "privacy_buckets" else EDGE_FACTOR_CTD


#: the spacing rule's edge term for connect-the-dots: h <= this * (nearest single-step support edge)
EDGE_FACTOR_CTD = 8.0


def _rule_interval(stats, counts, edge_factor: float | None = 1.0, c: float | None = None) -> tuple[float, float]:
    """h = min(s_K / 50, sqrt(c * eps_typ / K), edge_factor * edge) (and (eps_typ) of the binding branch).

    Connect-the-dots shifts each step's loss by about h^2/8 (optimistic
    side: a few times that), so the width after K steps grows like K h^2; the
    h^2 term (c = RULE_C by default) puts a probe answer's relative width at a
    typical epsilon eps_typ = mean + 3 sd of the composed loss under about 0.6%, and
    resolving the composed spread s_K by 50 points gives the first term (docs/MATH.md 5.1).
    ``edge`` is the distance from 0 to the nearest edge of a single-step loss support
    (|ln(1-q)| for Poisson remove): it keeps one step's loss law resolved.
    The accountant then refines h (at most twice) from a probe answer's width.
    ``stats`` comes from :func:`_step_stats`; ``counts`` are the steps per component.
    ``edge_factor=None`` drops the edge term: the spacing an *upper* bound needs (calibration,
    which also passes its own ``c``).
    """
    c = RULE_C if c is None else float(c)
    ef = 0.5 if edge_factor is None else float(edge_factor)  # (no edges then: only the 0.2 default)
    best, best_eps = math.inf, 1.0
    for row in stats:
        mean = var = 0.0
        K = 0
        widths = []
        edge_list = []
        for (mu, v, width, e), k in zip(row, counts):
            mean += k * mu
            var += k * v
            K += k
            if width > 0:
                widths.append(width)
            if edge_factor is not None:
                edge_list.extend(e)
        s = math.sqrt(max(var, 1e-300))
        eps_typ = max(mean + 3 * s, 1e-3)
        if var <= 0 or not widths:  # a single atom per step: any spacing resolves it
            h = min(ef * min(edge_list, default=0.2), 0.1)
        else:
            h = min(s / 50.0, math.sqrt(c * eps_typ / K), min(widths) / 50.0,
                    ef * min(edge_list, default=math.inf))
        if h < best:
            best, best_eps = h, eps_typ
    return float(max(best, 1e-6)), best_eps


class PLDAccountant(Accountant):
    """Certified PLD accounting (docs/MATH.md sections 3-5): events in, intervals out.

    ``PLDAccountant(relation, spacing=None, max_bins=..., discretisation=...,
    lower_bound=True).compose(event, count)``; see :func:`account` for the options.
    ``spacing`` is the grid spacing used (built on first use; ``interval`` is its older name).
    Each query answers with an :class:`Interval` whose ``upper`` is a certified upper
    bound (connect-the-dots, pessimistic) and ``lower`` a certified lower bound
    (tangents + convex hull, optimistic).
    """

    method = "pld"
    kind = "certified"

    def __init__(self, relation: str = "add_remove", *, spacing: float | None = None,
                 interval: float | None = None, max_bins: int = DEFAULT_MAX_BINS,
                 discretisation: str = "connect_the_dots", lower_bound: bool = True,
                 memory_budget: int = DEFAULT_MEMORY_BUDGET, time_budget: float | None = DEFAULT_TIME_BUDGET):
        super().__init__(relation)
        if spacing is not None:  # (``interval`` is the older name of the grid spacing)
            if interval is not None and interval != spacing:
                raise ValueError(f"spacing: given twice, as spacing={V.fmt(spacing)} and interval={V.fmt(interval)}")
            interval = spacing
        self.memory_budget = V.positive_int("memory_budget", memory_budget)
        self.time_budget = None if time_budget is None else V.positive_finite("time_budget", time_budget)
        self._deadline = None
        if not isinstance(lower_bound, bool):
            raise TypeError(f"lower_bound must be True or False, got {lower_bound!r}")
        if not lower_bound and interval is None:
            raise ValueError("lower_bound=False needs an explicit interval (the automatic one is tuned on the "
                             "width of the interval)")
        self._interval_opt = None if interval is None else V.positive_finite("interval", interval)
        self.upper_only = not lower_bound
        self.discretisation = _discretisation(discretisation)
        self.max_bins = V.positive_int("max_bins", max_bins)
        # an explicit max_bins is a user setting: it is never coarsened around (GridTooLargeError)
        self._bins_explicit = self.max_bins != DEFAULT_MAX_BINS
        if self.max_bins < 16:
            raise ValueError(f"max_bins must be at least 16, got {self.max_bins}")
        self._start = None  # a starting spacing for the automatic rule (account_steps)

    @property
    def spacing(self) -> float:
        """The grid spacing h of the privacy-loss discretisation (the same as ``interval``)."""
        return self.interval

    def _options(self) -> dict:
        out = {"interval": self._interval_opt, "max_bins": self.max_bins, "discretisation": self.discretisation,
               "lower_bound": not self.upper_only}
        if self.memory_budget != DEFAULT_MEMORY_BUDGET:
            out["memory_budget"] = self.memory_budget
        if self.time_budget != DEFAULT_TIME_BUDGET:
            out["time_budget"] = self.time_budget
        return out

    def epsilon_per_steps(self, event, steps, deltas):
        """As :meth:`Accountant.epsilon_per_steps`; the steps values share discretisations
        (:func:`account_steps`: each answer equals ``account(..., steps=k, interval=h)`` at
        the shared spacing h)."""
        if self.upper_only:
            return super().epsilon_per_steps(event, steps, deltas)
        deltas = V.delta_array("deltas", deltas)
        ks, make = self._shared_steps(event, steps)
        return self._table(ks, deltas, make, release=True)

    def _release(self) -> None:
        """Drop the cached compositions (each up to ``max_bins`` points per side); the shared
        single-step discretisation stays.  Later queries recompose what they need."""
        for st in getattr(self, "_branches", None) or []:
            st.cache.clear()
            st.coarse_cache.clear()

    def _tables(self, event, steps, deltas, fprs):
        """As :meth:`Accountant._tables`; epsilons and TPRs of a steps value come from
        the same accountant, and the steps values share discretisations (:func:`account_steps`)."""
        if self.upper_only:
            return super()._tables(event, steps, deltas, fprs)
        from ..pld.tradeoff import alpha_array

        deltas = V.delta_array("deltas", deltas)
        fprs = alpha_array("fprs", fprs)
        ks, make = self._shared_steps(event, steps)
        lo, est, up, notes = self._table(ks, deltas, make)
        tlo, tup, tnotes, why = self._tpr_table(ks, fprs, make)
        return StepsTables(lo, est, up, notes, tlo, tup, tnotes, why)

    def _shared_steps(self, event, steps):
        """``(ks, make)``: the validated steps values and ``make(k)`` -> the accountant of ``k`` runs
        of ``event`` (or the exception that building it raised), sharing discretisations."""
        ks = [V.steps(f"steps[{i}]", k) for i, k in enumerate(steps)]
        event = as_event(event, self.relation)
        accs = _account_steps(self.relation, event, ks, interval=self._interval_opt, max_bins=self.max_bins,
                              discretisation=self.discretisation, errors="return")
        return ks, (lambda k: accs[ks.index(k)])

    # -- exact parts (pldlib.exact) and the effective components ------------------------
    def _split(self):
        """Set ``_exact`` (a pair with certified ``delta_bounds``/``epsilon_bounds`` when the
        whole composition is exact, else None), ``_pinf`` (bounds on the +inf mass taken
        out of (eps0, delta0) steps) and ``_eff`` (the steps left to discretise: unsampled
        Gaussians combined into one step, randomized-response pairs, the rest)."""
        sp = X.split_exact([(s.event, k) for s, k in self._steps], self.relation)
        self._pinf = sp.pinf_bounds()
        self._exact = None
        rest = {id(e) for e, _ in sp.rest}
        eff = [(s, k) for s, k in self._steps if id(s.event) in rest]
        eff = epoch_components(eff)  # random allocation: one amplified pair per epoch (MATH 13.2)
        eff = group_schedule(eff, self.relation)  # long schedules: certified grouping (MATH 5.8)
        # the combined Gaussian: pair(event, c) gives sigma_comb / c = 1 / mu
        c = 2.0 if self.relation == "substitution" else 1.0
        gauss = None
        if sp.gauss_terms:
            # sigma of the combined step: 1 / sqrt(sum k / sigma^2) (the relation's factor c
            # is applied by the step's pair, as for any Gaussian step)
            gauss = (X.combined_sigma(sp), 1)
        if not sp.rest:
            if not sp.rr:
                base = X.gaussian_exact(gauss[0], c, sp.gauss_terms) if gauss else X.IdentityExact()
            elif not gauss and len(sp.rr) == 1:
                (eps0, K), = sp.rr.items()
                base = X.BinomialExact(eps0, K) if X.BinomialExact.n_terms(eps0, K) <= X.MAX_TERMS else None
            elif len(sp.rr) == 1 and X.GaussRRExact.fits(*next(iter(sp.rr.items()))):
                (eps0, K), = sp.rr.items()
                base = X.GaussRRExact(X.gaussian_exact(gauss[0], c, sp.gauss_terms), eps0, K)
            else:
                base = None
            if base is not None:
                self._exact = X.PinfWrapped(self._pinf, base.delta_bounds, base.epsilon_bounds)
        if gauss is not None:
            eff.append((Step(E.GaussianEvent(gauss[0]), self.relation), gauss[1]))
        for eps0, K in sp.rr.items():
            eff.append((Step(E.RandomizedResponseEvent(eps0), self.relation), K))
        self._eff = eff

    def _build(self):
        with self._clock():
            self._build_timed()

    def _build_timed(self):
        t0 = time.perf_counter()
        self.accuracy_limited = False
        self._split()
        if self._exact is not None or not self._eff:
            if self._exact is None:
                self._exact = X.PinfWrapped(self._pinf, X.IdentityExact().delta_bounds,
                                            X.IdentityExact().epsilon_bounds)
            # no grid is used; ``interval`` reports an explicit option back as given, else the
            # spacing the automatic rule would have chosen (callers such as calibrate reuse it)
            self._labels, self.tail, self._branches = [], 0.0, []
            if self._interval_opt is not None:
                self.interval = float(self._interval_opt)
            else:
                try:
                    self.interval = float(self._rule_start()) if self._eff else 0.1
                except Exception:
                    self.interval = 0.1
            self.setup_seconds = time.perf_counter() - t0
            return
        if self._interval_opt is None and not self._bins_explicit:
            budget_bins = max(16, min(self.max_bins, self.memory_budget // BYTES_PER_BIN))
            saved = self.max_bins
            self.max_bins = budget_bins
            try:
                self._build_grid(t0, None)
                last = None
                for _ in range(MAX_COARSEN):
                    if all(st.cache for st in self._branches):
                        break  # the refinement probe composed every branch at this spacing: it fits
                    try:
                        self._fits()  # the window of a typical query must fit the memory budget
                        break
                    except MemoryError as e:
                        if self._futile(e, last):
                            break  # (the queries answer the trivial interval, see _auto)
                        last, factor = e, _coarsen_factor(e)
                    except (ArithmeticError, ValueError):
                        break
                    self._coarsen(factor)
            finally:
                self._auto_bins = self.max_bins
                self.max_bins = saved
        elif self._interval_opt is None:
            self._build_auto(t0, self._rule_start())
        else:
            self._build_grid(t0, self._interval_opt)

    def _fits(self) -> None:
        """Lay out (no FFT) each branch's composition at the tilt estimated for delta = 1e-5:
        raises what a query's composition would raise for its size (``GridTooLargeError``
        when it exceeds the memory budget or the points the time left pays for), so that the
        grid is coarsened once, by the right factor, before any composition."""
        deltas = np.array([1e-5])
        cut = _cut_scale(deltas)
        for st in self._branches:
            if st.cache:
                continue  # composed at this spacing already (the refinement probe): it fits
            if not st.source.uppers_built and len(self._eff) < SCREEN_MAX_COMPONENTS:
                self._fits_coarse(st, deltas, cut)
                continue
            theta = _estimated_tilt(st, _tilt_plds(st, cut), 1e-5, cut)
            # (the optimistic PLDs only where built: the window is laid out from the pessimistic
            # side, the wider one; a query that does not fit coarsens the grid itself, ``_auto``)
            compose(st.uppers_at(cut), st.lowers_at(cut) if not self.upper_only and st.source.built else None,
                    st.counts, theta=theta, max_bins=self._bins(), cut_scale=cut, dry_run=True)

    def _fits_coarse(self, st, deltas, cut) -> None:
        """:meth:`_fits` for a branch whose fine PLDs are not built (the refinement probe's
        coarse screen skipped it): its window is laid out from the coarse composition that the
        screen of a query at these deltas uses (:meth:`_coarse_upper`, cached for it), whose
        points at the cheap spacing k h are ~1/k of the fine window's.  Building
        the fine PLDs here would also turn off the branch's screen (only efficiency and the
        coarsening decision depend on this, never soundness: a query that does not fit
        coarsens the grid itself, :meth:`_auto`)."""
        limit = self._bins()
        k = st.source.coarse_factor(st.source.level_for(cut, st.counts))
        try:
            self._coarse_upper(st, deltas, "eps", strict=True)
            # (no coarse composition -- it could not be had: left to the query, which coarsens)
            # (each cached composition at its own cheap spacing: k can differ between levels)
            # (the wider screens' compositions, SCREEN_SPREAD, left out: this one decides)
            need = max((int(round(c.upper.h / st.source.h)) * c.n_bins for key, c in st.coarse_cache.items()
                        if len(key) == 2), default=0)
        except GridTooLargeError as e:
            need = k * (e.need or limit)
        if need > limit:
            raise GridTooLargeError(f"composition needs about {need:,} grid points (limit {limit:,})",
                                    need=need, limit=limit)

    def _rule_start(self):
        if self._start is not None:
            return float(self._start)
        per_comp = [m.branches() for m, _ in self._eff]
        return _rule_interval(_step_stats(self._eff, per_comp), [k for _, k in self._eff],
                              edge_factor=_edge_factor(self.discretisation))[0]

    def _coarsen(self, factor: float = 2.0):
        """Multiply the spacing by ``factor`` (a power of 2; automatic grid only), flagging the
        accuracy as limited."""
        self._limited(stacklevel=5)
        h = float(factor) * self.interval
        per_comp = [m.branches() for m, _ in self._eff]
        self._branches = self._discretise(self._labels, per_comp, h)
        self.interval = h

    def _build_grid(self, t0, interval):
        components = self._eff
        per_comp = [m.branches() for m, _ in components]
        if interval is None:
            h0, _ = _rule_interval(_step_stats(components, per_comp), [k for _, k in components],
                                   edge_factor=_edge_factor(self.discretisation))
            if self._start is not None:
                h0 = float(self._start)
            for _ in range(MAX_COARSEN):
                try:
                    self._build_auto(t0, h0)
                    return
                except MemoryError as e:  # GridTooLargeError, or numpy under a memory cap
                    self._limited(stacklevel=6)
                    h0 *= _coarsen_factor(e)
            raise GridTooLargeError("no grid fits the memory budget")
        self._build_fixed(t0, interval)

    def _build_fixed(self, t0, interval):
        components = self._eff
        per_comp = [m.branches() for m, _ in components]
        labels = branch_labels(per_comp)
        self._labels = labels
        self.tail = _tail_for(sum(k for _, k in components))
        interval = V.positive_finite("interval", interval)
        _check_interval(interval, per_comp, self.tail)
        self._branches = self._discretise(labels, per_comp, interval)
        self.interval = float(interval)
        self.setup_seconds = time.perf_counter() - t0

    def _build_auto(self, t0, h_start):
        components = self._eff
        interval = None
        per_comp = [m.branches() for m, _ in components]
        labels = branch_labels(per_comp)
        self._labels = labels
        self.tail = _tail_for(sum(k for _, k in components))
        if interval is None:
            h = float(h_start)
            self._branches = self._discretise(labels, per_comp, h)
            # refine once from a probe answer: the width of eps intervals scales
            # like h^2 (like h for privacy buckets), so aim the probe's relative
            # width at 0.4% (the probe's compositions stay cached when h is kept)
            rate = 0.5 if self.discretisation == "connect_the_dots" else 1.0
            # refine only above 0.6% (a second pass costs more than the first); grouped schedules
            # (docs/MATH.md 5.8): the cells add about 2 * GROUP_RATIO, which no finer grid removes
            trigger = REFINE_ABOVE + (2.0 * GROUP_RATIO if any(isinstance(m, GroupedStep) for m, _ in components)
                                      else 0.0)
            for _ in range(2):
                if self.accuracy_limited:
                    break  # already coarsened to fit: a finer grid cannot fit either
                relw = self._probe_width()
                if not relw > trigger:  # NaN: the probe did not fit
                    break
                # (privacy buckets: at most 4x finer per refinement, so the default stays cheap)
                h_new = h * max(0.95 * (0.004 / relw) ** rate, 0.25)  # (aims at 0.4% from the grid)
                previous = self._branches
                try:
                    self._branches = self._discretise(labels, per_comp, h_new)
                    if rate == 1.0 and math.isnan(self._probe_width()):
                        raise GridTooLargeError("probe composition too large")
                except GridTooLargeError:
                    self._branches = previous  # keep the finest grid that fits
                    if rate == 0.5 and self._bins_explicit:
                        raise
                    if rate == 0.5:
                        self._limited(stacklevel=8)
                    break
                h = h_new
            interval = h
        self.interval = float(interval)
        self.setup_seconds = time.perf_counter() - t0

    def _discretise(self, labels, per_comp, h):
        """One :class:`_BranchState` per label; grids are laid out now (size errors raise
        here), the PLDs themselves are built when a query needs them."""
        branches = []
        for label in labels:
            pairs = []
            for (m, k), bl in zip(self._eff, per_comp):
                # a mechanism without this direction contributes its only branch
                b = next((b for b in bl if b.label == label), bl[0])
                pairs.append((b.upper, b.lower))
            cap = self._bins()
            if self._interval_opt is None and not self._bins_explicit:
                cap = min(cap, AUTO_STEP_POINTS)  # the time budget (automatic grid only)
            elif self._interval_opt is not None:
                # discretising a step peaks at about GRID_BYTES_PER_POINT per grid point: an explicit
                # grid beyond the memory budget is refused before it is built
                cap = min(cap, max(16, self.memory_budget // GRID_BYTES_PER_POINT))
            try:
                src = _Discretised(pairs, h, self.tail, cap, self.discretisation, self.upper_only)
            except GridTooLargeError as e:
                if self._interval_opt is None or cap >= self._bins():
                    raise
                raise GridTooLargeError(
                    f"{e} -- the limit is the memory budget's ({self.memory_budget:,} bytes at about "
                    f"{GRID_BYTES_PER_POINT} bytes per point while a step is discretised): use a coarser "
                    "interval or a larger memory_budget", need=e.need, limit=e.limit) from None
            branches.append(_BranchState(label, src, [k for _, k in self._eff]))
        return branches

    def _probe_width(self, delta: float = 1e-5) -> float:
        """Relative width of the eps interval at ``delta`` (0 if it cannot be probed, NaN if
        its composition exceeds ``max_bins``)."""
        try:
            l, u = self._epsilon(np.array([delta]))
            lo, up = float(l[0]), float(u[0])
        except GridTooLargeError:
            return math.nan
        except (ArithmeticError, MemoryError, ValueError):
            return 0.0
        if not (math.isfinite(lo) and math.isfinite(up)):
            return 0.0
        return (up - lo) / max(abs(up), 0.1)

    def _for_steps(self, k: int) -> "PLDAccountant":
        """The accountant of the same single mechanism at ``k`` steps, sharing this one's
        discretisation (grid spacing and single-step PLDs; compositions are not shared).
        Identical to ``account(mechanism, steps=k, interval=self.interval)`` when the
        per-step tail agrees (``steps <= TAIL_STEPS``)."""
        if self._exact is not None or len(self._eff) != 1 or len(self.components) != 1 or self._pinf[1] > 0 \
                or self._eff[0][0].event != self._steps[0][0].event or isinstance(self._eff[0][0], EpochStep):
            new = self.fresh().compose(self._steps[0][0].event, int(k))
            new._ensure_built()
            return new
        if _tail_for(k) != self.tail:
            raise ValueError("only a single mechanism with the same per-step tail can share a discretisation")
        new = self.fresh()
        new._steps = [(self._steps[0][0], int(k))]
        new._built = True
        new._exact, new._pinf, new._eff = None, (0.0, 0.0), [(self._eff[0][0], int(k))]
        new.accuracy_limited = self.accuracy_limited
        new._labels = self._labels
        new.tail = self.tail
        new._branches = [_BranchState(st.label, st.source, [int(k)]) for st in self._branches]
        new.interval = self.interval
        new.setup_seconds = 0.0
        new._built_keys = ("_labels", "tail", "_branches", "interval", "setup_seconds", "_exact", "_pinf", "_eff",
                           "accuracy_limited")
        return new

    # -- composition with caching -----------------------------------------
    def _compose(self, st: _BranchState, theta: float, eps_from=None, cut_scale=None,
                 lower: bool = True, thinned=None) -> Composition:
        """The branch's composition at tilt ``theta`` (cached); ``lower=False``: the pessimistic
        side alone is needed (a cached two-sided composition serves it too).  ``thinned``:
        (serial, PLDs) of :meth:`_Discretised.thinned_uppers` to compose instead of the fine
        pessimistic PLDs (pessimistic side only)."""
        key = (round(theta, 12), eps_from, cut_scale)
        lower = lower and not self.upper_only
        if thinned is not None:
            if lower:
                raise ValueError("thinned PLDs serve the pessimistic side alone")
            key = key + ("thinned", thinned[0])
        if not lower and not self.upper_only:
            if key in st.cache:
                return st.cache[key]
            key = key + ("upper",)
        if key not in st.cache:
            self._make_room()
            t = time.perf_counter()
            try:
                uppers = st.uppers_at(cut_scale) if thinned is None else thinned[1]
                comp = compose(uppers, st.lowers_at(cut_scale) if lower else None, st.counts,
                               theta=theta, eps_from=eps_from, max_bins=self._bins(), cut_scale=cut_scale)
            except GridTooLargeError as e:
                if e.need is not None and e.need <= self._bins(memory_only=True):
                    raise TimeBudgetError(str(e), need=e.need, limit=e.limit) from None
                if self._interval_opt is not None and e.limit is not None and e.limit < self.max_bins:
                    raise GridTooLargeError(
                        f"{e} -- the limit is the memory budget's ({self.memory_budget:,} bytes at about "
                        f"{BYTES_PER_BIN} bytes per point): use a coarser interval or a larger memory_budget",
                        need=e.need, limit=e.limit) from None
                raise
            if comp.n_bins >= TIME_MIN_BINS:  # (smaller ones measure overheads, not the rate)
                # measured seconds per point (with reading the answers): the time budget's rate
                self._rate = (1.0 + READ_FACTOR) * (time.perf_counter() - t) / comp.n_bins
            st.cache[key] = comp
        return st.cache[key]

    def _make_room(self) -> None:
        """Before a new composition: drop the cached ones (:meth:`_release`) when together they
        hold more than a quarter of the memory budget (about RETAINED_BYTES_PER_BIN per point and
        side, with the answer tables), so that cached compositions and the new one's working
        arrays stay near the budget.  Only work depends on the cache, never an answer."""
        held = 0
        for st in getattr(self, "_branches", None) or []:
            for c in (*st.cache.values(), *st.coarse_cache.values()):
                held += c.n_bins * (1 if c.lower is None else 2)
        if held * RETAINED_BYTES_PER_BIN > self.memory_budget // 4:
            self._release()

    def _tilt_for(self, st, eps_target, cut_scale=None, thinned=None) -> float:
        plds = st.uppers_at(cut_scale) if thinned is None else thinned[1]
        return solve_tilt(plds, st.counts, float(eps_target), cut_scale)

    # -- eps(delta) -------------------------------------------------------
    @staticmethod
    def _lower_eps(comp: Composition, deltas: np.ndarray) -> np.ndarray:
        """inf{eps : lower(eps) - alias(eps) <= delta}, certified (see Composition)."""
        if comp.lower is None:  # pessimistic side only
            return np.full(deltas.shape, -np.inf)
        ef = comp.lower.epsilon(deltas)
        step = 1e-9 * np.maximum(1.0, np.abs(np.where(np.isfinite(ef), ef, 0.0)))
        ea = ef - step
        g = comp.alias_term(ea)
        alt = comp.lower.epsilon(deltas + g)
        out = np.minimum(ea, alt)
        # below valid_from the lower curve says nothing
        return np.where(out < comp.valid_from, -np.inf, out)

    def _retilt(self, st, x, theta, evaluate, propose, cut_scale=None, eps_of=None, lower=True, thinned=None):
        """The re-tilt loop of both queries (docs/MATH.md section 5.1).

        Compose at tilt ``theta``; ``evaluate(comp, x, share)`` gives (upper, lower, round-off
        share, better) for the pending queries x: answers are kept where ``better`` (valid at
        this tilt and a smaller share than before).  While a share exceeds RETILT_SHARE,
        re-tilt at ``propose(pending, upper)``; a tilt that repeats falls back to the untilted
        window once, then stops.  Every kept answer is certified at its own tilt.

        A tilt repeats when it is within 1e-9 (relative) of one tried, or when it moves the
        tilting factor exp(theta eps) at the pending answers (``eps_of(pending, upper)``) by
        less than 5%: the round-off share would barely change.  Past the time budget the
        loop stops with the answers it has when each is certifiable (share below
        REFUSE_SHARE; flagged accuracy-limited).  ``lower=False``: pessimistic side only (the
        lower answers are then -inf / 0); ``thinned``: composing those PLDs (:meth:`_compose`).
        """
        n = x.size
        up = np.full(n, np.nan)
        lo = np.full(n, np.nan)
        share = np.full(n, np.inf)
        try:
            comp = self._compose(st, theta, cut_scale=cut_scale, lower=lower, thinned=thinned)
        except UntiltError:  # the tilt cannot be undone in floating point: start untilted
            comp = self._compose(st, 0.0, cut_scale=cut_scale, lower=lower, thinned=thinned)
        tried = [comp.theta]
        todo = np.arange(n)
        for _attempt in range(12):
            u, l, sh, better = evaluate(comp, x[todo], share[todo])
            idx = todo[better]
            up[idx], lo[idx], share[idx] = u[better], l[better], sh[better]
            todo = np.arange(n)[~(share <= RETILT_SHARE)]
            if todo.size == 0:
                break
            theta = propose(todo, up)
            scale = max(1.0, float(eps_of(todo, up))) if eps_of is not None else 1.0
            if any(abs(theta - th) < 1e-9 * max(1.0, th) or abs(theta - th) * scale < 0.05 for th in tried):
                theta = 0.0 if 0.0 not in tried else None  # fall back to the untilted window
            if theta is None:
                break
            tried.append(theta)
            try:
                comp = self._compose(st, theta, cut_scale=cut_scale, lower=lower, thinned=thinned)
            except UntiltError:
                break  # the answers found so far stand; the rest is refused by the caller
            except TimeBudgetError:
                if not np.all(share[todo] < REFUSE_SHARE):
                    raise  # nothing certifiable yet: the grid is coarsened (``_auto``)
                self._limited()
                break  # the answers found so far are certified, only looser
        return lo, up, share

    def _branch_epsilon(self, st, deltas, lower=True):
        def evaluate(comp, d, share):
            eu = comp.upper.epsilon(d)
            el = self._lower_eps(comp, d)
            with np.errstate(invalid="ignore", divide="ignore"):
                sh = np.where(np.isfinite(eu), comp.roundoff.delta_at_few(np.where(np.isfinite(eu), eu, 0.0)) / d, np.inf)
            better = (eu >= comp.valid_from) & (sh < share)
            # delta below the certain +inf mass: eps is +inf, certified by the lower curve
            certain = (comp.lower.const > d) if comp.lower is not None else np.zeros(d.shape, bool)
            better |= certain
            return (np.where(certain, np.inf, eu), np.where(certain, np.inf, el), np.where(certain, 0.0, sh),
                    better)

        cut = _cut_scale(deltas)  # far tails below 1e-12 of the smallest delta are cut
        # the first tilt needs no precision: estimated on the fine PLDs carried to the coarse
        # spacing, or, for an upper-only accountant on large grids, on coarse PLDs that also
        # choose where the fine ones connect their dots (docs/MATH.md 3.1; built, they serve the
        # estimates even where the fine PLDs end up whole)
        thinned = coarse = None
        if self.upper_only and st.source.thinnable(level := st.source.level_for(cut, st.counts)):
            coarse = st.coarse_at(cut)
            thinned = st.source.thinned_uppers(level, _estimated_tilt(st, coarse, float(deltas.min()), cut))

        def tilt_plds():
            return coarse if coarse is not None else _tilt_plds(st, cut)

        def propose(todo, up):  # tilt at the pending answer with the smallest delta
            j = todo[np.argmin(deltas[todo])]
            return (self._tilt_for(st, up[j], cut, thinned) if np.isfinite(up[j])
                    else _estimated_tilt(st, tilt_plds(), float(deltas[j]), cut))

        # start tilted at the smallest delta's estimated answer (one composition often serves all)
        def eps_of(todo, up):
            u = np.abs(up[todo])
            return np.max(u[np.isfinite(u)], initial=1.0)

        lo, up, share = self._retilt(st, deltas, _estimated_tilt(st, tilt_plds(), float(deltas.min()), cut),
                                     evaluate, propose, cut_scale=cut, eps_of=eps_of, lower=lower,
                                     thinned=thinned)
        bad = ~(share < REFUSE_SHARE)
        if bad.any():
            j = np.nonzero(bad)[0][0]
            floor = min(c.upper.const for c in st.cache.values())
            if floor >= 0.5 * deltas[j]:
                why = (f"it is below the floor {floor:.2g} of this accountant's upper curve "
                       f"(tail mass {self.tail:.1g} per step truncated to +inf)")
            else:
                why = (f"the floating-point round-off bound exceeds {REFUSE_SHARE:.0%} of delta "
                       "even with exponential tilting")
            raise PrecisionLimitError(f"delta={deltas[j]:.3g} cannot be certified: {why}; use a larger delta")
        return lo, up

    # -- several branches: max over directions, dominated ones skipped -------
    def _order(self, coarse: list) -> list:
        """Branch indices, the one whose coarse bound is largest at most queries first."""
        top = np.argmax(np.array(coarse), axis=0)  # (coarse bounds are never NaN)
        score = [int(np.sum(top == i)) for i in range(len(coarse))]
        return sorted(range(len(coarse)), key=lambda i: -score[i])

    def _coarse_upper(self, st, x, kind: str, strict: bool = False, spread: int = 1) -> np.ndarray:
        """Certified upper bounds on this branch's eps(x) (``kind="eps"``, x = deltas) or
        delta(x) (``kind="delta"``, x = epsilons) from its pessimistic PLDs at the cheap spacing
        times ``spread`` (:meth:`_Discretised.coarse`): looser; +inf where they cannot be had
        (``strict``: a composition too large raises its ``GridTooLargeError`` instead)."""
        try:
            cut = _cut_scale(x) if kind == "eps" else None
            plds = st.coarse_at(cut, spread)
            theta = _estimated_tilt(st, plds, float(x.min()), cut) if kind == "eps" else 0.0
            key = (round(theta, 12), cut) if spread == 1 else (round(theta, 12), cut, spread)
            if key not in st.coarse_cache:
                st.coarse_cache[key] = compose(plds, None, st.counts, theta=theta, max_bins=self._bins(),
                                               cut_scale=cut)
            comp = st.coarse_cache[key]
            if kind == "eps":
                # below valid_from the curve says nothing, but upper.delta(valid_from) <= x
                # then certifies eps(x) <= valid_from
                out = np.maximum(comp.upper.epsilon(x), comp.valid_from)
            else:
                out = np.where(x >= comp.valid_from, np.minimum(comp.upper.delta(x), 1.0), np.inf)
        except GridTooLargeError:
            if strict:
                raise
            return np.full(x.size, np.inf)
        except (ArithmeticError, MemoryError, ValueError):
            return np.full(x.size, np.inf)
        return np.where(np.isnan(out), np.inf, out)

    def _likely_first(self, x, kind: str, fine: bool = False) -> tuple[int | None, list]:
        """(index, scores): the branch whose composed loss a normal approximation (score: mean +
        z sd, z for the smallest delta; from each step's loss moments by quadrature where every
        branch's profiles have them, else from each branch's coarse pessimistic PLDs, or its fine
        ones with ``fine``; no composition) puts highest, and every branch's score; (None, [])
        when it cannot tell (then every branch gets its coarse bound)."""
        try:
            z = math.sqrt(2.0 * math.log(1.0 / max(float(np.min(x)), 1e-300))) if kind == "eps" else 2.0
            small = 1e-3 * (float(np.min(x)) if kind == "eps" else 1e-6)
            quad = None if fine else [st.source.step_moments() for st in self._branches]
            if quad is not None and any(q is None for q in quad):
                quad = None
            score = []
            for b, st in enumerate(self._branches):
                if quad is not None:
                    stats = quad[b]
                else:
                    cut = _cut_scale(x) if kind == "eps" else None
                    stats = [(*p.moments(), p.p_inf) for p in (st.uppers_at(cut) if fine else st.coarse_at(cut))]
                if sum(k * p_inf for (_, _, p_inf), k in zip(stats, st.counts)) > small:
                    return None, []  # mass at +inf that matters: the approximation says nothing about it
                m = v = 0.0
                for (mu, var, _), k in zip(stats, st.counts):
                    m, v = m + k * mu, v + k * var
                score.append(m + z * math.sqrt(max(v, 0.0)))
        except (ArithmeticError, MemoryError, ValueError):
            return None, []
        if not all(math.isfinite(sc) for sc in score):
            return None, []
        return int(np.argmax(score)), score

    def _combine(self, x, kind: str):
        """(lower, upper) of max over branches of eps(x) or delta(x).

        With several branches (add_remove) each answer is the maximum over the
        directions.  The branch with the largest coarse bounds is computed at full
        accuracy first; another branch is computed only at the queries where its
        coarse certified upper bound exceeds the lower bound found so far.  Where it
        does not, its true value lies below the others' lower bound, so it changes
        neither side of the interval: skipping it keeps both bounds certified.
        (Upper-only accountants compare with the upper bound found so far instead.)
        A later branch gets its optimistic side (the convex hull PLDs and their
        composition) only at the queries where its upper bound exceeds the lower bound
        found so far: elsewhere its own lower bound could not raise the maximum's.
        """
        exact = self._branch_epsilon if kind == "eps" else self._branch_delta
        empty = -np.inf if kind == "eps" else 0.0
        if len(self._branches) == 1:
            return exact(self._branches[0], x)
        screen = len(self._eff) < SCREEN_MAX_COMPONENTS
        # the branch computed first needs no coarse bound (it is computed at every query): when
        # none is built yet, it is the one a normal approximation from the coarse PLDs' moments
        # puts highest (only the work done depends on this choice, never the bounds); without a
        # screen (long schedules, whose fine pessimistic PLDs every branch needs) from the fine ones
        fresh = not any(st.source.uppers_built for st in self._branches)
        first, score = self._likely_first(x, kind, fine=not screen) if fresh else (None, [])
        # a branch whose score is within SCREEN_CLOSE of the first's gets no coarse bound either:
        # nearly symmetric directions (small q) differ by less than the coarse grid's excess, so
        # the screen could not skip it (measured: it never did on 20 DP-SGD shapes)
        close = {i for i, sc in enumerate(score) if first is not None and
                 sc >= score[first] - SCREEN_CLOSE * abs(score[first])}
        # a branch whose score lies well below the first's is screened lazily, when its turn comes
        # (the bounds found so far are known then): first at SCREEN_SPREAD times the cheap spacing,
        # at the cheap spacing only where that does not skip it (either is a certified upper bound;
        # only the work depends on the choice); not when the cheap screen is built already
        cut = _cut_scale(x) if kind == "eps" else None

        def wide_first(i, st):
            return (screen and first is not None and i != first and i not in close
                    and score[i] <= score[first] - SCREEN_SPREAD_GAP * abs(score[first])
                    and not any(key[1:] == (cut,) for key in st.coarse_cache)  # (no cheap screen yet)
                    and st.source.fits_wide_screen(st.source.level_for(cut, st.counts)))

        wide = {i for i, st in enumerate(self._branches) if wide_first(i, st)}
        coarse = [np.full(x.size, np.inf) if st.source.uppers_built or not screen or i in close or i in wide
                  else self._coarse_upper(st, x, kind) for i, st in enumerate(self._branches)]
        lo = np.full(x.size, empty)
        up = np.full(x.size, empty)
        # (without lower bounds, a branch is skipped where its coarse bound is below the
        # upper bound found so far: the maximum's upper bound is then still certified)
        ref = up if self.upper_only else lo
        order = self._order(coarse)
        if first is not None:
            order = [first] + [i for i in order if i != first]
        else:  # (later queries: the branches built in full first, the lazily built ones after)
            order = sorted(order, key=lambda i: not self._branches[i].source.built)
        started = False
        for i in order:
            if i in wide and not self._branches[i].source.uppers_built:
                c = self._coarse_upper(self._branches[i], x, kind, spread=SCREEN_SPREAD)
                if not np.all(c <= ref):
                    c = np.minimum(c, self._coarse_upper(self._branches[i], x, kind))
                coarse[i] = c
            need = ~(coarse[i] <= ref)
            if not need.any():
                continue
            st = self._branches[i]
            if started and not self.upper_only and not st.source.built:
                # a later branch: its pessimistic side first, its optimistic side only where its
                # upper bound exceeds the lower bound found so far.  Elsewhere its own lower bound
                # (<= its upper) could not raise the maximum's: the interval is the same as with
                # both sides computed.
                xs = x[need]
                _l, u = exact(st, xs, lower=False)
                l = np.full(xs.size, empty)
                may = ~(u <= lo[need])
                if may.any():
                    l2, u2 = exact(st, xs[may])
                    l[may] = l2
                    u[may] = np.minimum(u[may], u2)  # (two certified upper bounds)
            else:
                l, u = exact(st, x[need])
            started = True
            lo[need] = np.maximum(lo[need], l)
            up[need] = np.maximum(up[need], u)
        return lo, up

    def _epsilon(self, deltas):
        lo, up = self._combine(deltas, "eps")
        return _ordered(lo, up, "epsilon", deltas)

    def epsilon(self, delta) -> Interval:
        """Certified interval for eps(delta), vectorised over delta.

        Returns
        -------
        Interval of arrays (or floats for scalar input): ``lower <= eps(delta) <= upper``.
        """
        scalar = np.ndim(delta) == 0
        deltas = V.delta_array("delta", delta)
        if not self._built and self._steps:
            # every delta below the certain +inf mass of (eps0, delta0) steps: eps = +inf,
            # certified without any grid
            d_lo = X.split_exact([(s.event, k) for s, k in self._steps], self.relation).pinf_bounds()[0]
            if X.PinfWrapped.certainly_infinite(deltas, d_lo):
                self._check_steps()
                inf = np.full(deltas.shape, np.inf)
                return Interval(math.inf, math.inf) if scalar else Interval(inf, inf.copy())
        with self._clock():
            self._ensure_built()
            if self._exact is not None:
                lo, up = self._exact.epsilon_bounds(deltas)
            else:  # (random allocation / shuffle: also the unamplified bounds, the better of each, MATH 13.5)
                grid = X.PinfWrapped(self._pinf, None, lambda d: self._auto(self._epsilon, d))
                lo, up = with_unamplified(self._steps, self.relation, self.upper_only, "eps", deltas,
                                          lambda: grid.epsilon_bounds(deltas))
        up = np.where(np.isnan(up), np.inf, up)  # no certificate: the trivial bound
        lo = np.where(np.isnan(lo), -np.inf, lo)
        if not self.upper_only:  # (upper-only accountants report -inf, as documented)
            lo, up = _ordered(np.maximum(lo, _eps_floor(deltas)), up, "epsilon", deltas)
        if scalar:
            return Interval(float(lo[0]), float(up[0]))
        return Interval(lo, up)

    # -- trade-off curves (docs/MATH.md section 10) --------------------------
    def _power(self, alpha: np.ndarray):
        """Certified (lower, upper) bounds on the power 1 - beta(alpha) of the relation: the
        maximum over branches (beta is the pointwise minimum over the directions), each
        read exactly off the untilted composition (valid for every eps) by
        :func:`pldlib.pld.tradeoff.power_bounds`.

        With (eps0, delta0) masses taken out of the grid (``_pinf``: curve D + (1 - D) delta_b
        per branch) each branch's bounds are mapped by :func:`pldlib.pld.tradeoff.pinf_power`.
        Compositions answered in closed form (no grid) are one pair, the same in both
        directions (unsampled Gaussians, randomized response, (eps0, delta0) steps: all
        symmetric): the generic certified bounds from its delta(eps) (:meth:`Accountant._power`)
        (docs/MATH.md 10.5)."""
        from ..pld.tradeoff import max_directions, pinf_power

        self._ensure_built()
        if self._exact is not None:
            # (closed forms are cheap: a 16x finer eps grid than the generic default)
            self.TRADEOFF_GRID = 16 * Accountant.TRADEOFF_GRID
            lo, up = Accountant._power(self, alpha)
            # rejecting exactly on the +inf atom (Q-mass 0) has power >= its certified mass
            lo = np.maximum(lo, float(self._pinf[0]))
            return np.minimum(lo, up), up
        if self._pinf[1] > 0:
            return max_directions(pinf_power(self._pinf, lambda a, st=st: self._branch_power(st, a), alpha)
                                  for st in self._branches)
        return max_directions(self._branch_power(st, alpha) for st in self._branches)

    def _direction_deltas(self, eps: np.ndarray) -> list:
        """The closed-form pair's (lower, upper) delta(eps): one direction (see :meth:`_power`)."""
        if self._exact is None:  # (unused: _power reads each branch's discrete curves)
            return Accountant._direction_deltas(self, eps)
        d = self.delta(eps)
        return [(np.asarray(d.lower, dtype=float), np.asarray(d.upper, dtype=float))]

    def _branch_power(self, st, alpha):
        """Power bounds of one branch: from the untilted composition, then (where the interval
        is wider than 5% of the power, typically at tiny alpha where FFT round-off dominates)
        from compositions tilted at the eps where the bound is attained; every composition
        gives certified bounds, so the tightest of each side is kept."""
        from ..pld.tradeoff import power_bounds, vertex_eps

        comp0 = self._compose(st, 0.0)
        lo, up = power_bounds(comp0, alpha)
        tried = [0.0]
        for _ in range(6):
            bad = (up - lo > 0.05 * up) & (alpha > 0)
            if not bad.any():
                break
            j = np.nonzero(bad)[0][np.argmin(alpha[bad])]
            theta = self._tilt_for(st, vertex_eps(comp0.upper, float(alpha[j])))
            if any(abs(theta - t) <= 1e-6 * max(1.0, t) for t in tried):
                break
            tried.append(theta)
            try:
                l, u = power_bounds(self._compose(st, theta), alpha)
            except (ArithmeticError, ValueError, GridTooLargeError):
                break
            lo, up = np.maximum(lo, l), np.minimum(up, u)
        return lo, up

    # -- delta(eps) -------------------------------------------------------
    def _branch_delta(self, st, eps, lower=True):
        def evaluate(comp, e, share):
            du = comp.upper.delta(e)
            dl = (np.maximum(comp.lower.delta(e) - comp.alias_term(e), 0.0) if comp.lower is not None
                  else np.zeros(e.shape))
            with np.errstate(invalid="ignore", divide="ignore"):
                sh = comp.roundoff.delta_at_few(e) / np.maximum(du, 1e-320)
            return du, dl, sh, (e >= comp.valid_from) & (sh < share)

        def propose(todo, up):  # tilt at the pending answer with the largest eps
            return self._tilt_for(st, eps[todo[np.argmax(eps[todo])]])

        lo, up, _share = self._retilt(st, eps, 0.0, evaluate, propose,
                                      eps_of=lambda todo, up: np.max(np.abs(eps[todo]), initial=1.0), lower=lower)
        return lo, up

    def delta(self, epsilon) -> Interval:
        """Certified interval for delta(eps), vectorised over eps (negative eps allowed)."""
        scalar = np.ndim(epsilon) == 0
        eps = V.epsilon_array("epsilon", epsilon)
        with self._clock():
            self._ensure_built()
            if self._exact is not None:
                lo, up = self._exact.delta_bounds(eps)
            else:  # (random allocation / shuffle: also the unamplified bounds, the better of each, MATH 13.5)
                grid = X.PinfWrapped(self._pinf, lambda e: self._auto(self._combine, e, "delta"), None)
                lo, up = with_unamplified(self._steps, self.relation, self.upper_only, "delta", eps,
                                          lambda: grid.delta_bounds(eps))
        up = np.where(np.isnan(up), 1.0, np.minimum(up, 1.0))  # no certificate: the trivial bound
        lo = np.where(np.isnan(lo), 0.0, lo)
        if not self.upper_only:  # (upper-only accountants report 0, as documented)
            lo = np.maximum(lo, _delta_floor(eps))
        lo, up = _ordered(lo, up, "delta", eps)
        if scalar:
            return Interval(float(lo[0]), float(up[0]))
        return Interval(lo, up)

    # -- budget helpers ------------------------------------------------------------------
    def _auto_grid(self) -> bool:
        return self._interval_opt is None and not self._bins_explicit

    @contextlib.contextmanager
    def _clock(self):
        """Run the enclosed query (or build) under the time budget (nested calls share the
        outermost deadline)."""
        if self.__dict__.get("_deadline") is not None or self.time_budget is None:
            yield
            return
        self._deadline = time.perf_counter() + self.time_budget
        try:
            yield
        finally:
            self._deadline = None

    def _futile(self, err, last) -> bool:
        """Whether coarsening again is pointless: the composition refused now (``err``) needs
        more than 0.7x the points of the one refused before the last coarsening (``last``; the
        composed support of many steps of a few atoms does not shrink with h), or the time
        budget is overrun by half of itself (each coarsening re-discretises)."""
        need, before = getattr(err, "need", None), getattr(last, "need", None)
        if need is not None and before is not None and need > 0.7 * before:
            return True
        deadline = self.__dict__.get("_deadline")
        return deadline is not None and time.perf_counter() > deadline + 0.5 * self.time_budget

    def _limited(self, stacklevel: int = 4) -> None:
        """Flag the answers as accuracy-limited (a warning the first time)."""
        if not self.accuracy_limited:
            warnings.warn(f"pldlib: the automatic accuracy does not fit the memory budget of "
                          f"{self.memory_budget:,} bytes or the time budget of {self.time_budget} s; "
                          "answering with a coarser certified grid (wider intervals)",
                          AccuracyLimitedWarning, stacklevel=stacklevel)
        self.accuracy_limited = True

    def _bins(self, memory_only: bool = False) -> int:
        """The FFT length cap of compositions: ``max_bins`` and the memory budget's (an explicit
        interval whose composition exceeds it raises :class:`GridTooLargeError` before anything
        of that size is allocated), for an automatic grid under a query's clock also the points
        the time left pays for (at the measured cost per point, :data:`RATE_PRIOR` before any
        composition)."""
        if self._interval_opt is not None:
            return int(min(self.max_bins, max(16, self.memory_budget // BYTES_PER_BIN)))
        cap = self.__dict__.get("_auto_bins", self.max_bins)
        deadline = self.__dict__.get("_deadline")
        if memory_only or deadline is None or self._bins_explicit:
            return cap
        rate = max(self.__dict__.get("_rate", RATE_PRIOR), 0.25 * RATE_PRIOR)
        left = deadline - time.perf_counter()
        return int(min(cap, max(left / (TIME_SAFETY * rate), TIME_MIN_BINS)))

    def _auto(self, fn, *args):
        """``fn(*args)``; with an automatic grid, a composition that does not fit the budget
        coarsens the grid (flagged) and retries."""
        last = None
        for _ in range(MAX_COARSEN):
            try:
                return fn(*args)
            except MemoryError as e:  # GridTooLargeError, or numpy running out under a memory cap
                if self._interval_opt is not None and not isinstance(e, GridTooLargeError):
                    # (the process's own limit is below the memory budget's estimate: said in our
                    # words, not numpy's)
                    raise GridTooLargeError(
                        f"ran out of memory at interval {V.fmt(self.interval)} within the memory budget of "
                        f"{self.memory_budget:,} bytes (this process may use less): use a coarser interval or "
                        "a smaller memory_budget") from e
                if self._interval_opt is not None or self._bins_explicit or \
                        (not isinstance(e, GridTooLargeError) and self.interval <= 0):
                    raise
                if self._futile(e, last):
                    break
                last = e
                self._coarsen(_coarsen_factor(e))
        # no grid fits the budget at any spacing (e.g. 10^8 steps of a two-atom pair: the
        # composed support alone exceeds it): the trivial certified interval, flagged
        warnings.warn("pldlib: no grid within the memory and time budgets resolves this composition; answering with "
                      "the trivial certified interval", AccuracyLimitedWarning, stacklevel=4)
        self.accuracy_limited = True
        x = np.asarray(args[0], dtype=float)
        if fn == self._epsilon:
            return np.full(x.shape, -np.inf), np.full(x.shape, np.inf)
        return np.zeros(x.shape), np.ones(x.shape)


# -- lower bounds of random allocation and shuffling over several epochs (docs/MATH.md 13.3) -----
def max_coordinate_accountant(sigma: float, t: int, epochs: int, relation: str = "add_remove"):
    """The PLD accountant of the E-fold composition of :class:`MaxCoordinateProfile` (remove;
    add: reversed; add_remove: both).  Only its **lower** ends are bounds for random allocation
    or shuffling (``.epsilon(delta).lower``, ``.delta(eps).lower``)."""
    from ..sampling.allocation import MaxCoordinateProfile, epoch_length

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
