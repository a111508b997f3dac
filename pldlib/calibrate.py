"""Certified noise calibration: the smallest sigma that meets an (epsilon, delta) target.

eps(delta) is decreasing in sigma (docs/MATH.md section 9), so calibration is a
one-dimensional root search on log sigma.  Every evaluation returns a certified
interval [lower, upper] for eps at that sigma, and every decision is
certified:

* ``upper <= target``  -> sigma is feasible: it becomes the right end ``sigma_hi``;
* ``lower >  target``  -> sigma is infeasible for the true curve: the left end ``sigma_lo``;
* otherwise the target lies inside the interval: the accuracy is refined
  (spacing h halved, width ~ h^2) and sigma re-evaluated.

The search stops when sigma_hi / sigma_lo <= 1 + tol, so the returned sigma is
certified (its upper eps meets the target) AND within ``tol`` of the true
smallest sigma (which lies in (sigma_lo, sigma_hi]).  Steering uses secant
steps on (log sigma, log eps), seeded by a Gaussian-DP (CLT) estimate or
the eps atlas's estimate, so typical calls need a handful of evaluations.  (The
saddle-point accountant would be a closer seed, but its CGF tabulation per sigma
costs more than a whole calibration.)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from . import _validate as V
from ._validate import CalibrationError
from .methods.pld import Interval, account
from .mechanisms import Gaussian
from .profiles.base import LossRangeError

__all__ = ["calibrate", "CalibrationResult", "CalibrationError", "get_noise_multiplier", "seed_sigma"]


#: the connect-the-dots upper bound's excess over the truth, as a share of the interval
#: width (about 0.18 measured by Richardson extrapolation; used only to choose the grid
#: spacing when no infeasibility certificate is asked for)
UPPER_EXCESS_SHARE = 0.25


#: largest target epsilon :func:`calibrate` accepts (beyond it the noise is so small that single
#: steps leave the certifiable range; 200 is reached at q = 1 and at q = 0.01 over 100 steps)
MAX_EPSILON = 200.0
#: accepted range of the relative tolerance ``tol`` on sigma
TOL_RANGE = (1e-8, 0.1)


def _dp_target(epsilon, delta, q, steps, sampling, relation) -> tuple:
    """Validated ``(epsilon, delta, q, steps, sampling, relation)`` of a calibration or look-up."""
    from .sampling import sampling_names

    out = (V.positive_finite("epsilon", epsilon), V.probability_open("delta", delta), V.sampling_rate("q", q),
           V.steps("steps", steps), V.choice("sampling", sampling, sampling_names()),
           V.choice("relation", relation, V.RELATIONS))
    if out[4] == "none" and out[2] != 1.0:
        raise ValueError(f"q must be 1 when sampling is 'none' (got q={out[2]!r})")
    return out


class _Refused(Exception):
    """An evaluation the accountant refused: too little noise to certify (internal to the search)."""

    def __init__(self, sigma: float, exc: Exception):
        super().__init__(f"sigma={sigma:.6g}: {exc}")
        self.sigma, self.exc = sigma, exc


@dataclass
class CalibrationResult:
    """Calibrated noise multiplier with its certificate.

    Attributes
    ----------
    sigma : smallest sigma found whose certified upper eps <= target
    epsilon : certified eps interval at ``sigma``
    sigma_lower : a sigma whose certified *lower* eps exceeds the target (the true
        optimum lies in (sigma_lower, sigma]); None if the search could not certify it
    spacing : grid spacing h of the PLD evaluation that certified ``sigma``
    """

    sigma: float
    epsilon: Interval
    sigma_lower: float | None
    seconds: float
    evaluations: int
    spacing: float
    params: dict = field(default_factory=dict)
    #: (sigma, spacing, eps lower, eps upper) per evaluation (left out of the repr: it is long)
    history: list = field(default_factory=list, repr=False)
    seed: str = "gdp"

    def as_dict(self) -> dict:
        return {
            "sigma": self.sigma,
            "epsilon": {"lower": float(self.epsilon.lower), "upper": float(self.epsilon.upper)},
            "sigma_lower": self.sigma_lower,
            "seconds": self.seconds,
            "evaluations": self.evaluations,
            "spacing": self.spacing,
            "params": self.params,
            "seed": self.seed,
        }

    @property
    def interval(self) -> float:
        """The older name of :attr:`spacing` (deprecated: an *interval* is an answer)."""
        import warnings

        warnings.warn("interval is the older name of the grid spacing: use .spacing", DeprecationWarning, stacklevel=2)
        return self.spacing


def _gdp_sigma(epsilon, delta, q, steps) -> float:
    """Seed: the sigma at which the CLT/GDP estimate meets the target (an estimate only)."""

    def gdp_delta(mu):
        # e^eps Phi(b) in log space: e^eps alone overflows for eps > 709
        return special.ndtr(-epsilon / mu + mu / 2) - math.exp(min(epsilon + special.log_ndtr(-epsilon / mu - mu / 2),
                                                                   700.0))

    # mu needed: gdp_delta increases in mu, from 0 (mu -> 0) to 1; bracketed by expanding
    # (targets far from mu ~ 1, e.g. epsilon = 1e-6 and delta = 1e-12, need mu ~ 1e-12)
    lo, hi = 1e-6, 100.0
    if gdp_delta(hi) < delta:
        return 1.0
    while gdp_delta(lo) >= delta and lo > 1e-300:
        lo *= 1e-6
    if not gdp_delta(lo) < delta:
        return 1.0  # (an estimate only: the search moves on from any start)
    # bisection on log mu (a root finder's own convergence errors must not reach the user: where
    # the difference above cancels, any point of the bracket is as good a seed)
    for _ in range(200):
        if hi / lo <= 1.0 + 1e-12:
            break
        m = math.sqrt(lo * hi)
        if gdp_delta(m) < delta:
            lo = m
        else:
            hi = m
    mu = math.sqrt(lo * hi)
    if q >= 1.0:
        return math.sqrt(steps) / mu
    # mu = q sqrt(k (e^{1/sigma^2} - 1))
    x = (mu / (q * math.sqrt(steps))) ** 2
    return 1.0 / math.sqrt(math.log1p(x))


#: the h^2 constant of the spacing rule for calibration's upper-only searches (the accountant's
#: default is finer, docs/MATH.md 5.1; a search evaluates many sigmas and refines near the answer)
UPPER_RULE_C = 0.0067


def upper_interval(mechanism, steps: int) -> float:
    """Grid spacing aimed at the *upper* bound: the accountant's default rule
    (:func:`pldlib.methods.pld_grid._rule_interval`) without its support-edge term (which
    forces grids of ~1e5-1e6 points per step for q ~ 1e-4) and with the h^2 constant
    UPPER_RULE_C; upper bounds stay certified and tight at this spacing, lower bounds may be loose.
    """
    from .methods.pld_grid import _rule_interval, _step_stats

    components = [(mechanism, steps)]
    return _rule_interval(_step_stats(components, [mechanism.branches()]), [steps], edge_factor=None,
                          c=UPPER_RULE_C)[0]


def seed_sigma(epsilon: float, delta: float, q: float, steps: int, sampling: str = "poisson",
               relation: str = "add_remove") -> float:
    """A starting sigma from the Gaussian-DP (CLT) estimate -- an ESTIMATE, used only to steer.

    WOR add/remove uses sensitivity 2 (twice the sigma); substitution without
    Poisson sampling also doubles the sensitivity.
    """
    s = _gdp_sigma(epsilon, delta, q, steps)
    if sampling == "wor" and q < 1.0:
        s *= 2.0
    if relation == "substitution" and not (sampling == "poisson" and q < 1.0):
        s *= 2.0
    return s


def calibrate(epsilon: float | None = None, delta: float | None = None, q: float = 1.0, steps: int | None = None, *,
              sampling: str = "poisson",
              relation: str = "add_remove", tol: float = 1e-3, sigma_guess: float | None = None,
              spacing: float | None = None, table=None, max_evaluations: int = 60,
              certify_lower: bool | None = None, tpr_at_fpr=None, advantage=None,
              group: int = 1, interval: float | None = None, selections: int = 1) -> CalibrationResult:
    """Smallest Gaussian noise multiplier sigma whose certified eps(delta) <= epsilon.

    With ``tpr_at_fpr=(tpr, fpr)`` or ``advantage=a`` instead of (epsilon, delta), the
    target is an attack bound on the certified trade-off curve (docs/MATH.md 10.3):
    dispatched to :func:`pldlib.attack.calibrate_attack`, which returns an
    :class:`~pldlib.attack.AttackCalibrationResult`.

    Parameters
    ----------
    epsilon, delta : the target (eps in (0, 200], delta in (0, 1))
    q : sampling probability in (0, 1]; q = 1 means no subsampling
    steps : number of compositions (required: there is no default, since forgetting it
        would silently calibrate a single step)
    sampling : 'poisson' or 'wor' (ignored when q = 1)
    relation : 'add', 'remove', 'add_remove' or 'substitution'
    tol : relative tolerance on sigma, in [1e-8, 0.1] (the result is within tol of the true optimum
        when ``sigma_lower`` is not None and ``sigma / sigma_lower <= 1 + tol``, which is
        the normal outcome; a ``sigma_lower`` further away still bounds the optimum)
    sigma_guess : optional starting point (else the atlas's estimate or the GDP estimate)
    spacing : starting grid spacing of the PLD accountant (refined as needed; ``interval`` is
        its older name)
    table : an opened eps atlas (:func:`pldlib.atlas.open_atlas`: its interpolated estimate,
        capped by its certified sigma, seeds the search when it covers the query)
    certify_lower : also certify that sigma / (1 + tol) does NOT meet the target (the
        proof that the answer is within tol of the optimum; costs one or two more
        evaluations).  None (default): certify it unless that alone would force a grid
        at least 2x finer than the upper bound needs (small q: the optimistic side needs
        ``h <= |ln(1 - q)| / 2``, docs/MATH.md 5.1); then ``sigma_lower`` is None.
        With False the answer is still certified feasible, ``sigma_lower``
        may be None, and the search stops once the upper curve's root is located to tol/8;
        its fine evaluations then build the pessimistic side only (about half the work) on a
        grid chosen for the upper bound's accuracy, and the returned interval's lower bound
        comes from one full evaluation at 4x that spacing.
    group : user-level calibration: the protected unit is a user with up to ``group`` records
        (docs/MATH.md 13.1; 'poisson' or 'wor' sampling, or none; not substitution)
    selections : ``sampling='random_allocation'`` only: every record in k = ``selections`` of the
        t = k/q steps of each epoch (docs/MATH.md 13.8)

    Returns
    -------
    CalibrationResult
    """
    if steps is None:  # no silent 1-step default: a DP-SGD user who forgets it gets far too little noise
        raise TypeError("steps: required: the number of compositions (e.g. DP-SGD iterations); "
                        "pass steps=1 for a single release")
    group = V.positive_int("group", group)
    selections = V.positive_int("selections", selections)
    spacing = V.spacing_option(spacing, interval)
    if tpr_at_fpr is not None or advantage is not None:
        if group > 1:
            raise ValueError("group: attack-target calibration is example-level only (group = 1)")
        if selections > 1:
            raise ValueError("selections: attack-target calibration takes one selection per epoch (selections = 1)")
        if epsilon is not None or delta is not None:
            raise ValueError("epsilon/delta: give either (epsilon, delta) or an attack target "
                             "(tpr_at_fpr or advantage), not both")
        from .attack import calibrate_attack

        return calibrate_attack(q, steps, tpr_at_fpr=tpr_at_fpr, advantage=advantage, sampling=sampling,
                                relation=relation, tol=tol, sigma_guess=sigma_guess)
    t0 = time.perf_counter()
    if epsilon is None or delta is None:
        raise TypeError("epsilon, delta: required (or give an attack target: tpr_at_fpr or advantage)")
    epsilon = V.positive_finite("epsilon", epsilon)
    if epsilon > MAX_EPSILON:
        raise ValueError(f"epsilon: must be <= {MAX_EPSILON:g} for calibration, got {V.fmt(epsilon)}: a larger "
                         "target needs noise so small that one step's privacy loss leaves the range that can be "
                         "certified in floating point (e^700) or the grid exceeds max_bins")
    epsilon, delta, q, steps, sampling, relation = _dp_target(epsilon, delta, q, steps, sampling, relation)
    tol = V.positive_finite("tol", tol)
    if not (TOL_RANGE[0] <= tol <= TOL_RANGE[1]):
        raise ValueError(f"tol: must be in [{TOL_RANGE[0]:g}, {TOL_RANGE[1]:g}] (a relative tolerance on sigma: "
                         f"below, floating point and grid round-off decide; above, the answer may be far from "
                         f"the optimum), got {V.fmt(tol)}")
    samp = "none" if q == 1.0 else sampling

    def mech(sigma):
        return Gaussian(sigma=sigma, q=q, sampling=samp, relation=relation, group=group, selections=selections)

    mech(1.0).branches()  # refuses an unsupported combination (e.g. group > 1 with substitution) up front
    seed, seed_kind = None, "gdp"
    if sigma_guess is not None:
        seed, seed_kind = V.positive_finite("sigma_guess", sigma_guess), "guess"
    elif group > 1:  # tables and atlases are example-level: the GDP seed of a group-sized sensitivity
        seed = group * seed_sigma(epsilon, delta, q, steps, samp, relation)
    elif table is not None and samp != "none" and selections == 1:  # an eps atlas (pldlib.atlas)
        if not hasattr(table, "sigma_for") or not hasattr(table, "tables"):
            raise TypeError(f"table: an eps atlas (pldlib.atlas.open_atlas(path)), got {type(table).__name__}")
        try:
            ans = table.sigma_for(epsilon, delta, q, steps, samp, relation)
            if math.isfinite(ans.estimate):
                # the interpolated estimate, capped by the atlas's certified sigma
                seed, seed_kind = min(ans.estimate, ans.sigma) if math.isfinite(ans.sigma) else ans.estimate, "atlas"
        except ValueError:
            seed = None
    if seed is None:
        seed = seed_sigma(epsilon, delta, q, steps, samp, relation)
    history: list = []

    def evaluate(sigma: float, h: float | None, lower_bound: bool = True):
        """Certified eps interval at sigma; :class:`_Refused` where the accountant refuses sigma as
        too little noise (single-step loss beyond e^700): a lower end of the search, not an answer."""
        try:
            acc = account(mech(sigma), steps=steps, spacing=h, lower_bound=lower_bound)
            # a wide answer is sharpened (docs/MATH.md 5.9) only where it straddles the target: on
            # either side of it, the search learns all it needs from the first answer
            acc._sharpening = True
            iv = acc.epsilon(delta)
            acc._sharpening = False
            if float(iv.lower) <= epsilon < float(iv.upper):
                iv = acc.epsilon(delta)
        except LossRangeError as exc:
            raise _Refused(sigma, exc) from None
        except V.GridTooLargeError as exc:  # (its class kept; the message names the target)
            exc.args = (f"calibration to epsilon={V.fmt(epsilon)}, delta={V.fmt(delta)} (q={V.fmt(q)}, "
                        f"steps={steps}) at sigma={sigma:.6g}: {exc}; a target this small is beyond the "
                        "resolution the grid can certify (a larger epsilon or delta, or fewer steps, is)",)
            raise
        history.append((sigma, acc.spacing, float(iv.lower), float(iv.upper)))
        return iv, acc.spacing

    def mid(v):
        """The point the search steers by: the interval's middle, or its upper end when the
        lower end says nothing (upper-only evaluations, or an optimistic side too coarse)."""
        lo_v, up_v = float(v.lower), float(v.upper)
        return max(0.5 * (lo_v + up_v) if lo_v > 0.5 * up_v else up_v, 1e-300)
    lo_s = hi_s = hi_iv = None

    def record(sig, v):
        nonlocal lo_s, hi_s, hi_iv
        if float(v.upper) <= epsilon and (hi_s is None or sig < hi_s):
            hi_s, hi_iv = sig, v
        elif float(v.lower) > epsilon and (lo_s is None or sig > lo_s):
            lo_s = sig

    # Phase 1 -- locate the root with coarse, cheap evaluations (secant on log-log midpoints).
    n_eval = 0
    floor = None  # the largest sigma the accountant refused (too little noise to certify)
    user_lower = certify_lower
    while True:  # (a seed the accountant refuses moves up 4x: a lower end, not an answer)
        try:
            first = spacing
            small_q = False  # the optimistic side alone would force a much finer grid
            if spacing is None and q < 1.0:
                # tiny q: the default grid resolves |ln(1-q)| for the lower bound only; when that
                # makes it >= 2x finer than the upper bound needs, start from the upper-bound rule
                try:
                    h_u = upper_interval(mech(seed), steps)
                except LossRangeError as exc:
                    raise _Refused(seed, exc) from None
                if 0.5 * abs(math.log1p(-q)) < 0.5 * h_u:
                    first = h_u
                    small_q = True
            certify_lower = (not small_q) if user_lower is None else user_lower
            # upper-only evaluations while locating the root where the lower bound would be useless
            coarse_lower = not (small_q and not certify_lower)
            iv, h_def = evaluate(seed, first, lower_bound=coarse_lower)
            n_eval += 1
            break
        except _Refused as r:
            n_eval += 1
            if n_eval >= max_evaluations:
                raise CalibrationError(f"calibration to epsilon={V.fmt(epsilon)}, delta={V.fmt(delta)}: every sigma "
                                       f"tried up to {seed:.6g} is refused ({r.exc})") from None
            floor, seed = seed, seed * 4.0
    h = h_def if spacing is not None else h_def * 2.0
    pts = [(seed, iv)]
    record(seed, iv)
    s = seed
    for _ in range(8):
        (s1, v1) = pts[-1]
        if len(pts) == 1:
            slope = -2.0  # eps ~ sigma^-2 far from the transition
        else:
            s0, v0 = pts[-2]
            den = math.log(s1) - math.log(s0)
            slope = (math.log(mid(v1)) - math.log(mid(v0))) / den if den else -2.0
            if not (slope < -0.05):
                slope = -2.0
        r = math.exp(math.log(s1) + (math.log(epsilon) - math.log(mid(v1))) / slope)
        r = min(max(r, s1 / 4.0), s1 * 4.0)
        if abs(math.log(r / s1)) < 0.25 * tol and len(pts) > 1:
            s = r
            break
        if floor is not None and r <= floor:
            r = min(2.0 * floor, s1) if s1 > floor else 2.0 * floor
            if r == s1:
                break
        try:
            iv, _ = evaluate(r, h, lower_bound=coarse_lower)
        except _Refused:
            n_eval += 1
            floor = max(floor or 0.0, r)
            continue
        n_eval += 1
        pts.append((r, iv))
        record(r, iv)
        s = r
        if abs(math.log(mid(iv) / epsilon)) < 0.05 * tol * abs(slope):
            break
    # the width of an eps interval scales like h^2: pick h so that the interval is
    # narrower than the eps change over a sigma step of tol/4 (then the roots of the
    # upper and of the lower curve are within tol/4 of each other)
    slope_abs = abs(slope) if slope < -0.05 else 2.0
    need = 0.25 * slope_abs * epsilon * tol
    width_now = float(pts[-1][1].upper - pts[-1][1].lower)
    # split the width into a part that shrinks like h^2 and a structural part that does
    # not (w = a + b h^2, from the first evaluation at h_def and the last at 2 h_def): a
    # structurally loose lower bound (WOR substitution) must not drive h to tiny values
    # (relative widths, since the two evaluations are at different sigmas)
    r1 = float(pts[0][1].upper - pts[0][1].lower) / mid(pts[0][1])
    r2 = width_now / mid(pts[-1][1])
    structural = 0.0
    # relative widths also change with sigma: compare them only when the two sigmas are
    # close, or where a structurally loose lower bound is known (WOR substitution: the
    # max-profile upper bound against the remove-at-2D lower bound)
    comparable = (len(pts) > 1 and abs(math.log(pts[-1][0] / pts[0][0])) < 0.1) or (
        samp == "wor" and relation == "substitution")
    if (comparable and len(pts) > 1 and spacing is None and math.isfinite(r1) and math.isfinite(r2)
            and r1 > 0):
        a_rel = max(r1 - max(r2 - r1, 0.0) / 3.0, 0.0)
        if a_rel > 0.25 * r1:  # under h^2 scaling r2 ~ 4 r1, so a_rel ~ 0
            structural = a_rel * mid(pts[-1][1])
        if structural > 0.5 * need:
            certify_lower = False  # the infeasibility certificate is out of reach at any h
    if not coarse_lower:
        # upper-only search: the upper bound's excess over the truth at spacing h, from one
        # more evaluation at h / 2 (connect-the-dots excess ~ c h^2: excess(h) ~ 4/3 (U(h) - U(h/2)));
        # a steering estimate only -- every returned sigma is checked by an evaluation
        s_last, v_last = pts[-1]
        v_half, _ = evaluate(s_last, 0.5 * h, lower_bound=False)
        n_eval += 1
        record(s_last, v_half)
        excess = 4.0 / 3.0 * max(float(v_last.upper) - float(v_half.upper), 0.0)
        if excess > need:
            h *= max(0.9 * math.sqrt(need / excess), 0.05)
        else:
            h *= 0.5  # the half-spacing evaluation already meets the need
        pts.append((s_last, v_half))
    elif structural > 0.5 * need:
        h *= 0.5  # back to the default spacing: only the upper bound's accuracy matters now
    elif not certify_lower:
        # only the upper bound steers: its excess over the truth is ~18% of the interval
        # width (connect-the-dots vs the optimistic hull; measured across Poisson, WOR,
        # substitution and plain Gaussians), so aim the excess, not the width, at `need`
        excess = UPPER_EXCESS_SHARE * width_now
        if excess > need:
            h *= 0.9 * math.sqrt(need / excess)
    elif width_now > need:
        h *= 0.9 * math.sqrt(need / width_now)
    # Phase 2 -- certify at spacing h.  Secant steps on log(upper) aim just inside the
    # feasible side (upper = target * (1 - tol*slope/8)); once a feasible sigma_hi is
    # certified, sigma_hi / (1 + tol) is evaluated for the infeasibility certificate.
    aim = math.log(epsilon) - 0.125 * tol * slope_abs
    fine: list = []  # (log sigma, log upper) at spacing h
    r = s
    ambiguous = 0
    amb_width = None
    fallback = (hi_s, hi_iv)
    if hi_s is not None and hi_s > r * (1 + 2 * tol):
        hi_s = None  # certified but far above the located root: look near the root first
    while n_eval < max_evaluations:
        if hi_s is not None and lo_s is not None and hi_s / lo_s <= 1.0 + tol * (1 + 1e-9):
            break
        if hi_s is None:
            if len(fine) >= 2:  # secant on the fine upper curve
                (x0, y0), (x1, y1) = fine[-2], fine[-1]
                sl = (y1 - y0) / (x1 - x0) if x1 != x0 else -slope_abs
                if not sl < -0.05:
                    sl = -slope_abs
                cand = math.exp(x1 + (aim - y1) / sl)
                ref = math.exp(x1)
            elif len(fine) == 1:
                x1, y1 = fine[-1]
                cand = math.exp(x1 + (aim - y1) / (-slope_abs))
                ref = math.exp(x1)
            else:
                # from the last coarse upper bound, less the part of its excess over the
                # truth that spacing h removes (excess ~ UPPER_EXCESS_SHARE * width ~ h^2):
                # steering only, the evaluation at cand decides
                v_last = pts[-1][1]
                u_last = float(v_last.upper)
                w_last = float(v_last.upper - v_last.lower)
                h_last = history[len(pts) - 1][1] if len(history) >= len(pts) else h
                if math.isfinite(w_last) and w_last > 0 and structural == 0.0:
                    u_last -= 0.7 * UPPER_EXCESS_SHARE * w_last * max(1.0 - (h / h_last) ** 2, 0.0)
                cand = (math.exp(math.log(pts[-1][0]) + (aim - math.log(u_last)) / (-slope_abs))
                        if math.isfinite(u_last) and u_last > 0 else r)
                ref = pts[-1][0]
            # (a secant step of at most a factor 4, as in the first phase: a slope measured on
            # coarse intervals may be far too shallow)
            cand = min(max(cand, ref / 4.0), ref * 4.0)
            if lo_s is not None:
                cand = max(cand, lo_s * (1 + 0.25 * tol))
        else:
            if not certify_lower:
                if fine and abs(fine[-1][1] - aim) <= 0.125 * tol * slope_abs:
                    break  # close enough to the upper curve's root
                x1, y1 = fine[-1] if fine else (math.log(hi_s), math.log(max(float(hi_iv.upper), 1e-300)))
                cand = min(math.exp(x1 + (aim - y1) / (-slope_abs)), hi_s * (1 - 1e-12))
                if cand >= hi_s * (1 - 0.25 * tol) or (lo_s is not None and cand <= lo_s):
                    break
            else:
                cand = hi_s / (1 + tol) * (1 + 1e-12)
                if fine and fine[-1][1] < aim - 0.25 * tol * slope_abs:
                    # the last point is well inside the feasible side: jump (secant) instead of
                    # crawling; the slope of the last two fine points when it is usable, and at most
                    # a factor 4 (a slope measured on coarse intervals may be far too shallow)
                    x1, y1 = fine[-1]
                    sl = -slope_abs
                    if len(fine) >= 2 and fine[-2][0] != x1:
                        sl2 = (y1 - fine[-2][1]) / (x1 - fine[-2][0])
                        if sl2 < -0.05:
                            sl = sl2
                    cand = min(cand, max(math.exp(x1 + (aim - y1) / sl), math.exp(x1) / 4.0))
                if lo_s is not None and cand <= lo_s:
                    cand = math.sqrt(lo_s * hi_s)
                    if hi_s / lo_s <= 1.0 + tol:
                        break
        if floor is not None and cand <= floor * (1 + 0.25 * tol):
            # below a refused sigma: half-way (in log) to the smallest feasible one, else above it
            if hi_s is not None and hi_s / floor <= 1.0 + tol:
                break
            cand = math.sqrt(floor * hi_s) if hi_s is not None else 2.0 * floor
        # without the infeasibility certificate only upper bounds steer: skip the optimistic side
        try:
            v, _ = evaluate(cand, h, lower_bound=certify_lower)
        except _Refused:
            n_eval += 1
            floor = max(floor or 0.0, cand)
            continue
        n_eval += 1
        up_v, lo_v = float(v.upper), float(v.lower)
        if math.isfinite(up_v) and up_v > 0:
            fine.append((math.log(cand), math.log(up_v)))
        if up_v <= epsilon or lo_v > epsilon:
            record(cand, v)
        elif hi_s is not None and certify_lower:  # ambiguous at sigma_hi / (1 + tol)
            ambiguous += 1
            width = up_v - lo_v
            if (amb_width is not None and width > 0.7 * amb_width) or ambiguous > 3:
                # the width does not shrink with h (e.g. WOR substitution, whose lower
                # bound is structurally loose): give up the infeasibility certificate and
                # locate the upper curve's root instead; sigma stays certified
                certify_lower = False
                fine = [(math.log(cand), math.log(up_v))]
            else:  # sharpen (width ~ h^2)
                amb_width = width
                h *= 0.7
                fine.clear()
    if hi_s is None and fallback[0] is not None:
        hi_s, hi_iv = fallback
    if hi_s is None:
        raise CalibrationError("calibration did not find a certified sigma within the evaluation budget "
                               f"({n_eval} PLD evaluations)")
    if not float(hi_iv.lower) > -math.inf:
        # found by an upper-only evaluation: its lower bound comes from a full evaluation at
        # four times the spacing, or (eps(delta) decreases in sigma) from any evaluation at a larger sigma
        lower = max([lo_e for s_e, _, lo_e, _ in history if s_e >= hi_s] + [-math.inf])
        try:
            v, _ = evaluate(hi_s, 4.0 * h)
            n_eval += 1
            lower = max(lower, float(v.lower))
        except (ArithmeticError, MemoryError, ValueError, _Refused):
            pass
        hi_iv = Interval(min(lower, float(hi_iv.upper)), float(hi_iv.upper))
    return CalibrationResult(
        sigma=float(hi_s),
        epsilon=Interval(float(hi_iv.lower), float(hi_iv.upper)),
        sigma_lower=None if lo_s is None else float(lo_s),
        seconds=time.perf_counter() - t0,
        evaluations=n_eval,
        spacing=float(h),
        params={"epsilon": epsilon, "delta": delta, "q": q, "steps": steps, "sampling": samp,
                "relation": relation, "tol": tol, **({"group": group} if group > 1 else {})},
        history=history,
        seed=seed_kind,
    )


def get_noise_multiplier(target_epsilon: float, target_delta: float, sample_rate: float, steps: int | None = None,
                         epochs: float | None = None, accountant: str = "pld", epsilon_tolerance: float = 0.01,
                         **kwargs) -> float:
    """Opacus-compatible helper: the noise multiplier for a target (epsilon, delta).

    Same signature as ``opacus.accountants.utils.get_noise_multiplier``.  ``steps`` or
    ``epochs`` (steps = ceil(epochs / sample_rate)) gives the number of compositions.
    The returned sigma is certified: its PLD upper bound on eps(target_delta) is at most
    ``target_epsilon``.  ``epsilon_tolerance`` (Opacus: the accepted gap below the target)
    sets the relative tolerance on sigma to ``epsilon_tolerance / (2 target_epsilon)``
    (eps(delta) falls by at most ~2% per 1% of sigma for subsampled Gaussians), capped at
    the :func:`calibrate` default 1e-3; pass ``tol=`` to choose it directly.  Other
    keyword arguments go to :func:`calibrate` (``sampling``, ``relation``, ...).

    Only ``accountant="pld"`` exists here: Opacus' ``"rdp"`` over-reports epsilon and its
    ``"gdp"`` is an uncertified estimate, so neither gives a certified noise multiplier.
    """
    if accountant != "pld":
        raise ValueError(f"accountant: only 'pld' (certified) is available here, got {accountant!r} "
                         "('rdp' over-reports epsilon, 'gdp' and 'prv' estimates are not certified)")
    if (steps is None) == (epochs is None):
        raise ValueError("steps/epochs: give exactly one of steps or epochs")
    q = V.sampling_rate("sample_rate", sample_rate)
    target_epsilon = V.positive_finite("target_epsilon", target_epsilon)
    epsilon_tolerance = V.positive_finite("epsilon_tolerance", epsilon_tolerance)
    if steps is None:
        epochs = V.positive_finite("epochs", epochs)
        steps = int(math.ceil(epochs / q))
    if "tol" not in kwargs:
        kwargs["tol"] = max(min(1e-3, epsilon_tolerance / (2.0 * target_epsilon)), 1e-6)
    res = calibrate(target_epsilon, target_delta, q, steps, **kwargs)
    return res.sigma
