"""Batches drawn with replacement (docs/MATH.md 2.7): B independent uniform draws from n records.

Independent truths:

* one step, by exact enumeration of every draw sequence of tiny data sets (scalar records in
  [-1, 1], clipping norm 1) and a 30-digit closed-form hockey-stick integral of the two output
  mixtures (roots of p - e^eps q found with mpmath): the certified upper curve lies above the
  truth of *every* data set tried (random ones included: the pair is claimed to dominate them
  all), and the extremal data set (the record at +1, the others at -1) lies inside the certified
  interval (the pair is claimed exact for add and remove);
* many steps, by seeded Monte Carlo of the privacy loss of that extremal data set (numpy, written
  from the densities), with a Hoeffding band at 1 - 1e-6.
"""
from __future__ import annotations

import itertools
import math
import warnings

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib.mechanisms import Gaussian
from pldlib.methods.pld import PLDAccountant

mp.mp.dps = 30


# -- the truth of a tiny data set ---------------------------------------------------------------
def _sum_law(records, B):
    """{sum of B draws with replacement from ``records``: probability} (every draw sequence)."""
    law: dict = {}
    p = mp.mpf(1) / len(records) ** B
    for seq in itertools.product(records, repeat=B):
        s = mp.mpf(sum(mp.mpf(r) for r in seq))
        law[s] = law.get(s, 0) + p
    return law


def _hockey_stick(P: dict, Q: dict, sigma, eps):
    """delta = int (p - e^eps q)_+ for two finite mixtures of N(c, sigma^2), closed form between the
    roots of p - e^eps q (found on a fine scan, refined by mpmath)."""
    s, g = mp.mpf(sigma), mp.e ** mp.mpf(eps)

    def f(x):
        return (sum(w * mp.npdf(x, c, s) for c, w in P.items())
                - g * sum(w * mp.npdf(x, c, s) for c, w in Q.items()))

    def F(a, b):  # int_a^b (p - e^eps q)
        def m(law):
            return sum(w * (mp.ncdf((b - c) / s) - mp.ncdf((a - c) / s)) for c, w in law.items())
        return m(P) - g * m(Q)

    cs = [float(c) for c in list(P) + list(Q)]
    lo, hi = min(cs) - 40 * sigma, max(cs) + 40 * sigma
    xs = np.linspace(lo, hi, 8001)

    def log_density(law):  # (float64 scan in log space: only where the sign of p - e^eps q changes)
        c = np.array([float(v) for v in law]); w = np.log(np.array([float(v) for v in law.values()]))
        a = w[None, :] - (xs[:, None] - c[None, :]) ** 2 / (2 * sigma ** 2)
        m = a.max(axis=1)
        return m + np.log(np.exp(a - m[:, None]).sum(axis=1))

    pos = log_density(P) - log_density(Q) > eps
    roots = [mp.findroot(f, (mp.mpf(xs[i]), mp.mpf(xs[i + 1])), solver="anderson")
             for i in np.nonzero(pos[:-1] != pos[1:])[0]]
    edges = [-mp.inf] + roots + [mp.inf]
    total = mp.mpf(0)
    for a, b in zip(edges[:-1], edges[1:]):
        mid = (a + b) / 2 if mp.isfinite(a) and mp.isfinite(b) else (b - 1 if mp.isfinite(b) else a + 1)
        if f(mid) > 0:
            total += F(a, b)
    return float(max(total, 0))


def _truth(others, x, B, sigma, eps, relation, x_other=None):
    """Exact delta(eps) of one step on the data set ``others`` + [x] (remove: against ``others``;
    add: the reverse; substitution: against ``others`` + [x_other])."""
    with_x = _sum_law(list(others) + [x], B)
    if relation == "substitution":
        return _hockey_stick(with_x, _sum_law(list(others) + [x_other], B), sigma, eps)
    without = _sum_law(list(others), B)
    return _hockey_stick(with_x, without, sigma, eps) if relation == "remove" else \
        _hockey_stick(without, with_x, sigma, eps)


EPS = [-0.3, 0.0, 0.5, 1.5, 3.0]


def _certified(sigma, n, B, relation, eps):
    acc = PLDAccountant(relation).compose(E.WithReplacementGaussianEvent(sigma, n, B), 1)
    return acc.delta(np.array(eps))


@pytest.mark.parametrize("sigma,n,B", [(1.0, 4, 2), (0.7, 3, 3), (2.0, 5, 3)])
@pytest.mark.parametrize("relation", ["remove", "add"])
def test_one_step_extremal_data_set_inside_and_random_data_sets_below(sigma, n, B, relation):
    cert = _certified(sigma, n, B, relation, EPS)
    worst = [_truth([-1.0] * (n - 1), 1.0, B, sigma, e, relation) for e in EPS]
    for e, lo, up, t in zip(EPS, cert.lower, cert.upper, worst):
        assert lo <= t * (1 + 1e-9) + 1e-15 and t <= up * (1 + 1e-9) + 1e-15, (e, lo, t, up)
        assert up - t <= 0.05 * t + 1e-6  # (the pair is exact: only the grid's error is left)
    rng = np.random.default_rng(7)
    for _ in range(3):
        others = list(np.round(rng.uniform(-1, 1, n - 1), 3))
        x = float(np.round(rng.uniform(-1, 1), 3))
        for e, up in zip(EPS, cert.upper):
            assert _truth(others, x, B, sigma, e, relation) <= up * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize("sigma,n,B", [(1.0, 4, 2), (1.5, 3, 3)])
def test_one_step_substitution_bracketed(sigma, n, B):
    cert = _certified(sigma, n, B, "substitution", EPS)
    # the relation is symmetric (a pair and its reverse are both neighbours): its curve is the larger
    # of the extremal pair's and its reverse's (they differ at eps < 0, MATH 0.5), and both lie below
    # the upper end
    worst = [_truth([-1.0] * (n - 1), 1.0, B, sigma, e, "substitution", x_other=-1.0) for e in EPS]
    rev = [_truth([-1.0] * (n - 1), -1.0, B, sigma, e, "substitution", x_other=1.0) for e in EPS]
    for e, lo, up, t, r in zip(EPS, cert.lower, cert.upper, worst, rev):
        t = max(t, r)
        assert lo <= t * (1 + 1e-9) + 1e-15 and t <= up * (1 + 1e-9) + 1e-15, (e, lo, t, up)
    rng = np.random.default_rng(11)
    for _ in range(4):
        others = list(np.round(rng.uniform(-1, 1, n - 1), 3))
        x, x2 = (float(v) for v in np.round(rng.uniform(-1, 1, 2), 3))
        for e, up in zip(EPS, cert.upper):
            assert _truth(others, x, B, sigma, e, "substitution", x_other=x2) <= up * (1 + 1e-9) + 1e-15


# -- many steps: Monte Carlo of the extremal data set ------------------------------------------------
def _mc_delta(sigma, n, B, steps, eps, samples, direction, seed):
    """Hoeffding band (1 - 1e-6 jointly over the eps values) of delta(eps) of ``steps`` steps of the
    extremal data set: P = sum_k Bin(B, 1/n)(k) N(2k, sigma^2), Q = N(0, sigma^2) (remove), or (Q, P)."""
    from scipy import stats

    k = np.arange(B + 1)
    w = stats.binom.pmf(k, B, 1.0 / n)
    c = w * np.exp(-2.0 * k ** 2 / sigma ** 2)
    rng = np.random.default_rng(seed)
    total = np.zeros(samples)

    def loss(y):  # ln dP/dQ (y) = ln sum_k w_k e^{(2 k y - 2 k^2) / sigma^2} = ln sum_k c_k z^k, z = e^{2 y / sigma^2}
        # (Horner on positive terms: the same values to ~1e-16 as a log-sum-exp over the B + 1
        # components, 5x faster; z^B stays far inside floating point for the outputs drawn here,
        # which the assertion checks)
        z = np.exp(2.0 * y / sigma ** 2)
        acc = np.full(y.shape, c[-1])
        for ck in c[-2::-1]:
            acc = acc * z + ck
        assert np.all(np.isfinite(acc) & (acc > 0))
        return np.log(acc)

    for _ in range(steps):
        if direction == "remove":
            y = rng.normal(2.0 * rng.choice(k, size=samples, p=w / w.sum()), sigma)
            total += loss(y)
        else:
            total -= loss(rng.normal(0.0, sigma, samples))
    half = math.sqrt(math.log(2 * len(eps) / 1e-6) / (2 * samples))
    out = []
    for e in eps:
        est = float(np.mean(np.clip(1.0 - np.exp(e - total), 0.0, 1.0)))
        out.append((est - half, est + half))
    return out


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_many_steps_meet_monte_carlo(direction):
    sigma, n, B, steps = 1.2, 50, 8, 20
    eps = [0.25, 0.5, 1.0]
    cert = PLDAccountant(direction).compose(E.WithReplacementGaussianEvent(sigma, n, B), steps).delta(np.array(eps))
    band = _mc_delta(sigma, n, B, steps, eps, 400_000, direction, seed=3)
    for (lo_mc, up_mc), lo, up in zip(band, cert.lower, cert.upper):
        assert lo <= up_mc and lo_mc <= up


# -- the same pair as other schemes where they coincide --------------------------------------------
def test_one_draw_is_sampling_without_replacement_at_rate_one_over_n():
    wr = pldlib.account(Gaussian(1.3, sampling="with_replacement", batch_size=1, dataset_size=200), steps=300)
    wor = pldlib.account(Gaussian(1.3, q=1 / 200, sampling="wor"), steps=300)
    assert wr.epsilon(1e-6) == wor.epsilon(1e-6)


def test_more_than_wor_and_poisson_at_the_same_rate():
    """With replacement a record can be drawn twice: its certified lower end lies above WOR's upper
    end at the same rate B/n (and far above Poisson's add/remove, which moves the sum by one norm)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wr = pldlib.account(Gaussian(1.0, sampling="with_replacement", batch_size=64, dataset_size=2000),
                            steps=500).epsilon(1e-5)
        wor = pldlib.account(Gaussian(1.0, q=64 / 2000, sampling="wor"), steps=500).epsilon(1e-5)
    assert wr.lower > wor.upper


# -- the ways in ---------------------------------------------------------------------------------------
def test_mechanism_and_event():
    m = Gaussian(2.0, sampling="with_replacement", batch_size=10, dataset_size=1000)
    assert m.event == E.WithReplacementGaussianEvent(2.0, 1000, 10) and m.q == 0.01
    assert Gaussian(2.0, q=0.01, sampling="with_replacement", batch_size=10, dataset_size=1000).event == m.event
    for kw, match in [({"batch_size": 10}, "dataset_size: required"), ({"dataset_size": 10}, "batch_size: required"),
                      ({"batch_size": 10, "dataset_size": 1}, "dataset_size must be an integer >= 2"),
                      ({"batch_size": 0, "dataset_size": 10}, "batch_size must be an integer >= 1"),
                      ({"batch_size": 2, "dataset_size": 10, "q": 0.5}, "leave q out"),
                      ({"batch_size": 2, "dataset_size": 10, "group": 2}, "group")]:
        with pytest.raises(ValueError, match=match):
            Gaussian(1.0, sampling="with_replacement", **kw)
    with pytest.raises(ValueError, match="Gaussian noise only"):
        pldlib.Laplace(1.0, sampling="with_replacement", batch_size=2, dataset_size=10)
    with pytest.raises(pldlib.UnsupportedEventError, match="WithReplacementGaussianEvent"):
        PLDAccountant().compose(E.Sampled(E.GaussianEvent(1.0), 0.1, "with_replacement"), 1)
    with pytest.raises(pldlib.UnsupportedEventError, match="PLD accountant only"):
        pldlib.make_accountant("spa").compose(m.event, 10)


def test_dp_accounting_drop_in():
    import dp_accounting as da
    from dp_accounting import dp_event as D

    from pldlib.interop.dp_accounting import PldlibAccountant

    NR = da.NeighboringRelation
    ev = D.SelfComposedDpEvent(D.SampledWithReplacementDpEvent(1000, 10, D.GaussianDpEvent(1.5)), 100)
    ours = PldlibAccountant(NR.ADD_OR_REMOVE_ONE).compose(ev).get_epsilon(1e-5)
    direct = PLDAccountant("add_remove").compose(E.WithReplacementGaussianEvent(1.5, 1000, 10), 100).epsilon(1e-5)
    assert ours == direct.upper
    sub = PldlibAccountant(NR.REPLACE_ONE).compose(ev).get_epsilon(1e-5)
    assert sub >= ours * (1 - 1e-3)  # (substitution: the extremal data set is a substitution too)
    assert not PldlibAccountant(NR.REPLACE_SPECIAL).supports(ev)


def test_cli(capsys):
    # (the command's main() in this process, as tests/test_cli.py runs it: four interpreters
    # started for it cost more than the accounting)
    from pldlib.cli import main

    def run(*a):
        code = main(list(a))
        out, err = capsys.readouterr()
        return code, out, err

    base = ["epsilon", "--mechanism", "gaussian", "--sigma", "1.5", "--steps", "100", "--delta", "1e-5",
            "--sampling", "with_replacement"]
    code, stdout, stderr = run(*base, "--batch-size", "10", "--dataset-size", "1000", "--json")
    assert code == 0, stderr
    import json

    out = json.loads(stdout)
    direct = PLDAccountant("add_remove").compose(E.WithReplacementGaussianEvent(1.5, 1000, 10), 100).epsilon(1e-5)
    assert out["params"]["q"] == 0.01 and out["epsilon"][0]["upper"] == pytest.approx(direct.upper, rel=1e-12)
    code, _, stderr = run(*base, "--batch-size", "10")
    assert code == 2 and "--dataset-size: required with --sampling with_replacement" in stderr
    code, _, stderr = run(*base, "--batch-size", "10", "--dataset-size", "1")
    assert code == 2 and "--dataset-size" in stderr
    code, _, stderr = run("calibrate", "--for", "q", "--sigma", "1", "--epsilon", "1", "--delta", "1e-5", "--steps",
                          "10", "--sampling", "with_replacement", "--batch-size", "10", "--dataset-size", "1000")
    assert code == 2 and "calibrate sigma or steps" in stderr


def test_sweep_config(tmp_path):
    from sweeps.config import ConfigError, parse_config
    from sweeps.methods import make_mechanism

    data = {"name": "wr", "store": str(tmp_path / "s.zarr"), "mechanism": "gaussian", "methods": ["pld"],
            "grid": {"sigma": [1.0], "q": [0.01], "steps": [10], "delta": [1e-5],
                     "sampling": ["with_replacement"], "relation": ["add_remove"]},
            "batch_size": 10, "dataset_size": 1000}
    cfg = parse_config(data)
    params = {"mechanism": "gaussian", "sigma": 1.0, "q": 0.01, "sampling": "with_replacement",
              "relation": "add_remove", **cfg.mechanism_keywords()}
    assert make_mechanism(params).event == E.WithReplacementGaussianEvent(1.0, 1000, 10)
    with pytest.raises(ConfigError, match="grid.q"):
        parse_config({**data, "grid": {**data["grid"], "q": [0.02]}})
    with pytest.raises(ConfigError, match="dataset_size"):
        parse_config({k: v for k, v in data.items() if k != "dataset_size"})


@pytest.mark.parametrize("relation", ["remove", "add"])
def test_small_noise_keeps_the_draws_that_fit_and_stays_certified(relation):
    """At sigma 0.4 the shifts of many draws leave floating point's loss range: the draws beyond
    the cut are a perfectly distinguishing part above and the last kept draw below; one step still
    brackets the 30-digit curve of the whole pair (every draw of positive weight)."""
    from scipy import stats

    from pldlib.profiles.pairs import _wr_cut

    sigma, n, B = 0.4, 2000, 64
    w, kc = _wr_cut(E.WithReplacementGaussianEvent(sigma, n, B))
    assert 1 <= kc < w.size - 1  # (the cut is exercised)
    law = {mp.mpf(2 * k): mp.mpf(float(stats.binom.pmf(k, B, 1 / n))) for k in range(B + 1)
           if stats.binom.pmf(k, B, 1 / n) > 0}
    zero = {mp.mpf(0): mp.mpf(1)}
    eps = [0.0, 1.0, 4.0, 8.0]
    cert = _certified(sigma, n, B, relation, eps)
    for e, lo, up in zip(eps, cert.lower, cert.upper):
        t = _hockey_stick(law, zero, sigma, e) if relation == "remove" else _hockey_stick(zero, law, sigma, e)
        assert lo <= t * (1 + 1e-9) + 1e-15 and t <= up * (1 + 1e-9) + 1e-15, (e, lo, t, up)
    wide = pldlib.account(Gaussian(0.4, sampling="with_replacement", batch_size=256, dataset_size=60_000,
                                   relation=relation), steps=100).epsilon(1e-5)
    assert np.isfinite(wide.upper) and wide.upper - wide.lower < 0.01 * wide.upper


def test_a_record_drawn_about_half_the_time_has_no_bare_error():
    """n = 2, B = 2,000: the low draw counts' weights underflow to 0 and P(K >= 1) is 1 in floating
    point; the answer is a certified interval, or beyond floating point a LossRangeError (never a
    bare ValueError)."""
    from pldlib.profiles.base import LossRangeError

    for rel in ("add_remove", "substitution"):
        # (at the spacing the automatic grid picks for add_remove, given explicitly: the same pairs
        # and discretisation in ~1.5 s, where the automatic grid's search took ~10 s and, on a
        # loaded machine, ran out of its 10 s time budget with the trivial interval)
        acc = PLDAccountant(rel, spacing=0.34).compose(E.WithReplacementGaussianEvent(200.0, 2, 2000), 10)
        r = acc.epsilon(1e-5)
        assert np.isfinite(r.upper) and r.lower <= r.upper
        with pytest.raises(LossRangeError, match="use more noise"):
            PLDAccountant(rel).compose(E.WithReplacementGaussianEvent(50.0, 2, 2000), 10).epsilon(1e-5)
