"""Discrete privacy loss distributions on a uniform grid, and reading answers off them.

A discrete PLD holds masses ``m_i`` at losses ``eps_i = (start + i) * h`` plus a
mass ``p_inf`` at +inf.  Its hockey-stick curve (docs/MATH.md section 3) is

    delta(eps) = p_inf + sum_{eps_i > eps} m_i (1 - e^{eps - eps_i}),

linear in e^eps between grid points.  On the segment (eps_{i-1}, eps_i] it equals
``c + A_i - e^{eps - eps_i} B_i`` with right tail sums

    A_i = sum_{j >= i} m_j,     B_i = sum_{j >= i} m_j e^{eps_i - eps_j},

(B is scaled to the segment end so nothing overflows at large eps), which
gives both delta(eps) and the exact inverse eps(delta) per segment
(docs/MATH.md section 4).  The functions here work on any non-negative measure
(total mass need not be 1), which is what the certified upper and lower
curves of a composition are.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["DiscretePLD", "GridMeasure"]


@functools.lru_cache(maxsize=8)
def _block_weights(h: float, L: int) -> np.ndarray:
    w = np.exp(-h * np.arange(L))
    w.flags.writeable = False
    return w


def _discounted_tail_sums(m: np.ndarray, h: float) -> np.ndarray:
    """B_i = sum_{j >= i} m_j e^{-(j - i) h} for non-negative m (h > 0).

    Blocks of L points with L h <= 30: inside a block, weights e^{-(j - s) h} >= e^{-30}
    (s the block start) turn the sum into a right-to-left cumulative sum of non-negative
    terms, divided back by the weight at i; each block then adds the next block's total,
    decayed over the gap.  All terms are non-negative, so the relative error is at most
    about L units of round-off, as for a plain right-to-left recursion (plus log2 of the
    number of blocks where their carries are a doubling scan); masses below
    ~1e-295 may underflow inside a block (they are below anything certified downstream).
    Replaces ``scipy.signal.lfilter``, whose import cost ~0.8 s of every command's start-up.
    """
    m = np.asarray(m, dtype=float)
    n = m.size
    if n == 0:
        return m.copy()
    L = max(1, min(n, int(30.0 / h)))
    nb = -(-n // L)
    M = np.zeros(nb * L)
    M[:n] = m
    M = M.reshape(nb, L)
    w = _block_weights(float(h), L)                          # e^{-(j - s) h}
    local = np.cumsum((M * w)[:, ::-1], axis=1)[:, ::-1] / w  # sums inside each block
    if nb > _SCAN_FROM:
        # many blocks (coarse grids: L h ~ 30 with L small): the block starts' tail sums
        # c_k = a_k + r c_{k+1}, r = e^{-L h}, by a doubling scan (log2(nb) vector steps of
        # non-negative terms) instead of a Python loop over the blocks
        r = math.exp(-L * h)
        c = local[:, 0].copy()
        step, rs = 1, r
        while step < nb and rs > 0.0:
            c[:-step] += rs * c[step:]  # (the right side is evaluated before the update)
            step, rs = 2 * step, rs * rs
        gap = math.exp(-h) * w[::-1]                         # e^{-(s_next - i) h}
        local[:-1] += gap[None, :] * c[1:, None]
    elif nb > 1:
        gap = math.exp(-h) * w[::-1]                         # e^{-(s_next - i) h}
        carry = 0.0
        for k in range(nb - 1, -1, -1):
            if carry:
                local[k] += gap * carry
            carry = local[k, 0]
    return local.reshape(-1)[:n].copy()


#: from this many blocks on, the blocks' carries are a vectorised doubling scan
_SCAN_FROM = 256


@dataclass(frozen=True)
class GridMeasure:
    """A non-negative measure on the grid ``(start + i) * h + shift`` plus a constant ``const``.

    ``curve(eps) = const + sum_i m_i (1 - e^{eps - eps_i})_+``.  For a PLD the
    constant is the +inf mass; for certified bounds it also carries tail terms.
    ``shift`` (0 except for compositions of offset-lattice PLDs, docs/MATH.md 3.2) moves
    every grid point by the same amount.
    """

    h: float
    start: int
    masses: np.ndarray
    const: float = 0.0
    shift: float = 0.0

    @property
    def eps_grid(self) -> np.ndarray:
        return (self.start + np.arange(self.masses.size)) * self.h + self.shift

    def _tails(self):
        return self._table[1], self._table[2]

    @cached_property
    def _table(self):
        """(grid, A, B, D) computed once per measure (the masses are never modified):
        A, B are the right tail sums with a trailing 0 appended, D the curve at the grid
        points, made non-increasing."""
        m = np.maximum(self.masses, 0.0)
        n = m.size
        # A_i = sum_{j>=i} m_j ; B_i = sum_{j>=i} m_j e^{-(j-i)h}  (right-to-left filters)
        A = np.zeros(n + 1)
        B = np.zeros(n + 1)
        A[:n] = np.cumsum(m[::-1])[::-1]
        B[:n] = _discounted_tail_sums(m, self.h)
        # curve at grid points: D_i = const + A_{i+1} - e^{-h} B_{i+1}
        D = self.const + A[1:] - np.exp(-self.h) * B[1:]
        D = np.minimum.accumulate(np.maximum(D, 0.0))  # enforce monotone in float
        grid = (self.start + np.arange(n)) * self.h + self.shift
        return grid, A[:n], B[:n], D, A, B

    def delta(self, eps) -> np.ndarray:
        """curve(eps), vectorised over eps."""
        eps = np.asarray(eps, dtype=float)
        grid, _, _, _, A, B = self._table
        # i = first grid index with eps_i > eps
        i = np.searchsorted(grid, eps, side="right")
        end = np.where(i < grid.size, grid[np.minimum(i, grid.size - 1)], 0.0)
        with np.errstate(over="ignore", invalid="ignore"):
            val = self.const + A[i] - np.exp(eps - end) * B[i]
        val = np.where(i >= grid.size, self.const, val)
        return np.maximum(val, 0.0)

    def delta_at_few(self, eps) -> np.ndarray:
        """curve(eps) for a few eps without building the answer table (one pass over the
        masses right of each eps instead of the table's ~15 over all of them): the same curve as
        :meth:`delta`, summed as non-negative terms m_i (1 - e^{eps - eps_i}) (no cancellation;
        it may differ from :meth:`delta` in the last ~1e-13 relative).
        For diagnostics (the round-off share of a composition); uses the table if it is built."""
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        if "_table" in self.__dict__ or eps.size > 4:
            return self.delta(eps)
        m = self.masses
        n = m.size
        out = np.empty(eps.shape)
        for j, e in enumerate(eps.ravel()):
            if not np.isfinite(e):  # +inf: the constant; -inf: every mass (1 - 0); NaN: delta's answer
                out.flat[j] = (self.const if e > 0 else self.const + float(np.maximum(m, 0.0).sum()) if e < 0
                               else self.delta(np.array([e]))[0])
                continue
            # first index with eps_i > e (as np.searchsorted(grid, e, side="right"))
            i0 = self._first_above(e)
            tail = np.maximum(m[i0:], 0.0)
            with np.errstate(over="ignore", under="ignore"):
                # 1 - e^{e - eps_i} in (0, 1] by expm1: a sum of non-negative terms, no cancellation
                w = -np.expm1(e - ((self.start + i0 + np.arange(tail.size)) * self.h + self.shift))
            out.flat[j] = max(self.const + float(np.dot(tail, w)), 0.0)
        return out

    def _first_above(self, e: float) -> int:
        """First index i with (start + i) h + shift > e, as searchsorted on the grid would give."""
        n = self.masses.size
        guess = int(math.floor((e - self.shift) / self.h)) - self.start - 2
        i = min(max(guess, 0), n)
        # step to the exact first index (the guess is within a few of it)
        while i > 0 and (self.start + i - 1) * self.h + self.shift > e:
            i -= 1
        while i < n and (self.start + i) * self.h + self.shift <= e:
            i += 1
        return i

    def epsilon(self, delta) -> np.ndarray:
        """inf{eps : curve(eps) <= delta}, exact per segment, vectorised over delta.

        Returns +inf where curve never drops to delta (const > delta) and
        -inf where it is below delta everywhere.
        """
        delta = np.asarray(delta, dtype=float)
        grid, A, B, D, _, _ = self._table
        n = grid.size
        # first index with D_i <= delta
        i = np.searchsorted(-D, -delta, side="left")
        out = np.full(delta.shape, np.inf)
        ok = i < n
        ii = np.minimum(i, n - 1)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            num = self.const + A[ii] - delta
            val = grid[ii] + np.log(num / B[ii])
        val = np.where(num <= 0, -np.inf, val)
        val = np.minimum(val, grid[ii])
        # segments are (eps_{i-1}, eps_i]: the solution cannot lie left of eps_{i-1}
        val = np.where(ii > 0, np.maximum(val, grid[ii] - self.h), val)
        out = np.where(ok, val, out)
        out = np.where(ok & (B[ii] <= 0), grid[ii], out)
        return out


@dataclass(frozen=True)
class DiscretePLD:
    """A discrete privacy loss distribution: masses on ``(start + i) * h + shift`` and ``p_inf``.

    ``pessimistic`` says on which side of the true profile this PLD was built
    (True: its curve is >= the truth everywhere; False: <= the truth), up to the
    per-mass round-off bound ``mass_err`` that composition accounts for.  ``shift`` is
    the offset of the lattice (0 except for optimistic PLDs on an offset lattice,
    docs/MATH.md 3.2); composition adds the shifts of its factors.
    """

    h: float
    start: int
    masses: np.ndarray
    p_inf: float
    pessimistic: bool
    #: bound on the absolute floating-point error of each mass (None: exact)
    mass_err: np.ndarray | None = None
    shift: float = 0.0

    @property
    def eps_grid(self) -> np.ndarray:
        return (self.start + np.arange(self.masses.size)) * self.h + self.shift

    @property
    def size(self) -> int:
        return int(self.masses.size)

    def total_mass(self) -> float:
        return float(self.masses.sum() + self.p_inf)

    def measure(self) -> GridMeasure:
        return GridMeasure(self.h, self.start, self.masses, self.p_inf, self.shift)

    def delta(self, eps) -> np.ndarray:
        """Hockey-stick curve of this PLD at eps (vectorised)."""
        return self.measure().delta(eps)

    def epsilon(self, delta) -> np.ndarray:
        """Smallest eps with delta(eps) <= delta (vectorised, exact per segment)."""
        return self.measure().epsilon(delta)

    def log_mgf(self, theta) -> np.ndarray:
        """ln sum_i m_i e^{theta eps_i} (finite part), vectorised over theta."""
        theta = np.atleast_1d(np.asarray(theta, dtype=float))
        logm = np.log(np.where(self.masses > 0, self.masses, 1.0))
        logm = np.where(self.masses > 0, logm, -np.inf)
        e = self.eps_grid
        z = logm[None, :] + theta[:, None] * e[None, :]
        zmax = np.max(z, axis=1, keepdims=True)
        return (zmax[:, 0] + np.log(np.sum(np.exp(z - zmax), axis=1)))

    def moments(self) -> tuple[float, float]:
        """Mean and variance of the finite part of L under P (normalised)."""
        m = self.masses
        tot = m.sum()
        e = self.eps_grid
        mean = float((m * e).sum() / tot)
        var = float((m * (e - mean) ** 2).sum() / tot)
        return mean, var
