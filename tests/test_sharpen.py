"""Sharpened answers (docs/MATH.md 5.9): an answer of the automatic grid wider than 1% is asked
again on finer grids and, at tiny scales, of the saddle-point bounds; the intersection of
certified intervals is kept.  Pinned against independent truths: exact binomial sums (mpmath,
60 digits) for compositions of the discrete Laplace pair, whose loss takes two values, and an
independent Renyi-divergence bound (mpmath binomial expansion) where an answer claims delta is
below the smallest double."""
import math

import mpmath as mp
import numpy as np
import pytest

import pldlib

from pldlib import events as E
from pldlib.methods.pld import SHARPEN_WIDTH, AccuracyLimitedWarning, PLDAccountant

mp.mp.dps = 60


def dlaplace_delta(scale, k, eps):
    """delta(eps) of k-fold discrete Laplace (sensitivity 1): the loss is +1/scale with
    probability 1/(1+r) and -1/scale otherwise (r = e^(-1/scale)); a binomial sum."""
    a = 1 / mp.mpf(scale)
    r = mp.e ** (-a)
    p = 1 / (1 + r)
    tot = mp.mpf(0)
    for j in range(k + 1):
        loss = (2 * j - k) * a
        if loss > eps:
            tot += mp.binomial(k, j) * p ** j * (1 - p) ** (k - j) * (1 - mp.e ** (mp.mpf(eps) - loss))
    return tot


def dlaplace_eps(scale, k, delta):
    """eps(delta) of the same composition, by bisection on the exact curve (60 digits)."""
    lo, hi = mp.mpf(0), k / mp.mpf(scale)
    for _ in range(200):
        mid = (lo + hi) / 2
        if dlaplace_delta(scale, k, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def _acc(relation, steps, sharpen=True):
    acc = PLDAccountant(relation)
    if not sharpen:
        acc._sharpening = True  # (the switch the shared-spacing tables use)
    for ev, k in steps:
        acc.compose(ev, k)
    return acc


def _width(iv, kind):
    scale = max(abs(iv.upper), 1e-3) if kind == "eps" else abs(iv.upper)
    return (iv.upper - iv.lower) / scale


@pytest.mark.parametrize("scale,k,delta", [(13.8, 43, 5.7562520093770086e-06), (3.0, 200, 1e-14)])
def test_eps_sharpened_contains_exact_truth(scale, k, delta):
    steps = [(E.DiscreteLaplaceEvent(scale), k)]
    truth = float(dlaplace_eps(scale, k, delta))
    plain = _acc("remove", steps, sharpen=False).epsilon(delta)
    sharp = _acc("remove", steps).epsilon(delta)
    assert sharp.lower <= truth * (1 + 1e-9) and truth <= sharp.upper * (1 + 1e-9)
    assert plain.lower <= sharp.lower and sharp.upper <= plain.upper  # an intersection
    if _width(plain, "eps") > SHARPEN_WIDTH:
        assert _width(sharp, "eps") < _width(plain, "eps")


def test_tiny_delta_carried_by_saddle_point_bounds():
    """1,135 discrete Laplace steps at eps = 178.5: the truth (about 3e-45) is far below the
    grid's floor (its truncated tails, about 1e-30); the sharpened interval contains it and its
    upper end is within a few times of it."""
    scale, k, eps = 3.44, 1135, 178.54346530511984
    truth = float(dlaplace_delta(scale, k, eps))
    assert 1e-50 < truth < 1e-40
    steps = [(E.DiscreteLaplaceEvent(scale), k)]
    plain = _acc("remove", steps, sharpen=False).delta(eps)
    sharp = _acc("remove", steps).delta(eps)
    assert plain.upper > 1e-35  # the floor
    assert sharp.lower <= truth <= sharp.upper
    assert sharp.upper < 10 * truth


def _rdp_log_delta_bound(sigma, q, k, eps, alphas=range(2, 4000, 7)):
    """ln of an upper bound on delta(eps) of k remove-direction Poisson subsampled Gaussian
    steps, independent of pldlib: Renyi divergence of integer order a by the binomial expansion
    E_Q[(1 - q + q e^g)^a] = sum_j C(a, j) (1-q)^(a-j) q^j e^(j(j-1)/(2 sigma^2)), composed k
    times, and delta <= exp((a-1)(R - eps)) / a * (1 - 1/a)^(a-1)."""
    best = mp.inf
    for a in alphas:
        s = mp.fsum(mp.binomial(a, j) * (1 - mp.mpf(q)) ** (a - j) * mp.mpf(q) ** j
                    * mp.e ** (mp.mpf(j * (j - 1)) / (2 * mp.mpf(sigma) ** 2)) for j in range(a + 1))
        R = k * mp.log(s) / (a - 1)
        b = (a - 1) * (R - eps) - mp.log(a) + (a - 1) * mp.log(1 - mp.mpf(1) / a)
        best = min(best, b)
    return best


@pytest.mark.parametrize("sigma,q,k,eps", [(20.4, 9.54e-06, 794, 18.803980255210337), (1.0, 1e-6, 2, 141.8)])
def test_smallest_double_claim_is_sound(sigma, q, k, eps):
    """A delta answer of [0, 5e-324] claims the truth is below the smallest positive double:
    an independent Renyi bound in mpmath confirms it.  (The second case, far beyond the grid, is
    answered by the Renyi-DP conversion in milliseconds, where the Chernoff bound's mixture
    cumulants took seconds; the Renyi-DP accountant itself reports 5e-324 there, never 0.)"""
    from pldlib.methods import make_accountant

    ev = E.Sampled(E.GaussianEvent(sigma), q, "poisson")
    iv = _acc("remove", [(ev, k)]).delta(eps)
    assert iv.lower == 0.0 and 0.0 < iv.upper <= 5e-324
    assert _rdp_log_delta_bound(sigma, q, k, eps, alphas=range(2, 200, 3)) < math.log(5e-324)
    assert make_accountant("rdp", "remove").compose(ev, k).delta(eps).upper == 5e-324


def test_explicit_spacing_and_tables_not_sharpened():
    """An explicit spacing is the user's accuracy: answered as given (no finer grid)."""
    steps = [(E.DiscreteLaplaceEvent(13.8), 43)]
    a = PLDAccountant("remove", spacing=0.002)
    a.compose(*steps[0])
    b = PLDAccountant("remove", spacing=0.002)
    b._sharpening = True
    b.compose(*steps[0])
    x, y = a.epsilon(np.array([1e-6, 1e-3])), b.epsilon(np.array([1e-6, 1e-3]))
    np.testing.assert_array_equal(x.lower, y.lower)
    np.testing.assert_array_equal(x.upper, y.upper)


@pytest.mark.parametrize("r", [0.5, 2.0, 10.0])
@pytest.mark.parametrize("eps", [0.5, 5.0, 50.0])
def test_chernoff_bound_above_exact_gaussian(r, eps):
    """The quick Chernoff bound of a Gaussian pair (K(t) = r^2 t (t + 1) / 2) against the exact
    curve Phi(r/2 - eps/r) - e^eps Phi(-r/2 - eps/r) at 60 digits: above it, and within a factor
    30 of it where the truth is representable."""
    from pldlib.methods.cgf import GaussianCGF, chernoff_log_delta

    R, E_ = mp.mpf(r), mp.mpf(eps)
    exact = mp.ncdf(R / 2 - E_ / R) - mp.e ** E_ * mp.ncdf(-R / 2 - E_ / R)
    lg = chernoff_log_delta([(GaussianCGF(r), 1)], [eps])[0]
    assert lg >= mp.log(exact)
    if exact > mp.mpf("1e-300"):
        assert lg <= mp.log(exact) + mp.log(30)


@pytest.mark.parametrize("sigma,q,eps", [(0.8, 0.01, 2.0), (2.0, 0.1, 3.0), (0.5, 0.001, 6.0)])
def test_chernoff_bound_above_exact_poisson_step(sigma, q, eps):
    """One Poisson subsampled Gaussian step (remove) through the CGF of its mixture pair: the
    Chernoff bound lies above the exact curve (robust_truths.poisson_gauss_delta1, mpmath) and
    within a factor 10^3 of it (Chernoff is loose for mixtures, never below)."""
    from pldlib.methods.cgf import chernoff_log_delta, mechanism_cgfs
    from pldlib.methods.base import Step
    from pldlib.testing.robust_truths import poisson_gauss_delta1

    step = Step(E.Sampled(E.GaussianEvent(sigma), q, "poisson"), "remove")
    (label, cgf, _), = mechanism_cgfs(step)
    exact = poisson_gauss_delta1(sigma, q, eps, "remove")[0]
    lg = chernoff_log_delta([(cgf, 1)], [eps])[0]
    assert lg >= mp.log(exact)
    assert lg <= mp.log(exact) + mp.log(1000)


# -- the PRV accountant with its automatic accuracy ------------------------------------------
from pldlib.methods.prv import PRVAccountant  # noqa: E402
from pldlib.testing.truth import delta_gaussian  # noqa: E402


def _prv(sharpen, **kw):
    return PRVAccountant("remove", sharpen=sharpen, **kw).compose(
        E.Sampled(E.GaussianEvent(2.0), 0.01, "poisson"), 1000)


def test_prv_wide_answers_are_asked_again_on_finer_meshes_and_stay_certified():
    # eps_error = 0.01 widens eps ~ 0.62 by 2.6%: asked again at eps_error / 4 and / 16 it is
    # under 1%, and both intervals bracket the 30-digit contour-integral truth
    plain, sharp = _prv(False).epsilon(1e-5), _prv(None).epsilon(1e-5)
    assert (plain.upper - plain.lower) / plain.upper > 0.02
    assert (sharp.upper - sharp.lower) / sharp.upper < 0.01
    assert plain.lower <= sharp.lower <= sharp.upper <= plain.upper
    assert float(delta_gaussian(sharp.lower, 2.0, 1000, 0.01, "remove")) >= 1e-5
    assert float(delta_gaussian(sharp.upper, 2.0, 1000, 0.01, "remove")) <= 1e-5
    truth = float(delta_gaussian(0.3, 2.0, 1000, 0.01, "remove"))
    d_plain, d_sharp = _prv(False).delta(0.3), _prv(None).delta(0.3)
    assert d_plain.lower <= d_sharp.lower <= truth <= d_sharp.upper <= d_plain.upper
    assert (d_sharp.upper - d_sharp.lower) < 0.1 * (d_plain.upper - d_plain.lower)
    assert plain.lower <= sharp.estimate <= plain.upper  # (the estimate is the same mesh's, clipped)


def test_prv_sharpening_follows_the_accuracy_asked():
    # an error given is the user's accuracy (no sharpening) unless sharpen=True; fresh() keeps it
    assert _prv(None).sharpen and not _prv(None, eps_error=0.01).sharpen
    assert not _prv(None, delta_error=1e-12).sharpen and _prv(True, eps_error=0.01).sharpen
    asked = _prv(None, eps_error=0.01).epsilon(1e-5)
    assert asked == _prv(False).epsilon(1e-5)
    assert _prv(None).fresh().sharpen and not _prv(None, eps_error=0.01).fresh().sharpen
    with pytest.raises(TypeError, match="sharpen"):
        PRVAccountant("remove", sharpen="yes")


def test_prv_tradeoff_is_sharpened_too(monkeypatch):
    # two steps (a single step reads its own curve, docs/MATH.md 0.8, and needs no sharpening); the
    # reference is the PLD accountant's certified interval, 1000 times narrower.  The time limit is
    # lifted: under load the 16x mesh (0.6 s alone) would not fit the default 10 s and the answer
    # would stay wider, by design (the deadline itself: the next test)
    import pldlib.methods.prv as prv_mod
    from pldlib.methods import few_summands as FS

    monkeypatch.setattr(prv_mod, "SHARPEN_SECONDS", 600.0)
    monkeypatch.setattr(FS, "FEW", 0)  # (the PRV mesh alone: no PLD companion, docs/MATH.md 0.9)
    ev = E.Sampled(E.GaussianEvent(1.5), 0.08, "poisson")

    def acc(sharpen):
        return PRVAccountant("remove", sharpen=sharpen).compose(ev, 2)

    plain, sharp = acc(False).max_tpr(1e-3), acc(None).max_tpr(1e-3)
    ref = pldlib.PLDAccountant("remove").compose(ev, 2).max_tpr(1e-3)
    assert plain.lower <= sharp.lower <= ref.upper and ref.lower <= sharp.upper <= plain.upper
    assert (plain.upper - plain.lower) / ref.lower > 0.01 > (sharp.upper - sharp.lower) / ref.lower


def test_sharpening_stops_at_its_deadline():
    # a finer mesh is asked only when twice its predicted time (f x the first answer's) fits before
    # the deadline; what is not asked leaves the answer as it was (wider, still certified)
    import time

    from pldlib.methods import sharpen as S

    asked = []

    def finer(f, xs):
        asked.append(f)
        return pldlib.Interval(np.full(xs.size, 1.0), np.full(xs.size, 1.001))

    lo, up = np.array([1.0]), np.array([1.1])
    kw = dict(relation="remove", components=(), events=(), analytic=False)
    now = time.perf_counter()
    l1, u1 = S.sharpen("delta", np.array([0.5]), lo, up, took=1.0, deadline=now + 2.0, finer=finer, **kw)
    assert asked == [] and (l1[0], u1[0]) == (1.0, 1.1)
    l2, u2 = S.sharpen("delta", np.array([0.5]), lo, up, took=1.0, deadline=now + 9.0 + S.MARGIN, finer=finer, **kw)
    assert asked == [4] and (l2[0], u2[0]) == (1.0, 1.001)


def test_prv_and_spa_read_a_single_step_off_its_own_curve():
    from pldlib.methods.spa import SPAAccountant
    from pldlib.testing.robust_truths import np_power  # (the exact Neyman-Pearson power of one step)

    ev = E.Sampled(E.GaussianEvent(1.5), 0.08, "poisson")
    t_lo, t_up = (float(v) for v in np_power(1.5, 0.08, 1e-3, "remove"))  # (an enclosure of the truth)
    for cls in (PRVAccountant, SPAAccountant):
        iv = cls("remove").compose(ev, 1).max_tpr(1e-3)
        assert iv.lower <= t_up and t_lo <= iv.upper
        assert (iv.upper - iv.lower) / t_lo < 0.01


def test_a_grid_limited_by_its_budgets_is_sharpened_by_the_central_limit_bounds():
    # 6e7 steps: the grid within the budgets is coarse (width ~50%); the saddle-point accountant's
    # Berry-Esseen bounds are tight in this regime.  Both ends checked against the 30-digit
    # contour-integral truth through delta at the ends.  (A 16 MB memory budget: the grid is limited
    # at once, and the bounds have most of the time budget whatever the machine's load; at the
    # default budgets a loaded machine may spend it all on the grid.)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = PLDAccountant("add", memory_budget=16 * 2**20).compose(
            E.Sampled(E.GaussianEvent(2.48), 7.67e-05, "poisson"), 60_283_319)
        iv = a.epsilon(2.45e-05)
    assert a.accuracy_limited
    assert (iv.upper - iv.lower) / iv.upper < 0.01
    assert float(delta_gaussian(iv.lower, 2.48, 60_283_319, 7.67e-05, "add")) >= 2.45e-05
    assert float(delta_gaussian(iv.upper, 2.48, 60_283_319, 7.67e-05, "add")) <= 2.45e-05


def test_an_eps_answer_with_an_infinite_end_counts_as_wide():
    """An eps answer with no finite upper (or lower) end is sharpened too; a certain eps = +inf (both
    ends +inf) and a NaN (no answer) are not; delta answers are unchanged."""
    from pldlib.methods.sharpen import wide

    inf, nan = float("inf"), float("nan")
    lo = np.array([-1e-11, -inf, inf, 0.5, nan, 1.0])
    up = np.array([inf, 2.0, inf, 0.5001, inf, 1.5])
    assert wide("eps", lo, up).tolist() == [True, True, False, False, False, True]
    assert wide("delta", np.array([0.0, 0.3]), np.array([1.0, 0.3001])).tolist() == [True, False]


def test_compositions_with_eps0_delta0_steps_are_sharpened_on_finer_grids():
    """(eps0, delta0) steps put a +inf mass D outside the grid; the answers wrapping it are now
    sharpened too, by finer grids only (whose answers carry D as well; the analytic bounds describe
    the rest of the composition alone and are not asked).  Remove, 100 steps of sigma 2, q 0.2 with
    three (0, 1e-9) steps: delta(2), delta(4) were 1.6% and 3.7% wide.  Truth: D + (1 - D) delta(eps),
    D = 1 - (1 - 1e-9)^3, delta(eps) by the mpmath reference."""
    acc = (pldlib.PLDAccountant("remove").compose(E.Sampled(E.GaussianEvent(2.0), 0.2, "poisson"), 100)
           .compose(E.ApproxDPEvent(0.0, 1e-9), 3))
    eps = np.array([2.0, 4.0])
    iv = acc.delta(eps)
    D = 1 - (1 - 1e-9) ** 3
    for j, e in enumerate(eps):
        t = float(delta_gaussian(e, 2.0, 100, q=0.2, direction="remove", dps=20))
        t = D + (1 - D) * t
        assert iv.lower[j] <= t * (1 + 1e-9) and iv.upper[j] >= t * (1 - 1e-9), (e, t, iv)
        assert iv.upper[j] - iv.lower[j] <= 0.01 * iv.upper[j], iv


@pytest.mark.parametrize("sigma,q,k,eps,relation", [(0.5, 0.2, 10_000, 5.0, "add"), (0.6, 0.3, 2_000, 20.0, "remove")])
def test_delta_near_one_of_a_coarse_grid_gets_the_chernoff_lower_bound(sigma, q, k, eps, relation):
    """A grid coarsened by a small memory budget answered delta near 1 as [0, 1] (add) or [0.94, 1]
    (remove); the Chernoff lower bound of MATH 6.5 (K at negative tilts) certifies 1 - 8u.  The
    mpmath reference puts 1 - delta below 1e-29 in each case."""
    acc = PLDAccountant(relation, memory_budget=2**14).compose(E.Sampled(E.GaussianEvent(sigma), q, "poisson"), k)
    with pytest.warns(AccuracyLimitedWarning):
        iv = acc.delta(eps)
    truth = delta_gaussian(eps, sigma, k, q=q, direction=relation, dps=40)
    assert 1 - truth < 1e-29
    assert iv.lower <= truth <= iv.upper
    assert iv.upper - iv.lower <= 1e-14


def test_analytic_bounds_are_wrapped_with_the_infinite_mass_of_eps0_delta0_steps():
    """With (eps0, delta0) steps the answers are D + (1 - D) delta_rest (D their +inf mass, outside
    the components): the Chernoff bounds of the rest are wrapped so, the saddle-point and Renyi-DP
    bounds (of events that include such steps) are not asked.  Driven on a plain Gaussian rest
    (closed form) with answers made wide on purpose."""
    from pldlib.methods import sharpen as S
    from pldlib.methods.cgf import GaussianCGF, chernoff_lower_delta

    def truth(mu, eps, D):
        with mp.workdps(40):
            mu, eps = mp.mpf(mu), mp.mpf(eps)
            d = mp.ncdf(-eps / mu + mu / 2) - mp.exp(eps) * mp.ncdf(-eps / mu - mu / 2)
            return D + (1 - D) * d

    comp = [(pldlib.Gaussian(0.1), 1)]  # mu = 10
    D = 0.5
    lo, up = S.sharpen("delta", np.array([5.0]), [0.0], [1.0], took=0.0, deadline=None, finer=None,
                       relation="add_remove", components=comp, events=[(pldlib.Gaussian(0.1).event, 1)],
                       pinf=(D, D))
    t = truth(10.0, 5.0, D)
    bare = chernoff_lower_delta([(GaussianCGF(10.0), 1)], [5.0])[0]
    assert lo[0] <= t and lo[0] >= (D + (1 - D) * bare) * (1 - 1e-15) > bare and up[0] == 1.0
    # a tiny answer: the Chernoff upper bound of the rest (about 1e-339: 5e-324 in doubles), raised by D
    D = 1e-300
    lo, up = S.sharpen("delta", np.array([40.0]), [0.0], [1e-12], took=0.0, deadline=None, finer=None,
                       relation="add_remove", components=[(pldlib.Gaussian(1.0), 1)],
                       events=[(pldlib.Gaussian(1.0).event, 1)], pinf=(D, D))
    t = truth(1.0, 40.0, D)
    assert t <= up[0] < 1e-299 and lo[0] == 0.0


def test_the_exact_part_of_a_composition_bounds_its_lower_ends():
    """A part of a composition is a post-processing of it, so the part's curve lies below the
    whole's: the closed form of the unsampled Gaussian steps (here mu = 2 / 0.0935 = 21.4, which
    dominates eps at delta 1e-25) raises the lower end of a coarse grid's answer to it (the grid
    alone: 449.81).  Checked against the part's closed form in mpmath."""
    mu = mp.mpf(2) / mp.mpf(0.0935)

    def part_delta(e):
        with mp.workdps(50):
            e = mp.mpf(e)
            return mp.ncdf(-e / mu + mu / 2) - mp.exp(e) * mp.ncdf(-e / mu - mu / 2)

    with mp.workdps(50):
        part_eps = float(mp.findroot(lambda e: mp.log(part_delta(e)) - mp.log(mp.mpf("1e-25")), 450))
    acc = (PLDAccountant("add", memory_budget=2**16)
           .compose(E.Sampled(E.GaussianEvent(54.3), 6.3e-4, "poisson"), 10**6).compose(E.GaussianEvent(0.0935), 4))
    with pytest.warns(AccuracyLimitedWarning):
        iv = acc.epsilon(1e-25)
    assert part_eps * (1 - 1e-9) <= iv.lower <= part_eps and iv.upper >= part_eps
    d = acc.delta(440.0)
    t = float(part_delta(440.0))
    assert t * (1 - 1e-9) <= d.lower <= t * (1 + 1e-9) and d.upper >= t  # (the grid alone: 4.6e-24, t = 1.8e-23)


def test_long_compositions_ask_the_central_limit_bounds_for_every_wide_answer():
    """From LONG steps on, a wide answer that is neither tiny nor of a budget-limited grid is also
    intersected with the saddle-point accountant's certified bounds (the central-limit regime, where
    the finer grids rarely fit the time left).  10^6 Poisson steps of sigma 5, q 0.01 at eps 0.5: a
    certified [truth/2, 1.5 truth] (the stand-in for a coarse grid's answer) comes out under 1% wide,
    both ends checked against the 30-digit contour-integral truth; one step fewer than LONG, it is
    left as it was (not asked)."""
    from pldlib.methods import sharpen as S

    sigma, q, eps = 5.0, 0.01, 0.5
    ev = E.Sampled(E.GaussianEvent(sigma), q, "poisson")
    for k, asked in ((1_000_000, True), (S.LONG - 1, False)):
        truth = float(delta_gaussian(eps, sigma, k, q, "remove"))
        acc = PLDAccountant("remove").compose(ev, k)
        lo, up = S.sharpen("delta", np.array([eps]), [0.5 * truth], [1.5 * truth], took=0.1, deadline=None,
                           finer=None, relation="remove", components=acc._eff, events=[(ev, k)])
        if asked:
            assert (up[0] - lo[0]) / up[0] < 0.01, (lo, up, truth)
            assert lo[0] <= truth <= up[0]
        else:
            assert lo[0] == 0.5 * truth and up[0] == 1.5 * truth


def test_sharpen_option_turns_sharpening_on_for_an_explicit_spacing_and_off_everywhere():
    """``sharpen=True``: an explicit spacing's wide answer is asked again on finer grids (43 discrete
    Laplace steps of scale 13.8, eps(5.76e-6) at h = 0.01: 3.8% wide as asked, under 1% sharpened).
    ``sharpen=False``: an automatic grid's wide answer is left as the grid gives it (a delta of
    about 3e-45 at the grid's floor, 1e-35, where the default carries it by the saddle-point
    bounds).  All contain the exact binomial truth.  Anything but True, False, None: TypeError."""
    scale, k, delta = 13.8, 43, 5.7562520093770086e-06
    exact = float(dlaplace_eps(scale, k, delta))
    ev = E.DiscreteLaplaceEvent(scale)
    asked = PLDAccountant("add_remove", spacing=0.01).compose(ev, k).epsilon(delta)
    sharp = PLDAccountant("add_remove", spacing=0.01, sharpen=True).compose(ev, k)
    assert sharp.fresh().sharpen is True
    iv = sharp.epsilon(delta)
    assert _width(asked, "eps") > 0.01 and _width(iv, "eps") < 0.01, (asked, iv)
    for a in (asked, iv):
        assert a.lower <= exact * (1 + 1e-9) and exact <= a.upper * (1 + 1e-9), (a, exact)
    # (the saddle-point case of test_tiny_delta_carried_by_saddle_point_bounds: the floor stays)
    e3 = E.DiscreteLaplaceEvent(3.44)
    truth = float(dlaplace_delta(3.44, 1135, 178.54346530511984))
    on = PLDAccountant("remove").compose(e3, 1135).delta(178.54346530511984)
    off = PLDAccountant("remove", sharpen=False).compose(e3, 1135).delta(178.54346530511984)
    assert off.upper > 1e-35 > 10 * truth > on.upper and off.lower <= truth <= off.upper, (on, off, truth)
    for bad in ("yes", 1, 0.5):
        with pytest.raises(TypeError, match="sharpen"):
            PLDAccountant("add", sharpen=bad)
    assert pldlib.account(pldlib.Gaussian(1.0), steps=10, sharpen=False).sharpen is False
