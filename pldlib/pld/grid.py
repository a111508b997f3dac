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


def nonnegative(measure: "GridMeasure") -> "GridMeasure":
    """``measure``, marked as having no negative (or NaN) mass, which its maker guarantees (a
    composition's masses are products of non-negative numbers, capped): its readers then use
    its masses as they are, without a pass to check them."""
    object.__setattr__(measure, "_nonneg_known", True)
    return measure


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

    def _nonneg(self) -> np.ndarray:
        """The masses with negative ones raised to 0: the array itself when it has none (a
        composition's measures: no copy of the window, and no search when :func:`nonnegative`
        marked it so), else a copy."""
        m = self.masses
        if self.__dict__.get("_nonneg_known") or m.size == 0 or float(np.min(m)) >= 0.0:
            return m
        return np.maximum(m, 0.0)

    def _tails(self):
        return self._table[1], self._table[2]

    @cached_property
    def _table(self):
        """(grid, A, B, D) computed once per measure (the masses are never modified):
        A, B are the right tail sums with a trailing 0 appended, D the curve at the grid
        points, made non-increasing."""
        m = self._nonneg()
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

    @cached_property
    def _blocks(self):
        """(L, m, A, B): the masses (made non-negative) and their tail sums A_i, B_i at the block
        starts i = b L (with a trailing 0; b = 0 .. nb), from one pass of block sums: a few
        answers are read off these and one block (:meth:`_near`) instead of the whole table."""
        m = self._nonneg()
        n = m.size
        L = max(1, min(_FEW_BLOCK, int(30.0 / self.h), n))
        nb = -(-n // L)
        full = n // L
        sums = np.zeros((nb, 2))
        w2 = np.empty((L, 2))
        w2[:, 0] = 1.0
        w2[:, 1] = _block_weights(float(self.h), L)  # e^{-(j - s) h} inside a block
        if full:
            sums[:full] = m[: full * L].reshape(full, L) @ w2
        if full < nb:
            r = m[full * L :]
            sums[full] = r @ w2[: r.size]
        A = np.zeros(nb + 1)
        A[:nb] = np.cumsum(sums[::-1, 0])[::-1]
        # B at the block starts: C_b = U_b + e^{-L h} C_{b+1}, the same recursion one level up
        B = np.zeros(nb + 1)
        B[:nb] = _discounted_tail_sums(sums[:, 1], L * self.h)
        return L, m, A, B

    def _near(self, b: int):
        """(lo, grid, A, B, D) on the indices lo = b L .. hi of block b, hi the next block's start
        (included when it is on the grid): A, B from that block and the tail sums at hi."""
        L, m, Ab, Bb = self._blocks
        n = m.size
        lo, hi = b * L, min(b * L + L, n)
        mb = m[lo:hi]
        w = _block_weights(float(self.h), L)[: hi - lo]
        A = np.cumsum(mb[::-1])[::-1] + Ab[b + 1]
        # B_i = sum_{i <= j < hi} m_j e^{-(j - i) h} + e^{-(hi - i) h} B_hi
        B = (np.cumsum((mb * w)[::-1])[::-1] + Bb[b + 1] * math.exp(-(hi - lo) * self.h)) / w
        if hi < n:
            A, B = np.append(A, Ab[b + 1]), np.append(B, Bb[b + 1])
        # the curve at a grid point: c + A_i - B_i (the mass at eps_i itself weighs 0)
        D = np.maximum(self.const + A - B, 0.0)
        if hi == n:
            D[-1] = max(self.const, 0.0)  # (nothing lies right of the last point)
        grid = (self.start + np.arange(lo, lo + A.size)) * self.h + self.shift
        return lo, grid, A, B, D

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
        """curve(eps) for a few eps without building the answer table: on grids of _FEW_FROM
        points or more from the block tail sums (:meth:`_delta_few`, two passes), on smaller ones
        summed as non-negative terms m_i (1 - e^{eps - eps_i}) (no cancellation).  The same curve
        as :meth:`delta`, up to ~1e-13 relative.
        For diagnostics (the round-off share of a composition); uses the table if it is built."""
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        if "_table" in self.__dict__ or eps.size > 4:
            return self.delta(eps)
        m = self.masses
        n = m.size
        if n >= _FEW_FROM and np.all(np.isfinite(eps)):
            return self._delta_few(eps)
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
        if (delta.size <= _FEW and "_table" not in self.__dict__ and self.masses.size >= _FEW_FROM
                and np.all(np.isfinite(delta)) and np.all(delta >= 0)):
            return self._epsilon_few(delta)
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
        # no mass at or right of eps_i: the curve there is c + A_i, above delta (the answer is
        # eps_i) or not (then the formula's -inf, or eps_{i-1}: a measure with no mass at all
        # has the constant curve c <= delta, whose answer is -inf, never its first grid point)
        out = np.where(ok & (B[ii] <= 0) & (num > 0), grid[ii], out)
        return out

    def _delta_few(self, eps: np.ndarray) -> np.ndarray:
        """:meth:`delta` at a few finite eps from the block tail sums and one block each (the
        same segment formula c + A_i - e^{eps - eps_i} B_i as the table's)."""
        L, m, _, _ = self._blocks
        n = m.size
        out = np.empty(eps.shape)
        for k, e in enumerate(eps.ravel()):
            i = self._first_above(float(e))
            if i >= n:
                out.flat[k] = self.const
                continue
            lo, grid, A, B, _ = self._near(i // L)
            j = i - lo
            with np.errstate(over="ignore", invalid="ignore"):
                out.flat[k] = max(self.const + A[j] - math.exp(min(float(e) - grid[j], 0.0)) * B[j], 0.0)
        return out

    def _epsilon_few(self, delta: np.ndarray) -> np.ndarray:
        """:meth:`epsilon` for a few finite deltas without the table: the curve at the block
        starts (c + A_i - B_i, made non-increasing) finds the block that holds each answer's
        segment, and that block's table alone gives it, by the same segment formula."""
        L, m, Ab, Bb = self._blocks
        nb = Ab.size - 1
        Ds = np.minimum.accumulate(np.maximum(self.const + Ab[:nb] - Bb[:nb], 0.0))
        out = np.empty(delta.shape)
        for k, d in enumerate(delta.ravel()):
            b = int(np.searchsorted(-Ds, -d, side="left"))  # first block start with curve <= d
            lo, grid, A, B, D = self._near(max(b - 1, 0))
            if b > 0:  # (the curve left of this block is above d)
                D = np.minimum.accumulate(np.minimum(D, Ds[b - 1]))
            i = int(np.searchsorted(-D, -d, side="left"))
            if i >= D.size:
                out.flat[k] = np.inf  # past the last grid point: the curve stays at c > d
                continue
            num = self.const + A[i] - d
            if B[i] <= 0 and num > 0:  # (as in epsilon: no mass from here on, the curve above d)
                val = grid[i]
            else:
                val = grid[i] + math.log(num / B[i]) if num > 0 else -np.inf
                val = min(val, grid[i])
                if lo + i > 0:
                    val = max(val, grid[i] - self.h)
            out.flat[k] = val
        return out


#: answers for at most this many deltas are read without the table, on grids of at least _FEW_FROM points
_FEW = 4
_FEW_FROM = 4096
#: block length of that read (at most 30 / h)
_FEW_BLOCK = 512


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

    def coarsened(self, factor: int) -> "DiscretePLD":
        """Connect-the-dots of this PLD's own curve on the lattice of spacing ``factor * h``
        (same shift; docs/MATH.md 3.1): an atom at a + o h (a a coarse point, 0 <= o < factor)
        keeps its P- and Q-mass by sending (1 - e^{-o h}) / (1 - e^{-factor h}) of it to
        a + factor h and the rest to a, so the new curve equals this one at the coarse points
        and lies above it in between.  Round-off of the split is not tracked (``mass_err`` is
        None): an input of estimates (e.g. of a tilt), never of a certified bound."""
        factor = int(factor)
        h, m = self.h, self.masses
        k0 = self.start // factor
        pad = self.start - k0 * factor
        nb = -(-(m.size + pad) // factor)
        buf = np.zeros(nb * factor)
        buf[pad:pad + m.size] = m
        blocks = buf.reshape(nb, factor)
        right = blocks @ (np.expm1(-h * np.arange(factor)) / math.expm1(-h * factor))
        out = np.zeros(nb + 1)
        out[:-1] = blocks.sum(axis=1) - right
        out[1:] += right
        return DiscretePLD(h=factor * h, start=k0, masses=np.maximum(out, 0.0), p_inf=self.p_inf,
                           pessimistic=self.pessimistic, mass_err=None, shift=self.shift)

    def moments(self) -> tuple[float, float]:
        """Mean and variance of the finite part of L under P (normalised)."""
        m = self.masses
        tot = m.sum()
        e = self.eps_grid
        mean = float((m * e).sum() / tot)
        var = float((m * (e - mean) ** 2).sum() / tot)
        return mean, var
