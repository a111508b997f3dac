"""pldlib: certified numerical differential-privacy accounting.

Public API (thin re-exports over the modules that hold the maths):

* events (pure data, :mod:`pldlib.events`): :class:`GaussianEvent`, :class:`LaplaceEvent`,
  :class:`RandomizedResponseEvent`, :class:`ApproxDPEvent`, :class:`ProfileEvent`,
  :class:`Sampled`, :class:`SelfComposed`, :class:`Composed`, :class:`NoOp`
* mechanisms (sugar that builds events): :class:`Gaussian`, :class:`Laplace`,
  :class:`RandomizedResponse`, :class:`ApproxDP`, :class:`Custom`, :class:`LatticeNoise`
* accountants, one interface (:mod:`pldlib.methods`): :class:`PLDAccountant`,
  :class:`PRVAccountant`, :class:`SPAAccountant`, :class:`RDPAccountant`,
  :class:`CLTAccountant` -- ``Acc(relation).compose(event, count).epsilon(delta)``;
  :func:`make_accountant` by method name; :func:`account` the convenience entry
* answers: :class:`Interval` (``lo, up = ...``; ``.estimate`` and ``.kind`` for every method)
* calibration: :func:`calibrate`, :func:`get_noise_multiplier`
* sampling schemes: :mod:`pldlib.sampling` (registry: :func:`pldlib.sampling.scheme_names`)
* sigma look-ups: ``pldlib.atlas.open_atlas(path).sigma_for(epsilon, delta, q, steps, ...)``
* speed knob: :func:`pldlib.allocator.tune_allocator` (glibc malloc thresholds; applied at
  import with ``PLDLIB_TUNE_MALLOC=1``, and by the ``pldlib`` command unless ``=0``); by default
  import raises glibc's adaptive thresholds only (:func:`pldlib.allocator.raise_adaptive_thresholds`;
  none of it with ``=0``)
"""
from ._validate import GridTooLargeError, PrecisionLimitError
from .events import (
    ApproxDPEvent,
    Composed,
    DiscreteLaplaceEvent,
    GaussianEvent,
    LaplaceEvent,
    LatticeEvent,
    MixtureOfGaussiansEvent,
    NoOp,
    ProfileEvent,
    RandomizedResponseEvent,
    RepeatAndSelectEvent,
    Sampled,
    TruncatedPoissonGaussianEvent,
    WithReplacementGaussianEvent,
    SelfComposed,
    ZCDPEvent,
)
from .mechanisms import ApproxDP, Custom, DiscreteLaplace, Gaussian, Laplace, LatticeNoise, Mechanism, RandomizedResponse
from .methods import Accountant, Interval, UnsupportedEventError, make_accountant, method_names
from .methods.pld import PLDAccountant, account, account_steps
from .calibrate import CalibrationResult, calibrate, get_noise_multiplier
from . import sampling  # noqa: F401
from . import atlas  # noqa: F401  (pldlib.atlas.open_atlas(path): certified sigma look-ups)
from .profiles import (
    FiniteProfile,
    GaussianProfile,
    LaplaceProfile,
    PrivacyProfile,
    approx_dp_profile,
    randomized_response_profile,
)

__version__ = "0.1.0"

from . import allocator  # noqa: E402  (pldlib.allocator.tune_allocator(): a process-wide speed knob)


def _tune_at_import() -> None:
    import warnings

    try:
        if allocator.enabled(default=False):
            allocator.tune_allocator()
        elif allocator.enabled(default=True):  # (unset: glibc's adaptive thresholds raised only)
            allocator.raise_adaptive_thresholds()
    except ValueError as e:  # a bad PLDLIB_TUNE_MALLOC: say so, import anyway
        warnings.warn(str(e), RuntimeWarning, stacklevel=3)


_tune_at_import()

#: names imported on first use (keeps ``import pldlib`` light)
_LAZY = {
    "PRVAccountant": "pldlib.methods.prv", "account_prv": "pldlib.methods.prv",
    "SPAAccountant": "pldlib.methods.spa", "account_spa": "pldlib.methods.spa",
    "RDPAccountant": "pldlib.methods.rdp", "account_rdp": "pldlib.methods.rdp",
    "CLTAccountant": "pldlib.methods.clt", "account_clt": "pldlib.methods.clt",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pldlib' has no attribute {name!r}")

__all__ = [
    "account", "account_steps", "account_prv", "account_spa", "account_rdp", "account_clt",
    "Accountant", "PLDAccountant", "PRVAccountant", "SPAAccountant", "RDPAccountant", "CLTAccountant",
    "make_accountant", "method_names", "Interval",
    "calibrate", "CalibrationResult", "get_noise_multiplier",
    "PrecisionLimitError", "GridTooLargeError", "UnsupportedEventError",
    "GaussianEvent", "LaplaceEvent", "LatticeEvent", "RandomizedResponseEvent", "ApproxDPEvent", "ProfileEvent", "ZCDPEvent", "RepeatAndSelectEvent", "TruncatedPoissonGaussianEvent", "WithReplacementGaussianEvent",
    "MixtureOfGaussiansEvent", "Sampled", "SelfComposed", "Composed", "NoOp",
    "Mechanism", "Gaussian", "Laplace", "DiscreteLaplace", "DiscreteLaplaceEvent", "LatticeNoise", "RandomizedResponse", "ApproxDP", "Custom",
    "PrivacyProfile", "GaussianProfile", "LaplaceProfile", "FiniteProfile",
    "randomized_response_profile", "approx_dp_profile", "__version__",
]
