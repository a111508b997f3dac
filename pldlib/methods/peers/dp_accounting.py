"""dp_accounting's privacy loss distributions as a pldlib accountant, and the event mapping.

:func:`to_dp_event` maps a pldlib event to dp_accounting's ``DpEvent`` and
:data:`DP_RELATION` a pldlib relation to dp_accounting's ``NeighboringRelation``;
the dp_accounting drop-in (:mod:`pldlib.interop.dp_accounting`) uses the same two.

:class:`DpAccountingPLD` (method ``dp_accounting``, kind ``peer``) composes
dp_accounting's PLDs of the mapped events: the upper end of its answers is
dp_accounting's pessimistic PLD (connect-the-dots by default), the lower end its
optimistic PLD (privacy buckets: dp_accounting has no optimistic connect-the-dots).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from dp_accounting import dp_event as D
from dp_accounting import privacy_accountant as PA

from ... import _validate as V
from ... import events as E
from ..base import Accountant, Interval, as_event

__all__ = ["to_dp_event", "DP_RELATION", "RELATION_OF_DP", "DpAccountingPLD"]

NR = PA.NeighboringRelation

#: pldlib relation -> dp_accounting's (the relations it has a name for)
DP_RELATION = {"add_remove": NR.ADD_OR_REMOVE_ONE, "substitution": NR.REPLACE_ONE}
#: dp_accounting relation -> pldlib's (REPLACE_SPECIAL: a record replaced by a fixed one is
#: an add or a remove of that record's contribution: docs/MATH.md section 14)
RELATION_OF_DP = {NR.ADD_OR_REMOVE_ONE: "add_remove", NR.REPLACE_ONE: "substitution",
                  NR.REPLACE_SPECIAL: "add_remove"}


def to_dp_event(event, dataset_size: int | None = None):
    """The dp_accounting ``DpEvent`` of a pldlib event (or :class:`pldlib.Mechanism`).

    Gaussian -> ``GaussianDpEvent(sigma)`` (sigma is the noise multiplier at any
    sensitivity), Laplace -> ``LaplaceDpEvent(scale / sensitivity)``, discrete Laplace
    -> ``DiscreteLaplaceDpEvent(1 / scale, sensitivity)``, binary randomized response
    -> ``RandomizedResponseDpEvent(2 / (1 + e^eps0), 2)`` (its REPLACE_ONE pair),
    ``Sampled(..., "poisson")`` -> ``PoissonSampledDpEvent``, ``Sampled(..., "wor")``
    -> ``SampledWithoutReplacementDpEvent(n, q n)`` with ``n = dataset_size`` (or the
    smallest n making q n an integer when q is a ratio with denominator <= 10^9),
    ``SelfComposed``, ``Composed``, ``NoOp``.  Events dp_accounting has no class for
    (``ApproxDPEvent``, ``LatticeEvent``, ``ProfileEvent``) raise ``ValueError``.
    """
    ev = as_event(event)
    if isinstance(ev, E.NoOp):
        return D.NoOpDpEvent()
    if isinstance(ev, E.GaussianEvent):
        return D.GaussianDpEvent(ev.sigma)
    if isinstance(ev, E.LaplaceEvent):
        return D.LaplaceDpEvent(ev.scale / ev.sensitivity)
    if isinstance(ev, E.DiscreteLaplaceEvent):
        return D.DiscreteLaplaceDpEvent(1.0 / ev.scale, ev.sensitivity)
    if isinstance(ev, E.RandomizedResponseEvent):
        return D.RandomizedResponseDpEvent(2.0 / (1.0 + math.exp(ev.eps0)), 2)
    if isinstance(ev, E.MixtureOfGaussiansEvent):
        return D.MixtureOfGaussiansDpEvent(ev.sigma, list(ev.sensitivities), list(ev.probabilities))
    if isinstance(ev, E.Sampled):
        if ev.group > 1:
            raise ValueError("event: dp_accounting has no event for user-level accounting (group > 1)")
        inner = to_dp_event(ev.event)
        if ev.q == 1.0:
            return inner
        if ev.sampling == "poisson":
            return D.PoissonSampledDpEvent(ev.q, inner)
        if ev.sampling == "wor":
            if dataset_size is None:
                f = Fraction(ev.q).limit_denominator(10**9)
                if float(f) != ev.q:
                    raise ValueError(f"dataset_size: q = {V.fmt(ev.q)} is not a ratio batch / n with n <= 10^9; "
                                     "pass dataset_size")
                n, m = f.denominator, f.numerator
            else:
                n = V.positive_int("dataset_size", dataset_size)
                m = round(ev.q * n)
                if m / n != ev.q:
                    raise ValueError(f"dataset_size: q = {V.fmt(ev.q)} times {n} is not an integer batch size")
            return D.SampledWithoutReplacementDpEvent(n, m, inner)
        raise ValueError(f"event: dp_accounting has no event for sampling scheme {ev.sampling!r}")
    if isinstance(ev, E.SelfComposed):
        return D.SelfComposedDpEvent(to_dp_event(ev.event, dataset_size), ev.count)
    if isinstance(ev, E.Composed):
        return D.ComposedDpEvent([to_dp_event(e, dataset_size) for e in ev.events])
    raise ValueError(f"event: dp_accounting has no event class for {type(ev).__name__}")


def _bool(name, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name}: must be true or false, got {v!r}")
    return v


class DpAccountingPLD(Accountant):
    """dp_accounting's PLD accountant (``dp_accounting.pld``) as a pldlib method (kind ``peer``).

    ``upper``: its pessimistic PLD (``use_connect_dots``: connect-the-dots, its default;
    false: privacy buckets); ``lower``: its optimistic PLD (privacy buckets; ``optimistic=False``
    skips it: NaN).  ``value_discretization_interval`` is its grid spacing (default 1e-4,
    its own default).  Supported events: see :mod:`pldlib.methods.peers`.
    """

    method = "dp_accounting"
    kind = "peer"

    def __init__(self, relation: str = "add_remove", *, value_discretization_interval: float = 1e-4,
                 use_connect_dots: bool = True, optimistic: bool = True):
        super().__init__(relation)
        h = V.positive_finite("value_discretization_interval", value_discretization_interval)
        if h > 1.0:
            raise ValueError(f"value_discretization_interval: must be in (0, 1] (a privacy-loss grid spacing), "
                             f"got {V.fmt(h)}")
        self.value_discretization_interval = h
        self.use_connect_dots = _bool("use_connect_dots", use_connect_dots)
        self.optimistic = _bool("optimistic", optimistic)

    def _options(self) -> dict:
        return {"value_discretization_interval": self.value_discretization_interval,
                "use_connect_dots": self.use_connect_dots, "optimistic": self.optimistic}

    def _unsupported(self, step) -> str | None:
        ev = step.event
        base = ev.event if isinstance(ev, E.Sampled) else ev
        if isinstance(ev, E.MixtureOfGaussiansEvent):
            return ("dp_accounting has mixtures of Gaussians under add_remove only" if self.relation != "add_remove"
                    else None)
        if not isinstance(base, (E.GaussianEvent, E.LaplaceEvent)):
            return (f"dp_accounting's PLD peer takes Gaussian, Laplace and mixture-of-Gaussians steps only, "
                    f"not {type(base).__name__}")
        if isinstance(ev, E.Sampled):
            if ev.group > 1:
                return "dp_accounting has no user-level (group > 1) accounting"
            if ev.sampling != "poisson" and ev.q < 1.0:
                return ("dp_accounting's PLD accountant has no sampling without replacement or other "
                        f"scheme {ev.sampling!r} (Poisson only)")
        sampled = isinstance(ev, E.Sampled) and ev.q < 1.0
        if self.relation == "substitution" and not isinstance(base, E.GaussianEvent):
            return "dp_accounting's Laplace PLD has no neighbouring-relation option (add-or-remove only)"
        if self.relation in ("add", "remove") and sampled:
            return (f"dp_accounting's public PLD API has no single {self.relation!r} direction for "
                    "subsampled mechanisms (it takes the max of add and remove: relation add_remove)")
        return None

    def _pld(self, dp_ev, pessimistic: bool):
        from dp_accounting.pld import privacy_loss_distribution as dpl

        h = self.value_discretization_interval
        q = 1.0
        if isinstance(dp_ev, D.PoissonSampledDpEvent):
            q, dp_ev = dp_ev.sampling_probability, dp_ev.event
        # dp_accounting has no optimistic connect-the-dots (it warns and falls back): ask for buckets
        ctd = self.use_connect_dots and pessimistic
        rel = DP_RELATION.get(self.relation, NR.ADD_OR_REMOVE_ONE)  # add / remove: unsampled, symmetric
        if isinstance(dp_ev, D.MixtureOfGaussiansDpEvent):
            return dpl.from_mixture_gaussian_mechanism(dp_ev.standard_deviation, dp_ev.sensitivities,
                                                       dp_ev.sampling_probs, pessimistic_estimate=pessimistic,
                                                       value_discretization_interval=h, use_connect_dots=ctd)
        if isinstance(dp_ev, D.GaussianDpEvent):
            return dpl.from_gaussian_mechanism(dp_ev.noise_multiplier, sampling_prob=q,
                                               value_discretization_interval=h, pessimistic_estimate=pessimistic,
                                               use_connect_dots=ctd, neighboring_relation=rel)
        return dpl.from_laplace_mechanism(dp_ev.noise_multiplier, sampling_prob=q, value_discretization_interval=h,
                                          pessimistic_estimate=pessimistic, use_connect_dots=ctd)

    def _composed(self, pessimistic: bool):
        out = None
        for step, k in self._steps:
            p = self._pld(to_dp_event(step.event), pessimistic).self_compose(k)
            out = p if out is None else out.compose(p)
        return out

    def _build(self) -> None:
        self._upper_pld = self._composed(True)
        self._lower_pld = self._composed(False) if self.optimistic else None

    def _query(self, x, reader: str):
        self._ensure_built()
        scalar = np.ndim(x) == 0
        xs = np.atleast_1d(np.asarray(x, dtype=float))
        up = np.array([getattr(self._upper_pld, reader)(float(v)) for v in xs], dtype=float)
        lo = (np.array([getattr(self._lower_pld, reader)(float(v)) for v in xs], dtype=float)
              if self._lower_pld is not None else np.full(xs.shape, np.nan))
        if scalar:
            return Interval(float(lo[0]), float(up[0]), kind="peer")
        return Interval(lo, up, kind="peer")

    def epsilon(self, delta):
        """dp_accounting's eps(delta): (optimistic, pessimistic) as it computes them."""
        V.delta_array("delta", delta)
        return self._query(delta, "get_epsilon_for_delta")

    def delta(self, epsilon):
        """dp_accounting's delta(eps): (optimistic, pessimistic) as it computes them."""
        return self._query(epsilon, "get_delta_for_epsilon")
