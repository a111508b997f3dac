"""pldlib: certified numerical differential-privacy accounting.

Public API (thin re-exports over the modules that hold the maths):

* mechanisms: :class:`Gaussian`, :class:`Laplace`, :class:`RandomizedResponse`,
  :class:`ApproxDP`, :class:`Custom`
* accounting: :func:`account` -> accountant with ``.epsilon(delta)`` and
  ``.delta(epsilon)`` returning :class:`Interval` (lower, upper)
* building blocks: :mod:`pldlib.profiles` (hockey-stick curves),
  :mod:`pldlib.discretize` (connect-the-dots, convex hull, privacy buckets),
  :mod:`pldlib.composition` (certified FFT composition), :mod:`pldlib.pld`.
* lookup tables: ``pldlib.tables.open(path).sigma_for(epsilon, delta, q, steps, ...)``
  (:mod:`pldlib.tables`: certified sigmas without running an accountant)
"""
from .accountant import Estimate, Interval, PLDAccountant, PrecisionLimitError, account, account_steps
from .calibrate import CalibrationResult, calibrate, get_noise_multiplier
from .composition import GridTooLargeError
from .mechanisms import ApproxDP, Custom, Gaussian, Laplace, LatticeNoise, Mechanism, RandomizedResponse
from . import tables  # noqa: F401  (pldlib.tables.open(path): certified sigma lookup tables)
from .profiles import (
    GaussianProfile,
    LaplaceProfile,
    FiniteProfile,
    PrivacyProfile,
    approx_dp_profile,
    randomized_response_profile,
)

__version__ = "0.1.0"

__all__ = [
    "account", "account_steps", "Interval", "Estimate", "calibrate", "CalibrationResult", "get_noise_multiplier", "PLDAccountant", "PrecisionLimitError", "GridTooLargeError",
    "Mechanism", "Gaussian", "Laplace", "LatticeNoise", "RandomizedResponse", "ApproxDP", "Custom",
    "PrivacyProfile", "GaussianProfile", "LaplaceProfile", "FiniteProfile",
    "randomized_response_profile", "approx_dp_profile", "__version__",
]
