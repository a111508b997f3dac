"""Random allocation and shuffle at the edges (issue 39, items 1 and 6): certified intervals against
an independent high-precision truth of the epoch pair, lower bounds carried down to 0 (no float
floor), and the better of the amplified and unamplified upper bounds (docs/MATH.md 13.3-13.5).

The truth.  One epoch of random allocation with t = 2 steps (q = 1/2), Gaussian noise s = sigma per
step, one record of sensitivity 1: the pair of MATH 13.2 on R^2 (the max-coordinate / allocation
pair of section 13, of which the largest coordinate is a post-processing),

    P = (N(1, s^2) x N(0, s^2) + N(0, s^2) x N(1, s^2)) / 2,    Q = N(0, s^2) x N(0, s^2),

with likelihood ratio S(x) = (a + b) / 2, a = e^{(x1 - 1/2)/s^2}, b = e^{(x2 - 1/2)/s^2}.  With
g = e^eps:  remove: delta = int (p - g q)_+ = E_Q (S - g)_+;  add: delta = int (q - g p)_+ = E_Q (1 - g S)_+.
Conditioning on x1 (x2 ~ N(0, s^2) under Q, and E_Q[b; x2 > c] = P(N(1, s^2) > c)):

    remove: K = 2g - a;  K <= 0: (a + 1)/2 - g;  else, with c = 1/2 + s^2 ln K,
            (a/2 - g) Phibar(c/s) + Phibar((c - 1)/s) / 2;
    add:    K = 2/g - a; K <= 0: 0;              else, with c = 1/2 + s^2 ln K,
            (1 - g a/2) Phi(c/s) - (g/2) Phi((c - 1)/s);

then integrated over x1 ~ N(0, s^2) by mpmath (30 digits), split at the kink K = 0.  add_remove is
the larger of the two.  Nothing of pldlib is used.
"""
import functools
import math

import mpmath as mp
import numpy as np
import pytest

import pldlib

RELATIONS = ("add", "remove", "add_remove")


@functools.lru_cache(maxsize=None)
def truth_t2(sigma, eps, relation):
    """delta(eps) of one epoch of random allocation, t = 2 (module docstring), as an mpf."""
    if relation == "add_remove":
        return max(truth_t2(sigma, eps, "add"), truth_t2(sigma, eps, "remove"))
    with mp.workdps(30):
        s = mp.mpf(sigma)
        g = mp.exp(mp.mpf(eps))

        def inner(x1):
            a = mp.exp((x1 - mp.mpf(1) / 2) / s ** 2)
            if relation == "remove":
                K = 2 * g - a
                if K <= 0:
                    return (a + 1) / 2 - g
                c = mp.mpf(1) / 2 + s ** 2 * mp.log(K)
                return (a / 2 - g) * mp.ncdf(-c / s) + mp.ncdf(-(c - 1) / s) / 2
            K = 2 / g - a
            if K <= 0:
                return mp.mpf(0)
            c = mp.mpf(1) / 2 + s ** 2 * mp.log(K)
            return (1 - g * a / 2) * mp.ncdf(c / s) - g / 2 * mp.ncdf((c - 1) / s)

        kink = mp.mpf(1) / 2 + s ** 2 * mp.log(2 * g if relation == "remove" else 2 / g)
        pts = sorted({float(kink), -8 * sigma, 8 * sigma})
        pts = [-mp.inf] + [mp.mpf(p) for p in pts] + [mp.inf]
        return mp.quad(lambda x: inner(x) * mp.npdf(x, 0, s), pts)


def gauss_delta(eps, mu):
    """delta(eps) of the Gaussian pair N(mu, 1) vs N(0, 1) (Balle & Wang), 40 digits."""
    with mp.workdps(40):
        mu, e = mp.mpf(mu), mp.mpf(eps)
        return mp.ncdf(-e / mu + mu / 2) - mp.exp(e) * mp.ncdf(-e / mu - mu / 2)


def gauss_epsilon(delta, mu):
    """eps(delta) of the Gaussian pair (bisection on the closed form, 40 digits)."""
    with mp.workdps(40):
        return mp.findroot(lambda e: gauss_delta(e, mu) - delta, (mp.mpf(-50), mp.mpf(200)), solver="bisect")


def brackets(iv, truth, tiny=1e-300):
    up, lo = np.atleast_1d(iv.upper), np.atleast_1d(iv.lower)
    for u, l, tr in zip(up, lo, truth):
        tr = float(tr)
        assert u >= tr * (1 - 1e-9), ("upper below the truth", u, tr)
        assert l <= tr * (1 + 1e-9) + tiny, ("lower above the truth", l, tr)


def test_truth_self_checks():
    """The quadrature: delta(0) is the total variation in both directions (equal), the reversal
    identity delta_add(eps) = 1 - e^eps + e^eps delta_remove(-eps), and the issue's two numbers."""
    with mp.workdps(30):
        for e in (0.0, 0.7):
            ident = 1 - mp.exp(e) + mp.exp(e) * truth_t2(1.0, -e, "remove")
            assert abs(truth_t2(1.0, e, "add") - ident) < mp.mpf(10) ** -25
        assert abs(truth_t2(1.0, 0.0, "add") - truth_t2(1.0, 0.0, "remove")) < mp.mpf(10) ** -25
    assert abs(truth_t2(1.0, 8.0, "add") / mp.mpf("2.94e-28") - 1) < 0.01
    assert abs(truth_t2(0.7, 6.0, "add_remove") / mp.mpf("8.87e-6") - 1) < 0.01


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_one_epoch_interval_brackets_the_truth(sigma, relation):
    """Both ends of the interval against the quadrature, from eps = -0.5 into the far tail (lower
    bounds carried down: the truth reaches 1e-28 and below; sigma 0.7: the item-6 test)."""
    eps = [-0.5, 0.0, 1.0, 3.0, 6.0, 8.0]
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma, q=0.5, sampling="random_allocation", relation=relation),
                         steps=2)
    brackets(acc.delta(eps), [truth_t2(sigma, e, relation) for e in eps])


def test_issue_item1_reproducer():
    """sigma 1, q 1/2, add, one epoch: delta(8) lower <= the truth 2.94e-28 (was 9.99e-16); max_tpr(0) lower
    <= 0 (the pair is mutually absolutely continuous: exact 0); gdp_mu's lower end <= 1 (the epoch pair is
    dominated by the Gaussian pair mu = 1/sigma = 1, so "not GDP" is false)."""
    acc = pldlib.account(pldlib.Gaussian(sigma=1.0, q=0.5, sampling="random_allocation", relation="add"), steps=2)
    iv = acc.delta(8.0)
    assert iv.lower <= float(truth_t2(1.0, 8.0, "add")) <= iv.upper
    assert acc.max_tpr(0.0).lower <= 0.0
    assert acc.gdp_mu().lower <= 1.0


def test_issue_item6_upper_is_the_better_of_amplified_and_unamplified():
    """sigma 0.7, q 1/2: the upper is at most the unamplified Gaussian (mu = 1/sigma per epoch; was 1.28e-3
    at eps = 6 against its 6.6e-5) and still >= the truth 8.87e-6; epsilon(1e-5) is answered (was a
    PrecisionLimitError) at most the unamplified 6.65."""
    acc = pldlib.account(pldlib.Gaussian(sigma=0.7, q=0.5, sampling="random_allocation"), steps=2)
    iv = acc.delta(6.0)
    assert float(truth_t2(0.7, 6.0, "add_remove")) <= iv.upper <= float(gauss_delta(6.0, 1 / 0.7)) * (1 + 1e-9)
    brackets(acc.delta([0.0, 2.0]), [truth_t2(0.7, e, "add_remove") for e in (0.0, 2.0)])
    r = acc.epsilon(1e-5)
    assert r.upper <= float(gauss_epsilon(1e-5, 1 / 0.7)) + 1e-6
    assert r.lower <= r.upper


@pytest.mark.parametrize("scheme", ["random_allocation", "shuffle"])
@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("epochs", [1, 3])
def test_several_epochs_upper_at_most_unamplified_lower_no_floor(relation, epochs, scheme):
    """E epochs (t = 2, sigma 1), random allocation and shuffle: upper <= the unamplified Gaussian
    (mu = sqrt(E)/sigma, a certified upper bound for both schemes) and the lower below it too, down to the far tail where it is ~1e-30 (no float floor;
    the Gaussian dominates the truth, so a lower above it is above the truth)."""
    sigma = 1.0
    mu = math.sqrt(epochs) / sigma
    eps = [1.0, 4.0, 8.0, 12.0]
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma, q=0.5, sampling=scheme, relation=relation),
                         steps=2 * epochs)
    iv = acc.delta(eps)
    for j, e in enumerate(eps):
        g = float(gauss_delta(e, mu))
        assert iv.upper[j] <= g * (1 + 1e-9) + 1e-300
        assert iv.lower[j] <= g
    assert acc.epsilon(1e-5).upper <= float(gauss_epsilon(1e-5, mu)) + 1e-6


@pytest.mark.parametrize("relation", RELATIONS)
def test_shuffle_lower_below_the_allocation_pair_truth(relation):
    """Shuffle's lower bound is random allocation's dominated epoch pair (MATH 13.4): below the quadrature
    truth of that pair (which is itself <= shuffle's truth), in the far tail too; its upper (no
    amplification) above it."""
    sigma, eps = 1.0, [0.0, 2.0, 4.0, 8.0]
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma, q=0.5, sampling="shuffle", relation=relation), steps=2)
    brackets(acc.delta(eps), [truth_t2(sigma, e, relation) for e in eps])
    assert acc.max_tpr(0.0).lower <= 0.0


@pytest.mark.parametrize("scheme", ["random_allocation", "shuffle"])
def test_substitution_lower_has_no_floor(scheme):
    """Substitution (per-step bounds): 3 epochs, the lower stays below the Gaussian mu = 2 sqrt(E)/sigma,
    which dominates the truth (sensitivity 2, no amplification), down to 1e-30."""
    sigma, epochs = 2.0, 3
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma, q=0.5, sampling=scheme, relation="substitution"),
                         steps=2 * epochs)
    eps = [1.0, 4.0, 8.0, 12.0]
    iv = acc.delta(eps)
    for j, e in enumerate(eps):
        g = float(gauss_delta(e, 2 * math.sqrt(epochs) / sigma))
        assert iv.lower[j] <= g and iv.upper[j] >= iv.lower[j]


def test_lower_pair_has_no_infinite_atom_in_either_direction():
    """The dominated pair is built per direction (MATH 13.3): no P(+inf) in either (the old reverse got
    the float residual 1 - sum Q ~ 1e-15 there), exact P-totals <= 1 and <= the Q-totals (fsum)."""
    from pldlib.sampling.allocation import allocation_epoch_lower_pair

    fwd = allocation_epoch_lower_pair(1.0, 2).profile
    for prof in (fwd, fwd.reversed()):
        assert prof.p_inf == 0.0
        assert math.fsum(np.concatenate([prof.p_masses, [-1.0]])) <= 0.0
        assert math.fsum(np.concatenate([prof.p_masses, -prof.q_masses])) <= 0.0
    assert fwd.reversed().reversed() is fwd
    assert float(fwd.reversed().delta(8.0)) == 0.0
