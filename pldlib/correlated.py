"""Banded matrix mechanisms (DP-FTRL with banded matrix factorisation, BandMF) under cyclic
Poisson sampling, as compositions of pldlib events (docs/MATH.md 13.7).

A matrix mechanism releases C x + z over n steps: x_i is the sum of the clipped gradients (norm
at most 1) of the records used at step i, C is an n x n lower-triangular *strategy* matrix and z
has independent N(0, (sigma m)^2) entries, m the largest column norm of C (so ``sigma`` is the
noise multiplier of the unamplified mechanism, as in JAX Privacy and dp_accounting). C is
``b``-banded when C[i, j] = 0 for i - j >= b.

**Cyclic Poisson sampling.** The records are split into b fixed groups; step i uses group i mod
b, each of its records independently with probability ``q``. A record of group j takes part at
steps j, j + b, j + 2b, ... (each with probability q) and column i of a b-banded C touches rows i
to i + b - 1 only, so its participations touch disjoint rows; the noise on distinct rows is
independent. The release therefore splits into independent blocks, block i a Poisson-subsampled
Gaussian with sensitivity |C[:, i]| and noise sigma m: the record's privacy is *exactly* that
composition (adaptively: block i is released before the record's next participation). The
worst record is the worst group, and a group whose column norms dominate another's (sorted,
count for count) dominates it (less noise dominates more; an extra step only adds), so the
answer is the maximum over the groups no other group dominates.

:func:`bandmf_cyclic_poisson` gives those groups' events; :func:`account_bandmf` answers
certified intervals. Poisson sampling of every record at every step (not cyclic) is the
mixture-of-Gaussians event of the conditional-composition analysis (docs/MATH.md 13.6), which
the dp_accounting adapter accepts as JAX Privacy builds it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _validate as V
from . import events as E
from .methods.base import Interval

__all__ = ["BandedStrategy", "bandmf_cyclic_poisson", "account_bandmf", "calibrate_bandmf", "BandMFAccounting"]


@dataclass(frozen=True)
class BandedStrategy:
    """A b-banded lower-triangular strategy matrix, by what privacy needs of it: its column norms
    (one per step) and its number of bands b.

    Build it with :meth:`from_matrix` (checks the band structure) or :meth:`toeplitz` (the
    banded Toeplitz strategies of BandMF: C[i, j] = coefs[i - j] for 0 <= i - j < b)."""

    column_norms: tuple
    bands: int

    def __post_init__(self):
        norms = tuple(float(x) for x in np.asarray(self.column_norms, dtype=float).ravel())
        if not norms:
            raise ValueError("column_norms: at least one step is needed")
        for i, x in enumerate(norms):
            if not (math.isfinite(x) and x >= 0.0):
                raise ValueError(f"column_norms[{i}] must be finite and >= 0, got {V.fmt(x)}")
        if max(norms) == 0.0:
            raise ValueError("column_norms: all zero (the strategy releases nothing of the data)")
        object.__setattr__(self, "column_norms", norms)
        object.__setattr__(self, "bands", V.int_at_least("bands", self.bands, 1))

    @property
    def steps(self) -> int:
        return len(self.column_norms)

    @property
    def max_norm(self) -> float:
        return max(self.column_norms)

    @classmethod
    def from_matrix(cls, strategy, bands: int | None = None) -> "BandedStrategy":
        """From an n x n lower-triangular matrix; ``bands`` (default: the smallest b that fits)
        must cover every non-zero entry (C[i, j] = 0 for i - j >= b)."""
        C = np.asarray(strategy, dtype=float)
        if C.ndim != 2 or C.shape[0] != C.shape[1] or C.shape[0] < 1:
            raise ValueError(f"strategy: a square n x n matrix, got shape {C.shape}")
        if not np.all(np.isfinite(C)):
            raise ValueError("strategy: entries must be finite")
        i, j = np.nonzero(C)
        if np.any(j > i):
            raise ValueError("strategy: must be lower triangular (step i's release uses steps <= i)")
        need = int((i - j).max()) + 1 if i.size else 1
        if bands is None:
            bands = need
        bands = V.int_at_least("bands", bands, 1)
        if need > bands:
            raise ValueError(f"bands: the strategy has non-zero entries {need - 1} steps below the diagonal, "
                             f"so it needs bands >= {need}, got {bands}")
        return cls(tuple(np.sqrt(np.sum(C * C, axis=0))), bands)

    @classmethod
    def toeplitz(cls, coefs, steps: int) -> "BandedStrategy":
        """The banded Toeplitz strategy C[i, j] = coefs[i - j] (0 <= i - j < len(coefs)) over
        ``steps`` steps; its last columns are cut by the end of training (smaller norms)."""
        c = np.asarray(coefs, dtype=float).ravel()
        if c.size < 1 or not np.all(np.isfinite(c)):
            raise ValueError("coefs: a non-empty list of finite numbers")
        if c[0] == 0.0:
            raise ValueError("coefs: coefs[0] (the diagonal) must be non-zero")
        n = V.int_at_least("steps", steps, 1)
        sq = np.cumsum(c * c)
        norms = [math.sqrt(sq[min(c.size, n - i) - 1]) for i in range(n)]
        return cls(tuple(norms), int(c.size))


def _group_norms(strategy: BandedStrategy) -> list[tuple[int, np.ndarray]]:
    """(group j, its participations' column norms sorted descending) for the groups that no other
    group dominates (docs/MATH.md 13.7)."""
    b, norms = strategy.bands, np.asarray(strategy.column_norms)
    groups = []
    for j in range(min(b, norms.size)):
        g = np.sort(norms[j::b])[::-1]
        groups.append((j, g[g > 0.0]))
    width = max(g.size for _, g in groups)
    pad = [np.concatenate([g, np.zeros(width - g.size)]) for _, g in groups]
    keep = []
    for a in range(len(groups)):
        dominated = any(np.all(pad[c] >= pad[a]) and (np.any(pad[c] > pad[a]) or c < a)
                        for c in range(len(groups)) if c != a)
        if not dominated:
            keep.append(groups[a])
    return keep


def bandmf_cyclic_poisson(noise_multiplier: float, strategy: BandedStrategy, q: float) -> list[list[tuple]]:
    """The events of a b-banded matrix mechanism under cyclic Poisson sampling: one list of
    (event, count) per group that no other group dominates; the mechanism's privacy curve is the
    maximum of their composed curves (docs/MATH.md 13.7).

    Each participation at step i is ``Sampled(GaussianEvent(sigma m / |C[:, i]|), q, "poisson")``
    (q = 1: the unsampled Gaussian), m the largest column norm."""
    sigma = V.positive_finite("noise_multiplier", noise_multiplier)
    if not isinstance(strategy, BandedStrategy):
        raise TypeError(f"strategy: a BandedStrategy (from_matrix / toeplitz), got {type(strategy).__name__}")
    q = V.sampling_rate("q", q)
    m = strategy.max_norm
    out = []
    for _, g in _group_norms(strategy):
        vals, counts = np.unique(g, return_counts=True)
        evs = []
        for c, k in zip(vals[::-1], counts[::-1]):
            base = E.GaussianEvent(sigma * m / float(c))
            evs.append((E.Sampled(base, q, "poisson") if q < 1.0 else base, int(k)))
        out.append(evs)
    return out


@dataclass(frozen=True)
class BandMFAccounting:
    """Certified answers for a banded matrix mechanism: the maximum over its groups' accountants."""

    accountants: tuple

    def epsilon(self, delta) -> Interval:
        """Certified interval for eps(delta) (the max over groups of each end)."""
        return _max_of([a.epsilon(delta) for a in self.accountants], scalar=np.ndim(delta) == 0)

    def delta(self, epsilon) -> Interval:
        """Certified interval for delta(eps) (the max over groups of each end)."""
        return _max_of([a.delta(epsilon) for a in self.accountants], scalar=np.ndim(epsilon) == 0)


def _max_of(ivs, scalar: bool) -> Interval:
    """The end-wise maximum of certified intervals of the same quantity's candidates."""
    lo = np.maximum.reduce([np.asarray(i.lower, float) for i in ivs])
    up = np.maximum.reduce([np.asarray(i.upper, float) for i in ivs])
    return Interval(float(lo), float(up)) if scalar else Interval(lo, up)


def account_bandmf(noise_multiplier: float, strategy: BandedStrategy, q: float, *, epochs: int = 1,
                   sampling: str = "cyclic_poisson", relation: str = "add_remove", method: str = "pld",
                   **options) -> BandMFAccounting:
    """Certified accounting of ``epochs`` passes of a b-banded matrix mechanism over
    ``strategy.steps`` steps each (the strategy restarts every pass: passes compose), with batch
    selection ``sampling`` (``"cyclic_poisson"``; docs/MATH.md 13.7 says which others are certified
    and where), under ``relation``, by the certified ``method`` (``"pld"``, ``"prv"``, ``"spa"``).

    Examples
    --------
    >>> s = BandedStrategy.toeplitz([1.0, 0.5, 0.25], steps=300)
    >>> account_bandmf(1.0, s, q=0.05).epsilon(1e-5)   # Interval(lower=..., upper=...)
    """
    from .methods import make_accountant, method_info, method_names

    if sampling != "cyclic_poisson":
        raise ValueError(f"sampling: {sampling!r} is not certified for banded matrix mechanisms here; "
                         "'cyclic_poisson' is (exact reduction); for Poisson sampling build the "
                         "mixture-of-Gaussians event (MixtureOfGaussiansEvent, as JAX Privacy's "
                         "amplified_bandmf_event does); balls-in-bins and b-min-sep have no certified bound here")
    V.choice("method", method, method_names())
    if method_info(method).kind != "certified":
        raise ValueError(f"method: {method!r} gives no certified interval; use pld, prv or spa")
    epochs = V.int_at_least("epochs", epochs, 1)
    accs = []
    for evs in bandmf_cyclic_poisson(noise_multiplier, strategy, q):
        acc = make_accountant(method, relation, **options)
        for ev, k in evs:
            acc.compose(ev, k * epochs)
        accs.append(acc)
    return BandMFAccounting(tuple(accs))


def calibrate_bandmf(epsilon: float, delta: float, strategy: BandedStrategy, q: float, *, epochs: int = 1,
                     relation: str = "add_remove", method: str = "pld", tol: float = 1e-3,
                     bounds: tuple = (1e-2, 1e3)) -> float:
    """The smallest noise multiplier (within ``tol``) whose certified eps(delta) of
    :func:`account_bandmf` (cyclic Poisson) is at most ``epsilon``: certified for each group that
    no other group dominates (:func:`pldlib.calibration.calibrate_parameter`), the largest of
    those sigmas (eps falls as sigma grows, so it meets the target for every group).

    Raises :class:`pldlib.calibration.TargetUnreachableError` when even ``bounds[1]`` does not
    meet the target."""
    from .calibration import calibrate_parameter

    V.positive_finite("epsilon", epsilon)
    V.probability_open("delta", delta)
    if not isinstance(strategy, BandedStrategy):
        raise TypeError(f"strategy: a BandedStrategy (from_matrix / toeplitz), got {type(strategy).__name__}")
    q = V.sampling_rate("q", q)
    epochs = V.int_at_least("epochs", epochs, 1)
    n_groups = len(_group_norms(strategy))
    best = 0.0
    for gi in range(n_groups):
        def make_group(sigma, gi=gi):
            evs = bandmf_cyclic_poisson(sigma, strategy, q)[gi]
            return E.Composed(tuple(E.SelfComposed(ev, k * epochs) for ev, k in evs))

        r = calibrate_parameter(make_group, bounds, direction="larger_is_more_private", epsilon=epsilon, delta=delta,
                                parameter="noise_multiplier", method=method, relation=relation, tol=tol)
        best = max(best, float(r.value))
    return best
