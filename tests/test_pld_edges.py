"""Issue 39, PLD accountant core: very private long compositions, explicit grids that do not fit,
and lower bounds at a support edge (docs/MATH.md 3.2, 3.6, 4.5, 5.1).

Truths used here, all independent of the code under test:

* the reversed-pair identity (MATH 0.5): for eps < 0, delta(eps) = 1 - e^eps + e^eps delta_rev(-eps),
  so 1 - e^eps <= delta(eps) <= 1 - e^eps + e^eps B and ln(1 - delta) <= eps(delta) <= ln(1 - delta)
  - ln(1 - B), with B >= delta_rev(-eps) from the closed-form RDP of the sampled Gaussian at an integer
  order (Mironov et al.: A_a = sum_k C(a, k) (1 - q)^(a - k) q^k e^{k (k - 1) / (2 s^2)} bounds both
  directions; delta(x) <= exp((a - 1)(K ln A_a / (a - 1) - x))), evaluated in mpmath here;
* the closed-form single-step curve of the Poisson-subsampled Gaussian, in mpmath;
* the mpmath contour integral of :mod:`pldlib.testing.truth` (values quoted, ~40 s each to recompute);
* exact inclusion-exclusion bounds for a nearly perfectly distinguishing step (tiny sigma);
* a memory-capped child process (RLIMIT_AS) for the explicit grid that does not fit.
"""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib import events as E
from pldlib.pld.grid import GridMeasure

G = pldlib.Gaussian


def rdp_delta_bound(sigma, q, steps, x, orders=(8, 16, 32, 64, 128, 256)):
    """Upper bound on delta(x) of `steps` Poisson-subsampled Gaussian steps (either direction) from
    the integer-order RDP of the sampled Gaussian (closed form, mpmath, 50 digits)."""
    with mp.workdps(50):
        s2, q, x = mp.mpf(sigma) ** 2, mp.mpf(q), mp.mpf(x)
        best = mp.mpf(1)
        for a in orders:
            A = mp.fsum(mp.binomial(a, k) * (1 - q) ** (a - k) * q ** k * mp.exp(k * (k - 1) / (2 * s2))
                        for k in range(a + 1))
            best = min(best, mp.exp((a - 1) * (steps * mp.log(A) / (a - 1) - x)))
        return best


# -- item 2: very private long compositions, negative eps and the identity ----------------------
CASES = [  # (mechanism, steps, sigma of the Poisson pair whose RDP bounds it (WOR: sigma / 2), q)
    (G(sigma=5.0, q=1e-5, sampling="poisson"), 10**9, 5.0, 1e-5),
    (G(sigma=5.0, q=1e-7, sampling="poisson"), 10**7, 5.0, 1e-7),
    (G(sigma=5.0, q=1e-7, sampling="poisson", relation="add"), 10**7, 5.0, 1e-7),
    (G(sigma=5.0, q=1e-7, sampling="poisson", relation="remove"), 10**7, 5.0, 1e-7),
    (G(sigma=163.0, q=7e-6, sampling="wor"), 125_000, 81.5, 7e-6),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_negative_eps_both_ends_contain_the_reversed_pair_truth(case):
    """eps(0.5), eps(0.9), delta(-0.5), delta(-0.9): the truth lies within B of 1 - e^eps (resp.
    ln(1 - delta)), B < 1e-12 from the RDP bound; both ends of every interval must contain it.
    (Before: [-0.6024, -0.6024] for eps(0.5), truth -0.693147; delta(-0.5) = [0.393484, 0.393484],
    truth 0.3934693.)"""
    mech, k, s_rdp, q = CASES[case]
    acc = pldlib.account(mech, steps=k)
    ivs = acc.epsilon(np.array([0.5, 0.9]))  # (one query each: the sharpening is shared)
    for j, d in enumerate((0.5, 0.9)):
        B = rdp_delta_bound(s_rdp, q, k, -math.log1p(-d) - 1e-3)
        assert B < 1e-12  # (the truth is within B of the floor; RDP is loose: ~1e-16 is the truth here)
        iv = pldlib.Interval(float(ivs.lower[j]), float(ivs.upper[j]))
        with mp.workdps(40):
            lo_truth = mp.log(1 - mp.mpf(d))            # eps(d) >= ln(1 - d) for every pair
            hi_truth = lo_truth - mp.log(1 - B)         # ... and <= this, by the identity
            assert mp.mpf(iv.lower) <= lo_truth, (d, iv)
            assert mp.mpf(iv.upper) >= hi_truth, (d, iv)
    ivs = acc.delta(np.array([-0.5, -0.9]))
    for j, e in enumerate((-0.5, -0.9)):
        iv = pldlib.Interval(float(ivs.lower[j]), float(ivs.upper[j]))
        floor, top = _negative_eps_window(e, s_rdp, q, k)
        # (read off the reversed curve, MATH 0.5, the answer is now inside that window: its upper
        # end is 1 - e^eps + e^eps times the certified delta at -eps, a bound tested at eps > 0)
        assert mp.mpf(iv.lower) <= top and mp.mpf(iv.upper) >= floor, (e, iv)
        assert mp.mpf(iv.lower) >= floor * (1 - mp.mpf(1e-12))  # the floor itself is certified


def _negative_eps_window(e, s_rdp, q, k):
    """[1 - e^eps, 1 - e^eps + e^eps B] (40 digits), which holds delta(eps) at eps < 0 by the
    identity of MATH 0.5, with B < 1e-12 the RDP bound on the reversed delta at -eps."""
    B = rdp_delta_bound(s_rdp, q, k, -e)
    assert B < 1e-12
    with mp.workdps(40):
        floor = 1 - mp.exp(mp.mpf(e))
        return floor, floor + mp.exp(mp.mpf(e)) * B


@pytest.mark.parametrize("method", ["prv", "spa"])
@pytest.mark.parametrize("case", [1, 3, 4])  # (add_remove, remove, WOR; add mirrors remove)
def test_prv_and_spa_read_negative_eps_off_the_reversed_curve(method, case):
    """delta(eps < 0) = 1 - e^eps + e^eps delta_reversed(-eps) (MATH 0.5): the PRV accountant (every
    relation) and the saddle-point accountant (add_remove, substitution: their own reverse) read it
    so.  Both ends contain the truth (in [1 - e^eps, 1 - e^eps + e^eps B], B < 1e-12 from the RDP
    bound), and the interval is as tight as the reversed answer's: PRV under 1e-9 (its mesh alone
    gave up to 45%), SPA under 1e-5 (Berry-Esseen's absolute accuracy at -eps)."""
    from pldlib.methods import make_accountant

    mech, k, s_rdp, q = CASES[case]
    rel = mech.relation
    kw = {"on_edge": "flag"} if method == "spa" else {}  # (the estimate may be flagged: the ends are tested)
    acc = make_accountant(method, rel, **kw).compose(mech.event, k)
    for e in (-0.5, -0.9):
        iv = acc.delta(e)
        floor, top = _negative_eps_window(e, s_rdp, q, k)
        assert mp.mpf(iv.lower) <= top and mp.mpf(iv.upper) >= floor, (e, iv)
        tight = 1e-9 if method == "prv" else (1e-5 if rel in ("add_remove", "substitution") else None)
        if tight is not None:
            assert iv.upper - iv.lower <= tight * iv.upper, (e, iv)


@pytest.mark.parametrize("rel,sigma,q,k,delta,scheme", [
    ("add_remove", 21.39341714398705, 2.7361151777521564e-07, 283_011_643, 0.09214050164441091, "poisson"),
    ("remove", 2.0049799375737036, 4.254283403134871e-06, 7_181_620, 0.11079977835243368, "wor"),
    ("add_remove", 1.2173199947998572, 4.066149863068931e-07, 560_701_941, 0.670438061073339, "poisson")])
def test_prv_epsilon_below_zero_is_bracketed_on_the_reversed_curve(rel, sigma, q, k, delta, scheme):
    """An eps answer below 0 is bracketed on certified delta bounds read off the reversed curve
    (MATH 0.5; its mesh alone gave 8.5% and 5% wide, and no lower end in the third case).  Both ends checked through the 30-digit
    truth of delta at them (robust_truths.negative_eps_delta): delta(upper) <= target <= delta(lower)."""
    from pldlib.methods import make_accountant
    from pldlib.testing import robust_truths as T

    acc = make_accountant("prv", rel).compose(E.Sampled(E.GaussianEvent(sigma), q, scheme), k)
    iv = acc.epsilon(delta)
    assert iv.upper < 0 and iv.upper - iv.lower <= 0.01 * abs(iv.upper), iv
    at_up = T.negative_eps_delta(sigma, q, k, iv.upper, rel, scheme)
    at_lo = T.negative_eps_delta(sigma, q, k, iv.lower, rel, scheme)
    assert at_up[0] <= delta * (1 + 1e-12) and at_lo[1] >= delta * (1 - 1e-12), (iv, at_lo, at_up)


@pytest.mark.parametrize("rel,sigma,q,k,scheme,query,x", [
    ("remove", 28.698844313988463, 5.402518110221576e-06, 516_856_452, "wor", "delta", -0.3639362427318594),
    ("add", 123.43950386635687, 1.7428534489139074e-05, 407_474_573, "wor", "delta", -0.05448157448207558),
    ("add_remove", 65.03438994111495, 1.5575164799569654e-05, 548_530_332, "poisson", "delta", -1.846715707950817),
    ("add_remove", 20.580702330573068, 1.3129037105648245e-06, 451_859_970, "wor", "epsilon", 0.6038199139964621)])
def test_pld_reads_negative_eps_off_the_reversed_curve(rel, sigma, q, k, scheme, query, x):
    """The PLD accountant reads delta at eps < 0 off the reversed relation's curve at -eps (MATH 0.5;
    add_remove its own, remove and add the other's accountant) and brackets an eps answer below 0
    on it.  Before, its own budget-limited grids gave these 5.5%, 7.5%, 10.6% and 5.3% wide.  Both
    ends contain the 30-digit truth (robust_truths.negative_eps_delta: for eps, through delta at
    each end), and the answers are within 1e-6 (delta) and 1e-5 (eps: the bracket's resolution)."""
    from pldlib.testing import robust_truths as T

    acc = pldlib.PLDAccountant(rel).compose(E.Sampled(E.GaussianEvent(sigma), q, scheme), k)
    if query == "delta":
        iv = acc.delta(x)
        t_lo, t_hi = T.negative_eps_delta(sigma, q, k, x, rel, scheme)
        assert mp.mpf(iv.lower) <= t_hi and mp.mpf(iv.upper) >= t_lo, (iv, t_lo, t_hi)
        assert iv.upper - iv.lower <= 1e-6 * iv.upper, iv
    else:
        iv = acc.epsilon(x)
        assert iv.upper < 0 and iv.upper - iv.lower <= 1e-5 * abs(iv.upper), iv
        at_up = T.negative_eps_delta(sigma, q, k, iv.upper, rel, scheme)
        at_lo = T.negative_eps_delta(sigma, q, k, iv.lower, rel, scheme)
        assert at_up[0] <= x * (1 + 1e-12) and at_lo[1] >= x * (1 - 1e-12), (iv, at_lo, at_up)


def test_from_reverse_against_the_gaussian_closed_form():
    # the Gaussian pair's curve at eps < 0 (the closed form holds there too) from the certified
    # reversed ends at -eps (the pair is its own reverse)
    from pldlib.exact import GaussianExact
    from pldlib.methods.single_step import from_reverse

    for mu in (0.01, 0.5, 3.0):
        g = GaussianExact(mu)
        for e in (-1e-6, -0.2, -2.0, -30.0):
            r_lo, r_up = g.delta_bounds(np.array([-e]))
            lo, up = from_reverse(np.array([e]), r_lo, r_up)
            with mp.workdps(40):
                m, ee = mp.mpf(mu), mp.mpf(e)
                truth = mp.ncdf(m / 2 - ee / m) - mp.exp(ee) * mp.ncdf(-m / 2 - ee / m)
            assert mp.mpf(lo[0]) <= truth <= mp.mpf(up[0]), (mu, e, lo, up, truth)
            assert up[0] - lo[0] <= 1e-12 * float(truth), (mu, e, lo, up)


def test_substitution_family_contains_the_floor():
    """Substitution (and WOR substitution): the lower ends stay at or under 1 - e^eps and
    ln(1 - delta), the upper ends at or above them (every pair's floor, MATH 0.3)."""
    for mech, k in ((G(sigma=5.0, q=1e-7, sampling="poisson", relation="substitution"), 10**7),
                    (G(sigma=163.0, q=7e-6, sampling="wor", relation="substitution"), 125_000)):
        acc = pldlib.account(mech, steps=k)
        iv = acc.delta(-0.5)
        with mp.workdps(40):
            floor = 1 - mp.exp(mp.mpf(-0.5))
            assert mp.mpf(iv.lower) <= floor <= mp.mpf(iv.upper)
            ie = acc.epsilon(0.5)
            assert mp.mpf(ie.lower) <= mp.log(mp.mpf(0.5)) <= mp.mpf(ie.upper)


def test_explicit_fine_intervals_agree_on_a_very_private_wor_composition():
    """WOR sigma 163, q 7e-6, 125,000 steps at h = 2e-8 and 5e-9: the two certified intervals of
    each answer must intersect (before: disjoint, eps(1e-5) included; zero-width intervals above
    the truth at eps(0.5)), and eps(0.5), delta(-0.5) contain the reversed-pair truth."""
    m = G(sigma=163.0, q=7e-6, sampling="wor")
    B = rdp_delta_bound(81.5, 7e-6, 125_000, 0.5)
    assert B < 1e-16
    ivs = []
    for h in (2e-8, 5e-9):
        acc = pldlib.account(m, steps=125_000, spacing=h)
        ivs.append((acc.epsilon([0.5, 1e-5]), acc.delta([-0.5, 0.0])))
        e, d = ivs[-1]
        with mp.workdps(40):
            assert mp.mpf(e.lower[0]) <= mp.log(mp.mpf(0.5))
            floor = 1 - mp.exp(mp.mpf(-0.5))
            assert mp.mpf(d.lower[0]) <= floor and mp.mpf(d.upper[0]) >= floor + mp.exp(mp.mpf(-0.5)) * B
    for j in range(2):
        for a, b in ((ivs[0][j], ivs[1][j]),):
            assert np.all(np.maximum(a.lower, b.lower) <= np.minimum(a.upper, b.upper)), (a, b)


def test_lower_curve_without_mass_answers_minus_inf():
    """A measure with no mass and constant 0 has the curve 0 everywhere: eps(delta) = -inf for
    delta >= 0, never its first grid point (the lower curve of a composition whose round-off
    took every mass: before, its first grid point -0.48 was reported as a lower bound on
    eps(0.5) = -0.693)."""
    for n in (100, 5000):  # (the table and the few-answers paths)
        m = GridMeasure(1e-3, -480, np.zeros(n), 0.0)
        assert np.all(m.epsilon(np.array([0.5, 0.9])) == -np.inf)
        assert np.all(m.epsilon(np.array([0.5, 0.9, 0.1, 0.2, 0.3])) == -np.inf)
    # one mass: the exact segment formula (curve m (1 - e^{eps - eps_i}) = delta)
    m = GridMeasure(1e-3, -480, np.r_[np.zeros(4999), 0.25], 0.0)
    x = 4519 * 1e-3
    for d in (0.1, 0.2):
        assert m.epsilon(np.array([d]))[0] == pytest.approx(x + math.log1p(-d / 0.25), abs=1e-12)


def test_ordered_refuses_a_lower_end_above_the_upper():
    from pldlib.methods.pld import _ordered

    with pytest.raises(pldlib.PrecisionLimitError, match="exceeds the certified upper bound"):
        _ordered(np.array([0.2, 0.5]), np.array([0.3, 0.4]), "delta", np.array([1.0, 2.0]))
    lo, up = _ordered(np.array([0.2]), np.array([0.2]), "delta", np.array([1.0]))
    assert lo[0] == up[0] == 0.2


# -- the optimistic hull at a tiny spacing (the cause of item 2) ---------------------------------
def _remove_delta_mp(sigma, q, eps):
    """Closed-form single-step delta of the Poisson-subsampled Gaussian, remove (MATH 2.4)."""
    s, q, eps = mp.mpf(sigma), mp.mpf(q), mp.mpf(eps)
    if eps <= mp.log(1 - q):
        return 1 - mp.exp(eps)
    t = mp.log((mp.exp(eps) - (1 - q)) / q)
    x = s ** 2 * t + mp.mpf(1) / 2
    sf = lambda z: mp.ncdf(-z)  # noqa: E731
    return (1 - q) * sf(x / s) + q * sf((x - 1) / s) - mp.exp(eps) * sf(x / s)


@pytest.mark.parametrize("relation", ["add", "remove"])
def test_tiny_spacing_hull_is_under_the_closed_form_curve(relation):
    """sigma 5, q 1e-7 at h = 7.5e-7 (the automatic grid of 10^7 steps): the certified optimistic
    pair (masses minus their round-off bounds) stays under the closed-form curve at eps < 0, where
    1 - e^eps is all of it but ~1e-16 (before: total P-mass 1 + 2e-10 with a bound of 9e-13, so
    10^7 steps put the lower curve 1e-3 above the truth)."""
    acc = pldlib.account(G(sigma=5.0, q=1e-7, sampling="poisson", relation=relation), steps=10**7)
    assert acc.spacing < 1e-6  # (the automatic grid: 2-3 cells per step)
    (st,) = acc._branches
    lo = st.source.fine()[1][0]
    ml = np.maximum(lo.masses - lo.mass_err, 0.0)
    with mp.workdps(40):
        eg = [mp.mpf(float(v)) for v in lo.eps_grid]
        P = mp.fsum(mp.mpf(float(v)) for v in ml) + lo.p_inf
        Q = mp.fsum(mp.mpf(float(v)) * mp.exp(-e) for v, e in zip(ml, eg))
        assert P <= 1 and Q <= 1, (P - 1, Q - 1)
        for eps in (-0.5, -1e-3, -2e-6, -1e-7, 0.0, 5e-7, 2e-6):
            e = mp.mpf(eps)
            curve = lo.p_inf + mp.fsum(mp.mpf(float(v)) * (1 - mp.exp(e - x)) for v, x in zip(ml, eg) if x > e)
            if relation == "remove":
                truth = _remove_delta_mp(5.0, 1e-7, e)
            else:
                truth = max(1 - mp.exp(e) + mp.exp(e) * _remove_delta_mp(5.0, 1e-7, -e), 0)
            assert curve <= truth, (relation, eps, float(curve - truth))


# -- item 7: an explicit grid that does not fit ---------------------------------------------------
def test_explicit_interval_beyond_the_memory_budget_is_refused_under_a_memory_cap():
    """WOR sigma 0.118, q 2e-4, 15 steps at h = 1e-4 under a 3 GB address-space cap: before, it
    peaked at 2.98 GB and raised numpy's MemoryError; now the grid is estimated against the
    memory budget before it is built (GridTooLargeError naming the budget)."""
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
        import pldlib
        try:
            pldlib.account(pldlib.Gaussian(sigma=0.1178546231923773, q=0.00020371970639318756,
                                           sampling='wor'), steps=15, spacing=1e-4).delta(0.0)
            print('ANSWERED')
        except pldlib.GridTooLargeError as e:
            print('REFUSED', 'memory_budget' in str(e))
        # VmHWM: this image's own peak (ru_maxrss keeps the forking parent's size across exec)
        print('PEAK', [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "REFUSED True" in out.stdout, (out.stdout, out.stderr[-2000:])
    peak_kb = int(out.stdout.split("PEAK")[1].split()[0])
    assert peak_kb < 1_000_000  # refused before anything of the grid's size was allocated


@pytest.mark.parametrize("budget", [2**20, 3 * 10**7])
def test_explicit_interval_beyond_the_memory_budget_is_refused(budget):
    """An explicit interval whose step grid (2**20 bytes) or composition (3e7 bytes: the grids of
    78,676 points fit, the composition of 10,000 steps does not) exceeds the memory budget is
    refused with GridTooLargeError naming it."""
    m = G(sigma=1.0, q=0.01, sampling="poisson")
    with pytest.raises(pldlib.GridTooLargeError, match="memory_budget"):
        pldlib.account(m, steps=10_000, spacing=1e-4, memory_budget=budget).epsilon(1e-5)


# -- item 10: lower bounds at a support edge ------------------------------------------------------
@pytest.mark.parametrize("relation", ["add_remove", "remove", "add", "substitution"])
def test_edge_kink_keeps_the_lower_bound(relation):
    """WOR sigma 0.118 (0.059 per record pair), q 2e-4, 15 steps: almost all mass of each step's
    loss sits at the support edge ln(1 - q) and the truth of delta(0) is within 1e-15 of
    1 - (1 - q)^15 (at most the chance that the record is used; at least that chance times
    Phi(0.5 / 0.059) minus 1 - Phi(0.5 / 0.059)^15, thresholding each output at 1/2).  Before, the
    lower end was half of it: the lattice point next to the edge took the floor line's value."""
    q, k, s = 2e-4, 15, 0.1178546231923773 / 2
    with mp.workdps(40):
        used = 1 - (1 - mp.mpf(q)) ** k
        phi = mp.ncdf(mp.mpf(0.5) / s)
        t_lo, t_hi = used * phi - (1 - phi ** k), used
    iv = pldlib.account(G(sigma=2 * s, q=q, sampling="wor", relation=relation), steps=k).delta(0.0)
    assert mp.mpf(iv.lower) <= t_lo and mp.mpf(iv.upper) >= t_hi
    assert iv.lower >= 0.995 * float(t_lo), iv


def test_coarse_and_finer_explicit_intervals_both_keep_the_edge():
    """WOR sigma 0.3, q 0.01, 10 steps: max TPR at FPR 1e-3 at explicit h = 0.03, 0.015, 0.006 (the
    edge |ln(1 - q)| = 0.01 within 2 cells of 0: offset lattice; before: lower ends 0.050, 0.050,
    0.060 against ~0.0964): each lower end within 1% of its upper; with h = 0.003 (the lattice
    through 0) every pair of intervals intersects."""
    m = G(sigma=0.3, q=0.01, sampling="wor")
    ivs = [pldlib.account(m, steps=10, spacing=h).max_tpr(1e-3) for h in (0.03, 0.015, 0.006, 0.003)]
    for iv in ivs[:3]:
        assert iv.lower >= 0.99 * iv.upper, iv
    assert max(iv.lower for iv in ivs) <= min(iv.upper for iv in ivs)


# values of pldlib.testing.truth.delta_gaussian(0.5, 0.8, 20, q=0.05, direction=..., dps=20)
# (mpmath contour integral, independent of the accountants; ~25-40 s each)
TRUTH_08_005_20 = {"remove": 0.03745974804965837, "add": 0.0029042068178976436}


@pytest.mark.parametrize("relation", ["remove", "add"])
@pytest.mark.parametrize("h", [0.02, 0.012])
def test_offset_lattice_near_an_edge_contains_the_mpmath_truth(relation, h):
    """Poisson sigma 0.8, q 0.05, 20 steps at h = 0.02 and 0.012 (the edge |ln(1 - q)| = 0.051 is 2.6
    and 4.3 cells away): delta(0.5) contains the contour-integral truth."""
    iv = pldlib.account(G(sigma=0.8, q=0.05, sampling="poisson", relation=relation), steps=20,
                        spacing=h).delta(0.5)
    t = TRUTH_08_005_20[relation]
    assert iv.lower <= t * (1 - 1e-9) and iv.upper >= t * (1 + 1e-9), (iv, t)


def test_losses_beyond_exp_range_refuse_instead_of_nan():
    """A composition whose coarsened grid reaches losses beyond e^eps's range (RR x 3e8 with a
    Gaussian and (eps0, delta0) steps) answers an interval or refuses with PrecisionLimitError:
    never NaN, never a bare OverflowError."""
    import math
    import warnings

    from pldlib import PrecisionLimitError
    from pldlib.methods.pld import PLDAccountant

    acc = PLDAccountant("add")
    acc.compose(E.RandomizedResponseEvent(2.89), 293_100_746)
    acc.compose(E.GaussianEvent(9.48), 1)
    acc.compose(E.ApproxDPEvent(7.77, 6.46e-08), 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            lo, up = acc.epsilon(0.00729)
        except PrecisionLimitError:
            return
    assert not (math.isnan(lo) or math.isnan(up)) and lo <= up
