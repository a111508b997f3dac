"""The issue-39 families of the robustness runner (pldlib/testing/robust.py) and their truths
(pldlib/testing/robust_truths.py): each truth against a closed form or an independent
evaluation written here, the checker against fabricated wrong intervals, and a tiny run.
"""
import itertools

import mpmath as mp
import pytest

from pldlib.testing import robust as R
from pldlib.testing import robust_truths as T


def _phi_inv(a):
    return mp.sqrt(2) * mp.erfinv(2 * mp.mpf(a) - 1)


# -- randomized response ---------------------------------------------------------------------
@pytest.mark.parametrize("eps0,eps", [(0.1, 0.05), (0.1, -0.2), (2.3, 1.0), (30.0, 1.0), (60.1, 0.0)])
def test_rr_one_step_closed_form(eps0, eps):
    with mp.workdps(60):
        e0, e = mp.mpf(eps0), mp.mpf(eps)
        p = mp.exp(e0) / (1 + mp.exp(e0))
        want = max(0, p - mp.exp(e) * (1 - p)) + max(0, (1 - p) - mp.exp(e) * p)
        got = T.rr_delta(eps0, 1, eps)[0]
        assert abs(got - want) <= mp.mpf(10) ** -50 * max(want, 1)


def test_rr_binomial_sum_equals_enumeration_of_outcomes():
    # k = 5: all 2^5 output sequences, no grouping by the binomial
    eps0, k = 0.3, 5
    with mp.workdps(60):
        e0 = mp.mpf(eps0)
        p = mp.exp(e0) / (1 + mp.exp(e0))
        for eps in (0.0, 0.29, 0.9, 1.2, 1.5):
            tot = mp.mpf(0)
            for seq in itertools.product((0, 1), repeat=k):
                j = sum(seq)
                P, Q = p ** j * (1 - p) ** (k - j), (1 - p) ** j * p ** (k - j)
                tot += max(0, P - mp.exp(eps) * Q)
            assert abs(T.rr_delta(eps0, k, eps)[0] - tot) <= mp.mpf(10) ** -45


def test_rr_double_eps0_rounding_is_kept():
    # 10 * double(0.1) > 1: the largest loss exceeds 1, so delta(1) > 0 (the issue's 3a)
    v = T.rr_delta(0.1, 10, 1.0)[0]
    with mp.workdps(60):
        e0 = mp.mpf(0.1)
        want = (mp.exp(10 * e0) - mp.e) / (1 + mp.exp(e0)) ** 10
    assert v > 0 and abs(v - want) <= want * mp.mpf(10) ** -40


# -- Neyman-Pearson power ----------------------------------------------------------------------
@pytest.mark.parametrize("rel", ["remove", "add", "add_remove"])
@pytest.mark.parametrize("sigma,alpha", [(0.5, 0.3), (2.0, 1e-4), (1.0, 0.9)])
def test_np_power_unsampled_closed_form(rel, sigma, alpha):
    with mp.workdps(40):
        want = mp.ncdf(_phi_inv(alpha) + 1 / mp.mpf(sigma))
        lo, hi = T.np_power(sigma, 1.0, alpha, rel)
        assert lo <= want * (1 + mp.mpf(10) ** -25) and hi >= want * (1 - mp.mpf(10) ** -25)


@pytest.mark.parametrize("rel", ["remove", "add"])
def test_np_power_is_the_conjugate_of_delta(rel):
    # power(alpha) = min over eps of delta(eps) + e^eps alpha (docs/MATH.md 10), with delta the
    # one-step closed form: a different formula (hockey-stick, not thresholds)
    sigma, q, alpha = 0.8, 0.3, 0.05
    power = T.np_power(sigma, q, alpha, rel)[0]
    f = lambda e: T.poisson_gauss_delta1(sigma, q, e, rel)[0] + mp.exp(e) * alpha  # noqa: E731
    a, b = mp.mpf(-5), mp.mpf(10)  # f is unimodal (convex in e^eps): golden-section search
    g = (mp.sqrt(5) - 1) / 2
    for _ in range(120):
        c, d = b - g * (b - a), a + g * (b - a)
        a, b = (a, d) if f(c) < f(d) else (c, b)
    assert abs(f((a + b) / 2) - power) <= 1e-12
    for e in (-1, 0, 0.5, 2, 4):
        assert f(e) >= power * (1 - 1e-15)


# -- random allocation ---------------------------------------------------------------------------
@pytest.mark.parametrize("rel", ["add", "remove"])
def test_allocation_one_step_is_the_gaussian(rel):
    for sigma, eps in ((1.0, 0.5), (0.4, 3.0)):
        with mp.workdps(30):
            mu, e = 1 / mp.mpf(sigma), mp.mpf(eps)
            want = mp.ncdf(-e / mu + mu / 2) - mp.exp(e) * mp.ncdf(-e / mu - mu / 2)
            lo, hi = T.allocation_delta(sigma, 1, eps, rel)
            assert abs(lo - want) <= want * 1e-28 and hi - lo <= want * 1e-25


def _allocation_by_x2(sigma, eps, direction):
    """t = 2 by conditioning on x2 instead of (x1 - x2)/2: the inner expectation over x1 is a
    call (remove) or put (add) on one lognormal with a shifted strike; 1-D quadrature over x2."""
    with mp.workdps(25):
        s, E = mp.mpf(sigma), mp.exp(eps)
        k, m, sd = 1 / s ** 2, -1 / (2 * s ** 2) - mp.log(2), 1 / s
        F = mp.exp(m + sd ** 2 / 2)

        def f(x2):
            c = mp.exp((x2 - mp.mpf(1) / 2) * k) / 2
            if direction == "remove":
                K = E - c
                if K <= 0:
                    v = F + c - E
                else:
                    d = (m - mp.log(K)) / sd
                    v = F * mp.ncdf(d + sd) - K * mp.ncdf(d)
            else:
                K = 1 / E - c
                if K <= 0:
                    return mp.mpf(0)
                d = (mp.log(K) - m) / sd
                v = E * (K * mp.ncdf(d) - F * mp.ncdf(d - sd))
            return mp.npdf(x2, 0, s) * v

        kink = mp.mpf(1) / 2 + s ** 2 * (mp.log(2) + (eps if direction == "remove" else -eps))
        return mp.quad(f, sorted([-mp.inf, -10 * s, 0, mp.mpf(1) / 2, 10 * s, kink, mp.inf]))


@pytest.mark.parametrize("rel,sigma,eps", [("remove", 1.0, 0.5), ("add", 0.7, 1.0)])
def test_allocation_two_steps_against_other_conditioning(rel, sigma, eps):
    lo, hi = T.allocation_delta(sigma, 2, eps, rel)
    want = _allocation_by_x2(sigma, eps, rel)
    assert abs((lo + hi) / 2 - want) <= want * 1e-15


def test_allocation_power_at_zero_and_its_conjugate_bound():
    assert T.allocation_power(1.0, 0.0, "add_remove") == (0, 0)
    lo, hi = T.allocation_power(1.0, 0.05, "remove")
    assert hi - lo <= hi * 1e-12 and lo > 0.05
    # power(alpha) <= delta(eps) + e^eps alpha for every eps (conjugacy, docs/MATH.md 10), with
    # equality at the eps of the Neyman-Pearson threshold (close to the better of 1.0, 1.5; the exact
    # minimum agreed to 15 digits in a golden-section search, too slow for a test)
    ub = min(T.allocation_delta(1.0, 2, e, "remove")[0] + mp.exp(e) * 0.05 for e in (1.0, 1.5))
    assert hi <= ub * (1 + 1e-15) and ub - hi < 1e-3


@pytest.mark.parametrize("eps", [-0.4, -0.05, 0.01, 0.05])
def test_poisson_one_step_add_equals_the_identity(eps):
    # the add pair computed directly equals 1 - e^eps + e^eps delta_remove(-eps) (where that does
    # not cancel), and is exactly 0 beyond its largest loss -log(1 - q) (the identity leaves
    # a 1e-52 residue there: a false alarm in an earlier run)
    sigma, q = 0.6, 0.1
    with mp.workdps(50):
        via = -mp.expm1(mp.mpf(eps)) + mp.exp(mp.mpf(eps)) * T.poisson_gauss_delta1(sigma, q, -eps, "remove")[0]
        got = T.poisson_gauss_delta1(sigma, q, eps, "add")[0]
        assert abs(got - via) <= mp.mpf(10) ** -40
    assert T.poisson_gauss_delta1(0.145, 0.0824, 0.3153, "add")[0] == 0


# -- the negative-eps identity -------------------------------------------------------------------
@pytest.mark.parametrize("rel", ["add", "remove", "add_remove"])
def test_negative_eps_interval_contains_the_one_step_closed_form(rel):
    sigma, q, eps = 2.0, 0.01, -0.3
    lo, hi = T.negative_eps_delta(sigma, q, 1, eps, rel)
    exact = T.poisson_gauss_delta1(sigma, q, eps, rel)[0]
    assert abs(lo + mp.expm1(mp.mpf(eps))) < 1e-15  # (compared at the default 15 digits)
    assert lo <= exact <= hi and hi - lo < 1e-4  # (Chernoff: loose at one step, valid)


def test_negative_eps_interval_is_tight_for_the_issue_case():
    # sigma 5, q 1e-7, 1e7 steps, delta(-0.5): 1 - e^-0.5 up to far less than the library's
    # reported excess of 1.4e-5 (the issue's 2b)
    lo, hi = T.negative_eps_delta(5.0, 1e-7, 10**7, -0.5, "add_remove")
    assert hi - lo < 1e-6 and abs(lo + mp.expm1(mp.mpf(-0.5))) < 1e-15


# -- the checker ---------------------------------------------------------------------------------
def _rec(case, lo, up, truth):
    return R.check({"status": "ok", "lower": lo, "upper": up, "case": case, "seconds": 0.0, "peak_mb": 0.0,
                    "truth": truth})


def test_checker_flags_both_ends():
    case = {"family": "rr", "method": "pld", "relation": "add", "steps": [[{"kind": "rr", "eps0": 0.1}, 10]],
            "query": ["delta", 1.0]}
    t = R.family_truth(case)
    assert _rec(case, 0.0, 0.0, t)["flags"] == ["unsound upper"]  # the issue's 3a
    assert _rec(case, 0.0, 1e-19, t)["status"] == "ok"
    case = dict(case, query=["delta", 0.5])
    t = R.family_truth(case)
    v = float(t["value"][0])
    assert _rec(case, v * (1 + 1e-6), 1.0, t)["flags"] == ["unsound lower"]
    assert _rec(case, v * (1 - 1e-12), v * (1 + 1e-12), t)["status"] == "ok"
    # eps answers: through delta at the ends
    case = dict(case, query=["epsilon", 1e-3])
    e_lo, e_up = 0.5, 1.0
    t = R.family_truth(case, {"lower": e_lo, "upper": e_up})
    d_lo, d_up = float(t["at_lower"][0]), float(t["at_upper"][0])
    assert d_lo > 1e-3 > d_up  # so [0.9, 1.0] is sound, and each end misplaced is caught
    assert _rec(case, e_lo, e_up, t)["status"] == "ok"
    t2 = R.family_truth(case, {"lower": 0.2, "upper": 0.3})
    assert _rec(case, 0.2, 0.3, t2)["flags"] == ["unsound upper"]
    t3 = R.family_truth(case, {"lower": 0.9, "upper": 1.1})
    assert _rec(case, 0.9, 1.1, t3)["flags"] == ["unsound lower"]


def test_relative_width_and_where_it_makes_no_claim():
    import math

    mixed = {"relation": "add", "steps": [[{"kind": "gauss", "sigma": 1.0}, 1]], "query": ["delta", 1.0]}

    def w(lo, up, case=mixed, truth=None):
        return R.rel_width({"status": "ok", "lower": lo, "upper": up, "case": case, "truth": truth})

    assert w(0.0, 1e-30) == 1.0 and abs(w(0.99e-3, 1e-3) - 0.01) < 1e-12
    # delta answers relative to at least 1e-300: one certified below the normal doubles is narrow
    assert w(0.0, 5e-324) < 1e-20 and w(0.0, 0.0) == 0.0
    eps_case = dict(mixed, query=["epsilon", 1e-5])
    assert abs(w(1.0, 1.02, eps_case) - 0.02 / 1.02) < 1e-12 and abs(w(0.0, 1e-4, eps_case) - 0.1) < 1e-12
    fam = dict(mixed, family="rr")
    assert abs(w(0.5, 0.6, fam, {"value": ["0.5", "0.5"]}) - 0.2) < 1e-12
    assert math.isnan(w(0.0, 1e-300, fam, {"value": ["1e-320", "1e-320"]}))  # (a subnormal truth)


def test_rdp_and_shuffle_are_checked_on_the_upper_end_only():
    case = {"family": "tradeoff", "method": "rdp", "relation": "remove",
            "steps": [[{"kind": "sgauss", "sigma": 1.0, "q": 0.1, "scheme": "poisson"}, 1]], "query": ["max_tpr", 0.1]}
    t = R.family_truth(case)
    assert _rec(case, float("nan"), 1.0, t)["status"] == "ok"
    assert _rec(case, float("nan"), 0.1, t)["flags"] == ["unsound upper"]


def test_bare_exception_and_documented_refusal_are_told_apart():
    from pldlib import GridTooLargeError, PrecisionLimitError, UnsupportedEventError

    assert R._classify(GridTooLargeError("x")) == ("refused", "GridTooLargeError")
    assert R._classify(PrecisionLimitError("x")) == ("refused", "PrecisionLimitError")
    assert R._classify(UnsupportedEventError("x"))[0] == "unsupported"
    assert R._classify(MemoryError())[0] == "oom"
    assert R._classify(ValueError("x"))[0] == "error"


# -- a tiny run ------------------------------------------------------------------------------------
def test_tiny_run_of_every_family(tmp_path):
    cases = [
        {"family": "allocation", "method": "pld", "relation": "remove",
         "steps": [[{"kind": "alloc", "sigma": 2.0, "t": 2, "scheme": "random_allocation"}, 2]],
         "query": ["delta", 0.5]},
        {"family": "negeps", "method": "rdp", "relation": "remove",
         "steps": [[{"kind": "sgauss", "sigma": 50.0, "q": 1e-6, "scheme": "poisson"}, 10**4]],
         "query": ["delta", -0.2]},
        {"family": "explicit", "method": "pld", "relation": "add_remove", "spacing": 1e-3,
         "steps": [[{"kind": "sgauss", "sigma": 1.0, "q": 0.01, "scheme": "poisson"}, 1]], "query": ["delta", 0.5]},
    ]
    recs = [R.run_case(c) for c in cases]
    for r in recs:
        assert r["status"] in ("ok", "unsound", "refused", "unsupported"), (r["status"], r.get("error"))
        if r["status"] == "ok":
            assert r.get("truth"), r.get("truth_error")
    out = tmp_path / "r.md"
    R.main(["--family", "rr,tradeoff", "--cases", "4", "--seed", "2", "--workers", "2", "--out", str(out)])
    text = out.read_text() + R.report(recs, "t", "cmd")
    assert "| family | truth |" in text and "| allocation |" in text
    assert "| rr |" in text or "| tradeoff |" in text


def test_checker_flags_the_issue_outputs_from_before_the_fixes():
    # the intervals the issue's reproducer printed before the fixes (2026-11-28 03:59 UTC), each
    # against its family's truth: 2b, 3a, 3b and 4a of /tmp/repro/repro39.py
    by = {R.describe(c): c for c in R.issue39_cases()}
    before = [
        ("add_remove: sgauss(sigma=5.0, q=1e-07, scheme='poisson') x 10,000,000; delta(-0.5)",
         0.39348371203879823, 0.39348371203879823, "unsound lower"),
        ("add_remove: rr(eps0=0.1) x 10; delta(1.0)", 0.0, 0.0, "unsound upper"),
        ("add_remove: rr(eps0=60.1) x 10; delta(601.0)", 0.0, 0.0, "unsound upper"),
        ("prv add_remove: sgauss(sigma=0.5, q=0.5, scheme='poisson') x 1; max_tpr(0.3)",
         0.6282593146206287, 0.6433940178014901, "unsound lower"),
    ]
    for key, lo, up, flag in before:
        case = by[key]
        t = R.family_truth(case, {"lower": lo, "upper": up})
        assert _rec(case, lo, up, t).get("flags") == [flag], key
