"""What the privacy calculator page computes, as plain functions of its form's fields.

:func:`parse_query` checks the fields with the command line's own converters (the same
messages, e.g. ``argument --delta: must be in (0, 1), got 2.0``); :func:`atlas_answer` reads
the shipped sigma atlas (microseconds; a certified sigma, coarser than the exact one);
:func:`exact_answer` asks the PLD accountant: the certified sigma for a target (the same call
as ``pldlib calibrate``), the certified epsilon band over the course of training, and the
certified trade-off curve and TPR at the chosen FPRs.  Every number says what it is:
``certified`` (an upper or lower bound with a proof) or ``estimate``.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from .. import _validate as V

#: the schemes the page offers: those of the shipped atlas (explicitly not every registered scheme:
#: random_allocation / shuffle need whole epochs, and truncated_poisson a batch cap the form's
#: batch size would be confused with; they are reached through the library, the CLI and sweeps)
SAMPLINGS = ("poisson", "wor")
RELATIONS = ("add_remove", "add", "remove", "substitution")
#: points of the epsilon-over-training band and of the trade-off curve
BAND_POINTS = 16
CURVE_POINTS = 41
DEFAULT_FPRS = (0.001, 0.01, 0.1)


class QueryError(ValueError):
    """A form field is missing or invalid: ``field`` names it, the message is the CLI's."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass
class Query:
    """The checked form: the noise is ``sigma`` (given) or calibrated to ``epsilon``."""

    q: float
    steps: int
    delta: float
    sampling: str = "poisson"
    relation: str = "add_remove"
    epsilon: float | None = None
    sigma: float | None = None
    fprs: tuple = DEFAULT_FPRS
    dataset_size: int | None = None
    batch_size: int | None = None
    epochs: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _converted(field: str, flag: str, check, text):
    try:
        return V.from_text(check, str(text).strip())
    except ValueError as e:
        raise QueryError(field, f"argument --{flag}: {e}") from None


def _given(form: dict, name: str) -> bool:
    v = form.get(name)
    return v is not None and str(v).strip() != ""


def parse_query(form: dict) -> Query:
    """A :class:`Query` from the form's text fields; :class:`QueryError` names a bad one.

    Fields: ``dataset_size`` and ``batch_size`` (q = batch / size) or ``q``; ``epochs``
    (steps = ceil(epochs / q), as Opacus counts them) or ``steps``; ``sampling``,
    ``relation``, ``delta``; ``epsilon`` (calibrate sigma) or ``sigma``; ``fprs`` (comma
    separated)."""
    if not isinstance(form, dict):
        raise QueryError("form", "the query must be a mapping of field names to values")
    sampling = str(form.get("sampling") or "poisson")
    if sampling not in SAMPLINGS:
        raise QueryError("sampling", f"argument --sampling: invalid choice: {sampling!r} "
                                     f"(choose from {', '.join(SAMPLINGS)})")
    relation = str(form.get("relation") or "add_remove")
    if relation not in RELATIONS:
        raise QueryError("relation", f"argument --relation: invalid choice: {relation!r} "
                                     f"(choose from {', '.join(RELATIONS)})")
    n = b = None
    if _given(form, "dataset_size") or _given(form, "batch_size"):
        n = _converted("dataset_size", "dataset-size", V.steps, form.get("dataset_size", ""))
        b = _converted("batch_size", "batch-size", V.steps, form.get("batch_size", ""))
        if b > n:
            raise QueryError("batch_size", f"argument --batch-size: must be at most the dataset size {n}, got {b}")
        q = b / n
    elif _given(form, "q"):
        q = _converted("q", "q", V.sampling_rate, form["q"])
    else:
        raise QueryError("q", "give the dataset size and batch size, or the sampling rate q")
    epochs = None
    if _given(form, "epochs"):
        epochs = _converted("epochs", "epochs", V.positive_finite, form["epochs"])
        steps = max(1, math.ceil(epochs / q - 1e-9))
    elif _given(form, "steps"):
        steps = _converted("steps", "steps", V.steps, form["steps"])
    else:
        raise QueryError("steps", "give the number of epochs or of steps")
    if not _given(form, "delta"):
        raise QueryError("delta", "argument --delta: required")
    delta = _converted("delta", "delta", V.probability_open, form["delta"])
    eps = sigma = None
    if _given(form, "epsilon") == _given(form, "sigma"):
        raise QueryError("epsilon", "give a target epsilon (to calibrate sigma) or a noise multiplier sigma, "
                                    "not both")
    if _given(form, "epsilon"):
        eps = _converted("epsilon", "epsilon", V.positive_finite, form["epsilon"])
    else:
        sigma = _converted("sigma", "sigma", V.positive_finite, form["sigma"])
    fprs = DEFAULT_FPRS
    if _given(form, "fprs"):
        parts = [p for p in str(form["fprs"]).replace(" ", "").split(",") if p]
        fprs = tuple(sorted({_converted("fprs", "fpr", V.probability_open, p) for p in parts}))
        if not fprs or len(fprs) > 20:
            raise QueryError("fprs", "argument --fpr: give 1 to 20 false-positive rates in (0, 1), comma separated")
    return Query(q=float(q), steps=int(steps), delta=float(delta), sampling=sampling, relation=relation,
                 epsilon=eps, sigma=sigma, fprs=fprs, dataset_size=n, batch_size=b, epochs=epochs)


def _num(x):
    x = float(x)
    return x if math.isfinite(x) else (None if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def atlas_answer(query: Query, atlas=None) -> dict:
    """The shipped atlas's certified sigma for a target epsilon (none for a given sigma or an
    uncovered query: the reason is in ``note``)."""
    from ..atlas import AtlasRangeError, default_atlas_path, open_atlas

    t0 = time.perf_counter()
    out = {"source": "atlas", "sigma": None, "estimate": None, "kind": "certified upper", "note": None}
    if query.epsilon is None:
        out["note"] = "the atlas answers target epsilons; for a given sigma see the exact answer"
        return out
    try:
        atlas = atlas if atlas is not None else open_atlas(default_atlas_path())
        ans = atlas.sigma_for(query.epsilon, query.delta, query.q, query.steps, sampling=query.sampling,
                              relation=query.relation, outside="raise")
        out["sigma"] = _num(ans.sigma)
        out["estimate"] = _num(ans.estimate)
    except (AtlasRangeError, ValueError, TypeError, OSError) as e:
        out["note"] = f"outside the atlas: {e}"
    out["seconds"] = time.perf_counter() - t0
    return out


def exact_answer(query: Query, progress=None) -> dict:
    """The accountant's certified answers for ``query`` (see the module docstring)."""
    import pldlib

    say = progress or (lambda stage: None)
    t0 = time.perf_counter()
    out: dict = {"source": "accountant", "query": query.as_dict()}
    if query.epsilon is not None:
        say("calibrating sigma (certified)")
        res = pldlib.calibrate(query.epsilon, query.delta, query.q, query.steps, sampling=query.sampling,
                               relation=query.relation)
        sigma, spacing = float(res.sigma), float(res.spacing)
        out["calibration"] = {"sigma": sigma, "sigma_lower": res.sigma_lower, "spacing": spacing,
                              "epsilon": [_num(res.epsilon.lower), _num(res.epsilon.upper)],
                              "seconds": res.seconds, "kind": "certified upper"}
    else:
        sigma, spacing = float(query.sigma), None
    out["sigma"] = sigma
    mech = pldlib.Gaussian(sigma=sigma, q=query.q, sampling=query.sampling if query.q < 1 else "none",
                           relation=query.relation)
    say("epsilon at the end of training")
    # (a calibrated sigma is read on the grid that certified it: another grid's upper end may lie a
    # hair above the target)
    acc = pldlib.account(mech, steps=query.steps, spacing=spacing)
    iv = acc.epsilon(query.delta)
    out["epsilon"] = {"lower": _num(iv.lower), "upper": _num(iv.upper), "kind": "certified interval",
                      "accuracy_limited": bool(getattr(acc, "accuracy_limited", False))}
    say("epsilon over the course of training")
    ks = sorted({int(round(k)) for k in np.geomspace(1, query.steps, BAND_POINTS)} | {query.steps})
    lo, _est, up, _notes = acc.fresh().epsilon_per_steps(mech.event, ks, [query.delta])
    out["band"] = {"steps": ks, "lower": [_num(x) for x in lo[:, 0]], "upper": [_num(x) for x in up[:, 0]],
                   "kind": "certified interval per steps count"}
    say("trade-off curve and attack bounds")
    alphas = np.concatenate([[0.0], np.geomspace(1e-4, 1.0, CURVE_POINTS - 1)])
    beta = acc.tradeoff(alphas)
    tpr = acc.max_tpr(np.asarray(query.fprs))
    out["tradeoff"] = {"alpha": [float(a) for a in alphas], "beta_lower": [_num(x) for x in beta.lower],
                       "beta_upper": [_num(x) for x in beta.upper], "kind": "certified interval"}
    out["tpr"] = {"fpr": list(query.fprs), "lower": [_num(x) for x in tpr.lower],
                  "upper": [_num(x) for x in tpr.upper], "kind": "certified interval"}
    out["seconds"] = time.perf_counter() - t0
    return out
