"""One accountant interface for every method (docs/MATH.md section 9).

Every accounting method (pld, prv, spa, rdp, clt, and the peers wrapped by
the sweeps) is an :class:`Accountant`:

* ``Accountant(relation="add_remove", **options)`` -- the neighbouring relation
  is stated once, here; options are validated at construction;
* ``compose(event, count=1)`` -- adds ``count`` runs of ``event`` (an event of
  :mod:`pldlib.events`, or a :class:`pldlib.Mechanism` whose relation matches),
  returns the accountant; refuses events the method does not support with
  :class:`UnsupportedEventError`;
* ``supports(event)`` -- whether ``compose`` would accept it;
* ``epsilon(delta)`` / ``delta(epsilon)`` -- vectorised; every method returns
  an :class:`Interval` (``lo, up = ...``; ``.estimate`` and ``.kind`` say the
  rest; NaN marks a side the method does not certify);
* ``epsilon_per_steps(event, steps, deltas)`` -- a table over several step
  counts of one event (what sweeps and atlases ask), shared work where the
  method can.

The work is done lazily, on the first query after the last ``compose``.
``kind`` says what a method's numbers are: ``"certified"`` (both ends are
proven bounds), ``"upper"`` (a proven upper bound only), ``"estimate"``
(no guarantee) or ``"peer"`` (another library's accountant).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import _validate as V
from .. import events as E
from .._deadline import DeadlineExceeded
from ..profiles.pairs import UnsupportedEventError

__all__ = ["Interval", "StepsTables", "Accountant", "Step", "UnsupportedEventError", "KINDS",
           "as_event", "components_of"]

#: what a method's numbers are
KINDS = ("certified", "upper", "estimate", "peer")


class Interval(tuple):
    """The answer of every method: ``lower <= truth <= upper`` (floats or arrays).

    It unpacks as a pair, ``lo, up = acc.epsilon(1e-5)``, whatever the method, and
    carries two more fields:

    * ``estimate`` -- a central value where the method has one (PRV's central value,
      SPA's SP-MSD1, the CLT's Gaussian-DP value, RDP's bound), else ``None``.  An
      estimate carries no guarantee unless ``kind`` says so;
    * ``kind`` -- what the ends are: ``"certified"`` (both ends proven bounds),
      ``"upper"`` (a proven upper end; ``lower`` is NaN), ``"estimate"`` (no
      guarantee: both ends NaN, only ``estimate``) or ``"peer"`` (another
      library's numbers, as that library states them).

    A NaN end means the method does not certify that side.
    """

    def __new__(cls, lower, upper, estimate=None, kind: str = "certified"):
        self = tuple.__new__(cls, (lower, upper))
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.__dict__["estimate"] = estimate
        self.__dict__["kind"] = kind
        return self

    def __getnewargs__(self):
        return (self[0], self[1], self.__dict__["estimate"], self.__dict__["kind"])

    def __setattr__(self, name, value):
        raise AttributeError("an Interval is immutable")

    @property
    def lower(self):
        return self[0]

    @property
    def upper(self):
        return self[1]

    @property
    def width(self):
        return np.asarray(self.upper) - np.asarray(self.lower)

    def _replace(self, **kw) -> "Interval":
        f = {"lower": self.lower, "upper": self.upper, "estimate": self.estimate, "kind": self.kind}
        f.update(kw)
        return Interval(**f)

    def __repr__(self) -> str:
        extra = "" if self.estimate is None else f", estimate={self.estimate!r}"
        extra += "" if self.kind == "certified" else f", kind={self.kind!r}"
        return f"Interval(lower={self.lower!r}, upper={self.upper!r}{extra})"


class StepsTables(NamedTuple):
    """What :meth:`Accountant.tables_per_steps` returns for one event over several step counts:
    arrays of shape (len(steps), len(deltas)) for epsilon and (len(steps), len(fprs)) for the
    largest true-positive rate of a membership test.

    ``eps_lower``/``eps_upper`` are the method's ends (NaN where not computed, with a note in
    ``notes``; NaN by design where ``kind`` does not certify that side), ``eps_estimate`` its
    central value (NaN where it has none).  ``tpr_lower``/``tpr_upper`` are the certified
    interval of :meth:`Accountant.max_tpr` (NaN where not computed, with a note in
    ``tpr_notes``); ``tpr_unsupported`` is the reason when the method has no certified
    trade-off curve at all (then every TPR is NaN).  ``unsupported`` is the reason when the
    method cannot take the event at all (every cell NaN); ``capped`` marks the cells left out
    by ``eps_cap`` (their true eps is above the cap).  :meth:`failed` is the per-cell mask of
    cells that should have an answer and have none.
    """

    eps_lower: np.ndarray
    eps_estimate: np.ndarray
    eps_upper: np.ndarray
    notes: list
    tpr_lower: np.ndarray
    tpr_upper: np.ndarray
    tpr_notes: list
    tpr_unsupported: str = ""
    kind: str = "certified"
    unsupported: str = ""
    capped: np.ndarray | None = None

    def failed(self) -> np.ndarray:
        """Cells without the answer the method's kind promises: no upper end (certified, upper,
        peer), no estimate (estimate); capped and unsupported cells are not failures."""
        value = self.eps_estimate if self.kind == "estimate" else self.eps_upper
        bad = np.isnan(np.asarray(value, dtype=float))
        if self.unsupported:
            return np.zeros(bad.shape, dtype=bool)
        if self.capped is not None:
            bad &= ~self.capped
        return bad


class Step:
    """One single-step event bound to a relation: what a method's engine composes.

    ``branches()`` are its dominating pairs (:func:`pldlib.sampling.dominating_pairs`).
    """

    __slots__ = ("event", "relation", "_br")

    def __init__(self, event, relation: str):
        self.event = event
        self.relation = relation
        self._br = None

    def branches(self):
        """The dominating pairs (built once: the profiles keep their support searches cached)."""
        if self._br is None:
            from ..sampling import dominating_pairs

            self._br = dominating_pairs(self.event, self.relation)
        return list(self._br)

    @property
    def base(self) -> E.BaseEvent:
        return self.event.event if isinstance(self.event, E.Sampled) else self.event

    @property
    def q(self) -> float:
        return self.event.q if isinstance(self.event, E.Sampled) else 1.0

    @property
    def group(self) -> int:
        """Records per protected user (1: example level; docs/MATH.md 13.1)."""
        return self.event.group if isinstance(self.event, E.Sampled) else 1

    @property
    def sampling(self) -> str:
        return self.event.sampling if isinstance(self.event, E.Sampled) and self.event.q < 1.0 else "none"

    def __repr__(self):
        return f"Step({self.event!r}, relation={self.relation!r})"


def as_event(obj, relation: str | None = None) -> E.Event:
    """An event from ``obj``: an :class:`~pldlib.events.Event`, or a
    :class:`~pldlib.Mechanism` (whose relation must be ``relation`` when given)."""
    if isinstance(obj, E.Event):
        return obj
    from ..mechanisms import Mechanism

    if isinstance(obj, Mechanism):
        if relation is not None and obj.relation != relation:
            raise ValueError(f"relation: the mechanism says {obj.relation!r} but the accountant was built for "
                             f"{relation!r}; state the relation once, on the accountant")
        return obj.event
    raise TypeError(f"event must be a pldlib event or Mechanism, got {obj!r}")


def components_of(mechanism, steps) -> tuple[str, list[tuple[E.Event, int]]]:
    """(relation, [(event, count)]) from ``account``-style arguments: a Mechanism and a
    step count, or a list of (Mechanism, steps) pairs (one relation for all)."""
    from ..mechanisms import Mechanism

    if isinstance(mechanism, Mechanism):
        if steps is None:  # a silent default of 1 step is a trap for DP-SGD users
            raise TypeError("steps: required for a single mechanism: the number of compositions "
                            "(e.g. DP-SGD iterations); pass steps=1 for a single release")
        return mechanism.relation, [(mechanism.event, V.steps("steps", steps))]
    if steps is not None:
        raise ValueError("steps: give counts inside the list of (mechanism, steps) pairs")
    if isinstance(mechanism, E.Event):
        raise TypeError("mechanism: for an event, build an accountant and call compose(event, count) "
                        "(e.g. PLDAccountant(relation).compose(event, count))")
    try:
        comps = list(mechanism)
    except TypeError:
        raise TypeError("mechanism must be a Mechanism or a list of (mechanism, steps) pairs") from None
    if not comps:
        raise ValueError("mechanism: the list of (mechanism, steps) pairs is empty")
    out = []
    for i, item in enumerate(comps):
        try:
            m, k = item
        except (TypeError, ValueError):
            raise TypeError(f"mechanism[{i}] must be a (mechanism, steps) pair") from None
        if not isinstance(m, Mechanism):
            raise TypeError(f"mechanism[{i}] is not a Mechanism: {m!r}")
        out.append((m, V.steps(f"steps of mechanism[{i}]", k)))
    relations = {m.relation for m, _ in out}
    if len(relations) > 1:
        raise ValueError(f"relation: all mechanisms of one sequence need the same relation, got {sorted(relations)}")
    return out[0][0].relation, [(m.event, k) for m, k in out]


class Accountant:
    """Base class of every accounting method (see the module docstring)."""

    #: registry name of the method
    method: str = ""
    #: what its numbers are: one of :data:`KINDS`
    kind: str = "certified"

    def __init__(self, relation: str = "add_remove"):
        self.relation = V.choice("relation", relation, V.RELATIONS)
        self._steps: list[tuple[Step, int]] = []
        self._built = False
        self._building = False
        self._built_keys: tuple = ()

    # -- composition ---------------------------------------------------------------
    def compose(self, event, count: int = 1) -> "Accountant":
        """Add ``count`` runs of ``event``; returns the accountant (for chaining)."""
        ev = as_event(event, self.relation)
        count = V.steps("count", count)
        flat = E.flatten(ev, count)
        for e, _k in flat:
            why = self._unsupported(Step(e, self.relation))
            if why:
                raise UnsupportedEventError(f"{self.method}: {why}")
        # equal (hashable) events merge into one step: an index keeps this linear in the
        # number of distinct events (it is rebuilt if ``_steps`` was replaced)
        index = self.__dict__.get("_step_index")
        if index is None or index[0] is not self._steps or len(index[1]) > len(self._steps):
            index = (self._steps, {s.event: i for i, (s, _) in enumerate(self._steps) if E._hashable(s.event)})
            self._step_index = index
        where = index[1]
        for e, k in flat:
            i = where.get(e) if E._hashable(e) else None
            if i is not None:
                s, k0 = self._steps[i]
                self._steps[i] = (s, k0 + k)
            else:
                if E._hashable(e):
                    where[e] = len(self._steps)
                self._steps.append((Step(e, self.relation), k))
        self._reset()
        return self

    def supports(self, event) -> bool:
        """Whether :meth:`compose` accepts ``event`` (under this accountant's relation)."""
        try:
            ev = as_event(event, self.relation)
            return all(not self._unsupported(Step(e, self.relation)) for e, _ in E.flatten(ev))
        except (TypeError, ValueError, UnsupportedEventError):
            return False

    def _unsupported(self, step: Step) -> str | None:
        """Why this method cannot account ``step`` (None if it can); default: it needs the
        step's dominating pairs."""
        try:
            step.branches()
        except UnsupportedEventError as e:
            return str(e)
        return None

    @property
    def components(self) -> list[tuple[Step, int]]:
        """The composed single steps and their counts."""
        return list(self._steps)

    @property
    def total_steps(self) -> int:
        return sum(k for _, k in self._steps)

    @classmethod
    def for_mechanism(cls, mechanism, steps=None, **options) -> "Accountant":
        """Built accountant for ``account``-style arguments (a Mechanism and a step count,
        or a list of (Mechanism, steps)); the relation is the mechanisms'."""
        relation, comps = components_of(mechanism, steps)
        acc = cls(relation, **options)
        for event, k in comps:
            acc.compose(event, k)
        try:
            acc._ensure_built()  # build errors (e.g. grid size) raise here
        except DeadlineExceeded:
            # the time budget ran out while building: not an error of the arguments.  The first
            # query builds again under its own budget and, if that runs out too, answers with the
            # trivial interval, flagged as accuracy-limited (docs/limits.md)
            pass
        return acc

    # -- lazy build ------------------------------------------------------------------
    def _build(self) -> None:
        """Compute what the queries need from :attr:`components` (subclasses)."""

    def _ensure_built(self) -> None:
        if self._built:
            return
        if not self._steps:
            raise ValueError(f"{self.method}: nothing composed yet: call compose(event, count) first")
        self._check_steps()
        before = set(self.__dict__)
        self._building = True
        try:
            self._build()
        finally:
            self._building = False
        self._built_keys = tuple(k for k in self.__dict__ if k not in before)
        self._built = True

    def _check_steps(self) -> None:
        """Per-epoch schemes: whole epochs only (sampling/base.py); ValueError naming steps."""
        from ..sampling.base import check_steps

        for s, k in self._steps:
            check_steps(s.event, k)

    def _reset(self) -> None:
        for k in self._built_keys:
            self.__dict__.pop(k, None)
        self._built_keys = ()
        self._built = False

    def __getattr__(self, name):
        # state made by _build (e.g. ``interval``) is built on first access
        d = self.__dict__
        if name.startswith("__") or "_built" not in d or d["_built"] or d.get("_building"):
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")
        self._ensure_built()  # (nothing composed yet: a ValueError that says to compose first)
        return getattr(self, name)

    # -- queries --------------------------------------------------------------------------
    def epsilon(self, delta):
        raise NotImplementedError

    def delta(self, epsilon):
        raise NotImplementedError

    # -- trade-off curves (f-DP; docs/MATH.md section 10) ------------------------------
    #: points of the eps grid of the generic trade-off bounds (:meth:`_power`)
    TRADEOFF_GRID = 801
    #: at most this many eps points are added around the points where those bounds are attained
    REFINE_POINTS = 1024

    def _direction_deltas(self, eps: np.ndarray) -> list:
        """Certified [(lower, upper), ...] of delta(eps), one entry per direction of the relation
        (add_remove: remove and add), each bounding that direction's own curve; ``lower`` must
        bound the curve of pairs realised by neighbours (docs/MATH.md 10.5).

        Default, for methods that report only the maximum over directions: the upper end of
        :meth:`delta` (the maximum's upper end bounds every direction's curve) and no lower end
        (the maximum's lower end bounds no single direction's curve, so it certifies no attack)."""
        d = self.delta(eps)
        return [(np.zeros(eps.shape), np.asarray(d.upper, dtype=float))]

    def _tradeoff_top(self) -> float:
        """The right end of the eps grid of :meth:`_power`: the upper eps(1e-12) (NaN if none;
        only the grid, never a bound, depends on it)."""
        try:
            return float(self.epsilon(1e-12).upper)
        except (ArithmeticError, ValueError):
            return math.nan

    def _power(self, alpha: np.ndarray):
        """(lower, upper) certified bounds on the power 1 - beta(alpha) (docs/MATH.md 10.1, 10.5).

        Generic version from the method's certified delta(eps) of each direction
        (:meth:`_direction_deltas`) on an eps grid e_0 < ... < e_K, refined around the points
        where the bounds are attained (the PLD accountant reads its discrete curves exactly):
        per direction, power <= min_k [delta_up(e_k) + e^{e_k} alpha] and power >= min(delta_lo(e_0),
        min_k [delta_lo(e_{k+1}) + e^{e_k} alpha], e^{e_K} alpha), and power >= alpha
        (:func:`pldlib.pld.tradeoff.profile_power`); the relation's power is the point-wise
        maximum over directions of these (never the conjugate of the maximum of the curves,
        whose lower end can exceed every direction's power).
        Methods whose delta has no certified upper side (estimates) refuse.
        """
        from ..pld.tradeoff import max_directions, profile_argmins, profile_power

        if self.kind not in ("certified", "upper"):
            raise NotImplementedError(f"{self.method}: no certified trade-off curve for this method "
                                      f"(kind {self.kind!r}: its answers are estimates); use the 'pld' accountant")
        self._ensure_built()
        top = self._tradeoff_top()
        top = top if math.isfinite(top) else 40.0
        top = min(max(top, 1.0), 60.0)
        eps = np.linspace(-top - 5.0, top, self.TRADEOFF_GRID)
        dirs = self._direction_deltas(eps)
        # refinement: REFINE_POINTS more eps in the cells next to where some bound is attained
        # (any set of eps gives certified bounds; the refinement only tightens them); a single step
        # composed once reads its own curve (:mod:`.single_step`, microseconds), so it refines again
        from . import single_step as SS

        rounds = 4 if SS.of_accountant(self) is not None else 1
        for _ in range(rounds):
            idx = np.unique(np.concatenate([profile_argmins(eps, dl, du, alpha) for dl, du in dirs]))
            per = min(32, self.REFINE_POINTS // max(idx.size, 1))
            if not (idx.size and per >= 2):
                break
            a_ = eps[np.maximum(idx - 1, 0)]
            b_ = eps[np.minimum(idx + 1, eps.size - 1)]
            t = np.linspace(0.0, 1.0, per + 2)[1:-1]
            extra = np.unique((a_[:, None] + (b_ - a_)[:, None] * t[None, :]).ravel())
            extra = extra[~np.isin(extra, eps)]
            if extra.size:
                more = self._direction_deltas(extra)
                allx = np.concatenate([eps, extra])
                order = np.argsort(allx, kind="stable")
                eps = allx[order]
                dirs = [(np.concatenate([np.asarray(dl, float), np.asarray(ml, float)])[order],
                         np.concatenate([np.asarray(du, float), np.asarray(mu, float)])[order])
                        for (dl, du), (ml, mu) in zip(dirs, more)]
        return max_directions(profile_power(eps, dl, du, alpha) for dl, du in dirs)

    def tradeoff(self, alpha):
        """Certified interval for the trade-off function beta(alpha) (least type II error at
        type I error alpha; for several directions, e.g. add_remove, the point-wise minimum over
        them, each read off its own curve; docs/MATH.md section 10, 10.5),
        vectorised over alpha in [0, 1].  ``lower`` comes from the pessimistic side (no attack
        does better), ``upper`` from the optimistic one (some attack does at least as well)."""
        from ..pld.tradeoff import alpha_array, beta_from_power

        scalar = np.ndim(alpha) == 0
        a = alpha_array("alpha", alpha)
        self._ensure_built()
        plo, pup = self._power(a)
        blo, bup = beta_from_power(plo, pup)
        return Interval(float(blo[0]), float(bup[0])) if scalar else Interval(blo, bup)

    def max_tpr(self, fpr):
        """Certified interval for the largest true-positive rate of any membership test at
        false-positive rate ``fpr`` (1 - beta(fpr)), vectorised over fpr in [0, 1]."""
        from ..pld.tradeoff import alpha_array

        scalar = np.ndim(fpr) == 0
        a = alpha_array("fpr", fpr)
        self._ensure_built()
        plo, pup = self._power(a)
        return Interval(float(plo[0]), float(pup[0])) if scalar else Interval(plo, pup)

    def advantage(self):
        """Certified interval for the largest attack advantage max_alpha (1 - alpha - beta(alpha))
        (= delta(0), the total variation distance; docs/MATH.md section 10)."""
        self._power(np.array([0.5]))  # refuses methods without a certified curve
        iv = self.delta(0.0)
        lo = float(iv.lower)
        return Interval(max(lo, 0.0) if not math.isnan(lo) else 0.0, min(float(iv.upper), 1.0))

    def gdp_mu(self, alpha_min: float | None = None):
        """Certified interval for the smallest Gaussian-DP mu with beta(alpha) >= G_mu(alpha) =
        Phi(Phi^-1(1 - alpha) - mu) for alpha in [alpha_min, 1/2] and, for the symmetric relations
        (add_remove, substitution), its mirror image; for add or remove alone alpha is checked
        up to 1 - alpha_min (alpha_min default 1e-12).

        ``upper`` is a mu the curve is certified to satisfy on that range (+inf: none is);
        ``lower`` a mu below which it is certified not to (on that range, hence on (0, 1));
        both are +inf when the optimistic side certifies mass at +infinity (power > 0 at
        alpha = 0): then no mu holds.  Any mass at +infinity (pure DP failure probability, and the pessimistic
        side's truncated tails) rules out mu-GDP as alpha -> 0, hence the range.
        """
        from ..pld.tradeoff import DEFAULT_ALPHA_MIN, gdp_mu_bounds

        am = DEFAULT_ALPHA_MIN if alpha_min is None else float(alpha_min)
        if not (0.0 < am < 0.5):
            raise ValueError(f"alpha_min: must lie in (0, 0.5), got {V.fmt(alpha_min)}")
        self._ensure_built()
        if self._power(np.array([0.0]))[0][0] > 0.0:
            # certified mass at +infinity: power > 0 at alpha = 0, which no G_mu allows
            return Interval(math.inf, math.inf)
        lo, up = gdp_mu_bounds(self._power, am, symmetric=self.relation in ("add_remove", "substitution"))
        return Interval(lo, up)

    def _options(self) -> dict:
        """Constructor keyword arguments that rebuild an equivalent empty accountant."""
        return {}

    def fresh(self) -> "Accountant":
        """An empty accountant of the same method, relation and options."""
        return type(self)(self.relation, **self._options())

    #: whether a composition of a few summands also reads the PLD accountant's certified ends
    #: (:mod:`.few_summands`, docs/MATH.md 0.9; the PRV and saddle-point accountants)
    few_summands_pld = False

    #: the relation whose pairs are the reverses of each relation's (docs/MATH.md 0.5)
    REVERSED = {"remove": "add", "add": "remove", "add_remove": "add_remove", "substitution": "substitution"}

    def _reversal_applies(self) -> bool:
        """Whether delta at eps < 0 may be read off the reversed relation's curve (docs/MATH.md 0.5):
        not when a step is a user-supplied pair (``ProfileEvent``, also subsampled), which is composed
        as given for every relation, so that the other relation's accountant composes the same pair,
        not its reverse, and the pair's own curve need not be its reverse's."""
        for s, _k in self._steps:
            ev = s.event
            if isinstance(ev, E.Sampled):
                ev = ev.event
            if isinstance(ev, E.ProfileEvent):
                return False
        return True

    def _reversed(self) -> "Accountant":
        """This composition under the reversed relation: its delta at -eps gives this one's at eps
        (docs/MATH.md 0.5).  add_remove and substitution are closed under reversing a pair, so they
        are their own (``self``); remove and add are each other's (cached while the steps are
        unchanged)."""
        rel = self.REVERSED.get(self.relation, self.relation)
        if rel == self.relation:
            return self
        key = tuple((id(s), int(k)) for s, k in self._steps)
        hit = self.__dict__.get("_rev")
        if hit is None or hit[0] != key:
            acc = type(self)(rel, **self._options())
            for s, k in self._steps:
                acc.compose(s.event, k)
            hit = (key, acc)
            self.__dict__["_rev"] = hit
        return hit[1]

    def epsilon_per_steps(self, event, steps, deltas):
        """``(lower, estimate, upper, notes)``: eps(delta) of ``count`` runs of ``event``
        for every ``count`` in ``steps`` (arrays of shape (len(steps), len(deltas))).

        A steps value or delta that cannot be answered is NaN with a note (its text);
        other errors of the event itself raise.  Methods override this to share work
        across steps values; the default composes one fresh accountant per value.
        """
        deltas = V.delta_array("deltas", deltas)
        ks = [V.steps(f"steps[{i}]", k) for i, k in enumerate(steps)]
        return self._table(ks, deltas, lambda k: self.fresh().compose(event, k))

    def _for_count(self, event, k: int) -> "Accountant":
        """An accountant of ``k`` runs of ``event`` (what :meth:`tables_per_steps` asks the
        trade-off curve of; methods override it to share work across steps values)."""
        return self.fresh().compose(event, k)

    def tables_per_steps(self, event, steps, deltas, fprs=(), *, eps_cap: float | None = None,
                         eps_floor: float | None = None) -> StepsTables:
        """eps(delta) of ``count`` runs of ``event`` for every count in ``steps`` and every delta,
        and, for each false-positive rate in ``fprs``, the certified largest true-positive rate
        of any membership test (:meth:`max_tpr`): one :class:`StepsTables`.  This is what a
        sweep's task computes and stores.

        An event the method cannot take gives NaN tables with the reason in ``unsupported``
        (not an exception).  ``eps_cap`` (not with ``fprs``): the steps values are computed in
        ascending chunks, stopping after the first chunk whose largest count has certified lower
        bounds above ``eps_cap`` at every delta; eps(delta) does not decrease with the count
        nor increase with delta, so every cell left out (``capped``) has a true eps above the
        cap.  ``eps_floor`` (not with ``fprs``; a certified method's tables): a steps value whose
        Renyi-DP upper bound (:func:`rdp_floor_mask`, cheap for all steps values at once) is at
        most ``eps_floor`` at every delta is not computed either (``capped``: its true eps is
        below the floor at every delta); where the RDP accountant cannot take the event, every
        steps value is computed.  Errors of a single cell become notes; transient errors
        (``OSError``, a ``MemoryError`` other than :class:`GridTooLargeError`) propagate so a
        caller can retry.
        """
        from ..pld.tradeoff import alpha_array

        deltas = V.delta_array("deltas", deltas)
        ks = [V.steps(f"steps[{i}]", k) for i, k in enumerate(steps)]
        fprs = alpha_array("fprs", fprs) if len(np.atleast_1d(fprs)) else np.zeros(0)
        S, D, F = len(ks), deltas.size, fprs.size
        if eps_cap is not None:
            eps_cap = V.positive_finite("eps_cap", eps_cap)
            if F:
                raise ValueError("eps_cap: cannot be combined with false-positive rates (fprs)")
        why = self._refusal(event)
        if why:
            nan = np.full((S, D), np.nan)
            return StepsTables(nan, nan.copy(), nan.copy(), [], np.full((S, F), np.nan), np.full((S, F), np.nan),
                               [], why if F else "", self.kind, why)
        capped = None
        if eps_floor is not None:
            eps_floor = V.positive_finite("eps_floor", eps_floor)
            if F:
                raise ValueError("eps_floor: cannot be combined with false-positive rates (fprs)")
            if eps_cap is not None and eps_floor >= eps_cap:
                raise ValueError(f"eps_floor ({eps_floor:g}) must be below eps_cap ({eps_cap:g})")
        below, below_note = (rdp_floor_mask(event, self.relation, ks, deltas, eps_floor)
                             if eps_floor is not None else (np.zeros(S, bool), ""))
        if below.any():  # the steps values above the floor only, then the floored rows put back
            keep = np.nonzero(~below)[0]
            inner = self.tables_per_steps(event, [ks[i] for i in keep], deltas, eps_cap=eps_cap) if keep.size else None
            lo, est, up = (np.full((S, D), np.nan) for _ in range(3))
            capped = np.zeros((S, D), dtype=bool)
            capped[below] = True
            notes = [below_note]
            if inner is not None:
                lo[keep], est[keep], up[keep] = inner.eps_lower, inner.eps_estimate, inner.eps_upper
                if inner.capped is not None:
                    capped[keep] = inner.capped
                notes = list(inner.notes) + notes
                if inner.unsupported:
                    return inner._replace(eps_lower=lo, eps_estimate=est, eps_upper=up, capped=None,
                                          notes=[inner.unsupported])
            return StepsTables(lo, est, up, notes, np.zeros((S, 0)), np.zeros((S, 0)), [], "", self.kind, "", capped)
        if eps_cap is not None:
            lo, est, up, notes, capped = self._capped(event, ks, deltas, eps_cap)
            t = StepsTables(lo, est, up, notes, np.zeros((S, 0)), np.zeros((S, 0)), [], "")
        elif F:
            t = self._tables(event, ks, deltas, fprs)
        else:
            lo, est, up, notes = self.epsilon_per_steps(event, ks, deltas)
            t = StepsTables(lo, est, up, notes, np.zeros((S, 0)), np.zeros((S, 0)), [], "")
        lo, up = np.asarray(t.eps_lower, dtype=float), np.asarray(t.eps_upper, dtype=float)
        if self.kind == "estimate":  # an estimate is never stored as a bound
            lo, up = np.full((S, D), np.nan), np.full((S, D), np.nan)
        elif self.kind == "upper":
            lo = np.full((S, D), np.nan)
        return t._replace(eps_lower=lo, eps_upper=up, eps_estimate=np.asarray(t.eps_estimate, dtype=float),
                          kind=self.kind, capped=capped)

    def _refusal(self, event) -> str:
        """Why this method cannot take ``event`` ("" if it can)."""
        if self.supports(event):
            return ""
        try:
            self.fresh().compose(event)
        except UnsupportedEventError as e:
            return str(e)
        return ""  # compose accepts it after all: let the computation say what goes wrong

    #: steps values computed per call when a row stops at ``eps_cap`` (ascending)
    CAP_CHUNK = 6

    def _capped(self, event, ks, deltas, cap: float):
        """:meth:`epsilon_per_steps` for the steps values the cap cannot leave out, together --
        those whose Renyi-DP upper bound at the largest delta is at most ``cap`` (their eps is
        at most the cap there: :func:`rdp_floor_mask`; none where RDP cannot take the event) --
        then in ascending chunks of :data:`CAP_CHUNK` steps values, stopping after the first
        chunk whose largest count has certified lower bounds above ``cap`` at every delta (see
        :meth:`tables_per_steps`).  A row whose every steps value is below the cap so is computed
        in one call, exactly as without the cap."""
        S, D = len(ks), deltas.size
        lo, est, up = (np.full((S, D), np.nan) for _ in range(3))
        notes: list = []
        order = sorted(range(S), key=lambda i: ks[i])
        sorted_ks, top = [ks[i] for i in order], deltas[[int(np.argmax(deltas))]]
        needed, why = rdp_floor_mask(event, self.relation, sorted_ks, top, cap)
        if why.startswith("eps_floor not applied") and self.relation == "substitution":
            # (a prediction only, to compute together what the cap will not leave out: a substitution
            # is a removal and an addition, so eps is about twice the add_remove one)
            needed, _ = rdp_floor_mask(event, "add_remove", sorted_ks, top, cap / 2.0)
        first = int(np.argmin(needed)) if not needed.all() else S  # (a prefix: the mask of the sorted ks)
        done = 0
        while done < S:
            idx = order[done: max(first, done + self.CAP_CHUNK)] if done == 0 else order[done: done + self.CAP_CHUNK]
            l_, e_, u_, n_ = self.epsilon_per_steps(event, [ks[i] for i in idx], deltas)
            lo[idx], est[idx], up[idx] = l_, e_, u_
            notes += list(n_)
            done += len(idx)
            last = np.asarray(l_, dtype=float)[-1]
            if np.all(np.isfinite(last)) and float(np.min(last)) > cap:
                break
        capped = np.zeros((S, D), dtype=bool)
        if done < S:
            k0 = ks[order[done - 1]]
            capped[order[done:]] = True
            notes.append(f"steps > {k0} not computed: eps > eps_cap={cap:g} there (certified lower bound "
                         f"{float(np.min(lo[order[done - 1]])):.4g} at steps={k0})")
        return lo, est, up, notes, capped

    def _tables(self, event, ks, deltas, fprs) -> StepsTables:
        """The epsilon and TPR tables (validated arguments, ``fprs`` non-empty).  By default one
        accountant per steps value (:meth:`_for_count`) answers both (the epsilons come from
        :meth:`epsilon_per_steps` where a method overrides it to share work); the PLD accountant
        answers both from accountants sharing one discretisation, SPA from one CGF table."""
        accs = {}

        def make(k):
            if k not in accs:
                accs[k] = self._for_count(event, k)
            return accs[k]

        if type(self).epsilon_per_steps is Accountant.epsilon_per_steps:
            lo, est, up, notes = self._table(ks, deltas, make)  # one accountant per steps value: both tables
        else:
            lo, est, up, notes = self.epsilon_per_steps(event, ks, deltas)
        tlo, tup, tnotes, why = self._tpr_table(ks, fprs, make)
        return StepsTables(lo, est, up, notes, tlo, tup, tnotes, why)

    def _tpr_table(self, ks, fprs, make):
        """``(lower, upper, notes, unsupported)``: the certified max TPR at ``fprs`` of ``make(k)``
        (a built accountant, or the exception that building it raised) for every k in ``ks``.
        Transient errors propagate (see :meth:`_table`); others become notes."""
        S, F = len(ks), fprs.size
        lo, up = np.full((S, F), np.nan), np.full((S, F), np.nan)
        if self.kind not in ("certified", "upper"):
            what = ("another library's numbers, which pldlib does not certify" if self.kind == "peer"
                    else "its answers are estimates")
            return lo, up, [], f"{self.method}: no certified trade-off curve (kind {self.kind!r}: {what})"
        notes = []
        for i, k in enumerate(ks):
            try:
                acc = make(k)
                if isinstance(acc, BaseException):
                    raise acc
                iv = acc.max_tpr(fprs)
            except NotImplementedError as e:  # the method refuses certified curves altogether
                return np.full((S, F), np.nan), np.full((S, F), np.nan), [], str(e)
            except Exception as e:
                if transient(e):
                    raise
                notes.append(f"steps={k}: {type(e).__name__}: {e}")
                continue
            lo[i], up[i] = iv.lower, iv.upper
        return lo, up, notes, ""

    @staticmethod
    def _table(ks, deltas, make, release: bool = False):
        """Fill the (steps x deltas) table from ``make(k)`` -> a built accountant (or the
        exception that building it raised).  ``release``: once a steps value is answered, its
        accountant drops what it keeps for later queries (``_release()``, where it has one):
        a row of many steps values then holds one accountant's working memory at a time.

        Transient errors (``OSError``, a ``MemoryError`` other than
        :class:`GridTooLargeError`) propagate so that a caller can retry; so does a
        ``NotImplementedError``, ``TypeError`` or ``ValueError`` of the first steps value
        (a bad event, not a bad cell).  Others become notes; a failed vectorised
        query is retried delta by delta so that the answerable deltas are kept.
        """
        S, D = len(ks), deltas.size
        lo, est, up = (np.full((S, D), np.nan) for _ in range(3))
        notes = []
        for i, k in enumerate(ks):
            try:
                acc = make(k)
                if isinstance(acc, BaseException):
                    raise acc
                acc._ensure_built()
            except Exception as e:
                if transient(e) or (isinstance(e, (NotImplementedError, ValueError, TypeError)) and i == 0):
                    raise
                notes.append(f"steps={k}: {type(e).__name__}: {e}")
                continue
            try:
                _put(acc.epsilon(deltas), lo, est, up, i, slice(None))
            except Exception as e:
                if transient(e):
                    raise
                # keep the answerable deltas: one at a time, each failure a note
                for j, d in enumerate(deltas):
                    try:
                        _put(acc.epsilon(float(d)), lo, est, up, i, j)
                    except Exception as e1:
                        if transient(e1):
                            raise
                        notes.append(f"steps={k} delta={d:g}: {type(e1).__name__}: {e1}"
                                     if deltas.size > 1 else f"steps={k}: {type(e1).__name__}: {e1}")
            if release and hasattr(acc, "_release"):
                acc._release()
        return lo, est, up, notes

    # -- display --------------------------------------------------------------------------
    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={_short(v)}" for k, v in self._options().items())
        comps = "; ".join(f"{s.event!r} x {k}" for s, k in self._steps) or "nothing composed"
        return (f"<{type(self).__name__} method={self.method!r} kind={self.kind!r} relation={self.relation!r}"
                f"{', ' + opts if opts else ''}: {comps}>")


def _short(v) -> str:
    """An option value for a repr: numbers as numbers, long arrays as their range."""
    if isinstance(v, np.ndarray):
        if v.size > 6 and v.ndim == 1:
            return f"<{v.size} values {E._fmt(v[0])}..{E._fmt(v[-1])}>"
        return "[" + ", ".join(E._fmt(x) for x in v.ravel()) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(E._fmt(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return E._fmt(v)


def transient(e: BaseException) -> bool:
    """Errors that may pass on another try: ``OSError`` and a ``MemoryError`` that is not
    pldlib's own refusal (:class:`GridTooLargeError`)."""
    if isinstance(e, MemoryError):
        return not isinstance(e, V.GridTooLargeError)
    return isinstance(e, OSError)


def branch_labels(per_comp) -> list[str]:
    """The branch labels of a sequence of steps, first occurrence order (``per_comp``: one
    list of branches per step; items are :class:`Branch` or tuples whose first field is
    the label).  A step without a label contributes its only branch to it."""
    labels: list[str] = []
    for bl in per_comp:
        for b in bl:
            if b[0] not in labels:
                labels.append(b[0])
    return labels


def _put(r, lo, est, up, i, j):
    lo[i, j], up[i, j] = r.lower, r.upper
    if r.estimate is not None:
        est[i, j] = r.estimate


def scalar_or_array(scalar: bool, *arrays):
    """Floats for a scalar query, arrays otherwise."""
    if scalar:
        return tuple(float(np.asarray(a).ravel()[0]) if np.size(a) else math.nan for a in arrays)
    return arrays



#: the cheap certified upper bound behind ``eps_floor`` and the ``eps_cap`` grouping:
#: ``fn(event, relation, ks, deltas, floor) -> (mask, note)`` (set by :mod:`pldlib.methods` to
#: :func:`pldlib.methods.rdp.rdp_floor_mask`; this interface module imports no method)
_FLOOR_MASK = None


def set_floor_mask(fn) -> None:
    """Install the cheap certified upper bound used by ``eps_floor`` (see :data:`_FLOOR_MASK`)."""
    global _FLOOR_MASK
    _FLOOR_MASK = fn


def rdp_floor_mask(event, relation: str, ks, deltas, floor: float):
    """The installed cheap bound's ``(mask, note)`` (nothing masked when none is installed)."""
    if _FLOOR_MASK is None:
        return np.zeros(len(list(ks)), dtype=bool), "eps_floor not applied: no cheap certified upper bound installed"
    return _FLOOR_MASK(event, relation, ks, deltas, floor)
