"""FFT composition of discrete PLDs with certified error terms (docs/MATH.md section 4).

Composition of PLDs on one grid spacing h is convolution of their mass arrays.
``compose`` computes a product of k-fold self-compositions (heterogeneous
sequences included) with one forward FFT per distinct PLD, one elementwise
power/product and one inverse FFT, under three safeguards:

* **Exponential tilting.** Masses are tilted, m_i -> m_i e^{theta eps_i} / M(theta),
  which commutes with convolution; choosing theta so that the tilted sum is
  centred at the epsilon of interest makes that region the bulk of the FFT
  output, where its relative accuracy is good (small deltas stay certified).
* **Windows from Chernoff bounds.** The output window is chosen so that the
  tilted mass outside it is below ``alias_tol`` by a Chernoff bound computed
  from the exact CGFs of the discrete PLDs.  Mass outside the window folds
  into it (circular convolution) only as non-negative extra mass, which is
  harmless for the upper bound; for the lower bound it is subtracted through
  the certified term ``alias_log_bound``; mass beyond the right edge is added
  to the constant of the upper curve.
* **Round-off bounds.** A standard FFT error bound (Higham 2002, section 24.1,
  with a conservative constant) plus the error of the power gives an
  entrywise bound ``E`` on the tilted output; the upper curve uses
  ``y + E``, the lower ``max(y - E, 0)``.

The result is a pair of :class:`~pldlib.pld.GridMeasure` curves (upper, lower)
valid for every eps >= ``valid_from``.
"""
from __future__ import annotations

import functools
import math
import os
import threading
from dataclasses import dataclass

import numpy as np
import scipy.fft as sfft

from .. import _deadline
from .._validate import GridTooLargeError, PrecisionLimitError  # noqa: F401  (re-exported)


class UntiltError(PrecisionLimitError, ValueError):
    """The tilt is too large for float-accurate untilting (a documented precision limit;
    still a ValueError for callers that caught the former ValueError)."""
from .grid import DiscretePLD, GridMeasure, nonnegative

__all__ = ["compose", "Composition", "DEFAULT_ALIAS_TOL", "DEFAULT_MAX_BINS", "GridTooLargeError"]

_U = np.finfo(float).eps / 2
_BELOW_ONE = math.nextafter(1.0, 0.0)  # the largest double below 1
DEFAULT_ALIAS_TOL = 1e-30
DEFAULT_MAX_BINS = 2**25



@dataclass(frozen=True)
class Composition:
    """Certified result of a composition.

    ``upper`` and ``lower`` are curves such that for every eps >= valid_from
    (``lower`` is None, and ``alias_log_bound`` +inf, for a pessimistic-only composition):
    lower.delta(eps) - exp(alias_log_bound - theta * max(eps, valid_from))
    <= true delta(eps) <= upper.delta(eps).
    ``roundoff`` is the part of ``upper`` due to the round-off term (for
    diagnostics and for deciding whether to re-tilt): block-l2 masses where they are
    smaller than the entrywise allowance (see :func:`upper_masses`).
    """

    upper: GridMeasure
    lower: GridMeasure | None
    roundoff: GridMeasure
    theta: float
    valid_from: float
    alias_log_bound: float
    n_bins: int
    #: bound on the 2-norm of the FFT error of the tilted upper-side output (docs/MATH.md 4.4)
    roundoff_l2: float = math.nan

    def alias_term(self, eps) -> np.ndarray:
        if self.alias_log_bound == -np.inf:
            return np.zeros(np.shape(eps))
        eps = np.maximum(np.asarray(eps, dtype=float), self.valid_from)
        with np.errstate(under="ignore", over="ignore", invalid="ignore"):
            out = np.exp(self.alias_log_bound - self.theta * eps)
        return np.where(np.isnan(out), np.inf, out)  # unknown -> no lower-bound credit


class BlockRoundoff(GridMeasure):
    """The round-off part of a composition's upper curve where every block of B points took the
    block form (:func:`upper_masses`): masses r_b at the blocks' last points, zero elsewhere.
    :meth:`delta_at_few` sums the few r_b terms directly; the masses as an array of the window's
    size (what :class:`GridMeasure` holds) are written out only when something asks for them."""

    def __init__(self, h: float, start: int, n: int, last: np.ndarray, r: np.ndarray, shift: float = 0.0):
        for k, v in (("h", h), ("start", start), ("const", 0.0), ("shift", shift), ("_n", int(n)),
                     ("_last", last), ("_r", r)):
            object.__setattr__(self, k, v)

    def __getattr__(self, name):
        if name != "masses" or "_r" not in self.__dict__:
            raise AttributeError(name)
        m = np.zeros(self._n)
        m[self._last] = self._r
        object.__setattr__(self, "masses", m)
        return m

    def delta_at_few(self, eps) -> np.ndarray:
        """curve(eps) = sum_b r_b (1 - e^{eps - eps_b})_+, summed as non-negative terms."""
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        if "masses" in self.__dict__ or not np.all(np.isfinite(eps)):
            return super().delta_at_few(eps)
        pts = (self.start + self._last) * self.h + self.shift
        with np.errstate(over="ignore", under="ignore"):
            g = np.maximum(-np.expm1(eps.reshape(-1, 1) - pts), 0.0)
        return (g @ self._r).reshape(eps.shape) + self.const


def _logsumexp_rows(z: np.ndarray) -> np.ndarray:
    zmax = np.max(z, axis=-1, keepdims=True)
    zmax = np.where(np.isfinite(zmax), zmax, 0.0)
    t = z - zmax
    np.exp(t, out=t)  # (in place: one array of z's size, not two)
    with np.errstate(divide="ignore"):
        return zmax[..., 0] + np.log(np.sum(t, axis=-1))


#: block size of the coarse (block-aggregated) view of a side used to skip negligible terms
_BLOCK = 64
#: terms whose total is below e^-_NEGLIGIBLE_LOG times the whole are bounded, not summed
_NEGLIGIBLE_LOG = 50.0
#: sides with at most this many points are summed in full (finding windows costs more: a full
#: pass over 4,485 / 8,969 points took 89 / 177 us at theta 2.6, the windowed one 220 / 348 us;
#: windows pay on long sides at large tilts, e.g. 1.3 ms instead of 7 ms on 466,578 points at
#: theta 30)
_WINDOW_MIN = 256 * _BLOCK
#: ... and :meth:`_Side.log_mgf_upper` takes all its rows over the whole side at once (grouped by
#: block size) up to this many points: 24 Chernoff slopes on 35,870 / 96,458 points took 0.5 /
#: 0.8 ms so, 3-5 ms row by row in windows; on 145,216 / 289,260 points 0.8 / 1.5 ms, against
#: 7 / 8.5 ms in windows (at tilts 2.6 and 30 alike)
_PRODUCT_ALL_MAX = 2**22
#: the product form of :meth:`_Side.log_mgf_upper`: blocks of at most this many points ...
_PRODUCT_BLOCK = 256
#: ... and at least this many (smaller: the log-sum-exp path) ...
_PRODUCT_MIN = 8
#: ... on sides of at least this many points (on fewer, the log-sum-exp path is as fast)
_PRODUCT_FROM = 1024


def _product_sums(m: np.ndarray, starts: np.ndarray, h: float, t: np.ndarray, c: np.ndarray, B: int,
                  scale: bool = True):
    """(S, x): S_r = sum_i m_i e^{t_r eps_i - c_r} over the lattice segment m (its block starts'
    eps in ``starts``, blocks of B points, |t_r| h B <= 50) in the product form of
    :meth:`_Side.log_mgf_upper`, and x, the largest |e_b| ln 2 of the block scalings.

    With ``scale``, each block's masses are scaled by 2^-e_b (exact), e_b the binary exponent of
    the block's largest mass, so the block's largest scaled mass is in [1/2, 1) and, with g_k >=
    e^-50, no product that matters underflows (a product below the smallest normal number is
    < 2^-1022 of the block's largest term times e^50: relative 1e-284) and no mass is subnormal
    when it enters the matrix product (where flush-to-zero could drop it).  The block factor is
    e^{t eps_b - c + e_b ln 2}; blocks without mass get 0.  e_b ln 2 carries a rounding of
    |e_b| ln 2 u, which the caller's allowance covers through x.  Without ``scale`` (every
    non-zero mass of the segment is at least 1e-250, so every product with g is at least 1e-272,
    a normal number) e_b = 0 and the masses are not copied."""
    L = m.size
    nb = -(-L // B)
    bmax = None
    if scale:
        Mb = np.zeros(nb * B)
        Mb[:L] = m
        Mb = Mb.reshape(nb, B)
        bmax = Mb.max(axis=1)
        e = np.frexp(bmax)[1]
        Ms = np.ldexp(Mb, -e[:, None])
    else:
        Ms = None
        e = np.zeros(nb, dtype=np.int64)
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        # G[k] = e^{t h k} = e^{t h 16 a} e^{t h j} for k = 16 a + j (two roundings more)
        a16 = np.exp(np.multiply.outer(16.0 * h * np.arange(-(-B // 16)), t))
        G = (a16[:, None, :] * np.exp(np.multiply.outer(h * np.arange(min(B, 16)), t))[None, :, :]
             ).reshape(-1, t.size)[:B]                                                  # (B, r)
        xe = e * _LN2
        expo = t[:, None] * starts[None, :nb] - c[:, None] + xe[None, :]
        if bmax is not None:
            expo = np.where(bmax[None, :] > 0, expo, -np.inf)
        F = np.exp(expo)                                                                # (r, nb)
        if Ms is not None:
            P = Ms @ G
        else:  # (full blocks as a view of m, the last, partial one on its own: no copy of m)
            full = L // B
            P = m[: full * B].reshape(full, B) @ G
            if full < nb:
                P = np.concatenate([P, (m[full * B :] @ G[: L - full * B])[None, :]])
        S = np.einsum("rb,br->r", F, P)
    return S, float(np.max(np.abs(xe))) if xe.size else 0.0


_LN2 = math.log(2.0)
#: masses below e^_TINY_LOG (~1e-250) make :func:`_product_sums` scale their blocks
_TINY_LOG = -575.0
#: a block factor of :func:`_product_sums` that underflows (to 0 or a subnormal number) is off by
#: at most 2^-1075 absolute, times its block's products (each scaled mass < 1, g <= e^50): at most
#: 2^-1075 e^50 = 1.28e-302 per term, a relative 1.28e-102 per term of any sum S >= 1e-200
_UNDERFLOW_PER_TERM = 1.3e-102


class _Side:
    """One measure (masses + p_inf) to be composed ``count`` times.

    ``log_mgf`` and the tilted moments are evaluated exactly only over the
    window of blocks that can matter at the given theta: each block of
    ``_BLOCK`` points has its mass between e^{theta * (left end)} and
    e^{theta * (right end)} times its untilted mass, and blocks whose upper bound
    is below e^-50 of a lower bound of the total are added through that upper
    bound.  ``log_mgf`` therefore never understates ln M(theta) (beyond the
    round-off of a log-sum-exp) and overstates it by at most ~e^-50 relative.
    Each theta gets its own window (a large tilt concentrates the sum on a few
    blocks).

    Sides made by :meth:`of` share their arrays and their per-theta values
    (ln M(theta), tilted moments: they do not depend on ``count``) with every
    other side of the same single-step PLD, so the many compositions of one
    discretisation (one per steps count and tilt) do not recompute them.
    """

    def __init__(self, h: float, start: int, masses: np.ndarray, count: int):
        self.h = h
        self.start = start
        self.masses = masses
        self.count = count
        # ((start + i) h: the integers are exact as floats; each array made once, then in place)
        self.eps = np.arange(start, start + masses.size, dtype=float)
        self.eps *= h
        # ln m where m > 0, -inf elsewhere (fmax sends negative and NaN masses to 0)
        self.logm = np.fmax(masses, 0.0)
        with np.errstate(divide="ignore"):
            np.log(self.logm, out=self.logm)
        self._blocks = None
        self._lmgf: dict = {}   # theta -> ln M(theta) (windowed upper bound)
        self._mom: dict = {}    # theta -> (mean, variance) of the tilted step

    @classmethod
    def of(cls, pld, count: int, kind: str = "raw") -> "_Side":
        """The side of ``pld`` (``kind``: "raw" masses, "up" = masses + mass_err, "lo" =
        max(masses - mass_err, 0)) composed ``count`` times; its arrays and per-theta
        caches are kept on ``pld`` and shared."""
        if pld.mass_err is None:
            kind = "raw"
        cache = pld.__dict__.setdefault("_sides", {})
        base = cache.get(kind)
        if base is None:
            m = pld.masses
            if kind == "up" and pld.mass_err is not None:
                m = m + pld.mass_err
            elif kind == "lo" and pld.mass_err is not None:
                m = np.maximum(m - pld.mass_err, 0.0)
            base = cls(pld.h, pld.start, m, 0)
            base._coarse()  # computed once, shared
            base.tail_mass(0)
            base._cuts = {}
            cache[kind] = base
        new = object.__new__(cls)
        new.__dict__.update(base.__dict__)
        new.count = int(count)
        return new

    def _block_tails(self) -> np.ndarray:
        """Right-to-left sums of the block sums of :meth:`_coarse` (the masses > 0 only): entry b
        is the mass at indices >= b _BLOCK; a trailing 0."""
        rc = self.__dict__.get("_rcb")
        if rc is None:
            self._coarse()
            s = self._bsum
            rc = np.zeros(s.size + 1)
            np.cumsum(s[::-1], out=rc[s.size - 1::-1] if s.size else rc[:0])  # (in place)
            self._rcb = rc
        return rc

    def tail_mass(self, n: int) -> float:
        """sum of the masses at indices >= n (rounded up: the allowance 4 u size covers the block
        sums and their right-to-left sums, at most _BLOCK + size / _BLOCK terms deep; n a multiple
        of the block size, as :meth:`cut_index` gives, reads them, any other n sums its tail)."""
        up = 1.0 + 4.0 * _U * max(self.masses.size, 1)
        if n >= self.masses.size:
            return 0.0
        if n % _BLOCK:
            return float(np.sum(np.fmax(self.masses[n:], 0.0))) * up
        return float(self._block_tails()[n // _BLOCK]) * up

    def cut_index(self, log_thr: float) -> int:
        """Smallest n, a multiple of the block size, with tail_mass(n) <= e^log_thr (the size if none)."""
        rc = self._block_tails()
        with np.errstate(divide="ignore"):
            thr = math.exp(log_thr) / (1.0 + 4.0 * _U * max(self.masses.size, 1)) if log_thr < 700 else math.inf
        # rc is non-increasing: the first block start with rc <= thr
        n = int(np.searchsorted(-rc, -thr, side="left")) * _BLOCK
        return min(max(n, _BLOCK), self.masses.size)

    def cut(self, n: int) -> "_Side":
        """This side with its masses at indices >= n removed (same count); cached per n."""
        if n >= self.masses.size:
            return self
        cuts = self.__dict__.setdefault("_cuts", {})
        base = cuts.get(n)
        if base is None:
            base = object.__new__(_Side)
            base.h, base.start, base.count = self.h, self.start, 0
            base.masses, base.eps, base.logm = self.masses[:n], self.eps[:n], self.logm[:n]
            lb, e_lo, e_hi = self._coarse()
            nb = n // _BLOCK  # n is a multiple of the block size
            base._blocks = (lb[:nb], e_lo[:nb], e_hi[:nb])
            base._tiny = self._tiny[:nb]
            base._bsum = self._bsum[:nb]
            base._lmgf, base._mom = {}, {}
            cuts[n] = base
        new = object.__new__(_Side)
        new.__dict__.update(base.__dict__)
        new.count = self.count
        return new

    def _coarse(self):
        if self._blocks is None:
            n = self.logm.size
            nb = -(-n // _BLOCK)
            full = n // _BLOCK
            # ln of each block's mass: the log of its plain sum (the masses are at most 1, so no
            # sum overflows; the rounding is that of a log-sum-exp, u per term), the masses m > 0
            # only (those whose log is finite; fmax sends the others to 0)
            m = self.masses
            if m.size and not float(np.min(m)) >= 0.0:
                m = np.fmax(m, 0.0)
            sums = np.empty(nb)
            if full:
                np.sum(m[: full * _BLOCK].reshape(full, _BLOCK), axis=1, out=sums[:full])
            if full < nb:
                sums[full] = np.sum(m[full * _BLOCK:])
            self._bsum = sums
            with np.errstate(divide="ignore"):
                lb = np.log(sums)
            first = np.arange(nb) * _BLOCK
            last = np.minimum(first + _BLOCK - 1, n - 1)
            self._blocks = (lb, self.eps[first], self.eps[last])
            # blocks holding a mass in (0, 1e-250) (the product form scales those: _product_sums),
            # the whole blocks as a view of logm, the last, partial one on its own
            z = self.logm
            tiny = (z < _TINY_LOG) & (z > -np.inf)
            self._tiny = np.empty(nb, dtype=bool)
            np.any(tiny[: full * _BLOCK].reshape(full, _BLOCK), axis=1, out=self._tiny[:full])
            if full < nb:
                self._tiny[full] = tiny[full * _BLOCK:].any()
        return self._blocks

    def _row_windows(self, theta: np.ndarray):
        """(i0, i1, log_rest), arrays over theta: the terms [i0[j], i1[j]) are summed exactly
        at theta[j]; the others sum to at most e^log_rest[j] there."""
        n = self.logm.size
        T = theta.size
        full = (np.zeros(T, dtype=np.int64), np.full(T, n, dtype=np.int64), np.full(T, -np.inf))
        if n <= _WINDOW_MIN or not np.all(np.isfinite(theta)):
            return full
        lb, e_lo, e_hi = self._coarse()
        pos = theta[:, None] >= 0
        with np.errstate(invalid="ignore"):
            ub = lb[None, :] + theta[:, None] * np.where(pos, e_hi[None, :], e_lo[None, :])
            lo = lb[None, :] + theta[:, None] * np.where(pos, e_lo[None, :], e_hi[None, :])
        ub = np.where(np.isnan(ub), -np.inf, ub)
        lo = np.where(np.isnan(lo), -np.inf, lo)
        total_lo = _logsumexp_rows(lo)
        if not np.all(np.isfinite(total_lo)):
            return full
        keep = ub >= (total_lo - _NEGLIGIBLE_LOG - math.log(lb.size))[:, None]
        # (the block with the largest lower bound is always kept)
        nb = lb.size
        b0 = np.argmax(keep, axis=1)
        b1 = nb - np.argmax(keep[:, ::-1], axis=1)
        cols = np.arange(nb)[None, :]
        ub = np.where((cols >= b0[:, None]) & (cols < b1[:, None]), -np.inf, ub)
        return b0 * _BLOCK, np.minimum(b1 * _BLOCK, n), _logsumexp_rows(ub)

    def _windows(self, theta: np.ndarray):
        """(i0, i1, log_rest): the union of the per-theta windows; the terms outside it
        sum to at most e^log_rest[j] at theta[j]."""
        i0, i1, _ = self._row_windows(theta)
        a, b = int(i0.min()), int(i1.max())
        if a == 0 and b == self.logm.size:
            return 0, b, np.full(theta.size, -np.inf)
        lb, e_lo, e_hi = self._coarse()
        pos = theta[:, None] >= 0
        with np.errstate(invalid="ignore"):
            ub = lb[None, :] + theta[:, None] * np.where(pos, e_hi[None, :], e_lo[None, :])
        ub = np.where(np.isnan(ub), -np.inf, ub)
        ub[:, a // _BLOCK : -(-b // _BLOCK)] = -np.inf
        return a, b, _logsumexp_rows(ub)

    def _shifted_exps(self, t: float, i0: int, i1: int) -> tuple[float, np.ndarray]:
        """(zmax, e^{z - zmax}) for z = ln m + t eps over [i0, i1) (zmax = 0 if no term is finite)."""
        z = self.eps[i0:i1] * t
        z += self.logm[i0:i1]
        zmax = float(np.max(z)) if z.size else -np.inf
        if not math.isfinite(zmax):
            zmax = 0.0
        z -= zmax
        return zmax, np.exp(z, out=z)

    def _lse_window(self, t: float, i0: int, i1: int) -> float:
        zmax, w = self._shifted_exps(t, i0, i1)
        with np.errstate(divide="ignore"):
            return zmax + float(np.log(np.sum(w)))

    def log_mgf(self, theta) -> np.ndarray:
        theta = np.atleast_1d(np.asarray(theta, dtype=float))
        if theta.size == 1:
            t = float(theta[0])
            hit = self._lmgf.get(t)
            if hit is not None:
                return np.array([hit])
        out = np.empty(theta.size)
        if self.logm.size <= _WINDOW_MIN or not np.all(np.isfinite(theta)):
            rest = np.full(theta.size, -np.inf)
            with np.errstate(invalid="ignore"):
                for j0 in range(0, theta.size, 32):  # bounded memory
                    th = theta[j0 : j0 + 32]
                    out[j0 : j0 + 32] = _logsumexp_rows(self.logm[None, :] + th[:, None] * self.eps[None, :])
        else:
            i0, i1, rest = self._row_windows(theta)
            with np.errstate(invalid="ignore", over="ignore"):
                for j in range(theta.size):
                    out[j] = self._lse_window(float(theta[j]), int(i0[j]), int(i1[j]))
            # the skipped terms enter through their upper bound: never an understatement
            out = np.where(rest > -np.inf, np.logaddexp(out, rest), out)
        if theta.size == 1:
            self._lmgf[float(theta[0])] = float(out[0])
        return out

    def log_mgf_upper(self, theta) -> np.ndarray:
        """ln M(theta_j) rounded up, for many theta at once (Chernoff slopes; docs/MATH.md 4.3).

        Over the whole side (up to _PRODUCT_ALL_MAX points) or each theta's window
        (:meth:`_row_windows`), the terms m_i e^{t eps_i - c} are the
        products f_b g_k of a per-block factor f_b = e^{t eps_{i0 + bB} - c} and a per-offset one
        g_k = e^{t h k} (k < B, B a power of 2 <= 256 with |t| h B <= 50, so g never overflows):
        one exp per block and per offset, and a matrix-vector product, instead of one exp per
        term.  c bounds every term's exponent from above (the 64-point blocks' log-masses at their
        far ends), so no product overflows; blocks holding a mass below 1e-250 are scaled by a
        power of 2 first (:func:`_product_sums`), so no product that matters underflows.  Where
        the sum S is at least 1e-200 the result is c + ln S rounded up by :func:`_lmgf_slack`
        plus 12 u (the product form; docs/MATH.md 4.3) and 1.3e-102 per term summed (block
        factors below the smallest normal number: _UNDERFLOW_PER_TERM); other rows,
        and |t| h > 50/8, take the log-sum-exp path of :meth:`log_mgf` rounded up by the same
        allowance.  Skipped terms enter through their upper bound, as there."""
        theta = np.atleast_1d(np.asarray(theta, dtype=float))
        n = self.logm.size
        if not np.all(np.isfinite(theta)):
            return self.log_mgf(theta)  # (+-inf: no rounding question)
        whole = n <= _PRODUCT_ALL_MAX  # every row over the whole side (else each row's window)
        if whole:
            i0 = np.zeros(theta.size, dtype=np.int64)
            i1 = np.full(theta.size, n, dtype=np.int64)
            rest = np.full(theta.size, -np.inf)
        else:
            i0, i1, rest = self._row_windows(theta)
        lb, e_lo, e_hi = self._coarse()
        h = self.h
        # block sizes: the largest power of 2 <= _PRODUCT_BLOCK with |t| h B <= 50
        with np.errstate(divide="ignore"):
            B = np.minimum(_PRODUCT_BLOCK, 2.0 ** np.floor(np.log2(50.0 / np.maximum(np.abs(theta) * h, 1e-300))))
            if whole:  # (at least 4 blocks)
                B = np.minimum(B, 2.0 ** math.floor(math.log2(max(n / 4.0, 1.0))))
        B = B.astype(np.int64)
        out = np.full(theta.size, np.nan)
        shift = np.zeros(theta.size)  # the exponents' shift c of each row (for the allowance)
        if whole:  # one window for all rows: the rows of one block size together
            with np.errstate(invalid="ignore", over="ignore"):
                cs = np.max(lb[None, :] + theta[:, None] * np.where(theta[:, None] >= 0, e_hi[None, :],
                                                                    e_lo[None, :]), axis=1)
            for Bv in np.unique(B):
                rows = np.nonzero((B == Bv) & np.isfinite(cs))[0]
                Bv = int(Bv)
                if Bv < _PRODUCT_MIN or n < _PRODUCT_FROM or rows.size == 0:
                    continue
                t, c = theta[rows], cs[rows]
                S, xs = _product_sums(self.masses, self.eps[::Bv], h, t, c, Bv, scale=bool(self._tiny.any()))
                ok = (S >= _BATCH_MIN_SUM) & np.isfinite(S)
                with np.errstate(divide="ignore", invalid="ignore"):
                    out[rows[ok]] = c[ok] + np.log(S[ok]) + 12.0 * _U + (n + Bv) * _UNDERFLOW_PER_TERM
                shift[rows] = np.abs(c) + xs
        else:
            for j in range(theta.size):
                t, a, b, Bv = float(theta[j]), int(i0[j]), int(i1[j]), int(B[j])
                if Bv < _PRODUCT_MIN or b - a < 2 * Bv:
                    continue
                ba, bb = a // _BLOCK, -(-b // _BLOCK)
                with np.errstate(invalid="ignore", over="ignore"):
                    c = float(np.max(lb[ba:bb] + t * (e_hi[ba:bb] if t >= 0 else e_lo[ba:bb])))
                if not math.isfinite(c):
                    continue
                S, xs = _product_sums(self.masses[a:b], self.eps[a:b:Bv], h, np.array([t]), np.array([c]), Bv,
                                      scale=bool(self._tiny[ba:bb].any()))
                S = float(S[0])
                if S >= _BATCH_MIN_SUM and math.isfinite(S):
                    out[j] = c + math.log(S) + 12.0 * _U + (b - a + Bv) * _UNDERFLOW_PER_TERM
                    shift[j] = abs(c) + xs
        todo = np.nonzero(np.isnan(out))[0]
        if whole and todo.size:  # the log-sum-exp path, rows together
            with np.errstate(invalid="ignore", over="ignore"):
                out[todo] = _logsumexp_rows(self.logm[None, :] + theta[todo, None] * self.eps[None, :])
            shift[todo] = np.abs(out[todo]) + math.log(max(n, 1))
            todo = todo[:0]
        for j in todo:  # the log-sum-exp path
            a, b = int(i0[j]), int(i1[j])
            with np.errstate(invalid="ignore", over="ignore"):
                out[j] = self._lse_window(float(theta[j]), a, b)
            shift[j] = abs(out[j]) + math.log(max(b - a, 1))  # (>= |its shift|: S is in [1, b - a])
        span = np.maximum(np.abs(self.eps[np.minimum(i0, n - 1)]), np.abs(self.eps[np.maximum(i1 - 1, 0)]))
        fin = np.isfinite(out)
        # the allowance of _lmgf_slack, row by row
        slack = 2.0 * (np.maximum(i1 - i0, 1) + 8) * _U + 4.0 * _U * (shift + np.abs(theta) * span + 1.0)
        out = np.where(fin, out + slack, out)
        return np.where(rest > -np.inf, np.logaddexp(out, rest), out)

    def cgf_moments(self, theta: float) -> tuple[float, float, float]:
        """(ln M(theta), tilted mean, tilted variance) of one step in one pass over one window:
        the very numbers of :meth:`log_mgf` and :meth:`tilted_moments` (the same operations on
        the same terms), which it caches."""
        t = float(theta)
        lm, mom = self._lmgf.get(t), self._mom.get(t)
        if lm is not None and mom is not None:
            return lm, mom[0], mom[1]
        if not math.isfinite(t):
            lm = float(self.log_mgf(t)[0])
            m1, v1 = self.tilted_moments(t)
            return lm, m1, v1
        lm, m1, v1 = self._pass(t)
        self._mom[t] = (m1, v1)
        self._lmgf[t] = lm
        return lm, m1, v1

    def _pass(self, t: float) -> tuple[float, float, float]:
        """(ln M(t), tilted mean, tilted variance) over t's window in one pass: ln M as
        :meth:`log_mgf` computes it (z = ln m + t eps, max, exp(z - max), sum, log: the same
        operations), the moments from the same exps (w = e^{z - max} / sum)."""
        i0, i1, rest = self._row_windows(np.array([t]))
        i0, i1, rest = int(i0[0]), int(i1[0]), float(rest[0])
        e = self.eps[i0:i1]
        zmax, w = self._shifted_exps(t, i0, i1)
        S = np.sum(w)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lse = zmax + float(np.log(S))
            w /= S
            m1 = float(w @ e)
            d = e - m1
            d *= d
            v1 = float(w @ d)
            # (the skipped terms through their upper bound, as log_mgf adds them)
            lm = lse if not rest > -np.inf else float(np.logaddexp(lse, rest))
        return lm, m1, v1

    def tilted_moments(self, theta: float) -> tuple[float, float]:
        """Mean and variance of one step under the theta-tilted measure (negligible terms dropped)."""
        t = float(theta)
        hit = self._mom.get(t)
        if hit is not None:
            return hit
        if not math.isfinite(t):
            i0, i1, _ = self._row_windows(np.array([t]))
            i0, i1 = int(i0[0]), int(i1[0])
            e = self.eps[i0:i1]
            z = self.logm[i0:i1] + t * e
            w = np.exp(z - _logsumexp_rows(z[None, :])[0])
            m1 = float(np.sum(w * e))
            out = self._mom[t] = (m1, float(np.sum(w * (e - m1) ** 2)))
            return out
        lm, m1, v1 = self._pass(t)
        self._lmgf.setdefault(t, lm)
        out = self._mom[t] = (m1, v1)
        return out


#: from this many sides on (schedules), ln M and the tilted moments of all sides are evaluated
#: together: their masses on one lattice, one matrix-vector product per theta (_Batch)
BATCH_FROM = 16
#: sides per block of a batch (neighbours in order of their lattice start share one lattice)
BATCH_BLOCK = 32
#: exponents below this (relative to the largest on a block's lattice) are flushed to 0
_BATCH_FLUSH = -690.0
#: a batch sum below this is not trusted (terms may have been flushed): that side is recomputed alone
_BATCH_MIN_SUM = 1e-200


def _lmgf_slack(n: int, c: float, t: float, eps: np.ndarray) -> float:
    """Round-off allowance of a computed ln M = c + ln S over n terms at tilt t (lattice
    ``eps``): the sum's relative 2 (n + 8) u and the exponents' absolute 4 u (|c| + |t| max|eps|
    + 1) (docs/MATH.md 4.3)."""
    return 2.0 * (n + 8) * _U + 4.0 * _U * (abs(c) + abs(t) * max(abs(float(eps[0])), abs(float(eps[-1]))) + 1.0)


class _Batch:
    """The sides of one composition (one grid spacing h) evaluated together: ln M_m(t) and the
    tilted moments for every side m at once (a matrix-vector product per block of sides and per
    t, instead of one pass per side and t).

    The sides are ordered by their lattice end and split into blocks of BATCH_BLOCK; a
    block's masses sit on one lattice (its union).  For each t a block's exponents t eps_i are
    shifted by their maximum c, so every term m_i e^{t eps_i - c} is at most m_i.  Terms more
    than e^690 below c are flushed to 0; a side whose sum is at least 1e-200 lost at most e^-690
    <= 1e-299 (its masses sum to at most 1), a relative 1e-99, and a sum of non-negative terms
    carries relative round-off at most (L + 8) u (Higham 3.1, exp included): ``log_mgf``
    returns c + ln S rounded up by 2 (L + 8) u plus 4 u (|c| + |t| max|eps| + 1) for the
    exponents' own round-off, or down by as much with ``down=True``.  Other sides (far from
    the block's maximum at large |t|) are recomputed by :meth:`_Side.log_mgf` (exact up to its
    own windowing, never an understatement).
    """

    def __init__(self, sides: list[_Side]):
        self.sides = sides
        order = sorted(range(len(sides)), key=lambda r: (sides[r].start + sides[r].masses.size, sides[r].start))
        self.blocks = []
        for j in range(0, len(order), BATCH_BLOCK):
            rows = np.array(order[j : j + BATCH_BLOCK])
            g0 = min(sides[r].start for r in rows)
            g1 = max(sides[r].start + sides[r].masses.size for r in rows)
            M = np.zeros((rows.size, g1 - g0))
            for i, r in enumerate(rows):
                sd = sides[r]
                M[i, sd.start - g0 : sd.start - g0 + sd.masses.size] = sd.masses
            eps = (g0 + np.arange(g1 - g0)) * sides[0].h
            self.blocks.append((rows, M, eps))
        self._mom: dict = {}

    @staticmethod
    def _weights(t: float, eps: np.ndarray):
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            a = t * eps
            c = float(np.max(a))
            z = a - c
            w = np.where(z > _BATCH_FLUSH, np.exp(np.maximum(z, _BATCH_FLUSH)), 0.0)
        return c, w

    def log_mgf(self, theta, down: bool = False) -> np.ndarray:
        """ln M_m(theta_j) for every side m (rows) and theta_j (columns), rounded up (down)."""
        theta = np.atleast_1d(np.asarray(theta, dtype=float))
        out = np.empty((len(self.sides), theta.size))
        for j, t in enumerate(theta):
            if not math.isfinite(t):
                out[:, j] = [float(sd.log_mgf(t)[0]) for sd in self.sides]
                continue
            for rows, M, eps in self.blocks:
                c, w = self._weights(float(t), eps)
                S = M @ w
                r = _lmgf_slack(eps.size, c, float(t), eps)
                with np.errstate(divide="ignore"):
                    col = c + np.log(np.maximum(S, 1e-300)) + (-r if down else r)
                for i in np.nonzero(~(S >= _BATCH_MIN_SUM))[0]:
                    sd = self.sides[rows[i]]
                    v = float(sd.log_mgf(t)[0])
                    rv = _lmgf_slack(sd.masses.size, v, float(t), sd.eps)
                    col[i] = v - rv if down else v + rv
                out[rows, j] = col
        return out

    def moments(self, theta: float):
        """(means, variances) of one step of each side under the theta-tilted measure."""
        t = float(theta)
        hit = self._mom.get(t)
        if hit is not None:
            return hit
        m_all = np.empty(len(self.sides))
        v_all = np.empty(len(self.sides))
        for rows, M, eps in self.blocks:
            c, w = self._weights(t, eps)
            S0 = M @ w
            with np.errstate(invalid="ignore", divide="ignore"):
                m1 = (M @ (w * eps)) / S0
            ok = S0 >= _BATCH_MIN_SUM
            centre = float(np.mean(m1[ok])) if ok.any() else 0.0
            d = eps - centre
            with np.errstate(invalid="ignore", divide="ignore"):
                v1 = np.maximum((M @ (w * d * d)) / S0 - (m1 - centre) ** 2, 0.0)
            for i in np.nonzero(~ok)[0]:
                m1[i], v1[i] = self.sides[rows[i]].tilted_moments(t)
            m_all[rows], v_all[rows] = m1, v1
        out = self._mom[t] = (m_all, v_all)
        return out


_BATCHES: "collections.OrderedDict | None" = None
_BATCHES_LOCK = threading.Lock()


def _batch(sides: list[_Side]) -> _Batch | None:
    """The (cached) :class:`_Batch` of these sides, or None when they are fewer than BATCH_FROM."""
    global _BATCHES
    if len(sides) < BATCH_FROM or any(sd.h != sides[0].h for sd in sides):
        return None
    import collections

    key = tuple((id(sd.masses), sd.start) for sd in sides)
    with _BATCHES_LOCK:  # (accountants may run on several threads of one worker)
        if _BATCHES is None:
            _BATCHES = collections.OrderedDict()
        hit = _BATCHES.get(key)
        if hit is not None:
            _BATCHES.move_to_end(key)
            return hit
    b = _Batch(sides)
    with _BATCHES_LOCK:
        _BATCHES[key] = b  # (b.sides keeps the mass arrays alive: their ids stay unique)
        while len(_BATCHES) > 4:
            _BATCHES.popitem(last=False)
    return b


def _tilted_cgf(sides: list[_Side], theta: float, s: np.ndarray) -> np.ndarray:
    """sum_m k_m (ln M_m(theta + s) - ln M_m(theta)): CGF of the theta-tilted sum (an upper bound:
    ln M(theta + s) rounded up, ln M(theta) down)."""
    b = _batch(sides)
    if b is not None:
        k = np.array([sd.count for sd in sides], dtype=float)
        return k @ (b.log_mgf(theta + s) - b.log_mgf([theta], down=True))
    total = np.zeros(s.size)
    for sd in sides:
        base = float(sd.log_mgf(theta)[0])
        if math.isfinite(base):  # (rounded down by the log-sum-exp's allowance)
            base -= _lmgf_slack(sd.masses.size, abs(base) + math.log(max(sd.masses.size, 1)), theta, sd.eps)
        total += sd.count * (sd.log_mgf_upper(theta + s) - base)
    return total


def _log_mgf_total(sides: list[_Side], theta: float) -> float:
    """sum_m k_m ln M_m(theta) (for tilt estimates: no rounding direction needed)."""
    b = _batch(sides)
    if b is not None:
        return float(np.array([sd.count for sd in sides], dtype=float) @ b.log_mgf([theta])[:, 0])
    return float(sum(sd.count * float(sd.log_mgf(theta)[0]) for sd in sides))


def _moments(sides: list[_Side], theta: float) -> tuple[float, float]:
    """Mean and variance of the theta-tilted composed loss."""
    b = _batch(sides)
    if b is not None:
        k = np.array([sd.count for sd in sides], dtype=float)
        m1, v1 = b.moments(theta)
        return float(k @ m1), float(k @ v1)
    mean = var = 0.0
    for sd in sides:
        m1, v1 = sd.tilted_moments(theta)
        mean += sd.count * m1
        var += sd.count * v1
    return mean, var


#: Chernoff bounds are minimised over this many geometric slopes in [0.5, 60] / sd, plus 4 far ones
#: (each slope costs one windowed pass per side; 14 made windows ~4% narrower than 8, for 10-25%
#: more time on cheap calls)
CHERNOFF_SLOPES = 8


@functools.lru_cache(maxsize=4)
def _slopes(k: int) -> np.ndarray:
    out = np.concatenate([np.geomspace(0.5, 60.0, k), [1e-2, 0.1, 300.0, 3e3]])
    out.flags.writeable = False
    return out


def _chernoff_slopes() -> np.ndarray:
    """The slopes (times the composed sd) of :class:`_Chernoff`: CHERNOFF_SLOPES geometric ones
    in [0.5, 60] and 4 far ones."""
    return _slopes(CHERNOFF_SLOPES)


class _Chernoff:
    """Chernoff bounds for the theta-tilted composed loss Y:
    P(Y >= a) <= exp(K(s) - s a),  P(Y <= a) <= exp(K(-s) + s a)  for every s > 0,
    minimised over a geometric grid of s (any s gives a valid bound)."""

    def __init__(self, sides, theta, sd_total):
        # (any s gives a valid bound: a coarser grid only a slightly wider window)
        self.s = _chernoff_slopes() / max(sd_total, 1e-300)
        k = _tilted_cgf(sides, theta, np.concatenate([self.s, -self.s]))  # (both tails in one pass)
        self.kr, self.kl = k[: self.s.size], k[self.s.size :]

    def edges(self, log_tol):
        """(largest left edge, smallest right edge) with each tail <= e^{log_tol}."""
        with np.errstate(invalid="ignore"):
            right = np.nanmin((self.kr - log_tol) / self.s)
            left = np.nanmax(-(self.kl - log_tol) / self.s)
        return float(left), float(right)

    def log_right_tail(self, a):
        return float(np.nanmin(self.kr - self.s * a))

    def log_left_tail(self, a):
        return float(np.nanmin(self.kl + self.s * a))


#: an upper-only composition at a tilt (docs/MATH.md 4.3) starts its window at most this many tilted
#: standard deviations below the tilted mean (where the answers are: the tilt centres them), the rest
#: of its left tail folding into the window ...
LEFT_CUT_SD = 2.0
#: ... as far right as that folded tail, untilted where it lands, weighs at most this fraction of the
#: far tails' allowance CUT_REL * cut_scale (the same budget bounds the right tail moved to +inf below)
LEFT_CUT_REL = 1e-3
#: ... and it ends early by the room between its start and this many tilted sd below the tilted mean,
#: its right tail folding onto the start
RIGHT_FOLD_SD = 1.0
#: both folds apply to windows of at least this many points (below, the search costs more than it saves)
LEFT_CUT_FROM = 2**14
#: window starts tried by :func:`_left_cut`, and the bands its bound splits a folded tail into
_LEFT_CUT_CANDIDATES = 32
_LEFT_CUT_BANDS = 32


def _left_cut(ch: _Chernoff, theta: float, h: float, w_lo: int, w_hi: int, log_m: float, c_max: int,
              log_budget: float) -> int:
    """The largest window start c in [w_lo, c_max] whose folded left tail weighs at most
    e^log_budget once untilted where it lands (docs/MATH.md 4.3); w_lo if none is larger.

    Only the tightness of an upper curve depends on it: folded mass is extra non-negative mass.
    Tilted mass at index R < c lands at R + k N (k >= 1, the first in the window), untilted
    there by e^{log_m - theta h (R + k N)}.  Mass at R in [c - (j+1) b, c - j b) (band j of b
    points, j b < N) is at most the Chernoff bound P(Y <= (c - j b - 1) h) and lands at or right of
    c + N - (j+1) b; mass below c - N is bounded as a whole, untilted at the window start.
    """
    if c_max <= w_lo or not math.isfinite(log_budget):
        return w_lo

    def fits(cand):
        Ns = np.array([sfft.next_fast_len(max(int(w_hi - c), 2), real=True) for c in cand], dtype=float)
        b = np.ceil(Ns / _LEFT_CUT_BANDS)
        j = np.arange(_LEFT_CUT_BANDS, dtype=float)
        c = cand.astype(float)
        a = np.concatenate([(c[:, None] - j[None, :] * b[:, None] - 1.0), (c - Ns - 1.0)[:, None]], axis=1) * h
        land = np.concatenate([c[:, None] + Ns[:, None] - (j[None, :] + 1.0) * b[:, None], c[:, None]], axis=1) * h
        with np.errstate(invalid="ignore", over="ignore"):
            tail = np.nanmin(ch.kl[None, None, :] + ch.s[None, None, :] * a[:, :, None], axis=2)
            terms = np.minimum(tail, 0.0) + log_m - theta * land
            terms = np.where(np.isnan(terms), np.inf, terms)  # (no bound: the candidate fails)
            return _logsumexp_rows(terms) <= log_budget

    if fits(np.array([c_max]))[0]:  # (usually so at the tilts of small deltas)
        return int(c_max)
    cand = np.unique(np.linspace(w_lo, c_max, _LEFT_CUT_CANDIDATES).astype(np.int64))
    ok = fits(cand)
    return int(cand[ok].max()) if ok.any() else w_lo


#: the untilting exponent log M^k - theta * eps must keep ~1e-10 absolute accuracy
MAX_TILT_EXPONENT = 1e6


def _theta_cap(sides, moments0=None) -> float:
    """Largest tilt used: 40 composed standard deviations' worth, and float-safe
    (``moments0``: ``_moments(sides, 0.0)`` if the caller has it)."""
    m0, v0 = _moments(sides, 0.0) if moments0 is None else moments0
    full = sum(max(abs(sd.eps[0]), abs(sd.eps[-1])) * sd.count for sd in sides)
    # the windows of useful tilts stay within ~60 standard deviations of the mean
    span = min(full, abs(m0) + 60.0 * math.sqrt(max(v0, 0.0))) + 1.0
    return min(40.0 / math.sqrt(max(v0, 1e-300)), MAX_TILT_EXPONENT / span)


def solve_tilt(plds, counts, target_eps: float, cut_scale: float | None = None) -> float:
    """theta >= 0 such that the tilted composed mean equals ``target_eps`` (0 if below the mean).

    Newton's method on the (convex) CGF, safeguarded by a bracket; the tilt only
    affects accuracy, never soundness, so a loose solution is harmless.  ``cut_scale``: of
    the composition the tilt is for (the law whose far tails are cut, :func:`compose`).
    """
    sides = _cut_tails([_Side.of(p, k) for p, k in zip(plds, counts)], cut_scale)[0]
    m0, v0 = _moments(sides, 0.0)
    if target_eps <= m0:
        return 0.0
    theta_max = _theta_cap(sides, (m0, v0))
    if _moments(sides, theta_max)[0] <= target_eps:
        return theta_max
    lo, hi = 0.0, theta_max
    theta, mean, var = 0.0, m0, v0
    for _ in range(100):
        if mean < target_eps:
            lo = theta
        else:
            hi = theta
        step = (target_eps - mean) / max(var, 1e-300)
        nxt = theta + step
        if not (lo < nxt < hi):
            nxt = 0.5 * (lo + hi) if math.isfinite(hi) else max(2.0 * theta, theta + 1.0)
        if abs(nxt - theta) <= 1e-10 * max(1.0, theta) or nxt > 1e6:
            return min(nxt, 1e6)
        theta = nxt
        mean, var = _moments(sides, theta)
        if abs(mean - target_eps) <= 1e-9 * max(1.0, abs(target_eps)):
            return theta
    return theta


def estimate_tilt(plds, counts, delta: float, cut_scale: float | None = None) -> float:
    """Tilt theta whose tilted mean sits at the (estimated) eps(delta); 0 for large delta.

    Uses the saddle-point relation ln delta ~ K(t) - t K'(t) - ln(t (1 + t)) - ln sqrt(2 pi K''(t))
    of the composed discrete PLD (pessimistic side).  Only the efficiency of the
    composition depends on it, never its soundness.  ``cut_scale``: as in :func:`solve_tilt`.
    """
    sides = _cut_tails([_Side.of(p, k) for p, k in zip(plds, counts)], cut_scale)[0]
    # one side (a single mechanism's PLD): K, K' and K'' in one pass
    one = sides[0] if len(sides) == 1 else None

    def f(t):
        if one is not None:
            lm, m1, v1 = one.cgf_moments(t)
            logm, mean, var = one.count * lm, 0.0 + one.count * m1, 0.0 + one.count * v1
        else:
            logm = _log_mgf_total(sides, t)
            mean, var = _moments(sides, t)
        return logm - t * mean - math.log(t * (1 + t)) - 0.5 * math.log(2 * math.pi * max(var, 1e-300)), var

    target = math.log(delta)
    moments0 = _moments(sides, 0.0)
    theta_max = _theta_cap(sides, moments0)
    lo, hi = 1e-6, math.inf
    if f(lo)[0] <= target:
        return 0.0
    # Newton's method on f (decreasing), safeguarded by the bracket [lo, hi]; slope
    # f'(t) = -t K''(t) - (1 + 2t) / (t (1 + t)) (the third cumulant's term left out); start
    # from the normal approximation K(t) - t K'(t) ~ -t^2 K''(0) / 2
    v0 = moments0[1]
    t = min(max(math.sqrt(2.0 * max(-target, 1.0) / max(v0, 1e-300)), 2.0 * lo), theta_max)
    for _ in range(40):
        ft, var = f(t)
        if ft > target:
            lo = t
            if t >= theta_max:  # bounded losses: no saddle point below the cap
                return theta_max
        else:
            hi = t
        if hi / lo < 1.15:  # the tilt needs no precision
            break
        slope = -(t * max(var, 0.0) + (1.0 + 2.0 * t) / (t * (1.0 + t)))
        nxt = t + (target - ft) / slope
        if not (lo < nxt < hi) or not math.isfinite(nxt):
            nxt = math.sqrt(lo * hi) if math.isfinite(hi) else 4.0 * t
        nxt = min(nxt, theta_max)
        if abs(nxt - t) <= 0.03 * t:
            # Newton has (nearly) converged: step just past the root to close the bracket
            nxt = min(max(nxt, t) * 1.06, theta_max) if ft > target else min(nxt, t) / 1.06
        t = nxt
    # the smaller end: where a far tail takes over the tilted law (f drops steeply), a tilt
    # past the transition would centre the window on that tail instead of on eps(delta)
    return lo


def _fold(t: np.ndarray, offset: int, N: int) -> np.ndarray:
    """Place t at circular positions (offset + i) mod N, summing what overlaps."""
    if t.size <= N and offset % N + t.size <= N:
        out = np.zeros(N)
        out[offset % N : offset % N + t.size] = t
        return out
    return np.bincount((offset + np.arange(t.size)) % N, weights=t, minlength=N)


def _int_power(X: np.ndarray, k: int, overwrite_x: bool = False) -> np.ndarray:
    """X**k element-wise for an integer k >= 1 by binary powering (squarings and products).

    Each complex product has relative error <= sqrt(2) gamma_2 ~ 2.83 u (Higham 3.5) and a
    squaring doubles the relative error it receives, so the result has relative error at
    most (1 + 2.83 u)^k - 1 ~ 2.83 k u: inside the (pi + 1) k u term of the round-off
    bound (docs/MATH.md 4.4), and about 3x faster than exp(k log X) for large arrays.  The
    products are made in place (the same operations; no fresh array, hence no page faults, per
    product); ``overwrite_x``: the squarings may be made in X's own array.
    """
    k = int(k)
    if k == 1:
        return X
    out = None
    base = X
    own = overwrite_x  # (else X itself is never written: the squarings go to a buffer of their own)
    while True:
        _deadline.check("an FFT composition")  # (each pass: one elementwise product or two)
        if k & 1:
            if out is None:
                # (the running power becomes the result as it is; the next squaring goes to a
                # fresh array instead of a copy being made here)
                out = base if own else base.copy()
                own = False
            else:
                np.multiply(out, base, out=out)
        k >>= 1
        if not k:
            return out
        if own:
            np.multiply(base, base, out=base)
        else:
            base, own = base * base, True


#: FFT lengths from which scipy.fft may use several threads (below, threads cost more than they save)
FFT_THREADS_FROM = 2**18
#: batches of at least this many forward FFTs use several threads: scipy's pocketfft spreads a
#: batch's transforms over its threads, never the work of one 1-D transform (measured on 2 cores:
#: 8 x 2^18 points 1.6-2x faster, 2 x 2^20 and single transforms no faster)
FFT_THREADS_ROWS = 4


def fft_workers(n: int, rows: int = 1) -> int:
    """Threads for a batch of ``rows`` FFTs of n points in all: ``PLDLIB_FFT_WORKERS`` (default:
    the CPUs this process may use, at most 8) for n >= FFT_THREADS_FROM and rows >=
    FFT_THREADS_ROWS, else 1."""
    if n < FFT_THREADS_FROM or rows < FFT_THREADS_ROWS:
        return 1
    return _fft_threads()


@functools.lru_cache(maxsize=1)
def _fft_threads() -> int:
    env = os.environ.get("PLDLIB_FFT_WORKERS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"PLDLIB_FFT_WORKERS: must be a positive integer, got {env!r}") from None
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


#: smallest block of the block-l2 round-off allowance (below, the entrywise form is as good)
_RO_BLOCK_MIN = 8
#: largest block (for theta = 0, where the untilting factor is flat)
_RO_BLOCK_MAX = 2**14


def _roundoff_block(theta: float, h: float, N: int) -> int:
    """Block length of the l2 round-off allowance: a power of two with theta * B * h <= 1/2
    (the untilting factor varies by at most e^{1/2} inside a block), at most _RO_BLOCK_MAX."""
    cap = _RO_BLOCK_MAX if theta * h <= 0.0 else 0.5 / (theta * h)
    cap = min(cap, _RO_BLOCK_MAX, N)
    return 1 << int(math.floor(math.log2(cap))) if cap >= 1 else 1


#: block length of the untilting factor's product form (see :func:`untilt_factor`)
_UNTILT_BLOCK = 256


class UntiltBlocks:
    """The untilting factor in product form, never written out: u_j = a_b w_i for j = 256 b + i
    (``a`` one value per block of :data:`_UNTILT_BLOCK` points, ``w`` the offsets' factors,
    ``n`` points in all).  :meth:`array` writes it out (the same numbers as
    :func:`untilt_factor`'s array), :meth:`scale` multiplies an array of n points by it in place
    (by a_b, then by w_i: two roundings, as writing u out and multiplying by it), and
    :meth:`block_stats` gives blocks' maxima, sums and sums of squares of u from the factors."""

    __slots__ = ("a", "w", "n")

    def __init__(self, a: np.ndarray, w: np.ndarray, n: int):
        self.a, self.w, self.n = a, w, int(n)

    def array(self) -> np.ndarray:
        return np.multiply.outer(self.a, self.w).reshape(-1)[: self.n]

    def scale(self, x: np.ndarray) -> np.ndarray:
        """x *= u in place (x of n points); returns x."""
        B, n = self.w.size, self.n
        full = n // B
        if full:
            xb = x[: full * B].reshape(full, B)
            xb *= self.a[:full, None]
            xb *= self.w[None, :]
        if full * B < n:
            tail = x[full * B:]
            tail *= self.a[full]
            tail *= self.w[: n - full * B]
        return x

    def block_stats(self, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(max, sum, sum of squares) of u over each block of g points (the last one partial),
        g a power of two: each block lies inside one factor block or is a union of whole ones
        (so each is a_b times the same statistic of w's segment, or sums of those)."""
        B, n = self.w.size, self.n
        a = self.a
        nblk = -(-n // g)
        with np.errstate(over="ignore"):  # (a sum of squares past the largest double is +inf: a
            return self._block_stats(g, B, n, a, nblk)  # round-off bound of +inf certifies nothing)

    def _block_stats(self, g, B, n, a, nblk):
        if g <= B:
            k = B // g
            seg = self.w.reshape(k, g)
            wmax, wsum, wsq = seg.max(axis=1), seg.sum(axis=1), np.einsum("ij,ij->i", seg, seg)
            mx = np.multiply.outer(a, wmax).reshape(-1)[:nblk]
            sm = np.multiply.outer(a, wsum).reshape(-1)[:nblk]
            sq = np.multiply.outer(a * a, wsq).reshape(-1)[:nblk]
        else:
            c = g // B  # factor blocks per block
            wmax, wsum, wsq = float(self.w.max()), float(self.w.sum()), float(np.dot(self.w, self.w))
            pad = nblk * c - a.size
            ap = np.concatenate([a, np.zeros(pad)]) if pad > 0 else a[: nblk * c]
            ap = ap.reshape(nblk, c)
            mx, sm, sq = ap.max(axis=1) * wmax, ap.sum(axis=1) * wsum, np.einsum("ij,ij->i", ap, ap) * wsq
        if n % g:  # the last block is partial: its statistics from its own points
            j = np.arange((nblk - 1) * g, n)
            last = a[j // B] * self.w[j % B]  # (the numbers of array())
            mx[-1], sm[-1], sq[-1] = last.max(), last.sum(), float(np.dot(last, last))
        return mx, sm, sq


def untilt_factor(log_total: float, theta: float, eps_win: np.ndarray | None, n_pld: int, side: str, *,
                  start: int | None = None, h: float | None = None, n: int | None = None,
                  factored: bool = False) -> np.ndarray | UntiltBlocks:
    """e^{log_total - theta eps_j}, rounded outward: ``side`` "up" multiplies by 1 + r, "lo" by
    1 - r, with r >= 16 u (n_pld + 2)(|log_total| + theta max|eps| + 1) covering the round-off of
    the exponent (log_total is a sum of n_pld products) and of exp (docs/MATH.md 4.4).

    On the lattice eps_j = (start + j) h (``start``, ``h``, ``n`` given instead of ``eps_win``) it
    is the product e^{log_total - theta eps_b} e^{-theta h i} over blocks b of 256 points (one exp
    per block and per offset i, then one multiplication per point) where no factor overflows or is
    subnormal: the two exps and the product add at most 6.5 u to the relative error, inside r.
    ``factored``: that product form as an :class:`UntiltBlocks` (where it applies; the array
    otherwise), so that a caller multiplying by it need not write it out."""
    if eps_win is None:
        span = max(abs(start), abs(start + n - 1)) * h
    else:
        span = float(np.max(np.abs(eps_win[[0, -1]]))) if eps_win.size else 0.0
    r = 16.0 * _U * (n_pld + 2) * (abs(log_total) + theta * span + 1.0)
    scale = (1.0 + r) if side == "up" else max(1.0 - r, 0.0)
    if eps_win is None:
        B = _UNTILT_BLOCK
        nb = -(-n // B)
        a = log_total - theta * ((start + np.arange(nb) * B) * h)  # each block's largest exponent
        # (only where no factor overflows or is subnormal: then the product rounds as stated)
        if n >= 4 * B and theta * h * B <= 50.0 and float(np.max(a)) <= 700.0 and float(np.min(a)) >= -650.0:
            with np.errstate(under="ignore"):
                blocks = UntiltBlocks(np.exp(a) * scale, np.exp(-theta * h * np.arange(B)), n)
            return blocks if factored else blocks.array()
        eps_win = (start + np.arange(n)) * h
    with np.errstate(over="ignore", under="ignore"):
        u = np.exp(log_total - theta * eps_win)
    return u * scale


def _untilted(x: np.ndarray, untilt) -> np.ndarray:
    """x *= u in place, u the untilting factor as an array or an :class:`UntiltBlocks`."""
    if isinstance(untilt, UntiltBlocks):
        return untilt.scale(x)
    x *= untilt
    return x


def _positive_part(y: np.ndarray, start: int, overwrite_y: bool, sub: float | None = None) -> np.ndarray:
    """max(y - sub, 0) (``sub`` None: max(y, 0)) of the circular array y read from position
    ``start`` on (the window order: np.roll(y, -start)), in one pass; in y's own array when
    ``start`` is 0 and ``overwrite_y``."""
    N = y.size
    start %= max(N, 1)
    if start == 0:
        out = y if overwrite_y else None
        if sub is not None:
            out = np.subtract(y, sub, out=out)
            return np.maximum(out, 0.0, out=out)
        return np.maximum(y, 0.0, out=out)
    out = np.empty(N)
    for src, dst in ((y[start:], out[: N - start]), (y[:start], out[N - start:])):
        if sub is not None:
            np.subtract(src, sub, out=dst)
            np.maximum(dst, 0.0, out=dst)
        else:
            np.maximum(src, 0.0, out=dst)
    return out


def upper_masses(y: np.ndarray, E: float, untilt: np.ndarray, theta: float, h: float, cap: float = 1.0,
                 overwrite_y: bool = False, sparse_roundoff: bool = False, start: int = 0):
    """Masses of the certified upper measure from the computed tilted composition ``y`` whose
    error vector e satisfies ||e||_2 <= E (docs/MATH.md 4.4); returns (masses, roundoff masses).

    The true masses are (y_j - e_j) u_j >= 0 (u = ``untilt``).  For eps, the error of the curve is
    sum_j e_j u_j g_j with g_j = (1 - e^{eps - eps_j})_+.  Splitting the window into blocks b of B
    points, Cauchy-Schwarz and g_j <= g_{last(b)} give |sum_{j in b} e_j u_j g_j| <= E ||u_b||_2
    g_{last(b)}: a mass E ||u_b||_2 at the block's last point dominates the block's round-off for
    every eps at once.  Where that is not at least 2x smaller than the entrywise allowance
    sum_{j in b} min(E u_j, cap) (a varying or overflowing untilting factor), the block keeps the
    entrywise form (y_j + E) u_j.  Each mass is capped at ``cap`` (a true mass is at most cap, and
    a block's round-off term at most B cap).  ``overwrite_y``: the masses may be made in ``y``'s
    own array (the same numbers; no fresh array of the window's size).  ``untilt`` may be an
    :class:`UntiltBlocks` (the product form, then never written out in the usual case: the
    products y_j a_b w_i round twice, as y_j (a_b w_i) does, and the block norms come from the
    factors with the same allowance, docs/MATH.md 4.4).  ``sparse_roundoff``: where every block
    takes the block form, the round-off masses come as (indices, masses) of the blocks' last
    points instead of an array of the window's size.  ``start``: ``y`` is circular, the window
    starting at position ``start`` (the masses come out in window order; ``overwrite_y`` then
    has no effect).
    """
    N = y.size
    blocks = untilt if isinstance(untilt, UntiltBlocks) else None
    with np.errstate(over="ignore", invalid="ignore"):
        # (fmin: a NaN product -- inf * 0 -- becomes cap, the largest a mass can be)
        main = _untilted(_positive_part(y, start, overwrite_y), untilt)
        np.fmin(main, cap, out=main)
    B = _roundoff_block(theta, h, N)
    if B < _RO_BLOCK_MIN or E <= 0.0:
        untilt = untilt if blocks is None else blocks.array()
        with np.errstate(over="ignore", invalid="ignore"):
            ent = np.fmin(E * untilt, cap)
        return np.minimum(main + ent, cap), ent
    nb = -(-N // B)
    pad = nb * B - N
    last = np.minimum(np.arange(nb) * B + B - 1, N - 1)
    if blocks is not None:
        s, u_sum, u_sq = blocks.block_stats(B)
    else:
        u = np.concatenate([untilt, np.zeros(pad)]).reshape(nb, B) if pad else untilt.reshape(nb, B)
        s = np.max(u, axis=1)
    if np.all(s < 1e150) and np.all(s > 1e-150) and float(np.max(s)) * E <= cap:
        # the usual case: no block norm can overflow or underflow, no entry of E u reaches cap
        # (the entrywise allowance is E u itself): the same decisions without scaling copies
        if blocks is None:
            u_sq, u_sum = np.einsum("ij,ij->i", u, u), u.sum(axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            r = E * np.sqrt(u_sq) * (1.0 + 4.0 * _U * (B + 2))
            use = np.isfinite(r) & (r <= 0.5 * E * u_sum)
        if use.all():
            r = np.minimum(r, B * cap)
            main[last] += r
            if sparse_roundoff:  # (the round-off masses as (last, r): see BlockRoundoff)
                return main, (last, r)
            ro = np.zeros(N)
            ro[last] = r
            return main, ro
    if blocks is not None:
        untilt = blocks.array()
        u = np.concatenate([untilt, np.zeros(pad)]).reshape(nb, B) if pad else untilt.reshape(nb, B)
    with np.errstate(over="ignore", invalid="ignore"):
        ent = np.fmin(E * untilt, cap)
    ok = np.isfinite(s) & (s > 0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s_safe = np.where(ok, s, 1.0)
        w = u / s_safe[:, None]
        norm = s_safe * np.sqrt(np.einsum("ij,ij->i", w, w))
        r = E * norm * (1.0 + 4.0 * _U * (B + 2))  # round the block sum up
    entb = (np.concatenate([ent, np.zeros(pad)]) if pad else ent).reshape(nb, B).sum(axis=1)
    use = ok & np.isfinite(r) & (r <= 0.5 * entb)
    r = np.minimum(np.where(use, r, 0.0), B * cap)
    per = np.repeat(use, B)[:N]
    ro = np.where(per, 0.0, ent)
    masses = main
    if not per.all():
        off = ~per
        masses[off] = np.minimum(main[off] + ent[off], cap)
    ro[last[use]] += r[use]
    masses[last[use]] += r[use]
    return masses, ro


#: forward FFTs of up to this many sides share one call (while their rows fit in 2^22 points)
_FFT_ROWS_MAX = 32


def _window_shift(sides, w_lo: int, n_bins: int) -> int:
    """Position of the window's first index w_lo in a circular composition of these sides of
    n_bins points (composed absolute index base + R sits at position R mod n_bins)."""
    return (w_lo - sum(sd.count * sd.start for sd in sides)) % n_bins


def _compose_side(sides, theta, w_lo, n_bins, chern, roll: bool = True):
    """Compose one side; returns (masses_est, E, logscale, tails) on window [w_lo, w_lo + n_bins)
    (``roll=False``: the masses in circular order, the window starting at position
    :func:`_window_shift`)."""
    h = sides[0].h
    base = sum(sd.count * sd.start for sd in sides)
    top = base + sum(sd.count * (sd.masses.size - 1) for sd in sides)
    N = n_bins
    fft_rows = max(1, min(_FFT_ROWS_MAX, (1 << 22) // max(n_bins, 1)))
    b = _batch(sides)
    # (any normalising constants serve, the same ones untilt below: the batch's for many sides)
    logM = list(b.log_mgf([theta])[:, 0]) if b is not None else [float(sd.log_mgf(theta)[0]) for sd in sides]
    spec = None
    norm_sum = 0.0
    min_norm = np.inf
    K = 0
    rows = []
    for sd, lm in zip(sides, logM):
        t = np.multiply(sd.eps, theta)  # (in place: the numbers of exp(logm + theta eps - lm))
        t += sd.logm
        t -= lm
        np.exp(t, out=t)
        tf = _fold(t, 0, N)
        # 2-norm of the folded array (that of t itself when nothing overlaps); einsum
        # avoids a multi-threaded BLAS call on a mostly-zero array of length N
        v = t if t.size <= N else tf
        nrm = math.sqrt(float(np.einsum("i,i->", v, v)))
        norm_sum += sd.count * nrm
        min_norm = min(min_norm, nrm)
        K += sd.count
        rows.append((tf, sd.count))
        if len(rows) == fft_rows or sd is sides[-1]:
            _deadline.check("an FFT composition")
            # the forward FFTs of several sides in one call (rows of one array)
            # (one side: its row as a view, no stacked copy)
            stacked = rows[0][0][None, :] if len(rows) == 1 else np.stack([r for r, _ in rows])
            X = sfft.rfft(stacked, axis=-1, workers=fft_workers(N * len(rows), len(rows)))
            with np.errstate(under="ignore", invalid="ignore", over="ignore"):
                for i, (_r, k) in enumerate(rows):
                    Z = _int_power(X[i], k, overwrite_x=True)  # (each row of X is read once)
                    spec = Z if spec is None else spec * Z
            rows = []
    _deadline.check("an FFT composition")
    y = sfft.irfft(spec, N)  # (one transform: threads would not split it)
    # entrywise round-off bound on y (tilted, normalised masses)
    eta = 16.0 * _U * math.ceil(math.log2(max(N, 2)))
    growth = math.exp(min(700.0, K * eta * math.sqrt(N) * max(norm_sum / max(K, 1), 0.0)))
    # a bound on ||y_computed - y_exact||_2 (docs/MATH.md 4.4), hence on every entry
    E = (1.0 + eta) * growth * growth * (eta * (norm_sum + min_norm)
                                         + _U * (0.37 + (math.pi + 1.0) * K + 2 * len(sides)))
    if roll:  # window extraction: composed absolute index base + R sits at position R mod N
        y = np.roll(y, -_window_shift(sides, w_lo, N))
    log_total = float(sum(sd.count * lm for sd, lm in zip(sides, logM)))
    # tilted tail masses outside the window (0 where the support ends inside)
    w_hi = w_lo + N  # first index beyond the window
    log_right = -np.inf if w_hi > top else chern.log_right_tail(w_hi * h)
    log_left = -np.inf if w_lo <= base else chern.log_left_tail((w_lo - 1) * h)
    return y, E, log_total, log_left, log_right


#: a composition given ``cut_scale`` drops single-step right tails whose untilted mass, summed over
#: the steps, is at most this fraction of cut_scale (docs/MATH.md 4.3)
CUT_REL = 1e-6


def _cut_tails(sides: list, cut_scale: float | None) -> tuple[list, list[float]]:
    """The sides with their far right tails removed (docs/MATH.md 4.3), and the mass removed
    from each (per step).

    A single-step tail of untilted mass p beyond eps_cut weighs e^{theta eps} in a tilted
    measure, so at a large tilt a far tail of negligible mass can dominate the tilted law (the
    tilt that centres the window on the answer is then never found, and the window is huge).
    Each side keeps its masses below the first block boundary whose tail beyond it has mass p_m
    with sum_m k_m p_m <= CUT_REL * cut_scale (answers are wanted for deltas >= cut_scale).  On
    an upper side the tails move to +inf (pessimistic: the caller adds them to p_inf, so the
    upper curve rises by at most CUT_REL * cut_scale); on a lower side they are dropped (a
    sub-measure composes to a smaller curve: optimistic).  ``cut_scale=None``: no cut.
    """
    if cut_scale is None or not cut_scale > 0.0 or CUT_REL <= 0.0:
        return list(sides), [0.0] * len(sides)
    K = sum(sd.count for sd in sides)
    log_thr = math.log(CUT_REL * cut_scale) - math.log(max(K, 1))
    if not math.isfinite(log_thr):
        return list(sides), [0.0] * len(sides)
    out, extra = [], []
    for sd in sides:
        n = sd.cut_index(log_thr)
        if n < sd.masses.size:
            extra.append(sd.tail_mass(n))
            out.append(sd.cut(n))
        else:
            extra.append(0.0)
            out.append(sd)
    return out, extra


def compose(
    plds_upper: list[DiscretePLD],
    plds_lower: list[DiscretePLD] | None,
    counts: list[int],
    *,
    theta: float = 0.0,
    eps_from: float | None = None,
    alias_tol: float = DEFAULT_ALIAS_TOL,
    max_bins: int = DEFAULT_MAX_BINS,
    cut_scale: float | None = None,
    dry_run: bool = False,
) -> Composition | None:
    """Compose sum_m counts[m] copies of each PLD; certified upper and lower curves.

    Parameters
    ----------
    plds_upper, plds_lower : pessimistic and optimistic single-step PLDs (same h);
        ``plds_lower=None`` composes the pessimistic side only (``lower`` is then None)
    counts : how many times each is composed
    theta : exponential tilt (>= 0)
    eps_from : smallest eps at which answers are needed (extends the window left)
    alias_tol : bound on the tilted mass allowed outside the window
    max_bins : cap on the FFT length; beyond it :class:`GridTooLargeError`
    cut_scale : smallest delta the answers are wanted for; single-step right tails of total
        mass <= CUT_REL * cut_scale are moved to +inf (upper) / dropped (lower) before composing
        (docs/MATH.md 4.3), which keeps windows small when a far tail of negligible mass would
        dominate the tilted law.  None: no cut.  Tilts for such a composition should be
        computed with the same ``cut_scale`` (:func:`solve_tilt`, :func:`estimate_tilt`).
    dry_run : only lay out the window: raise what composing would raise for its size
        (:class:`GridTooLargeError`, ``UntiltError``) and return None, without any FFT.

    Returns
    -------
    Composition
        upper/lower curves valid for eps >= ``valid_from``.
    """
    if theta < 0:
        raise ValueError("theta must be >= 0")

    h = plds_upper[0].h
    upper_only = plds_lower is None
    if any(abs(p.h - h) > 1e-15 * h for p in list(plds_upper) + list(plds_lower or [])):
        raise ValueError("all PLDs must share one grid spacing")
    counts = [int(k) for k in counts]
    # lattice offsets (docs/MATH.md 3.2): the sides are composed on the integer lattice and
    # the sums of the offsets shift the results
    shift_up = float(sum(k * getattr(p, "shift", 0.0) for p, k in zip(plds_upper, counts)))
    shift_lo = 0.0 if upper_only else float(sum(k * getattr(p, "shift", 0.0) for p, k in zip(plds_lower, counts)))
    up = [_Side.of(p, k, "up") for p, k in zip(plds_upper, counts)]
    lo = up if upper_only else [_Side.of(p, k, "lo") for p, k in zip(plds_lower, counts)]
    up, cut_pinf = _cut_tails(up, cut_scale)
    lo = up if upper_only else _cut_tails(lo, cut_scale)[0]
    log_tol = math.log(alias_tol)
    # window from the pessimistic side (it is the wider one), both tails
    mean_t, var = _moments(up, theta)
    if cut_scale is not None and cut_scale > 0.0:
        # answers are wanted for deltas >= cut_scale near the tilted mean: tilted mass
        # e^log_tol outside the window weighs at most e^{log_tol + ln M_tot - theta mean} there
        # once untilted; keep that below CUT_REL * cut_scale (docs/MATH.md 4.3)
        log_m = sum(sd.count * float(sd.log_mgf(theta)[0]) for sd in up)
        rel = math.log(CUT_REL * cut_scale) - log_m + theta * mean_t
        if math.isfinite(rel):
            log_tol = max(log_tol, min(rel, math.log(1e-12)))
    sd_total = math.sqrt(max(var, 0.0)) + h
    ch_up = _Chernoff(up, theta, sd_total)
    ch_lo = ch_up if upper_only else _Chernoff(lo, theta, sd_total)
    left_e, right_e = ch_up.edges(log_tol)
    if not upper_only:
        l2, r2 = ch_lo.edges(log_tol)
        left_e, right_e = min(left_e, l2), max(right_e, r2)
    base = min(sum(sd.count * sd.start for sd in s) for s in (up, lo))
    top = max(sum(sd.count * (sd.start + sd.masses.size - 1) for sd in s) for s in (up, lo))
    w_lo = max(int(math.floor(left_e / h)) - 1, base)
    w_hi = min(int(math.ceil(right_e / h)) + 2, top + 1)
    if upper_only and theta > 0.0 and cut_scale is not None and cut_scale > 0.0 and w_hi - w_lo >= LEFT_CUT_FROM:
        # no lower curve: the window starts near the answers, its left tail folding in (4.3)
        c_max = int(math.floor((mean_t - LEFT_CUT_SD * math.sqrt(max(var, 0.0))) / h))
        log_budget = math.log(LEFT_CUT_REL * CUT_REL * cut_scale)
        w_lo = _left_cut(ch_up, theta, h, w_lo, w_hi, log_m, min(c_max, w_hi - 2), log_budget)
        # the right tail folds onto the window's start: what lands left of the answers' region
        # (RIGHT_FOLD_SD below the tilted mean) costs nothing there, so the window ends that much
        # earlier, provided the tail beyond its new end, moved to +inf, stays within the budget
        room = int(math.floor((mean_t - RIGHT_FOLD_SD * math.sqrt(max(var, 0.0))) / h)) - w_lo
        if room > 0:
            new_hi = max(w_hi - room, w_lo + 2)
            if ch_up.log_right_tail(new_hi * h) + log_m - theta * new_hi * h <= log_budget:
                w_hi = new_hi
    if eps_from is not None:
        w_lo = max(min(w_lo, int(math.floor((eps_from - max(shift_up, shift_lo)) / h)) - 1), base)
    need = max(w_hi - w_lo, 2)
    if need > max_bins:
        raise GridTooLargeError(
            f"composition needs {need:,} grid points (limit {max_bins:,}); "
            "use a coarser interval (larger h)", need=need, limit=max_bins
        )
    span = max(abs(w_lo), abs(w_hi)) * h
    if theta * span > 1.01 * MAX_TILT_EXPONENT:
        raise UntiltError(f"theta={theta:.3g} is too large for float-accurate untilting over eps up to {span:.3g} "
                          f"(floor: theta * |eps| <= {MAX_TILT_EXPONENT:.3g})")
    if dry_run:
        return None
    N = sfft.next_fast_len(need, real=True)
    # upper side
    y, E, log_total, log_left, log_right = _compose_side(up, theta, w_lo, N, ch_up, roll=False)
    y_at = _window_shift(up, w_lo, N)  # (y is circular: the window order is made with its first pass)
    untilt = untilt_factor(log_total, theta, None, len(up), "up", start=w_lo, h=h, n=N, factored=True)
    # (1.0 - 1e-300 rounds to 1.0: the largest double below 1 keeps log1p finite; a term
    # capped there leaves a product <= 2^-53, which the rounding up below turns into 1)
    p_inf_up = -math.expm1(sum(k * math.log1p(-min(p.p_inf + c, _BELOW_ONE))
                               for p, k, c in zip(plds_upper, counts, cut_pinf)))
    p_inf_up = min(p_inf_up * (1.0 + 8.0 * _U * (1 + len(counts))), 1.0)  # round up
    const_up = p_inf_up
    if log_right > -np.inf:
        const_up += math.exp(min(700.0, log_right + log_total - theta * (w_lo + N) * h))
    if theta == 0.0 and log_left > -np.inf:
        const_up += math.exp(min(700.0, log_left + log_total))
    # a probability is at most 1: capping keeps the bound and removes inf * 0 hazards
    E_up = E
    m_up, m_ro = upper_masses(y, E, untilt, theta, h, overwrite_y=True, sparse_roundoff=True,
                              start=y_at)  # (y is not read again)
    upper = nonnegative(GridMeasure(h, w_lo, m_up, const_up, shift_up))  # (max(y, 0) u + r, capped)
    roundoff = (BlockRoundoff(h, w_lo, N, *m_ro, shift_up) if isinstance(m_ro, tuple)
                else GridMeasure(h, w_lo, m_ro, 0.0, shift_up))
    valid_from = -np.inf if theta == 0.0 else w_lo * h + max(shift_up, shift_lo)
    if upper_only:
        return Composition(upper, None, roundoff, float(theta), float(valid_from), math.inf, int(N), float(E_up))
    # lower side
    y, E, log_total, log_left, log_right = _compose_side(lo, theta, w_lo, N, ch_lo, roll=False)
    y_at = _window_shift(lo, w_lo, N)
    untilt = untilt_factor(log_total, theta, None, len(lo), "lo", start=w_lo, h=h, n=N, factored=True)
    F = [float(sd.masses.sum()) for sd in lo]
    log_fp = sum(k * math.log(max(f + p.p_inf, 1e-300)) for f, p, k in zip(F, plds_lower, counts))
    log_f = sum(k * math.log(max(f, 1e-300)) for f, k in zip(F, counts))
    p_inf_lo = max(math.exp(log_fp) - math.exp(log_f), 0.0)
    p_inf_lo = min(p_inf_lo, -math.expm1(sum(k * math.log1p(-min(p.p_inf, _BELOW_ONE))
                                                for p, k in zip(plds_lower, counts))))
    p_inf_lo *= 1.0 - 8.0 * _U * (1 + len(counts))  # round the lower bound down
    with np.errstate(over="ignore", invalid="ignore"):
        # (in window order, in y's own array where it starts at 0; y is not read again: the
        # same numbers as max(y - E, 0) * u)
        m_lo = _untilted(_positive_part(y, y_at, True, sub=E), untilt)
    # dropping mass is on the optimistic side (a NaN or infinite product -- inf * 0 -- becomes 0)
    m_lo[~np.isfinite(m_lo)] = 0.0
    lower = GridMeasure(h, w_lo, np.minimum(m_lo, 1.0, out=m_lo), p_inf_lo, shift_lo)
    # aliased (folded) tilted mass <= e^{log_left} + e^{log_right}; untilted at eps_j > eps
    # it weighs at most e^{log_total - theta (eps - shift_lo)} (lattice frame: eps - shift_lo)
    alias_log = float(np.logaddexp(log_left, log_right) + log_total + theta * shift_lo)
    return Composition(upper, lower, roundoff, float(theta), float(valid_from), alias_log, int(N), float(E_up))
