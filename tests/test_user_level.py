"""User-level accounting: a user with up to g records (docs/MATH.md section 13.1).

Independent truths: the example-level answer (g = 1), the group-privacy conversion
(g eps, g e^{(g-1) eps} delta) of the example-level curve, 1-D quadrature of the explicit
mixture pair with mpmath, and seeded Monte Carlo of the mechanism itself (1-D aligned, and
2-D with the user's records pointing in different directions)."""
import math

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib.profiles.mixtures import GaussianNoise, poisson_remove, shift_mixture_remove
from pldlib.sampling.base import binomial_weights


def _acc(sigma, q, steps, g, sampling="poisson", relation="add_remove", **kw):
    return pldlib.account(pldlib.Gaussian(sigma=sigma, q=q, sampling=sampling, relation=relation, group=g),
                          steps=steps, **kw)


# -- g = 1 is the example-level answer ------------------------------------------------------
@pytest.mark.parametrize("sampling", ["poisson", "wor"])
@pytest.mark.parametrize("relation", ["add", "remove", "add_remove"])
def test_group_one_equals_example_level(sampling, relation):
    m1 = pldlib.Gaussian(sigma=0.9, q=0.02, sampling=sampling, relation=relation, group=1)
    m0 = pldlib.Gaussian(sigma=0.9, q=0.02, sampling=sampling, relation=relation)
    assert m1.event == m0.event and repr(m1) == repr(m0)
    a1, a0 = pldlib.account(m1, steps=300), pldlib.account(m0, steps=300)
    e1, e0 = a1.epsilon([1e-3, 1e-6]), a0.epsilon([1e-3, 1e-6])
    d1, d0 = a1.delta([0.5, 2.0]), a0.delta([0.5, 2.0])
    for x, y in ((e1, e0), (d1, d0)):
        assert np.array_equal(x.lower, y.lower) and np.array_equal(x.upper, y.upper)


def test_two_weight_mixture_is_the_poisson_pair():
    """The user-level profile code, fed Bin(1, q), reproduces the closed-form Poisson pair."""
    for s, q in [(1.0, 0.01), (0.5, 0.3), (3.0, 1e-4)]:
        a, b = poisson_remove(GaussianNoise(s, 1.0), q), shift_mixture_remove(GaussianNoise(s, 1.0), [1 - q, q])
        eps = np.linspace(math.log1p(-q) + 1e-6, 30, 2001)
        da, db = a.delta(eps), b.delta(eps)
        keep = da > 1e-280
        assert np.max(np.abs(da[keep] - db[keep]) / da[keep]) < 1e-8
        er = np.linspace(-30, -math.log1p(-q) - 1e-6, 2001)
        da, db = a.reversed().delta(er), b.reversed().delta(er)
        keep = da > 1e-280
        assert np.max(np.abs(da[keep] - db[keep]) / da[keep]) < 1e-5


def test_threshold_against_mpmath():
    """L(x_eps) = eps for the g-component loss, checked in 50-digit arithmetic."""
    mp.mp.dps = 50
    rng = np.random.default_rng(7)
    for g, q, s, D in [(2, 0.01, 1.0, 1.0), (8, 0.01, 1.0, 1.0), (8, 0.3, 0.5, 2.0), (5, 1e-5, 10.0, 1.0)]:
        w = binomial_weights(g, q)
        prof = shift_mixture_remove(GaussianNoise(s, D), w)
        eps = np.concatenate([math.log(w[0]) + 10 ** rng.uniform(-4, 0, 10), rng.uniform(0, 60, 10)])
        W = [mp.mpf(float(v)) for v in w]
        for e, x in zip(eps, prof._threshold(eps)):
            X = mp.mpf(float(x))
            L = mp.log(sum(W[k] * mp.exp((2 * X * k * D - (k * D) ** 2) / (2 * mp.mpf(s) ** 2)) for k in range(g + 1)))
            assert abs(L - mp.mpf(float(e))) < 1e-12 * max(1.0, abs(e))


# -- refusals and plumbing -------------------------------------------------------------------
def test_refusals_and_plumbing():
    with pytest.raises(pldlib.UnsupportedEventError, match="substitution"):
        _acc(1.0, 0.01, 10, 2, relation="substitution")
    with pytest.raises(pldlib.UnsupportedEventError, match="substitution"):
        _acc(1.0, 0.01, 10, 2, sampling="wor", relation="substitution")
    with pytest.raises(ValueError, match="Gaussian"):
        pldlib.Laplace(scale=1.0, q=0.01, sampling="poisson", group=2)
    with pytest.raises(pldlib.UnsupportedEventError, match="user-level"):
        _acc(1.0, 0.25, 4, 2, sampling="random_allocation")
    with pytest.raises(pldlib.UnsupportedEventError, match="Gaussian"):
        pldlib.PLDAccountant("add_remove").compose(E.Sampled(E.LaplaceEvent(1.0), 0.1, "poisson", 2)).epsilon(1e-5)
    with pytest.raises(ValueError, match="group"):
        E.Sampled(E.GaussianEvent(1.0), 1.0, "poisson", 2)
    with pytest.raises(ValueError, match="group"):
        pldlib.Gaussian(sigma=1.0, q=0.1, sampling="poisson", group=0)
    for method in ("rdp", "clt"):
        with pytest.raises(pldlib.UnsupportedEventError, match="group"):
            pldlib.make_accountant(method, "add_remove").compose(
                E.Sampled(E.GaussianEvent(1.0), 0.01, "poisson", 2), 10).epsilon(1e-5)
    ev = E.Sampled(E.GaussianEvent(1.0), 0.01, "poisson", 3)
    assert "group=3" in repr(ev) and ev != E.Sampled(E.GaussianEvent(1.0), 0.01, "poisson")
    # no sampling: g records each used once = the Gaussian with g times the sensitivity (exact)
    m = pldlib.Gaussian(sigma=4.0, group=4)
    assert m.event == E.GaussianEvent(1.0, 4.0)
    a, b = pldlib.account(m, steps=10).epsilon(1e-5), pldlib.account(pldlib.Gaussian(sigma=1.0), steps=10).epsilon(1e-5)
    assert a == b


def test_dp_accounting_export_refuses_groups():
    from pldlib.interop.dp_accounting import to_dp_event

    with pytest.raises(ValueError, match="group"):
        to_dp_event(E.Sampled(E.GaussianEvent(1.0), 0.01, "poisson", 2))


def test_wor_user_rate():
    from pldlib.sampling.wor import user_rate

    assert user_rate(100, 10_000, 1) == 100 / 10_000
    assert user_rate(100, 10_000, 8) == 100 / 9_993
    with pytest.raises(ValueError, match="batch"):
        user_rate(100, 100, 2)


def test_monotone_in_group():
    ups = [_acc(1.0, 0.01, 200, g).epsilon(1e-5).upper for g in (1, 2, 4, 8)]
    assert all(a < b for a, b in zip(ups, ups[1:]))


# -- (b) below the group-privacy conversion at a DP-SGD shape --------------------------------
def _group_conversion_lower(d1, g, delta, grid):
    """A lower bound on the group-privacy conversion of the example-level curve: the smallest
    eps1 with g e^{(g-1) eps1} delta1(eps1) <= delta gives (g eps1, delta) for groups of g;
    using the certified LOWER delta1 (``d1`` on ``grid``: below the truth) and the grid point
    below the first feasible one makes this at most the conversion of the exact example-level
    curve."""
    ok = np.nonzero(g * np.exp((g - 1) * grid) * d1 <= delta)[0]
    return g * grid[max(ok[0] - 1, 0)]


def test_below_group_privacy_conversion():
    sigma, q, steps, delta = 1.0, 0.01, 1000, 1e-5
    ex = _acc(sigma, q, steps, 1)
    ex_eps = ex.epsilon(delta)
    grid = np.arange(0.0, 30.0, 0.002)
    # (once: 15,000 deltas, read at the automatic grid's spacing given explicitly, so that they
    # are not sharpened -- 0.1 s instead of 7 s; an unsharpened certified lower delta is at most
    # the sharpened one, so the conversion below is at most as large and the test only harder)
    d1 = np.asarray(_acc(sigma, q, steps, 1, spacing=ex.spacing).delta(grid).lower)
    for g in range(2, 9):
        up = _acc(sigma, q, steps, g).epsilon(delta).upper
        conv = _group_conversion_lower(d1, g, delta, grid)
        assert up < conv, (g, up, conv)
    # and the conversion's own example-level epsilon at g = 2 is above the example-level eps
    assert _group_conversion_lower(d1, 2, delta, grid) > 2 * ex_eps.lower


# -- (c) one step: exact delta by 1-D quadrature --------------------------------------------
@mp.workdps(20)  # (the precision is restored on return: other tests' mpmath is untouched)
def _quad_delta(g, q, sigma, shift, eps, direction):
    """delta(eps) of P = sum_k Bin(g,q)(k) N(k shift, sigma^2) vs Q = N(0, sigma^2) (remove) or
    of (Q, P) (add), by mpmath quadrature of the positive part of the density difference
    (20 digits: the float result is the same as at 25 or 30, far inside the 1e-9 slack)."""
    s = mp.mpf(sigma)
    w = [mp.binomial(g, k) * mp.mpf(q) ** k * (1 - mp.mpf(q)) ** (g - k) for k in range(g + 1)]

    def p(x):
        return sum(w[k] * mp.npdf(x, k * shift, s) for k in range(g + 1))

    def qd(x):
        return mp.npdf(x, 0, s)

    E = mp.e ** mp.mpf(eps)
    if direction == "remove":
        f = lambda x: p(x) - E * qd(x)  # noqa: E731
    else:
        f = lambda x: qd(x) - E * p(x)  # noqa: E731
    # the sign changes where the log density ratio crosses eps (once: the ratio is monotone);
    # locate it on a float scan of the log ratio, refine it in mpmath, split the integral there
    xs = np.linspace(-30 * sigma, 30 * sigma + g * shift, 2001)
    k = np.arange(g + 1)[:, None]
    wf = np.array([float(v) for v in w])[:, None]
    lr = np.log((wf * np.exp((2 * xs[None, :] * k * shift - (k * shift) ** 2) / (2 * sigma**2))).sum(0))
    level = eps if direction == "remove" else -eps  # q > e^eps p  <=>  ln(p/q) < -eps
    sgn = lr > level
    def log_ratio(x):
        return mp.log(p(x)) - mp.log(qd(x)) - mp.mpf(level)

    cross = [mp.findroot(log_ratio, (mp.mpf(xs[i]), mp.mpf(xs[i + 1])), solver="illinois")
             for i in np.nonzero(sgn[1:] != sgn[:-1])[0]]
    pts = [-mp.inf] + cross + [mp.inf]
    tot = mp.mpf(0)
    for a, b in zip(pts, pts[1:]):
        mid = (a + b) / 2 if mp.isfinite(a) and mp.isfinite(b) else (b - 1 if mp.isfinite(b) else a + 1)
        if f(mid) > 0:
            tot += mp.quad(f, [a, b])
    return float(tot)


@pytest.mark.parametrize("sampling,factor", [("poisson", 1), ("wor", 2)])
@pytest.mark.parametrize("g,sigma,q", [(2, 0.8, 0.1), (4, 1.5, 0.05), (8, 1.0, 0.2)])
def test_one_step_quadrature_inside_interval(sampling, factor, g, sigma, q):
    for relation in ("remove", "add"):
        acc = _acc(sigma, q, 1, g, sampling=sampling, relation=relation)
        for eps in (0.1, 0.5, 1.0, 2.0):
            truth = _quad_delta(g, q, sigma, factor, eps, relation)
            iv = acc.delta(eps)
            assert iv.lower <= truth * (1 + 1e-9) + 1e-15 and truth <= iv.upper * (1 + 1e-9) + 1e-15, \
                (relation, eps, iv, truth)


# -- Monte Carlo of the mechanism, composed ------------------------------------------------
def _mc_delta(sample_x, loss_of, steps, eps, n, rng, beta=1e-3, n_tests=1):
    """(estimate, Hoeffding half-width at confidence 1 - beta over n_tests estimates) of
    E[(1 - e^{eps - Y})_+], Y the sum over steps of the loss of sampled outputs."""
    acc = np.zeros(len(eps))
    for c in range(0, n, 200_000):
        m = min(200_000, n - c)
        y = np.zeros(m)
        for _ in range(steps):
            y += loss_of(sample_x(m))
        acc += np.maximum(0.0, -np.expm1(np.asarray(eps)[:, None] - y[None, :])).sum(axis=1)
    return acc / n, math.sqrt(math.log(2 * n_tests / beta) / (2 * n))


def _log_ratio_1d(x, w, shift, sigma):
    """ln sum_k w_k N(k shift, sigma^2)(x) / N(0, sigma^2)(x), written out here (not pldlib's)."""
    k = np.arange(len(w))[:, None]
    t = np.log(np.where(np.asarray(w) > 0, w, 1e-300))[:, None] + (2 * x[None, :] * k * shift - (k * shift) ** 2) / (2 * sigma**2)
    return np.logaddexp.reduce(t, axis=0)


@pytest.mark.parametrize("sampling,factor", [("poisson", 1), ("wor", 2)])
def test_monte_carlo_composed_inside_interval(sampling, factor):
    g, sigma, q, steps, n = 4, 1.5, 0.1, 5, 1_000_000
    rng = np.random.default_rng(2020 + factor)
    w = np.array([math.comb(g, k) * q**k * (1 - q) ** (g - k) for k in range(g + 1)])
    eps = [0.1, 0.5, 1.0]
    acc = _acc(sigma, q, steps, g, sampling=sampling)
    iv = acc.delta(eps)

    def under_p(m):  # remove direction, outputs under P: K ~ Bin(g, q) records each moving by `factor`
        return factor * rng.binomial(g, q, m) + sigma * rng.standard_normal(m)

    def under_q(m):
        return sigma * rng.standard_normal(m)

    rem, hw = _mc_delta(under_p, lambda x: _log_ratio_1d(x, w, factor, sigma), steps, eps, n, rng, n_tests=6)
    add, _ = _mc_delta(under_q, lambda x: -_log_ratio_1d(x, w, factor, sigma), steps, eps, n, rng, n_tests=6)
    est = np.maximum(rem, add)
    assert np.all(np.asarray(iv.lower) <= est + hw) and np.all(est - hw <= np.asarray(iv.upper)), (iv, est, hw)


def test_misaligned_records_are_dominated():
    """A user whose 3 records point in different directions (2-D outputs): the Monte Carlo
    delta of the real mechanism stays below the certified upper bound (docs/MATH.md 13.1: the
    aligned 1-D pair dominates)."""
    g, sigma, q, steps, n = 3, 1.0, 0.3, 3, 400_000
    rng = np.random.default_rng(13)
    ang = np.array([0.0, 0.9, 2.2])
    v = np.stack([np.cos(ang), np.sin(ang)], axis=1)  # unit vectors
    subsets = np.array([[(s >> i) & 1 for i in range(g)] for s in range(2 ** g)], dtype=float)
    mu = subsets @ v  # (8, 2)
    lw = np.log(q) * subsets.sum(1) + np.log1p(-q) * (g - subsets.sum(1))

    def loss(x):  # x (m, 2)
        t = lw[:, None] + (x @ mu.T).T / sigma**2 - (mu**2).sum(1)[:, None] / (2 * sigma**2)
        return np.logaddexp.reduce(t, axis=0)

    def under_p(m):
        idx = rng.choice(len(lw), size=m, p=np.exp(lw))
        return mu[idx] + sigma * rng.standard_normal((m, 2))

    eps = [0.2, 0.6]
    est, hw = _mc_delta(under_p, loss, steps, eps, n, rng, n_tests=2)
    up = np.asarray(_acc(sigma, q, steps, g, relation="remove").delta(eps).upper)
    assert np.all(est - hw <= up), (est, hw, up)


# -- calibration and CLI ------------------------------------------------------------------
def test_calibrate_group():
    r = pldlib.calibrate(8.0, 1e-5, 0.01, 500, group=4)
    assert _acc(r.sigma, 0.01, 500, 4).epsilon(1e-5).upper <= 8.0
    assert r.params["group"] == 4
    r1 = pldlib.calibrate(8.0, 1e-5, 0.01, 500)
    assert r.sigma > r1.sigma and "group" not in r1.params
    with pytest.raises(pldlib.UnsupportedEventError):
        pldlib.calibrate(8.0, 1e-5, 0.01, 500, group=4, relation="substitution")


def test_cli_group(capsys):
    import json

    from pldlib.cli import main

    assert main(["epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.01", "--steps", "200",
                 "--group", "4", "--delta", "1e-5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"]["group"] == 4
    want = _acc(1.0, 0.01, 200, 4).epsilon(1e-5)
    assert out["epsilon"][0]["upper"] == pytest.approx(want.upper, rel=1e-12)
    assert main(["epsilon", "--mechanism", "gaussian", "--sigma", "1", "--q", "0.01", "--steps", "10",
                 "--group", "4", "--delta", "1e-5", "--relation", "substitution"]) == 2
    assert main(["calibrate", "--epsilon", "8", "--delta", "1e-5", "--q", "0.01", "--steps", "200",
                 "--group", "2", "--json", "--no-table"]) == 0
    assert json.loads(capsys.readouterr().out)["params"]["group"] == 2
