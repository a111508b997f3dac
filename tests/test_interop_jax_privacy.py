"""The events JAX Privacy's accounting builds (jax_privacy.experimental.accounting, 2.x) go through
pldlib's dp_accounting drop-in unchanged: DP-SGD, amplified BandMF and fixed-size (without
replacement) batches are accounted, certified, and agree with the same events built by hand;
the events pldlib cannot account yet are refused with the reason."""
from __future__ import annotations

import math

import numpy as np
import pytest

acc_mod = pytest.importorskip("jax_privacy.experimental.accounting",
                              reason="jax-privacy is not installed (pip install 'pldlib[test]')")

import pldlib  # noqa: E402
from pldlib.interop.dp_accounting import PldlibAccountant  # noqa: E402


def eps_of(event, delta=1e-6, **kw):
    a = PldlibAccountant(**kw)
    a.compose(event)
    return a.epsilon_interval(delta)


def test_dpsgd_event_is_the_poisson_gaussian():
    ev = acc_mod.dpsgd_event(1.1, 2000, sampling_prob=0.01)
    got = eps_of(ev)
    want = pldlib.account(pldlib.Gaussian(sigma=1.1, q=0.01, sampling="poisson"), steps=2000).epsilon(1e-6)
    assert (got.lower, got.upper) == (want.lower, want.upper)


@pytest.mark.parametrize("bands,iterations", [(1, 1000), (4, 1000), (16, 1001)])
def test_amplified_bandmf_event(bands, iterations):
    """JAX Privacy 2.0 accounts amplified BandMF as ceil(iterations / bands) Poisson rounds."""
    ev = acc_mod.amplified_bandmf_event(0.9, iterations, num_bands=bands, sampling_prob=0.02)
    got = eps_of(ev)
    rounds = math.ceil(iterations / bands)
    want = pldlib.account(pldlib.Gaussian(sigma=0.9, q=0.02, sampling="poisson"), steps=rounds).epsilon(1e-6)
    assert (got.lower, got.upper) == (want.lower, want.upper)


def test_fixed_size_batches_without_replacement():
    ev = acc_mod.fixed_dpsgd_event(1.2, 500, dataset_size=60_000, batch_size=600)
    got = eps_of(ev)
    want = pldlib.account(pldlib.Gaussian(sigma=1.2, q=0.01, sampling="wor"), steps=500).epsilon(1e-6)
    assert (got.lower, got.upper) == (want.lower, want.upper) and np.isfinite(got.upper)


def test_truncated_dpsgd_event_is_the_truncated_poisson_step():
    ev = acc_mod.truncated_dpsgd_event(1.2, 10, sampling_prob=0.01, num_examples=10_000, truncated_batch_size=120)
    got = eps_of(ev)
    want = pldlib.PLDAccountant().compose(pldlib.TruncatedPoissonGaussianEvent(1.2, 0.01, 10_000, 120), 10) \
        .epsilon(1e-6)
    assert (got.lower, got.upper) == (want.lower, want.upper)


def test_batches_drawn_with_replacement():
    ev = acc_mod.fixed_dpsgd_event(1.2, 10, dataset_size=1000, batch_size=10, replace=True)
    got = eps_of(ev)
    want = pldlib.PLDAccountant().compose(pldlib.WithReplacementGaussianEvent(1.2, 1000, 10), 10).epsilon(1e-6)
    assert (got.lower, got.upper) == (want.lower, want.upper)