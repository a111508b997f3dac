"""Accounting methods: one interface (:mod:`.base`), one module per method, one registry.

=====  =========  ==============================================  ===========================
name   kind       what it answers                                 module
=====  =========  ==============================================  ===========================
pld    certified  interval (connect-the-dots / convex hull, FFT)  :mod:`pldlib.pld.accountant`
prv    certified  interval + PRV estimate                         :mod:`pldlib.methods.prv`
spa    certified  interval (Berry-Esseen) + SP-MSD1 estimate      :mod:`pldlib.methods.spa`
rdp    upper      upper bound only (moments accountant)           :mod:`pldlib.methods.rdp`
clt    estimate   Gaussian-DP CLT estimate, no guarantee          :mod:`pldlib.methods.clt`
=====  =========  ==============================================  ===========================

The registry is the one list of method names that the CLI, the sweep configs,
calibration, tables and campaigns read.  Classes are imported on first use, so
``import pldlib`` stays light.  Other packages add methods with
:func:`register_method` (the sweeps register the peers dp_accounting and
prv_accountant as kind ``peer``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from .. import _validate as V
from .base import KINDS, Accountant, Estimate, Interval, StepsTables, UnsupportedEventError  # noqa: F401

__all__ = ["MethodInfo", "register_method", "method_names", "method_info", "accountant_class",
           "make_accountant", "Accountant", "Interval", "Estimate", "StepsTables", "UnsupportedEventError", "KINDS"]


@dataclass(frozen=True)
class MethodInfo:
    """A registered method: ``target`` is ``"module:Class"`` (imported lazily) or the class."""

    name: str
    kind: str
    target: object
    summary: str = ""


_METHODS: dict[str, MethodInfo] = {}


def register_method(name: str, target, *, kind: str, summary: str = "") -> None:
    """Register an :class:`Accountant` subclass (or ``"module:Class"``) under ``name``."""
    V.choice("kind", kind, KINDS)
    _METHODS[name] = MethodInfo(name, kind, target, summary)


def method_names(kind: str | tuple | None = None) -> tuple[str, ...]:
    """Registered method names (optionally only those of the given kind(s))."""
    kinds = (kind,) if isinstance(kind, str) else kind
    return tuple(n for n, m in _METHODS.items() if kinds is None or m.kind in kinds)


def method_info(name: str) -> MethodInfo:
    V.choice("method", name, tuple(_METHODS))
    return _METHODS[name]


def accountant_class(name: str) -> type:
    """The :class:`Accountant` subclass registered as ``name``."""
    info = method_info(name)
    if isinstance(info.target, str):
        mod, cls = info.target.split(":")
        return getattr(importlib.import_module(mod), cls)
    return info.target


def make_accountant(name: str, relation: str = "add_remove", **options) -> Accountant:
    """An empty accountant of method ``name`` (options validated by its constructor)."""
    return accountant_class(name)(relation, **options)


register_method("pld", "pldlib.pld.accountant:PLDAccountant", kind="certified",
                summary="certified PLD accountant (lower, upper)")
register_method("prv", "pldlib.methods.prv:PRVAccountant", kind="certified",
                summary="PRV accountant: certified lower, upper and its central estimate")
register_method("spa", "pldlib.methods.spa:SPAAccountant", kind="certified",
                summary="saddle-point accountant: certified Berry-Esseen interval and the SP-MSD1 estimate")
register_method("rdp", "pldlib.methods.rdp:RDPAccountant", kind="upper",
                summary="RDP / moments accountant: an upper bound only")
register_method("clt", "pldlib.methods.clt:CLTAccountant", kind="estimate",
                summary="Gaussian-DP CLT approximation: an ESTIMATE only, never a guarantee")
