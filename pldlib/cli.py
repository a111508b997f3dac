"""Command-line interface: ``pldlib epsilon ...``, ``pldlib delta ...``, ``pldlib tradeoff ...``,
``pldlib calibrate ...``.

Examples
--------
::

    pldlib epsilon --mechanism gaussian --sigma 0.8 --steps 10000 --delta 1e-6 1e-5
    pldlib delta --mechanism laplace --scale 2 --steps 100 --epsilon 1 5 --json

With ``--json`` exactly one JSON object is printed on stdout (strictly valid
JSON: non-finite numbers are written as ``null`` and explained in ``"note"``)::

    {"epsilon": [{"delta": d, "lower": x, "upper": y, "trivial": false}, ...],
     "method": "pld", "seconds": t, "params": {...},
     "notes": [...], "trivial": false, "accuracy_limited": false}

``seconds`` is the wall time of the accounting itself (building the accountant
and answering the query), not of interpreter start-up or imports.

Nothing is silent: an answer that is *accuracy-limited* (the automatic grid was
coarsened to fit the memory or time budget: still certified, only wider),
*trivial* (the certified interval is no better than the bounds every
mechanism satisfies, so it says nothing: epsilon in [ln(1 - delta), inf] or
[-inf, inf], delta in [max(0, 1 - e^eps), 1], beta(alpha) in [0, 1 - alpha],
advantage in [0, 1], Gaussian-DP mu in [0, inf]) or computed on a too coarse
explicit ``--spacing`` gets one line on stderr (``pldlib: note: ...``; the
coarse ``--spacing`` line is a ``pldlib: warning: ...``) and, with ``--json``,
an entry in ``"notes"`` plus the flags ``"trivial"`` (also per row) and
``"accuracy_limited"``.  The library's own warnings are recorded, not printed:
they come back as these notes.

Exit status: 0 success; 4 the answer is printed but at least one interval is
trivial (see above); 2 bad or unsupported input (one line on stderr naming
the argument); 3 the answer is beyond what can be certified at this accuracy
or the grid would be too large (:class:`pldlib.PrecisionLimitError`,
:class:`pldlib.GridTooLargeError`, single-step losses too large; nothing on
stdout); 1 an unexpected internal error (one line; rerun with ``--debug`` or
set ``PLDLIB_DEBUG=1`` for the traceback).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import sysconfig
import time
import traceback
import warnings
from contextlib import ExitStack, contextmanager
from typing import Callable

import numpy as np

from . import __version__, allocator
from . import _validate as V
from .plugins import load_plugins
from ._validate import PrecisionLimitError
from .calibrate import CalibrationError
from ._validate import GridTooLargeError
from .pld.compose import DEFAULT_MAX_BINS
from .methods.pld import DEFAULT_MEMORY_BUDGET, DEFAULT_TIME_BUDGET, AccuracyLimitedWarning
from .mechanisms import Gaussian, Mechanism, mechanism_names, mechanism_spec

__all__ = ["main", "build_parser", "MECHANISMS", "EXIT_OK", "EXIT_USAGE", "EXIT_LIMIT", "EXIT_TRIVIAL"]

PROG = "pldlib"
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_LIMIT = 3
#: an answer was printed, but at least one of its intervals is trivial (certifies nothing)
EXIT_TRIVIAL = 4

EPILOG = ("Exit status: 0 ok; 4 answer printed, but at least one interval is trivial (no better than what "
          "every mechanism satisfies, so it certifies nothing: epsilon [ln(1 - delta), inf], delta "
          "[max(0, 1 - e^eps), 1], beta [0, 1 - alpha], advantage [0, 1], mu [0, inf]); "
          "2 bad or unsupported input; 3 precision or grid-size limit (no answer); 1 internal error "
          "(rerun with --debug). Answers that are trivial, accuracy-limited (automatic grid coarsened "
          "to fit the memory or time budget) or on a too coarse --spacing get a 'pldlib: note:' "
          "(or 'warning:') line on stderr and, with --json, the fields \"notes\", \"trivial\" and "
          "\"accuracy_limited\".")

from ._validate import RELATIONS
from .methods import accountant_class, method_info, method_names
from .sampling import sampling_names

SAMPLINGS = sampling_names()

#: method options the CLI exposes: flag -> constructor keyword of the accountant
METHOD_OPTIONS = {"--spacing": "spacing", "--eps-error": "eps_error", "--delta-error": "delta_error",
                  "--max-bins": "max_bins", "--time-budget": "time_budget", "--memory-budget": "memory_budget"}
#: per-method defaults of the CLI that differ from the constructor's
CLI_DEFAULTS = {"spa": {"on_edge": "flag"}}


def _accepted(method: str) -> set:
    import inspect

    return set(inspect.signature(accountant_class(method).__init__).parameters)


def make_method_accountant(method: str, relation: str, args) -> "object":
    """The registered accountant ``method`` under ``relation`` with the options given on the
    command line; an option the method does not take is a usage error, not silently ignored."""
    accepted = _accepted(method)
    kw = dict(CLI_DEFAULTS.get(method, {}))
    for flag, name in METHOD_OPTIONS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if name not in accepted:
            takers = [m for m in method_names() if name in _accepted(m)]
            raise UsageError(f"argument {flag}: applies to --method {' / '.join(takers)} only, "
                             f"not to --method {method}")
        kw[name] = value
    return accountant_class(method)(relation, **kw)


def _maker(spec):
    def make(args) -> Mechanism:
        return spec.make(getattr(args, spec.noise), sensitivity=args.sensitivity, q=args.q,
                         sampling=args.sampling, relation=args.relation, group=args.group, **_truncation(args),
                         **_selections(args))
    return make


#: the sampling scheme whose steps need --batch-size and --dataset-size (a capped Poisson batch)
TRUNCATED = "truncated_poisson"
#: the sampling scheme of a batch drawn with replacement (--batch-size draws from --dataset-size records)
WITH_REPLACEMENT = "with_replacement"
#: the schemes whose steps need --batch-size and --dataset-size
SIZED = (TRUNCATED, WITH_REPLACEMENT)
#: its flags: flag -> keyword of the mechanism (pldlib.mechanisms.Mechanism)
TRUNCATION_FLAGS = {"--batch-size": "batch_size", "--dataset-size": "dataset_size"}


def _truncation(args) -> dict:
    """The keywords ``batch_size`` and ``dataset_size`` of a ``--sampling truncated_poisson`` or
    ``with_replacement`` step (empty for every other scheme); a UsageError naming the flag when one
    is missing, or given with another scheme."""
    given = {flag: getattr(args, name, None) for flag, name in TRUNCATION_FLAGS.items()}
    if args.sampling in SIZED:
        for flag, v in given.items():
            if v is None:
                raise UsageError(f"argument {flag}: required with --sampling {args.sampling}")
        if args.sampling == WITH_REPLACEMENT and given["--dataset-size"] < 2:
            raise UsageError("argument --dataset-size: must be at least 2 with --sampling "
                             f"{WITH_REPLACEMENT}, got {given['--dataset-size']}")
        return {TRUNCATION_FLAGS[f]: v for f, v in given.items()}
    for flag, v in given.items():
        if v is not None:
            raise UsageError(f"argument {flag}: only with --sampling {TRUNCATED} or {WITH_REPLACEMENT}"
                             + (f", not with --sampling {args.sampling}" if args.sampling else ""))
    return {}


def _selections(args) -> dict:
    """The keyword ``selections`` of a k of t random-allocation step (empty when k = 1); a UsageError
    naming --selections when k > 1 comes with another scheme."""
    k = getattr(args, "selections", 1)
    if k == 1:
        return {}
    if args.sampling != "random_allocation":
        raise UsageError("argument --selections: k > 1 only with --sampling random_allocation"
                         + (f", not with --sampling {args.sampling}" if args.sampling else ""))
    return {"selections": k}


def _add_selections(g) -> None:
    g.add_argument("--selections", type=_steps, default=1, metavar="K",
                   help="--sampling random_allocation only: every record in K of the t = K/q steps of each "
                        "epoch (k of t random allocation; default 1)")


def _add_truncation(g) -> None:
    g.add_argument("--batch-size", type=_count, default=None, metavar="B",
                   help=f"--sampling {TRUNCATED} / {WITH_REPLACEMENT} only (required there): {TRUNCATED}: a "
                        f"Poisson batch larger than B is cut to a uniformly random subset of B records; "
                        f"{WITH_REPLACEMENT}: each batch is B independent uniform draws")
    g.add_argument("--dataset-size", type=_count, default=None, metavar="N",
                   help=f"--sampling {TRUNCATED} / {WITH_REPLACEMENT} only (required there): the number of "
                        "records N (with the protected one)")


def mechanisms() -> dict[str, tuple[str, Callable]]:
    """Mechanism name -> (name of its noise parameter, constructor from parsed args), read from
    the mechanism descriptors (:func:`pldlib.mechanisms.mechanism_spec`) when asked, so that
    mechanisms registered later (plugins) are included."""
    return {n: (mechanism_spec(n).noise, _maker(mechanism_spec(n))) for n in mechanism_names()}


#: the built-in mechanisms (see :func:`mechanisms`)
MECHANISMS = mechanisms()


# ---------------------------------------------------------------------------
# argument parsing
# ---------------------------------------------------------------------------
class UsageError(Exception):
    """Bad command-line input; the message names the argument."""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line on stderr and exit status 2.

    It also accepts negative numbers in scientific notation and -inf as values
    (``--epsilon -1e-3``), which plain argparse mistakes for options.
    """

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._negative_number_matcher = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)

    def error(self, message):  # noqa: D401 - argparse API
        raise UsageError(message)


def _arg(check, *extra):
    """An argparse ``type`` from a validator of :mod:`pldlib._validate` (the one set of argument
    checks, shared with the API, the sweep configs and the calculator page): the text as a number,
    checked (:func:`pldlib._validate.from_text`), its error as argparse's one-line message."""
    def convert(text: str):
        try:
            return V.from_text(check, text, *extra)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = check.__name__
    return convert


_positive_finite = _arg(V.positive_finite)
_steps = _arg(V.steps)
_delta = _arg(V.probability_open)
_epsilon = _arg(V.finite)
_q = _arg(V.sampling_rate)
_max_bins = _arg(V.int_at_least, 16)
_delta_error = _arg(V.probability_open)
_count = _arg(V.int_at_least, 1)


def _memory(text: str) -> int:
    """A byte count: an integer, optionally with a suffix k, M or G (powers of 1024), at least 1M."""
    t = text.strip()
    scale = {"k": 2**10, "m": 2**20, "g": 2**30}.get(t[-1:].lower(), 1)
    number = t[:-1] if scale != 1 else t
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count (e.g. 500M, 2G, 1073741824)") from None
    if not math.isfinite(value) or value * scale < 2**20:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite byte count of at least 1M")
    return int(value * scale)


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mechanism")
    g.add_argument("--mechanism", required=True, choices=sorted(mechanisms()),
                   help="base mechanism")
    helps: dict[str, list[str]] = {}
    for n in mechanism_names():  # one flag per noise parameter, from the mechanism descriptors
        spec = mechanism_spec(n)
        helps.setdefault(spec.noise, []).append(f"{n}: {spec.help}")
    for noise, h in helps.items():
        g.add_argument(f"--{noise}", type=_positive_finite, help="; ".join(h))
    g.add_argument("--sensitivity", type=_positive_finite, default=1.0,
                   help="sensitivity (L2 for gaussian, L1 for laplace, an integer for discrete_laplace; default 1)")
    g.add_argument("--q", type=_q, default=1.0,
                   help="sampling probability in (0, 1] (default 1)")
    g.add_argument("--sampling", choices=SAMPLINGS, default=None,
                   help=f"sampling scheme (default: none if q = 1, poisson if q < 1; {TRUNCATED}: a capped "
                        f"Poisson batch, with --batch-size and --dataset-size; {WITH_REPLACEMENT}: batches drawn "
                        "with replacement, with --batch-size and --dataset-size, q = B/N)")
    _add_truncation(g)
    _add_selections(g)
    g.add_argument("--relation", choices=RELATIONS, default="add_remove",
                   help="neighbouring relation (default add_remove)")
    g.add_argument("--group", type=_steps, default=1, metavar="G",
                   help="user-level accounting: each protected user has up to G records (default 1; "
                        "gaussian, poisson / wor / no sampling, not substitution; with wor, q = batch / "
                        "(records of the other users + 1))")
    g.add_argument("--steps", type=_steps, required=True, help="number of compositions (integer >= 1)")
    a = p.add_argument_group("accounting")
    a.add_argument("--method", choices=method_names(), default="pld",
                   help="accounting method (default pld): " + "; ".join(
                       f"{m} ({method_info(m).kind})" for m in method_names()))
    a.add_argument("--spacing", "--interval", dest="spacing", type=_positive_finite, default=None,
                   help="grid spacing h of the privacy-loss discretisation (the accuracy knob; "
                        "smaller = tighter and slower; default: chosen automatically)")
    a.add_argument("--eps-error", type=_positive_finite, default=None,
                   help="prv only: target error in epsilon (default 0.01)")
    a.add_argument("--delta-error", type=_delta_error, default=None,
                   help="prv only: target error in delta (default 1e-12)")
    a.add_argument("--max-bins", type=_max_bins, default=None,
                   help=f"pld / prv: cap on the FFT length (memory guard; default {DEFAULT_MAX_BINS})")
    a.add_argument("--time-budget", type=_positive_finite, default=None, metavar="SECONDS",
                   help=f"pld only: seconds a query (or the build) may spend on an automatic grid "
                        f"(default {DEFAULT_TIME_BUDGET:g}); past it the grid is coarsened and the answer "
                        f"flagged accuracy-limited (still certified)")
    a.add_argument("--memory-budget", type=_memory, default=None, metavar="BYTES",
                   help=f"pld / prv: memory the automatic grid may use, in bytes or with a suffix "
                        f"k, M, G (default {DEFAULT_MEMORY_BUDGET / 2**30:g}G)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    _add_debug(p)


def _add_debug(p: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    # (SUPPRESS on the subcommands: their default must not overwrite a --debug given before them)
    p.add_argument("--debug", action="store_true", default=default,
                   help="on an internal error, show the full traceback (as PLDLIB_DEBUG=1 does)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Certified differential-privacy accounting: each answer is an interval "
                    "[lower, upper] that contains the exact value.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_debug(parser, default=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    pe = sub.add_parser("epsilon", help="epsilon(delta) intervals", epilog=EPILOG,
                        description="Certified interval for epsilon at each given delta.")
    _add_common(pe)
    pe.add_argument("--delta", type=_delta, nargs="+", required=True, metavar="D",
                    help="target delta(s), each in (0, 1)")
    pd = sub.add_parser("delta", help="delta(epsilon) intervals", epilog=EPILOG,
                        description="Certified interval for delta at each given epsilon.")
    _add_common(pd)
    pd.add_argument("--epsilon", type=_epsilon, nargs="+", required=True, metavar="E",
                    help="epsilon value(s), finite (negative allowed)")
    _add_calibrate(sub)
    _add_serve(sub)
    _add_tradeoff(sub)
    return parser


# -- pldlib tradeoff (docs/MATH.md section 10) ---------------------------------------------
def _alpha(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text!r}")
    return x


def _run_calibrate_for(args) -> int:
    """``pldlib calibrate --for steps|q|scale|eps0``: the generic certified calibration
    (:func:`pldlib.calibration.calibrate_parameter`) of a mechanism of the descriptors."""
    from .calibration import calibrate_parameter

    what = args.for_
    spec = mechanism_spec(args.mechanism)
    noises = sorted({mechanism_spec(n).noise for n in mechanism_names()})
    for other in noises:
        if other != spec.noise and getattr(args, other, None) is not None:
            raise UsageError(f"argument --{other}: not allowed with --mechanism {args.mechanism} "
                             f"(its noise is --{spec.noise})")
    if what in noises and what != spec.noise:
        takers = [n for n in mechanism_names() if mechanism_spec(n).noise == what]
        raise UsageError(f"argument --for: {what} is the noise of --mechanism {' / '.join(takers)}, "
                         f"not of {args.mechanism}")
    if what == spec.noise:
        if getattr(args, spec.noise) is not None:
            raise UsageError(f"argument --{spec.noise}: not allowed with --for {what} (it is the answer)")
        if args.steps is None:
            raise UsageError(f"argument --steps: required with --for {what}")
    elif getattr(args, spec.noise) is None:
        raise UsageError(f"argument --{spec.noise}: required with --for {what}")
    if what == "steps" and args.steps is not None:
        raise UsageError("argument --steps: not allowed with --for steps (it is the answer)")
    if what == "q" and args.q is not None:
        raise UsageError("argument --q: not allowed with --for q (it is the answer)")
    if what == "q" and args.steps is None:
        raise UsageError("argument --steps: required with --for q")
    if args.sampling in SIZED and what == "sigma":  # (no atlas of these batches: --no-table is what it does)
        if args.table is not None:
            raise UsageError(f"argument --table: the atlas has no {args.sampling} tables; leave --table out")
    elif args.table is not None or args.no_table:
        raise UsageError(f"argument --table/--no-table: apply to sigma calibration only, not to --for {what}")
    q = 1.0 if args.q is None else args.q
    if args.sampling == WITH_REPLACEMENT:
        if what == "q":
            raise UsageError(f"argument --for: q is --batch-size / --dataset-size with --sampling {WITH_REPLACEMENT}; "
                             "calibrate sigma or steps")
        if args.batch_size is not None and args.dataset_size:
            q = args.batch_size / args.dataset_size if args.q is None else args.q
    sampling = args.sampling or ("poisson" if (what == "q" or q < 1.0) else "none")
    if sampling == "none" and (what == "q" or q < 1.0):
        raise UsageError("argument --sampling: 'none' cannot have q < 1 (use poisson or wor)")
    truncation = _truncation(args)
    kw = dict(relation=args.relation, **({"group": args.group} if args.group > 1 else {}), **truncation,
              **_selections(args))
    noise = getattr(args, spec.noise)
    direction = "larger_is_less_private"
    if what == "steps":
        mech = spec.make(noise, q=q, sampling=sampling, **kw)
        make, bounds, integer = (lambda k: (mech, k)), (1, 10**12), True
    elif what == "q":
        make = lambda x: spec.make(noise, q=x, sampling=sampling, **kw)  # noqa: E731
        bounds, integer = (1e-9, 1.0), False
    else:  # the mechanism's noise parameter
        make = lambda x: spec.make(x, q=q, sampling=sampling, **kw)  # noqa: E731
        bounds, integer = (1e-6, 30.0) if spec.more_private == "down" else (1e-4, 1e4), False
        direction = "larger_is_more_private" if spec.more_private == "up" else "larger_is_less_private"
    t0 = time.perf_counter()
    with _quiet() as caught:
        res = calibrate_parameter(make, bounds, direction=direction, epsilon=args.epsilon,
                                  delta=args.delta, steps=1 if what == "steps" else args.steps, integer=integer,
                                  parameter=what, tol=args.tol)
    seconds = time.perf_counter() - t0
    notes = _Notes()
    notes.limited(caught)
    params = {"mechanism": args.mechanism, spec.noise: noise, "q": None if what == "q" else q,
              "steps": None if what == "steps" else args.steps,
              "sampling": sampling, **truncation, **_selections(args), "relation": args.relation,
              **({"group": args.group} if args.group > 1 else {})}
    if args.json:
        out = {**res.as_dict(), "params": params, "seconds": seconds, **notes.fields()}
        print(json.dumps(out, allow_nan=False, default=float))
        return notes.emit()
    fmt = (lambda v: f"{v:d}") if integer else (lambda v: f"{v:.8g}")
    head = " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items() if v is not None)
    lines = [f"calibrate --for {what}  target eps(delta={args.delta:g}) <= {args.epsilon:g}  {head}  ({seconds:.3f} s)"]
    if res.trivially_met:
        lines.append(f"{what} = {fmt(res.value)} (the end of the searched range) already meets the target: "
                     f"certified eps(delta) in [{res.interval.lower:.8g}, {res.interval.upper:.8g}]")
    else:
        more = "largest" if direction == "larger_is_less_private" else "smallest"
        lines.append(f"{what} = {fmt(res.value)}   the {more} value whose certified eps(delta) meets the target: "
                     f"[{res.interval.lower:.8g}, {res.interval.upper:.8g}] <= {args.epsilon:g}")
        b = res.beyond_interval
        verdict = ("certified NOT to meet the target" if res.beyond_certified
                   else "not certified to meet it (its interval holds the target)")
        lines.append(f"{what} = {fmt(res.beyond)}   {verdict}: [{b.lower:.8g}, {b.upper:.8g}]")
    print("\n".join(lines))
    return notes.emit()


def _add_tradeoff(sub) -> None:
    pt = sub.add_parser("tradeoff", help="trade-off curve beta(alpha) intervals (attack bounds)", epilog=EPILOG,
                        description="Certified interval for the trade-off function beta(alpha): the least "
                                    "type II error (1 - TPR) of any membership test at type I error "
                                    "(FPR) alpha, over both directions of the relation; plus the "
                                    "certified attack advantage and Gaussian-DP mu.")
    _add_common(pt)
    pt.add_argument("--alpha", type=_alpha, nargs="+", required=True, metavar="A",
                    help="type I error(s) / false-positive rate(s), each in [0, 1]")


def _run_tradeoff(args) -> int:
    _, make = mechanisms()[args.mechanism]
    with _quiet() as caught:
        t0 = time.perf_counter()
        mech = make(args)
        acc = make_method_accountant(args.method, mech.relation, args).compose(mech.event, args.steps)
        a = np.asarray(args.alpha, dtype=float)
        iv = acc.tradeoff(a)
        tpr = acc.max_tpr(a)
        adv = acc.advantage()
        mu = acc.gdp_mu()
        seconds = time.perf_counter() - t0
    lo, up = np.atleast_1d(iv.lower), np.atleast_1d(iv.upper)
    # trivial: beta in [0, 1 - alpha] (no test ruled out, none shown; alpha = 1 is exact: beta(1) = 0),
    # advantage in [0, 1], mu in [0, inf]
    triv = (lo <= 0.0) & (up >= (1.0 - a) * (1.0 - 1e-12)) & (a < 1.0)
    adv_triv = bool(adv.lower <= 0.0 and adv.upper >= 1.0)
    mu_triv = bool(mu.lower <= 0.0 and mu.upper == math.inf)
    notes = _Notes()
    notes.limited(caught, acc)
    notes.flag_trivial(triv, "beta in [0, 1 - alpha] (max TPR in [alpha, 1])", "alpha", a)
    if adv_triv:
        notes.trivial = True
        notes.add(f"trivial answer: the certified advantage interval is [0, 1]: it certifies nothing "
                  f"(exit status {EXIT_TRIVIAL})")
    if mu_triv:
        notes.trivial = True
        notes.add(f"trivial answer: the certified Gaussian-DP mu interval is [0, inf]: it certifies nothing "
                  f"(exit status {EXIT_TRIVIAL})")
    if args.json:
        rows = [{"alpha": float(x), "lower": _num(l), "upper": _num(u), "tpr_lower": _num(tl),
                 "tpr_upper": _num(tu), "trivial": bool(t)}
                for x, l, u, tl, tu, t in zip(a, lo, up, np.atleast_1d(tpr.lower), np.atleast_1d(tpr.upper), triv)]
        out = {"tradeoff": rows,
               "advantage": {"lower": _num(adv.lower), "upper": _num(adv.upper), "trivial": adv_triv},
               "gdp_mu": {"lower": _num(mu.lower), "upper": _num(mu.upper), "alpha_min": 1e-12,
                          "trivial": mu_triv},
               "method": args.method, "seconds": seconds, "params": _params(args, acc)}
        if not (math.isfinite(mu.lower) and math.isfinite(mu.upper)):
            out["note"] = ("null marks +infinity: a null gdp_mu upper means no mu is certified; null lower "
                           "and upper mean the curve is certified to satisfy no mu")
        out.update(notes.fields())
        print(json.dumps(out, allow_nan=False))
    else:
        p = _params(args, acc)
        head = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.items() if v is not None)
        lines = [f"tradeoff  method={args.method}  {head}  ({seconds:.3f} s)",
                 f"{'alpha (FPR)':>12}  {'beta lower':>14}  {'beta upper':>14}  {'max TPR lower':>14}  "
                 f"{'max TPR upper':>14}"]
        for x, l, u, tl, tu in zip(a, lo, up, np.atleast_1d(tpr.lower), np.atleast_1d(tpr.upper)):
            lines.append(f"{x:>12g}  {_fmt(l):>14}  {_fmt(u):>14}  {_fmt(tl):>14}  {_fmt(tu):>14}")
        lines.append(f"advantage in [{_fmt(adv.lower)}, {_fmt(adv.upper)}];  Gaussian-DP mu in "
                     f"[{_fmt(mu.lower)}, {_fmt(mu.upper)}] (alpha >= 1e-12)")
        print("\n".join(lines))
    return notes.emit()


def _add_serve(sub) -> None:
    ps = sub.add_parser(
        "serve", help="the privacy calculator in a web browser (or --export DIR: a static copy)",
        description="Start a local web page: dataset size, batch size, epochs, sampling, relation, delta and a "
                    "target epsilon or a noise multiplier in; the atlas's certified sigma at once, then the "
                    "accountant's certified sigma, epsilon over training and the trade-off curve.")
    ps.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    ps.add_argument("--port", type=_arg(V.int_at_least, 0), default=8050, help="port (default 8050; 0: any free one)")
    ps.add_argument("--export", metavar="DIR", default=None,
                    help="write a static copy of the page (atlas look-ups only, no server) into DIR and exit")


def _run_serve(args) -> int:
    if args.export is not None:
        from .web.export import export

        try:
            files = export(args.export)
        except OSError as e:
            return _fail(f"--export {args.export}: {e.strerror or e}", EXIT_USAGE)
        print("\n".join(files))
        return 0
    from .web.app import serve

    def ready(url):
        print(f"pldlib calculator: {url}  (Ctrl-C to stop)", flush=True)

    try:
        serve(args.host, args.port, ready=ready)
    except OSError as e:
        return _fail(f"--port {args.port}: cannot listen on {args.host}: {e.strerror or e}", EXIT_USAGE)
    return 0


def _add_calibrate(sub) -> None:
    pc = sub.add_parser(
        "calibrate", help="certified Gaussian noise multiplier, steps or sampling rate for a target", epilog=EPILOG,
        description="Smallest Gaussian noise multiplier sigma whose certified (PLD upper bound) "
                    "eps(delta) is <= the target epsilon, to a relative tolerance in sigma; with --for steps "
                    "or --for q, the largest number of steps or sampling rate at a given --sigma.")
    noises = sorted({mechanism_spec(n).noise for n in mechanism_names()})
    pc.add_argument("--for", dest="for_", choices=("steps", "q", *noises), default="sigma",
                    help="the parameter to calibrate (default sigma, the Gaussian noise multiplier); steps and q "
                         "need the mechanism's noise (e.g. --sigma); scale / eps0 need --mechanism laplace, "
                         "discrete_laplace / randomized_response")
    pc.add_argument("--mechanism", choices=sorted(mechanism_names()), default="gaussian",
                    help="the mechanism (default gaussian; the fast sigma path is Gaussian only)")
    for noise in noises:
        pc.add_argument(f"--{noise}", type=_positive_finite, default=None,
                        help=f"the mechanism's {noise} (with --for steps or --for q)")
    pc.add_argument("--epsilon", type=_positive_finite, required=True, metavar="E",
                    help="target epsilon (> 0)")
    pc.add_argument("--delta", type=_delta, required=True, metavar="D", help="target delta in (0, 1)")
    pc.add_argument("--q", type=_q, default=None, help="sampling probability in (0, 1] (default 1)")
    pc.add_argument("--steps", type=_steps, default=None,
                    help="number of compositions (integer >= 1; required except with --for steps)")
    pc.add_argument("--sampling", choices=SAMPLINGS, default=None,
                    help=f"sampling scheme (default: none if q = 1, poisson if q < 1; --for q: poisson; {TRUNCATED}: "
                         "with --batch-size and --dataset-size, calibrated by the generic search of --for)")
    _add_truncation(pc)
    _add_selections(pc)
    pc.add_argument("--relation", choices=RELATIONS, default="add_remove",
                    help="neighbouring relation (default add_remove)")
    pc.add_argument("--group", type=_steps, default=1, metavar="G",
                    help="user-level: each protected user has up to G records (default 1)")
    pc.add_argument("--tol", type=_positive_finite, default=1e-3,
                    help="relative tolerance on sigma (default 1e-3)")
    pc.add_argument("--table", default=None, metavar="PATH",
                    help="eps atlas (.npz, pldlib.atlas) used as a seed when it covers the query "
                         "(default: the curated atlas shipped under results/atlas/, if present)")
    pc.add_argument("--no-table", action="store_true", help="do not seed from the atlas")
    pc.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    _add_debug(pc)


def _run_calibrate(args) -> int:
    from .calibrate import MAX_EPSILON, TOL_RANGE, calibrate

    if args.for_ != "sigma" or args.mechanism != "gaussian" or args.sampling in SIZED:
        return _run_calibrate_for(args)
    _truncation(args)  # (--batch-size / --dataset-size without truncated_poisson)
    if args.sigma is not None:
        raise UsageError("argument --sigma: not allowed when calibrating sigma (use --for steps or --for q)")
    if args.steps is None:
        raise UsageError("argument --steps: required (or calibrate it: --for steps --sigma S)")
    if args.q is None:
        args.q = 1.0

    if args.epsilon > MAX_EPSILON:
        raise UsageError(f"argument --epsilon: must be <= {MAX_EPSILON:g} for calibration, got {args.epsilon:g} "
                         "(a larger target needs noise so small that one step's privacy loss cannot be certified)")
    if not (TOL_RANGE[0] <= args.tol <= TOL_RANGE[1]):
        raise UsageError(f"argument --tol: must be in [{TOL_RANGE[0]:g}, {TOL_RANGE[1]:g}] (a relative tolerance "
                         f"on sigma), got {args.tol:g}")

    if args.sampling is None:
        args.sampling = "poisson" if args.q < 1.0 else "none"
    elif args.sampling == "none" and args.q < 1.0:
        raise UsageError(f"argument --q: q = {args.q:g} < 1 needs --sampling poisson or wor "
                         "(got --sampling none)")
    t0 = time.perf_counter()
    table = None
    if not args.no_table:
        from .atlas import default_atlas_path, open_atlas

        path = args.table if args.table is not None else default_atlas_path()
        if path is not None:
            try:
                with _quiet():
                    table = open_atlas(path)  # (.npz, numpy only)
            except (OSError, ValueError, KeyError) as e:
                if args.table is not None:  # asked for explicitly: a bad path is bad input
                    why = (e.strerror or "cannot open it") if isinstance(e, OSError) and not isinstance(
                        e, FileNotFoundError) else ("no such file" if isinstance(e, FileNotFoundError) else
                                                    str(e) if _deliberate(e) else "not a pldlib atlas (.npz)")
                    raise UsageError(f"argument --table: cannot read {args.table!r}: {why}") from None
    table_seconds = time.perf_counter() - t0
    with _quiet() as caught:
        res = calibrate(args.epsilon, args.delta, args.q, args.steps, sampling=args.sampling,
                        relation=args.relation, tol=args.tol, table=table, group=args.group,
                        **_selections(args))
    notes = _Notes()  # (a calibrated sigma is never trivial: it is certified to meet the target)
    notes.limited(caught)
    if res.sigma_lower is None:
        notes.add(f"the search certified no sigma below {res.sigma:.8g} as too small: sigma is certified to "
                  f"meet the target, but not to be within --tol {args.tol:g} of the smallest that does")
    params = {"epsilon": args.epsilon, "delta": args.delta, "q": args.q, "steps": args.steps,
              "sampling": args.sampling, **_selections(args), "relation": args.relation, "tol": args.tol,
              **({"group": args.group} if args.group > 1 else {}),
              "mechanism": "gaussian", "method": "pld", "spacing": res.spacing,
              "evaluations": res.evaluations, "seed": res.seed,
              "calibration_seconds": res.seconds, "table_seconds": table_seconds}
    seconds = time.perf_counter() - t0  # everything: opening the table and the search
    if args.json:
        out = {"sigma": res.sigma,
               "epsilon": {"lower": _num(res.epsilon.lower), "upper": _num(res.epsilon.upper)},
               "sigma_lower": res.sigma_lower, "seconds": seconds, "params": params, **notes.fields()}
        print(json.dumps(out, allow_nan=False))
    else:
        lines = [f"calibrate  target eps={args.epsilon:g} delta={args.delta:g}  q={args.q:g} "
                 f"sampling={args.sampling}{f' selections={args.selections}' if args.selections > 1 else ''} "
                 f"relation={args.relation} steps={args.steps}"
                 f"{f' group={args.group}' if args.group > 1 else ''}  "
                 f"({seconds:.3f} s, of which {table_seconds:.3f} s opening the table; "
                 f"{res.evaluations} PLD evaluations, seed: {res.seed})",
                 f"sigma = {res.sigma:.8g}   certified eps(delta) in [{_fmt(res.epsilon.lower)}, "
                 f"{_fmt(res.epsilon.upper)}] <= {args.epsilon:g}"]
        if res.sigma_lower is not None:
            lines.append(f"sigma = {res.sigma_lower:.8g} is certified NOT to meet the target: the "
                         f"smallest feasible sigma lies in ({res.sigma_lower:.8g}, {res.sigma:.8g}]")
        print("\n".join(lines))
    return notes.emit()


def _resolve(args) -> None:
    """Cross-argument checks and defaults; raises UsageError naming the argument."""
    own, _ = mechanisms()[args.mechanism]
    for name in sorted({p for p, _ in mechanisms().values()}):
        if name != own and getattr(args, name) is not None:
            raise UsageError(f"argument --{name}: not allowed with --mechanism {args.mechanism} "
                             f"(use --{own})")
    if getattr(args, own) is None:
        raise UsageError(f"argument --{own}: required with --mechanism {args.mechanism}")
    if args.sampling is None:
        args.sampling = "poisson" if args.q < 1.0 else "none"
    elif args.sampling == "none" and args.q < 1.0:
        raise UsageError(f"argument --q: q = {args.q:g} < 1 needs --sampling poisson or wor "
                         "(got --sampling none)")
    _truncation(args)


def _params(args, accountant) -> dict:
    own, _ = mechanisms()[args.mechanism]
    h = getattr(accountant, "spacing", None)
    return {
        "mechanism": args.mechanism,
        own: getattr(args, own),
        "sensitivity": args.sensitivity,
        "q": args.batch_size / args.dataset_size if args.sampling == WITH_REPLACEMENT else args.q,
        "sampling": args.sampling,
        **_truncation(args),
        **_selections(args),
        "relation": args.relation,
        **({"group": args.group} if args.group > 1 else {}),
        "steps": args.steps,
        "spacing": None if h is None else float(h),
    }


# ---------------------------------------------------------------------------
# notes: nothing lost, nothing silent
# ---------------------------------------------------------------------------
@contextmanager
def _quiet():
    """Run library calls with numpy's floating-point warnings off and Python warnings
    recorded, not printed; yields the list of recorded warnings (read by :class:`_Notes`)."""
    with ExitStack() as stack:
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        stack.enter_context(np.errstate(all="ignore"))
        yield caught


def _values(xs, limit: int = 4) -> str:
    xs = [f"{float(x):g}" for x in xs]
    return ", ".join(xs[:limit]) + (f" (and {len(xs) - limit} more)" if len(xs) > limit else "")


class _Notes:
    """What the answer's reader must know besides its numbers: each note is one line on
    stderr and an entry of the JSON ``"notes"``; ``trivial`` decides the exit status."""

    def __init__(self):
        self.lines: list[tuple[str, str]] = []  # (kind "note" / "warning", text)
        self.trivial = False
        self.accuracy_limited = False

    def add(self, text: str, kind: str = "note") -> None:
        text = " ".join(str(text).split())
        if all(t != text for _, t in self.lines):
            self.lines.append((kind, text))

    def limited(self, caught, acc=None) -> None:
        """Accuracy-limited answers: the library's AccuracyLimitedWarning(s), or its flag."""
        msgs = [str(w.message) for w in caught if issubclass(w.category, AccuracyLimitedWarning)]
        for m in msgs:
            self.add("accuracy-limited: " + m.removeprefix(f"{PROG}: "))
        if msgs or getattr(acc, "accuracy_limited", False):
            self.accuracy_limited = True
            if not msgs:
                self.add("accuracy-limited: the automatic grid was coarsened to fit the memory or time "
                         "budget; the intervals are certified but wider than the automatic rule aims at")

    def flag_trivial(self, mask, what: str, at: str, values) -> None:
        """Note the answers (``mask``) whose certified interval is the trivial one ``what``."""
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            self.trivial = True
            self.add(f"trivial answer at {at} {_values(np.asarray(values, dtype=float)[mask])}: the certified "
                     f"interval is no better than {what}, which every mechanism satisfies: it certifies "
                     f"nothing (exit status {EXIT_TRIVIAL})")

    def fields(self) -> dict:
        return {"notes": [t for _, t in self.lines], "trivial": bool(self.trivial),
                "accuracy_limited": bool(self.accuracy_limited)}

    def emit(self) -> int:
        """Print the notes on stderr; returns the exit status of a printed answer."""
        for kind, text in self.lines:
            print(f"{PROG}: {kind}: {text}", file=sys.stderr)
        return EXIT_TRIVIAL if self.trivial else EXIT_OK


def _trivial_rows(command: str, values, lo, hi) -> np.ndarray:
    """Answers whose certified interval is no better than the bounds every pair satisfies
    (delta(eps) >= 1 - e^eps, from the event "everything"): epsilon in [ln(1 - delta), inf],
    delta in [max(0, 1 - e^eps), 1].  A lower end the method does not offer (NaN) counts as
    trivial; the lower end may sit a relative 1e-9 above the universal bound (round-off)."""
    x = np.asarray(values, dtype=float)
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    if command == "epsilon":
        floor = np.log1p(-x)
        return (hi == np.inf) & ~(lo > floor + 1e-9 * np.abs(floor))
    floor = np.maximum(-np.expm1(np.minimum(x, 0.0)), 0.0)
    return (hi >= 1.0) & ~(lo > floor + 1e-9 * floor)


def _answer_notes(args, values, lo, hi, acc, caught) -> _Notes:
    """Notes on an epsilon / delta answer."""
    notes = _Notes()
    notes.limited(caught, acc)
    arg, what = (("delta", "[ln(1 - delta), inf]") if args.command == "epsilon" else
                 ("epsilon", "[max(0, 1 - e^epsilon), 1]"))
    triv = _trivial_rows(args.command, values, lo, hi)
    notes.flag_trivial(triv, f"{args.command} in {what}", arg, values)
    if args.command == "epsilon":
        open_top = (hi == np.inf) & (lo < np.inf) & ~triv
        if open_top.any():
            notes.add(f"no finite upper bound on epsilon is certified at delta "
                      f"{_values(np.asarray(values)[open_top])} (only the lower bound)")
    est = getattr(acc, "_cli_estimate", None)
    if est is not None and method_info(args.method).kind != "estimate":
        gone = np.isnan(est) & np.isfinite(lo) & np.isfinite(hi)
        if gone.any():
            notes.add(f"no {args.method} estimate at {arg} {_values(np.asarray(values)[gone])} "
                      "(outside the range where it is defined); the certified bounds stand")
    coarse = _coarse(args, values, lo, hi)
    if coarse:
        notes.add(coarse, kind="warning")
    return notes


# ---------------------------------------------------------------------------
# running and output
# ---------------------------------------------------------------------------
def _run(args):
    """Build the mechanism and accountant, answer the query; returns (values, lo, hi, seconds, acc,
    notes)."""
    _, make = mechanisms()[args.mechanism]
    values = args.delta if args.command == "epsilon" else args.epsilon
    with _quiet() as caught:
        t0 = time.perf_counter()
        mech = make(args)
        acc = make_method_accountant(args.method, mech.relation, args).compose(mech.event, args.steps)
        query = acc.epsilon if args.command == "epsilon" else acc.delta
        iv = query(np.asarray(values, dtype=float))
        seconds = time.perf_counter() - t0
    lo = np.atleast_1d(np.asarray(iv.lower, dtype=float))
    hi = np.atleast_1d(np.asarray(iv.upper, dtype=float))
    acc._cli_estimate = (np.atleast_1d(np.asarray(iv.estimate, dtype=float))
                         if iv.estimate is not None else None)
    return values, lo, hi, seconds, acc, _answer_notes(args, values, lo, hi, acc, caught)


def _num(x: float):
    x = float(x)
    return x if math.isfinite(x) else None


def _json_output(args, values, lo, hi, seconds, acc, notes: _Notes) -> str:
    key, arg = ("epsilon", "delta") if args.command == "epsilon" else ("delta", "epsilon")
    triv = _trivial_rows(args.command, values, lo, hi)
    rows = [{arg: float(v), "lower": _num(l), "upper": _num(u), "trivial": bool(t)}
            for v, l, u, t in zip(values, lo, hi, triv)]
    est = getattr(acc, "_cli_estimate", None)
    if est is not None:  # an approximation, labelled as such
        for row, e in zip(rows, est):
            row["estimate"] = _num(e)
    out = {key: rows, "method": args.method, "seconds": seconds, "params": _params(args, acc)}
    if method_info(args.method).kind == "estimate":
        out["warning"] = f"{args.method} is an ESTIMATE, not a guarantee: lower and upper are null"
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        out["note"] = ("null marks a non-finite bound: a null lower is -infinity (no non-trivial "
                       "lower bound), a null upper is +infinity (no finite bound)")
    out.update(notes.fields())
    return json.dumps(out, allow_nan=False)


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x:.10g}" if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def _table_output(args, values, lo, hi, seconds, acc) -> str:
    p = _params(args, acc)
    head = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in p.items() if v is not None)
    lines = [f"{args.command}  method={args.method}  {head}  ({seconds:.3f} s)"]
    arg = "delta" if args.command == "epsilon" else "epsilon"
    est = getattr(acc, "_cli_estimate", None)
    cols = [arg, "lower", "upper", "width", "rel.width"] + (["estimate (no guarantee)"] if est is not None else [])
    body = []
    for j, (v, l, u) in enumerate(zip(values, lo, hi)):
        w = u - l if (math.isfinite(l) and math.isfinite(u)) else math.inf
        mag = max(abs(l), abs(u)) if math.isfinite(w) else math.inf
        rw = w / mag if (math.isfinite(w) and mag > 0) else (0.0 if w == 0 else math.inf)
        body.append([f"{v:g}", _fmt(l), _fmt(u), _fmt(w) if math.isfinite(w) else "inf",
                     f"{rw:.2e}" if math.isfinite(rw) else "inf"]
                    + ([_fmt(float(est[j]))] if est is not None else []))
    widths = [max(len(c), *(len(r[i]) for r in body)) for i, c in enumerate(cols)]
    lines.append("  ".join(c.rjust(wd) for c, wd in zip(cols, widths)))
    lines += ["  ".join(x.rjust(wd) for x, wd in zip(r, widths)) for r in body]
    return "\n".join(lines)


def _fail(message: str, code: int) -> int:
    one_line = " ".join(str(message).split())
    print(f"{PROG}: error: {one_line}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (the console script passes it to sys.exit)."""
    try:
        load_plugins()  # mechanisms and methods named in $PLDLIB_PLUGINS
    except ImportError as e:
        return _fail(str(e), EXIT_USAGE)
    parser = build_parser()
    try:
        if allocator.enabled(default=True):  # (a short process of our own: docs in pldlib.allocator)
            allocator.tune_allocator()
    except ValueError as e:
        return _fail(str(e), EXIT_USAGE)
    try:
        args = parser.parse_args(argv)
        if args.command not in ("calibrate", "serve"):
            _resolve(args)
    except UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    except SystemExit as e:  # --help / --version
        return int(e.code or 0) if not isinstance(e.code, str) else _fail(e.code, EXIT_USAGE)
    debug = bool(getattr(args, "debug", False)) or os.environ.get("PLDLIB_DEBUG", "") not in ("", "0")
    try:
        if args.command == "calibrate":
            return _run_calibrate(args)
        if args.command == "serve":
            return _run_serve(args)
        if args.command == "tradeoff":
            return _run_tradeoff(args)
        values, lo, hi, seconds, acc, notes = _run(args)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as e:  # one line instead of a traceback
        if debug:
            raise
        message, code = _error_line(e)
        return _fail(message, code)
    # the whole answer is built before anything is printed (no partial output)
    text = (_json_output(args, values, lo, hi, seconds, acc, notes) if args.json
            else _table_output(args, values, lo, hi, seconds, acc))
    print(text)
    return notes.emit()


#: packages whose own exception text is not for users (raised inside them = an internal error)
_FOREIGN = ("numpy", "scipy")


def _frames(e: BaseException):
    return traceback.extract_tb(e.__traceback__) if e.__traceback__ is not None else []


def _foreign(filename: str) -> bool:
    """A file of numpy / scipy, another installed package or the standard library."""
    parts = os.path.normpath(filename).split(os.sep)
    if "pldlib" in parts:
        return False
    return (any(p in _FOREIGN for p in parts) or "site-packages" in parts
            or os.path.abspath(filename).startswith(sysconfig.get_paths()["stdlib"] + os.sep))


def _deliberate(e: BaseException) -> bool:
    """Whether ``e`` was raised by a ``raise`` statement of our own (a documented error with a
    message written for users), not by numpy / scipy or a built-in operation (raw text)."""
    frames = _frames(e)
    if not frames:
        return bool(str(e))
    last = frames[-1]
    return not _foreign(last.filename) and (last.line or "").lstrip().startswith("raise")


def _where(e: BaseException) -> str:
    """Where ``e`` arose: the innermost pldlib line (and the foreign package beneath it)."""
    frames = _frames(e)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    own = [f for f in frames if not _foreign(f.filename)]
    where = ""
    if own:
        f = own[-1]
        path = os.path.relpath(f.filename, root) if f.filename.startswith(root) else os.path.basename(f.filename)
        where = f" at {path}:{f.lineno}"
    if frames and _foreign(frames[-1].filename):
        pkg = next((p for p in os.path.normpath(frames[-1].filename).split(os.sep) if p in _FOREIGN), "a library")
        where += f" (raised inside {pkg})"
    return where


def _error_line(e: Exception) -> tuple[str, int]:
    """(one-line message, exit status) of an exception: documented errors keep their message;
    anything else is an internal error named by type and place, without raw library text."""
    name = type(e).__name__
    if isinstance(e, UsageError):
        return str(e), EXIT_USAGE
    if isinstance(e, (PrecisionLimitError, CalibrationError, GridTooLargeError)):
        return (f"{name}: {e}" if str(e) else name), EXIT_LIMIT
    if isinstance(e, (OverflowError, MemoryError)):
        if _deliberate(e) and str(e):
            return f"{name}: {e}", EXIT_LIMIT
        what = ("the computation overflowed double precision" if isinstance(e, OverflowError)
                else "the computation ran out of memory")
        return (f"{name}{_where(e)}: {what}; these inputs are beyond what can be computed here "
                "(try more noise, fewer steps or a coarser --interval)"), EXIT_LIMIT
    if isinstance(e, (ValueError, TypeError, NotImplementedError)) and _deliberate(e):
        return (str(e) or name), EXIT_USAGE
    return (f"internal error: {name}{_where(e)}; rerun with --debug (or PLDLIB_DEBUG=1) for the traceback "
            "and please report it"), EXIT_INTERNAL


def _coarse(args, values, lo, hi) -> str | None:
    """The warning when an explicit --interval left an interval wider than half its upper end:
    still certified, but too coarse to mean much (None otherwise)."""
    if getattr(args, "spacing", None) is None:
        return None
    for v, l, u in zip(values, lo, hi):
        if math.isfinite(u) and u > 0 and (u - max(l, 0.0)) > 0.5 * u:
            arg = "delta" if args.command == "epsilon" else "epsilon"
            return (f"--spacing {args.spacing:g} is too coarse here: at {arg} {v:g} the certified "
                    f"interval [{l:.4g}, {u:.4g}] is wider than half its upper end; use a smaller --spacing or "
                    "omit it (automatic)")
    return None


if __name__ == "__main__":
    sys.exit(main())
