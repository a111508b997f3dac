"""Modules that add mechanisms or methods, imported by name where pldlib runs.

A mechanism (:func:`pldlib.mechanisms.register_mechanism`) or a method
(:func:`pldlib.methods.register_method`) registers itself when its module is
imported.  Code that imports the module itself needs nothing more; the command
line and the sweeps' workers, which run in other processes, import the modules
named in the environment variable ``PLDLIB_PLUGINS`` (comma-separated module
names, e.g. ``PLDLIB_PLUGINS=mylab.mechanisms,mylab.accountant``).
"""
from __future__ import annotations

import importlib
import os

__all__ = ["load_plugins", "ENV"]

#: the environment variable naming the plugin modules
ENV = "PLDLIB_PLUGINS"

_loaded: set[str] = set()


def load_plugins(names: str | None = None) -> tuple[str, ...]:
    """Import the modules named in ``names`` (default: ``$PLDLIB_PLUGINS``) once each; returns
    their names.  A module that cannot be imported raises ``ImportError`` naming it and the
    variable."""
    text = os.environ.get(ENV, "") if names is None else names
    out = []
    for name in (n.strip() for n in text.split(",")):
        if not name:
            continue
        if name not in _loaded:
            try:
                importlib.import_module(name)
            except ImportError as e:
                raise ImportError(f"{ENV}: cannot import plugin module {name!r}: {e}") from None
            _loaded.add(name)
        out.append(name)
    return tuple(out)
