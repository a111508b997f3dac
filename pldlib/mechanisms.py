"""User-facing mechanism specifications.

A mechanism spec names a base mechanism (Gaussian, Laplace, randomized
response, an (eps0, delta0)-DP mechanism, or any custom profile) together with
its sampling scheme and neighbouring relation.  Its :meth:`Mechanism.branches`
turns it into the dominating pairs to compose (MATH.md section 2): one branch
per direction whose composed answers are maximised *after* composition.  Each
branch carries the profile that gives the upper bound and the one that gives
the lower bound (they differ only for WOR substitution).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from . import _validate as V
from .profiles import (
    GaussianProfile,
    LaplaceProfile,
    PrivacyProfile,
    approx_dp_profile,
    randomized_response_profile,
)

__all__ = ["Mechanism", "Gaussian", "Laplace", "LatticeNoise", "RandomizedResponse", "ApproxDP", "Custom",
           "Branch"]


class Branch(NamedTuple):
    """One direction to compose: ``upper`` certifies the upper bound, ``lower`` the lower."""

    label: str
    upper: PrivacyProfile
    lower: PrivacyProfile


@dataclass(frozen=True)
class Mechanism:
    """Base class: a single-step mechanism with sampling and neighbouring relation."""

    q: float = field(default=1.0, kw_only=True)
    sampling: str = field(default="none", kw_only=True)
    relation: str = field(default="add_remove", kw_only=True)

    def __post_init__(self):
        V.sampling_rate("q", self.q)
        V.choice("sampling", self.sampling, V.SAMPLINGS)
        V.choice("relation", self.relation, V.RELATIONS)
        if self.sampling == "none" and self.q != 1.0:
            raise ValueError(f"q must be 1 when sampling is 'none' (got q={self.q}); "
                             "choose sampling='poisson' or 'wor' for q < 1")

    # -- to be provided by subclasses ------------------------------------
    def base_profile(self, sensitivity_factor: float = 1.0) -> PrivacyProfile:
        """The pair (B_0, B_{c D}) of the unsampled base mechanism, c = sensitivity_factor."""
        raise NotImplementedError

    @property
    def subsamplable(self) -> bool:
        return False

    def branches(self) -> list[Branch]:
        """Dominating pairs to compose, one per direction (MATH.md section 2)."""
        from .subsampling import branches_for

        return branches_for(self)

    def describe(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["mechanism"] = type(self).__name__.lower()
        return d


@dataclass(frozen=True)
class Gaussian(Mechanism):
    """Gaussian mechanism with noise multiplier ``sigma`` (noise std = sigma * sensitivity)."""

    sigma: float
    sensitivity: float = 1.0

    def __post_init__(self):
        V.positive_finite("sigma", self.sigma)
        V.positive_finite("sensitivity", self.sensitivity)
        super().__post_init__()

    def base_profile(self, sensitivity_factor: float = 1.0) -> PrivacyProfile:
        # only the ratio noise / sensitivity matters
        return GaussianProfile(sigma=self.sigma / sensitivity_factor)

    def noise(self, sensitivity_factor: float = 1.0):
        from .mixtures import GaussianNoise

        return GaussianNoise(self.sigma, sensitivity_factor)

    @property
    def subsamplable(self) -> bool:
        return True


@dataclass(frozen=True)
class Laplace(Mechanism):
    """Laplace mechanism with noise scale ``scale`` (b) and L1 sensitivity ``sensitivity``."""

    scale: float
    sensitivity: float = 1.0

    def __post_init__(self):
        V.positive_finite("scale", self.scale)
        V.positive_finite("sensitivity", self.sensitivity)
        super().__post_init__()

    def base_profile(self, sensitivity_factor: float = 1.0) -> PrivacyProfile:
        return LaplaceProfile(scale=self.scale, sensitivity=self.sensitivity * sensitivity_factor)

    def noise(self, sensitivity_factor: float = 1.0):
        from .mixtures import LaplaceNoise

        return LaplaceNoise(self.scale, self.sensitivity * sensitivity_factor)

    @property
    def subsamplable(self) -> bool:
        return True


@dataclass(frozen=True)
class LatticeNoise(Mechanism):
    """Symmetric additive noise on the integers with pmf ``pmf`` (offsets 0..m-1), sensitivity ``shift``.

    A tiny exactly-representable mechanism, mainly for brute-force checks of the
    subsampling table: every pair is a finite profile computed exactly.
    """

    pmf: tuple = ()
    shift: int = 1

    def __post_init__(self):
        import numpy as np

        arr = np.asarray(self.pmf, dtype=float)
        if arr.ndim != 1 or arr.size < 2 or np.any(arr < 0) or abs(arr.sum() - 1) > 1e-12:
            raise ValueError("pmf must be a probability vector of length >= 2")
        if int(self.shift) != self.shift or self.shift < 1:
            raise ValueError("shift must be an integer >= 1")
        if not np.allclose(arr, arr[::-1], rtol=0, atol=1e-15):
            # the dominating pairs of MATH.md section 2 assume B_{-D} mirrors B_D
            raise ValueError("pmf must be symmetric (pmf == pmf[::-1]) for the subsampling dominating pairs")
        super().__post_init__()

    @property
    def lattice_pmf(self):
        import numpy as np

        return np.asarray(self.pmf, dtype=float)

    @property
    def subsamplable(self) -> bool:
        return True


@dataclass(frozen=True)
class RandomizedResponse(Mechanism):
    """Binary randomized response with parameter eps0 (one record's bit, no subsampling)."""

    eps0: float

    def __post_init__(self):
        V.positive_finite("eps0", self.eps0)
        super().__post_init__()
        if self.sampling != "none":
            raise ValueError("sampling: randomized response is supported without subsampling only")

    def base_profile(self, sensitivity_factor: float = 1.0) -> PrivacyProfile:
        return randomized_response_profile(self.eps0)


@dataclass(frozen=True)
class ApproxDP(Mechanism):
    """Any (eps0, delta0)-DP mechanism, through its dominating pair."""

    eps0: float
    delta0: float = 0.0

    def __post_init__(self):
        V.nonnegative_finite("eps0", self.eps0)
        V.probability_closed_open("delta0", self.delta0)
        super().__post_init__()
        if self.sampling != "none":
            raise ValueError("sampling: ApproxDP is supported without subsampling only")

    def base_profile(self, sensitivity_factor: float = 1.0) -> PrivacyProfile:
        return approx_dp_profile(self.eps0, self.delta0)


@dataclass(frozen=True)
class Custom(Mechanism):
    """A user-supplied profile (a dominating pair), composed as is."""

    profile: PrivacyProfile = None

    def __post_init__(self):
        if not isinstance(self.profile, PrivacyProfile):
            raise TypeError("profile must be a PrivacyProfile")
        super().__post_init__()
        if self.sampling != "none":
            raise ValueError("sampling: a custom profile is composed as given (sampling='none')")

    def base_profile(self, sensitivity_factor: float = 1.0) -> PrivacyProfile:
        return self.profile

    def branches(self) -> list[Branch]:
        return [Branch("pair", self.profile, self.profile)]
