"""Banded matrix mechanisms under cyclic Poisson sampling (docs/MATH.md 13.7): the reduction to
independent Poisson-subsampled Gaussian blocks is checked against the full matrix mechanism,
whose output vector's likelihood ratio is enumerated over every participation pattern and
sampled (Monte Carlo with an empirical Bernstein confidence bound), and against the closed form
of unsampled Gaussians; the strategy's validation names what is wrong."""
import itertools
import math

import mpmath as mp
import numpy as np
import pytest

from pldlib.correlated import BandedStrategy, account_bandmf, bandmf_cyclic_poisson

COEFS = [1.0, 0.6, 0.3]


def banded(coefs, n):
    C = np.zeros((n, n))
    for i in range(n):
        for j in range(max(0, i - len(coefs) + 1), i + 1):
            C[i, j] = coefs[i - j]
    return C


def bernstein(v, beta):
    """Maurer-Pontil empirical Bernstein half-width for the mean of v in [0, 1] (two-sided, 1 - beta)."""
    n = v.size
    return math.sqrt(2 * v.var(ddof=1) * math.log(4 / beta) / n) + 7 * math.log(4 / beta) / (3 * (n - 1))


def full_matrix_delta(C, sigma, q, group, eps, direction, n_samples, seed):
    """Monte Carlo delta(eps) of the *whole* release C x + z for one record of ``group`` (scalar
    gradient 1 at each participation, every other record 0): P mixes N(C x_pattern, s^2 I) over
    all 2^k participation patterns, Q = N(0, s^2 I); the loss is computed on the n-dimensional
    output without any block decomposition."""
    n = C.shape[0]
    b = max(i - j for i, j in zip(*np.nonzero(C))) + 1
    s = sigma * np.sqrt((C * C).sum(axis=0)).max()
    part = list(range(group, n, b))
    pats = list(itertools.product([0, 1], repeat=len(part)))
    means = np.array([C @ np.bincount(part, weights=p, minlength=n) for p in pats])
    w = np.array([np.prod([q if x else 1 - q for x in p]) for p in pats])
    rng = np.random.default_rng(seed)
    if direction == "remove":  # samples under P
        Y = means[rng.choice(len(pats), size=n_samples, p=w)] + s * rng.standard_normal((n_samples, n))
    else:  # add: the reversed pair, samples under Q
        Y = s * rng.standard_normal((n_samples, n))
    lw = np.log(w)[None, :] + (Y @ means.T) / s ** 2 - 0.5 * (means ** 2).sum(axis=1)[None, :] / s ** 2
    L = np.logaddexp.reduce(lw, axis=1)
    if direction == "add":
        L = -L
    return {e: np.maximum(0.0, -np.expm1(e - L)) for e in eps}


@pytest.mark.parametrize("direction", ["remove", "add"])
@pytest.mark.parametrize("sigma,q,n", [(1.0, 0.3, 8), (0.7, 0.5, 7)])
def test_reduction_matches_the_full_matrix_mechanism(direction, sigma, q, n):
    C = banded(COEFS, n)
    s = BandedStrategy.from_matrix(C)
    eps = [0.25, 1.0, 2.0]
    iv = account_bandmf(sigma, s, q, relation=direction).delta(np.array(eps))
    beta = 1e-6
    # the worst group is group 0 here (its column norms dominate): its record is the realised worst case
    samples = full_matrix_delta(C, sigma, q, 0, eps, direction, 200_000, seed=7)
    for i, e in enumerate(eps):
        v = samples[e]
        h = bernstein(v, beta)
        assert iv.lower[i] <= v.mean() + h and v.mean() - h <= iv.upper[i], (e, v.mean(), h, iv)


def test_toeplitz_and_matrix_agree_and_the_worst_group_is_kept():
    n = 8
    a, b = BandedStrategy.from_matrix(banded(COEFS, n)), BandedStrategy.toeplitz(COEFS, n)
    np.testing.assert_allclose(a.column_norms, b.column_norms, rtol=1e-15)
    assert a.bands == b.bands == 3
    groups = bandmf_cyclic_poisson(1.0, a, 0.2)
    assert len(groups) == 1  # group 0 (columns 0, 3, 6) dominates groups 1 and 2
    # two groups no one dominates: one has more steps, the other a larger norm
    odd = BandedStrategy((1.0, 2.0, 1.0, 0.5, 1.0), bands=2)  # group 0: 1, 1, 1; group 1: 2, 0.5
    assert len(bandmf_cyclic_poisson(1.0, odd, 0.2)) == 2


def test_unsampled_is_the_closed_form_gaussian():
    """q = 1: every step is an unsampled Gaussian with ratio |c_i| / (sigma m); the group's
    composition is one Gaussian of ratio sqrt(sum |c_i|^2) / (sigma m), exact at 40 digits."""
    n, sigma = 9, 2.0
    s = BandedStrategy.toeplitz(COEFS, n)
    m = max(s.column_norms)
    r = mp.sqrt(sum(mp.mpf(c) ** 2 for c in s.column_norms[0::3])) / (mp.mpf(sigma) * mp.mpf(m))
    eps = 0.5
    mp.mp.dps = 40
    exact = mp.ncdf(r / 2 - eps / r) - mp.e ** eps * mp.ncdf(-r / 2 - eps / r)
    iv = account_bandmf(sigma, s, 1.0).delta(eps)
    assert iv.lower <= exact * (1 + 1e-12) and exact <= iv.upper * (1 + 1e-12)
    assert iv.upper - iv.lower <= 1e-9 * exact


def test_epochs_compose_and_bounds_order():
    s = BandedStrategy.toeplitz(COEFS, 30)
    one = account_bandmf(1.0, s, 0.1).epsilon(1e-5)
    three = account_bandmf(1.0, s, 0.1, epochs=3).epsilon(1e-5)
    assert one.lower <= one.upper < three.lower <= three.upper


@pytest.mark.parametrize("kw,name", [
    ({"noise_multiplier": 0.0}, "noise_multiplier"), ({"q": 0.0}, "q"), ({"q": 1.5}, "q"),
    ({"sampling": "balls_in_bins"}, "sampling"), ({"method": "rdp"}, "method"), ({"epochs": 0}, "epochs")])
def test_bad_arguments(kw, name):
    args = {"noise_multiplier": 1.0, "strategy": BandedStrategy.toeplitz(COEFS, 6), "q": 0.1, **kw}
    with pytest.raises(ValueError, match=name):
        account_bandmf(args.pop("noise_multiplier"), args.pop("strategy"), args.pop("q"), **args)


def test_bad_strategies():
    with pytest.raises(ValueError, match="lower triangular"):
        BandedStrategy.from_matrix(np.triu(np.ones((3, 3))))
    with pytest.raises(ValueError, match="bands >= 3"):
        BandedStrategy.from_matrix(banded(COEFS, 5), bands=2)
    with pytest.raises(ValueError, match="square"):
        BandedStrategy.from_matrix(np.ones((2, 3)))
    with pytest.raises(ValueError, match="coefs"):
        BandedStrategy.toeplitz([0.0, 1.0], 4)
    with pytest.raises(ValueError, match="column_norms"):
        BandedStrategy((1.0, -1.0), 1)
    with pytest.raises(TypeError, match="BandedStrategy"):
        bandmf_cyclic_poisson(1.0, banded(COEFS, 4), 0.1)


def test_calibration_is_certified_and_near_optimal():
    from pldlib.correlated import calibrate_bandmf

    s = BandedStrategy.toeplitz([1.0, 0.5, 0.3, 0.2], steps=400)
    sig = calibrate_bandmf(2.0, 1e-5, s, 0.05)
    assert account_bandmf(sig, s, 0.05).epsilon(1e-5).upper <= 2.0
    assert account_bandmf(sig * 0.98, s, 0.05).epsilon(1e-5).lower > 2.0  # no certified sigma 2% lower
    with pytest.raises(ValueError, match="epsilon"):
        calibrate_bandmf(-1.0, 1e-5, s, 0.05)
