"""Hockey-stick maths of one step, no grids (docs/MATH.md sections 1-2).

* :mod:`.base` -- privacy profiles: Gaussian, Laplace, finite pairs, custom.
* :mod:`.mixtures` -- noise families and the mixtures of shifted noise that
  sampling produces.
* :mod:`.pairs` -- dominating pairs of one step and the maths registered per event type.

Every other module of this package is a mechanism's maths and registers itself
(:func:`pldlib.profiles.pairs.register`) when the package is imported: adding a
mechanism needs no import line here.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from .base import (  # noqa: F401
    FiniteProfile,
    GaussianProfile,
    LaplaceProfile,
    PrivacyProfile,
    ReversedProfile,
    approx_dp_profile,
    randomized_response_profile,
)
from . import pairs  # noqa: F401,E402

for _m in _pkgutil.iter_modules(__path__):
    if _m.name not in ("base", "mixtures", "pairs"):
        _importlib.import_module(f"{__name__}.{_m.name}")
