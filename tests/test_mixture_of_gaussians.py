"""Mixtures of Gaussians (dp_accounting's MixtureOfGaussiansDpEvent): both directions of the pair
against 40-digit mpmath truths, through every method that takes them, the two-point mixture
equal to the Poisson-subsampled Gaussian bit for bit, and dp_accounting's drop-in."""
from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib.methods import make_accountant
from pldlib.sampling import dominating_pairs

mp.mp.dps = 40


def truth_delta(sigma, cs, ps, eps, direction):
    """delta(eps) of one step at 40 digits: remove = H_{e^eps}(sum p_i N(c_i) || N(0)), add = the
    reverse.  L(x) = ln sum p_i exp((2 x c_i - c_i^2) / (2 s^2)) is increasing in x, so the set
    where the first density exceeds e^eps times the second is a half line, its end x* found by
    mpmath's root finder; then delta is a sum of Gaussian tails."""
    s = mp.mpf(sigma)
    cs = [mp.mpf(c) for c in cs]
    ps = [mp.mpf(p) for p in ps]
    e = mp.mpf(eps)

    def L(x):
        return mp.log(mp.fsum(p * mp.exp((2 * x * c - c * c) / (2 * s * s)) for c, p in zip(cs, ps)))

    sf = lambda z: mp.ncdf(-z)  # noqa: E731
    target = e if direction == "remove" else -e
    lo, hi = mp.mpf(-1), mp.mpf(1)
    while L(lo) > target:
        lo *= 2
        if lo < -1e6:  # L >= ln p_0 > target everywhere (a zero shift): the half line is all of R
            return max(1 - mp.exp(e), 0) if direction == "remove" else mp.mpf(0)
    while L(hi) < target:
        hi *= 2
    x = mp.findroot(lambda t: L(t) - target, (lo, hi), solver="anderson")
    mix_sf = mp.fsum(p * sf((x - c) / s) for c, p in zip(cs, ps))
    mix_cdf = mp.fsum(p * mp.ncdf((x - c) / s) for c, p in zip(cs, ps))
    if direction == "remove":  # {L > eps} = {x > x*}: P = mixture, Q = N(0)
        return max(mix_sf - mp.exp(e) * sf(x / s), 0)
    return max(mp.ncdf(x / s) - mp.exp(e) * mix_cdf, 0)  # add: P = N(0), Q = mixture, {L < -eps}


def mixtures():
    rng = np.random.default_rng(7)
    out = []
    for n in (2, 3, 4, 5):
        for sigma in (0.5, 1.5, 5.0):
            c = np.round(np.sort(rng.uniform(0.0, 2.0, n)), 3)
            c[0] = 0.0 if n % 2 == 0 else c[0]
            p = rng.dirichlet(np.ones(n))
            p = np.round(p, 6)
            p[-1] = 1.0 - p[:-1].sum()
            out.append((sigma, tuple(c), tuple(p)))
    return out


@pytest.mark.parametrize("sigma,cs,ps", mixtures())
def test_one_step_pairs_and_accountant_bracket_the_40_digit_truth(sigma, cs, ps):
    ev = E.MixtureOfGaussiansEvent(sigma, cs, ps)
    branches = {b.label: b.upper for b in dominating_pairs(ev, "add_remove")}
    assert set(branches) == {"add", "remove"}
    acc = make_accountant("pld").compose(ev, 1)
    for eps in (0.0, 0.3, 1.0, 3.0):
        t = {d: float(truth_delta(sigma, cs, ps, eps, d)) for d in ("add", "remove")}
        for d, prof in branches.items():  # the exact pairs: their curves are the truth to rounding
            got = float(prof.delta(np.array([eps]))[0])
            assert got == pytest.approx(t[d], rel=1e-9, abs=1e-300), (d, eps)
        lo, up = acc.delta(eps)
        truth = max(t.values())
        assert lo <= truth * (1 + 1e-12) + 1e-300 and up >= truth * (1 - 1e-12), (eps, lo, up, truth)
        assert up - lo <= 1e-2 * truth + 1e-12


def test_the_two_point_mixture_is_the_poisson_gaussian_bit_for_bit():
    mog = E.MixtureOfGaussiansEvent(2.0, (0.0, 1.0), (0.99, 0.01))
    sgd = E.Sampled(E.GaussianEvent(2.0), 0.01, "poisson")
    assert mog.canonical() == sgd
    for m in ("pld", "prv", "spa", "rdp", "clt"):
        kw = {"on_edge": "flag"} if m == "spa" else {}
        a = make_accountant(m, **kw).compose(mog, 500).epsilon(np.array([1e-7, 1e-5]))
        b = make_accountant(m, **kw).compose(sgd, 500).epsilon(np.array([1e-7, 1e-5]))
        for x, y in ((a.lower, b.lower), (a.upper, b.upper), (a.estimate, b.estimate)):
            if x is None:
                assert y is None
            else:
                np.testing.assert_array_equal(x, y)
    # scale: shift c is the Gaussian of noise multiplier sigma / c; all shifts 0 is nothing at all
    assert E.MixtureOfGaussiansEvent(3.0, (2.0,), (1.0,)).canonical() == E.GaussianEvent(1.5)
    assert E.flatten(E.MixtureOfGaussiansEvent(1.0, (0.0,), (1.0,)), 5) == []


def test_methods_that_cannot_take_a_mixture_say_why_and_the_others_agree():
    ev = E.MixtureOfGaussiansEvent(1.0, (0.0, 1.0, 2.0), (0.81, 0.18, 0.01))
    for m in ("rdp", "clt"):
        with pytest.raises(pldlib.UnsupportedEventError, match="Gaussian"):
            make_accountant(m).compose(ev, 10)
    with pytest.raises(pldlib.UnsupportedEventError, match="add and remove only"):
        make_accountant("pld", "substitution").compose(ev, 10)
    res = {m: make_accountant(m).compose(ev, 200).epsilon(1e-6) for m in ("pld", "prv", "spa")}
    lo = max(r.lower for r in res.values())
    up = min(r.upper for r in res.values())
    assert lo <= up  # certified intervals of one truth intersect
    assert res["pld"].upper - res["pld"].lower < 5e-3 * res["pld"].upper


@pytest.mark.parametrize("bad,match", [
    (dict(sigma=0.0, sensitivities=(1.0,), probabilities=(1.0,)), "sigma"),
    (dict(sigma=1.0, sensitivities=(1.0, -1.0), probabilities=(0.5, 0.5)), "sensitivities"),
    (dict(sigma=1.0, sensitivities=(1.0, 2.0), probabilities=(0.5, 0.6)), "probabilities"),
    (dict(sigma=1.0, sensitivities=(1.0, 2.0), probabilities=(1.0,)), "one probability per sensitivity"),
    (dict(sigma=1.0, sensitivities="ab", probabilities=(1.0,)), "list of numbers"),
])
def test_bad_mixtures_are_refused_naming_the_argument(bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        E.MixtureOfGaussiansEvent(**bad)


def test_dp_accounting_drop_in_accepts_mixtures_and_agrees_with_dp_accounting():
    from dp_accounting import dp_event as D
    from dp_accounting.pld import pld_privacy_accountant as P

    from pldlib.interop.dp_accounting import NeighboringRelation as NR
    from pldlib.interop.dp_accounting import PldlibAccountant

    ev = D.MixtureOfGaussiansDpEvent(1.2, [0.0, 0.6, 1.0], [0.9, 0.07, 0.03])
    ours = PldlibAccountant()
    ours.compose(ev, 300)
    # (their mixture PLD takes ~9 s to build at spacing 1e-4, ~5 s at 2e-4)
    h = 2e-4
    theirs = P.PLDAccountant(value_discretization_interval=h)
    theirs.compose(ev, 300)
    iv = ours.epsilon_interval(1e-6)
    e_theirs = theirs.get_epsilon(1e-6)
    # dp_accounting's pessimistic value lies above the truth by at most its discretisation error
    # (about steps x spacing in the loss); our certified interval holds the truth
    assert iv.lower <= e_theirs + 1e-9 and e_theirs <= iv.upper + 300 * h
    assert ours.get_epsilon(1e-6) == iv.upper
    with pytest.raises(Exception, match="REPLACE_ONE"):
        PldlibAccountant(NR.REPLACE_ONE).compose(ev, 1)
    special = PldlibAccountant(NR.REPLACE_SPECIAL)
    special.compose(ev, 300)
    assert special.get_epsilon(1e-6) == ours.get_epsilon(1e-6)
    # the two-point mixture is dp_accounting's Poisson-sampled Gaussian
    a, b = PldlibAccountant(), PldlibAccountant()
    a.compose(D.MixtureOfGaussiansDpEvent(2.0, [0.0, 1.0], [0.98, 0.02]), 1000)
    b.compose(D.PoissonSampledDpEvent(0.02, D.GaussianDpEvent(2.0)), 1000)
    assert a.get_epsilon(1e-5) == b.get_epsilon(1e-5)
    assert math.isfinite(a.get_epsilon(1e-5))


def test_monte_carlo_bernstein_interval_covers_a_closed_form():
    # the Monte Carlo routine itself, against the Gaussian closed form (k unsampled steps of sigma:
    # one Gaussian of sigma / sqrt(k)): its empirical Bernstein interval must hold the truth
    from scipy.stats import norm

    from pldlib.testing.montecarlo import events_delta_interval

    sigma, k, eps = 2.0, 8, np.array([0.0, 0.5, 1.0, 2.0])
    mu = math.sqrt(k) / sigma
    truth = norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    mc = events_delta_interval("add_remove", [(E.GaussianEvent(sigma), k)], eps, n_samples=400_000, seed=7,
                               bound="bernstein")
    assert np.all(mc.lower <= truth) and np.all(truth <= mc.upper)
    hoeff = events_delta_interval("add_remove", [(E.GaussianEvent(sigma), k)], eps, n_samples=400_000, seed=7)
    assert np.all(mc.upper - mc.lower <= hoeff.upper - hoeff.lower)  # (narrower where delta is small)


@pytest.mark.parametrize("b,p,sigma", [(2, 0.05, 0.8), (4, 0.1, 1.5), (3, 0.02, 1.0)])
def test_bandmf_shaped_mixtures_agree_with_monte_carlo(b, p, sigma):
    # mixtures of banded-matrix shape (benchmarks/correlated_mc.py, where 12 shapes run at 10^7
    # samples): the certified interval overlaps a seeded Monte Carlo interval (confidence 0.999)
    from pldlib.methods.pld import PLDAccountant
    from pldlib.testing.montecarlo import banded_mixture, events_delta_interval

    ev = banded_mixture(b, 0.5, p, sigma)
    eps = np.array([0.0, 0.25, 0.5, 1.0])
    iv = PLDAccountant("add_remove").compose(ev, 10).delta(eps)
    mc = events_delta_interval("add_remove", [(ev, 10)], eps, n_samples=200_000, seed=b, bound="bernstein")
    assert np.all(iv.upper >= mc.lower) and np.all(iv.lower <= mc.upper), (iv, mc)
