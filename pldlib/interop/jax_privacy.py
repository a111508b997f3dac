"""The batches JAX Privacy selects are the batches accounted (docs/MATH.md section 14).

JAX Privacy 2.x describes how DP-SGD draws its batches with a ``jax_privacy.batch_selection``
strategy.  :func:`batch_events` reads such a strategy (by class name and fields: jax is never
imported here) and gives the pldlib events of the DP-SGD run it drives (Gaussian noise multiplier
``noise_multiplier``, each example's clipped gradient of norm at most 1, ``num_examples`` records);
:func:`account` accounts them; :func:`check_event` says, in one line, when the dp_accounting event
someone accounts is not the scheme the strategy runs (e.g. Poisson accounting for balls-in-bins
batches) and which pldlib scheme is.

========================================  =====================================================
strategy                                  pldlib events (per record, the worst one)
========================================  =====================================================
``CyclicPoissonSampling`` (cycle b = 1)    ``iterations`` Poisson steps at ``sampling_prob``
``CyclicPoissonSampling`` (cycle b > 1)    ceil(iterations / b) Poisson steps (its group's rounds)
... with ``truncated_batch_size`` B        truncated Poisson steps (group of num_examples // b)
``BallsInBinsSampling`` (cycle b)          one epoch of random allocation over b steps, noise
                                           multiplier sigma / sqrt(E), E = ceil(iterations / b)
``FixedBatchSampling`` (replace=False)     ``iterations`` steps without replacement, q = B / n
``FixedBatchSampling`` (replace=True)      ``iterations`` steps of B draws with replacement (MATH 2.7)
``BMinSepSampling``                        refused here (no single pair); :func:`account_bandmf`
                                           with ``c_col = [1]`` gives a wide certified interval
========================================  =====================================================

BandMF (a banded Toeplitz strategy ``c_col``) goes through :func:`account_bandmf`: cyclic Poisson
exactly (docs/MATH.md 13.7), balls-in-bins with a certified interval that is not tight (13.10),
b-min-sep with a wide one (13.11; also with ``c_col = [1]``, DP-SGD).

**Balls in bins** keeps each example's bin for the whole run, so the E rounds it joins are not E
independent random allocations: given its bin j the record adds its gradient to rounds
j, j + b, ..., and for non-adaptive queries the E noisy sums of a bin are, by sufficiency, one
Gaussian observation with sensitivity sqrt(E).  One record in one of b such super-steps is one
epoch of random allocation at noise multiplier sigma / sqrt(E) (the bins with one round fewer are
a post-processing of that: added noise).  The reduction, like random allocation's own upper bound
for several steps per bin, is for non-adaptive queries.

Relations: ``add_remove`` (JAX Privacy's ADD_OR_REMOVE_ONE) needs ``PartitionType.INDEPENDENT``
for a cyclic strategy with b > 1, as JAX Privacy's own docstring says (its EQUAL_SPLIT default
re-partitions when a record is added); ``substitution`` (REPLACE_ONE) takes either.
"""
from __future__ import annotations

import math
import warnings

from .. import _validate as V
from .. import events as E
from ..profiles.pairs import UnsupportedEventError

__all__ = ["batch_events", "account", "account_bandmf", "check_event", "BatchSelectionMismatchWarning"]


class BatchSelectionMismatchWarning(UserWarning):
    """The dp_accounting event accounted is not the scheme the batch-selection strategy runs."""


def _name(strategy) -> str:
    return type(strategy).__name__


def _partition(strategy) -> str:
    p = getattr(strategy, "partition_type", None)
    return getattr(p, "name", str(p)) if p is not None else "EQUAL_SPLIT"


def batch_events(strategy, num_examples: int, noise_multiplier: float,
                 relation: str = "add_remove") -> list[tuple[E.Event, int]]:
    """[(event, count)]: the pldlib events of a DP-SGD run whose batches ``strategy`` selects (see the
    module docstring); :class:`UnsupportedEventError` with the reason for a strategy pldlib cannot
    certify, ValueError naming the argument for bad input."""
    n = V.int_at_least("num_examples", num_examples, 1)
    sigma = V.positive_finite("noise_multiplier", noise_multiplier)
    V.choice("relation", relation, V.RELATIONS)
    name = _name(strategy)
    it = getattr(strategy, "iterations", None)
    if name not in ("CyclicPoissonSampling", "BallsInBinsSampling", "FixedBatchSampling", "BMinSepSampling"):
        raise TypeError(f"strategy: a jax_privacy.batch_selection strategy, got {name}")
    it = V.int_at_least("strategy.iterations", it, 1)
    if name == "BMinSepSampling":
        raise UnsupportedEventError(
            "strategy: b-min-sep sampling has no single dominating pair of pldlib events; "
            "pldlib.interop.jax_privacy.account_bandmf(strategy, noise_multiplier, [1.0]) gives its certified "
            "(wide) interval, CyclicPoissonSampling and BallsInBinsSampling a tight one")
    if name == "FixedBatchSampling":
        b = V.int_at_least("strategy.batch_size", strategy.batch_size, 1)
        if getattr(strategy, "replace", False):  # (rng.choice(n, b, replace=True): b independent draws)
            if n < 2:
                raise ValueError(f"num_examples: batches drawn with replacement need at least 2 examples, got {n}")
            return [(E.WithReplacementGaussianEvent(sigma, n, b), it)]
        if b > n:
            raise ValueError(f"strategy.batch_size: {b} exceeds num_examples {n}")
        g = E.GaussianEvent(sigma)
        return [(g if b == n else E.Sampled(g, b / n, "wor"), it)]
    cycle = V.int_at_least("strategy.cycle_length", getattr(strategy, "cycle_length", 1), 1)
    rounds = math.ceil(it / cycle)  # (the groups that come first in the cycle join one round more)
    if name == "BallsInBinsSampling":
        if cycle == 1:
            return [(E.GaussianEvent(sigma), it)]
        return [(E.Sampled(E.GaussianEvent(sigma / math.sqrt(rounds)), 1.0 / cycle, "random_allocation"), cycle)]
    # cyclic Poisson
    if cycle > 1 and relation in ("add", "remove", "add_remove") and _partition(strategy) != "INDEPENDENT":
        raise UnsupportedEventError(
            f"strategy: cyclic Poisson sampling with partition_type {_partition(strategy)} re-partitions the "
            "examples when one is added, so it is accounted under substitution only (JAX Privacy's own "
            "docstring); use PartitionType.INDEPENDENT for add_remove")
    q = V.sampling_rate("strategy.sampling_prob", strategy.sampling_prob)
    cap = getattr(strategy, "truncated_batch_size", None)
    g = E.GaussianEvent(sigma)
    if cap is not None:
        group = max(1, n // cycle)
        return [(E.TruncatedPoissonGaussianEvent(sigma, q, group, V.int_at_least("strategy.truncated_batch_size",
                                                                                cap, 1)), rounds)]
    return [(g if q == 1.0 else E.Sampled(g, q, "poisson"), rounds)]


def account(strategy, num_examples: int, noise_multiplier: float, relation: str = "add_remove",
            method: str = "pld", **options):
    """The built pldlib accountant (``method``, ``options`` its keywords) of :func:`batch_events`:
    ``account(strategy, n, sigma).epsilon(delta)`` is the certified interval of the run."""
    from ..methods import make_accountant

    acc = make_accountant(method, relation, **options)
    for ev, k in batch_events(strategy, num_examples, noise_multiplier, relation):
        acc.compose(ev, k)
    return acc


def account_bandmf(strategy, noise_multiplier: float, c_col, relation: str = "add_remove", method: str = "pld",
                   **options):
    """Certified accounting of BandMF whose batches ``strategy`` selects: the banded Toeplitz strategy
    with first-column coefficients ``c_col`` (JAX Privacy's, e.g. ``optimize_banded_toeplitz``) over
    ``strategy.iterations`` steps, noise of standard deviation ``noise_multiplier`` (JAX Privacy's
    convention: times the clip norm, whatever c_col's norm).  Returns an object whose ``epsilon(delta)``
    and ``delta(epsilon)`` give certified intervals.

    - ``BallsInBinsSampling``: :func:`pldlib.correlated.balls_in_bins_bandmf` (needs len(c_col) <=
      cycle_length; certified, not tight; docs/MATH.md 13.10);
    - ``CyclicPoissonSampling``: :func:`pldlib.correlated.account_bandmf` (exact; needs len(c_col) <=
      cycle_length; PartitionType.INDEPENDENT under add_remove, as for DP-SGD);
    - ``BMinSepSampling``: :func:`pldlib.correlated.b_min_sep_bandmf` (needs len(c_col) <= min_sep;
      a wide certified interval: unamplified upper end, a one-statistic lower end; 13.11);
    - others: :class:`UnsupportedEventError` with the reason."""
    import numpy as np

    from .. import correlated as CR

    sigma = V.positive_finite("noise_multiplier", noise_multiplier)
    name = _name(strategy)
    it = V.int_at_least("strategy.iterations", getattr(strategy, "iterations", None), 1)
    c = np.asarray(c_col, dtype=float).ravel()
    if c.size < 1 or not np.all(np.isfinite(c)):
        raise ValueError("c_col: a non-empty list of finite numbers")
    cycle = V.int_at_least("strategy.cycle_length", getattr(strategy, "cycle_length", 1), 1)
    if c.size > cycle and name in ("BallsInBinsSampling", "CyclicPoissonSampling"):
        raise ValueError(f"c_col: {c.size} bands exceed the cycle length {cycle}: a record's participations would "
                         "share rows of the release (JAX Privacy requires bands <= cycle length too)")
    st = CR.BandedStrategy.toeplitz(c, it)
    nm = sigma / st.max_norm  # (pldlib's noise multiplier is relative to the largest column norm)
    if name == "BallsInBinsSampling":
        return CR.balls_in_bins_bandmf(nm, st, cycle, relation=relation, method=method, **options)
    if name == "CyclicPoissonSampling":
        if cycle > 1 and relation in ("add", "remove", "add_remove") and _partition(strategy) != "INDEPENDENT":
            raise UnsupportedEventError(
                f"strategy: cyclic Poisson sampling with partition_type {_partition(strategy)} re-partitions the "
                "examples when one is added, so it is accounted under substitution only; use "
                "PartitionType.INDEPENDENT for add_remove")
        if getattr(strategy, "truncated_batch_size", None) is not None:
            raise UnsupportedEventError("strategy: truncated cyclic Poisson batches with a banded strategy have no "
                                        "certified accounting here")
        wide = CR.BandedStrategy(st.column_norms, cycle)  # (a b-banded strategy is cycle-banded, cycle >= b)
        return CR.account_bandmf(nm, wide, q=V.sampling_rate("strategy.sampling_prob", strategy.sampling_prob),
                                 relation=relation, method=method, **options)
    if name == "BMinSepSampling":
        b = V.int_at_least("strategy.min_sep", strategy.min_sep, 1)
        if c.size > b:  # (JAX Privacy's own check)
            raise ValueError(f"c_col: {c.size} bands exceed min_sep {b}: two participations could share rows of "
                             "the release (JAX Privacy requires bands <= min_sep too)")
        if getattr(strategy, "truncated_batch_size", None) is not None:
            raise UnsupportedEventError("strategy: truncated b-min-sep batches have no certified accounting here")
        return CR.b_min_sep_bandmf(nm, st, V.sampling_rate("strategy.sampling_prob", strategy.sampling_prob), b,
                                   warm_start=bool(getattr(strategy, "warm_start", True)), relation=relation,
                                   method=method, **options)
    raise UnsupportedEventError(f"strategy: {name} with a banded strategy has no certified accounting here")


def _sampling_of(event) -> str | None:
    """The sampling scheme of a pldlib event ('poisson', 'wor', 'random_allocation', 'truncated_poisson',
    'with_replacement', 'none'), looking through compositions; None when it mixes schemes."""
    found = set()
    for ev, _k in E.flatten(event, 1):
        if isinstance(ev, E.Sampled):
            found.add(ev.sampling if ev.q < 1.0 else "none")
        elif isinstance(ev, E.TruncatedPoissonGaussianEvent):
            found.add("truncated_poisson")
        elif isinstance(ev, E.WithReplacementGaussianEvent):
            found.add("with_replacement")
        else:
            found.add("none")
    return found.pop() if len(found) == 1 else None


def check_event(strategy, num_examples: int, dp_event, noise_multiplier: float | None = None,
                relation: str = "add_remove") -> str | None:
    """One line saying how the dp_accounting ``dp_event`` someone accounts differs from the scheme
    ``strategy`` runs (its sampling scheme, or its step count), also emitted as a
    :class:`BatchSelectionMismatchWarning`; None when they agree.  ``noise_multiplier`` defaults
    to the event's own (its first Gaussian)."""
    from .dp_accounting import from_dp_event

    ours = from_dp_event(dp_event)
    if noise_multiplier is None:
        gs = [e for e, _ in E.flatten(ours, 1)]
        sig = next((getattr(getattr(e, "event", e), "sigma", None) for e in gs
                    if getattr(getattr(e, "event", e), "sigma", None) is not None), None)
        if sig is None:
            raise ValueError("noise_multiplier: the event has no Gaussian step to read it from; pass it")
        noise_multiplier = sig
    try:
        want = batch_events(strategy, num_examples, noise_multiplier, relation)
    except UnsupportedEventError as e:
        msg = (f"{_name(strategy)} batches are not accounted by pldlib events ({e}); the event accounted does not "
               "describe them")
        warnings.warn(msg, BatchSelectionMismatchWarning, stacklevel=2)
        return msg
    have, need = _sampling_of(ours), _sampling_of(E.Composed([ev for ev, _ in want]))
    steps_have = sum(k for _, k in E.flatten(ours, 1))
    steps_need = sum(k for _, k in want)
    msg = None
    if have != need:
        msg = (f"the event accounts {have or 'mixed'} sampling but {_name(strategy)} selects batches by "
               f"{need} (sampling={need!r}); pldlib.interop.jax_privacy.account(strategy, num_examples, "
               "noise_multiplier) accounts the batches that run")
    elif steps_have != steps_need:
        msg = (f"the event accounts {steps_have} steps but {_name(strategy)} gives each record {steps_need} "
               f"(sampling={need!r}); pldlib.interop.jax_privacy.account(strategy, num_examples, "
               "noise_multiplier) accounts the batches that run")
    if msg:
        warnings.warn(msg, BatchSelectionMismatchWarning, stacklevel=2)
    return msg
