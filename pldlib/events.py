"""Privacy events as pure data (docs/MATH.md section 9).

An event says *what* was released, never *how* to account for it: it holds
parameters and no maths.  The maths of a base mechanism lives in
:mod:`pldlib.profiles` (registered per event type in
:mod:`pldlib.profiles.pairs`), the maths of a sampling scheme in
:mod:`pldlib.sampling`, and each accounting method (:mod:`pldlib.methods`)
decides which events it supports.  The neighbouring relation is not part of
an event: it is stated once, on the accountant.

Base mechanisms (one release):

* :class:`GaussianEvent` -- additive Gaussian noise, noise multiplier ``sigma``
* :class:`LaplaceEvent` -- additive Laplace noise of scale ``scale``
* :class:`RandomizedResponseEvent` -- binary randomized response with ``eps0``
* :class:`ApproxDPEvent` -- any (eps0, delta0)-DP mechanism
* :class:`LatticeEvent` -- a symmetric integer noise given by its pmf (tiny, exact)
* :class:`DiscreteLaplaceEvent` -- two-sided geometric noise on the integers
* :class:`ProfileEvent` -- a user-supplied dominating pair (a :class:`~pldlib.profiles.PrivacyProfile`)

Wrappers:

* :class:`Sampled` -- ``event`` run on a random subset, ``q`` the sampling rate and
  ``sampling`` a name from the sampling registry (``poisson``, ``wor``, ...)
* :class:`SelfComposed` -- ``event`` repeated ``count`` times
* :class:`Composed` -- a sequence of events
* :class:`NoOp` -- releases nothing (composes to the identity)

:func:`flatten` turns any event tree into ``[(step_event, count), ...]``, the
single-step events (a base mechanism, possibly sampled) and their counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from . import _validate as V

__all__ = [
    "Event", "GaussianEvent", "LaplaceEvent", "RandomizedResponseEvent", "ApproxDPEvent",
    "LatticeEvent", "DiscreteLaplaceEvent", "ProfileEvent", "MixtureOfGaussiansEvent", "ZCDPEvent",
    "RepeatAndSelectEvent", "TruncatedPoissonGaussianEvent", "WithReplacementGaussianEvent", "Sampled",
    "SelfComposed",
    "Composed", "NoOp",
    "flatten", "is_step",
]


@dataclass(frozen=True)
class Event:
    """Base of every privacy event (pure data)."""

    def __repr__(self) -> str:  # numbers printed as numbers (not np.float64(...))
        args = ", ".join(f"{f.name}={_fmt(getattr(self, f.name))}" for f in fields(self))
        return f"{type(self).__name__}({args})"


def _fmt(v):
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return repr(int(v))
    return repr(v)


@dataclass(frozen=True, repr=False)
class BaseEvent(Event):
    """A single release of a base mechanism (no sampling)."""


@dataclass(frozen=True, repr=False)
class GaussianEvent(BaseEvent):
    """Gaussian noise of standard deviation ``sigma * sensitivity`` added to a query of
    sensitivity ``sensitivity`` (``sigma`` is the noise multiplier)."""

    sigma: float
    sensitivity: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "sigma", V.positive_finite("sigma", self.sigma))
        object.__setattr__(self, "sensitivity", V.positive_finite("sensitivity", self.sensitivity))


@dataclass(frozen=True, repr=False)
class MixtureOfGaussiansEvent(BaseEvent):
    """Gaussian noise of standard deviation ``sigma`` added to a query whose difference between
    neighbours is a random shift: ``sensitivities[i]`` with probability ``probabilities[i]``
    (the same units as ``sigma``).  Remove: N(0, sigma^2) against sum_i p_i N(c_i, sigma^2);
    add: the reverse (docs/MATH.md section 13.6; dp_accounting's ``MixtureOfGaussiansDpEvent``,
    the conditional-composition analysis of matrix mechanisms).

    Sensitivities are >= 0 (norms), probabilities >= 0 summing to 1 (within 1e-9).
    ``{0: 1 - q, c: q}`` is the Poisson-subsampled Gaussian with noise multiplier sigma / c,
    and composes as exactly that event (:meth:`canonical`)."""

    sigma: float
    sensitivities: tuple
    probabilities: tuple

    def __post_init__(self):
        object.__setattr__(self, "sigma", V.positive_finite("sigma", self.sigma))
        c = _real_tuple("sensitivities", self.sensitivities)
        p = _real_tuple("probabilities", self.probabilities)
        if len(c) != len(p) or not c:
            raise ValueError(f"sensitivities and probabilities: one probability per sensitivity, got "
                             f"{len(c)} and {len(p)}")
        if any(not math.isfinite(x) or x < 0 for x in c):
            raise ValueError(f"sensitivities must be finite and >= 0, got {V.fmt(min(c))}")
        if any(not math.isfinite(x) or x < 0 for x in p) or abs(math.fsum(p) - 1.0) > 1e-9:
            raise ValueError(f"probabilities must be >= 0 and sum to 1, got sum {V.fmt(math.fsum(p))}")
        object.__setattr__(self, "sensitivities", c)
        object.__setattr__(self, "probabilities", p)

    def canonical(self) -> "Event":
        """The simplest equal event: ``NoOp`` (every shift 0), ``GaussianEvent(sigma / c)`` (one
        shift c > 0 with probability 1), ``Sampled(GaussianEvent(sigma / c), q, "poisson")``
        (shifts 0 and c > 0); else the mixture itself (equal shifts merged, zero weights dropped)."""
        merged: dict = {}
        for ci, pi in zip(self.sensitivities, self.probabilities):
            if pi > 0:
                merged[ci] = merged.get(ci, 0.0) + pi
        pos = {ci: pi for ci, pi in merged.items() if ci > 0}
        if not pos:
            return NoOp()
        if len(pos) == 1:
            (c, q), = pos.items()
            q = 1.0 if 0.0 not in merged else q
            g = GaussianEvent(self.sigma / c)
            return g if q >= 1.0 else Sampled(g, q, "poisson")
        return self


def _real_tuple(name: str, values) -> tuple:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a list of numbers, got {V.fmt(values)}")
    try:
        vals = tuple(values)
    except TypeError:
        raise TypeError(f"{name} must be a list of numbers, got {V.fmt(values)}") from None
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__") for v in vals):
        raise TypeError(f"{name} must be a list of numbers, got {V.fmt(values)}")
    return tuple(float(v) for v in vals)


@dataclass(frozen=True, repr=False)
class LaplaceEvent(BaseEvent):
    """Laplace noise of scale ``scale`` (b) added to a query of L1 sensitivity ``sensitivity``."""

    scale: float
    sensitivity: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "scale", V.positive_finite("scale", self.scale))
        object.__setattr__(self, "sensitivity", V.positive_finite("sensitivity", self.sensitivity))


@dataclass(frozen=True, repr=False)
class RandomizedResponseEvent(BaseEvent):
    """Binary randomized response: the true bit with probability e^eps0 / (1 + e^eps0)."""

    eps0: float

    def __post_init__(self):
        object.__setattr__(self, "eps0", V.positive_finite("eps0", self.eps0))


@dataclass(frozen=True, repr=False)
class ApproxDPEvent(BaseEvent):
    """Any (eps0, delta0)-DP mechanism (accounted through its worst-case pair)."""

    eps0: float
    delta0: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "eps0", V.nonnegative_finite("eps0", self.eps0))
        object.__setattr__(self, "delta0", V.probability_closed_open("delta0", self.delta0))


@dataclass(frozen=True, repr=False)
class ZCDPEvent(BaseEvent):
    """A mechanism known only by a zero-concentrated DP guarantee: Renyi divergences
    D_alpha <= xi + rho alpha for every alpha > 1 (Bun and Steinke 2016).  It has no single
    privacy-loss distribution, so only Renyi accounting takes it (``method="rdp"``: an upper bound
    through the RDP-to-(eps, delta) conversion, docs/MATH.md 8.1)."""

    rho: float
    xi: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "rho", V.nonnegative_finite("rho", self.rho))
        object.__setattr__(self, "xi", V.nonnegative_finite("xi", self.xi))


@dataclass(frozen=True, repr=False)
class TruncatedPoissonGaussianEvent(BaseEvent):
    """One DP-SGD step with a capped batch: each of ``dataset_size`` records is sampled with
    probability ``q``, a batch larger than ``batch_size`` is cut to a uniformly random subset of
    ``batch_size`` records, and Gaussian noise of multiplier ``sigma`` is added to the sum
    (dp_accounting's TruncatedSubsampledGaussianDpEvent).  ``dataset_size`` counts the records of
    the data set that holds the protected record (its neighbour has one fewer), as dp_accounting
    counts them.  Dominating pair: docs/MATH.md 2.6."""

    sigma: float
    q: float
    dataset_size: int
    batch_size: int

    def __post_init__(self):
        object.__setattr__(self, "sigma", V.positive_finite("sigma", self.sigma))
        object.__setattr__(self, "q", V.sampling_rate("q", self.q))
        object.__setattr__(self, "dataset_size", V.int_at_least("dataset_size", self.dataset_size, 1))
        object.__setattr__(self, "batch_size", V.int_at_least("batch_size", self.batch_size, 1))

    @property
    def truncation_probability(self) -> float:
        """t = P(Bin(dataset_size - 1, q) >= batch_size): the other records alone fill the batch."""
        from scipy import stats

        return float(stats.binom.sf(self.batch_size - 1, self.dataset_size - 1, self.q))

    @property
    def truncated_rate(self) -> float:
        """q B / (B + 1): the largest chance that the record is in a cut batch (given M >= B others)."""
        return self.q * self.batch_size / (self.batch_size + 1)


@dataclass(frozen=True, repr=False)
class WithReplacementGaussianEvent(BaseEvent):
    """One DP-SGD step whose batch is ``batch_size`` = B draws *with replacement* from
    ``dataset_size`` = n records (a record may be drawn several times; dp_accounting's
    SampledWithReplacementDpEvent around a GaussianDpEvent), Gaussian noise of multiplier ``sigma``
    added to the sum.  ``dataset_size`` counts the records of the data set that holds the protected
    record (its neighbour under add/remove has one fewer).  The number of draws of the protected
    record is K ~ Bin(B, 1/n), each moving the sum by at most 2 clipping norms.  Dominating pairs
    (exact for add and remove): docs/MATH.md 2.7."""

    sigma: float
    dataset_size: int
    batch_size: int

    def __post_init__(self):
        object.__setattr__(self, "sigma", V.positive_finite("sigma", self.sigma))
        object.__setattr__(self, "dataset_size", V.int_at_least("dataset_size", self.dataset_size, 2))
        object.__setattr__(self, "batch_size", V.int_at_least("batch_size", self.batch_size, 1))

    @property
    def q(self) -> float:
        """B / n: the expected fraction of the data set drawn per step."""
        return self.batch_size / self.dataset_size

    @property
    def hit_probability(self) -> float:
        """eta = P(K >= 1) = 1 - (1 - 1/n)^B: the protected record is drawn at least once."""
        return -math.expm1(self.batch_size * math.log1p(-1.0 / self.dataset_size))

    def draw_weights(self) -> np.ndarray:
        """The law of K ~ Bin(B, 1/n) on 0..k_max (k_max: the last k whose weight is not 0 in
        floating point; the mass beyond it is below 1e-300)."""
        from scipy import stats

        B, p = self.batch_size, 1.0 / self.dataset_size
        mean = B * p
        # (far beyond the mean + 40 sd the weights are < 1e-300: stop the table there)
        k_max = int(min(B, math.ceil(mean + 40.0 * math.sqrt(mean * (1.0 - p)) + 700.0)))
        w = stats.binom.pmf(np.arange(k_max + 1), B, p)
        last = int(np.nonzero(w > 0.0)[0][-1])
        return w[: last + 1]


@dataclass(frozen=True, repr=False)
class RepeatAndSelectEvent(BaseEvent):
    """``event`` run a random number K of times, only the best run's output released (private
    hyperparameter selection; Papernot and Steinke 2022).  K is Poisson (``shape=inf``) or truncated
    negative binomial with shape ``shape`` >= 0 (0: logarithmic, 1: geometric), of mean ``mean`` >= 1.
    Accounted by Renyi DP only (``method="rdp"``: an upper bound, docs/MATH.md 8.1)."""

    event: Event
    mean: float
    shape: float = math.inf

    def __post_init__(self):
        if not isinstance(self.event, Event):
            raise TypeError(f"event: a pldlib event, got {type(self.event).__name__}")
        mean = V.finite("mean", self.mean)
        if mean < 1:
            raise ValueError(f"mean: the mean number of runs must be >= 1, got {V.fmt(mean)}")
        shape = float(self.shape) if isinstance(self.shape, (int, float)) and not isinstance(self.shape, bool) \
            else self.shape
        if not isinstance(shape, float) or math.isnan(shape) or shape < 0:
            raise ValueError(f"shape: must be >= 0 (inf: Poisson), got {V.fmt(self.shape)}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "shape", shape)


@dataclass(frozen=True, repr=False)
class LatticeEvent(BaseEvent):
    """Symmetric integer noise with pmf ``pmf`` (offsets 0..m-1) and sensitivity ``shift``."""

    pmf: tuple
    shift: int = 1

    def __post_init__(self):
        # (finite, >= 0, sums to 1, symmetric: docs/MATH.md section 2 assumes B_{-D} mirrors B_D)
        object.__setattr__(self, "pmf", V.lattice_pmf("pmf", self.pmf))
        object.__setattr__(self, "shift", V.whole_number("shift", self.shift))


@dataclass(frozen=True, repr=False)
class DiscreteLaplaceEvent(BaseEvent):
    """Discrete Laplace noise (pmf proportional to ``e^(-|x|/scale)`` on the integers) added to
    an integer query of sensitivity ``sensitivity``."""

    scale: float
    sensitivity: int = 1

    def __post_init__(self):
        object.__setattr__(self, "scale", V.positive_finite("scale", self.scale))
        object.__setattr__(self, "sensitivity", V.positive_int("sensitivity", self.sensitivity))


@dataclass(frozen=True, repr=False, eq=False)
class ProfileEvent(BaseEvent):
    """A user-supplied dominating pair, composed as given (for every relation).

    With ``add_profile`` the pair differs by direction: ``profile`` is the remove
    direction and ``add_profile`` the add direction (add_remove keeps both and
    maximises after composition; substitution is then undefined).
    """

    profile: object
    add_profile: object = None

    def __post_init__(self):
        # a privacy profile (pldlib.profiles.PrivacyProfile) by what it offers: events sit below
        # the profiles and do not import them
        if not _is_profile(self.profile):
            raise TypeError(f"profile must be a PrivacyProfile, got {type(self.profile).__name__}")
        if self.add_profile is not None and not _is_profile(self.add_profile):
            raise TypeError(f"add_profile must be a PrivacyProfile or None, got {type(self.add_profile).__name__}")


@dataclass(frozen=True, repr=False)
class Sampled(Event):
    """``event`` applied to a random subset: each record's inclusion follows the sampling
    scheme ``sampling`` at rate ``q`` (``q = 1``: every record is used, i.e. no sampling).

    ``sampling`` names a scheme of :mod:`pldlib.sampling` (``poisson``, ``wor``,
    ``random_allocation``, ``shuffle``); an unknown name is refused when the event is
    composed.  ``group`` > 1 is user-level accounting: the protected unit is a user with up
    to ``group`` records, each sampled by ``sampling`` (docs/MATH.md section 13.1; Gaussian
    noise, schemes ``poisson`` and ``wor``, relations add / remove / add_remove).

    ``selections`` = k > 1 (``random_allocation`` only) puts every record in k of the
    t = k / q steps of each epoch, chosen uniformly (k of t random allocation,
    docs/MATH.md 13.8); q stays the per-step rate, the same expected batch size as
    Poisson sampling at rate q."""

    event: BaseEvent
    q: float
    sampling: str = "poisson"
    group: int = 1
    selections: int = 1

    def __post_init__(self):
        if not isinstance(self.event, BaseEvent):
            raise TypeError(f"event: Sampled wraps a base mechanism event, got {self.event!r}")
        object.__setattr__(self, "q", V.sampling_rate("q", self.q))
        if not isinstance(self.sampling, str) or not self.sampling.isidentifier():
            raise ValueError(f"sampling: a sampling scheme's name (e.g. 'poisson'), got {V.fmt(self.sampling)}")
        object.__setattr__(self, "group", V.positive_int("group", self.group))
        if self.group > 1 and self.q == 1.0:
            raise ValueError("group: a Sampled event at q = 1 is not sampled; a group of g records without "
                             "sampling is the base event with sensitivity g times larger")
        object.__setattr__(self, "selections", V.positive_int("selections", self.selections))
        if self.selections > 1:
            if self.sampling != "random_allocation":
                raise ValueError(f"selections: k > 1 selections per epoch (k of t random allocation) need "
                                 f"sampling='random_allocation', got sampling={self.sampling!r}")
            if self.q == 1.0:
                raise ValueError("selections: at q = 1 every record is in every step; k of t random allocation "
                                 "needs q = k / t < 1")
            if self.group > 1:
                raise ValueError("selections: k of t random allocation has no user-level accounting (group > 1)")

    def __repr__(self) -> str:
        args = f"event={self.event!r}, q={_fmt(self.q)}, sampling={self.sampling!r}"
        extra = (f', group={self.group}' if self.group != 1 else '') + \
            (f', selections={self.selections}' if self.selections != 1 else '')
        return f"Sampled({args}{extra})"

    @property
    def scheme(self) -> str:
        """The older name of :attr:`sampling` (read-only)."""
        return self.sampling


@dataclass(frozen=True, repr=False)
class SelfComposed(Event):
    """``event`` composed with itself ``count`` times."""

    event: Event
    count: int

    def __post_init__(self):
        if not isinstance(self.event, Event):
            raise TypeError(f"event must be an Event, got {self.event!r}")
        object.__setattr__(self, "count", V.steps("count", self.count))


@dataclass(frozen=True, repr=False)
class Composed(Event):
    """The events of ``events``, one after the other."""

    events: tuple

    def __post_init__(self):
        evs = tuple(self.events)
        for i, e in enumerate(evs):
            if not isinstance(e, Event):
                raise TypeError(f"events[{i}] must be an Event, got {e!r}")
        object.__setattr__(self, "events", evs)


@dataclass(frozen=True, repr=False)
class NoOp(Event):
    """Releases nothing."""


def is_step(event) -> bool:
    """True for a single-step event: a base mechanism, or a sampled one."""
    return isinstance(event, (BaseEvent, Sampled))


def flatten(event: Event, count: int = 1) -> list[tuple[Event, int]]:
    """``[(step_event, count), ...]``: the single-step events of ``event`` and how often
    each runs, equal steps merged (composition is commutative), first occurrence order.
    ``Sampled(e, 1.0, ...)`` is the same step as ``e``."""
    out: dict = {}

    def walk(e, k):
        if isinstance(e, NoOp):
            return
        if isinstance(e, Sampled) and e.q == 1.0:
            e = e.event
        if isinstance(e, MixtureOfGaussiansEvent):
            e = e.canonical()
            if isinstance(e, NoOp):
                return
        if is_step(e):
            key = e if _hashable(e) else ("id", id(e))
            if key in out:
                out[key] = (e, out[key][1] + k)
            else:
                out[key] = (e, k)
        elif isinstance(e, SelfComposed):
            walk(e.event, k * e.count)
        elif isinstance(e, Composed):
            for sub in e.events:
                walk(sub, k)
        else:
            raise TypeError(f"not a privacy event: {e!r}")

    walk(event, V.steps("count", count))
    return list(out.values())


def _hashable(e) -> bool:
    try:
        hash(e)
    except TypeError:
        return False
    return True


def _is_profile(obj) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("sf_p", "sf_q", "delta"))
