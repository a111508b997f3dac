"""Sampling schemes: one registry (:mod:`.base`), one module per scheme.

Adding a scheme: a module in this package defining a :class:`SamplingScheme`
subclass and calling :func:`register`; it is imported (and so registered) with
the package, no import line needed.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from .base import (  # noqa: F401
    NO_SAMPLING,
    SamplingScheme,
    directions,
    dominating_pairs,
    get_scheme,
    register,
    sampling_names,
    scheme_names,
)

for _m in sorted(_pkgutil.iter_modules(__path__), key=lambda m: (m.name not in ("poisson", "wor"), m.name)):
    if _m.name != "base":
        _importlib.import_module(f"{__name__}.{_m.name}")
