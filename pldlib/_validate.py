"""Argument validation and error types shared by the public API and the CLIs.

Every check raises :class:`ValueError` (or :class:`TypeError`) whose message
names the offending argument and says why it was rejected.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import numpy as np

#: the neighbouring relations (the one list; sampling names live in :mod:`pldlib.sampling`)
RELATIONS = ("add", "remove", "add_remove", "substitution")


class PrecisionLimitError(ArithmeticError):
    """A requested answer lies beyond what floating point can certify here."""


class GridTooLargeError(MemoryError):
    """The composition would need more grid points than allowed.

    ``need`` and ``limit`` (points; None when unknown) let an automatic grid coarsen by the
    right factor at once."""

    def __init__(self, *args, need: int | None = None, limit: int | None = None):
        super().__init__(*args)
        self.need, self.limit = need, limit


class CalibrationError(RuntimeError):
    """No certified parameter could be found within the evaluation budget or the accuracy limits."""


def fmt(v) -> str:
    """A number as a user reads it (``1.5``, not ``np.float64(1.5)``)."""
    if isinstance(v, (bool, np.bool_)):
        return repr(bool(v))
    if isinstance(v, numbers.Integral):
        return repr(int(v))
    if isinstance(v, numbers.Real):
        return repr(float(v))
    return repr(v)


def positive_finite(name: str, value) -> float:
    """A finite real number > 0."""
    v = finite(name, value)
    if v <= 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    return v


def from_text(check, text: str, *extra):
    """``check`` (a validator of this module) applied to ``text`` read as a number; a ValueError
    whose message is the check's without its argument name (``must be > 0, got -1.0``), the
    one-line message the command line and the calculator page show after their field's name."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number, got {text!r}") from None
    try:
        return check("value", v, *extra)
    except (TypeError, ValueError) as e:
        raise ValueError(str(e).removeprefix("value ")) from None


def spacing_option(spacing, interval, stacklevel: int = 3):
    """The grid spacing given as ``spacing=`` or under its older name ``interval=`` (which warns
    with a ``DeprecationWarning``: an *interval* is an answer); ``ValueError`` when both differ."""
    if interval is None:
        return spacing
    import warnings

    warnings.warn("interval= is the older name of the grid spacing: use spacing=", DeprecationWarning,
                  stacklevel=stacklevel)
    if spacing is not None and spacing != interval:
        raise ValueError(f"spacing: given twice, as spacing={fmt(spacing)} and interval={fmt(interval)}")
    return interval


def finite(name: str, value) -> float:
    """A finite real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {fmt(value)}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v!r}")
    return v


def int_at_least(name: str, value, low: int) -> int:
    """An integer >= ``low`` (floats that are whole numbers are accepted)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or not float(value).is_integer() or value < low):
        raise ValueError(f"{name} must be an integer >= {low}, got {fmt(value)}")
    return int(value)


def nonnegative_finite(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {fmt(value)}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    return v


def probability_open(name: str, value) -> float:
    """A number strictly inside (0, 1), e.g. a target delta."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {fmt(value)}")
    v = float(value)
    if not (0.0 < v < 1.0):
        raise ValueError(f"{name} must be in (0, 1), got {v!r}")
    return v


def sampling_rate(name: str, value) -> float:
    """A sampling probability in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {fmt(value)}")
    v = float(value)
    if not (0.0 < v <= 1.0):
        raise ValueError(f"{name} must be in (0, 1], got {v!r}")
    return v


def steps(name: str, value) -> int:
    """An integer >= 1 (floats that are whole numbers are accepted)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer >= 1, got {fmt(value)}")
    if isinstance(value, numbers.Integral):
        v = int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        v = int(value)
    else:
        raise ValueError(f"{name} must be an integer >= 1, got {fmt(value)}")
    if v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v}")
    return v


def positive_int(name: str, value) -> int:
    """An integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= 1, got {fmt(value)}")
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {fmt(value)}")
    return int(value)


def probability_closed_open(name: str, value) -> float:
    """A number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number in [0, 1), got {fmt(value)}")
    v = float(value)
    if not (0.0 <= v < 1.0):
        raise ValueError(f"{name} must be in [0, 1), got {v!r}")
    return v


def choice(name: str, value, options: Iterable[str]) -> str:
    options = tuple(options)
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {fmt(value)}")
    return value


def _float_array(name: str, values) -> np.ndarray:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a number or a list of numbers, got {fmt(values)}")
    try:
        arr = np.atleast_1d(np.asarray(values, dtype=float))
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number or a list of numbers, got {fmt(values)}") from None
    return arr


def delta_array(name: str, values) -> np.ndarray:
    """A non-empty 1-d array of deltas, each in (0, 1)."""
    arr = _float_array(name, values)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty list of numbers")
    bad = ~((arr > 0) & (arr < 1))
    if bad.any():
        raise ValueError(f"{name} must be in (0, 1), got {fmt(arr[bad][0])}")
    return arr


def epsilon_array(name: str, values) -> np.ndarray:
    """A non-empty 1-d array of finite epsilons (negative values allowed)."""
    arr = _float_array(name, values)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty list of numbers")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name} must be finite, got {fmt(arr[bad][0])}")
    return arr


def lattice_pmf(name: str, values) -> tuple:
    """A symmetric probability vector of length >= 2 (a lattice noise's pmf on offsets 0..m-1):
    finite entries >= 0 summing to 1 (within 1e-12), pmf == pmf[::-1] (within 1e-15)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of probabilities, got {fmt(values)}")
    vals = list(values)
    if any(isinstance(v, bool) or not isinstance(v, numbers.Real) for v in vals):
        raise TypeError(f"{name} must be a flat list of real numbers (probabilities)")
    arr = np.asarray(vals, dtype=float)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"{name} must have at least 2 entries, got {arr.size}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        bad = arr[~(np.isfinite(arr) & (arr >= 0))][0]
        raise ValueError(f"{name} entries must be finite and >= 0, got {fmt(bad)}")
    if abs(math.fsum(arr.tolist()) - 1.0) > 1e-12:
        raise ValueError(f"{name} must sum to 1, got {fmt(math.fsum(arr.tolist()))}")
    if not np.allclose(arr, arr[::-1], rtol=0, atol=1e-15):
        # the dominating pairs of docs/MATH.md section 2 assume B_{-D} mirrors B_D
        raise ValueError(f"{name} must be symmetric ({name} == {name}[::-1]) for the subsampling dominating pairs")
    return tuple(float(x) for x in arr)


def whole_number(name: str, value) -> int:
    """An integer >= 1, given as an int or a whole float (``2.0``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be an integer >= 1, got {fmt(value)}")
    if isinstance(value, numbers.Integral):
        v = int(value)
    elif math.isfinite(float(value)) and float(value).is_integer():
        v = int(float(value))
    else:
        raise ValueError(f"{name} must be an integer >= 1, got {fmt(value)}")
    if v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v}")
    return v
