"""pldlib behind dp_accounting's interface (docs/MATH.md section 14).

:class:`PldlibAccountant` is a ``dp_accounting.PrivacyAccountant``: code that
takes a dp_accounting accountant (JAX Privacy builds them as
``accountant_fn(neighboring_relation)``, TF Privacy and
``dp_accounting.mechanism_calibration.calibrate_dp_mechanism`` call
``compose(event, count)`` and ``get_epsilon(delta)``) runs unchanged on any
certified pldlib method::

    from dp_accounting import dp_event
    from pldlib.interop.dp_accounting import PldlibAccountant

    acc = PldlibAccountant()                       # ADD_OR_REMOVE_ONE, method "pld"
    acc.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0)), 10_000)
    acc.get_epsilon(1e-5)                          # the certified UPPER bound (a float)
    acc.epsilon_interval(1e-5)                     # pldlib's Interval(lower, upper)

Guarantee: ``get_epsilon`` / ``get_delta`` return the **upper** end of the
method's certified answer (pessimistic: never below the truth); the lower end
is available from :meth:`PldlibAccountant.epsilon_interval` /
:meth:`PldlibAccountant.delta_interval`.  A method that certifies no upper
bound (``clt``) is refused.

Neighbouring relations (``dp_accounting.NeighboringRelation``):

* ``ADD_OR_REMOVE_ONE`` -> pldlib ``"add_remove"``;
* ``REPLACE_ONE`` -> ``"substitution"``;
* ``REPLACE_SPECIAL`` (a record replaced by a fixed "zero" record) -> ``"add_remove"``
  for Gaussian / Laplace / discrete Laplace steps, unsampled or Poisson-sampled:
  the differing record moves the query by at most its sensitivity and, under
  Poisson sampling, is included independently of the others, so the dominating
  pairs are exactly the remove pair and its reversal (MATH.md section 14).
  Sampling without replacement is refused under it (pldlib's WOR pairs assume
  add/remove or substitution neighbours, and would not be tight).

Events (:func:`from_dp_event`): ``NoOpDpEvent``, ``NonPrivateDpEvent`` (epsilon
= inf, delta = 1, as dp_accounting's accountants), ``GaussianDpEvent``,
``LaplaceDpEvent``, ``DiscreteLaplaceDpEvent``, ``RandomizedResponseDpEvent``
(under ``REPLACE_ONE`` / ``REPLACE_SPECIAL``, as dp_accounting: k-ary randomized
response is an exact finite pair), ``PoissonSampledDpEvent``,
``SampledWithoutReplacementDpEvent`` (rate = sample_size / source_dataset_size;
dp_accounting's PLD accountant has no such event, so JAX Privacy falls back to
RDP for fixed-size batches: here it is a certified interval),
``MixtureOfGaussiansDpEvent`` (under ``ADD_OR_REMOVE_ONE`` and ``REPLACE_SPECIAL``,
as dp_accounting: both directions of its pair; its two-point form {0, c} is the
Poisson-sampled Gaussian), ``TruncatedSubsampledGaussianDpEvent`` (``ADD_OR_REMOVE_ONE``),
``SingleEpochTreeAggregationDpEvent``, ``RepeatAndSelectDpEvent``, ``ZCDpEvent``,
``RandomAllocationDpEvent(event, num_selected, num_steps)`` (dp_accounting's pull request #414, read
by its fields since it is in no release: one epoch, each record in ``num_selected`` of the
``num_steps`` steps; Gaussian inner event), ``SelfComposedDpEvent``, ``ComposedDpEvent``.
dp_accounting has no plain (epsilon, delta) event; pldlib's :class:`~pldlib.events.ApproxDPEvent`
therefore has no dp_accounting counterpart.  ``SampledWithReplacementDpEvent`` around a
``GaussianDpEvent`` (``ADD_OR_REMOVE_ONE``: its exact pair; ``REPLACE_ONE``: a certified interval
whose upper end is not tight; MATH.md 2.7; neither of dp_accounting's accountants takes it).
Refused with the reason: ``UnsupportedDpEvent``.
"""
from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event as D
from dp_accounting import privacy_accountant as PA

from .. import _validate as V
from .. import events as E
from ..methods import make_accountant, method_info, method_names
from ..methods.base import Interval
from ..methods.peers.dp_accounting import RELATION_OF_DP, to_dp_event  # noqa: F401  (re-exported)
from ..profiles import FiniteProfile
from ..profiles.base import LossRangeError

__all__ = ["PldlibAccountant", "calibrate_dp_mechanism", "from_dp_event", "to_dp_event", "relation_of", "NeighboringRelation",
           "CERTIFIED_UPPER_METHODS"]

NeighboringRelation = PA.NeighboringRelation
NR = NeighboringRelation

_RELATION = RELATION_OF_DP  # one mapping, shared with the dp_accounting peer

#: pldlib method kinds whose answers carry a certified upper bound (what get_epsilon returns)
CERTIFIED_UPPER_METHODS = ("certified", "upper")


class _Refused(Exception):
    def __init__(self, event, message):
        super().__init__(message)
        self.event, self.message = event, message


class _NonPrivate:
    """Marker: the (sub)event releases its input (epsilon = inf)."""


NON_PRIVATE = _NonPrivate()


def relation_of(neighboring_relation) -> str:
    """The pldlib relation name of a ``dp_accounting.NeighboringRelation``."""
    if not isinstance(neighboring_relation, NR):
        raise TypeError("neighboring_relation must be a dp_accounting NeighboringRelation "
                        f"(ADD_OR_REMOVE_ONE, REPLACE_ONE, REPLACE_SPECIAL), got {neighboring_relation!r}")
    return _RELATION[neighboring_relation]


def _rr_event(ev, rel):
    """k-ary randomized response (noise parameter p, k buckets) as an exact pair.

    Output = input with probability 1 - p + p/k, any other bucket with p/k each.
    REPLACE_ONE (x -> x'): losses +l, 0, -l with P-masses 1-p+p/k, (k-2)p/k, p/k,
    l = log((1-p+p/k)/(p/k)); for k = 2 this is binary randomized response with
    eps0 = l.  REPLACE_SPECIAL (x -> a record answered uniformly): remove pair
    P = R(x), Q = uniform: losses log(k(1-p+p/k)), log(p) with P-masses 1-p+p/k,
    (k-1)p/k; the add direction is its reversal.
    """
    p, k = ev.noise_parameter, ev.num_buckets
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise _Refused(ev, f"num_buckets must be an integer >= 1, got {V.fmt(k)}")
    if not (0.0 <= p <= 1.0):
        raise _Refused(ev, f"noise_parameter must be in [0, 1], got {V.fmt(p)}")
    if rel == NR.ADD_OR_REMOVE_ONE:
        raise _Refused(ev, "RandomizedResponseDpEvent needs neighboring_relation REPLACE_ONE or REPLACE_SPECIAL "
                           "(as in dp_accounting)")
    if p == 1.0 or k == 1:  # uniform output, or a single bucket: nothing is released
        return E.NoOp()
    if p == 0.0:
        return NON_PRIVATE
    top, other = 1.0 - p + p / k, p / k
    if rel == NR.REPLACE_ONE:
        if k == 2:
            return E.RandomizedResponseEvent(math.log(top / other))
        l = math.log(top / other)
        return E.ProfileEvent(FiniteProfile([-l, 0.0, l], [other, (k - 2) * other, top]))
    rem = FiniteProfile([math.log(k * top), math.log(p)], [top, (k - 1) * other])
    return E.ProfileEvent(rem, rem.reversed())


def _tree_event(ev, rel):
    """Tree aggregation over one epoch (Kairouz et al. 2021, appendix D): trees restarted, each
    record in one tree; a record's gradient enters ceil(log2(T + 1)) node sums of its tree (T: the
    largest tree), each by at most the clipping norm, so the released node sums move by at most
    sqrt(depth) in L2 when the record is replaced by the special one: a Gaussian mechanism with
    sensitivity sqrt(depth) (docs/MATH.md 14).  Only under REPLACE_SPECIAL: adding or removing a
    record shifts the later records' places in the stream."""
    if rel != NR.REPLACE_SPECIAL:
        raise _Refused(ev, "tree aggregation is accounted under REPLACE_SPECIAL only (adding or removing a record "
                           "moves every later record to another leaf)")
    counts = [ev.step_counts] if np.isscalar(ev.step_counts) else list(ev.step_counts)
    try:
        counts = [V.int_at_least("step_counts", c, 0) for c in counts]
    except (TypeError, ValueError) as e:
        raise _Refused(ev, str(e)) from None
    if not counts or max(counts) == 0:
        raise _Refused(ev, "step_counts must hold at least one positive number of steps")
    if ev.noise_multiplier == 0:
        return NON_PRIVATE
    depth = math.ceil(math.log2(max(counts) + 1))
    try:
        # (noise std sigma x the clipping norm on every node: noise multiplier sigma / sqrt(depth) of
        # the whole release, whose sensitivity is sqrt(depth) clipping norms)
        return E.GaussianEvent(ev.noise_multiplier / math.sqrt(depth))
    except (TypeError, ValueError) as e:
        raise _Refused(ev, f"noise_multiplier: {e}") from None


def _sizes(ev) -> tuple[int, int]:
    """(source_dataset_size, sample_size) of a sampled-with/without-replacement event, each an integer
    >= 0 (_Refused naming the field otherwise)."""
    n, m = ev.source_dataset_size, ev.sample_size
    for name, v in (("source_dataset_size", n), ("sample_size", m)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise _Refused(ev, f"{name} must be an integer >= 0, got {V.fmt(v)}")
    return n, m


def _with_replacement(ev, rel):
    """SampledWithReplacementDpEvent around a GaussianDpEvent: ``sample_size`` independent uniform draws
    from ``source_dataset_size`` records (docs/MATH.md 2.7; ADD_OR_REMOVE_ONE exact, REPLACE_ONE an
    upper bound that is not tight)."""
    n, m = _sizes(ev)
    if m == 0:
        return E.NoOp()
    if n < 2:
        raise _Refused(ev, f"source_dataset_size must be at least 2 (the data set with the protected record), got {n}")
    if rel == NR.REPLACE_SPECIAL:
        raise _Refused(ev, "sampling with replacement is supported under ADD_OR_REMOVE_ONE and REPLACE_ONE, not "
                           "REPLACE_SPECIAL")
    if not isinstance(ev.event, D.GaussianDpEvent):
        raise _Refused(ev, f"sampling with replacement is certified around a GaussianDpEvent only, not "
                           f"{type(ev.event).__name__}")
    if ev.event.noise_multiplier == 0:
        return NON_PRIVATE
    try:
        return E.WithReplacementGaussianEvent(ev.event.noise_multiplier, n, m)
    except (TypeError, ValueError) as e:
        raise _Refused(ev, f"noise_multiplier: {e}") from None


def _convert(ev, rel):
    """pldlib event (or NON_PRIVATE) of a DpEvent under dp_accounting relation ``rel``;
    raises _Refused naming the offending sub-event."""
    if isinstance(ev, D.NoOpDpEvent):
        return E.NoOp()
    if isinstance(ev, D.NonPrivateDpEvent):
        return NON_PRIVATE
    for theirs, ours in ((D.GaussianDpEvent, E.GaussianEvent), (D.LaplaceDpEvent, E.LaplaceEvent)):
        if isinstance(ev, theirs):
            if ev.noise_multiplier == 0:
                return NON_PRIVATE
            try:
                return ours(ev.noise_multiplier)
            except (TypeError, ValueError) as e:
                raise _Refused(ev, f"noise_multiplier: {e}") from None
    if isinstance(ev, D.DiscreteLaplaceDpEvent):
        a = ev.noise_parameter
        if a == 0:
            return NON_PRIVATE
        try:
            return E.DiscreteLaplaceEvent(1.0 / V.positive_finite("noise_parameter", a), ev.sensitivity)
        except (TypeError, ValueError) as e:
            raise _Refused(ev, str(e)) from None
    if isinstance(ev, D.RandomizedResponseDpEvent):
        return _rr_event(ev, rel)
    if isinstance(ev, D.SingleEpochTreeAggregationDpEvent):
        return _tree_event(ev, rel)
    if isinstance(ev, D.TruncatedSubsampledGaussianDpEvent):
        if rel != NR.ADD_OR_REMOVE_ONE:
            raise _Refused(ev, "truncated Poisson sampling is accounted under ADD_OR_REMOVE_ONE only here")
        if ev.sampling_probability == 0 or ev.truncated_batch_size == 0 or ev.dataset_size == 0:
            return E.NoOp()
        if ev.noise_multiplier == 0:
            return NON_PRIVATE
        try:
            return E.TruncatedPoissonGaussianEvent(ev.noise_multiplier, ev.sampling_probability, ev.dataset_size,
                                                   ev.truncated_batch_size)
        except (TypeError, ValueError) as e:
            raise _Refused(ev, str(e)) from None
    if isinstance(ev, D.RepeatAndSelectDpEvent):
        inner = _convert(ev.event, rel)
        if inner is NON_PRIVATE:
            return NON_PRIVATE
        try:
            return E.RepeatAndSelectEvent(inner, ev.mean, ev.shape)
        except (TypeError, ValueError) as e:
            raise _Refused(ev, str(e)) from None
    if isinstance(ev, D.ZCDpEvent):  # (taken as stated for the accountant's relation; method "rdp" takes it)
        try:
            return E.ZCDPEvent(ev.rho, ev.xi)
        except (TypeError, ValueError) as e:
            raise _Refused(ev, str(e)) from None
    if isinstance(ev, D.MixtureOfGaussiansDpEvent):
        if rel == NR.REPLACE_ONE:
            raise _Refused(ev, "a mixture of Gaussians is accounted under ADD_OR_REMOVE_ONE and REPLACE_SPECIAL "
                               "(as dp_accounting does), not REPLACE_ONE")
        if ev.standard_deviation == 0:
            return NON_PRIVATE
        try:
            return E.MixtureOfGaussiansEvent(ev.standard_deviation, tuple(ev.sensitivities),
                                            tuple(ev.sampling_probs)).canonical()
        except (TypeError, ValueError) as e:
            raise _Refused(ev, str(e)) from None
    if isinstance(ev, D.PoissonSampledDpEvent):
        q = ev.sampling_probability
        if not (isinstance(q, (int, float, np.number)) and 0.0 <= q <= 1.0):
            raise _Refused(ev, f"sampling_probability must be in [0, 1], got {V.fmt(q)}")
        if q == 0:
            return E.NoOp()
        return _sampled(ev, ev.event, float(q), "poisson", rel)
    if isinstance(ev, D.SampledWithoutReplacementDpEvent):
        n, m = _sizes(ev)
        if m > n or n == 0:
            raise _Refused(ev, f"sample_size must be in [0, source_dataset_size], got {m} of {n}")
        if m == 0:
            return E.NoOp()
        if rel == NR.REPLACE_SPECIAL and m < n:
            raise _Refused(ev, "sampling without replacement is supported under ADD_OR_REMOVE_ONE and "
                               "REPLACE_ONE, not REPLACE_SPECIAL")
        return _sampled(ev, ev.event, m / n, "wor", rel)
    if isinstance(ev, D.SampledWithReplacementDpEvent):
        return _with_replacement(ev, rel)
    if type(ev).__name__ == "RandomAllocationDpEvent":
        return _random_allocation(ev, rel)
    if isinstance(ev, D.SelfComposedDpEvent):
        c = ev.count
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0:
            raise _Refused(ev, f"count must be an integer >= 0, got {V.fmt(c)}")
        inner = _convert(ev.event, rel)
        if c == 0 or isinstance(inner, E.NoOp):
            return E.NoOp()
        if inner is NON_PRIVATE:
            return NON_PRIVATE
        return E.SelfComposed(inner, int(c))
    if isinstance(ev, D.ComposedDpEvent):
        subs = [_convert(e, rel) for e in ev.events]
        if any(s is NON_PRIVATE for s in subs):
            return NON_PRIVATE
        subs = [s for s in subs if not isinstance(s, E.NoOp)]
        return E.Composed(subs) if subs else E.NoOp()
    if isinstance(ev, D.DpEvent):
        raise _Refused(ev, f"{type(ev).__name__} has no pldlib counterpart")
    raise _Refused(ev, f"not a DpEvent: {ev!r}")


def _random_allocation(ev, rel):
    """``RandomAllocationDpEvent(event, num_selected, num_steps)`` (dp_accounting's pull request #414,
    not in a release: read by its fields): one epoch of ``num_steps`` steps of ``event``, every record
    in ``num_selected`` of them chosen uniformly -> t steps of ``Sampled(event, k/t,
    "random_allocation", selections=k)`` (Gaussian inner event, as that pull request)."""
    k, t = getattr(ev, "num_selected", None), getattr(ev, "num_steps", None)
    for name, v in (("num_selected", k), ("num_steps", t)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise _Refused(ev, f"{name} must be an integer >= 1, got {V.fmt(v)}")
    k, t = int(k), int(t)
    if k > t:
        raise _Refused(ev, f"num_selected must be <= num_steps, got {k} of {t}")
    if rel == NR.REPLACE_SPECIAL:
        raise _Refused(ev, "random allocation is accounted under ADD_OR_REMOVE_ONE and REPLACE_ONE, "
                           "not REPLACE_SPECIAL")
    inner = _convert(getattr(ev, "event", None), rel)
    if isinstance(inner, E.NoOp) or inner is NON_PRIVATE:
        return inner
    if not isinstance(inner, E.GaussianEvent):
        raise _Refused(ev, "random allocation is implemented for a Gaussian inner event only, "
                           f"got {getattr(ev, 'event', None)}")
    if k == t:  # every record in every step: t unsampled steps
        return E.SelfComposed(inner, t)
    try:
        return E.SelfComposed(E.Sampled(inner, k / t, "random_allocation", selections=k), t)
    except (TypeError, ValueError) as e:
        raise _Refused(ev, str(e)) from None


def _sampled(outer, inner_ev, q, scheme, rel):
    inner = _convert(inner_ev, rel)
    if isinstance(inner, E.NoOp):
        return inner
    if inner is NON_PRIVATE:  # as dp_accounting: epsilon = inf (a valid upper bound; delta(eps) = q exactly)
        return NON_PRIVATE
    if not isinstance(inner, (E.GaussianEvent, E.LaplaceEvent, E.DiscreteLaplaceEvent)):
        raise _Refused(outer, f"the sampled event must be Gaussian, Laplace or discrete Laplace, got {inner_ev}")
    return E.Sampled(inner, q, scheme) if q < 1.0 else inner


def from_dp_event(event, neighboring_relation=NR.ADD_OR_REMOVE_ONE) -> E.Event:
    """The pldlib event of a dp_accounting ``DpEvent`` (see the module docstring).

    ``neighboring_relation`` matters for randomized response (whose pair depends on
    it) and for refusing what a relation does not support.  Account the result with
    a pldlib accountant built for ``relation_of(neighboring_relation)``.  A
    ``NonPrivateDpEvent`` (or a zero noise multiplier) has no pldlib event:
    ``ValueError``; an event pldlib cannot account: :class:`pldlib.UnsupportedEventError`.
    """
    from ..methods import UnsupportedEventError

    relation_of(neighboring_relation)
    try:
        out = _convert(event, neighboring_relation)
    except _Refused as r:
        raise UnsupportedEventError(f"event: {r.message} (in {r.event})") from None
    if out is NON_PRIVATE:
        raise ValueError(f"event: {event} is not differentially private (epsilon = inf); it has no pldlib event")
    return out


class PldlibAccountant(PA.PrivacyAccountant):
    """A dp_accounting ``PrivacyAccountant`` answered by a certified pldlib method.

    Parameters
    ----------
    neighboring_relation : ``dp_accounting.NeighboringRelation`` (first positional
        argument, as JAX Privacy calls ``accountant_fn(relation)``); default
        ``ADD_OR_REMOVE_ONE``
    method : a pldlib method name (``pldlib.method_names()``) whose answers carry a
        certified upper bound: ``"pld"`` (default), ``"prv"``, ``"spa"``, ``"rdp"``
    on_limit : ``"inf"`` (default) or ``"raise"``: what :meth:`get_epsilon` does when
        the method cannot compute a bound at all because a single step leaks too much
        (privacy loss beyond the floating range) or its grid would exceed ``max_bins``:
        return ``inf`` (delta: 1), a valid but trivial upper bound -- this is what
        calibration searches need at tiny noise --, or raise the pldlib error
    **options : the method's own options (e.g. ``spacing=`` for ``pld``)

    ``get_epsilon(delta)`` and ``get_delta(epsilon)`` return the certified upper end
    (pessimistic; MATH.md section 14); :meth:`epsilon_interval` and
    :meth:`delta_interval` return the method's whole answer.
    """

    def __init__(self, neighboring_relation=NR.ADD_OR_REMOVE_ONE, method: str = "pld", *,
                 on_limit: str = "inf", **options):
        relation = relation_of(neighboring_relation)
        super().__init__(neighboring_relation)
        V.choice("method", method, method_names())
        if method_info(method).kind not in CERTIFIED_UPPER_METHODS:
            raise ValueError(f"method: {method!r} certifies no upper bound (kind {method_info(method).kind!r}); "
                             f"use one of {', '.join(method_names(CERTIFIED_UPPER_METHODS))}")
        self._on_limit = V.choice("on_limit", on_limit, ("inf", "raise"))
        self._method = method
        self._method_options = dict(options)
        self._relation = relation
        self._acc = make_accountant(method, relation, **options)  # validates the options
        self._non_private = False

    # -- dp_accounting's protocol ------------------------------------------------------
    def _maybe_compose(self, event, count, do_compose):
        try:
            ev = _convert(event, self.neighboring_relation)
        except _Refused as r:
            return self.CompositionErrorDetails(invalid_event=r.event, error_message=r.message)
        if ev is NON_PRIVATE:
            if do_compose and count > 0:
                self._non_private = True
            return None
        if isinstance(ev, E.NoOp):
            return None
        if not self._acc.supports(ev):
            try:
                self._acc.fresh().compose(ev, 1)
                why = f"{self._method} does not support this event"
            except Exception as e:  # the method's own reason
                why = str(e)
            return self.CompositionErrorDetails(invalid_event=event, error_message=why)
        if do_compose and count > 0:
            self._acc.compose(ev, int(count))
        return None

    def get_epsilon(self, target_delta: float) -> float:
        """Certified upper bound on epsilon at ``target_delta`` (a float)."""
        if self._non_private:
            return math.inf
        r = self._answer("epsilon", target_delta)
        return float(r.upper)

    def get_delta(self, target_epsilon: float) -> float:
        """Certified upper bound on delta at ``target_epsilon`` (a float)."""
        if self._non_private:
            return 1.0
        r = self._answer("delta", target_epsilon)
        return float(r.upper)

    # -- pldlib's answers ------------------------------------------------------------------
    def epsilon_interval(self, target_delta) -> Interval:
        """The method's whole answer for epsilon (an ``Interval``, with ``estimate`` where the method has one)."""
        if self._non_private:
            return Interval(math.inf, math.inf)
        return self._answer("epsilon", target_delta)

    def delta_interval(self, target_epsilon) -> Interval:
        """The method's whole answer for delta (an ``Interval``, with ``estimate`` where the method has one)."""
        if self._non_private:
            return Interval(1.0, 1.0)
        return self._answer("delta", target_epsilon)

    @property
    def accountant(self):
        """The pldlib accountant doing the work."""
        return self._acc

    @property
    def method(self) -> str:
        return self._method

    def _answer(self, what, x):
        if not self._acc.components:  # nothing but no-ops: identical output distributions
            if what == "epsilon":
                V.delta_array("target_delta", x)
                return Interval(0.0, 0.0)
            e = float(V.epsilon_array("target_epsilon", x)[0]) if np.ndim(x) == 0 else None
            if e is None:
                d = np.maximum(0.0, -np.expm1(V.epsilon_array("target_epsilon", x)))
                return Interval(d, d)
            d = max(0.0, -math.expm1(e))
            return Interval(d, d)
        try:
            return getattr(self._acc, what)(x)
        except (LossRangeError, V.GridTooLargeError):
            if self._on_limit == "raise":
                raise
            if what == "epsilon":
                return Interval(-math.inf, math.inf)
            return Interval(0.0, 1.0)

    def __repr__(self) -> str:
        opts = "".join(f", {k}={E._fmt(v)}" for k, v in self._method_options.items())
        return (f"<PldlibAccountant {self.neighboring_relation.name} method={self._method!r}{opts}: "
                f"{'non-private; ' if self._non_private else ''}{self._acc!r}>")


# -- calibration ------------------------------------------------------------------------------
#: at most this factor beyond the first guess when a bracket is searched for (as dp_accounting)
BRACKET_GROWTH = 2.0**30


def calibrate_dp_mechanism(make_fresh_accountant, make_event_from_param, target_epsilon: float,
                           target_delta: float, bracket_interval=None, discrete: bool = False,
                           tol: float | None = None):
    """``dp_accounting.mechanism_calibration.calibrate_dp_mechanism``'s contract, answered by
    pldlib's certified calibration (:func:`pldlib.calibration.calibrate_parameter`).

    ``make_fresh_accountant()`` must return a :class:`PldlibAccountant` (its method, relation
    and options are used); ``make_event_from_param(p)`` builds the ``DpEvent`` at parameter p.
    ``bracket_interval`` is a dp_accounting ``ExplicitBracketInterval`` or
    ``LowerEndpointAndGuess`` (default: lower end 0, guess 1, grown by doubling up to 2^30 times
    the guess).  The epsilon of the event must be monotone in p, either way (a noise multiplier:
    decreasing; a number of steps: increasing).  ``tol`` is absolute, as in dp_accounting
    (default 1e-6, or exact integers when ``discrete``); it becomes the relative tolerance
    ``tol / max bracket end`` within [1e-8, 0.1].

    Returns the extreme parameter whose **certified upper** epsilon(target_delta) is at most
    ``target_epsilon`` (an ``int`` when ``discrete``).  Unlike dp_accounting's root search, the
    returned value never lies on the wrong side of the target: the certificate is checked at
    the returned value itself.  Raises :class:`pldlib.calibration.TargetUnreachableError` when no
    parameter in the bracket meets the target.
    """
    from dp_accounting import mechanism_calibration as MC

    from ..calibration import NotPrivateError, calibrate_parameter

    if not callable(make_fresh_accountant):
        raise TypeError(f"make_fresh_accountant: must be callable, got {type(make_fresh_accountant).__name__}")
    if not callable(make_event_from_param):
        raise TypeError(f"make_event_from_param: must be callable, got {type(make_event_from_param).__name__}")
    proto = make_fresh_accountant()
    if not isinstance(proto, PldlibAccountant):
        raise TypeError("make_fresh_accountant: must return a PldlibAccountant (a certified pldlib method), got "
                        f"{type(proto).__name__}; dp_accounting's own calibrate_dp_mechanism serves other accountants")
    if not isinstance(proto.ledger, D.NoOpDpEvent) and not (
            isinstance(proto.ledger, D.ComposedDpEvent) and not proto.ledger.events):
        raise ValueError("make_fresh_accountant: returned an accountant that has composed events already")
    target_epsilon = V.nonnegative_finite("target_epsilon", target_epsilon)
    target_delta = V.probability_open("target_delta", target_delta)
    relation = proto.neighboring_relation

    def event_at(p):
        p = int(p) if discrete else float(p)
        ev = _convert(make_event_from_param(p), relation)
        if ev is NON_PRIVATE:
            raise NotPrivateError(f"the event at parameter {p!r} is not private (it has no finite epsilon)")
        return ev

    def meets(p) -> bool:
        acc = make_accountant(proto._method, proto._relation, **proto._method_options)
        try:
            return float(acc.compose(event_at(p), 1).epsilon(target_delta).upper) <= target_epsilon
        except (ArithmeticError, MemoryError, ValueError):  # (NotPrivateError included)
            return False  # (no certificate at p: treated as not meeting the target)

    if bracket_interval is None:
        bracket_interval = MC.LowerEndpointAndGuess(0, 1)
    if isinstance(bracket_interval, MC.ExplicitBracketInterval):
        lo, hi = sorted((float(bracket_interval.endpoint_1), float(bracket_interval.endpoint_2)))
    elif isinstance(bracket_interval, MC.LowerEndpointAndGuess):
        lo, hi = float(bracket_interval.lower_endpoint), float(bracket_interval.initial_guess)
        if not hi > lo:
            raise ValueError(f"bracket_interval: the initial guess {V.fmt(hi)} must exceed the lower endpoint "
                             f"{V.fmt(lo)}")
        at_lo, step = meets(lo), hi - lo
        while meets(hi) == at_lo:
            step *= 2.0
            if step > BRACKET_GROWTH * (hi - lo + 1.0):
                raise MC.NoBracketIntervalFoundError(
                    f"no parameter between {lo:g} and {hi:g} changes whether the certified epsilon meets "
                    f"{target_epsilon:g} at delta {target_delta:g}")
            hi = lo + step
    else:
        raise TypeError(f"bracket_interval: an ExplicitBracketInterval or LowerEndpointAndGuess, got "
                        f"{type(bracket_interval).__name__}")
    if discrete:
        lo, hi = math.ceil(lo), math.floor(hi)
    direction = "larger_is_less_private" if meets(lo) else "larger_is_more_private"
    if tol is None:
        tol = 1e-6
    tol = V.positive_finite("tol", tol)
    rel = min(max(tol / max(abs(hi), abs(lo), 1e-300), 1e-8), 0.1)
    res = calibrate_parameter(event_at, (lo, hi), direction=direction, epsilon=target_epsilon, delta=target_delta,
                              integer=bool(discrete), method=proto._method, relation=proto._relation,
                              method_options=proto._method_options, tol=rel, parameter="param")
    return int(res.value) if discrete else float(res.value)
