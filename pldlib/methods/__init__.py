"""Accounting methods: one interface (:mod:`.base`), one module per method, one registry.

=====  =========  ==============================================  ===========================
name   kind       what it answers                                 module
=====  =========  ==============================================  ===========================
pld    certified  interval (connect-the-dots / convex hull, FFT)  :mod:`pldlib.methods.pld`
prv    certified  interval + PRV estimate                         :mod:`pldlib.methods.prv`
spa    certified  interval (Berry-Esseen) + SP-MSD1 estimate      :mod:`pldlib.methods.spa`
rdp    upper      upper bound only (moments accountant)           :mod:`pldlib.methods.rdp`
clt    estimate   Gaussian-DP CLT estimate, no guarantee          :mod:`pldlib.methods.clt`
=====  =========  ==============================================  ===========================

The registry is the one list of method names that the CLI, the sweep configs,
calibration, tables and campaigns read.  Classes are imported on first use, so
``import pldlib`` stays light.  Other libraries' accountants are methods of kind ``peer``
(:mod:`pldlib.methods.peers`), listed only where their package is installed.
:func:`register_method` adds a method: an :class:`Accountant` subclass (or its
``"module:Class"`` path), nothing else.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from .. import _validate as V
from .base import KINDS, Accountant, Interval, StepsTables, UnsupportedEventError  # noqa: F401

__all__ = ["MethodInfo", "register_method", "method_names", "method_info", "accountant_class",
           "make_accountant", "Accountant", "Interval", "StepsTables", "UnsupportedEventError", "KINDS"]


@dataclass(frozen=True)
class MethodInfo:
    """A registered method: ``target`` is ``"module:Class"`` (imported lazily) or the class."""

    name: str
    kind: str
    target: object
    summary: str = ""
    #: the package the method needs (None: pldlib alone)
    requires: str | None = None

    @property
    def installed(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


_METHODS: dict[str, MethodInfo] = {}


def register_method(name: str, target, *, kind: str, summary: str = "", requires: str | None = None) -> None:
    """Register an :class:`Accountant` subclass (or ``"module:Class"``) under ``name``;
    ``requires``: the package it needs (the method is listed only where it is installed)."""
    V.choice("kind", kind, KINDS)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: a method name must be an identifier, got {name!r}")
    if not (isinstance(target, str) and target.count(":") == 1) and not (
            isinstance(target, type) and issubclass(target, Accountant)):
        raise TypeError(f"target: an Accountant subclass or 'module:Class', got {target!r}")
    _METHODS[name] = MethodInfo(name, kind, target, summary, requires)


def method_names(kind: str | tuple | None = None, *, installed: bool = True) -> tuple[str, ...]:
    """Registered method names (optionally only those of the given kind(s)); ``installed``:
    only those whose package is installed (all pldlib methods are)."""
    kinds = (kind,) if isinstance(kind, str) else kind
    return tuple(n for n, m in _METHODS.items()
                 if (kinds is None or m.kind in kinds) and (not installed or m.installed))


def method_info(name: str) -> MethodInfo:
    V.choice("method", name, tuple(_METHODS))
    return _METHODS[name]


def accountant_class(name: str) -> type:
    """The :class:`Accountant` subclass registered as ``name`` (ImportError naming the
    package when a peer's package is not installed)."""
    info = method_info(name)
    if not info.installed:
        raise ImportError(f"method {name!r} needs the optional package {info.requires!r}, which is not "
                          f"installed (pip install 'pldlib[peers]')")
    if isinstance(info.target, str):
        mod, cls = info.target.split(":")
        return getattr(importlib.import_module(mod), cls)
    return info.target


def _install_floor_mask() -> None:
    from . import base, rdp

    base.set_floor_mask(rdp.rdp_floor_mask)


_install_floor_mask()


def make_accountant(name: str, relation: str = "add_remove", **options) -> Accountant:
    """An empty accountant of method ``name`` (options validated by its constructor)."""
    return accountant_class(name)(relation, **options)


register_method("pld", "pldlib.methods.pld:PLDAccountant", kind="certified",
                summary="certified PLD accountant (lower, upper)")
register_method("prv", "pldlib.methods.prv:PRVAccountant", kind="certified",
                summary="PRV accountant: certified lower, upper and its central estimate")
register_method("spa", "pldlib.methods.spa:SPAAccountant", kind="certified",
                summary="saddle-point accountant: certified Berry-Esseen interval and the SP-MSD1 estimate")
register_method("rdp", "pldlib.methods.rdp:RDPAccountant", kind="upper",
                summary="RDP / moments accountant: an upper bound only")
register_method("clt", "pldlib.methods.clt:CLTAccountant", kind="estimate",
                summary="Gaussian-DP CLT approximation: an ESTIMATE only, never a guarantee")
register_method("dp_accounting", "pldlib.methods.peers.dp_accounting:DpAccountingPLD", kind="peer",
                requires="dp_accounting",
                summary="peer: dp_accounting PLD (pessimistic upper; optimistic lower, privacy buckets)")
register_method("prv_accountant", "pldlib.methods.peers.prv_accountant:PrvAccountantPeer", kind="peer",
                requires="prv_accountant", summary="peer: prv_accountant 0.2 (lower, estimate, upper)")
