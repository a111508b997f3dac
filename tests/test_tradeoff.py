"""Certified trade-off curves (docs/MATH.md section 10): closed forms bracketed, exact
enumeration, consistency with the certified (eps, delta) profile, derived figures, bad input."""
import math

import numpy as np
import pytest
from scipy import special, stats

import pldlib
import pldlib.attack
from pldlib import GaussianEvent, PLDAccountant, RandomizedResponseEvent, Sampled
from pldlib.events import ApproxDPEvent

ALPHAS = np.geomspace(1e-8, 0.5, 50)


def gdp(mu, a):
    """Phi(Phi^-1(1 - a) - mu), written independently of pldlib."""
    return stats.norm.cdf(stats.norm.isf(a) - mu)


def rr_f(eps0, a):
    return np.maximum.reduce([np.zeros_like(a), 1 - math.exp(eps0) * a, math.exp(-eps0) * (1 - a)])


# (unsampled Gaussian steps are combined into one Gaussian of mu = sqrt(k) / sigma first: (5.0, 100),
# the same mu = 2 as (2.0, 16), gave the same answers bit for bit and is left out)
@pytest.mark.parametrize("sigma,k", [(0.8, 1), (1.0, 10), (2.0, 16), (20.0, 1000)])
def test_kfold_gaussian_bracketed(sigma, k):
    acc = PLDAccountant("add_remove").compose(GaussianEvent(sigma), k)
    iv = acc.tradeoff(ALPHAS)
    truth = gdp(math.sqrt(k) / sigma, ALPHAS)
    assert np.all(iv.lower <= truth) and np.all(truth <= iv.upper)
    # tight: the width is a small share of the type II error (widths reported in results/TRADEOFF.md)
    assert np.max(iv.width) < 0.01
    # max_tpr is 1 - beta, with the ends swapped
    t = acc.max_tpr(ALPHAS)
    assert np.allclose(t.lower, 1 - iv.upper, atol=1e-15) and np.allclose(t.upper, 1 - iv.lower, atol=1e-15)
    mu = math.sqrt(k) / sigma
    m = acc.gdp_mu()
    assert m.lower <= mu <= m.upper and m.upper - m.lower < 0.05 * mu
    adv = acc.advantage()
    assert adv.lower <= 2 * stats.norm.cdf(mu / 2) - 1 <= adv.upper


@pytest.mark.parametrize("eps0", [0.1, 1.0, 3.0])
def test_randomized_response_bracketed(eps0):
    a = np.concatenate([ALPHAS, np.linspace(0.5, 1.0, 26)])
    acc = PLDAccountant("add_remove", spacing=1e-3).compose(RandomizedResponseEvent(eps0))
    iv = acc.tradeoff(a)
    truth = rr_f(eps0, a)
    assert np.all(iv.lower <= truth + 0.0) and np.all(truth <= iv.upper)
    # answered in closed form (pldlib.exact): the generic certified bound from delta(eps) on a
    # fine eps grid (an exact Neyman-Pearson reading of the closed forms is left for later)
    assert np.max(iv.width) < 2e-3
    adv = acc.advantage()
    exact = (math.exp(eps0) - 1) / (math.exp(eps0) + 1)
    assert adv.lower <= exact <= adv.upper


def test_randomized_response_composed_enumeration():
    """k-fold randomized response: exact Neyman-Pearson curve by enumerating the binomial."""
    eps0, k = 0.7, 6
    p = math.exp(eps0) / (1 + math.exp(eps0))
    j = np.arange(k + 1)[::-1]                   # number of +eps0 losses, largest loss first
    pm = stats.binom.pmf(j, k, p)
    qm = pm * np.exp(-eps0 * (2 * j - k))
    xs = np.concatenate([[0.0], np.cumsum(qm)])
    ys = np.concatenate([[0.0], np.cumsum(pm)])
    a = np.linspace(0, 1, 101)
    truth = 1 - np.interp(a, xs, ys)
    iv = PLDAccountant("remove").compose(RandomizedResponseEvent(eps0), k).tradeoff(a)
    assert np.all(iv.lower <= truth + 1e-15) and np.all(truth <= iv.upper + 1e-15)
    assert np.max(iv.width) < 1e-3  # closed form (binomial enumeration) read through the generic bound


def _configs():
    rng = np.random.default_rng(19)
    out = []
    rels = ["add", "remove", "add_remove", "substitution"]
    for i in range(20):
        out.append((float(rng.uniform(0.6, 2.0)), float(10 ** rng.uniform(-2, -0.7)), int(rng.integers(1, 40)),
                    ["poisson", "wor"][i % 2], rels[(i // 2) % 4]))
    return out


@pytest.mark.parametrize("sigma,q,k,scheme,relation", _configs())
def test_consistent_with_certified_profile(sigma, q, k, scheme, relation):
    acc = PLDAccountant(relation, spacing=0.02).compose(Sampled(GaussianEvent(sigma), q, scheme), k)
    a = np.concatenate([np.geomspace(1e-6, 0.5, 25), np.linspace(0.55, 0.99, 10)])
    iv = acc.tradeoff(a)
    eps = np.linspace(-3, 12, 301)
    du = acc.delta(eps).upper
    E = np.exp(eps)[None, :]
    implied = np.max(1 - du[None, :] - E * a[:, None], axis=1)
    if relation in ("add_remove", "substitution"):  # symmetric relations: the reversed pair too
        implied = np.maximum(implied, np.max((1 - du[None, :] - a[:, None]) / E, axis=1))
    implied = np.maximum(implied, 0.0)
    assert np.all(iv.lower >= implied - 1e-9)
    # and the optimistic side: beta_true <= beta_up, so by conjugacy
    # delta_true(eps) = sup_alpha [1 - beta_true(alpha) - e^eps alpha] >= 1 - beta_up(alpha) - e^eps alpha,
    # which the certified upper delta must respect as well
    assert np.all(iv.upper >= iv.lower)
    assert np.all(iv.upper <= 1 - a + 1e-12)
    assert np.all(du[None, :] >= 1 - iv.upper[:, None] - E * a[:, None] - 1e-9)


def test_pure_dp_with_delta_has_no_mu():
    acc = PLDAccountant("add_remove").compose(ApproxDPEvent(1.0, 1e-3), 3)
    m = acc.gdp_mu()
    assert m.lower == math.inf and m.upper == math.inf
    # the +inf atom: power at alpha = 0 is at least 1 - (1 - 1e-3)^3
    t = acc.max_tpr(0.0)
    assert t.lower >= 1 - (1 - 1e-3) ** 3 - 1e-12


def test_dpsgd_gdp_estimate_is_optimistic():
    """The CLT mu (Gaussian-DP estimate) of DP-SGD is below the certified lower end."""
    sigma, q, k = 1.0, 0.01, 1000
    acc = PLDAccountant().compose(Sampled(GaussianEvent(sigma), q, "poisson"), k)
    clt_mu = q * math.sqrt(k * math.expm1(1 / sigma**2))
    m = acc.gdp_mu()
    assert clt_mu < m.lower < m.upper < 1.1 * m.lower


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), [0.2, 2.0]])
def test_bad_alpha(bad):
    acc = PLDAccountant().compose(GaussianEvent(1.0), 2)
    with pytest.raises(ValueError, match="alpha"):
        acc.tradeoff(bad)
    with pytest.raises(ValueError, match="fpr"):
        acc.max_tpr(bad)
    with pytest.raises(TypeError, match="alpha"):
        acc.tradeoff("x")
    with pytest.raises(ValueError, match="alpha_min"):
        acc.gdp_mu(alpha_min=0.0)


def test_uncertified_methods_say_so():
    acc = pldlib.make_accountant("clt", "add_remove").compose(GaussianEvent(1.0), 10)
    with pytest.raises(NotImplementedError, match="no certified trade-off"):
        acc.tradeoff(0.1)


@pytest.mark.parametrize("name", ["prv", "spa", "rdp"])
def test_other_methods_generic_bounds(name):
    """PRV and SPA (certified delta) and RDP (upper delta only) through the generic eps-grid bounds."""
    acc = pldlib.make_accountant(name, "add_remove").compose(GaussianEvent(2.0), 16)
    a = np.geomspace(1e-6, 0.5, 20)
    iv = acc.tradeoff(a)
    f = gdp(2.0, a)
    assert np.all(iv.lower <= f) and np.all(f <= iv.upper)
    if name == "prv":
        assert np.max(iv.width) < 0.05
    if name == "rdp":  # no certified lower delta: the upper end of beta is the random test's
        assert np.allclose(iv.upper, 1 - a)


def test_scalar_in_floats_out():
    acc = PLDAccountant().compose(GaussianEvent(1.0), 2)
    iv = acc.tradeoff(0.01)
    assert isinstance(iv.lower, float) and isinstance(iv.upper, float)
    assert iv.lower <= gdp(math.sqrt(2), 0.01) <= iv.upper


# -- calibration to attack targets ------------------------------------------------------
@pytest.mark.parametrize("target", [dict(tpr_at_fpr=(0.2, 0.05)), dict(advantage=0.2)])
def test_attack_calibration_certified(target):
    q, k = 0.1, 20
    res = pldlib.calibrate(q=q, steps=k, tol=1e-2, **target)
    # checked independently with a fresh accountant at the returned sigma (default accuracy)
    acc = pldlib.account(pldlib.Gaussian(sigma=res.sigma, q=q, sampling="poisson"), steps=k,
                         spacing=res.interval)
    if "advantage" in target:
        assert acc.advantage().upper <= target["advantage"]
        assert res.value.upper <= target["advantage"]
    else:
        tpr, fpr = target["tpr_at_fpr"]
        assert acc.max_tpr(fpr).upper <= tpr
    # the infeasibility certificate: just below, the certified lower bound exceeds the target
    assert res.sigma_lower is not None and res.sigma / res.sigma_lower <= 1.0 + 1e-2 + 1e-9
    acc_lo = pldlib.account(pldlib.Gaussian(sigma=res.sigma_lower, q=q, sampling="poisson"), steps=k)
    got = acc_lo.advantage().lower if "advantage" in target else acc_lo.max_tpr(target["tpr_at_fpr"][1]).lower
    assert got > (target.get("advantage") or target["tpr_at_fpr"][0])


def test_attack_calibration_bad_input():
    with pytest.raises(ValueError, match="tpr_at_fpr"):
        pldlib.calibrate(q=0.1, steps=10, tpr_at_fpr=(0.01, 0.05))
    with pytest.raises(ValueError, match="advantage"):
        pldlib.calibrate(q=0.1, steps=10, advantage=1.5)
    with pytest.raises(ValueError, match="epsilon/delta"):
        pldlib.calibrate(1.0, 1e-5, q=0.1, steps=10, advantage=0.2)
    with pytest.raises(ValueError, match="exactly one"):
        pldlib.attack.calibrate_attack(0.1, 10, advantage=0.2, tpr_at_fpr=(0.2, 0.1))
    with pytest.raises(TypeError, match="tpr_at_fpr"):
        pldlib.calibrate(q=0.1, steps=10, tpr_at_fpr=0.2)


def test_implied_epsilon_helpers():
    from pldlib.attack import epsilon_for_advantage, epsilon_for_tpr

    e = epsilon_for_tpr(0.05, 0.01, 1e-5)
    assert math.isclose(1e-5 + math.exp(e) * 0.01, 0.05, rel_tol=1e-9)
    e = epsilon_for_advantage(0.1, 1e-5)
    assert math.isclose((math.exp(e) - 1 + 2e-5) / (math.exp(e) + 1), 0.1, rel_tol=1e-9)


# -- command line ------------------------------------------------------------------------
def test_cli_tradeoff_json(capsys):
    import json

    from pldlib.cli import main

    rc = main(["tradeoff", "--mechanism", "gaussian", "--sigma", "2", "--steps", "4", "--alpha", "0.001", "0.1",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    truth = gdp(1.0, np.array([0.001, 0.1]))
    for row, t in zip(out["tradeoff"], truth):
        assert row["lower"] <= t <= row["upper"]
        assert row["tpr_lower"] <= 1 - t <= row["tpr_upper"]
    assert out["gdp_mu"]["lower"] <= 1.0 <= out["gdp_mu"]["upper"]
    assert out["advantage"]["lower"] <= 2 * stats.norm.cdf(0.5) - 1 <= out["advantage"]["upper"]


@pytest.mark.parametrize("argv,needle", [
    (["--alpha", "1.5"], "--alpha"), (["--alpha", "-0.1"], "--alpha"), (["--alpha", "x"], "--alpha"),
    (["--alpha", "0.1", "--method", "clt"], "no certified trade-off")])
def test_cli_tradeoff_bad_input(capsys, argv, needle):
    from pldlib.cli import main

    rc = main(["tradeoff", "--mechanism", "gaussian", "--sigma", "2", "--steps", "4"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("relation", ["remove", "add"])
def test_one_direction_is_not_symmetric(relation):
    """For add or remove alone the relation is ordered: the reversed-pair term e^-eps (1 - delta - alpha)
    bounds the other direction's beta, and the certified upper end of this direction's beta falls below
    it somewhere (so the consistency test above rightly applies it to symmetric relations only)."""
    acc = PLDAccountant(relation, spacing=0.02).compose(Sampled(GaussianEvent(1.0), 0.1, "poisson"), 10)
    a = np.concatenate([np.geomspace(1e-6, 0.5, 25), np.linspace(0.55, 0.99, 10)])
    iv = acc.tradeoff(a)
    eps = np.linspace(-3, 12, 301)
    du = acc.delta(eps).upper
    second = np.max((1 - du[None, :] - a[:, None]) / np.exp(eps)[None, :], axis=1)
    assert np.any(iv.upper < second - 1e-3)
    # while under add_remove (both directions) it holds
    both = PLDAccountant("add_remove", spacing=0.02).compose(Sampled(GaussianEvent(1.0), 0.1, "poisson"), 10)
    du2 = both.delta(eps).upper
    second2 = np.max((1 - du2[None, :] - a[:, None]) / np.exp(eps)[None, :], axis=1)
    assert np.all(both.tradeoff(a).lower >= second2 - 1e-9)


def test_randomized_response_gdp_mu():
    """mu of randomized response by a dense independent search over its closed-form curve."""
    eps0 = 1.0
    a = np.geomspace(1e-12, 0.5, 200_001)
    dense = float(np.max(stats.norm.ppf(1 - rr_f(eps0, a)) - stats.norm.ppf(a)))
    m = PLDAccountant("add_remove", spacing=1e-3).compose(RandomizedResponseEvent(eps0)).gdp_mu()
    assert m.lower <= dense + 1e-9 and dense <= m.upper
    assert m.upper - m.lower < 0.01


@pytest.mark.parametrize("method,q", [("pld", 1.0), ("spa", 1.0), ("rdp", 1.0), ("prv", 1.0), ("clt", 1.0),
                                      ("pld", 0.05), ("spa", 0.05)])
def test_tables_per_steps_match_the_single_queries(method, q):
    """Accountant.tables_per_steps (what sweeps store for grid.fpr): its eps table is
    epsilon_per_steps' and its TPRs those of an accountant built for each steps value alone
    (PLD: at the shared spacing; SPA: its one-step tables scaled, identical to building),
    bracketing the closed form of the unsampled Gaussian."""
    from pldlib.methods import accountant_class

    cls = accountant_class(method)
    kw = {"on_edge": "flag"} if method == "spa" else {}
    if method == "prv":  # (sharpening depends on the time left: compare the answers it starts from)
        kw = {"sharpen": False}
    ev = GaussianEvent(2.0) if q == 1.0 else Sampled(GaussianEvent(2.0), q, "poisson")
    ks, deltas, fprs = [3, 40], [1e-5, 1e-8], [1e-3, 0.05]
    t = cls("add_remove", **kw).tables_per_steps(ev, ks, deltas, fprs)
    slow = method == "spa" and q < 1  # a sampled SPA build takes ~1.5 s: check the largest k only
    if not slow:
        lo, est, up, _ = cls("add_remove", **kw).epsilon_per_steps(ev, ks, deltas)
        for a, b in ((t.eps_lower, lo), (t.eps_estimate, est), (t.eps_upper, up)):
            np.testing.assert_array_equal(a, b)
    if method == "clt":
        assert "no certified trade-off curve" in t.tpr_unsupported and np.isnan(t.tpr_upper).all()
        return
    assert t.tpr_unsupported == "" and t.tpr_notes == [] and t.tpr_lower.shape == (2, 2)
    for i, k in enumerate(ks):
        if slow and k != ks[-1]:
            continue
        if q == 1.0:
            truth = 1 - gdp(math.sqrt(k) / 2.0, np.array(fprs))
            assert np.all(t.tpr_lower[i] <= truth) and np.all(truth <= t.tpr_upper[i])
        if method == "pld":
            one = PLDAccountant("add_remove", spacing=t_interval(ev, ks, k)).compose(ev, k).max_tpr(fprs)
        else:
            one = cls("add_remove", **kw).compose(ev, k).max_tpr(fprs)
        np.testing.assert_array_equal(t.tpr_lower[i], one.lower)
        np.testing.assert_array_equal(t.tpr_upper[i], one.upper)
    if method == "prv":  # sharpened (the default): still brackets the closed form, and no wider
        s = cls("add_remove").tables_per_steps(ev, ks, deltas, fprs)
        truth = 1 - gdp(np.sqrt(np.array(ks, dtype=float))[:, None] / 2.0, np.array(fprs)[None, :])
        assert np.all(s.tpr_lower <= truth) and np.all(truth <= s.tpr_upper)
        assert np.all(s.tpr_upper - s.tpr_lower <= t.tpr_upper - t.tpr_lower + 1e-12)


def t_interval(ev, ks, k):
    """The grid spacing that PLD's shared discretisation of ``ks`` gives steps value ``k``."""
    from pldlib.methods.pld import _account_steps

    return _account_steps("add_remove", ev, ks)[ks.index(k)].spacing
