"""Edge cases of issues 39 (items 8, 9, 11) and 40 (item 4): lattice pairs with disjoint or
partly disjoint supports, attack calibration whose target every sigma meets, atlas queries
outside the sigma grid, and noise beyond floating point (sigma 1e300 / 1e-300, q 1e-300).

Every number is checked against a truth written here: exact enumeration in rationals, the
Gaussian closed form in mpmath, or the general bounds 1 - e^eps <= delta(eps) <= 1 - e^eps + TV
(any pair; TV its total variation, at most steps x the one-step TV)."""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest

import pldlib
from pldlib.profiles.base import LossRangeError

mp.mp.dps = 50


# -- lattice noise: exact truths by enumeration ----------------------------------------------
def _shifted(pmf, c):
    """{output: mass} of the lattice noise pmf (offsets 0..m-1) shifted by c, in rationals."""
    return {c + i: Fraction(p) for i, p in enumerate(pmf) if p}


def _mix(pmf, weights):
    out = {}
    for c, w in weights.items():
        for o, p in _shifted(pmf, c).items():
            out[o] = out.get(o, 0) + Fraction(w) * p
    return out


def _pairs(pmf, D, q, relation):
    """The dominating pairs (P, Q) the library documents (docs/MATH.md section 2), one per
    direction whose curves are maximised after composition; q = 1: unsampled."""
    if q == 1:
        if relation == "substitution":
            return [(_mix(pmf, {2 * D: 1}), _mix(pmf, {0: 1}))]
        rem = (_mix(pmf, {D: 1}), _mix(pmf, {0: 1}))
    else:
        q = Fraction(q)
        if relation == "substitution":
            return [(_mix(pmf, {0: 1 - q, D: q}), _mix(pmf, {0: 1 - q, -D: q}))]
        rem = (_mix(pmf, {0: 1 - q, D: q}), _mix(pmf, {0: 1}))
    add = (rem[1], rem[0])
    return {"remove": [rem], "add": [add], "add_remove": [add, rem]}[relation]


def _delta_truth(pairs, steps, eps):
    """max over directions of sum over output tuples of (P - e^eps Q)_+ (Q = 0: P), in mpmath."""
    best = mp.mpf(0)
    a = mp.exp(mp.mpf(eps))
    for P, Q in pairs:
        outs = sorted(set(P) | set(Q))
        tot = mp.mpf(0)
        for t in itertools.product(outs, repeat=steps):
            p = math.prod(P.get(o, 0) for o in t)
            if p == 0:
                continue
            qq = math.prod(Q.get(o, 0) for o in t)
            v = mp.mpf(p.numerator) / p.denominator - a * mp.mpf(qq.numerator) / qq.denominator
            tot += max(v, 0)
        best = max(best, tot)
    return best


LATTICE_CASES = [
    # issue 39 item 8: disjoint supports (delta = 1 for every eps)
    (dict(pmf=[0.5, 0.5], shift=2), 1),
    (dict(pmf=[0.5, 0.5], shift=2, relation="remove"), 1),
    (dict(pmf=[0.25, 0.5, 0.25], shift=2, relation="substitution"), 1),
    (dict(pmf=[0.5, 0.0, 0.5], shift=1), 3),
    # partly disjoint: a +inf atom next to finite losses
    (dict(pmf=[0.25, 0.5, 0.25], shift=2), 2),
    (dict(pmf=[0.5, 0.5], shift=2, q=0.3, sampling="poisson"), 2),
    (dict(pmf=[0.5, 0.5], shift=2, q=0.3, sampling="poisson", relation="substitution"), 2),
    (dict(pmf=[0.5, 0.5], shift=2, q=0.3, sampling="poisson", relation="add"), 3),
    # a shift far beyond the pmf's length: the same pair as any shift >= m (no dense array)
    (dict(pmf=[0.25, 0.5, 0.25], shift=10**12, q=0.3, sampling="poisson"), 2),
]


@pytest.mark.parametrize("kw, steps", LATTICE_CASES)
def test_lattice_pairs_with_disjoint_supports_are_certified(kw, steps):
    m = pldlib.LatticeNoise(**kw)
    D = min(kw["shift"], 10)  # (beyond the pmf's length the shift does not change the pair)
    pairs = _pairs(kw["pmf"], D, kw.get("q", 1), kw.get("relation", "add_remove"))
    acc = pldlib.account(m, steps=steps)
    eps = [-1.0, 0.0, 0.5, 2.0]
    iv = acc.delta(eps)
    for e, lo, hi in zip(eps, iv.lower, iv.upper):
        t = _delta_truth(pairs, steps, e)
        assert mp.mpf(float(lo)) <= t <= mp.mpf(float(hi)), (kw, steps, e, lo, float(t), hi)
    disjoint = all(all(Q.get(o, 0) == 0 for o in P) for P, Q in pairs)
    if disjoint:  # L = +inf P-surely: delta = 1 exactly, eps(delta) = +inf, TPR = 1
        assert np.all(iv.upper == 1.0) and np.all(iv.lower >= 1.0 - 1e-12)
        ev = acc.epsilon([1e-3, 0.5])
        assert np.all(np.isinf(ev.lower)) and np.all(np.isinf(ev.upper))
        t = acc.max_tpr(0.01)
        assert t.upper == 1.0 and t.lower >= 1.0 - 1e-12


def test_discrete_laplace_with_vanishing_scale_is_the_disjoint_pair():
    # scale 1e-300: the noise is a point mass at 0, so shifted copies are disjoint: delta = 1
    acc = pldlib.account(pldlib.DiscreteLaplace(scale=1e-300), steps=3)
    iv = acc.delta([0.0, 5.0])
    assert np.all(iv.upper == 1.0) and np.all(iv.lower >= 1.0 - 1e-12)
    assert math.isinf(float(acc.epsilon(1e-5).upper))


@pytest.mark.parametrize("kw, exc, word", [
    (dict(pmf=[float("nan")] * 2), ValueError, "pmf entries must be finite"),
    (dict(pmf=[0.5, float("inf")]), ValueError, "pmf entries must be finite"),
    (dict(pmf="ab"), TypeError, "pmf"),
    (dict(pmf=5), TypeError, "pmf"),
    (dict(pmf=[[0.5], [0.5]]), TypeError, "pmf"),
    (dict(pmf=[0.7, 0.7]), ValueError, "pmf must sum to 1"),
    (dict(pmf=[1.0]), ValueError, "at least 2"),
    (dict(pmf=[0.6, 0.4]), ValueError, "symmetric"),
    (dict(pmf=[0.5, 0.5], shift=float("nan")), ValueError, "shift must be an integer"),
    (dict(pmf=[0.5, 0.5], shift=2.5), ValueError, "shift must be an integer"),
    (dict(pmf=[0.5, 0.5], shift=0), ValueError, "shift must be an integer"),
    (dict(pmf=[0.5, 0.5], shift=True), TypeError, "shift"),
])
def test_lattice_noise_arguments_are_validated(kw, exc, word):
    with pytest.raises(exc, match=word):
        pldlib.LatticeNoise(**kw)
    with pytest.raises(exc, match=word):
        pldlib.LatticeEvent(kw["pmf"], kw.get("shift", 1))


def test_lattice_noise_accepts_arrays_and_whole_float_shifts():
    m = pldlib.LatticeNoise(pmf=np.array([0.25, 0.5, 0.25]), shift=2.0)
    assert m.pmf == (0.25, 0.5, 0.25) and m.shift == 2 and hash(m) == hash(pldlib.LatticeNoise(
        pmf=(0.25, 0.5, 0.25), shift=2))


# -- attack calibration: targets every sigma meets, and ones no sigma certifies ----------------
def _tpr_truth(sigma, q, fpr):
    """max over the remove and add directions of the Neyman-Pearson TPR at FPR ``fpr`` of the
    Poisson-subsampled Gaussian (mpmath): remove P = (1-q) N(0, s^2) + q N(1, s^2) against
    Q = N(0, s^2), rejecting x > t; add P = N(0, s^2) against Q = (1-q) N(0, s^2) + q N(1, s^2),
    rejecting x < t (the likelihood ratio is monotone in x for both)."""
    s, q, a = mp.mpf(sigma), mp.mpf(q), mp.mpf(fpr)
    t_rem = s * mp.sqrt(2) * mp.erfinv(1 - 2 * a)  # Q(x > t) = a
    rem = (1 - q) * a + q * mp.ncdf(-(t_rem - 1) / s)
    lo, hi = -60 * s, 1 + 60 * s  # Q(x < t) = a by bisection (increasing in t)
    for _ in range(300):
        t = (lo + hi) / 2
        if (1 - q) * mp.ncdf(t / s) + q * mp.ncdf((t - 1) / s) < a:
            lo = t
        else:
            hi = t
    t_add = (lo + hi) / 2
    add = mp.ncdf(t_add / s)
    return max(rem, add)


@pytest.mark.parametrize("q, tpr, fpr", [(0.5, 0.9, 0.3), (0.01, 0.05, 1e-3)])
def test_attack_target_met_by_every_sigma_is_not_refused(q, tpr, fpr):
    # sup over sigma of the TPR at FPR a is its sigma -> 0 limit q + (1 - q) a (< tpr here): every
    # sigma meets the target; the search descends until the accountant refuses (single-step loss
    # beyond e^700) and returns the smallest certifiable sigma (issue 39 item 9 raised there)
    assert q + (1 - q) * fpr < tpr
    r = pldlib.calibrate(q=q, steps=1, tpr_at_fpr=(tpr, fpr), tol=0.1)
    assert r.sigma_refused is not None and r.sigma_refused < r.sigma <= r.sigma_refused * 1.1 * (1 + 1e-9)
    assert r.value.upper <= tpr
    truth = _tpr_truth(r.sigma, q, fpr)
    assert mp.mpf(r.value.lower) <= truth <= mp.mpf(r.value.upper)
    with pytest.raises(pldlib.PrecisionLimitError):
        pldlib.account(pldlib.Gaussian(sigma=r.sigma_refused, q=q, sampling="poisson"), steps=1).max_tpr(fpr)


def test_attack_target_no_sigma_certifies_is_a_calibration_error():
    from pldlib.calibrate import CalibrationError

    with pytest.raises(CalibrationError, match=r"tpr@fpr=0.1 <= 0.100000000001.*smallest certified upper"):
        pldlib.calibrate(q=1.0, steps=1, tpr_at_fpr=(0.1 + 1e-12, 0.1))


# -- the atlas outside its sigma grid ---------------------------------------------------------
ISSUE_QUERY = (0.1195182360971911, 2.2614475306855085e-07, 0.7621253881998983, 122092)


@pytest.fixture(scope="module")
def curated():
    from pldlib.atlas import default_atlas_path, open_atlas

    path = default_atlas_path()
    if path is None:
        pytest.skip("no curated atlas in this checkout")
    return open_atlas(path)


def test_atlas_query_above_its_sigma_grid_raises_and_calibrate_falls_back(curated):
    from pldlib.atlas import AtlasRangeError

    e, d, q, k = ISSUE_QUERY
    top = float(curated.axes["sigma"][-1])
    with pytest.raises(AtlasRangeError, match=r"epsilon=0.1195182360971911.*above the atlas's sigma range"):
        curated.sigma_for(*ISSUE_QUERY)
    # the certified accountant, independent of the atlas: even its largest sigma falls short
    assert pldlib.account(pldlib.Gaussian(sigma=top, q=q, sampling="poisson"), steps=k).epsilon(d).lower > e
    # arrays keep one NaN per such query (documented), the other queries answered
    v = curated.sigma_for([e, 1.0], d, q, k)
    assert math.isnan(v.sigma[0]) and math.isfinite(v.sigma[1])
    with pytest.raises(AtlasRangeError):
        curated.sigma_for([1.0, e], d, q, k, outside="raise")
    r = pldlib.calibrate(e, d, q, k, table=curated, tol=1e-2)
    assert r.sigma > top
    assert pldlib.account(pldlib.Gaussian(sigma=r.sigma, q=q, sampling="poisson"), steps=k).epsilon(d).upper <= e


def test_atlas_query_below_its_sigma_grid_raises(curated):
    from pldlib.atlas import AtlasRangeError

    with pytest.raises(AtlasRangeError, match="at or below the atlas's sigma range"):
        curated.sigma_for(150.0, 1e-5, 0.01, 100)
    s = float(curated.sigma_for([150.0], 1e-5, 0.01, 100).sigma[0])  # arrays: certified, not tight
    assert pldlib.account(pldlib.Gaussian(sigma=s, q=0.01, sampling="poisson"), steps=100).epsilon(1e-5).upper <= 150


@pytest.mark.parametrize("args, word", [
    ((float("nan"), 1e-5, 0.01, 100), "epsilon"), ((1.0, float("nan"), 0.01, 100), "delta"),
    ((1.0, 1e-5, float("nan"), 100), "q"), ((1.0, 1e-5, 0.01, float("nan")), "steps"),
    ((1.0, 1e-5, 0.01, float("inf")), "steps"), ((float("inf"), 1e-5, 0.01, 100), "epsilon"),
])
def test_atlas_rejects_nan_and_infinite_arguments(curated, args, word):
    with pytest.raises(ValueError, match=word):
        curated.sigma_for(*args)


# -- noise beyond floating point -------------------------------------------------------------
def _identity_bracket(delta, tv):
    """eps(delta) of any pair with total variation <= tv lies in [ln(1 - delta), ln(1 - delta + tv)]
    (1 - e^eps <= delta(eps) <= 1 - e^eps + tv for eps <= 0)."""
    d, tv = mp.mpf(delta), mp.mpf(tv)
    return mp.log(1 - d), mp.log(1 - d + tv)


@pytest.mark.parametrize("sigma, q, sampling, relation", [
    (1e300, 0.01, "poisson", "add_remove"), (1e300, 0.01, "wor", "add_remove"),
    (1e300, 0.01, "poisson", "substitution"), (1e160, 0.01, "poisson", "add_remove"),
    (1.0, 1e-300, "poisson", "add_remove"),
])
def test_gaussian_at_huge_sigma_or_tiny_q_is_all_noise(sigma, q, sampling, relation):
    # issue 40 item 4: sigma 1e300 raised OverflowError (sigma**2).  One step's TV is at most
    # q (2 Phi(c / (2 sigma)) - 1), c <= 2 the sensitivity factor of the relation/sampling
    steps, delta = 10, 1e-5
    tv = steps * min(mp.mpf(q) * (2 * mp.ncdf(mp.mpf(2) / (2 * mp.mpf(sigma))) - 1), 1)
    lo_t, hi_t = _identity_bracket(delta, tv)
    acc = pldlib.account(pldlib.Gaussian(sigma=sigma, q=q, sampling=sampling, relation=relation), steps=steps)
    iv = acc.epsilon(delta)
    assert mp.mpf(float(iv.lower)) <= lo_t and hi_t <= mp.mpf(float(iv.upper)) <= 0
    d = acc.delta(0.5)  # 0 <= delta(0.5) <= tv
    assert float(d.lower) <= tv and 0.0 <= float(d.upper) <= 1e-20


def test_laplace_at_huge_scale_is_all_noise():
    steps, delta, b = 10, 1e-5, 1e300
    tv = steps * (1 - mp.exp(-1 / (2 * mp.mpf(b))))  # TV(Lap(0, b), Lap(1, b)) = 1 - e^{-1/(2b)}
    lo_t, hi_t = _identity_bracket(delta, tv)
    for kw in (dict(), dict(q=0.01, sampling="poisson")):
        iv = pldlib.account(pldlib.Laplace(scale=b, **kw), steps=steps).epsilon(delta)
        assert mp.mpf(float(iv.lower)) <= lo_t and hi_t <= mp.mpf(float(iv.upper)) <= 0


@pytest.mark.parametrize("mech", [
    lambda: pldlib.Gaussian(sigma=1e-300, q=0.01, sampling="poisson"),
    lambda: pldlib.Gaussian(sigma=1e-160, q=1e-300, sampling="poisson"),
    lambda: pldlib.Laplace(scale=1e-300),
    lambda: pldlib.Laplace(scale=1e-300, q=0.01, sampling="poisson"),
])
def test_vanishing_noise_is_a_documented_precision_error(mech):
    with pytest.raises(LossRangeError, match="use more noise"):
        pldlib.account(mech(), steps=10).epsilon(1e-5)


def test_gaussian_noise_in_units_of_sigma_matches_the_closed_form():
    # beyond 1e100 the noise is described in units of sigma (same pair, D / sigma = 1 here):
    # the remove pair's delta against its closed form, q = 0.1 (docs/MATH.md section 2)
    from pldlib.profiles.mixtures import GaussianNoise, poisson_remove

    q = mp.mpf("0.1")
    prof = poisson_remove(GaussianNoise(1e120, 1e120), 0.1)
    for eps in (0.1, 1.0, 3.0):
        e = mp.mpf(eps)
        x = mp.log((mp.exp(e) - (1 - q)) / q) + mp.mpf(1) / 2  # {L > eps} = {x > x_eps}
        truth = (1 - q) * mp.ncdf(-x) + q * mp.ncdf(-(x - 1)) - mp.exp(e) * mp.ncdf(-x)
        assert abs(float(prof.delta(eps)) / float(truth) - 1) < 1e-12


def _gauss_delta(mu, eps):
    mu, eps = mp.mpf(mu), mp.mpf(eps)
    return mp.ncdf(-eps / mu + mu / 2) - mp.exp(eps) * mp.ncdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("epsilon, delta, steps", [(1e-6, 1e-12, 10**6), (1e-12, 1e-300, 10**6)])
def test_calibrate_extreme_targets_meet_the_closed_form(epsilon, delta, steps):
    # issue 40 item 4: the Gaussian-DP seed's root finder raised "f(a) and f(b) must have
    # different signs"; the sigma found must meet the target by the closed form (unsampled:
    # mu = sqrt(steps) / sigma), and sigma_lower must not
    r = pldlib.calibrate(epsilon, delta, q=1.0, steps=steps)
    assert _gauss_delta(mp.sqrt(steps) / mp.mpf(r.sigma), epsilon) <= delta
    if r.sigma_lower is not None:
        assert _gauss_delta(mp.sqrt(steps) / mp.mpf(r.sigma_lower), epsilon) > delta


def test_cli_answers_huge_sigma_and_extreme_calibration(capsys):
    from pldlib.cli import main

    assert main(["epsilon", "--mechanism", "gaussian", "--sigma", "1e300", "--q", "0.01", "--steps", "10",
                 "--delta", "1e-5", "--json"]) == 0
    import json

    row = json.loads(capsys.readouterr().out)["epsilon"][0]
    assert row["lower"] <= math.log1p(-1e-5) <= row["upper"] <= 0
    assert main(["calibrate", "--epsilon", "1e-6", "--delta", "1e-12", "--q", "1", "--steps", "1000000",
                 "--no-table"]) == 0
    text = capsys.readouterr()
    assert "different signs" not in text.out + text.err


def test_calibrate_search_is_not_stopped_by_a_refused_sigma():
    # a start far below the answer (sigma 1e-3: one step's loss beyond e^700) used to raise
    # LossRangeError ("use more noise"); a refused sigma is a lower end of the search.  The
    # certified accountant is the reference: sigma meets the target, sigma_lower does not
    r = pldlib.calibrate(1.0, 1e-5, q=0.01, steps=100, sigma_guess=1e-3)
    m = pldlib.Gaussian(sigma=r.sigma, q=0.01, sampling="poisson")
    assert pldlib.account(m, steps=100, spacing=r.spacing).epsilon(1e-5).upper <= 1.0
    assert r.sigma_lower is not None and r.sigma / r.sigma_lower <= 1 + 1e-3 + 1e-9
    m = pldlib.Gaussian(sigma=r.sigma_lower, q=0.01, sampling="poisson")
    assert pldlib.account(m, steps=100, spacing=r.spacing).epsilon(1e-5).lower > 1.0


def test_calibrate_sharpens_only_answers_that_straddle_the_target(monkeypatch):
    # a search evaluation wholly above or below the target needs no sharpening (the search learns
    # its side from the first answer): the start far below used to spend the whole 10 s budget on
    # the saddle-point bounds of an answer that was nowhere near the target
    from pldlib.methods.pld import PLDAccountant

    seen = []
    real = PLDAccountant._sharpen

    def spy(self, kind, x, lo, up, t_start, **kw):
        if not self.__dict__.get("_sharpening"):
            seen.append((float(lo[0]), float(up[0])))
        return real(self, kind, x, lo, up, t_start, **kw)

    monkeypatch.setattr(PLDAccountant, "_sharpen", spy)
    r = pldlib.calibrate(1.0, 1e-5, q=0.01, steps=100, sigma_guess=1e-3)
    assert r.sigma_lower is not None and r.sigma / r.sigma_lower <= 1 + 1e-3 + 1e-9
    assert all(lo <= 1.0 < up for lo, up in seen), seen


def test_calibration_beyond_the_grid_names_the_target():
    with pytest.raises(pldlib.GridTooLargeError, match=r"calibration to epsilon=1e-06, delta=1e-12"):
        pldlib.calibrate(1e-6, 1e-12, q=0.01, steps=1000)
