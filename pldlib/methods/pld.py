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

import math
import time
import warnings
from typing import Sequence

import numpy as np

from .. import _validate as V
from .. import events as E
from .. import exact as X
from .._deadline import DeadlineExceeded
from .._validate import GridTooLargeError, PrecisionLimitError
from ..mechanisms import Mechanism
from . import few_summands as FS
from . import sharpen as S
from . import single_step as SS
from .base import Accountant, Interval, Step, StepsTables, as_event, branch_labels
from .schedule import EpochStep, epoch_components, group_schedule
from .pld_budget import (BYTES_PER_BIN, DEFAULT_MEMORY_BUDGET, DEFAULT_TIME_BUDGET, READ_FACTOR,  # noqa: F401
                         RETAINED_BYTES_PER_BIN, TIME_MIN_BINS, AccuracyLimitedWarning, BudgetPolicy, TimeBudgetError,
                         _coarsen_factor)
from .pld_grid import (DISCRETISATIONS, SCREEN_CLOSE, SCREEN_MAX_COMPONENTS, SCREEN_SPREAD,  # noqa: F401
                       SCREEN_SPREAD_GAP, GridPolicy, _BranchState, _cut_scale, _discretisation, _edge_factor,
                       _estimated_tilt, _rule_interval, _step_stats, _tail_for, _tilt_plds)
from ..sampling.allocation import with_unamplified
from ..pld.compose import DEFAULT_MAX_BINS, Composition, UntiltError, compose, solve_tilt

__all__ = ["Interval", "account", "account_steps", "PLDAccountant", "PrecisionLimitError", "GridTooLargeError",
           "DISCRETISATIONS", "AccuracyLimitedWarning", "DEFAULT_MEMORY_BUDGET", "DEFAULT_TIME_BUDGET"]


#: round-off share of an answer above which it is recomputed with a tilt
RETILT_SHARE = 1e-4
#: round-off share above which an answer is refused as not certifiable
REFUSE_SHARE = 0.5


def account(mechanism, steps: int | None = None, *, spacing: float | None = None, interval: float | None = None,
            max_bins: int = DEFAULT_MAX_BINS, discretisation: str = "connect_the_dots",
            lower_bound: bool = True, memory_budget: int = DEFAULT_MEMORY_BUDGET,
            time_budget: float | None = DEFAULT_TIME_BUDGET, sharpen: bool | None = None) -> "PLDAccountant":
    """Account for ``steps`` compositions of ``mechanism`` (or a heterogeneous list).

    Parameters
    ----------
    mechanism : Mechanism or list of (Mechanism, steps)
    steps : number of compositions: required for a single mechanism (no silent default of
        one step: ``TypeError`` names it), not given with a list of (mechanism, steps)
    spacing : grid spacing h of the privacy-loss discretisation (the accuracy knob; the
        accountant's ``spacing`` attribute says which it used; ``interval=`` is its older name,
        still accepted with a ``DeprecationWarning``); by default chosen from the composed loss distribution so that the
        relative width of eps intervals is well under 1% in typical use.
    max_bins : cap on FFT length (memory guard)
    discretisation : ``"connect_the_dots"`` (default: connect-the-dots for the
        upper bound, tangents + convex hull for the lower) or
        ``"privacy_buckets"`` (the classic baseline: losses rounded up for the
        upper bound and down for the lower; both stay certified, but the
        width shrinks only like h instead of h^2: the default spacing is
        refined at that rate but at most 16x below the connect-the-dots rule,
        within ``max_bins``, so it is typically much wider there; pass
        ``spacing`` to compare the two at matched accuracy).
    lower_bound : with False only the pessimistic side is built and composed
        (about half the work): answers keep their certified upper bounds and report
        lower bounds of -inf (eps) or 0 (delta).  Needs an explicit ``spacing``.
    memory_budget : bytes the automatic grid may use (default 1 GB,
        :data:`DEFAULT_MEMORY_BUDGET`); the automatic grid also keeps each single-step
        grid within :data:`AUTO_STEP_POINTS` points (its time budget: a few seconds).
        When the automatic accuracy does not fit,
        the spacing is coarsened until it does: the answers stay certified but are
        wider, ``acc.accuracy_limited`` is True and an :class:`AccuracyLimitedWarning`
        is issued.  (:class:`GridTooLargeError` is raised only for an explicit
        ``spacing`` that does not fit ``max_bins``.)
    time_budget : seconds one query (or the build) may spend on an automatic grid (default
        10, :data:`DEFAULT_TIME_BUDGET`; None: no limit).  A composition predicted (from the
        measured cost per FFT point) to end past it is not started: the grid is coarsened
        instead, or the re-tilt loop keeps the certified answers it has, with the same flag
        and warning as the memory budget.  Work still running ``HARD_GRACE`` (0.5 s) past the
        budget is interrupted between FFTs and discretisation passes; the query keeps the
        answers it has certified, or answers the trivial interval, flagged.  The budget never
        applies to an explicit ``spacing``.
    sharpen : ``None`` (default): an answer of the automatic grid wider than 1% is asked again
        on grids 4 and 16 times finer within the time budget, then of the analytic bounds, and
        the intersection of the certified intervals is returned (docs/MATH.md 5.9); an explicit
        ``spacing`` is answered at that spacing.  ``True``: an explicit spacing's wide answers
        too (within ``time_budget``; the answers then depend on the time it leaves).
        ``False``: no answer is sharpened (each is read off its grid).

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
    spacing = V.spacing_option(spacing, interval)
    return PLDAccountant.for_mechanism(mechanism, steps, spacing=spacing, max_bins=max_bins,
                                       discretisation=discretisation, lower_bound=lower_bound,
                                       memory_budget=memory_budget, time_budget=time_budget, sharpen=sharpen)


def account_steps(mechanism: Mechanism, steps_list: Sequence[int], *, spacing: float | None = None,
                  max_bins: int = DEFAULT_MAX_BINS, discretisation: str = "connect_the_dots",
                  errors: str = "raise", interval: float | None = None) -> list:
    """Accountants for ``mechanism`` at several steps counts, sharing discretisations.

    Returns one :class:`PLDAccountant` per entry of ``steps_list`` (same order).
    Steps values that can share a grid are discretised once; each accountant then
    composes on its own, and is identical to
    ``account(mechanism, steps=k, spacing=acc.spacing, ...)`` (for k <= 10^6),
    so every answer keeps its certificate.

    Spacing rule (``spacing=None``): the steps values are taken from the largest
    down; a group is led by its largest K, whose spacing is the one
    ``account(mechanism, steps=K)`` would choose (rule of :func:`_rule_interval`
    plus the probe refinements); a smaller K joins the group when the group's
    spacing is at most the one the rule gives K itself (so it is never coarser
    than K's own rule), otherwise it leads a new group.  Typical DP-SGD sweeps
    (100..10,000 steps) need one group.  With an explicit ``spacing`` all
    steps share it.

    ``errors="return"`` puts the exception in place of an accountant that cannot
    be built (after retrying it alone when its group's discretisation failed),
    so that one bad steps value does not lose the others.
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError("account_steps: mechanism must be a single Mechanism")
    spacing = V.spacing_option(spacing, interval)
    return _account_steps(mechanism.relation, mechanism.event, steps_list, spacing=spacing, max_bins=max_bins,
                          discretisation=discretisation, errors=errors)


def _account_steps(relation, event, steps_list, *, spacing=None, max_bins=DEFAULT_MAX_BINS,
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
        acc = PLDAccountant(relation, spacing=h, **kw)
        acc._start = start
        acc._sharpening = True  # (shared-spacing tables: each answer the one at that spacing)
        acc.compose(event, k)
        acc._ensure_built()
        return acc

    out: list = [None] * len(ks)
    distinct = sorted(set(ks), reverse=True)
    rule = {}
    if spacing is None:
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
            if spacing is None and lead in rule:
                acc = make(lead, start=rule[lead])
            else:
                acc = make(lead, h=spacing)
        except Exception as e:
            if errors == "raise":
                raise
            built[lead] = e
            continue
        built[lead] = acc
        rest = []
        for k in todo:
            joins = _tail_for(k) == acc.tail and (spacing is not None or k not in rule
                                                  or acc.spacing <= rule[k])
            if joins and (spacing is not None or k in rule):
                built[k] = acc._for_steps(k)
            else:
                rest.append(k)
        todo = rest
    for i, k in enumerate(ks):
        out[i] = built[k]
    return out


#: sharpening's settings (:mod:`pldlib.methods.sharpen`), under the names this module had
SHARPEN_WIDTH, SHARPEN_FACTORS, SHARPEN_TINY = S.WIDTH, S.FACTORS, S.TINY


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
    from ..sampling.base import get_scheme, scheme_kw

    return get_scheme(ev.sampling).steps_multiple(ev.q, **scheme_kw(ev)) > 1


def _lattice_epoch(step) -> bool:
    """Whether ``step`` is an epoch bounded by lattice pairs (random allocation's 13.2 / 13.3 pairs,
    shuffling), rather than by its exact pairs (:meth:`~pldlib.sampling.base.SamplingScheme.exact_epoch_pieces`)."""
    if not isinstance(step, EpochStep):
        return False
    from ..sampling.base import get_scheme, scheme_kw

    ev = step.event
    return get_scheme(ev.sampling).exact_epoch_pieces(ev.event, ev.q, step.relation, **scheme_kw(ev)) is None


class PLDAccountant(GridPolicy, BudgetPolicy, Accountant):
    """Certified PLD accounting (docs/MATH.md sections 3-5): events in, intervals out.

    ``PLDAccountant(relation, spacing=None, max_bins=..., discretisation=...,
    lower_bound=True).compose(event, count)``; see :func:`account` for the options.
    ``spacing`` is the grid spacing used (built on first use; ``interval`` is its older name,
    still accepted with a ``DeprecationWarning``).
    Each query answers with an :class:`Interval` whose ``upper`` is a certified upper
    bound (connect-the-dots, pessimistic) and ``lower`` a certified lower bound
    (tangents + convex hull, optimistic).
    """

    method = "pld"
    kind = "certified"

    def __init__(self, relation: str = "add_remove", *, spacing: float | None = None,
                 interval: float | None = None, max_bins: int = DEFAULT_MAX_BINS,
                 discretisation: str = "connect_the_dots", lower_bound: bool = True,
                 memory_budget: int = DEFAULT_MEMORY_BUDGET, time_budget: float | None = DEFAULT_TIME_BUDGET,
                 sharpen: bool | None = None):
        super().__init__(relation)
        spacing = V.spacing_option(spacing, interval)
        if sharpen is not None and not isinstance(sharpen, (bool, np.bool_)):
            raise TypeError(f"sharpen must be True, False or None, got {V.fmt(sharpen)}")
        self.sharpen = None if sharpen is None else bool(sharpen)
        self.memory_budget = V.positive_int("memory_budget", memory_budget)
        self.time_budget = None if time_budget is None else V.positive_finite("time_budget", time_budget)
        self._deadline = None
        if not isinstance(lower_bound, bool):
            raise TypeError(f"lower_bound must be True or False, got {lower_bound!r}")
        if not lower_bound and spacing is None:
            raise ValueError("lower_bound=False needs an explicit spacing (the automatic one is tuned on the "
                             "width of the interval)")
        self._spacing_opt = None if spacing is None else V.positive_finite("spacing", spacing)
        self.upper_only = not lower_bound
        self.discretisation = _discretisation(discretisation)
        self.max_bins = V.positive_int("max_bins", max_bins)
        # an explicit max_bins is a user setting: it is never coarsened around (GridTooLargeError)
        self._bins_explicit = self.max_bins != DEFAULT_MAX_BINS
        if self.max_bins < 16:
            raise ValueError(f"max_bins must be at least 16, got {self.max_bins}")
        self._start = None  # a starting spacing for the automatic rule (account_steps)

    @property
    def interval(self) -> float:
        """The older name of :attr:`spacing` (the grid spacing h; read-only)."""
        return self.spacing

    def _options(self) -> dict:
        out = {"spacing": self._spacing_opt, "max_bins": self.max_bins, "discretisation": self.discretisation,
               "lower_bound": not self.upper_only}
        if self.memory_budget != DEFAULT_MEMORY_BUDGET:
            out["memory_budget"] = self.memory_budget
        if self.time_budget != DEFAULT_TIME_BUDGET:
            out["time_budget"] = self.time_budget
        if self.sharpen is not None:
            out["sharpen"] = self.sharpen
        return out

    def epsilon_per_steps(self, event, steps, deltas):
        """As :meth:`Accountant.epsilon_per_steps`; the steps values share discretisations
        (:func:`account_steps`: each answer equals ``account(..., steps=k, spacing=h)`` at
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
        accs = _account_steps(self.relation, event, ks, spacing=self._spacing_opt, max_bins=self.max_bins,
                              discretisation=self.discretisation, errors="return")
        return ks, (lambda k: accs[ks.index(k)])

    # -- exact parts (pldlib.exact) and the effective components ------------------------
    def _unsupported(self, step):
        """As :meth:`Accountant._unsupported`, except that a step of a per-epoch scheme whose epochs
        have pairs (:meth:`~pldlib.sampling.base.SamplingScheme.epoch_pieces`: random allocation with
        noise other than Gaussian, docs/MATH.md 13.9) is supported when its per-step pairs are not."""
        why = super()._unsupported(step)
        ev = step.event
        if why is None or not (isinstance(ev, E.Sampled) and ev.q < 1.0 and ev.group == 1):
            return why
        from ..profiles.pairs import UnsupportedEventError
        from ..sampling.base import get_scheme, scheme_kw

        scheme = get_scheme(ev.sampling)
        kw = scheme_kw(ev)
        if scheme.steps_multiple(ev.q, **kw) > 1:
            try:
                if scheme.epoch_pieces(ev.event, ev.q, step.relation, **kw) is not None:
                    return None
            except UnsupportedEventError as e:
                return str(e)
        return why

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
        gauss = None
        if sp.gauss_terms:
            # sigma of the combined step: 1 / sqrt(sum k / sigma^2) (the relation's factor c
            # is applied by the step's pair, as for any Gaussian step)
            gauss = (X.combined_sigma(sp), 1)
        if not sp.rest:
            self._exact = X.whole_exact([(s.event, k) for s, k in self._steps], self.relation)
        if gauss is not None:
            eff.append((Step(E.GaussianEvent(gauss[0]), self.relation), gauss[1]))
        for eps0, K in sp.rr.items():
            eff.append((Step(E.RandomizedResponseEvent(eps0), self.relation), K))
        self._eff = eff
        self._ceiling = None  # (computed on first use: _loss_ceiling)

    def _build(self):
        with self._clock():
            self._build_timed()


    def _for_steps(self, k: int) -> "PLDAccountant":
        """The accountant of the same single mechanism at ``k`` steps, sharing this one's
        discretisation (grid spacing and single-step PLDs; compositions are not shared).
        Identical to ``account(mechanism, steps=k, spacing=self.spacing)`` when the
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
        new.spacing = self.spacing
        new.setup_seconds = 0.0
        new._ceiling = None
        new._sharpening = self.__dict__.get("_sharpening", False)
        new._built_keys = ("_labels", "tail", "_branches", "spacing", "setup_seconds", "_exact", "_pinf", "_eff",
                           "_ceiling", "accuracy_limited")
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
                if lower:  # (the pessimistic side's window alone, before the optimistic side is
                    # discretised: a window too large for the grid is refused without that work)
                    compose(uppers, None, st.counts, theta=theta, eps_from=eps_from, max_bins=self._bins(),
                            cut_scale=cut_scale, dry_run=True)
                comp = compose(uppers, st.lowers_at(cut_scale) if lower else None, st.counts,
                               theta=theta, eps_from=eps_from, max_bins=self._bins(), cut_scale=cut_scale)
            except GridTooLargeError as e:
                if e.need is not None and e.need <= self._bins(memory_only=True):
                    raise TimeBudgetError(str(e), need=e.need, limit=e.limit) from None
                if self._spacing_opt is not None and e.limit is not None and e.limit < self.max_bins:
                    raise GridTooLargeError(
                        f"{e} -- the limit is the memory budget's ({self.memory_budget:,} bytes at about "
                        f"{BYTES_PER_BIN} bytes per point): use a coarser spacing or a larger memory_budget",
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
            except (TimeBudgetError, DeadlineExceeded):
                if not np.all(share[todo] < REFUSE_SHARE):
                    raise  # nothing certifiable yet: the grid is coarsened (``_auto``), or out of time
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
        if bad.any() and self.accuracy_limited:
            # a grid the budgets coarsened: the budgets, not delta, are the cause -- no grid answer
            # (the flagged trivial interval, narrowed by the analytic bounds where they can)
            up, lo = np.where(bad, np.inf, up), np.where(bad, -np.inf, lo)
            bad[:] = False
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
        if self.accuracy_limited:
            # a grid the budgets coarsened out of floating point: no grid answer there (the budgets,
            # not the query, are the cause; the trivial interval, flagged, for the analytic bounds)
            nan = np.isnan(lo) | np.isnan(up)
            lo, up = np.where(nan, -np.inf, lo), np.where(nan, np.inf, up)
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
            t_start = time.perf_counter()
            try:
                self._ensure_built()
                if self._exact is not None:
                    lo, up = self._exact.epsilon_bounds(deltas)
                else:  # (random allocation / shuffle: also the unamplified bounds, the better of each, MATH 13.5)
                    grid = X.PinfWrapped(self._pinf, None, lambda d: self._auto(self._epsilon, d))
                    try:
                        lo, up = with_unamplified(self._steps, self.relation, self.upper_only, "eps", deltas,
                                                  lambda: grid.epsilon_bounds(deltas))
                    except PrecisionLimitError as err:  # (beyond the grid: a single step reads its own curve)
                        lo, up = self._one_step_instead(deltas, err)
                    # (an answer below 0 is bracketed on the reversed curve next, tighter than the
                    # long compositions' saddle-point bounds: those are not asked for it; an answer
                    # across 0 gets them -- the bracket cannot place a positive eps)
                    lo, up = self._sharpen("eps", deltas, lo, up, t_start,
                                           long_ok=None if self.upper_only else ~(up < 0))
                lo, up = self._negative_epsilon(deltas, lo, up, t_start)
            except DeadlineExceeded:
                return self._out_of_time("eps", deltas, scalar)
        up = np.where(np.isnan(up), np.inf, up)  # no certificate: the trivial bound
        lo = np.where(np.isnan(lo), -np.inf, lo)
        ceiling = self._loss_ceiling()
        if ceiling < math.inf:  # delta(ceiling) = 0 < delta: eps(delta) <= ceiling (MATH 0.6)
            up = np.minimum(up, ceiling)
        if not self.upper_only:  # (upper-only accountants report -inf, as documented)
            lo, up = _ordered(np.maximum(lo, _eps_floor(deltas)), up, "epsilon", deltas)
        if scalar:
            return Interval(float(lo[0]), float(up[0]))
        return Interval(lo, up)

    def _reversed_delta(self, eps: np.ndarray, t_start: float, sharpen: bool = True):
        """Certified (lower, upper) of delta at ``eps`` < 0 from the reversed relation's delta at
        -eps (docs/MATH.md 0.5: delta(eps) = 1 - e^eps + e^eps delta_rev(-eps)), or None.  Read
        this way the answer keeps the reversed one's relative accuracy, where the grid's own
        window may not even reach eps < 0.  add_remove and substitution read their own curve;
        remove and add build the other relation's accountant of the same steps (automatic grids
        only, and only when the time taken plus twice this one's set-up time is within 0.8 of the
        time budget); it shares this query's deadline (work past it is stopped: this answer
        stands).  ``sharpen=False``: the reversed answers are not sharpened.  Upper-only
        accountants are left as they are (their lower ends are 0, as documented)."""
        if self.upper_only or not self._reversal_applies():
            return None
        rev = self._reversed()
        if rev is not self and not rev._built:
            if (not self._auto_grid() or self.time_budget is None
                    or time.perf_counter() - t_start + 2.0 * self.setup_seconds > 0.8 * self.time_budget):
                return None
        keep = rev.__dict__.get("_deadline"), rev.__dict__.get("_sharpening", False)
        if rev is not self:
            rev.__dict__["_deadline"] = self.__dict__.get("_deadline")
        rev._sharpening = keep[1] or not sharpen
        try:
            r = rev.delta(-np.asarray(eps, dtype=float))
        except SS._SKIP:  # (refused: this answer stands)
            return None
        finally:
            if rev is not self:
                rev.__dict__["_deadline"] = keep[0]
            rev._sharpening = keep[1]
        return SS.from_reverse(eps, r.lower, r.upper)

    def _negative_epsilon(self, deltas: np.ndarray, lo: np.ndarray, up: np.ndarray, t_start: float):
        """An eps answer wider than 1% that reaches below 0, bracketed on the reversed curve's
        certified delta (:meth:`_reversed_delta`, unsharpened; :func:`single_step.bracket_negative_epsilon`)."""
        if self.upper_only:
            return lo, up
        return SS.bracket_negative_epsilon(lambda e: self._reversed_delta(e, t_start, sharpen=False),
                                           deltas, lo, up, S.WIDTH)

    def _out_of_time(self, kind: str, x: np.ndarray, scalar: bool) -> Interval:
        """The answer of a query whose work the hard deadline stopped (:mod:`pldlib._deadline`;
        no certified grid answer was in hand): the trivial certified interval with its
        closed-form lower floor, flagged accuracy-limited."""
        warnings.warn(f"pldlib: the time budget of {self.time_budget} s ran out before a grid answer was certified; "
                      "answering with the trivial certified interval (a larger time_budget gives a real one)",
                      AccuracyLimitedWarning, stacklevel=3)
        self.accuracy_limited = True
        if kind == "eps":
            lo, up = np.full(x.shape, -np.inf), np.full(x.shape, np.inf)
            if not self.upper_only:
                lo = np.maximum(lo, _eps_floor(x))
        else:
            lo, up = np.zeros(x.shape), np.ones(x.shape)
            if not self.upper_only:
                lo = np.maximum(lo, _delta_floor(x))
        if scalar:
            return Interval(float(lo[0]), float(up[0]))
        return Interval(lo, up)

    # -- sharpening wide answers (docs/MATH.md 5.9) -----------------------------------------
    def _one_step(self, kind: str, x: np.ndarray, lo: np.ndarray, up: np.ndarray):
        """Wide answers of a single step composed once, intersected with the step's own curve read
        off its pairs (:mod:`.single_step`, docs/MATH.md 0.8; certified to the accuracy of the
        profile's sf values), as the PRV and saddle-point accountants do.  The grid's floor (about
        1e-30) is where a one-step grid is widest: delta(0.05) of sigma 5.5, q 6.3e-4 is 1.1e-133,
        which the grid answered [0, 9e-31].  Delta answers read it at once (milliseconds); eps
        answers after the finer grids (:meth:`_sharpen`: its bisection reads the curve ~160 times,
        up to seconds for mixture pairs)."""
        lo, up = np.asarray(lo, dtype=float), np.asarray(up, dtype=float)
        need = np.nonzero(S.wide(kind, lo, up))[0]
        one = self._one_step_pairs() if need.size else None
        if one is None:
            return lo, up
        read = SS.delta_bounds if kind == "delta" else SS.epsilon_bounds
        lo, up = lo.copy(), up.copy()
        l2, u2 = read(one, x[need])
        lo[need], up[need] = SS.intersect(lo[need], up[need], l2, u2)
        return lo, up

    def _one_step_instead(self, deltas: np.ndarray, err: PrecisionLimitError):
        """eps(delta) of a single step composed once, read off its own curve alone where the grid
        refuses (a delta below what its round-off can certify); re-raises the refusal unless every
        answer has two finite ends."""
        one = self._one_step_pairs()
        if one is not None:
            lo, up = SS.epsilon_bounds(one, deltas)
            if np.all(np.isfinite(lo) & np.isfinite(up)):
                return lo, up
        raise err

    def _one_step_pairs(self):
        """The pairs of a single step composed once (:func:`.single_step.of_accountant`), or None
        (also for upper-only accountants and epochs of random allocation and shuffling)."""
        if self.upper_only or any(isinstance(m, EpochStep) for m, _ in self._steps):
            return None
        return SS.of_accountant(self)

    def _exact_part(self):
        """The certified closed form of the composition's exact steps (unsampled Gaussians,
        randomized response, (eps0, delta0) steps) when it has others too, else None.  A part of a
        composition is a post-processing of it, so the part's curve lies below the whole's in every
        direction: its lower ends are the whole's lower bounds (docs/MATH.md 5.9, 12)."""
        steps = [(s.event, k) for s, k in self._steps]
        sp = X.split_exact(steps, self.relation)
        if not sp.rest or len(sp.rest) == len(steps):
            return None
        rest = {id(e) for e, _ in sp.rest}
        return X.whole_exact([(e, k) for e, k in steps if id(e) not in rest], self.relation)

    def _sharpen(self, kind: str, x: np.ndarray, lo: np.ndarray, up: np.ndarray, t_start: float,
                 long_ok=None):
        """Narrow answers wider than 1% (:func:`pldlib.methods.sharpen.sharpen`, docs/MATH.md 5.9):
        the same composition on grids 4 and 16 times finer while that fits the time budget, then
        the analytic (Chernoff, saddle-point) bounds at tiny scales -- and, for a grid limited by
        its budgets, for every wide answer (the long compositions whose grid is coarse are the
        central-limit regime, where the Berry-Esseen bounds are tight).

        Only automatic grids are sharpened, unless ``sharpen=True`` (``sharpen=False``: none; an
        explicit spacing is the user's accuracy: only a single
        step composed once is intersected with its own curve, as its delta answers are); with
        (eps0, delta0) steps the analytic bounds of the rest are wrapped with their +inf mass, never
        random allocation's lattice bounds (their width is the gap between proven bounds; its exact
        two-step pairs, MATH 13.13, are sharpened) or an upper-only accountant; an accuracy-limited
        one (its budgets spent) gets the analytic bounds only."""
        if self.upper_only or not self._branches or any(_lattice_epoch(m) for m, _ in self._eff) \
                or self.__dict__.get("sharpen") is False:
            return lo, up
        # an explicit spacing (unless sharpen=True), the shared-spacing tables of account_steps and
        # the finer grids asked here keep their grid: only what needs none is read -- a single step's
        # own curve, the exact part's lower ends (milliseconds; the tables' answers stay equal to
        # account(..., spacing=h)'s)
        grid_fixed = (not self._auto_grid() and self.__dict__.get("sharpen") is not True) \
            or self.__dict__.get("_sharpening")

        def finer(f, xs):
            acc = PLDAccountant(self.relation, spacing=self.spacing / f, discretisation=self.discretisation,
                                memory_budget=self.memory_budget)
            acc._sharpening = True
            for s, k in self._steps:
                acc.compose(s.event, k)
            return acc.epsilon(xs) if kind == "eps" else acc.delta(xs)

        one = self._one_step_pairs()
        read = SS.delta_bounds if kind == "delta" else SS.epsilon_bounds

        def part(xs):  # (built only when an answer is wide)
            ex = self._exact_part()
            if ex is None:
                raise NotImplementedError("no exact part")
            return ex.delta_bounds(xs) if kind == "delta" else ex.epsilon_bounds(xs)

        before, self._sharpening = self.__dict__.get("_sharpening", False), True
        try:
            return S.sharpen(kind, x, lo, up, took=time.perf_counter() - t_start,
                             deadline=self.__dict__.get("_deadline"),
                             finer=None if self.accuracy_limited or grid_fixed else finer, relation=self.relation,
                             components=self._eff, events=[(s.event, k) for s, k in self._steps],
                             analytic_everywhere=self.accuracy_limited,
                             analytic=not grid_fixed, pinf=self._pinf,
                             exact=None if one is None else (lambda xs: read(one, xs)), part=part,
                             long_ok=long_ok)
        finally:
            self._sharpening = before

    def _loss_ceiling(self, label: str | None = None) -> float:
        """A certified upper bound on every composed privacy loss of branch ``label`` (the sum
        over its steps of ``count * loss_sup`` of the step's pessimistic profile, rounded up) or,
        by default, of every branch (the largest); +inf when a step's loss is unbounded, a step
        has +inf mass, or the answers come from an exact path (docs/MATH.md 0.6)."""
        if self._exact is not None or self._pinf[1] > 0 or not self._eff:
            return math.inf
        if self._ceiling is None:
            per_comp = [m.branches() for m, _ in self._eff]
            ceilings = {}
            for lab in branch_labels(per_comp):
                terms = []
                for (m, k), bl in zip(self._eff, per_comp):
                    b = next((b for b in bl if b.label == lab), bl[0])
                    terms.append(k * b.upper.loss_sup())
                if all(t < math.inf for t in terms):
                    ceilings[lab] = math.fsum(terms) + 1e-12 * math.fsum(abs(t) for t in terms) + 1e-300
                else:
                    ceilings[lab] = math.inf
            self._ceiling = ceilings
        if label is not None:
            return self._ceiling.get(label, math.inf)
        return max(self._ceiling.values(), default=math.inf)

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
        return max_directions(self._capped_power(st, alpha) for st in self._branches)

    def _capped_power(self, st, alpha):
        """:meth:`_branch_power`, its upper end capped by e^S alpha where the branch's composed loss
        is at most S (delta(S) = 0, so beta(alpha) >= 1 - e^S alpha: docs/MATH.md 0.6)."""
        lo, up = self._branch_power(st, alpha)
        s = self._loss_ceiling(st.label)
        if s < 700.0:
            with np.errstate(over="ignore"):
                cap = np.minimum(math.exp(s) * (1 + 1e-12) * alpha, 1.0)
            up = np.minimum(up, cap)
            lo = np.minimum(lo, up)
        return lo, up

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
            t_start = time.perf_counter()
            try:
                self._ensure_built()
                if self._exact is not None:
                    lo, up = self._exact.delta_bounds(eps)
                else:
                    lo, up = np.full(eps.size, np.nan), np.full(eps.size, np.nan)
                    todo = np.arange(eps.size)
                    reversible = self._reversal_applies()
                    own = self.REVERSED.get(self.relation) == self.relation and reversible
                    if own and (eps < 0).any():
                        # eps < 0 off its own curve at -eps > 0 first (MATH 0.5), where the grid is
                        # made for the answers: the grid below 0 is then read only where still wide
                        neg = np.nonzero(eps < 0)[0]
                        got = self._reversed_delta(eps[neg], t_start)
                        if got is not None:
                            lo[neg], up[neg] = got
                            with np.errstate(invalid="ignore"):
                                todo = np.nonzero(~((up - lo) <= S.WIDTH * up))[0]
                    if todo.size:
                        e2 = eps[todo]
                        # (random allocation / shuffle: also the unamplified bounds, the better of each, MATH 13.5)
                        grid = X.PinfWrapped(self._pinf, lambda e: self._auto(self._combine, e, "delta"), None)
                        l2, u2 = with_unamplified(self._steps, self.relation, self.upper_only, "delta", e2,
                                                  lambda: grid.delta_bounds(e2))
                        l2, u2 = self._one_step("delta", e2, l2, u2)
                        # (eps < 0 of the other relation's reversed curve next, tighter than the
                        # long compositions' saddle-point bounds: those are not asked for it)
                        l2, u2 = self._sharpen("delta", e2, l2, u2, t_start,
                                               long_ok=~(e2 < 0) if reversible and not own else None)
                        lo[todo], up[todo] = SS.intersect(np.nan_to_num(l2, nan=0.0), np.nan_to_num(u2, nan=1.0),
                                                          lo[todo], up[todo])
                with np.errstate(invalid="ignore"):  # eps < 0, wider than 1% (or unanswered)
                    neg = np.nonzero((eps < 0) & ~((up - lo) <= S.WIDTH * up))[0]
                if self._exact is not None or own:
                    neg = neg[:0]  # (exact, or read off its own curve above)
                got = self._reversed_delta(eps[neg], t_start) if neg.size else None
                if got is not None:  # 1 - e^eps + e^eps delta_rev(-eps) (MATH 0.5)
                    lo[neg], up[neg] = SS.intersect(np.nan_to_num(lo[neg], nan=0.0), np.nan_to_num(up[neg], nan=1.0),
                                                    *got)
            except DeadlineExceeded:
                return self._out_of_time("delta", eps, scalar)
        up = np.where(np.isnan(up), 1.0, np.minimum(up, 1.0))  # no certificate: the trivial bound
        lo = np.where(np.isnan(lo), 0.0, lo)
        ceiling = self._loss_ceiling()
        if ceiling < math.inf:  # every composed loss is <= ceiling: delta is exactly 0 there (MATH 0.6)
            beyond = eps >= ceiling
            up, lo = np.where(beyond, 0.0, up), np.where(beyond, 0.0, lo)
        if not self.upper_only:  # (upper-only accountants report 0, as documented)
            lo = np.maximum(lo, _delta_floor(eps))
        lo, up = _ordered(lo, up, "delta", eps)
        if scalar:
            return Interval(float(lo[0]), float(up[0]))
        return Interval(lo, up)


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


# the companion of the PRV and saddle-point accountants for a few summands (docs/MATH.md 0.9)
FS.register(PLDAccountant)
