"""Certified calibration of one monotone parameter of any event family.

A family ``make(p)`` maps a parameter value p to an event (or a Mechanism, or a pair
``(event, count)``) that is composed ``steps`` times.  The parameter is *monotone*: the
true privacy curve gets worse as p moves in one direction:

* ``direction="larger_is_less_private"`` (steps, sampling rate q, batch size,
  randomized-response eps0): the answer is the LARGEST p meeting the target;
* ``direction="larger_is_more_private"`` (Gaussian sigma, Laplace scale): the answer is
  the SMALLEST p meeting the target.

Every evaluation is a certified interval [lower, upper] on the target metric (eps(delta),
delta(eps) or the largest TPR at a given FPR) from an accountant of
:func:`pldlib.methods.make_accountant`.  The answer's *upper* bound meets the target
(so the answer is certified private).  The proof of search is the point ``beyond``
(the next integer, or for continuous parameters a point within the relative tolerance
``tol`` beyond the answer) whose certified *lower* bound already fails the target: then
the true optimum lies between the answer and ``beyond``.  When no such certificate is
reached (the accountant's interval straddles the target there), ``beyond_certified`` is
False and only the answer's side is certified; ``beyond`` is then still a value the accountant
does not certify (its upper bound exceeds the target), so the answer is the extreme value the
accountant certifies at its accuracy (``refine`` repeats the search on finer grids).

Integer parameters are searched exactly: galloping (doubling) from the private end, then
bisection, so a bound of 1e9 needs about 60 evaluations.  Continuous parameters are
bisected on a log scale (a linear scale when the lower bound is 0).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from . import _validate as V
from ._validate import CalibrationError
from .methods.base import Interval

__all__ = ["calibrate_parameter", "ParameterCalibration", "CalibrationError", "TargetUnreachableError", "NotPrivateError",
           "DIRECTIONS", "METRICS"]

DIRECTIONS = ("larger_is_less_private", "larger_is_more_private")
METRICS = ("epsilon", "delta", "tpr")


class NotPrivateError(ValueError):
    """Raised by a calibration's ``make(p)`` for a parameter at which the event has no finite
    privacy (e.g. zero noise): that parameter does not meet any target."""


class TargetUnreachableError(CalibrationError, ValueError):
    """Even the most private end of the parameter range does not certifiably meet the target."""


@dataclass
class ParameterCalibration:
    """A calibrated parameter with its certificate.

    Attributes
    ----------
    value : the extreme parameter whose certified upper metric meets the target
    interval : certified interval of the metric at ``value``
    beyond : the next integer (or a point within ``tol`` beyond ``value``) on the less
        private side; None when ``value`` is the range's end (``trivially_met``)
    beyond_interval : certified interval of the metric at ``beyond`` (None when not evaluated)
    beyond_certified : True when ``beyond_interval.lower`` exceeds the target (the optimum
        is certified to lie in [value, beyond)); False: only ``value``'s side is certified
    trivially_met : the least private end of the range already meets the target
    """

    parameter: str
    value: float
    interval: Interval
    beyond: float | None
    beyond_interval: Interval | None
    beyond_certified: bool
    trivially_met: bool
    target: dict
    bounds: tuple
    direction: str
    method: str
    evaluations: int
    seconds: float
    history: list = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        def iv(v):
            return None if v is None else {"lower": float(v.lower), "upper": float(v.upper)}

        return {
            "parameter": self.parameter,
            "value": self.value,
            "interval": iv(self.interval),
            "beyond": self.beyond,
            "beyond_interval": iv(self.beyond_interval),
            "beyond_certified": self.beyond_certified,
            "trivially_met": self.trivially_met,
            "target": self.target,
            "bounds": list(self.bounds),
            "direction": self.direction,
            "method": self.method,
            "evaluations": self.evaluations,
            "seconds": self.seconds,
        }


def _target(epsilon, delta, tpr_at_fpr, metric):
    if tpr_at_fpr is not None:
        if epsilon is not None or delta is not None:
            raise ValueError("epsilon/delta: give either (epsilon, delta) or tpr_at_fpr, not both")
        try:
            tpr, fpr = tpr_at_fpr
        except (TypeError, ValueError):
            raise TypeError(f"tpr_at_fpr: must be a pair (tpr, fpr), got {V.fmt(tpr_at_fpr)}") from None
        tpr, fpr = V.probability_open("tpr_at_fpr[0]", tpr), V.probability_open("tpr_at_fpr[1]", fpr)
        if not fpr < tpr:
            raise ValueError(f"tpr_at_fpr: need fpr < tpr (a test with tpr <= fpr is trivial), got {V.fmt((tpr, fpr))}")
        return "tpr", {"tpr": tpr, "fpr": fpr}, tpr
    if epsilon is None or delta is None:
        raise TypeError("epsilon, delta: both required (or give tpr_at_fpr)")
    epsilon = V.nonnegative_finite("epsilon", epsilon)
    delta = V.probability_open("delta", delta)
    metric = V.choice("metric", metric, ("epsilon", "delta"))
    t = {"epsilon": epsilon, "delta": delta, "metric": metric}
    return metric, t, (epsilon if metric == "epsilon" else delta)


def calibrate_parameter(make, bounds, *, direction: str, epsilon: float | None = None, delta: float | None = None,
                        metric: str = "epsilon", tpr_at_fpr=None, steps: int = 1, integer: bool = False,
                        parameter: str = "p", method: str = "pld", relation: str | None = None,
                        method_options: dict | None = None, tol: float = 1e-3, refine: int = 0,
                        max_evaluations: int = 200) -> ParameterCalibration:
    """The extreme parameter p in ``bounds`` whose certified upper metric meets the target.

    Parameters
    ----------
    make : callable p -> event, Mechanism, or (event, count); composed ``steps`` times
        (times ``count`` when a pair is returned: e.g. ``lambda k: (event, k)`` for steps)
    bounds : (low, high), the search range (low >= 0; integers when ``integer``)
    direction : 'larger_is_less_private' (answer: the largest p) or
        'larger_is_more_private' (answer: the smallest p)
    epsilon, delta : the target; ``metric='epsilon'``: certified eps(delta) <= epsilon;
        ``metric='delta'``: certified delta(epsilon) <= delta
    tpr_at_fpr : (tpr, fpr) instead: certified largest TPR at FPR fpr <= tpr
    steps : compositions of ``make(p)`` (a positive integer)
    integer : search integers exactly (steps, batch size)
    method : accountant name (:func:`pldlib.methods.make_accountant`); must be certified
        (kind 'certified') for the answer to be certified
    relation : neighbouring relation of the accountant (default: the Mechanism's, else add_remove)
    method_options : keyword arguments of the accountant's constructor
    tol : relative tolerance of continuous parameters, in [1e-8, 0.1]
    refine : for the 'pld' method, how many times the search is repeated on a grid 4 times finer
        (integers: a second pass from the answer; every pass: at ``beyond`` when its interval
        straddles the target).  0 (default): the answer is the extreme value the accountant's
        automatic grid certifies, and ``beyond`` (the next value) is not certified feasible there

    Raises
    ------
    TargetUnreachableError : the most private end of ``bounds`` does not certifiably meet the
        target (the message names the target and the interval reached there)
    CalibrationError : the evaluation budget ran out
    """
    from .methods import make_accountant, method_info
    from .methods.base import components_of

    t0 = time.perf_counter()
    if not callable(make):
        raise TypeError(f"make: a callable p -> event, got {type(make).__name__}")
    direction = V.choice("direction", direction, DIRECTIONS)
    metric, target, tval = _target(epsilon, delta, tpr_at_fpr, metric)
    steps = V.steps("steps", steps)
    info = method_info(method)
    if info.kind not in ("certified", "upper"):
        # an estimate or another library's number is no certificate: calibrating on it would
        # report an uncertified parameter as certified
        raise ValueError(f"method: {method!r} (kind {info.kind!r}) certifies no upper bound; use a certified "
                         "method such as 'pld'")
    tol = V.positive_finite("tol", tol)
    if not (1e-8 <= tol <= 0.1):
        raise ValueError(f"tol: must be in [1e-08, 0.1] (a relative tolerance on the parameter), got {V.fmt(tol)}")
    refine = V.int_at_least("refine", refine, 0)
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise TypeError(f"bounds: a pair (low, high), got {V.fmt(bounds)}") from None
    if integer:
        lo, hi = V.whole_number("bounds[0]", lo), V.whole_number("bounds[1]", hi)
        if lo < 0:
            raise ValueError(f"bounds: the low end must be >= 0, got {lo}")
    else:
        lo, hi = V.nonnegative_finite("bounds[0]", lo), V.positive_finite("bounds[1]", hi)
    if not lo < hi:
        raise ValueError(f"bounds: need low < high, got {V.fmt((lo, hi))}")
    opts = dict(method_options or {})
    less = direction == "larger_is_less_private"
    # private end / least private end
    p_priv, p_least = (lo, hi) if less else (hi, lo)
    history: list = []
    n_eval = 0
    cache: dict = {}

    def evaluate(p, extra=None):
        nonlocal n_eval
        key = (p, tuple(sorted((extra or {}).items())))
        if key in cache:
            return cache[key]
        if n_eval >= max_evaluations:
            raise CalibrationError(f"calibration of {parameter}: evaluation budget ({max_evaluations}) exhausted")
        obj = make(int(p) if integer else float(p))
        count = steps
        if isinstance(obj, tuple) and len(obj) == 2:
            obj, c = obj
            count = steps * V.steps("count", c)
        rel = relation
        if hasattr(obj, "event") and hasattr(obj, "base_event"):  # a Mechanism
            rel_m, comps = components_of(obj, count)
            rel = rel or rel_m
        else:
            comps = [(obj, count)]
        acc = make_accountant(method, rel or "add_remove", **{**opts, **(extra or {})})
        for ev, k in comps:
            acc.compose(ev, k)
        if metric == "epsilon":
            v = acc.epsilon(target["delta"])
        elif metric == "delta":
            v = acc.delta(target["epsilon"])
        else:
            v = acc.max_tpr(target["fpr"])
        v = Interval(float(v.lower), float(v.upper)) if info.kind == "certified" else Interval(-math.inf,
                                                                                               float(v.upper))
        if math.isnan(v.upper):  # no certified upper bound at this point: never feasible
            v = Interval(v.lower, math.inf)
        n_eval += 1
        history.append((p, float(v.lower), float(v.upper)))
        cache[key] = (v, acc)
        return v, acc

    extra: dict = {}

    def ok(p):
        from .profiles.base import LossRangeError

        try:
            return evaluate(p, extra)[0].upper <= tval
        except (LossRangeError, V.GridTooLargeError, V.PrecisionLimitError, NotPrivateError):
            # too little noise, or too fine a grid, to certify: not certified feasible
            if p == p_priv and not extra:
                raise
            return False

    def describe():
        if metric == "tpr":
            return f"TPR <= {V.fmt(target['tpr'])} at FPR {V.fmt(target['fpr'])}"
        if metric == "epsilon":
            return f"eps(delta={V.fmt(target['delta'])}) <= {V.fmt(target['epsilon'])}"
        return f"delta(eps={V.fmt(target['epsilon'])}) <= {V.fmt(target['delta'])}"

    def result(value, beyond, trivially):
        v = evaluate(value, extra)[0]
        biv, bcert = None, False
        if beyond is not None:
            biv = evaluate(beyond, extra)[0]
            bcert = biv.lower > tval
            if not bcert and method == "pld":
                acc_b = evaluate(beyond, extra)[1]
                h = float(getattr(acc_b, "spacing", 0.0) or 0.0)
                for _ in range(refine):
                    if h <= 0:
                        break
                    h /= 4.0
                    try:
                        biv = evaluate(beyond, {"spacing": h})[0]
                    except (ArithmeticError, MemoryError, ValueError):
                        break
                    if biv.lower > tval:
                        bcert = True
                        break
        return ParameterCalibration(parameter, int(value) if integer else float(value), v, beyond, biv, bcert,
                                    trivially, target, (lo, hi), direction, method, n_eval,
                                    time.perf_counter() - t0, history)

    # the private end must meet the target
    if not ok(p_priv):
        v = evaluate(p_priv)[0]
        raise TargetUnreachableError(
            f"{parameter}: target {describe()} is unreachable in bounds {V.fmt((lo, hi))}: even the most private "
            f"end {parameter}={V.fmt(p_priv)} gives a certified interval [{V.fmt(v.lower)}, {V.fmt(v.upper)}]")
    if integer:
        step = 1 if less else -1

        def search(good):
            """The certified-feasible value reached from ``good`` (feasible) by galloping and
            bisection, restarted while the next value is certified feasible too (the accountant's
            bounds are certified, not exactly monotone in the parameter); None: the range's end."""
            while True:
                d, bad = 1, None
                while True:
                    cand = good + step * d
                    if (less and cand >= p_least) or (not less and cand <= p_least):
                        cand = p_least
                    if ok(cand):
                        good = cand
                        if cand == p_least:
                            return good, True
                        d *= 2
                    else:
                        bad = cand
                        break
                while abs(bad - good) > 1:  # bisection: ok(good), not ok(bad)
                    m = (good + bad) // 2
                    if ok(m):
                        good = m
                    else:
                        bad = m
                if not ok(good + step):
                    return good, False
                good += step

        good, at_end = search(p_priv)
        if not at_end and method == "pld" and "interval" not in opts and "spacing" not in opts:
            # a second pass on one finer grid for every value: the automatic grid of the first
            # pass is chosen per value and is coarse near the target
            h = float(evaluate(good)[1].spacing)
            for _ in range(refine):
                h /= 4.0
                extra.clear()
                extra["spacing"] = h
                try:
                    if not ok(good):
                        break
                except (ArithmeticError, MemoryError, ValueError):
                    break
                good, at_end = search(good)
                if at_end or evaluate(good + step, extra)[0].lower > tval:
                    break
            if not ok(good):  # (the finer grid could not certify the answer: keep the first pass's)
                extra.clear()
        return result(good, None if at_end else good + step, at_end)

    # continuous: bisection (log scale when lo > 0)
    if ok(p_least):
        return result(p_least, None, True)
    good, bad = p_priv, p_least
    logscale = lo > 0

    def gap():
        return abs(math.log(bad / good)) if logscale else abs(bad - good) / max(abs(good), abs(bad))

    while gap() > math.log1p(tol) * 0.999 if logscale else gap() > tol:
        m = math.sqrt(good * bad) if logscale else 0.5 * (good + bad)
        if m in (good, bad):
            break
        if ok(m):
            good = m
        else:
            bad = m
    return result(good, bad, False)
