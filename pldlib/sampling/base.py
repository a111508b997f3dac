"""The sampling registry and what every scheme shares (docs/MATH.md section 2).

A sampling scheme turns the noise of a base mechanism (its *shift family*,
:func:`pldlib.profiles.pairs.family_of`) into the dominating pairs of one
sampled step, per neighbouring relation.  The answer of a composition is the
maximum over the returned branches *after* composition (add and remove curves
can cross after composition, seed 002 sections 5 and 7).

:func:`register` adds a scheme (one module per scheme: :mod:`.poisson`,
:mod:`.wor`); :func:`scheme_names` is the one list of names that the events,
mechanisms, CLI, configs, calibration and tables read; :func:`dominating_pairs`
is what every accounting method calls for a single step.
"""
from __future__ import annotations

import numpy as np

from .. import _validate as V
from .. import events as E
from ..profiles.pairs import Branch, UnsupportedEventError, family_of, unsampled_branches

__all__ = ["SamplingScheme", "register", "get_scheme", "scheme_names", "sampling_names", "dominating_pairs",
           "directions", "scheme_kw", "user_level_branches", "check_steps", "NO_SAMPLING"]

#: the sampling name of an unsampled step (every record is used)
NO_SAMPLING = "none"


class SamplingScheme:
    """Base class of a sampling scheme: ``name``, the ``relations`` it supports and
    ``branches(event, q, relation)`` (the dominating pairs of one sampled step, 0 < q < 1)."""

    name: str = ""
    relations: tuple = V.RELATIONS
    summary: str = ""
    #: whether a step may put a record in k > 1 of an epoch's steps (``Sampled.selections``); such
    #: a scheme's methods take a ``selections`` keyword (passed only when it is not 1)
    takes_selections: bool = False

    def branches(self, event, q: float, relation: str) -> list[Branch]:
        raise NotImplementedError

    def group_branches(self, event, q: float, relation: str, group: int) -> list[Branch]:
        """User-level branches: a user with up to ``group`` records (docs/MATH.md 13.1).
        A scheme without user-level accounting refuses (the default)."""
        raise UnsupportedEventError(f"sampling {self.name!r} has no user-level accounting (group > 1); "
                                    "user-level accounting is implemented for 'poisson' and 'wor'")

    def steps_multiple(self, q: float) -> int:
        """The step count of a step sampled at rate q must be a multiple of this (1: any
        count; a scheme whose per-step pairs are only valid over whole epochs returns t)."""
        return 1

    def epoch_branches(self, event, q: float, relation: str) -> list[Branch] | None:
        """Dominating pairs of one whole *epoch* (``steps_multiple(q)`` steps), for a scheme whose
        bound is a per-epoch pair rather than a per-step one; None (the default): use
        :meth:`branches` per step.  Accountants that read it compose ``steps / t`` epochs
        (:func:`pldlib.methods.schedule.epoch_components`); the others use the per-step branches."""
        return None

    def epoch_pieces(self, event, q: float, relation: str, **kw) -> list[tuple[list[Branch], int]] | None:
        """One epoch as a composition of per-epoch pairs: [(branches, count)], each ``branches`` a list
        like :meth:`epoch_branches` composed ``count`` times per epoch (the upper and lower sides of
        all pieces together bound one epoch); None: use :meth:`branches` per step.  The default is
        :meth:`epoch_branches` once."""
        br = self.epoch_branches(event, q, relation, **kw)
        return None if br is None else [(br, 1)]

    def exact_epoch_pieces(self, event, q: float, relation: str, **kw) -> list[tuple[list[Branch], int]] | None:
        """:meth:`epoch_pieces` where they are the epoch's pair *exactly* (upper and lower sides the
        same analytic pairs), else None (the default).  Accountants that take only analytic
        profiles (the PRV accountant) compose these instead of the per-step branches."""
        return None

    def __repr__(self) -> str:
        return f"<sampling scheme {self.name!r}: {self.summary}>"


def scheme_kw(step) -> dict:
    """The extra keywords a :class:`~pldlib.events.Sampled` step passes to its scheme's methods
    (``selections`` when it is not 1)."""
    k = getattr(step, "selections", 1)
    return {"selections": k} if k != 1 else {}


_SCHEMES: dict[str, SamplingScheme] = {}


def register(scheme: SamplingScheme) -> SamplingScheme:
    """Add ``scheme`` to the registry under ``scheme.name``."""
    if not scheme.name or scheme.name == NO_SAMPLING:
        raise ValueError(f"a sampling scheme needs a name other than {NO_SAMPLING!r}")
    _SCHEMES[scheme.name] = scheme
    return scheme


def scheme_names() -> tuple[str, ...]:
    """Names of the registered sampling schemes (``poisson``, ``wor``, ...)."""
    return tuple(_SCHEMES)


def sampling_names() -> tuple[str, ...]:
    """``"none"`` and the registered schemes: the choices of a ``sampling`` argument."""
    return (NO_SAMPLING,) + scheme_names()


def get_scheme(name: str) -> SamplingScheme:
    V.choice("sampling", name, scheme_names())
    return _SCHEMES[name]


def dominating_pairs(step, relation: str) -> list[Branch]:
    """The branches of one step (a base event, or a :class:`~pldlib.events.Sampled` one)."""
    V.choice("relation", relation, V.RELATIONS)
    if isinstance(step, E.Sampled):
        if step.q < 1.0:
            scheme = get_scheme(step.sampling)
            if relation not in scheme.relations:
                raise UnsupportedEventError(f"sampling {scheme.name!r} does not support the relation {relation!r} "
                                            f"(it supports {', '.join(scheme.relations)})")
            if step.group > 1:
                return scheme.group_branches(step.event, step.q, relation, step.group)
            kw = scheme_kw(step)
            if kw and not scheme.takes_selections:
                raise UnsupportedEventError(f"sampling {scheme.name!r} has no k of t selections "
                                            f"(selections={step.selections}); 'random_allocation' has")
            return scheme.branches(step.event, step.q, relation, **kw)
        step = step.event
    if not isinstance(step, E.BaseEvent):
        raise TypeError(f"not a single-step event: {step!r}")
    return unsampled_branches(step, relation)


def check_steps(step, count: int) -> None:
    """ValueError naming ``steps`` if ``count`` runs of ``step`` are not a whole number
    of the scheme's epochs (:meth:`SamplingScheme.steps_multiple`)."""
    if isinstance(step, E.Sampled) and step.q < 1.0:
        t = get_scheme(step.sampling).steps_multiple(step.q, **scheme_kw(step))
        if count % t:
            raise ValueError(f"steps: sampling {step.sampling!r} is accounted per epoch of t={t} steps; "
                             f"steps must be a multiple of t, got {count}")


def directions(family, q: float, relation: str) -> list[Branch]:
    """The add / remove branches of a family's mixtures at rate q (relation add, remove or
    add_remove; both directions are kept for add_remove and maximised after composition)."""
    if relation == "remove":
        rem = family.remove_pair(q)
        return [Branch("remove", rem, rem)]
    if relation == "add":
        add = family.add_pair(q)
        return [Branch("add", add, add)]
    if relation == "add_remove":
        add, rem = family.add_pair(q), family.remove_pair(q)
        return [Branch("add", add, add), Branch("remove", rem, rem)]
    raise ValueError(f"relation: directions() handles add, remove and add_remove, got {relation!r}")


class SizedScheme(SamplingScheme):
    """A scheme whose steps depend on the batch size and the dataset size as well as on q, which a
    :class:`~pldlib.events.Sampled` event does not carry: its steps are an event of their own
    (``event_call``), built by a mechanism, and ``Sampled(event, q, name)`` is refused saying so."""

    #: how to write the scheme's own event, for the message
    event_call: str = ""

    def branches(self, event, q, relation):
        raise UnsupportedEventError(
            f"sampling {self.name!r} needs the batch size and the dataset size, which Sampled(event, q, "
            f"{self.name!r}) does not carry: use Gaussian(sigma, q=q, sampling={self.name!r}, batch_size=B, "
            "dataset_size=n) (the CLI's --batch-size and --dataset-size, a sweep config's batch_size: and "
            f"dataset_size:) or the event {self.event_call}")


def user_level_branches(event, weights, factor: float, relation: str, name: str) -> list[Branch]:
    """Branches of one user-level step (docs/MATH.md 13.1): the remove pair
    P = sum_k weights[k] N(k factor D, s^2), Q = N(0, s^2) and its reverse (add), from a
    Gaussian event; ``weights`` is the law of (a stochastic upper bound on) the number of the
    user's records in the batch, ``factor`` the shift per record (1 Poisson, 2 WOR)."""
    if not isinstance(event, E.GaussianEvent):
        raise UnsupportedEventError(f"user-level accounting (group > 1) is implemented for Gaussian noise only, "
                                    f"got {type(event).__name__}")
    if relation == "substitution":
        raise UnsupportedEventError(
            f"user-level accounting (group > 1) with {name!r} sampling supports add, remove and add_remove; "
            "no dominating pair is proven here for replacing a whole user (substitution)")
    rem = family_of(event, factor).shifts_remove_pair(weights)
    if relation == "remove":
        return [Branch("remove", rem, rem)]
    add = rem.reversed()
    if relation == "add":
        return [Branch("add", add, add)]
    return [Branch("add", add, add), Branch("remove", rem, rem)]


def binomial_weights(g: int, q: float):
    """Bin(g, q) pmf on 0..g (the number of a user's g records in a Poisson batch)."""
    import math

    k = np.arange(g + 1)
    logc = np.array([math.lgamma(g + 1) - math.lgamma(j + 1) - math.lgamma(g - j + 1) for j in k])
    return np.exp(logc + k * math.log(q) + (g - k) * math.log1p(-q))
