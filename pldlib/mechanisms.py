"""User-facing mechanism specifications: sugar that builds events.

``Gaussian(sigma, q=0.01, sampling="poisson", relation="add_remove")`` is one
step of a mechanism together with its sampling and neighbouring relation.
Its :attr:`~Mechanism.event` is the pure-data event
(:mod:`pldlib.events`; ``Sampled(GaussianEvent(sigma), q, "poisson")``) and its
:attr:`~Mechanism.relation` the relation the accountant is built with, so

    account(Gaussian(sigma, q=q, sampling="poisson"), steps=k)
    == PLDAccountant("add_remove").compose(Sampled(GaussianEvent(sigma), q, "poisson"), k)

:meth:`Mechanism.branches` gives the dominating pairs to compose (docs/MATH.md
section 2), one per direction whose answers are maximised after composition.

``Gaussian(sigma, q=q, sampling="truncated_poisson", batch_size=B, dataset_size=n)`` is a
capped Poisson batch (a batch larger than B cut to a uniform subset of B); its event is
``TruncatedPoissonGaussianEvent(sigma, q, n, B)`` (docs/MATH.md 2.6), so that

    account(Gaussian(sigma, q=q, sampling="truncated_poisson", batch_size=B, dataset_size=n), steps=k)
    == PLDAccountant("add_remove").compose(TruncatedPoissonGaussianEvent(sigma, q, n, B), k)

``Gaussian(sigma, sampling="with_replacement", batch_size=B, dataset_size=n)`` is a batch of B
independent uniform draws from the n records (docs/MATH.md 2.7); its event is
``WithReplacementGaussianEvent(sigma, n, B)`` and its rate q is B/n (a ``q`` given must equal it).

``batch_size`` and ``dataset_size`` are required for those two schemes and refused for every
other; Gaussian noise only, no ``group``; relations add, remove and add_remove (and, with
replacement, substitution).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from . import _validate as V
from . import events as E
from .profiles.pairs import Branch, maths_of
from .profiles.base import PrivacyProfile

__all__ = ["Mechanism", "Gaussian", "Laplace", "DiscreteLaplace", "LatticeNoise", "RandomizedResponse", "ApproxDP", "Custom",
           "Branch", "MechanismSpec", "register_mechanism", "mechanism_spec", "mechanism_names"]


#: the sampling scheme of a capped Poisson batch (:mod:`pldlib.sampling.truncated_poisson`): its
#: steps need ``batch_size`` and ``dataset_size``, so a mechanism builds them
#: (:class:`pldlib.events.TruncatedPoissonGaussianEvent`), never ``Sampled(..., "truncated_poisson")``
TRUNCATED_POISSON = "truncated_poisson"
#: the sampling scheme of a batch drawn with replacement (:mod:`pldlib.sampling.with_replacement`):
#: its steps are :class:`pldlib.events.WithReplacementGaussianEvent`, built here from the two sizes
WITH_REPLACEMENT = "with_replacement"
#: the schemes whose steps need ``batch_size`` and ``dataset_size``
SIZED = (TRUNCATED_POISSON, WITH_REPLACEMENT)


@dataclass(frozen=True)
class Mechanism:
    """Base class: a single-step mechanism with sampling and neighbouring relation."""

    q: float = field(default=1.0, kw_only=True)
    sampling: str = field(default="none", kw_only=True)
    relation: str = field(default="add_remove", kw_only=True)
    #: user-level accounting: the protected unit is a user with up to ``group`` records
    #: (docs/MATH.md 13.1; Gaussian noise; ``poisson`` or ``wor`` sampling, or none)
    group: int = field(default=1, kw_only=True)
    #: ``sampling="truncated_poisson"`` only: the cap B on the batch size (a Poisson batch larger
    #: than B is cut to a uniformly random subset of B records) and the number n of records
    #: (docs/MATH.md 2.6; :class:`pldlib.events.TruncatedPoissonGaussianEvent`)
    batch_size: int | None = field(default=None, kw_only=True)
    dataset_size: int | None = field(default=None, kw_only=True)
    #: ``sampling="random_allocation"`` only: every record in ``selections`` = k of the t = k/q steps
    #: of each epoch (k of t random allocation, docs/MATH.md 13.8)
    selections: int = field(default=1, kw_only=True)

    def __post_init__(self):
        from .sampling import sampling_names

        V.sampling_rate("q", self.q)
        V.choice("sampling", self.sampling, sampling_names())
        V.choice("relation", self.relation, V.RELATIONS)
        V.positive_int("group", self.group)
        V.positive_int("selections", self.selections)
        if self.selections > 1 and self.sampling != "random_allocation":
            raise ValueError(f"selections: k > 1 selections per epoch need sampling='random_allocation' "
                             f"(k of t random allocation), got sampling={self.sampling!r}")
        if self.sampling == TRUNCATED_POISSON:
            object.__setattr__(self, "_event", self._truncated_event())
            return
        if self.sampling == WITH_REPLACEMENT:
            object.__setattr__(self, "_event", self._with_replacement_event())
            return
        for name in ("batch_size", "dataset_size"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name}: only for sampling='{TRUNCATED_POISSON}' (a capped Poisson batch) or "
                                 f"'{WITH_REPLACEMENT}', not for sampling={self.sampling!r}")
        if self.sampling == "none" and self.q != 1.0:
            raise ValueError(f"q must be 1 when sampling is 'none' (got q={float(self.q)!r}); "
                             "choose a sampling scheme (e.g. sampling='poisson' or 'wor') for q < 1")
        base = self.base_event()
        if self.sampling != "none" and maths_of(base).family is None:
            raise ValueError(f"sampling: {type(self).__name__} is supported without subsampling only")
        unsampled = self.q == 1.0 or self.sampling == "none"
        if self.group > 1 and not isinstance(base, E.GaussianEvent):
            raise ValueError(f"group: user-level accounting (group > 1) is implemented for Gaussian noise only, "
                             f"not {type(self).__name__}")
        if unsampled and self.group > 1:
            # g records, every one used: the Gaussian with sensitivity g times larger (exact)
            base = E.GaussianEvent(base.sigma / self.group, base.sensitivity * self.group)
        object.__setattr__(self, "_event", base if unsampled else
                           E.Sampled(base, self.q, self.sampling, self.group, self.selections))

    def _sized_gaussian(self, batch_what: str, min_records: int) -> E.GaussianEvent:
        """The Gaussian base event of a scheme that needs ``batch_size`` (>= 1) and ``dataset_size``
        (>= ``min_records``); ValueError naming what is missing or not supported."""
        for name, what, low in (("batch_size", batch_what, 1), ("dataset_size", "the number n of records",
                                                                   min_records)):
            if getattr(self, name) is None:
                raise ValueError(f"{name}: required with sampling='{self.sampling}' ({what}); e.g. "
                                 f"Gaussian(sigma, q=q, sampling='{self.sampling}', batch_size=B, dataset_size=n)")
            object.__setattr__(self, name, V.int_at_least(name, getattr(self, name), low))
        base = self.base_event()
        if not isinstance(base, E.GaussianEvent):
            raise ValueError(f"sampling: '{self.sampling}' is implemented for Gaussian noise only, "
                             f"not {type(self).__name__}")
        if self.group > 1:
            raise ValueError(f"group: user-level accounting (group > 1) is not implemented for "
                             f"sampling='{self.sampling}' (use 'poisson' or 'wor')")
        return base

    def _truncated_event(self) -> E.TruncatedPoissonGaussianEvent:
        """The step of ``sampling="truncated_poisson"``: Poisson sampling at rate q, a batch larger
        than ``batch_size`` cut to a uniform subset of that size, Gaussian noise (docs/MATH.md 2.6)."""
        base = self._sized_gaussian("the cap B on the batch size", 1)
        # (substitution: refused by the event's pair when composed, as for the event itself)
        return E.TruncatedPoissonGaussianEvent(base.sigma, self.q, self.dataset_size, self.batch_size)

    def _with_replacement_event(self) -> E.WithReplacementGaussianEvent:
        """The step of ``sampling="with_replacement"``: ``batch_size`` independent uniform draws from
        ``dataset_size`` records, Gaussian noise (docs/MATH.md 2.7); q is batch_size / dataset_size."""
        base = self._sized_gaussian("the number B of draws per batch", 2)
        rate = self.batch_size / self.dataset_size
        if self.q != 1.0 and abs(self.q - rate) > 1e-9 * rate:
            raise ValueError(f"q: with sampling='{WITH_REPLACEMENT}' the rate is batch_size / dataset_size = "
                             f"{self.batch_size}/{self.dataset_size} = {rate:.6g}, got q={float(self.q)!r} "
                             "(leave q out)")
        object.__setattr__(self, "q", rate)
        return E.WithReplacementGaussianEvent(base.sigma, self.dataset_size, self.batch_size)

    # -- to be provided by subclasses ------------------------------------
    def base_event(self) -> E.BaseEvent:
        """The unsampled base event of this mechanism."""
        raise NotImplementedError

    @property
    def event(self) -> E.Event:
        """The pure-data event of one step (sampled when ``q < 1``)."""
        return self._event

    @property
    def subsamplable(self) -> bool:
        return maths_of(self.base_event()).family is not None

    def base_profile(self, sensitivity_factor: float = 1.0) -> PrivacyProfile:
        """The pair (B_0, B_{c D}) of the unsampled base mechanism, c = sensitivity_factor."""
        return maths_of(self.base_event()).pair(self.base_event(), sensitivity_factor)

    def branches(self) -> list[Branch]:
        """Dominating pairs to compose, one per direction (docs/MATH.md section 2)."""
        from .sampling import dominating_pairs

        return dominating_pairs(self.event, self.relation)

    def describe(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if not ((f.name == "group" and self.group == 1)
                     or (f.name == "selections" and self.selections == 1)
                     or (f.name in ("batch_size", "dataset_size") and getattr(self, f.name) is None))}
        d["mechanism"] = type(self).__name__.lower()
        return d

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={E._fmt(v)}' for k, v in self.describe().items() if k != 'mechanism')})"


@dataclass(frozen=True, repr=False)
class Gaussian(Mechanism):
    """Gaussian mechanism with noise multiplier ``sigma`` (noise std = sigma * sensitivity)."""

    sigma: float
    sensitivity: float = 1.0

    def base_event(self):
        return E.GaussianEvent(self.sigma, self.sensitivity)


@dataclass(frozen=True, repr=False)
class Laplace(Mechanism):
    """Laplace mechanism with noise scale ``scale`` (b) and L1 sensitivity ``sensitivity``."""

    scale: float
    sensitivity: float = 1.0

    def base_event(self):
        return E.LaplaceEvent(self.scale, self.sensitivity)


@dataclass(frozen=True, repr=False)
class DiscreteLaplace(Mechanism):
    """Discrete Laplace mechanism: noise with pmf proportional to ``e^(-|x|/scale)`` on the
    integers, integer sensitivity ``sensitivity``; exact pairs for every sampling and relation."""

    scale: float
    sensitivity: int = 1

    def base_event(self):
        return E.DiscreteLaplaceEvent(self.scale, self.sensitivity)


@dataclass(frozen=True, repr=False)
class LatticeNoise(Mechanism):
    """Symmetric additive noise on the integers with pmf ``pmf`` (offsets 0..m-1), sensitivity ``shift``.

    A tiny exactly-representable mechanism, mainly for brute-force checks of the
    subsampling table: every pair is a finite profile computed exactly.
    """

    pmf: tuple = ()
    shift: int = 1

    def __post_init__(self):
        # (validated first: a clear message naming pmf or shift, and a hashable tuple)
        object.__setattr__(self, "pmf", V.lattice_pmf("pmf", self.pmf))
        object.__setattr__(self, "shift", V.whole_number("shift", self.shift))
        super().__post_init__()

    def base_event(self):
        return E.LatticeEvent(self.pmf, self.shift)

    @property
    def lattice_pmf(self):
        import numpy as np

        return np.asarray(self.pmf, dtype=float)


@dataclass(frozen=True, repr=False)
class RandomizedResponse(Mechanism):
    """Binary randomized response with parameter eps0 (one record's bit, no subsampling)."""

    eps0: float

    def base_event(self):
        return E.RandomizedResponseEvent(self.eps0)


@dataclass(frozen=True, repr=False)
class ApproxDP(Mechanism):
    """Any (eps0, delta0)-DP mechanism, through its dominating pair."""

    eps0: float
    delta0: float = 0.0

    def base_event(self):
        return E.ApproxDPEvent(self.eps0, self.delta0)


@dataclass(frozen=True, repr=False)
class Custom(Mechanism):
    """A user-supplied profile (a dominating pair), composed as is; with ``add_profile``
    the remove (``profile``) and add directions differ (see :class:`pldlib.events.ProfileEvent`)."""

    profile: PrivacyProfile = None
    add_profile: PrivacyProfile = None

    def base_event(self):
        return E.ProfileEvent(self.profile, self.add_profile)


# -- descriptors: what the CLI and the sweep configs read ------------------------------------
@dataclass(frozen=True)
class MechanismSpec:
    """A mechanism as the command line and the sweep configs know it.

    ``name`` is its ``--mechanism`` / ``mechanism:`` value; ``cls`` the :class:`Mechanism`
    subclass; ``noise`` the name of its noise parameter, which is its CLI flag (``--sigma``),
    the keyword of ``cls`` and the value a sweep's ``sigma`` axis holds for it; ``more_private``
    says which way the noise parameter makes it more private (``"up"``: larger is more
    private, e.g. sigma; ``"down"``: smaller is, e.g. eps0); ``help`` describes it.
    """

    name: str
    cls: type
    noise: str
    help: str
    more_private: str = "up"

    @property
    def flag(self) -> str:
        return f"--{self.noise}"

    def make(self, noise: float, **kw) -> Mechanism:
        """``cls(noise=..., **kw)``; ``sensitivity`` is dropped when it is 1 and ``cls`` has none,
        refused otherwise."""
        types = {f.name: f.type for f in fields(self.cls)}
        if "sensitivity" in kw and "sensitivity" not in types:
            if kw["sensitivity"] != 1.0:
                raise ValueError(f"sensitivity: {self.name} has no sensitivity parameter")
            kw.pop("sensitivity")
        for k, v in kw.items():  # an integer parameter given as a whole float (command lines, YAML)
            if types.get(k) in (int, "int") and isinstance(v, float) and v.is_integer():
                kw[k] = int(v)
        return self.cls(**{self.noise: noise}, **kw)


_SPECS: dict[str, MechanismSpec] = {}


def register_mechanism(spec: MechanismSpec) -> MechanismSpec:
    """Make ``spec`` known to the CLI (``--mechanism``, its noise flag) and the sweep configs."""
    if not isinstance(spec, MechanismSpec):
        raise TypeError(f"spec: a MechanismSpec, got {spec!r}")
    if not (isinstance(spec.cls, type) and issubclass(spec.cls, Mechanism)):
        raise TypeError(f"spec.cls: a Mechanism subclass, got {spec.cls!r}")
    if spec.noise not in {f.name for f in fields(spec.cls)}:
        raise ValueError(f"spec.noise: {spec.cls.__name__} has no parameter {spec.noise!r}")
    V.choice("more_private", spec.more_private, ("up", "down"))
    _SPECS[spec.name] = spec
    return spec


def mechanism_spec(name: str) -> MechanismSpec:
    """The registered :class:`MechanismSpec` called ``name``."""
    V.choice("mechanism", name, tuple(_SPECS))
    return _SPECS[name]


def mechanism_names() -> tuple[str, ...]:
    """Names of the registered mechanisms (CLI ``--mechanism``, config ``mechanism:``)."""
    return tuple(_SPECS)


register_mechanism(MechanismSpec("gaussian", Gaussian, "sigma",
                                 "Gaussian noise multiplier (noise std = sigma * sensitivity)"))
register_mechanism(MechanismSpec("laplace", Laplace, "scale", "Laplace noise scale b"))
register_mechanism(MechanismSpec("discrete_laplace", DiscreteLaplace, "scale",
                                 "discrete Laplace scale (pmf proportional to exp(-|x|/scale))"))
register_mechanism(MechanismSpec("randomized_response", RandomizedResponse, "eps0",
                                 "randomized response parameter eps0 (no subsampling)", more_private="down"))
