"""pldlib behind dp_accounting's PrivacyAccountant interface (pldlib/interop/dp_accounting.py).

Independent references: dp_accounting's own PLD (its pessimistic accountant and its
optimistic privacy-buckets PLD, at a coarse and a fine grid), exact enumeration of
composed k-ary randomized response, the Gaussian closed form, and dp_accounting's
RDP accountant for sampling without replacement (which its PLD accountant refuses).
"""
from __future__ import annotations

import math
import subprocess
import sys
from math import comb

import numpy as np
import pytest
from scipy import special
from dp_accounting import dp_event as D
from dp_accounting import mechanism_calibration as MC
from dp_accounting import privacy_accountant as PA
from dp_accounting.pld import pld_privacy_accountant as dpa_pld
from dp_accounting.pld import privacy_loss_distribution as dpa_dist
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from scipy.stats import norm

import pldlib
from pldlib.interop.dp_accounting import PldlibAccountant, from_dp_event, relation_of, to_dp_event

NR = PA.NeighboringRelation
DELTA = 1e-5

SGD = D.SelfComposedDpEvent(D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(1.0)), 10_000)
HETERO = D.ComposedDpEvent([
    D.SelfComposedDpEvent(D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(1.0)), 1000),
    D.SelfComposedDpEvent(D.PoissonSampledDpEvent(0.05, D.GaussianDpEvent(2.0)), 500),
    D.SelfComposedDpEvent(D.LaplaceDpEvent(10.0), 10),
])
#: (kind, q, noise, count) of the same events, for dp_accounting's optimistic PLD
PARTS = {"sgd": [("g", 0.01, 1.0, 10_000)],
         "hetero": [("g", 0.01, 1.0, 1000), ("g", 0.05, 2.0, 500), ("l", 1.0, 10.0, 10)]}


def _their_optimistic(parts, h):
    """dp_accounting's optimistic PLD (privacy buckets rounded down): a lower estimate."""
    out = None
    for kind, q, s, k in parts:
        if kind == "g":
            p = dpa_dist.from_gaussian_mechanism(s, sampling_prob=q, value_discretization_interval=h,
                                                 pessimistic_estimate=False, use_connect_dots=False)
        else:
            p = dpa_dist.from_laplace_mechanism(s, sampling_prob=q, value_discretization_interval=h,
                                                pessimistic_estimate=False, use_connect_dots=False)
        p = p.self_compose(k)
        out = p if out is None else out.compose(p)
    return out.get_epsilon_for_delta(DELTA)


@pytest.mark.parametrize("name,event", [("sgd", SGD), ("hetero", HETERO)])
def test_same_event_through_both_accountants(name, event):
    h = 1e-3  # dp_accounting's discretisation interval (coarse: keeps the test fast)
    their_pess = dpa_pld.PLDAccountant(NR.ADD_OR_REMOVE_ONE, h).compose(event).get_epsilon(DELTA)
    their_opt = _their_optimistic(PARTS[name], h)
    # behind dp_accounting's interface, at half their grid spacing (0.1-0.2 s); at the same
    # spacing both upper ends are the same connect-the-dots number (ours 1e-8 higher: round-off)
    ours = PldlibAccountant(NR.ADD_OR_REMOVE_ONE, spacing=h / 2)
    assert ours.compose(event) is ours
    iv = ours.epsilon_interval(DELTA)
    assert ours.get_epsilon(DELTA) == iv.upper           # get_epsilon is the certified upper end
    # ours inside [their optimistic, their pessimistic] widened by their interval h
    assert their_opt - h <= iv.lower <= iv.upper <= their_pess + h, (their_opt, iv, their_pess)
    # ... and it brackets a fine-grid reference: dp_accounting's pessimistic PLD at h = 2e-4
    ref = dpa_pld.PLDAccountant(NR.ADD_OR_REMOVE_ONE, 2e-4).compose(event).get_epsilon(DELTA)
    assert iv.lower <= ref <= iv.upper, (iv, ref)
    assert iv.upper - iv.lower < 0.01 * iv.upper          # and it is narrow
    # delta(eps) too: their pessimistic delta at our upper eps cannot be far above DELTA
    d = ours.delta_interval(iv.upper)
    assert d.lower <= DELTA * (1 + 1e-6) and d.upper <= DELTA * (1 + 1e-6)


def test_calibrate_dp_mechanism_returns_a_certified_sigma():
    def make_event(sigma):
        return D.SelfComposedDpEvent(D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(sigma)), 10_000)

    sigma = MC.calibrate_dp_mechanism(lambda: PldlibAccountant(spacing=2e-3), make_event, 6.0, DELTA,
                                      bracket_interval=MC.LowerEndpointAndGuess(0.0, 1.0), tol=1e-3)
    check = PldlibAccountant(spacing=2e-3).compose(make_event(sigma))
    assert check.get_epsilon(DELTA) <= 6.0                  # certified: its upper bound meets the target
    # near-optimal: pldlib's own calibration (certified optimum within 0.1%) is within 1% of it
    ref = pldlib.calibrate(epsilon=6.0, delta=DELTA, q=0.01, steps=10_000, table=None)
    assert ref.sigma <= sigma * 1.001 and sigma <= ref.sigma * 1.01, (sigma, ref.sigma)


def test_our_calibrate_dp_mechanism_takes_dp_accountings_arguments_and_certifies_the_answer():
    # the drop-in for dp_accounting.mechanism_calibration.calibrate_dp_mechanism: same arguments,
    # answered by pldlib's certified search; checked against dp_accounting's own PLD accountant
    from pldlib.interop.dp_accounting import calibrate_dp_mechanism

    def noise(sigma):
        return D.SelfComposedDpEvent(D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(sigma)), 1000)

    sigma = calibrate_dp_mechanism(PldlibAccountant, noise, 2.0, DELTA, MC.LowerEndpointAndGuess(0, 1))
    assert isinstance(sigma, float)
    assert PldlibAccountant().compose(noise(sigma)).get_epsilon(DELTA) <= 2.0   # certified at the answer
    # dp_accounting's fine-grid PLD: the answer meets the target there too, and its own (uncertified)
    # root is within 0.5% of ours: searched for in exactly that bracket (half the evaluations of
    # their PLD that [0, 1] takes), where their search raises ValueError if it holds no root
    fine = dpa_pld.PLDAccountant(value_discretization_interval=1e-4)
    assert fine.compose(noise(sigma)).get_epsilon(DELTA) <= 2.0 * (1 + 1e-3)
    theirs = MC.calibrate_dp_mechanism(dpa_pld.PLDAccountant, noise, 2.0, DELTA,
                                       MC.ExplicitBracketInterval(sigma / (1 + 5e-3), sigma / (1 - 5e-3)), tol=1e-4)
    assert abs(sigma / theirs - 1) < 5e-3, (sigma, theirs)
    # 1% less noise is certified to miss the target (the answer is near the optimum)
    assert PldlibAccountant().compose(noise(sigma * 0.99)).epsilon_interval(DELTA).lower > 2.0

    # a discrete parameter where more is less private: the largest number of steps
    def steps(k):
        return D.SelfComposedDpEvent(D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(1.0)), k)

    k = calibrate_dp_mechanism(PldlibAccountant, steps, 2.0, DELTA, MC.LowerEndpointAndGuess(1, 100), discrete=True)
    assert isinstance(k, int)
    assert PldlibAccountant().compose(steps(k)).get_epsilon(DELTA) <= 2.0
    assert PldlibAccountant().compose(steps(int(k * 1.03) + 1)).epsilon_interval(DELTA).lower > 2.0
    # an explicit bracket, and the errors
    s2 = calibrate_dp_mechanism(PldlibAccountant, noise, 2.0, DELTA, MC.ExplicitBracketInterval(0.5, 3.0))
    assert abs(s2 / sigma - 1) < 2e-3
    with pytest.raises(TypeError, match="PldlibAccountant"):
        calibrate_dp_mechanism(dpa_pld.PLDAccountant, noise, 2.0, DELTA)
    with pytest.raises(ValueError, match="target_delta"):
        calibrate_dp_mechanism(PldlibAccountant, noise, 2.0, 0.0)
    with pytest.raises(pldlib.calibration.TargetUnreachableError, match="unreachable"):
        calibrate_dp_mechanism(PldlibAccountant, noise, 2.0, DELTA, MC.ExplicitBracketInterval(0.4, 0.6))


def test_jax_privacy_style_factory_and_recipe():
    # JAX Privacy builds accountants as accountant_fn(neighboring_relation)
    accountant_fn = PldlibAccountant
    acc = accountant_fn(NR.ADD_OR_REMOVE_ONE)
    assert acc.neighboring_relation is NR.ADD_OR_REMOVE_ONE and isinstance(acc, PA.PrivacyAccountant)
    assert isinstance(acc.ledger, D.NoOpDpEvent)
    event = D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(1.0))
    acc.compose(event, 10_000)
    assert acc.ledger == D.SelfComposedDpEvent(event, 10_000)
    assert acc.get_epsilon(DELTA) == pytest.approx(6.19, abs=0.01)
    # README recipe (JAX Privacy / TF Privacy: swap the accountant, keep the events)
    from pldlib.interop.dp_accounting import PldlibAccountant as Acc
    eps = Acc(NR.ADD_OR_REMOVE_ONE, method="pld").compose(
        D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(1.0)), 10_000).get_epsilon(1e-5)
    assert 6.16 < eps < 6.2


def _gauss_delta(eps, r):
    """Exact hockey-stick divergence of (N(r, 1), N(0, 1)) (Balle and Wang 2018)."""
    return norm.cdf(r / 2 - eps / r) - math.exp(eps) * norm.cdf(-r / 2 - eps / r)


@pytest.mark.parametrize("relation,r", [(NR.ADD_OR_REMOVE_ONE, 1.0), (NR.REPLACE_SPECIAL, 1.0),
                                        (NR.REPLACE_ONE, 2.0)])
def test_gaussian_matches_the_closed_form_under_each_relation(relation, r):
    # 25 Gaussian steps of noise multiplier 4: one Gaussian of noise 4 / 5; sensitivity doubles
    # under REPLACE_ONE (as in dp_accounting)
    acc = PldlibAccountant(relation).compose(D.GaussianDpEvent(4.0), 25)
    for eps in (0.5, 1.0, 2.0):
        iv = acc.delta_interval(eps)
        truth = _gauss_delta(eps, r * 5 / 4.0)
        assert iv.lower <= truth <= iv.upper, (eps, iv, truth)


def _rr_replace_one_delta(eps, p, k, n):
    """Exact delta(eps) of n-fold k-ary randomized response, x -> x' (enumerating the counts of
    outputs x, x' and others)."""
    top, other = 1 - p + p / k, p / k
    total = 0.0
    for a in range(n + 1):
        for c in range(n + 1 - a):
            b = n - a - c
            pm = math.factorial(n) / (math.factorial(a) * math.factorial(b) * math.factorial(c)) \
                * top ** a * ((k - 2) * other) ** b * other ** c
            qm = math.factorial(n) / (math.factorial(a) * math.factorial(b) * math.factorial(c)) \
                * other ** a * ((k - 2) * other) ** b * top ** c
            total += max(0.0, pm - math.exp(eps) * qm)
    return total


def _rr_replace_special_delta(eps, p, k, n):
    """Exact delta(eps) of n-fold k-ary randomized response, x -> special (uniform) record,
    the larger of both directions."""
    top, other = 1 - p + p / k, p / k
    rem = add = 0.0
    for j in range(n + 1):  # j outputs equal to x
        mult = comb(n, j) * (k - 1) ** (n - j)
        pr, u = top ** j * other ** (n - j), k ** -float(n)
        rem += mult * max(0.0, pr - math.exp(eps) * u)
        add += mult * max(0.0, u - math.exp(eps) * pr)
    return max(rem, add)


@pytest.mark.parametrize("k", [2, 5])
def test_randomized_response_matches_enumeration(k):
    p, n = 0.3, 6
    ev = D.RandomizedResponseDpEvent(p, k)
    one = PldlibAccountant(NR.REPLACE_ONE).compose(ev, n)
    special = PldlibAccountant(NR.REPLACE_SPECIAL).compose(ev, n)
    for eps in (0.5, 2.0, 5.0):
        iv = one.delta_interval(eps)
        t = _rr_replace_one_delta(eps, p, k, n)
        assert iv.lower - 1e-12 <= t <= iv.upper + 1e-12, (eps, iv, t)
        iv = special.delta_interval(eps)
        t = _rr_replace_special_delta(eps, p, k, n)
        assert iv.lower - 1e-12 <= t <= iv.upper + 1e-12, (eps, iv, t)
    # one step agrees with dp_accounting's own PLD (for count > 1 its PLD accountant composes
    # randomized response only once, so we compare a single step)
    for rel in (NR.REPLACE_ONE, NR.REPLACE_SPECIAL):
        theirs = dpa_pld.PLDAccountant(rel, 1e-4).compose(ev).get_delta(1.0)
        iv = PldlibAccountant(rel).compose(ev).delta_interval(1.0)
        assert iv.lower - 1e-4 <= theirs <= iv.upper + 1e-4


def test_sampling_without_replacement_where_their_pld_refuses():
    ev = D.SampledWithoutReplacementDpEvent(10_000, 100, D.GaussianDpEvent(2.0))
    assert not dpa_pld.PLDAccountant(NR.REPLACE_ONE).supports(ev)       # their PLD refuses
    assert not dpa_pld.PLDAccountant(NR.ADD_OR_REMOVE_ONE).supports(ev)
    ours = PldlibAccountant(NR.REPLACE_ONE).compose(ev, 300)
    iv = ours.epsilon_interval(DELTA)
    assert 0 < iv.lower <= iv.upper < math.inf
    # dp_accounting's RDP accountant (a proven upper bound) is the only peer that answers.  It
    # reads the noise multiplier relative to the replace-one sensitivity, where its PLD
    # accountant and pldlib read it relative to one record (a replaced record then moves the
    # sum by twice that: the Gaussian(2.0) below is its Gaussian(1.0)).  A certified lower
    # bound can never exceed a proven upper bound of the same mechanism:
    same = D.SampledWithoutReplacementDpEvent(10_000, 100, D.GaussianDpEvent(1.0))
    rdp = dpa_rdp.RdpAccountant(neighboring_relation=NR.REPLACE_ONE).compose(same, 300).get_epsilon(DELTA)
    assert iv.lower <= rdp
    # the two readings of REPLACE_ONE inside dp_accounting itself (plain Gaussian, 10 steps; their PLD
    # at spacing 1e-3, not their default 1e-4: 0.1 s instead of 1 s, and their eps moves by 3e-7,
    # far inside the 1e-3 below):
    g = D.GaussianDpEvent(2.0)
    their_pld = dpa_pld.PLDAccountant(NR.REPLACE_ONE, 1e-3).compose(g, 10).get_epsilon(DELTA)
    their_rdp = dpa_rdp.RdpAccountant(neighboring_relation=NR.REPLACE_ONE).compose(g, 10).get_epsilon(DELTA)
    assert their_rdp < their_pld / 2                       # sensitivity 1 vs 2
    ours_g = PldlibAccountant(NR.REPLACE_ONE).compose(g, 10).epsilon_interval(DELTA)
    assert ours_g.lower <= their_pld <= ours_g.upper + 1e-3
    ours_add_remove = PldlibAccountant(NR.ADD_OR_REMOVE_ONE).compose(ev, 300).epsilon_interval(DELTA)
    assert 0 < ours_add_remove.lower <= ours_add_remove.upper < math.inf
    assert not PldlibAccountant(NR.REPLACE_SPECIAL).supports(ev)


def test_special_events_and_refusals():
    acc = PldlibAccountant()
    assert acc.compose(D.NoOpDpEvent()).get_epsilon(DELTA) == 0.0
    assert acc.get_delta(1.0) == 0.0 and acc.get_delta(-1.0) == pytest.approx(1 - math.exp(-1.0))
    acc.compose(D.NonPrivateDpEvent())
    assert acc.get_epsilon(DELTA) == math.inf and acc.get_delta(10.0) == 1.0
    assert PldlibAccountant().compose(D.GaussianDpEvent(0.0)).get_epsilon(DELTA) == math.inf
    assert PldlibAccountant().compose(D.PoissonSampledDpEvent(0.0, D.GaussianDpEvent(1.0)), 5).get_epsilon(DELTA) == 0
    # tiny noise, unsampled: the closed form (docs/MATH.md 12.1) answers; its delta at the returned
    # eps, from the Gaussian profile in log space, is the target
    mu = 1e3
    e = PldlibAccountant().compose(D.GaussianDpEvent(1.0 / mu)).get_epsilon(DELTA)
    d = special.ndtr(-e / mu + mu / 2) - math.exp(e + special.log_ndtr(-e / mu - mu / 2))
    assert math.isfinite(e) and d == pytest.approx(DELTA, rel=1e-6)
    # tiny noise, subsampled: a valid (trivial) upper bound instead of an exception (what calibration needs)
    tiny = D.PoissonSampledDpEvent(0.5, D.GaussianDpEvent(1e-3))
    assert PldlibAccountant().compose(tiny).get_epsilon(DELTA) == math.inf
    with pytest.raises(pldlib.PrecisionLimitError):
        PldlibAccountant(on_limit="raise").compose(tiny).get_epsilon(DELTA)
    for ev, words in [
        (D.SampledWithReplacementDpEvent(100, 10, D.LaplaceDpEvent(1.0)), "GaussianDpEvent only"),
        (D.SampledWithReplacementDpEvent(1, 10, D.GaussianDpEvent(1.0)), "at least 2"),
        (D.UnsupportedDpEvent(), "no pldlib counterpart"),
        (D.ZCDpEvent(0.1), "method=.rdp."),  # (accepted by method="rdp": tests/test_zcdp.py)
        (D.RandomizedResponseDpEvent(0.5, 2), "REPLACE_ONE or REPLACE_SPECIAL"),
        (D.PoissonSampledDpEvent(0.1, D.RandomizedResponseDpEvent(0.5, 2)), "must be Gaussian, Laplace"),
    ]:
        a = PldlibAccountant(NR.REPLACE_ONE if "Gaussian, Laplace" in words else NR.ADD_OR_REMOVE_ONE)
        assert not a.supports(ev)
        with pytest.raises(PA.UnsupportedEventError, match=words):
            a.compose(ev)
    with pytest.raises(PA.UnsupportedEventError, match="only the Gaussian"):
        PldlibAccountant(method="rdp").compose(D.LaplaceDpEvent(1.0))
    with pytest.raises(ValueError, match="method: 'clt' certifies no upper bound"):
        PldlibAccountant(method="clt")
    with pytest.raises(TypeError, match="neighboring_relation"):
        PldlibAccountant("add_remove")
    with pytest.raises(ValueError, match="spacing"):
        PldlibAccountant(spacing=-1.0)


@pytest.mark.parametrize("method", ["prv", "spa", "rdp"])
def test_other_methods_behind_the_same_interface(method):
    ev = D.SelfComposedDpEvent(D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(1.0)), 1000)
    pld = PldlibAccountant().compose(ev).epsilon_interval(DELTA)
    acc = PldlibAccountant(NR.ADD_OR_REMOVE_ONE, method=method).compose(ev)
    up = acc.get_epsilon(DELTA)
    assert up >= pld.lower                                   # every certified upper bound is above the truth
    if method != "rdp":
        assert acc.epsilon_interval(DELTA).lower <= pld.upper


def test_converters_round_trip_and_map_parameters():
    pairs = [
        (D.GaussianDpEvent(1.5), pldlib.GaussianEvent(1.5)),
        (D.LaplaceDpEvent(2.0), pldlib.LaplaceEvent(2.0)),
        (D.DiscreteLaplaceDpEvent(0.5, 3), pldlib.DiscreteLaplaceEvent(2.0, 3)),
        (D.PoissonSampledDpEvent(0.01, D.GaussianDpEvent(1.0)), pldlib.Sampled(pldlib.GaussianEvent(1.0), 0.01)),
        (D.SampledWithoutReplacementDpEvent(1000, 10, D.LaplaceDpEvent(1.0)),
         pldlib.Sampled(pldlib.LaplaceEvent(1.0), 0.01, "wor")),
        (D.SelfComposedDpEvent(D.GaussianDpEvent(2.0), 7), pldlib.SelfComposed(pldlib.GaussianEvent(2.0), 7)),
        (D.NoOpDpEvent(), pldlib.NoOp()),
    ]
    for theirs, ours in pairs:
        assert from_dp_event(theirs) == ours
        assert from_dp_event(to_dp_event(ours)) == ours
    comp = D.ComposedDpEvent([pairs[0][0], pairs[3][0]])
    assert from_dp_event(comp) == pldlib.Composed([pairs[0][1], pairs[3][1]])
    # binary randomized response: p = 2 / (1 + e^eps0) both ways
    rr = from_dp_event(D.RandomizedResponseDpEvent(0.3, 2), NR.REPLACE_ONE)
    assert rr.eps0 == pytest.approx(math.log(0.85 / 0.15), rel=1e-14)
    assert to_dp_event(rr).noise_parameter == pytest.approx(0.3, rel=1e-14)
    # Laplace with sensitivity: dp_accounting's noise multiplier is scale / sensitivity
    assert to_dp_event(pldlib.LaplaceEvent(4.0, sensitivity=2.0)) == D.LaplaceDpEvent(2.0)
    assert to_dp_event(pldlib.Gaussian(sigma=1.0, q=0.01, sampling="poisson")) == pairs[3][0]
    assert to_dp_event(pldlib.Sampled(pldlib.GaussianEvent(1.0), 0.25, "wor"), dataset_size=400) == \
        D.SampledWithoutReplacementDpEvent(400, 100, D.GaussianDpEvent(1.0))
    with pytest.raises(ValueError, match="dataset_size"):
        to_dp_event(pldlib.Sampled(pldlib.GaussianEvent(1.0), 0.25, "wor"), dataset_size=401)
    with pytest.raises(ValueError, match="ApproxDPEvent"):
        to_dp_event(pldlib.ApproxDPEvent(1.0, 1e-6))
    with pytest.raises(ValueError, match="not differentially private"):
        from_dp_event(D.NonPrivateDpEvent())
    with pytest.raises(pldlib.UnsupportedEventError, match="REPLACE_ONE or REPLACE_SPECIAL"):
        from_dp_event(D.RandomizedResponseDpEvent(0.3, 2))
    assert [relation_of(r) for r in NR] == ["add_remove", "substitution", "add_remove"]


def test_repr_names_method_and_relation():
    r = repr(PldlibAccountant(NR.REPLACE_ONE, method="spa").compose(D.GaussianDpEvent(2.0), 3))
    assert "REPLACE_ONE" in r and "'spa'" in r and "GaussianEvent(sigma=2.0" in r and " at 0x" not in r


def test_import_pldlib_imports_no_adapter():
    code = ("import sys, pldlib; pldlib.account(pldlib.Gaussian(sigma=1.0), steps=2).epsilon(1e-5); "
            "bad = [m for m in ('dp_accounting', 'opacus', 'torch', 'pldlib.interop') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_single_epoch_tree_aggregation_is_a_gaussian_of_sensitivity_sqrt_depth():
    # closed form: depth = ceil(log2(T + 1)) nodes per record, noise sigma per node: the Gaussian
    # mechanism with mu = sqrt(depth) / sigma per epoch, composed over the epochs
    ev = D.SingleEpochTreeAggregationDpEvent(2.0, [1000, 500])
    ours = PldlibAccountant(NR.REPLACE_SPECIAL)
    ours.compose(ev, 3)
    mu = math.sqrt(3 * math.ceil(math.log2(1001))) / 2.0
    iv = ours.epsilon_interval(DELTA)
    for e, side in ((iv.lower, "lower"), (iv.upper, "upper")):
        d = special.ndtr(-e / mu + mu / 2) - math.exp(e + special.log_ndtr(-e / mu - mu / 2))
        assert (d >= DELTA * (1 - 1e-9)) if side == "lower" else (d <= DELTA * (1 + 1e-9)), (side, e, d)
    rdp = dpa_rdp.RdpAccountant(neighboring_relation=NR.REPLACE_SPECIAL)
    rdp.compose(ev, 3)
    assert iv.upper <= rdp.get_epsilon(DELTA)  # (RDP: a looser upper bound of the same mechanism)
    # a single tree of T = 1 step is one Gaussian step
    one = PldlibAccountant(NR.REPLACE_SPECIAL).compose(D.SingleEpochTreeAggregationDpEvent(1.5, 1))
    ref = PldlibAccountant(NR.REPLACE_SPECIAL).compose(D.GaussianDpEvent(1.5))
    assert one.get_epsilon(DELTA) == ref.get_epsilon(DELTA)
    with pytest.raises(PA.UnsupportedEventError, match="REPLACE_SPECIAL only"):
        PldlibAccountant().compose(ev)
    assert PldlibAccountant(NR.REPLACE_SPECIAL).compose(D.SingleEpochTreeAggregationDpEvent(0.0, 10)) \
        .get_epsilon(DELTA) == math.inf
