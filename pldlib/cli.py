"""Command-line interface: ``pldlib epsilon ...``, ``pldlib delta ...``, ``pldlib tradeoff ...``.

Examples
--------
::

    pldlib epsilon --mechanism gaussian --sigma 0.8 --steps 10000 --delta 1e-6 1e-5
    pldlib delta --mechanism laplace --scale 2 --steps 100 --epsilon 1 5 --json

With ``--json`` exactly one JSON object is printed on stdout (strictly valid
JSON: non-finite numbers are written as ``null`` and explained in ``"note"``)::

    {"epsilon": [{"delta": d, "lower": x, "upper": y}, ...],
     "method": "pld", "seconds": t, "params": {...}}

``seconds`` is the wall time of the accounting itself (building the accountant
and answering the query), not of interpreter start-up or imports.

Exit status: 0 success; 2 bad or unsupported input (one line on stderr naming
the argument); 3 the answer is beyond what can be certified at this accuracy
or the grid would be too large (:class:`pldlib.PrecisionLimitError`,
:class:`pldlib.GridTooLargeError`, single-step losses too large); 1 an
unexpected internal error (one line; set ``PLDLIB_DEBUG=1`` for a traceback).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import warnings
from typing import Callable

import numpy as np

from . import __version__, allocator
from ._validate import PrecisionLimitError
from .methods.base import Estimate
from .calibrate import CalibrationError
from ._validate import GridTooLargeError
from .pld.compose import DEFAULT_MAX_BINS
from .mechanisms import Gaussian, Laplace, Mechanism

__all__ = ["main", "build_parser", "MECHANISMS", "EXIT_OK", "EXIT_USAGE", "EXIT_LIMIT"]

PROG = "pldlib"
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_LIMIT = 3

from ._validate import RELATIONS
from .methods import accountant_class, method_info, method_names
from .sampling import sampling_names

SAMPLINGS = sampling_names()

#: method options the CLI exposes: flag -> constructor keyword of the accountant
METHOD_OPTIONS = {"--interval": "interval", "--eps-error": "eps_error", "--delta-error": "delta_error",
                  "--max-bins": "max_bins"}
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


def _make_gaussian(args) -> Mechanism:
    return Gaussian(sigma=args.sigma, sensitivity=args.sensitivity, q=args.q,
                    sampling=args.sampling, relation=args.relation, group=args.group)


def _make_laplace(args) -> Mechanism:
    return Laplace(scale=args.scale, sensitivity=args.sensitivity, q=args.q,
                   sampling=args.sampling, relation=args.relation, group=args.group)


#: mechanism name -> (name of its noise parameter, constructor from parsed args)
MECHANISMS: dict[str, tuple[str, Callable]] = {
    "gaussian": ("sigma", _make_gaussian),
    "laplace": ("scale", _make_laplace),
}
_NOISE_PARAMS = sorted({p for p, _ in MECHANISMS.values()})


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


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def _positive_finite(text: str) -> float:
    v = _number(text)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return v


def _steps(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
        if not (math.isfinite(f) and f.is_integer()):
            raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
        v = int(f)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return v


def _delta(text: str) -> float:
    v = _number(text)
    if not (0.0 < v < 1.0):
        raise argparse.ArgumentTypeError(f"each delta must be in (0, 1), got {text!r}")
    return v


def _epsilon(text: str) -> float:
    v = _number(text)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"each epsilon must be finite, got {text!r}")
    return v


def _q(text: str) -> float:
    v = _number(text)
    if not (0.0 < v <= 1.0):
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return v


def _max_bins(text: str) -> int:
    v = _steps(text)
    if v < 16:
        raise argparse.ArgumentTypeError(f"must be an integer >= 16, got {text!r}")
    return v


def _delta_error(text: str) -> float:
    v = _number(text)
    if not (0.0 < v < 1.0):
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text!r}")
    return v


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mechanism")
    g.add_argument("--mechanism", required=True, choices=sorted(MECHANISMS),
                   help="base mechanism")
    g.add_argument("--sigma", type=_positive_finite,
                   help="Gaussian noise multiplier (noise std = sigma * sensitivity)")
    g.add_argument("--scale", type=_positive_finite, help="Laplace noise scale b")
    g.add_argument("--sensitivity", type=_positive_finite, default=1.0,
                   help="sensitivity (L2 for gaussian, L1 for laplace; default 1)")
    g.add_argument("--q", type=_q, default=1.0,
                   help="sampling probability in (0, 1] (default 1)")
    g.add_argument("--sampling", choices=SAMPLINGS, default=None,
                   help="sampling scheme (default: none if q = 1, poisson if q < 1)")
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
    a.add_argument("--interval", type=_positive_finite, default=None,
                   help="grid spacing h of the privacy-loss discretisation (the accuracy knob; "
                        "smaller = tighter and slower; default: chosen automatically)")
    a.add_argument("--eps-error", type=_positive_finite, default=None,
                   help="prv only: target error in epsilon (default 0.01)")
    a.add_argument("--delta-error", type=_delta_error, default=None,
                   help="prv only: target error in delta (default 1e-12)")
    a.add_argument("--max-bins", type=_max_bins, default=None,
                   help=f"pld / prv: cap on the FFT length (memory guard; default {DEFAULT_MAX_BINS})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Certified differential-privacy accounting: each answer is an interval "
                    "[lower, upper] that contains the exact value.",
        epilog="Exit status: 0 ok, 2 bad or unsupported input, 3 precision or grid-size limit, "
               "1 internal error.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    pe = sub.add_parser("epsilon", help="epsilon(delta) intervals",
                        description="Certified interval for epsilon at each given delta.")
    _add_common(pe)
    pe.add_argument("--delta", type=_delta, nargs="+", required=True, metavar="D",
                    help="target delta(s), each in (0, 1)")
    pd = sub.add_parser("delta", help="delta(epsilon) intervals",
                        description="Certified interval for delta at each given epsilon.")
    _add_common(pd)
    pd.add_argument("--epsilon", type=_epsilon, nargs="+", required=True, metavar="E",
                    help="epsilon value(s), finite (negative allowed)")
    _add_calibrate(sub)
    _add_tradeoff(sub)
    return parser


# -- pldlib tradeoff (docs/MATH.md section 10) ---------------------------------------------
def _alpha(text: str) -> float:
    x = _number(text)
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text!r}")
    return x


def _add_tradeoff(sub) -> None:
    pt = sub.add_parser("tradeoff", help="trade-off curve beta(alpha) intervals (attack bounds)",
                        description="Certified interval for the trade-off function beta(alpha): the least "
                                    "type II error (1 - TPR) of any membership test at type I error "
                                    "(FPR) alpha, over both directions of the relation; plus the "
                                    "certified attack advantage and Gaussian-DP mu.")
    _add_common(pt)
    pt.add_argument("--alpha", type=_alpha, nargs="+", required=True, metavar="A",
                    help="type I error(s) / false-positive rate(s), each in [0, 1]")


def _run_tradeoff(args) -> int:
    _, make = MECHANISMS[args.mechanism]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
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
    if args.json:
        rows = [{"alpha": float(x), "lower": _num(l), "upper": _num(u), "tpr_lower": _num(tl),
                 "tpr_upper": _num(tu)} for x, l, u, tl, tu in zip(a, lo, up, np.atleast_1d(tpr.lower),
                                                                   np.atleast_1d(tpr.upper))]
        out = {"tradeoff": rows, "advantage": {"lower": _num(adv.lower), "upper": _num(adv.upper)},
               "gdp_mu": {"lower": _num(mu.lower), "upper": _num(mu.upper), "alpha_min": 1e-12},
               "method": args.method, "seconds": seconds, "params": _params(args, acc)}
        if not (math.isfinite(mu.lower) and math.isfinite(mu.upper)):
            out["note"] = ("null marks +infinity: a null gdp_mu upper means no mu is certified; null lower "
                           "and upper mean the curve is certified to satisfy no mu")
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
    return EXIT_OK


def _add_calibrate(sub) -> None:
    pc = sub.add_parser(
        "calibrate", help="smallest certified Gaussian noise multiplier for a target",
        description="Smallest Gaussian noise multiplier sigma whose certified (PLD upper bound) "
                    "eps(delta) is <= the target epsilon, to a relative tolerance in sigma.")
    pc.add_argument("--epsilon", type=_positive_finite, required=True, metavar="E",
                    help="target epsilon (> 0)")
    pc.add_argument("--delta", type=_delta, required=True, metavar="D", help="target delta in (0, 1)")
    pc.add_argument("--q", type=_q, default=1.0, help="sampling probability in (0, 1] (default 1)")
    pc.add_argument("--steps", type=_steps, required=True, help="number of compositions (integer >= 1)")
    pc.add_argument("--sampling", choices=SAMPLINGS, default=None,
                    help="sampling scheme (default: none if q = 1, poisson if q < 1)")
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


def _run_calibrate(args) -> int:
    from .calibrate import MAX_EPSILON, TOL_RANGE, calibrate

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
                table = open_atlas(path)  # (.npz, numpy only)
            except (OSError, ValueError, KeyError) as e:
                if args.table is not None:  # asked for explicitly: a bad path is bad input
                    raise UsageError(f"argument --table: cannot read {args.table!r}: {e}") from None
    table_seconds = time.perf_counter() - t0
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        res = calibrate(args.epsilon, args.delta, args.q, args.steps, sampling=args.sampling,
                        relation=args.relation, tol=args.tol, table=table, group=args.group)
    params = {"epsilon": args.epsilon, "delta": args.delta, "q": args.q, "steps": args.steps,
              "sampling": args.sampling, "relation": args.relation, "tol": args.tol,
              **({"group": args.group} if args.group > 1 else {}),
              "mechanism": "gaussian", "method": "pld", "interval": res.interval,
              "evaluations": res.evaluations, "seed": res.seed,
              "calibration_seconds": res.seconds, "table_seconds": table_seconds}
    seconds = time.perf_counter() - t0  # everything: opening the table and the search
    if args.json:
        out = {"sigma": res.sigma,
               "epsilon": {"lower": _num(res.epsilon.lower), "upper": _num(res.epsilon.upper)},
               "sigma_lower": res.sigma_lower, "seconds": seconds, "params": params}
        print(json.dumps(out, allow_nan=False))
    else:
        lines = [f"calibrate  target eps={args.epsilon:g} delta={args.delta:g}  q={args.q:g} "
                 f"sampling={args.sampling} relation={args.relation} steps={args.steps}"
                 f"{f' group={args.group}' if args.group > 1 else ''}  "
                 f"({seconds:.3f} s, of which {table_seconds:.3f} s opening the table; "
                 f"{res.evaluations} PLD evaluations, seed: {res.seed})",
                 f"sigma = {res.sigma:.8g}   certified eps(delta) in [{_fmt(res.epsilon.lower)}, "
                 f"{_fmt(res.epsilon.upper)}] <= {args.epsilon:g}"]
        if res.sigma_lower is not None:
            lines.append(f"sigma = {res.sigma_lower:.8g} is certified NOT to meet the target: the "
                         f"smallest feasible sigma lies in ({res.sigma_lower:.8g}, {res.sigma:.8g}]")
        print("\n".join(lines))
    return EXIT_OK


def _resolve(args) -> None:
    """Cross-argument checks and defaults; raises UsageError naming the argument."""
    own, _ = MECHANISMS[args.mechanism]
    for name in _NOISE_PARAMS:
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


def _params(args, accountant) -> dict:
    own, _ = MECHANISMS[args.mechanism]
    h = getattr(accountant, "interval", None)
    return {
        "mechanism": args.mechanism,
        own: getattr(args, own),
        "sensitivity": args.sensitivity,
        "q": args.q,
        "sampling": args.sampling,
        "relation": args.relation,
        **({"group": args.group} if args.group > 1 else {}),
        "steps": args.steps,
        "interval": None if h is None else float(h),
    }


# ---------------------------------------------------------------------------
# running and output
# ---------------------------------------------------------------------------
def _run(args):
    """Build the mechanism and accountant, answer the query; returns (values, lo, hi, seconds, acc)."""
    _, make = MECHANISMS[args.mechanism]
    values = args.delta if args.command == "epsilon" else args.epsilon
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        mech = make(args)
        acc = make_method_accountant(args.method, mech.relation, args).compose(mech.event, args.steps)
        query = acc.epsilon if args.command == "epsilon" else acc.delta
        iv = query(np.asarray(values, dtype=float))
        seconds = time.perf_counter() - t0
    lo = np.atleast_1d(np.asarray(iv.lower, dtype=float))
    hi = np.atleast_1d(np.asarray(iv.upper, dtype=float))
    acc._cli_estimate = (np.atleast_1d(np.asarray(iv.estimate, dtype=float))
                         if isinstance(iv, Estimate) else None)
    return values, lo, hi, seconds, acc


def _num(x: float):
    x = float(x)
    return x if math.isfinite(x) else None


def _json_output(args, values, lo, hi, seconds, acc) -> str:
    key, arg = ("epsilon", "delta") if args.command == "epsilon" else ("delta", "epsilon")
    rows = [{arg: float(v), "lower": _num(l), "upper": _num(u)} for v, l, u in zip(values, lo, hi)]
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
    parser = build_parser()
    try:
        if allocator.enabled(default=True):  # (a short process of our own: docs in pldlib.allocator)
            allocator.tune_allocator()
    except ValueError as e:
        return _fail(str(e), EXIT_USAGE)
    try:
        args = parser.parse_args(argv)
        if args.command != "calibrate":
            _resolve(args)
    except UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    except SystemExit as e:  # --help / --version
        return int(e.code or 0) if not isinstance(e.code, str) else _fail(e.code, EXIT_USAGE)
    try:
        if args.command == "calibrate":
            return _run_calibrate(args)
        if args.command == "tradeoff":
            return _run_tradeoff(args)
        values, lo, hi, seconds, acc = _run(args)
    except UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    except (PrecisionLimitError, CalibrationError, GridTooLargeError, OverflowError, MemoryError) as e:
        return _fail(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, EXIT_LIMIT)
    except (ValueError, TypeError, NotImplementedError) as e:
        return _fail(str(e) or type(e).__name__, EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as e:  # one line instead of a traceback
        if os.environ.get("PLDLIB_DEBUG"):
            raise
        return _fail(f"internal error: {type(e).__name__}: {e} (set PLDLIB_DEBUG=1 for a traceback)",
                     EXIT_INTERNAL)
    if args.json:
        print(_json_output(args, values, lo, hi, seconds, acc))
    else:
        print(_table_output(args, values, lo, hi, seconds, acc))
    _warn_coarse(args, values, lo, hi)
    return EXIT_OK


def _warn_coarse(args, values, lo, hi) -> None:
    """One warning line on stderr when an explicit --interval left an interval wider than half
    its upper end: still certified, but too coarse to mean much."""
    if getattr(args, "interval", None) is None:
        return
    for v, l, u in zip(values, lo, hi):
        if math.isfinite(u) and u > 0 and (u - max(l, 0.0)) > 0.5 * u:
            arg = "delta" if args.command == "epsilon" else "epsilon"
            print(f"{PROG}: warning: --interval {args.interval:g} is too coarse here: at {arg} {v:g} the certified "
                  f"interval [{l:.4g}, {u:.4g}] is wider than half its upper end; use a smaller --interval or "
                  "omit it (automatic)", file=sys.stderr)
            return


if __name__ == "__main__":
    sys.exit(main())
