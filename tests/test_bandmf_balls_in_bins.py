"""Banded matrix mechanisms under balls-in-bins batches (docs/MATH.md 13.10): the bin groups, the
Gram of the bins' shifts, one band against random allocation, and the interval against a seeded
Monte Carlo of the release itself (the full n-dimensional Gaussian mixture, no decomposition)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

from pldlib import events as E
from pldlib.correlated import (BandedStrategy, account_bandmf, balls_in_bins_bandmf, bin_gram, bin_groups,
                               thinned_lower_pairs)
from pldlib.methods import make_accountant


def _dense(strategy_coefs, T):
    C = np.zeros((T, T))
    for k, v in enumerate(strategy_coefs):
        i = np.arange(T - k)
        C[i + k, i] = v
    return C


def _shifts(C, b):
    """(T, b): column J is the release's shift with the record in bin J (gradient 1 at its steps)."""
    return np.stack([C[:, j::b].sum(axis=1) for j in range(b)], axis=1)


@pytest.mark.parametrize("b,beta", [(b, beta) for b in (1, 2, 3, 7, 10, 16, 33) for beta in (1, 2, 3, 5, 8)
                                    if beta <= b])
def test_bin_groups_partition_the_cycle_with_gaps_of_at_least_bands(b, beta):
    groups = bin_groups(b, beta)
    flat = sorted(j for g in groups for j in g)
    assert flat == list(range(b))
    t = b // beta
    assert max(len(g) for g in groups) == t
    assert sum(len(g) == t for g in groups) >= b // t  # as many full groups as the runs allow
    for g in groups:
        for x in g:
            for y in g:
                if x != y:
                    d = abs(x - y)
                    assert min(d, b - d) >= beta


def test_bin_groups_refuse_more_bands_than_bins():
    with pytest.raises(ValueError, match="bands: 5 bands exceed the 4 bins"):
        bin_groups(4, 5)


@pytest.mark.parametrize("seed", range(4))
def test_bin_gram_equals_the_dense_products(seed):
    rng = np.random.default_rng(seed)
    T, beta = int(rng.integers(8, 40)), int(rng.integers(1, 6))
    b = int(rng.integers(beta, 12))
    C = np.tril(rng.normal(size=(T, T)))
    C[np.subtract.outer(np.arange(T), np.arange(T)) >= beta] = 0.0
    np.fill_diagonal(C, 1.0 + rng.random(T))
    S = _shifts(C, b)
    G = bin_gram(BandedStrategy.from_matrix(C, bands=beta), b)
    np.testing.assert_allclose(G, S.T @ S, rtol=1e-12, atol=1e-12)
    c = rng.random(beta) + 0.1
    st = BandedStrategy.toeplitz(c, T)
    S2 = _shifts(_dense(c, T), b)
    np.testing.assert_allclose(bin_gram(st, b), S2.T @ S2, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("b,T,sigma", [(8, 40, 2.0), (20, 60, 1.5)])
def test_one_band_is_one_epoch_of_random_allocation(b, T, sigma):
    """With one band the bins' shifts are orthogonal, E_J = rounds of bin J: the interval is random
    allocation's own (the heaviest bin's rounds; MATH 13.10 reduces to the JAX Privacy reading)."""
    st = BandedStrategy.toeplitz([1.0], T)
    E_max = math.ceil(T / b)
    acc = balls_in_bins_bandmf(sigma, st, b)
    ra = make_accountant("pld", "add_remove")
    ra.compose(E.Sampled(E.GaussianEvent(sigma / math.sqrt(E_max)), 1.0 / b, "random_allocation"), b)
    for d in (1e-3, 1e-6):
        ours, theirs = acc.epsilon(d), ra.epsilon(d)
        assert ours.upper == pytest.approx(theirs.upper, rel=1e-9)
        if T % b == 0:  # every bin has E rounds: the lower end is at least random allocation's (its
            # two directions accounted apart: their grids differ from the joint accountant's by
            # ~1e-5), and the max test can be higher still, never above the upper end
            assert ours.lower >= theirs.lower * (1 - 1e-4)
        assert ours.lower <= theirs.upper
        # and the max test (v), a lower bound of its own, stays inside random allocation's interval
        assert acc._eps_test(np.array([d]))[0] <= theirs.upper
        assert ours.lower <= ours.upper


def _mc_delta(S, noise, eps, n, seed, rng_bins=None):
    """Monte Carlo of H_{e^eps}(P || Q), P = mean_J N(S[:, J], noise^2 I), Q = N(0, noise^2 I) (the
    release with the record in a uniform bin), from n samples of P: (mean, Hoeffding half-width at
    1 - 1e-6 for each eps, a union over them)."""
    rng = np.random.default_rng(seed)
    T, b = S.shape
    nrm2 = np.sum(S * S, axis=0)
    L = []
    for _ in range(n // 5000):
        J = rng.integers(0, b, 5000)
        y = S[:, J].T + rng.normal(0.0, noise, (5000, T))
        L.append(logsumexp((y @ S - nrm2 / 2) / noise ** 2, axis=1) - math.log(b))
    L = np.concatenate(L)
    eps = np.asarray(eps, float)
    vals = np.maximum(0.0, -np.expm1(eps[:, None] - L[None, :]))
    half = math.sqrt(math.log(2 * eps.size / 1e-6) / (2 * L.size))
    return vals.mean(axis=1), half


SHAPES = [  # (bins, bands, steps, sigma, coefficient decay)
    (12, 3, 60, 2.5, 0.6),
    (16, 4, 64, 3.0, 0.7),
    (10, 5, 50, 2.0, 0.5),
    (9, 2, 45, 1.5, 0.8),
]


@pytest.mark.parametrize("b,beta,T,sigma,decay", SHAPES)
def test_interval_brackets_monte_carlo_of_the_release(b, beta, T, sigma, decay):
    """The upper end lies above a 2e5-sample Monte Carlo of the all-ones data set's release (a
    valid data set: the worst case is at least it), the max test's lower end below it (that test
    is a post-processing of the same release)."""
    c = decay ** np.arange(beta)
    st = BandedStrategy.toeplitz(c, T)
    S = _shifts(_dense(c, T), b)
    noise = sigma * st.max_norm
    eps = np.array([0.25, 0.5, 1.0, 1.5])
    mc, half = _mc_delta(S, noise, eps, 200_000, seed=b * 100 + beta)
    acc = balls_in_bins_bandmf(sigma, st, b, relation="remove")
    iv = acc.delta(eps)
    assert np.all(iv.upper >= mc - half), (iv.upper, mc, half)
    assert np.all(acc._delta_test(eps) <= mc + half), (acc._delta_test(eps), mc, half)
    assert np.all(iv.lower <= iv.upper)
    # the interval is not trivial: the test's lower end is positive where the release's delta is large
    assert np.any(acc._delta_test(eps) > 0.0)


@pytest.mark.parametrize("b,beta,T,sigma,decay", SHAPES[:2])
def test_thinned_pairs_against_monte_carlo_of_their_data_sets(b, beta, T, sigma, decay):
    """Each thinned lower pair (gradient 0 except at steps d k) is checked against a Monte Carlo of
    that data set's own release: its certified lower curve lies below it."""
    c = decay ** np.arange(beta)
    st = BandedStrategy.toeplitz(c, T)
    C = _dense(c, T)
    noise = sigma * st.max_norm
    eps = np.array([0.25, 0.5, 1.0])
    acc = balls_in_bins_bandmf(sigma, st, b, relation="remove")
    lower = acc._delta_group_lower(eps)
    # the data sets behind the pairs: gaps bands and the first gap prime to b
    mcs = []
    for d in sorted({beta, next(x for x in range(beta, beta + b + 1) if math.gcd(x, b) == 1)}):
        g = np.zeros(T)
        g[::d] = 1.0
        mc, half = _mc_delta(_shifts(C * g, b), noise, eps, 200_000, seed=d)
        mcs.append(mc + half)
    assert np.all(lower <= np.max(mcs, axis=0)), (lower, mcs)
    assert thinned_lower_pairs(st.column_norms, b, beta)


def test_interval_is_ordered_and_monotone_in_noise():
    # (4 bands, 40 bins, 5 rounds per bin: 200 steps, not 400, cost a third -- the rounds per bin only
    # scale the work; the test's other shapes have 3 to 5)
    st = BandedStrategy.toeplitz([1.0, 0.6, 0.4, 0.3], 200)
    prev = None
    for sigma in (3.0, 5.0, 8.0):  # (below 3 a point costs 9-11 s)
        iv = balls_in_bins_bandmf(sigma, st, 40).epsilon(np.array([1e-3, 1e-6]))
        assert np.all(iv.lower <= iv.upper)
        if prev is not None:
            assert np.all(iv.upper <= prev.upper + 1e-9)
        prev = iv


def test_account_bandmf_routes_balls_in_bins_and_checks_its_arguments():
    st = BandedStrategy.toeplitz([1.0, 0.5], 100)
    a = account_bandmf(3.0, st, sampling="balls_in_bins", bins=10)
    b = balls_in_bins_bandmf(3.0, st, 10)
    assert a.epsilon(1e-5) == b.epsilon(1e-5)
    with pytest.raises(ValueError, match="bins: balls-in-bins sampling needs"):
        account_bandmf(3.0, st, sampling="balls_in_bins")
    with pytest.raises(ValueError, match="epochs: balls-in-bins keeps"):
        account_bandmf(3.0, st, sampling="balls_in_bins", bins=10, epochs=2)
    with pytest.raises(ValueError, match="bins / min_sep: only balls-in-bins"):
        account_bandmf(3.0, st, q=0.1, bins=10)
    with pytest.raises(ValueError, match="q: cyclic Poisson sampling needs"):
        account_bandmf(3.0, st)
    with pytest.raises(ValueError, match="bands: 2 bands exceed the 1 bins"):
        balls_in_bins_bandmf(3.0, st, 1)
    with pytest.raises(ValueError, match="relation"):
        balls_in_bins_bandmf(3.0, st, 10, relation="substitution")
    with pytest.raises(ValueError, match="noise_multiplier"):
        balls_in_bins_bandmf(-1.0, st, 10)
    with pytest.raises(ValueError, match="sampling: 'b_min_sep_x' is not certified"):
        account_bandmf(3.0, st, sampling="b_min_sep_x", bins=10)


def test_jax_privacy_reader_for_bandmf():
    """JAX Privacy's own strategy objects: balls-in-bins and cyclic Poisson with a banded c_col,
    in its noise convention (standard deviation = noise_multiplier, whatever c_col's norm)."""
    B = pytest.importorskip("jax_privacy.batch_selection")
    from pldlib.interop.jax_privacy import account, account_bandmf as jax_bandmf
    from pldlib.profiles.pairs import UnsupportedEventError

    c = np.array([0.8, 0.45, 0.3])
    st = BandedStrategy.toeplitz(c, 120)
    bib = B.BallsInBinsSampling(iterations=120, cycle_length=12)
    ours = jax_bandmf(bib, 2.4, c).epsilon(1e-5)
    direct = balls_in_bins_bandmf(2.4 / st.max_norm, st, 12).epsilon(1e-5)
    assert ours.lower == direct.lower and ours.upper == direct.upper
    # one band, unit coefficient: the DP-SGD reading (one random-allocation epoch)
    one = jax_bandmf(bib, 2.4, np.array([1.0])).epsilon(1e-5)
    dpsgd = account(bib, 1000, 2.4).epsilon(1e-5)
    assert one.upper == pytest.approx(dpsgd.upper, rel=1e-9)
    cyc = B.CyclicPoissonSampling(sampling_prob=0.25, iterations=120, cycle_length=4,
                                  partition_type=B.PartitionType.INDEPENDENT)
    got = jax_bandmf(cyc, 2.4, c).epsilon(1e-5)
    want = account_bandmf(2.4 / st.max_norm, BandedStrategy(st.column_norms, 4), q=0.25).epsilon(1e-5)
    assert got.upper == want.upper and got.lower == want.lower
    with pytest.raises(ValueError, match="c_col: 3 bands exceed the cycle length 2"):
        jax_bandmf(B.BallsInBinsSampling(iterations=120, cycle_length=2), 2.4, c)
    with pytest.raises(UnsupportedEventError, match="FixedBatchSampling with a banded strategy"):
        jax_bandmf(B.FixedBatchSampling(batch_size=10, iterations=120), 2.4, c)


# -- b-min-sep (docs/MATH.md 13.11) -------------------------------------------------------------

def _enumerated_count_law(T, b, p, act, warm):
    """P(N = n) by enumerating every participation sequence of the b-min-sep chain."""
    import itertools

    starts = ([(a, p / (1 + (b - 1) * p)) for a in range(b - 1)] + [(b - 1, 1 / (1 + (b - 1) * p))]
              if warm and b > 1 else [(b - 1, 1.0)])
    out = np.zeros(T + 2)
    for a0, w0 in starts:
        for x in itertools.product((0, 1), repeat=T):
            a, pr, n = a0, w0, 0
            for t in range(T):
                if x[t]:
                    if a < b - 1:
                        break
                    pr, a, n = pr * p, 0, n + int(act[t])
                else:
                    pr *= (1 - p) if a >= b - 1 else 1.0
                    a = min(a + 1, b - 1)
            else:
                out[n] += pr
    return out


@pytest.mark.parametrize("T,b,p,warm", [(7, 3, 0.4, True), (8, 1, 0.3, True), (7, 2, 0.5, False), (9, 4, 0.7, True),
                                        (10, 5, 0.2, False)])
def test_min_sep_count_law_equals_enumeration(T, b, p, warm):
    from pldlib.correlated import min_sep_count_law

    act = np.random.default_rng(T * b).random(T) < 0.7
    law = min_sep_count_law(act, b, p, warm)
    want = _enumerated_count_law(T, b, p, act, warm)
    np.testing.assert_allclose(law, want[: law.size], rtol=1e-12, atol=1e-15)
    assert want[law.size:].sum() == 0.0


def _chain_participations(T, b, p, n, rng):
    """(n, T) 0/1 participations of the warm-started b-min-sep chain."""
    x = np.zeros((n, T))
    blocked = rng.random(n) < (b - 1) * p / (1 + (b - 1) * p)
    a = np.where(blocked, rng.integers(0, max(b - 1, 1), n), b - 1)
    for t in range(T):
        take = (a >= b - 1) & (rng.random(n) < p)
        x[:, t] = take
        a = np.where(take, 0, np.minimum(a + 1, b - 1))
    return x


@pytest.mark.parametrize("T,bands,ms,p,sigma", [(60, 3, 4, 0.3, 2.0), (80, 2, 5, 0.2, 3.0)])
def test_b_min_sep_lower_end_against_monte_carlo_of_its_statistic(T, bands, ms, p, sigma):
    """The lower end is the curve of <w, y> for the record with gradient L / a_j at the active steps:
    sample that release itself (the chain, C x + z), read the statistic, and compare the
    mixture's exact privacy loss Monte Carlo against the certified lower curve."""
    from pldlib.correlated import b_min_sep_bandmf

    c = 0.7 ** np.arange(bands)
    st = BandedStrategy.toeplitz(c, T)
    C = _dense(c, T)
    w = C.sum(axis=1)
    a = C.T @ w
    acc = b_min_sep_bandmf(sigma, st, p, ms, relation="remove")
    L, act = acc.level, acc.active  # (the data set the lower end reads: gradient L / a_j at these steps)
    assert np.all(a[act] >= L * (1 - 1e-12)) and L > 0
    g = np.where(act, np.minimum(1.0, L / np.where(act, a, 1.0)), 0.0)
    noise = sigma * st.max_norm
    rng = np.random.default_rng(T + ms)
    n = 200_000
    x = _chain_participations(T, ms, p, n, rng)
    stat = (x * g) @ (C.T @ w) + rng.normal(0.0, noise * np.linalg.norm(w), n)  # <w, C x + z>
    # the statistic's law is the mixture over N = participations at active steps of N(N L, (noise |w|)^2)
    from pldlib.correlated import min_sep_count_law
    law = min_sep_count_law(act, ms, p)
    s2 = (noise * np.linalg.norm(w)) ** 2
    ks = np.arange(law.size)
    loss = logsumexp(np.log(np.maximum(law, 1e-300))[None, :] + (stat[:, None] * ks * L - (ks * L) ** 2 / 2) / s2,
                     axis=1)
    eps = np.array([0.1, 0.25, 0.5])
    vals = np.maximum(0.0, -np.expm1(eps[:, None] - loss[None, :]))
    half = math.sqrt(math.log(2 * eps.size / 1e-6) / (2 * n))
    lo = acc.delta(eps).lower
    assert np.all(lo <= vals.mean(axis=1) + half), (lo, vals.mean(axis=1), half)
    assert np.all(lo >= vals.mean(axis=1) - half - 0.02)  # and it is the statistic's curve, not a loose one


@pytest.mark.parametrize("T,bands,ms,p,sigma", [(60, 3, 4, 0.3, 2.0), (100, 4, 6, 0.15, 3.0)])
def test_b_min_sep_upper_end_above_jax_privacy_monte_carlo(T, bands, ms, p, sigma):
    """JAX Privacy's own sampler and privacy loss of the all-ones data set (a valid data set, so the
    worst case is at least it): the certified upper end lies above its Monte Carlo band."""
    B = pytest.importorskip("jax_privacy.batch_selection")
    from jax_privacy.experimental.monte_carlo import sample_generation as G

    from pldlib.interop.jax_privacy import account_bandmf as jax_bandmf

    c = 0.7 ** np.arange(bands)
    strat = B.BMinSepSampling(sampling_prob=p, iterations=T, min_sep=ms)
    losses = G.get_privacy_loss_sample(strat, sigma, c, seed=np.random.default_rng(5), positive_sample=True,
                                       num_samples=20_000)[0]
    eps = np.array([0.25, 0.5, 1.0])
    mc = np.mean(np.maximum(0.0, -np.expm1(eps[:, None] - losses[None, :])), axis=1)
    half = math.sqrt(math.log(2 * eps.size / 1e-6) / (2 * losses.size))
    iv = jax_bandmf(strat, sigma, c, relation="remove").delta(eps)
    assert np.all(iv.upper >= mc - half)
    assert np.all(iv.lower <= iv.upper)
    with pytest.raises(ValueError, match="c_col: 4 bands exceed min_sep 3"):
        jax_bandmf(B.BMinSepSampling(sampling_prob=p, iterations=T, min_sep=3), sigma, 0.7 ** np.arange(4))


def test_b_min_sep_through_account_bandmf_and_its_errors():
    from pldlib.correlated import b_min_sep_bandmf

    st = BandedStrategy.toeplitz([1.0, 0.5], 100)
    a = account_bandmf(3.0, st, q=0.2, sampling="b_min_sep", min_sep=4).epsilon(1e-5)
    b = b_min_sep_bandmf(3.0, st, 0.2, 4).epsilon(1e-5)
    assert a == b and 0 < a.lower < a.upper
    with pytest.raises(ValueError, match="min_sep and q: b-min-sep sampling needs both"):
        account_bandmf(3.0, st, sampling="b_min_sep", min_sep=4)
    with pytest.raises(ValueError, match="min_sep: 1 is below the strategy's 2 bands"):
        b_min_sep_bandmf(3.0, st, 0.2, 1)
    with pytest.raises(ValueError, match="sampling_prob"):
        b_min_sep_bandmf(3.0, st, 1.5, 4)


def test_b_min_sep_spectral_upper_piece():
    """The second upper piece: T Poisson steps at rate p with noise sigma m / |C|, |C| bounded by
    the Schur test (checked against the dense spectral norm); with one band it is exactly Poisson
    sampling at rate p."""
    from pldlib.correlated import b_min_sep_bandmf

    st1 = BandedStrategy.toeplitz([1.0], 150)
    acc = b_min_sep_bandmf(3.0, st1, 0.25, 4)
    pois = make_accountant("pld", "add_remove")
    pois.compose(E.Sampled(E.GaussianEvent(3.0), 0.25, "poisson"), 150)
    assert acc.epsilon(1e-5).upper == pytest.approx(pois.epsilon(1e-5).upper, rel=1e-9)
    rng = np.random.default_rng(3)
    for _ in range(5):
        T, beta = int(rng.integers(10, 60)), int(rng.integers(1, 6))
        C = np.tril(rng.normal(size=(T, T)))
        C[np.subtract.outer(np.arange(T), np.arange(T)) >= beta] = 0.0
        np.fill_diagonal(C, 1.0 + rng.random(T))
        st = BandedStrategy.from_matrix(C, bands=beta)
        a = b_min_sep_bandmf(2.0, st, 0.1, beta)
        ev = a.upper_accs[1]._steps[0][0].event  # (Sampled(Gaussian(s m / bound), p))
        bound = 2.0 * st.max_norm / ev.event.sigma
        assert bound >= np.linalg.norm(C, 2) * (1 - 1e-12)
    # a zero on the diagonal (C singular): the spectral piece is left out, the unamplified one stays
    C = np.eye(20)
    C[5, 5] = 0.0
    a = b_min_sep_bandmf(2.0, BandedStrategy.from_matrix(C, bands=1), 0.1, 2)
    assert len(a.upper_accs) == 1


def test_calibration_under_balls_in_bins_and_b_min_sep():
    """calibrate_bandmf returns a sigma whose certified upper end meets the target, and a sigma a
    little smaller does not (the bisection's tolerance); unreachable targets are named."""
    from pldlib.calibration import TargetUnreachableError
    from pldlib.correlated import b_min_sep_bandmf, calibrate_bandmf

    st = BandedStrategy.toeplitz([1.0, 0.5], 100)
    for kw, acc_of in ((dict(sampling="balls_in_bins", bins=10), lambda s: balls_in_bins_bandmf(s, st, 10)),
                       (dict(sampling="b_min_sep", min_sep=4, q=0.2), lambda s: b_min_sep_bandmf(s, st, 0.2, 4))):
        sigma = calibrate_bandmf(4.0, 1e-5, st, tol=1e-3, **kw)
        assert acc_of(sigma).epsilon(1e-5).upper <= 4.0
        assert acc_of(sigma / 1.01).epsilon(1e-5).upper > 4.0
        with pytest.raises(TargetUnreachableError, match="epsilon: 0.0001 at delta 1e-12 is not met"):
            calibrate_bandmf(1e-4, 1e-12, st, bounds=(0.1, 5.0), **kw)
    with pytest.raises(ValueError, match="min_sep and q"):
        calibrate_bandmf(4.0, 1e-5, st, sampling="b_min_sep", min_sep=4)
    # the upper end alone (what calibration reads) equals the full object's upper end
    full, alone = b_min_sep_bandmf(3.0, st, 0.2, 4), b_min_sep_bandmf(3.0, st, 0.2, 4, upper_only=True)
    assert full.epsilon(1e-5).upper == alone.epsilon(1e-5).upper
    assert alone.delta(-0.3).lower == pytest.approx(-math.expm1(-0.3), rel=1e-12)  # (1 - e^eps: every pair)


@pytest.mark.parametrize("power", [0.5, 1.0, 3.0])
def test_root_search_meets_the_target_within_tol_in_few_evaluations(power):
    """The search behind balls-in-bins / b-min-sep calibration on closed-form curves
    eps = (c / sigma)^power, with no finite value below a floor (too little noise to certify):
    the answer meets the target, the exact root is within tol below it, and it takes under half
    the evaluations of a geometric bisection (15 from (0.01, 1000) at tol 1e-3)."""
    from pldlib.correlated import _smallest_meeting

    for c, eps in ((2.7, 4.0), (0.9, 0.3), (40.0, 1.5)):
        calls = []

        def upper(s):
            calls.append(s)
            return math.inf if s < 0.1 else (c / s) ** power

        root = c / eps ** (1 / power)
        got = _smallest_meeting(upper, eps, 0.01, 1000.0, 1e-3, upper(1000.0))
        assert upper(got) <= eps and got / root <= 1.001 + 1e-12 and got >= root * (1 - 1e-12)
        assert len(calls) <= 8, (c, eps, len(calls))
    # lo itself meets the target: returned as is
    assert _smallest_meeting(lambda s: 1.0 / s, 2.0, 1.0, 10.0, 1e-3, 0.1) == 1.0


def test_strategy_diagonals_must_match_column_norms():
    """The upper ends read column_norms, the lower ends the diagonals: a strategy whose two disagree
    would mix two mechanisms, so it is refused."""
    st = BandedStrategy.toeplitz([1.0, 0.5], 6)
    with pytest.raises(ValueError, match="diagonals: their column norms differ"):
        BandedStrategy(st.column_norms, 2, st.diagonals * 1.1)
    assert BandedStrategy(st.column_norms, 2, st.diagonals).diagonals is not None


def test_bandmf_sweep_cells_use_the_sweep_settings_of_their_method():
    """A bandmf block builds its accountants with the sweep's fixed settings (PRV unsharpened, so a
    cell never depends on timing): the cell equals bandmf_run with sharpen=False."""
    from pldlib.correlated import bandmf_run
    from sweeps.methods import run_block

    spec = {"index": 0, "params": {"sigma": 2.0, "q": 0.1, "sampling": "cyclic_poisson", "relation": "add_remove",
                                   "method": "prv@b2", "mechanism": "bandmf"},
            "steps": [40], "deltas": [1e-5], "options": {"bands": 2, "variant_of": "prv"}}
    r = run_block(spec)
    want = bandmf_run(2.0, 40, 2, "cyclic_poisson", 0.1, method="prv", sharpen=False).epsilon(1e-5)
    assert r["eps_upper"][0, 0] == want.upper and r["eps_lower"][0, 0] == want.lower
