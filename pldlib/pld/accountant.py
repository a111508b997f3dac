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
from typing import NamedTuple, Sequence

import numpy as np

from .. import _validate as V
from .._validate import GridTooLargeError, PrecisionLimitError
from ..mechanisms import Mechanism
from ..methods.base import Accountant, Estimate, Interval, as_event, branch_labels, components_of  # noqa: F401
from .compose import DEFAULT_MAX_BINS, Composition, compose, estimate_tilt, solve_tilt
from .discretize import connect_the_dots, convex_hull_optimistic, grid_for, privacy_buckets

__all__ = ["Interval", "Estimate", "account", "account_steps", "PLDAccountant", "PrecisionLimitError", "GridTooLargeError",
           "DISCRETISATIONS"]

#: spacing of the cheap pessimistic PLDs that test whether a branch can matter, in units of h
COARSE_FACTOR = 8
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


def _tail_for(total_steps: int) -> float:
    return TAIL_TOTAL / max(int(total_steps), TAIL_STEPS)


def _discretisation(name) -> str:
    if not isinstance(name, str) or name not in DISCRETISATIONS:
        raise ValueError(f"discretisation: must be one of {', '.join(DISCRETISATIONS)}, got {name!r}")
    return name


def account(mechanism, steps: int | None = None, *, interval: float | None = None,
            max_bins: int = DEFAULT_MAX_BINS, discretisation: str = "connect_the_dots",
            lower_bound: bool = True) -> "PLDAccountant":
    """Account for ``steps`` compositions of ``mechanism`` (or a heterogeneous list).

    Parameters
    ----------
    mechanism : Mechanism or list of (Mechanism, steps)
    steps : number of compositions: required for a single mechanism (no silent default of
        one step: ``TypeError`` names it), not given with a list of (mechanism, steps)
    interval : grid spacing h of the privacy-loss discretisation (the accuracy
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

    Examples
    --------
    >>> acc = account(Gaussian(sigma=0.8), steps=1000)
    >>> acc.epsilon(1e-6)            # Interval(lower=..., upper=...)
    """
    return PLDAccountant.for_mechanism(mechanism, steps, interval=interval, max_bins=max_bins,
                                       discretisation=discretisation, lower_bound=lower_bound)


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
            rule = {k: _rule_interval(stats, [k])[0] for k in distinct}
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


class _Discretised:
    """The single-step PLDs of one branch (one direction) at spacing h, built on first use.

    The grids are laid out (and their size checked) at construction; the
    connect-the-dots and convex-hull PLDs are computed only when a query needs
    this branch at full accuracy.  ``coarse()`` gives pessimistic PLDs of the
    same profiles at spacing ``COARSE_FACTOR * h`` (for the dominance test of
    :meth:`PLDAccountant.epsilon`).  Shared by the accountants that
    :func:`account_steps` derives from one discretisation.
    """

    def __init__(self, pairs, h, tail, max_bins, discretisation, upper_only=False):
        self.pairs = pairs  # [(upper profile, lower profile)] per component
        self.h, self.tail, self.max_bins = h, tail, max_bins
        self.discretisation = discretisation
        self.upper_only = upper_only
        self.grids = [(grid_for(pu, h, tail, max_bins), None if upper_only else grid_for(pl, h, tail, max_bins))
                      for pu, pl in pairs]
        self._fine = None
        self._coarse = None

    @property
    def built(self) -> bool:
        return self._fine is not None

    def fine(self):
        if self._fine is None:
            uppers, lowers = [], []
            for (pu, pl), (gu, gl) in zip(self.pairs, self.grids):
                if self.discretisation == "privacy_buckets":
                    uppers.append(privacy_buckets(pu, gu, pessimistic=True))
                    if gl is not None:
                        lowers.append(privacy_buckets(pl, gl, pessimistic=False))
                else:
                    uppers.append(connect_the_dots(pu, gu))
                    if gl is not None:
                        lowers.append(convex_hull_optimistic(pl, gl))
            self._fine = (uppers, None if self.upper_only else lowers)
        return self._fine

    def coarse(self):
        """Pessimistic PLDs at spacing COARSE_FACTOR * h (a cheap certified upper bound)."""
        if self._coarse is None:
            hc = COARSE_FACTOR * self.h
            self._coarse = [connect_the_dots(pu, grid_for(pu, hc, self.tail, self.max_bins))
                            for pu, _ in self.pairs]
        return self._coarse


class _BranchState:
    """One branch label of an accountant: its (lazily built) PLDs, counts and compositions."""

    def __init__(self, label: str, source: _Discretised, counts: list):
        self.label = label
        self.source = source
        self.counts = counts
        self.cache: dict = {}
        self.coarse_cache: dict = {}

    @property
    def uppers(self) -> list:
        return self.source.fine()[0]

    @property
    def lowers(self) -> list:
        return self.source.fine()[1]


def _check_interval(h: float, per_comp, tail: float) -> None:
    """Refuse an explicit spacing h wider than half of every step's whole privacy-loss range
    (down to the truncated tail mass): each grid would hold at most two cells, and the
    certified interval, still valid, would say nothing (e.g. [-1e-5, 999.8] for 10 Gaussian
    steps at h = 100)."""
    from ..profiles.base import loss_range

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
def _step_stats(components, per_comp):
    """Per branch label, per component: (mean, variance, support width, support edges) of
    one step's loss (from a cheap connect-the-dots PLD at 4000 points)."""
    out = []
    n_labels = max(len(b) for b in per_comp)
    for j in range(n_labels):
        row = []
        for (m, _k), bl in zip(components, per_comp):
            prof = bl[min(j, len(bl) - 1)].upper
            lo, hi = prof.eps_bounds(1e-12)
            h0 = max((hi - lo) / 4000.0, 1e-9)
            pld = connect_the_dots(prof, grid_for(prof, h0, 1e-12))
            mu, v = pld.moments()
            # an optimistic PLD cannot resolve mass between 0 and a support edge
            # closer than h (e.g. ln(1-q) for Poisson remove): keep h below half of it
            edges = [abs(e) for e in (lo, hi) if e != 0.0 and math.isfinite(e)]
            row.append((mu, v, hi - lo, edges))
        out.append(row)
    return out


def _rule_interval(stats, counts) -> tuple[float, float]:
    """h = min(s_K / 50, sqrt(0.0067 * eps_typ / K), edge / 2) (and (eps_typ) of the binding branch).

    Connect-the-dots shifts each step's loss by about h^2/8 (optimistic
    side: a few times that), so the width after K steps is about
    0.75 K h^2; keeping it under 0.5% of a typical epsilon
    eps_typ = mean + 3 sd of the composed loss, and resolving the composed
    spread s_K by 50 points, gives this rule.  ``edge`` is the distance from 0 to
    the nearest edge of a single-step loss support (|ln(1-q)| for Poisson
    remove): a coarser grid leaves the optimistic PLD nothing to work with.
    The accountant then refines h (at most twice) from a probe answer's width.
    ``stats`` comes from :func:`_step_stats`; ``counts`` are the steps per component.
    """
    best, best_eps = math.inf, 1.0
    for row in stats:
        mean = var = 0.0
        K = 0
        widths = []
        edges = []
        for (mu, v, width, e), k in zip(row, counts):
            mean += k * mu
            var += k * v
            K += k
            if width > 0:
                widths.append(width)
            edges.extend(e)
        s = math.sqrt(max(var, 1e-300))
        eps_typ = max(mean + 3 * s, 1e-3)
        if var <= 0 or not widths:  # a single atom per step: any spacing resolves it
            h = min(0.5 * min(edges, default=0.2), 0.1)
        else:
            h = min(s / 50.0, math.sqrt(0.0067 * eps_typ / K), min(widths) / 50.0,
                    0.5 * min(edges, default=math.inf))
        if h < best:
            best, best_eps = h, eps_typ
    return float(max(best, 1e-6)), best_eps


class PLDAccountant(Accountant):
    """Certified PLD accounting (docs/MATH.md sections 3-5): events in, intervals out.

    ``PLDAccountant(relation, interval=None, max_bins=..., discretisation=...,
    lower_bound=True).compose(event, count)``; see :func:`account` for the options.
    Each query answers with an :class:`Interval` whose ``upper`` is a certified upper
    bound (connect-the-dots, pessimistic) and ``lower`` a certified lower bound
    (tangents + convex hull, optimistic).
    """

    method = "pld"
    kind = "certified"

    def __init__(self, relation: str = "add_remove", *, interval: float | None = None,
                 max_bins: int = DEFAULT_MAX_BINS, discretisation: str = "connect_the_dots",
                 lower_bound: bool = True):
        super().__init__(relation)
        if not isinstance(lower_bound, bool):
            raise TypeError(f"lower_bound must be True or False, got {lower_bound!r}")
        if not lower_bound and interval is None:
            raise ValueError("lower_bound=False needs an explicit interval (the automatic one is tuned on the "
                             "width of the interval)")
        self._interval_opt = None if interval is None else V.positive_finite("interval", interval)
        self.upper_only = not lower_bound
        self.discretisation = _discretisation(discretisation)
        self.max_bins = V.positive_int("max_bins", max_bins)
        if self.max_bins < 16:
            raise ValueError(f"max_bins must be at least 16, got {self.max_bins}")
        self._start = None  # a starting spacing for the automatic rule (account_steps)

    def _options(self) -> dict:
        return {"interval": self._interval_opt, "max_bins": self.max_bins, "discretisation": self.discretisation,
                "lower_bound": not self.upper_only}

    def epsilon_per_steps(self, event, steps, deltas):
        """As :meth:`Accountant.epsilon_per_steps`; the steps values share discretisations
        (:func:`account_steps`: each answer equals ``account(..., steps=k, interval=h)`` at
        the shared spacing h)."""
        if self.upper_only:
            return super().epsilon_per_steps(event, steps, deltas)
        deltas = V.delta_array("deltas", deltas)
        ks = [V.steps(f"steps[{i}]", k) for i, k in enumerate(steps)]
        event = as_event(event, self.relation)
        accs = _account_steps(self.relation, event, ks, interval=self._interval_opt, max_bins=self.max_bins,
                              discretisation=self.discretisation, errors="return")
        return self._table(ks, deltas, lambda k: accs[ks.index(k)])

    def _build(self):
        t0 = time.perf_counter()
        components = self.components
        interval = self._interval_opt
        per_comp = [m.branches() for m, _ in components]
        labels = branch_labels(per_comp)
        self._labels = labels
        self.tail = _tail_for(self.total_steps)
        if interval is None:
            if self._start is None:
                h, _ = _rule_interval(_step_stats(self.components, per_comp), [k for _, k in components])
            else:
                h = float(self._start)
            self._branches = self._discretise(labels, per_comp, h)
            # refine once from a probe answer: the width of eps intervals scales
            # like h^2 (like h for privacy buckets), so aim the probe's relative
            # width at 0.4% (the probe's compositions stay cached when h is kept)
            rate = 0.5 if self.discretisation == "connect_the_dots" else 1.0
            for _ in range(2):
                relw = self._probe_width()
                if not relw > 0.004:  # NaN: the probe did not fit
                    break
                # (privacy buckets: at most 4x finer per refinement, so the default stays cheap)
                h_new = h * max(0.95 * (0.004 / relw) ** rate, 0.25)
                previous = self._branches
                try:
                    self._branches = self._discretise(labels, per_comp, h_new)
                    if rate == 1.0 and math.isnan(self._probe_width()):
                        raise GridTooLargeError("probe composition too large")
                except GridTooLargeError:
                    if rate == 0.5:
                        raise
                    self._branches = previous  # privacy buckets: keep the finest grid that fits
                    break
                h = h_new
            interval = h
        else:
            interval = V.positive_finite("interval", interval)
            _check_interval(interval, per_comp, self.tail)
            self._branches = self._discretise(labels, per_comp, interval)
        self.interval = float(interval)
        self.setup_seconds = time.perf_counter() - t0

    def _discretise(self, labels, per_comp, h):
        """One :class:`_BranchState` per label; grids are laid out now (size errors raise
        here), the PLDs themselves are built when a query needs them."""
        branches = []
        for label in labels:
            pairs = []
            for (m, k), bl in zip(self.components, per_comp):
                # a mechanism without this direction contributes its only branch
                b = next((b for b in bl if b.label == label), bl[0])
                pairs.append((b.upper, b.lower))
            src = _Discretised(pairs, h, self.tail, self.max_bins, self.discretisation, self.upper_only)
            branches.append(_BranchState(label, src, [k for _, k in self.components]))
        if len(branches) == 1:
            branches[0].source.fine()
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
        if len(self.components) != 1 or _tail_for(k) != self.tail:
            raise ValueError("only a single mechanism with the same per-step tail can share a discretisation")
        new = self.fresh()
        new._steps = [(self._steps[0][0], int(k))]
        new._built = True
        new._labels = self._labels
        new.tail = self.tail
        new._branches = [_BranchState(st.label, st.source, [int(k)]) for st in self._branches]
        new.interval = self.interval
        new.setup_seconds = 0.0
        new._built_keys = ("_labels", "tail", "_branches", "interval", "setup_seconds")
        return new

    # -- composition with caching -----------------------------------------
    def _compose(self, st: _BranchState, theta: float, eps_from=None) -> Composition:
        key = (round(theta, 12), eps_from)
        if key not in st.cache:
            st.cache[key] = compose(st.uppers, None if self.upper_only else st.lowers, st.counts, theta=theta,
                                    eps_from=eps_from, max_bins=self.max_bins)
        return st.cache[key]

    def _tilt_for(self, st, eps_target) -> float:
        return solve_tilt(st.uppers, st.counts, float(eps_target))

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

    def _branch_epsilon(self, st, deltas):
        n = deltas.size
        up = np.full(n, np.nan)
        lo = np.full(n, np.nan)
        share = np.full(n, np.inf)
        # start tilted at the smallest delta's estimated answer (one composition often serves all)
        comp = self._compose(st, estimate_tilt(st.uppers, st.counts, float(deltas.min())))
        tried = [comp.theta]
        todo = np.arange(n)
        for attempt in range(12):
            d = deltas[todo]
            eu = comp.upper.epsilon(d)
            el = self._lower_eps(comp, d)
            with np.errstate(invalid="ignore", divide="ignore"):
                sh = np.where(np.isfinite(eu), comp.roundoff.delta(np.where(np.isfinite(eu), eu, 0.0)) / d, np.inf)
            valid = eu >= comp.valid_from
            better = valid & (sh < share[todo])
            # delta below the certain +inf mass: eps is +inf, certified by the lower curve
            certain = (comp.lower.const > d) if comp.lower is not None else np.zeros(d.shape, bool)
            better |= certain
            eu = np.where(certain, np.inf, eu)
            el = np.where(certain, np.inf, el)
            sh = np.where(certain, 0.0, sh)
            idx = todo[better]
            up[idx], lo[idx], share[idx] = eu[better], el[better], sh[better]
            todo = np.arange(n)[~(share <= RETILT_SHARE)]
            if todo.size == 0:
                break
            # next: tilt at the pending answer with the smallest delta
            j = todo[np.argmin(deltas[todo])]
            theta = (self._tilt_for(st, up[j]) if np.isfinite(up[j])
                     else estimate_tilt(st.uppers, st.counts, float(deltas[j])))
            if any(abs(theta - th) < 1e-9 * max(1.0, th) for th in tried):
                theta = 0.0 if 0.0 not in tried else None  # fall back to the untilted window
            if theta is None:
                break
            tried.append(theta)
            comp = self._compose(st, theta)
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

    def _coarse_upper(self, st, x, kind: str) -> np.ndarray:
        """Certified upper bounds on this branch's eps(x) (``kind="eps"``, x = deltas) or
        delta(x) (``kind="delta"``, x = epsilons) from its pessimistic PLDs at spacing
        COARSE_FACTOR * h: cheap and looser; +inf where they cannot be had."""
        try:
            plds = st.source.coarse()
            theta = estimate_tilt(plds, st.counts, float(x.min())) if kind == "eps" else 0.0
            key = round(theta, 12)
            if key not in st.coarse_cache:
                st.coarse_cache[key] = compose(plds, None, st.counts, theta=theta, max_bins=self.max_bins)
            comp = st.coarse_cache[key]
            if kind == "eps":
                # below valid_from the curve says nothing, but upper.delta(valid_from) <= x
                # then certifies eps(x) <= valid_from
                out = np.maximum(comp.upper.epsilon(x), comp.valid_from)
            else:
                out = np.where(x >= comp.valid_from, np.minimum(comp.upper.delta(x), 1.0), np.inf)
        except (ArithmeticError, MemoryError, ValueError):
            return np.full(x.size, np.inf)
        return np.where(np.isnan(out), np.inf, out)

    def _combine(self, x, kind: str):
        """(lower, upper) of max over branches of eps(x) or delta(x).

        With several branches (add_remove) each answer is the maximum over the
        directions.  The branch with the largest coarse bounds is computed at full
        accuracy first; another branch is computed only at the queries where its
        coarse certified upper bound exceeds the lower bound found so far.  Where it
        does not, its true value lies below the others' lower bound, so it changes
        neither side of the interval: skipping it keeps both bounds certified.
        (Upper-only accountants compare with the upper bound found so far instead.)
        """
        exact = self._branch_epsilon if kind == "eps" else self._branch_delta
        empty = -np.inf if kind == "eps" else 0.0
        if len(self._branches) == 1:
            return exact(self._branches[0], x)
        coarse = [np.full(x.size, np.inf) if st.source.built else self._coarse_upper(st, x, kind)
                  for st in self._branches]
        lo = np.full(x.size, empty)
        up = np.full(x.size, empty)
        # (without lower bounds, a branch is skipped where its coarse bound is below the
        # upper bound found so far: the maximum's upper bound is then still certified)
        ref = up if self.upper_only else lo
        for i in self._order(coarse):
            need = ~(coarse[i] <= ref)
            if not need.any():
                continue
            l, u = exact(self._branches[i], x[need])
            lo[need] = np.maximum(lo[need], l)
            up[need] = np.maximum(up[need], u)
        return lo, up

    def _epsilon(self, deltas):
        lo, up = self._combine(deltas, "eps")
        return np.minimum(lo, up), up

    def epsilon(self, delta) -> Interval:
        """Certified interval for eps(delta), vectorised over delta.

        Returns
        -------
        Interval of arrays (or floats for scalar input): ``lower <= eps(delta) <= upper``.
        """
        scalar = np.ndim(delta) == 0
        deltas = V.delta_array("delta", delta)
        self._ensure_built()
        lo, up = self._epsilon(deltas)
        if scalar:
            return Interval(float(lo[0]), float(up[0]))
        return Interval(lo, up)

    # -- delta(eps) -------------------------------------------------------
    def _branch_delta(self, st, eps):
        n = eps.size
        up = np.full(n, np.nan)
        lo = np.full(n, np.nan)
        share = np.full(n, np.inf)
        comp = self._compose(st, 0.0)
        todo = np.arange(n)
        for attempt in range(12):
            e = eps[todo]
            du = comp.upper.delta(e)
            dl = (np.maximum(comp.lower.delta(e) - comp.alias_term(e), 0.0) if comp.lower is not None
                  else np.zeros(e.shape))
            with np.errstate(invalid="ignore", divide="ignore"):
                sh = comp.roundoff.delta(e) / np.maximum(du, 1e-320)
            valid = e >= comp.valid_from
            better = valid & (sh < share[todo])
            idx = todo[better]
            up[idx], lo[idx], share[idx] = du[better], dl[better], sh[better]
            todo = np.arange(n)[~(share <= RETILT_SHARE)]
            if todo.size == 0:
                break
            j = todo[np.argmax(eps[todo])]
            theta = self._tilt_for(st, eps[j])
            if abs(theta - comp.theta) < 1e-12:
                break
            comp = self._compose(st, theta)
        return lo, up

    def delta(self, epsilon) -> Interval:
        """Certified interval for delta(eps), vectorised over eps (negative eps allowed)."""
        scalar = np.ndim(epsilon) == 0
        eps = V.epsilon_array("epsilon", epsilon)
        self._ensure_built()
        lo, up = self._combine(eps, "delta")
        up = np.minimum(up, 1.0)
        lo = np.minimum(lo, up)
        if scalar:
            return Interval(float(lo[0]), float(up[0]))
        return Interval(lo, up)
