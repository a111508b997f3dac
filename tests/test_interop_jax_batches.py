"""JAX Privacy's batch-selection strategies (jax_privacy.batch_selection, 2.x) read as the pldlib
events of the run they drive: each against its pldlib scheme, balls-in-bins against Monte Carlo of
the exact fixed-bin pair, the uncertifiable ones refused with the reason, and a one-line warning when
the event accounted is not the scheme that runs."""
from __future__ import annotations

import math

import numpy as np
import pytest

bs = pytest.importorskip("jax_privacy.batch_selection", reason="jax-privacy is not installed")

import pldlib  # noqa: E402
from pldlib import events as E  # noqa: E402
from pldlib.interop.jax_privacy import (BatchSelectionMismatchWarning, account, batch_events,  # noqa: E402
                                        check_event)


def test_poisson_and_cyclic_poisson():
    ev = batch_events(bs.CyclicPoissonSampling(sampling_prob=0.01, iterations=1000), 10_000, 1.1)
    assert ev == [(E.Sampled(E.GaussianEvent(1.1), 0.01, "poisson"), 1000)]
    got = account(bs.CyclicPoissonSampling(sampling_prob=0.01, iterations=1000), 10_000, 1.1).epsilon(1e-5)
    assert got == pldlib.account(pldlib.Gaussian(1.1, q=0.01, sampling="poisson"), steps=1000).epsilon(1e-5)
    cyc = bs.CyclicPoissonSampling(sampling_prob=0.04, iterations=1001, cycle_length=4,
                                   partition_type=bs.PartitionType.INDEPENDENT)
    assert batch_events(cyc, 10_000, 1.1) == [(E.Sampled(E.GaussianEvent(1.1), 0.04, "poisson"), 251)]
    # EQUAL_SPLIT (JAX Privacy's default) re-partitions when a record is added: substitution only
    eq = bs.CyclicPoissonSampling(sampling_prob=0.04, iterations=1000, cycle_length=4)
    with pytest.raises(pldlib.UnsupportedEventError, match="INDEPENDENT"):
        batch_events(eq, 10_000, 1.1)
    assert batch_events(eq, 10_000, 1.1, relation="substitution")[0][1] == 250
    tr = bs.CyclicPoissonSampling(sampling_prob=0.01, iterations=100, truncated_batch_size=120)
    assert batch_events(tr, 10_000, 1.0) == [(E.TruncatedPoissonGaussianEvent(1.0, 0.01, 10_000, 120), 100)]


def test_fixed_batches_and_refusals():
    fx = bs.FixedBatchSampling(batch_size=100, iterations=500)
    assert batch_events(fx, 10_000, 1.0) == [(E.Sampled(E.GaussianEvent(1.0), 0.01, "wor"), 500)]
    assert batch_events(bs.FixedBatchSampling(batch_size=100, iterations=5, replace=True), 10_000, 1.0) == \
        [(E.WithReplacementGaussianEvent(1.0, 10_000, 100), 5)]
    with pytest.raises(pldlib.UnsupportedEventError, match="b-min-sep"):
        batch_events(bs.BMinSepSampling(sampling_prob=0.1, iterations=10, min_sep=4), 10_000, 1.0)
    with pytest.raises(TypeError, match="strategy"):
        batch_events(object(), 10_000, 1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        batch_events(fx, 10_000, -1.0)
    with pytest.raises(ValueError, match="num_examples"):
        batch_events(fx, 0, 1.0)


def test_balls_in_bins_is_one_allocation_epoch_at_sigma_over_sqrt_rounds():
    bib = bs.BallsInBinsSampling(iterations=40, cycle_length=4)
    assert batch_events(bib, 1000, 2.0) == [
        (E.Sampled(E.GaussianEvent(2.0 / math.sqrt(10)), 0.25, "random_allocation"), 4)]


@pytest.mark.parametrize("cycle,rounds,sigma", [(4, 3, 2.0), (8, 5, 3.0)])
def test_balls_in_bins_monte_carlo_inside(cycle, rounds, sigma):
    """Monte Carlo of the exact fixed-bin pair (the record in bin J, uniform once, joins rounds J, J + b,
    ...; the others contribute 0; 2e5 samples per direction, Hoeffding at beta 1e-3): the likelihood
    ratio is the mean over the bins of the product over that bin's rounds of the Gaussian ratios."""
    bib = bs.BallsInBinsSampling(iterations=cycle * rounds, cycle_length=cycle)
    eps = np.array([0.2, 0.6, 1.2])
    iv = account(bib, 1000, sigma).delta(eps)
    rng = np.random.default_rng(cycle * 10 + rounds)
    n = 200_000
    est = []
    for direction in ("remove", "add"):
        x = sigma * rng.standard_normal((n, cycle, rounds))
        if direction == "remove":
            x[:, 0, :] += 1.0
        y = ((x - 0.5) / sigma ** 2).sum(axis=2)  # each bin's log ratio, its rounds summed
        loss = np.logaddexp.reduce(y, axis=1) - math.log(cycle)
        if direction == "add":
            loss = -loss
        est.append((-np.expm1(np.minimum(eps[:, None] - loss[None, :], 0.0))).mean(axis=1))
    mc = np.maximum(*est)
    eta = math.sqrt(math.log(2 * 2 * len(eps) / 1e-3) / (2 * n))
    assert np.all(iv.lower <= mc + eta) and np.all(mc - eta <= iv.upper), (iv, mc, eta)


def test_a_mismatch_is_one_line():
    from dp_accounting import dp_event as D

    poisson = D.SelfComposedDpEvent(D.PoissonSampledDpEvent(0.25, D.GaussianDpEvent(2.0)), 40)
    bib = bs.BallsInBinsSampling(iterations=40, cycle_length=4)
    with pytest.warns(BatchSelectionMismatchWarning) as rec:
        msg = check_event(bib, 1000, poisson)
    assert msg and "\n" not in msg and "random_allocation" in msg and len(rec) == 1
    pois = bs.CyclicPoissonSampling(sampling_prob=0.25, iterations=40)
    assert check_event(pois, 1000, poisson) is None
    cyc = bs.CyclicPoissonSampling(sampling_prob=0.25, iterations=40, cycle_length=4,
                                   partition_type=bs.PartitionType.INDEPENDENT)
    with pytest.warns(BatchSelectionMismatchWarning):
        assert "10" in check_event(cyc, 1000, poisson)  # (accounts 40 steps, each record joins 10)
    with pytest.warns(BatchSelectionMismatchWarning, match="b-min-sep"):
        check_event(bs.BMinSepSampling(sampling_prob=0.1, iterations=10, min_sep=4), 1000, poisson)
