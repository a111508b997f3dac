"""Noise calibration to attack targets (docs/MATH.md section 10.3).

``calibrate_attack(tpr_at_fpr=(tpr, fpr))`` or ``calibrate_attack(advantage=a)`` finds the
smallest Gaussian noise multiplier whose *certified* trade-off curve meets the target:
the certified upper bound on the true-positive rate of any membership test at
false-positive rate ``fpr`` (resp. on the advantage max_alpha 1 - alpha - beta(alpha)) is
at most the target.  ``pldlib.calibrate(..., tpr_at_fpr=..., advantage=...)`` dispatches here.

Both figures decrease as sigma grows (a larger sigma is a post-processing of a smaller
one, for every sampling scheme and relation; MATH.md 9.2), so the search brackets the
answer with certified decisions only (upper <= target: feasible; lower > target:
infeasible) and bisects on log sigma.  Helpers give the (epsilon, delta) a user would
derive for the same attack bound from the (eps, delta)-DP trade-off
f(alpha) = max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from scipy import special

from . import _validate as V
from .methods.base import Interval
from .sampling import sampling_names

__all__ = ["calibrate_attack", "AttackCalibrationResult", "epsilon_for_tpr", "epsilon_for_advantage"]


@dataclass
class AttackCalibrationResult:
    """Calibrated sigma for an attack target.

    sigma : smallest sigma found whose certified upper metric <= target
    value : certified interval of the metric (TPR at the FPR, or advantage) at ``sigma``
    sigma_lower : a sigma whose certified *lower* metric exceeds the target (the optimum
        lies in (sigma_lower, sigma]); None if not certified
    spacing : grid spacing h of the PLD evaluation that certified ``sigma`` (re-check with
        ``account(..., spacing=spacing)``; the default spacing may be coarser)
    """

    sigma: float
    value: Interval
    sigma_lower: float | None
    metric: str
    target: float
    seconds: float
    evaluations: int
    spacing: float = math.nan
    params: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    #: a sigma just below ``sigma`` that the accountant refuses (single-step loss beyond floating
    #: point): then every sigma it could certify met the target and ``sigma`` is the smallest
    #: certifiable one (to tol), not a certified optimum; None otherwise
    sigma_refused: float | None = None

    def as_dict(self) -> dict:
        return {"sigma": self.sigma, "metric": self.metric, "target": self.target,
                "value": {"lower": float(self.value.lower), "upper": float(self.value.upper)},
                "sigma_lower": self.sigma_lower, "sigma_refused": self.sigma_refused, "seconds": self.seconds,
                "evaluations": self.evaluations, "spacing": self.spacing, "params": self.params}

    @property
    def interval(self) -> float:
        """The older name of :attr:`spacing` (deprecated: an *interval* is an answer)."""
        import warnings

        warnings.warn("interval is the older name of the grid spacing: use .spacing", DeprecationWarning, stacklevel=2)
        return self.spacing


def epsilon_for_tpr(tpr: float, fpr: float, delta: float) -> float:
    """The largest eps whose (eps, delta)-DP trade-off bounds the TPR at ``fpr`` by ``tpr``:
    solves min(delta + e^eps fpr, 1 - e^-eps (1 - delta - fpr)) = tpr (0 if even eps = 0 fails)."""
    from scipy import optimize

    def implied(eps):
        return min(delta + math.exp(eps) * fpr, 1.0 - math.exp(-eps) * (1.0 - delta - fpr))

    if implied(0.0) > tpr:
        return 0.0
    hi = 1.0
    while implied(hi) <= tpr:
        hi *= 2.0
        if hi > 1e3:
            return math.inf
    return optimize.brentq(lambda e: implied(e) - tpr, 0.0, hi, xtol=1e-12)


def epsilon_for_advantage(advantage: float, delta: float) -> float:
    """The eps with (e^eps - 1 + 2 delta) / (e^eps + 1) = advantage (the advantage bound of
    (eps, delta)-DP), 0 if delta alone exceeds it."""
    x = (1.0 + advantage - 2.0 * delta) / (1.0 - advantage)
    return math.log(x) if x > 1.0 else 0.0


def _seed(mu: float, q: float, steps: int, samp: str, relation: str) -> float:
    """Gaussian-DP (CLT) seed: mu = q sqrt(k (e^{1/s^2} - 1)), or sqrt(k)/s unsampled (an ESTIMATE)."""
    mu = max(mu, 1e-6)
    if q >= 1.0:
        s = math.sqrt(steps) / mu
    else:
        s = 1.0 / math.sqrt(math.log1p((mu / (q * math.sqrt(steps))) ** 2))
    if samp == "wor" or (relation == "substitution" and samp != "poisson"):
        s *= 2.0
    return s


def calibrate_attack(q: float = 1.0, steps: int | None = None, *, tpr_at_fpr=None, advantage=None,
                     sampling: str = "poisson", relation: str = "add_remove", tol: float = 1e-3,
                     sigma_guess: float | None = None, max_evaluations: int = 40) -> AttackCalibrationResult:
    """Smallest Gaussian noise multiplier whose certified attack bound meets the target.

    Parameters
    ----------
    q, steps, sampling, relation : as :func:`pldlib.calibrate`
    tpr_at_fpr : (tpr, fpr): the certified upper bound on the TPR of any membership test at
        FPR ``fpr`` must be <= ``tpr`` (0 < fpr < tpr < 1)
    advantage : a in (0, 1): the certified upper bound on max_alpha (1 - alpha - beta(alpha))
        must be <= a
    tol : relative tolerance on sigma (sigma / sigma_lower <= 1 + tol when certified)

    Returns
    -------
    AttackCalibrationResult (sigma certified: its accountant's upper metric <= target)

    A sigma the accountant refuses (too little noise: :class:`pldlib.PrecisionLimitError`,
    :class:`pldlib.GridTooLargeError`) is a lower end of the search, not a failure: when every
    certifiable sigma meets the target, the smallest certifiable one is returned with
    ``sigma_refused`` set.  A target no sigma within the evaluation budget certifies raises
    :class:`pldlib.CalibrationError` naming the target and the metric reached.
    """
    from ._validate import CalibrationError
    from .mechanisms import Gaussian
    from .methods.pld import account

    t0 = time.perf_counter()
    if steps is None:
        raise TypeError("steps: required: the number of compositions (e.g. DP-SGD iterations); "
                        "pass steps=1 for a single release")
    if (tpr_at_fpr is None) == (advantage is None):
        raise ValueError("tpr_at_fpr/advantage: give exactly one attack target")
    if tpr_at_fpr is not None:
        try:
            tpr, fpr = tpr_at_fpr
        except (TypeError, ValueError):
            raise TypeError(f"tpr_at_fpr: must be a pair (tpr, fpr), got {V.fmt(tpr_at_fpr)}") from None
        tpr = V.probability_open("tpr_at_fpr[0] (tpr)", tpr)
        fpr = V.probability_open("tpr_at_fpr[1] (fpr)", fpr)
        if not tpr > fpr:
            raise ValueError(f"tpr_at_fpr: the target tpr must exceed the fpr (a random test reaches tpr = fpr), "
                             f"got ({V.fmt(tpr)}, {V.fmt(fpr)})")
        metric, target = f"tpr@fpr={fpr:g}", tpr
        mu_seed = float(special.ndtri(tpr) - special.ndtri(fpr))
    else:
        target = V.probability_open("advantage", advantage)
        metric = "advantage"
        mu_seed = float(2.0 * special.ndtri(0.5 * (1.0 + target)))
    q = V.sampling_rate("q", q)
    steps = V.steps("steps", steps)
    V.choice("sampling", sampling, sampling_names())
    V.choice("relation", relation, V.RELATIONS)
    tol = V.positive_finite("tol", tol)
    samp = "none" if q == 1.0 else sampling
    history: list = []

    def evaluate(sigma: float, h=None):
        acc = account(Gaussian(sigma=sigma, q=q, sampling=samp, relation=relation), steps=steps, spacing=h)
        iv = acc.max_tpr(fpr) if advantage is None else acc.advantage()
        history.append((sigma, acc.spacing, float(iv.lower), float(iv.upper)))
        return Interval(float(iv.lower), float(iv.upper)), acc.spacing

    lo_s = hi_s = hi_iv = hi_h = refused = None
    n = 0
    reached = []  # (sigma, certified upper metric) of the evaluations

    def decide(sigma):
        """Evaluate; refine the grid (twice at most) while the target is inside the interval.
        A sigma the accountant refuses (too little noise to certify) is not feasible."""
        nonlocal lo_s, hi_s, hi_iv, hi_h, n, refused
        n += 1
        try:
            iv, h = evaluate(sigma)
        except (V.PrecisionLimitError, V.GridTooLargeError):
            if refused is None or sigma > refused:
                refused = sigma
            return False
        for _ in range(2):
            if iv.upper <= target or iv.lower > target:
                break
            iv, h = evaluate(sigma, 0.5 * h)
            n += 1
        reached.append((sigma, iv.upper))
        if iv.upper <= target:
            if hi_s is None or sigma < hi_s:
                hi_s, hi_iv, hi_h = sigma, iv, h
            return True
        if iv.lower > target and (lo_s is None or sigma > lo_s):
            lo_s = sigma
        return False  # infeasible, or not certified feasible

    s = V.positive_finite("sigma_guess", sigma_guess) if sigma_guess is not None else _seed(
        mu_seed, q, steps, samp, relation)
    # bracket: [not feasible, feasible], by factors 1.25, 1.25^2, 1.25^4, ... (at most 16)
    a = b = None
    step = 1.25
    if decide(s):
        b = s
        while a is None and n < max_evaluations:
            s /= step
            step = min(step * step, 16.0)
            if decide(s):
                b = s
            else:
                a = s
    else:
        a = s
        while b is None and n < max_evaluations and s < 1e250:
            s *= step
            step = min(step * step, 16.0)
            if decide(s):
                b = s
            else:
                a = s
    if b is None:
        best = min(reached, key=lambda t: t[1]) if reached else None
        got = (f"; the smallest certified upper {metric} found is {best[1]!r} (at sigma = {best[0]:.6g})"
               if best else "")
        raise CalibrationError(f"calibration to {metric} <= {V.fmt(target)}: no certified sigma found within "
                               f"{n} evaluations (sigma up to {s:.3g}){got}; the target is too close to "
                               "what a random test reaches")
    while n < max_evaluations and b / a > 1.0 + tol:
        m = math.sqrt(a * b)
        if decide(m):
            b = m
        else:
            a = m
    return AttackCalibrationResult(
        sigma_refused=None if refused is None or refused < a * (1 - 1e-12) else float(refused),
        sigma=float(hi_s), value=hi_iv, sigma_lower=None if lo_s is None else float(lo_s), metric=metric,
        target=float(target), seconds=time.perf_counter() - t0, evaluations=n, spacing=float(hi_h),
        params={"q": q, "steps": steps, "sampling": samp, "relation": relation, "tol": tol,
                "tpr_at_fpr": None if tpr_at_fpr is None else [float(tpr), float(fpr)],
                "advantage": None if advantage is None else float(target)},
        history=history)
