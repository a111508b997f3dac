"""The PLD accountant's budget policy: how much memory and time an automatic grid may use.

An automatic grid (no explicit spacing) is coarsened -- by powers of 2, flagged with
:class:`AccuracyLimitedWarning` -- when a composition would exceed the memory budget or the
points the time left pays for.  Coarsening keeps every answer a certified interval (only
wider); an explicit spacing or ``max_bins`` is never coarsened around
(:class:`~pldlib.GridTooLargeError` instead).  :class:`BudgetPolicy` holds the accountant's
side of it (the clock of a query, the FFT length cap, the retry loop); the grid it coarsens
is :mod:`pldlib.methods.pld_grid`'s.
"""
from __future__ import annotations

import contextlib
import math
import time
import warnings

import numpy as np

from .. import _deadline
from .. import _validate as V
from .._validate import GridTooLargeError

__all__ = ["AccuracyLimitedWarning", "BudgetPolicy", "DEFAULT_MEMORY_BUDGET", "DEFAULT_TIME_BUDGET",
           "TimeBudgetError"]


class AccuracyLimitedWarning(UserWarning):
    """The automatic grid was coarsened to fit the memory or time budget: the answer is still a
    certified interval, only wider than the accuracy the automatic rule aims at
    (``PLDAccountant.accuracy_limited`` is then True)."""


#: default memory budget of the automatic grid (bytes): 1 GB
DEFAULT_MEMORY_BUDGET = 2**30
#: default time budget (seconds) of one query (and of one build) on an automatic grid: a
#: composition predicted to end past it coarsens the grid (flagged) instead of running
DEFAULT_TIME_BUDGET = 10.0
#: seconds past the time budget after which work still running on an automatic grid is
#: interrupted (a hard stop between FFTs and discretisation passes; the query then answers with
#: what it has certified, flagged): no query overruns its budget by much more than this
HARD_GRACE = 0.5
#: compositions of at most this many points always run, past the deadline too (a few tenths
#: of a second each): coarsening for time ends there
TIME_MIN_BINS = 2**18
#: seconds per FFT point of a composition (both sides, with reading its answers) before one
#: was measured on this accountant (5e-7 to 1e-6 here)
RATE_PRIOR = 8e-7
#: reading a composition's answers (query tables) costs about this fraction of composing it
READ_FACTOR = 0.7
#: a composition may use at most 1 / TIME_SAFETY of the time left (the re-tilt loop may need
#: a few); the cap is never below TIME_MIN_BINS
TIME_SAFETY = 3.0
#: bytes per FFT bin of a composition (both sides, transforms and work arrays; measured
#: peak about 100 bytes per bin): the automatic grid uses at most budget / this many bins
BYTES_PER_BIN = 128
#: bytes a cached composition keeps per FFT point and side (its masses and, once read, its
#: answer table: grid, tail sums and curve values)
RETAINED_BYTES_PER_BIN = 56
#: peak bytes per single-step grid point while a branch is discretised (both sides: measured
#: 134 for connect-the-dots, 273 with the optimistic hull, on 3.4 million points)
GRID_BYTES_PER_POINT = 320
#: at most this many halvings of the automatic spacing to fit the budget
MAX_COARSEN = 24
#: the time budget of the automatic grid: a single-step grid has at most this many points
#: (discretising a subsampled pair costs a few microseconds per point: about 1 s here)
AUTO_STEP_POINTS = 2**18


class TimeBudgetError(GridTooLargeError):
    """A composition of the automatic grid needs more points than the time left allows
    (internal: the automatic grid coarsens by :func:`_coarsen_factor`, or the re-tilt loop
    keeps the certified answers it has; never seen by users)."""


def _coarsen_factor(err) -> float:
    """How much coarser the next automatic grid is: 2, or at once the power of 2 (at most
    2^8) that brings a composition of ``err.need`` points within ``err.limit`` (the window's
    points scale like 1/h)."""
    need, limit = getattr(err, "need", None), getattr(err, "limit", None)
    if not need or not limit or need <= limit:
        return 2.0
    return float(2 ** min(8, max(1, math.ceil(math.log2(need / limit)))))


class BudgetPolicy:
    def _coarsen(self, factor: float = 2.0):
        """Multiply the spacing by ``factor`` (a power of 2; automatic grid only), flagging the
        accuracy as limited."""
        self._limited(stacklevel=5)
        h = float(factor) * self.spacing
        per_comp = [m.branches() for m, _ in self._eff]
        self._branches = self._discretise(self._labels, per_comp, h)
        self.spacing = h

    def _auto_grid(self) -> bool:
        return self._spacing_opt is None and not self._bins_explicit

    @contextlib.contextmanager
    def _clock(self):
        """Run the enclosed query (or build) under the time budget (nested calls share the
        outermost deadline)."""
        if self.__dict__.get("_deadline") is not None or self.time_budget is None:
            yield
            return
        self._deadline = time.perf_counter() + self.time_budget
        # the hard stop (automatic grids only: an explicit spacing is answered as asked): work
        # still running HARD_GRACE after the budget is interrupted (:mod:`pldlib._deadline`)
        hard = self._deadline + HARD_GRACE if self._auto_grid() else None
        try:
            with _deadline.hard_deadline(hard):
                yield
        finally:
            self._deadline = None

    def _futile(self, err, last) -> bool:
        """Whether coarsening again is pointless: the composition refused now (``err``) needs
        more than 0.7x the points of the one refused before the last coarsening (``last``; the
        composed support of many steps of a few atoms does not shrink with h), or the time
        budget is overrun by half of itself (each coarsening re-discretises)."""
        need, before = getattr(err, "need", None), getattr(last, "need", None)
        if need is not None and before is not None and need > 0.7 * before:
            return True
        deadline = self.__dict__.get("_deadline")
        return deadline is not None and time.perf_counter() > deadline + 0.5 * self.time_budget

    def _limited(self, stacklevel: int = 4) -> None:
        """Flag the answers as accuracy-limited (a warning the first time)."""
        if not self.accuracy_limited:
            warnings.warn(f"pldlib: the automatic accuracy does not fit the memory budget of "
                          f"{self.memory_budget:,} bytes or the time budget of {self.time_budget} s; "
                          "answering with a coarser certified grid (wider intervals)",
                          AccuracyLimitedWarning, stacklevel=stacklevel)
        self.accuracy_limited = True

    def _bins(self, memory_only: bool = False) -> int:
        """The FFT length cap of compositions: ``max_bins`` and the memory budget's (an explicit
        interval whose composition exceeds it raises :class:`GridTooLargeError` before anything
        of that size is allocated), for an automatic grid under a query's clock also the points
        the time left pays for (at the measured cost per point, :data:`RATE_PRIOR` before any
        composition)."""
        if self._spacing_opt is not None:
            return int(min(self.max_bins, max(16, self.memory_budget // BYTES_PER_BIN)))
        cap = self.__dict__.get("_auto_bins", self.max_bins)
        deadline = self.__dict__.get("_deadline")
        if memory_only or deadline is None or self._bins_explicit:
            return cap
        rate = max(self.__dict__.get("_rate", RATE_PRIOR), 0.25 * RATE_PRIOR)
        left = deadline - time.perf_counter()
        return int(min(cap, max(left / (TIME_SAFETY * rate), TIME_MIN_BINS)))

    def _auto(self, fn, *args):
        """``fn(*args)``; with an automatic grid, a composition that does not fit the budget
        coarsens the grid (flagged) and retries."""
        last = None
        for _ in range(MAX_COARSEN):
            try:
                return fn(*args)
            except MemoryError as e:  # GridTooLargeError, or numpy running out under a memory cap
                if self._spacing_opt is not None and not isinstance(e, GridTooLargeError):
                    # (the process's own limit is below the memory budget's estimate: said in our
                    # words, not numpy's)
                    raise GridTooLargeError(
                        f"ran out of memory at spacing {V.fmt(self.spacing)} within the memory budget of "
                        f"{self.memory_budget:,} bytes (this process may use less): use a coarser spacing or "
                        "a smaller memory_budget") from e
                if self._spacing_opt is not None or self._bins_explicit or \
                        (not isinstance(e, GridTooLargeError) and self.spacing <= 0):
                    raise
                if self._futile(e, last):
                    break
                last = e
                self._coarsen(_coarsen_factor(e))
        # no grid fits the budget at any spacing (e.g. 10^8 steps of a two-atom pair: the
        # composed support alone exceeds it): the trivial certified interval, flagged
        warnings.warn("pldlib: no grid within the memory and time budgets resolves this composition; the grid gives "
                      "only the trivial certified interval (closed forms and analytic bounds may narrow it)",
                      AccuracyLimitedWarning, stacklevel=4)
        self.accuracy_limited = True
        x = np.asarray(args[0], dtype=float)
        if fn == self._epsilon:
            return np.full(x.shape, -np.inf), np.full(x.shape, np.inf)
        return np.zeros(x.shape), np.ones(x.shape)
