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
from dataclasses import dataclass, field

import numpy as np

from . import _validate as V
from . import events as E
from .methods.base import Interval

__all__ = ["BandedStrategy", "bandmf_cyclic_poisson", "account_bandmf", "calibrate_bandmf", "BandMFAccounting",
           "balls_in_bins_bandmf", "BallsInBinsBandMF", "bin_groups", "thinned_lower_pairs",
           "bin_gram", "max_test_curve", "b_min_sep_bandmf", "BMinSepBandMF", "min_sep_count_law",
           "BANDMF_SAMPLINGS", "sqrt_toeplitz_coefs", "bandmf_run"]


@dataclass(frozen=True)
class BandedStrategy:
    """A b-banded lower-triangular strategy matrix, by what privacy needs of it: its column norms
    (one per step) and its number of bands b.

    Build it with :meth:`from_matrix` (checks the band structure) or :meth:`toeplitz` (the
    banded Toeplitz strategies of BandMF: C[i, j] = coefs[i - j] for 0 <= i - j < b)."""

    column_norms: tuple
    bands: int
    #: (bands, steps) array, diagonals[k, i] = C[i + k, i] (0 past the last row), when known: balls-in-bins
    #: lower bounds use the columns' inner products (:func:`bin_gram_rows`)
    diagonals: object = field(default=None, compare=False, repr=False)

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
        if self.diagonals is not None:
            d = np.asarray(self.diagonals, dtype=float)
            if d.shape != (self.bands, len(norms)) or not np.all(np.isfinite(d)):
                raise ValueError(f"diagonals: a finite ({self.bands}, {len(norms)}) array, got shape {d.shape}")
            # (the upper ends read the column norms, the lower ends the diagonals: they must agree)
            if not np.allclose(np.sqrt(np.sum(d * d, axis=0)), norms, rtol=1e-9, atol=0.0):
                raise ValueError("diagonals: their column norms differ from column_norms (give one strategy)")
            object.__setattr__(self, "diagonals", d)

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
        n = C.shape[0]
        diags = np.array([np.concatenate([np.diagonal(C, -k), np.zeros(k)]) if k < n else np.zeros(n)
                          for k in range(bands)])
        return cls(tuple(np.sqrt(np.sum(C * C, axis=0))), bands, diags)

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
        i = np.arange(n)
        diags = np.array([np.where(i + k < n, c[k], 0.0) for k in range(c.size)])
        return cls(tuple(norms), int(c.size), diags)


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


def account_bandmf(noise_multiplier: float, strategy: BandedStrategy, q: float | None = None, *, epochs: int = 1,
                   sampling: str = "cyclic_poisson", relation: str = "add_remove", method: str = "pld",
                   bins: int | None = None, min_sep: int | None = None, **options):
    """Certified accounting of ``epochs`` passes of a b-banded matrix mechanism over
    ``strategy.steps`` steps each (the strategy restarts every pass: passes compose), with batch
    selection ``sampling``, under ``relation``, by the certified ``method`` (``"pld"``, ``"prv"``,
    ``"spa"``):

    - ``"cyclic_poisson"`` (probability ``q`` in the record's group's steps): exact (MATH 13.7);
    - ``"balls_in_bins"`` with ``bins`` (each record's bin fixed for the run, ``q`` unused):
      :func:`balls_in_bins_bandmf`, a certified interval that is not tight (MATH 13.10);
    - ``"b_min_sep"`` with ``min_sep`` and ``q`` (JAX Privacy's ``BMinSepSampling``):
      :func:`b_min_sep_bandmf`, a wide certified interval (unamplified upper end; MATH 13.11).

    Examples
    --------
    >>> s = BandedStrategy.toeplitz([1.0, 0.5, 0.25], steps=300)
    >>> account_bandmf(1.0, s, q=0.05).epsilon(1e-5)   # Interval(lower=..., upper=...)
    """
    from .methods import make_accountant, method_info, method_names

    if sampling not in ("cyclic_poisson", "balls_in_bins", "b_min_sep"):
        raise ValueError(f"sampling: {sampling!r} is not certified for banded matrix mechanisms here; "
                         "'cyclic_poisson' (exact reduction), 'balls_in_bins' and 'b_min_sep' (certified "
                         "intervals, not tight) are; for Poisson sampling build the mixture-of-Gaussians event "
                         "(MixtureOfGaussiansEvent, as JAX Privacy's amplified_bandmf_event does)")
    V.choice("method", method, method_names())
    if method_info(method).kind != "certified":
        raise ValueError(f"method: {method!r} gives no certified interval; use pld, prv or spa")
    epochs = V.int_at_least("epochs", epochs, 1)
    if sampling == "balls_in_bins":
        if bins is None:
            raise ValueError("bins: balls-in-bins sampling needs the number of bins (JAX Privacy's cycle_length)")
        if epochs != 1:
            raise ValueError("epochs: balls-in-bins keeps each record's bin for the whole run; build the "
                             "strategy over all the run's steps (BandedStrategy.toeplitz(coefs, steps=iterations)) "
                             "and pass epochs=1")
        return balls_in_bins_bandmf(noise_multiplier, strategy, bins, relation=relation, method=method, **options)
    if sampling == "b_min_sep":
        if min_sep is None or q is None:
            raise ValueError("min_sep and q: b-min-sep sampling needs both (q: the probability that an eligible "
                             "record takes part)")
        if epochs != 1:
            raise ValueError("epochs: build the strategy over all the run's steps and pass epochs=1")
        return b_min_sep_bandmf(noise_multiplier, strategy, q, min_sep, relation=relation, method=method, **options)
    if bins is not None or min_sep is not None:
        raise ValueError("bins / min_sep: only balls-in-bins (bins) and b-min-sep (min_sep) sampling take them "
                         "(cyclic Poisson's cycle is the strategy's bands)")
    if q is None:
        raise ValueError("q: cyclic Poisson sampling needs the sampling probability q")
    accs = []
    for evs in bandmf_cyclic_poisson(noise_multiplier, strategy, q):
        acc = make_accountant(method, relation, **options)
        for ev, k in evs:
            acc.compose(ev, k * epochs)
        accs.append(acc)
    return BandMFAccounting(tuple(accs))


def _smallest_meeting(upper, epsilon: float, lo: float, hi: float, tol: float, f_hi: float) -> float:
    """The smallest sigma in [lo, hi] (within the relative ``tol``) with ``upper(sigma) <= epsilon``,
    where ``upper`` falls as sigma grows and ``f_hi = upper(hi)`` meets the target.

    A bracket [fails, meets] shrinks by log-log regula falsi (eps falls about as a power of
    sigma), Illinois-weighted when one end is kept twice, each point at least the tolerance
    inside the bracket (so that a point beyond the root closes it).  While the failing end has
    no finite value (too little noise to certify), the line through the last two meeting points
    is extended instead, or the bracket is bisected geometrically.  The answer is always a sigma
    whose ``upper`` was checked to meet the target; ``lo`` is returned only when it meets the
    target itself.  Far fewer evaluations than bisection where they are dear (small sigma), e.g.
    6-8 instead of 15 from (0.01, 1000) at tol 1e-3."""
    f_lo = upper(lo)
    if f_lo <= epsilon:
        return lo
    target = math.log(epsilon)
    w_lo = w_hi = 1.0  # (Illinois weights of the ends' residuals)
    kept = ""  # the end kept by the last step
    step = (1.0 + tol) * (1.0 - 1e-9)
    prev = None  # (the meeting point before hi, and its value)

    def through(x0, f0, x1, f1, w0=1.0, w1=1.0):  # (where the log-log line through two points meets the target)
        r0, r1 = w0 * (math.log(f0) - target), w1 * (math.log(f1) - target)
        if r0 == r1:
            return math.nan
        ln = math.log(x0) + (math.log(x1) - math.log(x0)) * r0 / (r0 - r1)
        return math.exp(min(max(ln, math.log(lo)), math.log(hi)))  # (an extension may point outside)

    while hi / lo > 1.0 + tol:
        x = math.nan
        if math.isfinite(f_lo) and f_lo > 0 and f_hi > 0:
            x = through(lo, f_lo, hi, f_hi, w_lo, w_hi)
        elif prev is not None and prev[1] > 0 and f_hi > 0:
            x = through(prev[0], prev[1], hi, f_hi)
        if math.isnan(x) or hi / lo <= step * step:
            x = math.sqrt(lo * hi)
        else:  # (a point within tol of an end moves to tol from it: the bracket closes if it lands beyond)
            x = min(max(x, lo * step), hi / step)
        fx = upper(x)
        if fx <= epsilon:
            prev = (hi, f_hi)
            hi, f_hi, w_hi = x, fx, 1.0
            w_lo = w_lo / 2.0 if kept == "lo" else 1.0
            kept = "lo"
        else:
            lo, f_lo, w_lo = x, fx, 1.0
            w_hi = w_hi / 2.0 if kept == "hi" else 1.0
            kept = "hi"
    return hi


def calibrate_bandmf(epsilon: float, delta: float, strategy: BandedStrategy, q: float | None = None, *,
                     epochs: int = 1, relation: str = "add_remove", method: str = "pld", tol: float = 1e-3,
                     bounds: tuple = (1e-2, 1e3), sampling: str = "cyclic_poisson",
                     bins: int | None = None, min_sep: int | None = None) -> float:
    """The smallest noise multiplier (within ``tol``) whose certified eps(delta) of
    :func:`account_bandmf` is at most ``epsilon``.

    Cyclic Poisson: certified for each group that no other group dominates
    (:func:`pldlib.calibration.calibrate_parameter`), the largest of those sigmas (eps falls as
    sigma grows, so it meets the target for every group).  Balls-in-bins (``bins``) and b-min-sep
    (``min_sep``, ``q`` the probability p): a log-log regula falsi on a bracket of the certified
    upper end of :func:`balls_in_bins_bandmf` / :func:`b_min_sep_bandmf` (each of their pieces
    falls as sigma grows); the sigma returned meets the target.

    Raises :class:`pldlib.calibration.TargetUnreachableError` when even ``bounds[1]`` does not
    meet the target."""
    from .calibration import TargetUnreachableError, calibrate_parameter
    from ._validate import GridTooLargeError, PrecisionLimitError

    V.positive_finite("epsilon", epsilon)
    V.probability_open("delta", delta)
    if not isinstance(strategy, BandedStrategy):
        raise TypeError(f"strategy: a BandedStrategy (from_matrix / toeplitz), got {type(strategy).__name__}")
    epochs = V.int_at_least("epochs", epochs, 1)
    V.positive_finite("tol", tol)
    lo, hi = (V.positive_finite("bounds[0]", bounds[0]), V.positive_finite("bounds[1]", bounds[1]))
    if not lo < hi:
        raise ValueError(f"bounds: the lower end must be below the upper end, got {bounds}")
    if sampling in ("balls_in_bins", "b_min_sep"):
        if sampling == "balls_in_bins" and bins is None:
            raise ValueError("bins: balls-in-bins sampling needs the number of bins (JAX Privacy's cycle_length)")
        if sampling == "b_min_sep" and (min_sep is None or q is None):
            raise ValueError("min_sep and q: b-min-sep sampling needs both (q: the probability that an eligible "
                             "record takes part)")
        if epochs != 1:
            raise ValueError(f"epochs: {sampling} batches are accounted over the whole run; build the strategy "
                             "over all the run's steps and pass epochs=1")

        def upper(sig):  # (too little noise for floating point: not met, the safe side)
            try:
                if sampling == "balls_in_bins":
                    acc = balls_in_bins_bandmf(sig, strategy, bins, relation=relation, method=method, upper_only=True)
                else:
                    acc = b_min_sep_bandmf(sig, strategy, q, min_sep, relation=relation, method=method,
                                           upper_only=True)
                return float(acc.epsilon(delta).upper)
            except (PrecisionLimitError, GridTooLargeError):  # (LossRangeError is a PrecisionLimitError)
                return math.inf

        f_hi = upper(hi)
        if not f_hi <= epsilon:
            raise TargetUnreachableError(
                f"epsilon: {V.fmt(epsilon)} at delta {V.fmt(delta)} is not met even at noise multiplier "
                f"{V.fmt(hi)} (certified eps there {V.fmt(f_hi)}); raise bounds[1]")
        return _smallest_meeting(upper, epsilon, lo, hi, tol, f_hi)
    if sampling != "cyclic_poisson":
        raise ValueError(f"sampling: {sampling!r}; 'cyclic_poisson', 'balls_in_bins' or 'b_min_sep'")
    if q is None:
        raise ValueError("q: cyclic Poisson sampling needs the sampling probability q")
    q = V.sampling_rate("q", q)
    n_groups = len(_group_norms(strategy))
    best = 0.0
    for gi in range(n_groups):
        def make_group(sigma, gi=gi):
            evs = bandmf_cyclic_poisson(sigma, strategy, q)[gi]
            return E.Composed(tuple(E.SelfComposed(ev, k * epochs) for ev, k in evs))

        r = calibrate_parameter(make_group, (lo, hi), direction="larger_is_more_private", epsilon=epsilon,
                                delta=delta, parameter="noise_multiplier", method=method, relation=relation, tol=tol)
        best = max(best, float(r.value))
    return best


# -- balls-in-bins batches (docs/MATH.md 13.10) ---------------------------------------------------

def bin_groups(bins: int, bands: int) -> list[list[int]]:
    """A partition of the cycle's bins 0..bins-1 into groups whose bins are pairwise at cyclic
    distance >= ``bands`` (so a b-banded strategy gives their records disjoint rows), with as many
    groups of the largest possible size t = bins // bands as possible (docs/MATH.md 13.10).

    The cycle is cut into t runs of consecutive bins, each of length >= bands (lengths
    bins // t or one more); group o holds the o-th bin of every run long enough to have one.
    Consecutive members are a whole run apart (>= bands), also across the cycle's end."""
    b = V.int_at_least("bins", bins, 1)
    beta = V.int_at_least("bands", bands, 1)
    if beta > b:
        raise ValueError(f"bands: {beta} bands exceed the {b} bins: a record's participations one cycle apart "
                         "would share rows of the release; use a strategy with at most as many bands as bins")
    t = b // beta
    base, extra = divmod(b, t)
    starts, pos = [], 0
    lengths = [base + (1 if r < extra else 0) for r in range(t)]
    for ln in lengths:
        starts.append(pos)
        pos += ln
    groups = []
    for o in range(max(lengths)):
        groups.append([st + o for st, ln in zip(starts, lengths) if ln > o])
    return groups


def thinned_lower_pairs(column_norms, bins: int, bands: int) -> list[tuple[float, int, float]]:
    """[(p, t, r)]: lower-bound pairs of balls-in-bins batches (docs/MATH.md 13.10 (iv)): with a
    record whose gradient is 0 except at the steps d k (k = 0, 1, ...; gaps d >= bands, so their
    columns touch disjoint rows), the release is random allocation over the bins with bin J's
    sensitivity r_J (its active columns' norms together).  Keeping the t bins with r_J >= r
    (scaled down to r, the others replaced by noise: post-processing) leaves with probability
    p = t / bins one epoch of random allocation over t slots at sensitivity r, else nothing.
    Gaps tried: ``bands`` and the first gap >= bands prime to ``bins`` (every bin then active when
    the run is long enough); every level r of the bins' sensitivities."""
    norms = np.asarray(column_norms, float)
    T, b = norms.size, int(bins)
    gaps = [bands]
    d = bands
    while math.gcd(d, b) != 1 and d < bands + b:
        d += 1
    if d != bands and math.gcd(d, b) == 1:
        gaps.append(d)
    out = []
    for d in gaps:
        steps = np.arange(0, T, d)
        r2 = np.zeros(b)
        np.add.at(r2, steps % b, norms[steps] ** 2)
        r = np.sqrt(r2)
        for level in np.unique(r[r > 0.0]):
            t = int(np.sum(r >= level))
            out.append((t / b, t, float(level)))
    # (a level kept only if no other has as many bins or more at as large a sensitivity or more)
    keep = [x for x in out if not any((y[1] >= x[1] and y[2] >= x[2] and y != x) for y in out)]
    return sorted(set(keep))


def bin_gram(strategy: BandedStrategy, bins: int) -> np.ndarray:
    """The bins x bins matrix of <s_J, s_K>, s_J the sum of the strategy's columns J, J + bins, ...
    (the release's shift when the record is in bin J with gradient 1 at each of its steps), from
    the strategy's diagonals (columns closer than ``bands`` share rows)."""
    D = strategy.diagonals
    if D is None:
        raise ValueError("strategy: its diagonals are not known (build it with from_matrix or toeplitz)")
    beta, T = D.shape
    b = int(bins)
    G = np.zeros(b * b)
    a = np.arange(T)
    for dlt in range(min(beta, T)):
        # <C_a, C_{a+dlt}> = sum_k C[a+dlt+k, a+dlt] C[a+dlt+k, a] = sum_k D[k, a+dlt] D[k+dlt, a]
        n = T - dlt
        v = np.einsum("ki,ki->i", D[: beta - dlt, dlt:], D[dlt:, :n])
        idx = (a[:n] % b) * b + (a[:n] + dlt) % b
        np.add.at(G, idx, v)
        if dlt:
            np.add.at(G, ((a[:n] + dlt) % b) * b + a[:n] % b, v)
    return G.reshape(b, b)


#: the max test's thresholds (in units of the noise, docs/MATH.md 13.10 (v))
_TAUS = np.linspace(-2.0, 40.0, 8401)
#: relative margins on the max test's probabilities (float error of log_ndtr/expm1 is far smaller)
_TEST_MARGIN = 1e-9


def max_test_curve(strategy: BandedStrategy, bins: int, noise_std: float, group) -> tuple[np.ndarray, np.ndarray]:
    """(P_lo, Q_up) on the thresholds :data:`_TAUS` of the test "some u_J > tau", u_J = <s_J, y> /
    (noise_std |s_J|) over the bins J of ``group`` (pairwise at least ``bands`` apart, so the u_J are
    independent unit Gaussians under the unchanged output Q): Q(test) = 1 - Phi(tau)^t exactly; with
    the record in bin K the u_J have means G[J, K] / (noise_std |s_J|), so P(test) = mean_K (1 -
    prod_J Phi(tau - mean_JK)).  Both rounded to the safe side (docs/MATH.md 13.10 (v))."""
    from scipy.special import log_ndtr

    G = bin_gram(strategy, bins)
    A = np.asarray(group, int)
    rA = np.sqrt(np.maximum(np.diag(G)[A], 0.0))
    keep = rA > 0.0
    A, rA = A[keep], rA[keep]
    if A.size == 0:
        return np.zeros(_TAUS.size), np.ones(_TAUS.size)
    mu = G[A, :] / (rA[:, None] * noise_std)            # (t, bins)
    t = A.size
    lp = np.zeros((_TAUS.size, mu.shape[1]))
    for j in range(t):
        lp += log_ndtr(_TAUS[:, None] - mu[j][None, :])
    P = np.mean(-np.expm1(lp), axis=1) * (1.0 - _TEST_MARGIN)
    Q = -np.expm1(t * log_ndtr(_TAUS)) * (1.0 + _TEST_MARGIN) + 1e-300
    return np.maximum(P, 0.0), np.minimum(Q, 1.0)


def _ra_event(slot_sigma: float, t: int):
    """One epoch of random allocation over t slots at noise multiplier ``slot_sigma`` (t = 1: the
    Gaussian), as (event, count)."""
    g = E.GaussianEvent(slot_sigma)
    return (g, 1) if t == 1 else (E.Sampled(g, 1.0 / t, "random_allocation"), t)


def _bisect(f, lo, hi, want_true_at: str, iters: int = 60):
    """Vectorised bisection of a monotone predicate f(eps) (array -> bool array), True for large
    eps: returns the smallest eps found where f holds (``want_true_at="hi"``: an eps at which f is
    known True) or the largest where it fails (``"lo"``)."""
    lo, hi = np.array(lo, float), np.array(hi, float)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        ok = f(mid)
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
        if np.all(hi - lo <= 1e-12 * np.maximum(1.0, np.abs(hi))):
            break
    return hi if want_true_at == "hi" else lo


@dataclass(frozen=True)
class BallsInBinsBandMF:
    """Certified answers for a banded matrix mechanism under balls-in-bins batches (docs/MATH.md
    13.10): each record's bin J, uniform over ``bins``, is fixed for the run, so it takes part in
    steps J, J + bins, ...

    Upper end (pessimistic): the smaller of (i) the average over :func:`bin_groups` of one epoch of
    random allocation over the group (joint convexity over the bins' offsets; a group's bins touch
    disjoint rows) and (ii) the unamplified Gaussian of the heaviest bin; both at slot noise
    sigma m / r_max, r_J the norm of bin J's columns together.  Lower end (optimistic): the largest
    of (iii) one bin of weight 1/bins (a Poisson step at q = 1/bins), (iv) t bins at weight t/bins
    (random allocation over them, mixed with the unchanged output), both exact curves of data sets
    whose record's gradient is 0 elsewhere, and (v) a max test on the real release
    (:func:`max_test_curve`)."""

    groups_upper: tuple    # ((weight, accountant), ...)
    unamplified: object    # accountant
    one_bin: object        # accountant (the Poisson step)
    group_lower: tuple     # ((p, {direction: accountant}), ...)
    relation: str
    max_test: tuple = None  # (P_lo, Q_up) of :func:`max_test_curve` (remove direction), or None

    # -- pieces as delta curves -------------------------------------------
    def _delta_upper(self, eps):
        # (the weighted sum rounded up: a few ulp, far inside the relative 1e-14 added)
        avg = sum(w * np.asarray(a.delta(eps).upper, float) for w, a in self.groups_upper) * (1.0 + 1e-14)
        return np.minimum(np.minimum(avg, np.asarray(self.unamplified.delta(eps).upper, float)), 1.0)

    def _delta_group_lower(self, eps):
        """Exact-curve lower bounds (iv): P = p RA + (1 - p) Q against Q, per direction; their max.
        The transformed eps are rounded up (RA's lower curve falls in eps) and the products down
        (a relative 1e-12 each: far beyond the few ulp of exp, log and the products)."""
        eps = np.asarray(eps, float)
        out = np.zeros(eps.shape)
        a = np.exp(np.minimum(eps, 700.0))
        up, down = 1e-12, 1.0 - 1e-12
        for p, accs in self.group_lower:
            if "remove" in accs:  # H_a(p M + (1 - p) Q || Q) = p H_{1 + (a - 1)/p}(M || Q)
                arg = 1.0 + (a - 1.0) / p
                ok = arg > 0
                e2 = np.log(np.where(ok, arg, 1.0))
                e2 = e2 + up * np.maximum(1.0, np.abs(e2))
                d = np.where(ok, p * np.asarray(accs["remove"].delta(e2).lower, float), 1.0 - a) * down
                out = np.maximum(out, d)
            if "add" in accs:  # H_a(Q || p M + (1 - p) Q) = (1 - a (1 - p)) H_{a p / (1 - a (1 - p))}(Q || M)
                c = 1.0 - a * (1.0 - p)
                pos = c > 0
                e2 = np.log(np.where(pos, a * p / np.where(pos, c, 1.0), 1.0))
                e2 = e2 + up * np.maximum(1.0, np.abs(e2))
                d = np.where(pos, c * np.asarray(accs["add"].delta(e2).lower, float), 0.0) * down
                out = np.maximum(out, d)
        return np.maximum(out, 0.0)

    def _delta_test(self, eps):
        """(v): max over thresholds of P(test) - e^eps Q(test) (remove direction; 0 without it)."""
        eps = np.asarray(eps, float)
        if self.max_test is None or self.relation == "add":
            return np.zeros(eps.shape)
        P, Q = self.max_test
        a = np.exp(np.minimum(eps, 700.0))
        return np.maximum(np.max(P[None, :] - a.reshape(-1, 1) * Q[None, :], axis=1).reshape(eps.shape), 0.0)

    def _eps_test(self, d):
        """(v) as eps: max over thresholds of log((P - delta) / Q) (-inf where P <= delta)."""
        if self.max_test is None or self.relation == "add":
            return np.full(d.shape, -np.inf)
        P, Q = self.max_test
        diff = P[None, :] - d.reshape(-1, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(diff > 0, np.log(np.where(diff > 0, diff, 1.0)) - np.log(Q[None, :]), -np.inf)
        out = np.max(e, axis=1)
        return out - 1e-12 * np.abs(out)  # (the logs' rounding, to the safe side)

    def _delta_lower(self, eps):
        return np.maximum(np.maximum(np.asarray(self.one_bin.delta(eps).lower, float), self._delta_group_lower(eps)),
                          self._delta_test(eps))

    # -- queries ------------------------------------------------------------
    def delta(self, epsilon) -> Interval:
        """Certified interval for delta(eps)."""
        e = np.asarray(epsilon, float)
        lo, up = self._delta_lower(e), self._delta_upper(e)
        lo = np.minimum(lo, up)
        return Interval(float(lo), float(up)) if e.ndim == 0 else Interval(lo, up)

    def epsilon(self, delta) -> Interval:
        """Certified interval for eps(delta): the upper end an eps at which the upper curve is at most
        delta, the lower end one at which the lower curve still exceeds delta (bisection)."""
        d = np.atleast_1d(np.asarray(delta, float))
        un = np.asarray(self.unamplified.epsilon(d).upper, float)  # (i's curve is at most delta there)
        lo1 = np.asarray(self.one_bin.epsilon(d).lower, float)
        hi = un
        start = np.minimum(lo1, hi) - 1.0
        up = _bisect(lambda x: self._delta_upper(x) <= d, start, hi, "hi")
        if len(self.groups_upper) == 1:  # one group size: its own eps is certified directly
            up = np.minimum(up, np.asarray(self.groups_upper[0][1].epsilon(d).upper, float))
        lo2 = _bisect(lambda x: self._delta_group_lower(x) <= d, np.minimum(lo1, up) - 1.0, up, "lo") \
            if self.group_lower else np.full(d.shape, -np.inf)
        # (lo2 is an eps where the lower curve exceeds delta, unless that never happened: check it)
        lo2 = np.where(self._delta_group_lower(lo2) > d, lo2, -np.inf)
        for p, accs in self.group_lower:  # p = 1: the pair is random allocation itself, read directly
            if p == 1.0:
                for a in accs.values():
                    lo2 = np.maximum(lo2, np.asarray(a.epsilon(d).lower, float))
        lo = np.minimum(np.maximum(np.maximum(lo1, lo2), self._eps_test(d)), up)
        if np.ndim(delta) == 0:
            return Interval(float(lo[0]), float(up[0]))
        return Interval(lo, up)


def balls_in_bins_bandmf(noise_multiplier: float, strategy: BandedStrategy, bins: int, *,
                         relation: str = "add_remove", method: str = "pld", upper_only: bool = False,
                         **options) -> BallsInBinsBandMF:
    """Certified accounting of a b-banded matrix mechanism over ``strategy.steps`` steps whose
    batches are balls in ``bins`` bins (JAX Privacy's ``BallsInBinsSampling`` with cycle_length =
    bins): each record's bin is drawn once and kept, so it takes part in every bins-th step.  Needs
    bands <= bins.  Non-adaptive queries, as random allocation's own bound (docs/MATH.md 13.10).
    ``upper_only``: skip the lower end's pieces (its answers' lower ends are then only (iii)).

    The interval is certified on both ends but not tight: the upper end lets the adversary know
    the bin's position within its group (t = bins // bands bins per group), so it amplifies like t
    bins, not ``bins``; with one band it is exact (one epoch of random allocation over ``bins``).

    Examples
    --------
    >>> s = BandedStrategy.toeplitz([1.0, 0.5, 0.25], steps=1000)
    >>> balls_in_bins_bandmf(4.0, s, bins=100).epsilon(1e-5)   # Interval(lower=..., upper=...)
    """
    from .methods import make_accountant, method_info, method_names

    sigma = V.positive_finite("noise_multiplier", noise_multiplier)
    if not isinstance(strategy, BandedStrategy):
        raise TypeError(f"strategy: a BandedStrategy (from_matrix / toeplitz), got {type(strategy).__name__}")
    b = V.int_at_least("bins", bins, 1)
    V.choice("relation", relation, ("add", "remove", "add_remove"))
    V.choice("method", method, method_names())
    if method_info(method).kind != "certified":
        raise ValueError(f"method: {method!r} gives no certified interval; use pld, prv or spa")
    groups = bin_groups(b, strategy.bands)
    norms = np.asarray(strategy.column_norms)
    r = np.array([math.sqrt(float(np.sum(norms[j::b] ** 2))) for j in range(b)])
    if not np.any(r > 0.0):
        raise ValueError("strategy: no bin takes part in any step (more bins than steps with non-zero columns)")
    s_noise = sigma * strategy.max_norm  # the noise's standard deviation

    def acc_of(evs, rel=relation):
        a = make_accountant(method, rel, **options)
        for ev, k in evs:
            a.compose(ev, k)
        return a

    r_max = float(r.max())
    sizes = {}
    for g in groups:
        sizes[len(g)] = sizes.get(len(g), 0) + len(g)
    ups = tuple((n / b, acc_of([_ra_event(s_noise / r_max, t)])) for t, n in sorted(sizes.items(), reverse=True))
    unamp = acc_of([(E.GaussianEvent(s_noise / r_max), 1)])
    one = acc_of([(E.Sampled(E.GaussianEvent(s_noise / r_max), 1.0 / b, "poisson") if b > 1
                   else E.GaussianEvent(s_noise / r_max), 1)])
    dirs = ("add", "remove") if relation == "add_remove" else (relation,)
    lows = () if upper_only else tuple(
        (p, {d: acc_of([_ra_event(s_noise / r_t, t)], d) for d in dirs})
        for p, t, r_t in thinned_lower_pairs(norms, b, strategy.bands) if t > 1 and r_t > 0.0)
    test = None
    if strategy.diagonals is not None and relation != "add" and not upper_only:
        big = max(len(g) for g in groups)
        best = max((g for g in groups if len(g) == big), key=lambda g: float(np.min(r[g])))
        test = max_test_curve(strategy, b, s_noise, best)
    return BallsInBinsBandMF(ups, unamp, one, lows, relation, test)


# -- b-min-sep batches (docs/MATH.md 13.11) ---------------------------------------------------------

def min_sep_count_law(active, min_sep: int, p: float, warm_start: bool = True) -> np.ndarray:
    """P(N = n), N the number of a record's participations at the ``active`` steps under b-min-sep
    sampling (JAX Privacy's ``BMinSepSampling``): a record that did not take part in the previous
    min_sep - 1 steps takes part with probability ``p``.  ``warm_start``: the participation chain
    starts in its stationary law (JAX Privacy's default), else eligible.  Forward recursion over
    the steps on (steps since the last participation, capped at min_sep - 1) x (count so far)."""
    act = np.asarray(active, bool)
    b = int(min_sep)
    nmax = int(act.sum())
    width = min(nmax, -(-act.size // b)) + 1  # (at most one participation per b steps)
    # state a = 0..b-2: blocked (a steps after the last participation); b - 1: eligible
    S = np.zeros((b, width))
    if warm_start and b > 1:
        S[:, 0] = p / (1.0 + (b - 1) * p)
        S[b - 1, 0] = 1.0 / (1.0 + (b - 1) * p)
    else:
        S[b - 1, 0] = 1.0
    for t in range(act.size):
        elig = S[b - 1]
        took = p * elig
        new = np.zeros_like(S)
        if act[t]:  # a participant's count goes up (the last column cannot be passed: width is the most)
            new[0, 1:] += took[:-1]
            new[0, -1] += took[-1]
        else:
            new[0] += took
        new[b - 1] += elig * (1.0 - p)  # (b = 1: state 0 is the eligible one; no blocked states)
        if b > 1:
            new[1:b - 1] += S[0:b - 2]
            new[b - 1] += S[b - 2]
        S = new
    return S.sum(axis=0)


@dataclass(frozen=True)
class BMinSepBandMF:
    """Certified answers for a banded matrix mechanism under b-min-sep batches (docs/MATH.md 13.11).

    Upper end (pessimistic): the smaller of the unamplified Gaussian of the largest shift any
    admissible participation pattern gives and T Poisson steps at rate p with noise sigma m / |C|
    (|C| bounded above by the Schur test).  Lower end (optimistic): the exact curve of one
    statistic of a real data set's release, a mixture of Gaussians over the participation count,
    lowered by its probabilities' rounding.  The ends can be far apart."""

    lower_acc: object  # (None: no lower piece, the bound every pair meets)
    upper_accs: tuple  # (the unamplified Gaussian, the spectral Poisson steps)
    margin: float
    level: float = 0.0                                                # the lower end's data set: gradient
    active: object = field(default=None, compare=False, repr=False)  # level / a_j at these steps

    def delta(self, epsilon) -> Interval:
        e = np.asarray(epsilon, float)
        up = np.minimum.reduce([np.asarray(a.delta(e).upper, float) for a in self.upper_accs])
        if self.lower_acc is None:
            lo = np.maximum(-np.expm1(np.minimum(e, 700.0)), 0.0) * (1.0 - 1e-15)
        else:
            lo = np.maximum(np.asarray(self.lower_acc.delta(e).lower, float) - self.margin, 0.0)
        lo = np.minimum(lo, up)
        return Interval(float(lo), float(up)) if e.ndim == 0 else Interval(lo, up)

    def epsilon(self, delta) -> Interval:
        d = np.asarray(delta, float)
        up = np.minimum.reduce([np.asarray(a.epsilon(d).upper, float) for a in self.upper_accs])
        dd = np.minimum(d + self.margin, 1.0 - 1e-16)
        if self.lower_acc is None:
            lo = np.minimum(np.log1p(-d) * (1.0 + 1e-15), up)
        else:
            lo = np.minimum(np.asarray(self.lower_acc.epsilon(dd).lower, float), up)
        return Interval(float(lo), float(up)) if d.ndim == 0 else Interval(lo, up)


def b_min_sep_bandmf(noise_multiplier: float, strategy: BandedStrategy, sampling_prob: float, min_sep: int, *,
                     warm_start: bool = True, relation: str = "add_remove", method: str = "pld",
                     upper_only: bool = False, **options) -> BMinSepBandMF:
    """Certified accounting of a b-banded matrix mechanism under b-min-sep batches (JAX Privacy's
    ``BMinSepSampling(sampling_prob, iterations=strategy.steps, min_sep)``; bands <= min_sep):
    the upper end is the unamplified Gaussian or Poisson steps at the strategy's norm (whichever
    is smaller; both hold for adaptive queries), the lower end one statistic of a real data set
    (non-adaptive).  The interval can be wide (docs/MATH.md 13.11).  ``upper_only``: no lower end
    (its answers' lower ends are then those of the empty mechanism)."""
    from .methods import make_accountant, method_info, method_names

    sigma = V.positive_finite("noise_multiplier", noise_multiplier)
    if not isinstance(strategy, BandedStrategy):
        raise TypeError(f"strategy: a BandedStrategy (from_matrix / toeplitz), got {type(strategy).__name__}")
    p = V.sampling_rate("sampling_prob", sampling_prob)
    b = V.int_at_least("min_sep", min_sep, 1)
    if strategy.bands > b:
        raise ValueError(f"min_sep: {b} is below the strategy's {strategy.bands} bands: two participations could "
                         "share rows of the release; use min_sep >= bands")
    V.choice("relation", relation, ("add", "remove", "add_remove"))
    V.choice("method", method, method_names())
    if method_info(method).kind != "certified":
        raise ValueError(f"method: {method!r} gives no certified interval; use pld, prv or spa")
    if strategy.diagonals is None:
        raise ValueError("strategy: its diagonals are not known (build it with from_matrix or toeplitz)")
    norms2 = np.asarray(strategy.column_norms) ** 2
    T = norms2.size
    s_noise = sigma * strategy.max_norm
    # upper: the largest |sum of the columns of an admissible pattern|^2 (columns >= b apart are disjoint)
    best = np.zeros(T + 1)
    for t in range(T):
        best[t + 1] = max(best[t], norms2[t] + (best[t + 1 - b] if t + 1 - b >= 0 else 0.0))
    up = make_accountant(method, relation, **options)
    up.compose(E.GaussianEvent(s_noise / math.sqrt(best[T])), 1)
    # |C|_2 <= sqrt(max column abs sum * max row abs sum) (Schur test); column i's entries are
    # D[k, i], row r's are D[k, r - k]
    D = strategy.diagonals
    col = np.abs(D).sum(axis=0).max()
    rows = np.zeros(T)
    for k in range(D.shape[0]):
        rows[k:] += np.abs(D[k, : T - k]) if k < T else 0.0
    c_norm = math.sqrt(float(col) * float(rows.max())) * (1.0 + 1e-12)
    ups = (up,)
    if np.all(D[0] != 0.0):  # (C invertible: the argument of docs/MATH.md 13.11 needs C^-1)
        up2 = make_accountant(method, relation, **options)
        g = E.GaussianEvent(s_noise / c_norm)
        up2.compose(E.Sampled(g, p, "poisson") if p < 1.0 else g, T)
        ups = (up, up2)
    # lower: the statistic <w, y>, w = sum of the columns; participation j shifts it by g_j <w, C_j>
    beta = D.shape[0]
    a = np.zeros(T)  # a_j = <w, C_j> = sum_i <C_i, C_j>
    for dlt in range(min(beta, T)):
        v = np.einsum("ki,ki->i", D[: beta - dlt, dlt:], D[dlt:, : T - dlt])  # <C_i, C_{i+dlt}>
        a[: T - dlt] += v
        if dlt:
            a[dlt:] += v
    w_norm = math.sqrt(max(float(np.sum(a)), 0.0))  # |w|^2 = sum_j a_j
    best_lo, best_score = None, -1.0
    cands = [] if upper_only or not np.any(a > 0) else sorted({float(np.median(a[a > 0])), float(np.min(a[a > 0]))})
    for cand in cands:
        act = a >= cand * (1.0 - 1e-9)  # (equal a_j of a Toeplitz strategy's interior differ by rounding)
        level = float(np.min(a[act]))  # gradient level / a_j <= 1 at the active steps, 0 elsewhere:
        law = min_sep_count_law(act, b, p, warm_start)  # each active participation shifts by level
        score = level * float(np.dot(np.arange(law.size), law))  # (the mean shift: pick the stronger)
        if score > best_score:
            best_lo, best_score = (level, law, act), score
    lo, margin = None, 0.0
    if best_lo is not None and w_norm > 0:
        lo = make_accountant(method, relation, **options)
        level, law, active = best_lo
        keep = law > 1e-300
        n = np.nonzero(keep)[0]
        probs = law[keep] / math.fsum(law[keep])
        lo.compose(E.MixtureOfGaussiansEvent(s_noise * w_norm, tuple(float(level * k) for k in n),
                                             tuple(float(x) for x in probs)), 1)
        # each probability is within 3 T u relative of the chain's (per step: a product by p or 1 - p,
        # itself within u, and a sum of at most two non-negative terms), the normalisation adds 2u and
        # the masses dropped are below 1e-300 each: the total variation between the mixture composed
        # and the statistic's true law is at most the margin (docs/MATH.md 13.11)
        margin = (4 * T + 8) * 2.220446049250313e-16 * 2.0 + T * 1e-300
    else:  # (no lower piece: the bounds every pair meets, delta >= 1 - e^eps)
        level, active = 0.0, np.zeros(T, bool)
    return BMinSepBandMF(lo, ups, margin, level, active)


# -- a BandMF run by its expected batch fraction (what a sweep's cell holds) -------------------------

#: the batch selections of :func:`bandmf_run` (and of a sweep of mechanism ``bandmf``)
BANDMF_SAMPLINGS = ("cyclic_poisson", "balls_in_bins", "b_min_sep")


def sqrt_toeplitz_coefs(bands: int) -> np.ndarray:
    """The first ``bands`` coefficients of the square root of the prefix-sum matrix (Fichtenberger,
    Henzinger and Upadhyay's max-error strategy; JAX Privacy's ``optimal_max_error_strategy_coefs``,
    its BandMF starting point), C(2k, k) / 4^k, scaled to unit norm."""
    k = V.int_at_least("bands", bands, 1)
    c = np.ones(k)
    for i in range(1, k):
        c[i] = c[i - 1] * (2 * i - 1) / (2 * i)
    return c / np.linalg.norm(c)


def bandmf_scheme_args(sampling: str, q: float, bands: int) -> dict:
    """The batch selection's own parameters for an expected batch fraction ``q`` (the share of the
    records in each step's batch): cyclic Poisson with cycle ``bands`` at probability q * bands,
    balls-in-bins with 1/q bins, b-min-sep with min_sep ``bands`` at p with p / (1 + (bands - 1) p)
    = q.  ValueError naming q when the scheme cannot reach it."""
    V.choice("sampling", sampling, BANDMF_SAMPLINGS)
    q = V.sampling_rate("q", q)
    k = V.int_at_least("bands", bands, 1)
    if sampling == "cyclic_poisson":
        if q * k > 1.0 + 1e-12:
            raise ValueError(f"q: cyclic Poisson over a cycle of {k} bands reaches batch fractions up to 1/{k}, "
                             f"got {V.fmt(q)}")
        return {"q": min(q * k, 1.0)}
    if sampling == "balls_in_bins":
        bins = round(1.0 / q)
        if abs(bins * q - 1.0) > 1e-9 or bins < k:
            raise ValueError(f"q: balls-in-bins takes q = 1/bins with at least {k} bins (the bands), got {V.fmt(q)}")
        return {"bins": int(bins)}
    if (k - 1) * q >= 1.0:
        raise ValueError(f"q: b-min-sep with min_sep {k} reaches batch fractions below 1/{k - 1}, got {V.fmt(q)}")
    return {"q": min(q / (1.0 - (k - 1) * q), 1.0), "min_sep": k}


def bandmf_run(noise_multiplier: float, steps: int, bands: int, sampling: str, q: float, *,
               relation: str = "add_remove", method: str = "pld", **options):
    """Certified accounting of a BandMF run of ``steps`` steps with :func:`sqrt_toeplitz_coefs`
    (``bands`` of them; one band is DP-SGD) whose batches hold a fraction ``q`` of the records in
    expectation (:func:`bandmf_scheme_args`), by :func:`account_bandmf`.  Its ``epsilon(delta)``
    and ``delta(epsilon)`` give certified intervals."""
    steps = V.int_at_least("steps", steps, 1)
    args = bandmf_scheme_args(sampling, q, bands)
    st = BandedStrategy.toeplitz(sqrt_toeplitz_coefs(bands), steps)
    if sampling == "cyclic_poisson":
        return account_bandmf(noise_multiplier, st, args["q"], relation=relation, method=method, **options)
    return account_bandmf(noise_multiplier, st, sampling=sampling, relation=relation, method=method,
                          q=args.get("q"), bins=args.get("bins"), min_sep=args.get("min_sep"), **options)
