"""A hard deadline for long numerical work (the PLD accountant's time budget).

Work that may run long (FFT compositions, discretising a step, tabulating cumulants) calls
:func:`check` between its pieces; inside :func:`hard_deadline`, a check past the deadline raises
:class:`DeadlineExceeded`, and the caller answers with what it has already certified (or the
trivial interval), flagged as accuracy-limited.  Each piece between two checks is short (at most
one FFT or one vectorised pass over a grid), so the work stops soon after the deadline.  Outside
any :func:`hard_deadline` block, :func:`check` costs a context-variable read and does nothing.
"""
from __future__ import annotations

import contextlib
import contextvars
import time

__all__ = ["DeadlineExceeded", "check", "hard_deadline", "remaining"]


class DeadlineExceeded(TimeoutError):
    """The enclosing :func:`hard_deadline` passed while work was running (the work is abandoned;
    no answer depends on it)."""


_AT: contextvars.ContextVar = contextvars.ContextVar("pldlib_hard_deadline", default=None)


@contextlib.contextmanager
def hard_deadline(at: float | None):
    """Within the block, :func:`check` raises :class:`DeadlineExceeded` once
    ``time.perf_counter()`` passes ``at`` (None: no deadline of its own).  Nested blocks keep
    the earlier of the two deadlines."""
    cur = _AT.get()
    token = _AT.set(cur if at is None else (at if cur is None else min(cur, at)))
    try:
        yield
    finally:
        _AT.reset(token)


def check(what: str = "the computation") -> None:
    """Raise :class:`DeadlineExceeded` when the enclosing deadline has passed."""
    at = _AT.get()
    if at is not None and time.perf_counter() > at:
        raise DeadlineExceeded(f"{what} ran past the time budget")


def remaining() -> float:
    """Seconds left before the enclosing deadline (inf without one)."""
    at = _AT.get()
    return float("inf") if at is None else at - time.perf_counter()
