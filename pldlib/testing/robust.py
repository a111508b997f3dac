"""Robustness runner: random valid inputs, each call in a forked child under a memory cap
and a time limit (issue 22; ``make robust``, tests/test_robust.py).

Every case is one PLD accountant query (``epsilon(delta)`` or ``delta(eps)``) of a
random valid composition: unsampled or subsampled (Poisson / WOR) Gaussian, Laplace,
randomized response, (eps0, delta0)-DP, discrete Laplace, or a heterogeneous list of
them, under every relation.  A case *passes* when it answers lower <= upper (both
not NaN) within the limits, or refuses with :class:`pldlib.PrecisionLimitError`
(the documented refusal: counted separately).  Where a closed form exists (lists of
unsampled Gaussians: one Gaussian with mu^2 = c^2 sum k / sigma^2) the interval is
also checked against an mpmath evaluation of that closed form at 40 digits (written
here, independently of :mod:`pldlib.exact`).

Issue 39 adds families with independent truths (:mod:`pldlib.testing.robust_truths`), each
run with a random method (pld, prv, spa, rdp where they answer) and checked at BOTH ends:
an upper end below the truth (relative slack 1e-9) is ``unsound upper``, a lower end above it
(relative 1e-9 plus an absolute 1e-300) ``unsound lower``.  See :data:`FAMILIES`.

    python -m pldlib.testing.robust --cases 2000 --seed 1 --workers 2 --out results/ROBUSTNESS.md
    python -m pldlib.testing.robust --family allocation,rr --cases 50
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import resource
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

RELATIONS = ("add", "remove", "add_remove", "substitution")
MEM_CAP = 2 * 2**30
TIME_LIMIT = 12.0  # (the accountants' default time budget is 10 s; a second of margin and process overhead)
#: the explicit-interval family runs under the cap of issue 39 (3 GB)
MEM_CAP_EXPLICIT = 3 * 2**30
#: the explicit-interval family's time limit is this many times TIME_LIMIT (no time budget applies)
EXPLICIT_TIME_FACTOR = 3
#: seconds the child may spend on the mpmath truth after the library has answered
TRUTH_LIMIT = 120.0
#: relative slack of both checks, and the absolute slack of the lower-end check: 1e-300 is
#: below every delta or power a double represents to full relative precision near the
#: subnormal range (a lower end of 1e-310 against a truth of 0 is representation, not a claim)
REL_SLACK = 1e-9
ABS_SLACK = 1e-300
#: families of random cases (--family): name -> the truth each is checked against
FAMILIES = {
    "mixed": "the original mix (every event, relation); 40-digit closed form for lists of unsampled Gaussians, "
             "lower <= upper otherwise",
    "allocation": "random allocation / shuffle, one epoch of t = 2 steps: exact hockey-stick of the epoch "
                  "pair by 1-D mpmath quadrature (robust_truths.allocation_delta), max_tpr by its Neyman-Pearson "
                  "threshold (robust_truths.allocation_power); shuffle: upper end only",
    "negeps": "long very private Poisson/WOR subsampled Gaussian at eps < 0: the identity "
              "1 - e^eps + e^eps delta_rev(-eps), delta_rev bounded by a Chernoff/RDP bound "
              "(robust_truths.negative_eps_delta)",
    "rr": "randomized response over eps0 in [1e-3, 60]: exact binomial sums at 60 digits from the double "
          "eps0 (robust_truths.rr_delta)",
    "tradeoff": "max_tpr of one subsampled Gaussian step: exact Neyman-Pearson power (closed form / "
                "mpmath bisection; robust_truths.np_power)",
    "explicit": "explicit spacing under a 3 GB cap: an answer or GridTooLargeError, never MemoryError; "
                "one Poisson step against its closed form (robust_truths.poisson_gauss_delta1), eps < 0 "
                "against the identity",
}
#: share of each family in a --family all run
FAMILY_WEIGHTS = {"mixed": 0.5, "allocation": 0.1, "negeps": 0.1, "rr": 0.1, "tradeoff": 0.1, "explicit": 0.1}
METHODS = ("pld", "prv", "spa", "rdp")


def _logu(rng, lo, hi):
    return float(10 ** rng.uniform(math.log10(lo), math.log10(hi)))


def random_step(rng, relation):
    """One (step spec, count) with every parameter over the issue's valid domain."""
    kind = rng.choice(["gauss", "gauss", "sgauss", "sgauss", "slaplace", "laplace", "rr", "approx", "dlaplace"])
    k = int(_logu(rng, 1, 1e9)) if rng.random() < 0.7 else int(_logu(rng, 1, 1e4))
    if kind == "gauss":
        return {"kind": "gauss", "sigma": _logu(rng, 0.05, 1e3)}, k
    if kind == "sgauss":
        scheme = "poisson" if relation != "substitution" or rng.random() < 0.5 else "wor"
        scheme = rng.choice(["poisson", "wor"]) if relation in ("add_remove", "substitution") else "poisson"
        return {"kind": "sgauss", "sigma": _logu(rng, 0.05, 1e3), "q": _logu(rng, 1e-8, 1.0),
                "scheme": str(scheme)}, k
    if kind == "slaplace":
        return {"kind": "slaplace", "scale": _logu(rng, 0.05, 1e3), "q": _logu(rng, 1e-8, 1.0)}, k
    if kind == "laplace":
        return {"kind": "laplace", "scale": _logu(rng, 0.05, 1e3)}, int(_logu(rng, 1, 1e4))
    if kind == "rr":
        return {"kind": "rr", "eps0": _logu(rng, 1e-3, 10)}, k
    if kind == "approx":
        e0 = 0.0 if rng.random() < 0.3 else _logu(rng, 1e-3, 10)
        return {"kind": "approx", "eps0": e0, "delta0": _logu(rng, 1e-12, 1e-3)}, k
    return {"kind": "dlaplace", "scale": _logu(rng, 0.05, 100)}, int(_logu(rng, 1, 1e4))


def random_case(rng):
    relation = str(rng.choice(RELATIONS))
    n = 1 if rng.random() < 0.75 else int(rng.integers(2, 4))
    steps = [random_step(rng, relation) for _ in range(n)]
    if rng.random() < 0.5:
        query = ("epsilon", _logu(rng, 1e-30, 0.99))
    else:
        query = ("delta", float(rng.uniform(0, 500)) if rng.random() < 0.3 else _logu(rng, 1e-3, 500))
    return {"relation": relation, "steps": [[s, k] for s, k in steps], "query": list(query)}


def _method(rng):
    return str(rng.choice(METHODS))


def _alloc_case(rng):
    rel = str(rng.choice(["add", "remove", "add_remove"]))
    scheme = "random_allocation" if rng.random() < 0.8 else "shuffle"
    step = {"kind": "alloc", "sigma": _logu(rng, 0.3, 5.0), "t": 2, "scheme": scheme}
    r = rng.random()
    if r < 0.5:
        query = ["delta", float(rng.uniform(-1.0, 8.0)) if rng.random() < 0.7 else _logu(rng, 1e-3, 30)]
    elif r < 0.8:
        query = ["epsilon", _logu(rng, 1e-10, 0.5)]
    else:
        query = ["max_tpr", 0.0 if rng.random() < 0.2 else _logu(rng, 1e-6, 0.5)]
    method = str(rng.choice(METHODS[:3]))  # (RDP has no formula for per-epoch schemes)
    return {"family": "allocation", "method": method, "relation": rel, "steps": [[step, 2]], "query": query}


def _negeps_case(rng):
    rel = str(rng.choice(["add", "remove", "add_remove"]))
    scheme = "poisson" if rng.random() < 0.75 else "wor"
    sigma = _logu(rng, 1.0, 300.0)
    q = _logu(rng, 1e-8, 1e-4)
    k = int(_logu(rng, 1e4, 1e9))
    step = {"kind": "sgauss", "sigma": sigma, "q": q, "scheme": scheme}
    query = ["delta", -_logu(rng, 1e-3, 3.0)] if rng.random() < 0.6 else ["epsilon", float(rng.uniform(0.02, 0.95))]
    return {"family": "negeps", "method": _method(rng), "relation": rel, "steps": [[step, k]], "query": query}


#: eps0 values that are not exact doubles (the bugs came from their rounding)
RR_ROUND = (0.1, 0.2, 0.3, 0.7, 1.1, 2.3, 10.1, 30.0, 60.1)


def _rr_case(rng):
    rel = str(rng.choice(RELATIONS))
    eps0 = float(rng.choice(RR_ROUND)) if rng.random() < 0.3 else _logu(rng, 1e-3, 60.0)
    k = int(_logu(rng, 1, 2000))
    r = rng.random()
    if r < 0.35:  # on a loss atom (2j - k) eps0, computed in doubles: the boundary cases
        j = int(rng.integers(k // 2, k + 1))
        query = ["delta", float((2 * j - k) * eps0)]
    elif r < 0.7:
        query = ["delta", float(rng.uniform(0, k * eps0 * 1.1))]
    else:
        query = ["epsilon", _logu(rng, 1e-12, 0.5)]
    method = str(rng.choice(METHODS[:3]))  # (RDP takes Gaussian noise only)
    return {"family": "rr", "method": method, "relation": rel,
            "steps": [[{"kind": "rr", "eps0": eps0}, k]], "query": query}


def _tradeoff_case(rng):
    rel = str(rng.choice(RELATIONS))
    scheme = "poisson" if rel == "substitution" or rng.random() < 0.8 else "wor"
    step = {"kind": "sgauss", "sigma": _logu(rng, 0.3, 5.0), "q": _logu(rng, 1e-3, 1.0), "scheme": scheme}
    alpha = 0.0 if rng.random() < 0.05 else _logu(rng, 1e-6, 0.9)
    return {"family": "tradeoff", "method": _method(rng), "relation": rel, "steps": [[step, 1]],
            "query": ["max_tpr", alpha]}


def _explicit_case(rng):
    rel = str(rng.choice(["add", "remove", "add_remove"]))
    scheme = "poisson" if rng.random() < 0.6 else "wor"
    k = 1 if rng.random() < 0.4 else int(_logu(rng, 2, 100))
    step = {"kind": "sgauss", "sigma": _logu(rng, 0.05, 3.0), "q": _logu(rng, 1e-5, 0.5), "scheme": scheme}
    r = rng.random()
    if r < 0.3:
        query = ["delta", 0.0]
    elif r < 0.6:
        query = ["delta", _logu(rng, 1e-3, 10)]
    elif r < 0.7:
        query = ["delta", -_logu(rng, 1e-3, 2)]
    else:
        query = ["epsilon", _logu(rng, 1e-10, 0.1)]
    return {"family": "explicit", "method": "pld", "relation": rel, "steps": [[step, k]], "query": query,
            "spacing": _logu(rng, 1e-5, 1e-2)}


def family_case(rng, family):
    """One random case of ``family`` (a key of :data:`FAMILIES`)."""
    if family == "mixed":
        return random_case(rng)
    return {"allocation": _alloc_case, "negeps": _negeps_case, "rr": _rr_case, "tradeoff": _tradeoff_case,
            "explicit": _explicit_case}[family](rng)


def make_cases(n, seed, families=("mixed",)):
    """``n`` cases: the old issue-22 sequence for ``("mixed",)``; otherwise each case's family is
    drawn first (weights :data:`FAMILY_WEIGHTS`, renormalised over ``families``)."""
    rng = np.random.default_rng(seed)
    families = list(families)
    if families == ["mixed"]:
        return [random_case(rng) for _ in range(n)]
    w = np.array([FAMILY_WEIGHTS[f] for f in families])
    w = w / w.sum()
    return [family_case(rng, str(families[rng.choice(len(families), p=w)])) for _ in range(n)]


def event_of(s):
    from pldlib import events as E

    kind = s["kind"]
    if kind == "gauss":
        return E.GaussianEvent(s["sigma"])
    if kind == "sgauss":
        return E.Sampled(E.GaussianEvent(s["sigma"]), s["q"], s["scheme"])
    if kind == "slaplace":
        return E.Sampled(E.LaplaceEvent(s["scale"]), s["q"], "poisson")
    if kind == "laplace":
        return E.LaplaceEvent(s["scale"])
    if kind == "rr":
        return E.RandomizedResponseEvent(s["eps0"])
    if kind == "approx":
        return E.ApproxDPEvent(s["eps0"], s["delta0"])
    if kind == "dlaplace":
        return E.DiscreteLaplaceEvent(s["scale"])
    if kind == "alloc":
        return E.Sampled(E.GaussianEvent(s["sigma"]), 1.0 / s["t"], s["scheme"])
    raise ValueError(kind)


def gaussian_truth(case):
    """The closed-form answer (mpmath, 40 digits) when every step is an unsampled Gaussian."""
    import mpmath

    if not all(s["kind"] == "gauss" for s, _ in case["steps"]):
        return None
    c = 2 if case["relation"] == "substitution" else 1
    with mpmath.workdps(40):
        mu = c * mpmath.sqrt(sum(mpmath.mpf(k) / mpmath.mpf(s["sigma"]) ** 2 for s, k in case["steps"]))

        def delta(e):
            e = mpmath.mpf(e)
            return mpmath.ncdf(-e / mu + mu / 2) - mpmath.exp(e) * mpmath.ncdf(-e / mu - mu / 2)

        what, x = case["query"]
        if what == "delta":
            return ("delta", delta(x))
        return ("epsilon", delta)  # checked through delta at the interval's ends


def family_truth(case, answer=None):
    """The independent truth of a family case (mpmath, :mod:`.robust_truths`), as plain strings
    (full precision survives the pipe): ``{"value": [lo, hi]}`` for delta / max_tpr queries,
    ``{"at_lower": [lo, hi], "at_upper": [lo, hi]}`` (delta at the answer's ends) for epsilon
    queries; None where the family has none (then only lower <= upper is checked)."""
    import mpmath

    from . import robust_truths as T

    fam = case.get("family", "mixed")
    if fam == "mixed":
        return None
    rel = case["relation"]
    (st, k), = case["steps"]
    what, x = case["query"]
    if fam == "allocation" and what == "max_tpr":
        def fn(a):
            return T.allocation_power(st["sigma"], a, rel)
    elif fam == "allocation":
        def fn(e):
            return T.allocation_delta(st["sigma"], st["t"], e, rel)
    elif fam == "rr":
        def fn(e):
            return T.rr_delta(st["eps0"], int(k), e)
    elif fam == "tradeoff":
        def fn(a):
            return T.np_power(st["sigma"], st["q"], a, rel, st["scheme"])
    elif fam in ("negeps", "explicit"):
        s_eff = st["sigma"] / 2 if st["scheme"] == "wor" else st["sigma"]

        def fn(e):
            if int(k) == 1:
                return T.poisson_gauss_delta1(s_eff, st["q"], e, rel)
            if e < 0:
                return T.negative_eps_delta(st["sigma"], st["q"], int(k), e, rel, st["scheme"])
            if fam == "negeps":
                return (mpmath.mpf(0), T.reversed_delta_upper(s_eff, st["q"], int(k), e, rel))
            return None
    else:
        raise ValueError(f"family: unknown {fam!r}")

    def ser(v):
        return None if v is None else [mpmath.nstr(v[0], 30), mpmath.nstr(v[1], 30)]

    if what != "epsilon":
        return {"value": ser(fn(x))}
    out = {}
    for end in ("lower", "upper"):
        e = answer[end]
        out["at_" + end] = ser(fn(e)) if math.isfinite(e) else None
    return out


def _classify(e):
    """(status, class name) of an exception: documented refusals, out of memory, or bare."""
    from pldlib import GridTooLargeError, PrecisionLimitError, UnsupportedEventError

    name = type(e).__name__
    if isinstance(e, (PrecisionLimitError, GridTooLargeError)):
        return "refused", name
    if isinstance(e, UnsupportedEventError):
        return "unsupported", name
    if type(e) is MemoryError:
        return "oom", name
    if type(e) is ValueError and str(e).startswith("spacing: "):
        # an explicit spacing the pair cannot use (wider than its whole loss range): the
        # argument check's one-line error, naming the argument and a usable value
        return "refused", "ValueError (spacing argument)"
    return "error", name


def _build(case):
    from pldlib.methods import make_accountant
    from pldlib.methods.pld import PLDAccountant

    method = case.get("method", "pld")
    if method == "pld":
        acc = PLDAccountant(case["relation"], **({"spacing": case["spacing"]} if case.get("spacing") else {}))
    else:
        acc = make_accountant(method, case["relation"])
    for s, k in case["steps"]:
        acc.compose(event_of(s), int(k))
    return acc


def _vm_size() -> int:
    """Bytes of address space this process has mapped now (0 where /proc is not there)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _child(case, conn):
    # the cap is on what the case itself maps: a child forked from a large parent (a test
    # worker with many threads and arenas) starts with the parent's mappings, which are added
    cap = (MEM_CAP_EXPLICIT if case.get("spacing") else MEM_CAP) + _vm_size()
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ValueError, OSError):
        pass
    t0 = time.perf_counter()
    out = {}
    try:
        import warnings

        acc = _build(case)
        what, x = case["query"]
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = {"epsilon": acc.epsilon, "delta": acc.delta, "max_tpr": acc.max_tpr}[what](x)
            limited = bool(acc.__dict__.get("accuracy_limited", False)) or any(
                "AccuracyLimited" in type(m.message).__name__ for m in w)
        out = {"status": "ok", "lower": float(r.lower), "upper": float(r.upper), "limited": limited}
    except Exception as e:  # (every outcome is recorded; MemoryError is an Exception too)
        st, name = _classify(e)
        out = {"status": st, "error_class": name, "error": f"{name}: {e}",
               "trace": traceback.format_exc()[-800:]}
    out["seconds"] = time.perf_counter() - t0
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    conn.send(out)
    if out["status"] == "ok" and case.get("family", "mixed") != "mixed":
        t1 = time.perf_counter()
        try:
            tr = {"truth": family_truth(case, out)}
        except Exception as e:  # a truth that cannot be computed is reported, not guessed
            tr = {"truth_error": f"{type(e).__name__}: {e}"}
        tr["truth_seconds"] = time.perf_counter() - t1
        conn.send(tr)
    conn.close()


def run_case(case, time_limit=TIME_LIMIT, truth_limit=TRUTH_LIMIT):
    """Run one case in a forked child (memory cap, time limit); returns its checked record.
    The child answers first (timed), then computes the family's truth (``truth_limit``)."""
    if case.get("spacing"):  # (an explicit grid has no time budget, by design: a longer limit)
        time_limit = time_limit * EXPLICIT_TIME_FACTOR
    ctx = mp.get_context("fork")
    a, b = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(case, b))
    t0 = time.perf_counter()
    p.start()
    b.close()
    rec = None
    if a.poll(time_limit):
        try:
            rec = a.recv()
        except EOFError:
            rec = None
    wall = time.perf_counter() - t0
    if rec is not None and rec["status"] == "ok" and case.get("family", "mixed") != "mixed":
        try:
            rec.update(a.recv() if a.poll(truth_limit) else {"truth_error": "truth over its time limit"})
        except EOFError:
            rec["truth_error"] = "truth: child died"
    p.join(5)
    if p.is_alive():
        p.kill()
        p.join()
    if rec is None:
        rec = {"status": "timeout" if wall >= time_limit else "crash", "seconds": wall, "peak_mb": math.nan,
               "error": f"exit code {p.exitcode}"}
    rec["case"] = case
    return check(rec)


def _upper_only(rec):
    """Cases whose truth bounds the answer from one side only: shuffle (the allocation pair is
    realised by the zero dataset: a lower bound on the truth), and RDP (no lower end)."""
    c = rec["case"]
    return c.get("method") == "rdp" or any(s.get("scheme") == "shuffle" for s, _ in c["steps"])


def check(rec):
    """Soundness: lower <= upper, not NaN; the closed form (mixed family) or the family's truth
    inside [lower, upper] up to :data:`REL_SLACK` / :data:`ABS_SLACK`.  Sets ``status`` to
    ``unsound`` with ``flags`` among lower>upper / unsound upper / unsound lower."""
    if rec["status"] != "ok":
        return rec
    lo, up = rec["lower"], rec["upper"]
    case = rec["case"]
    if case.get("method") == "rdp" and math.isnan(lo):
        lo = -math.inf  # (RDP states no lower end)
    if math.isnan(lo) or math.isnan(up) or lo > up:
        rec["status"] = "unsound"
        rec["flags"] = ["lower>upper"]
        rec["error"] = f"lower={lo} upper={up}"
        return rec
    if case.get("family", "mixed") == "mixed":
        return _check_gaussian(rec, lo, up)
    tr = rec.get("truth")
    if not tr:
        return rec
    import mpmath

    R, A = mpmath.mpf(REL_SLACK), mpmath.mpf(ABS_SLACK)
    flags = []
    what, x = case["query"]
    if what != "epsilon":
        if tr.get("value"):
            tl, th = (mpmath.mpf(v) for v in tr["value"])
            if up < tl * (1 - R):
                flags.append("unsound upper")
            if not _upper_only(rec) and lo > th * (1 + R) + A:
                flags.append("unsound lower")
    else:
        d = mpmath.mpf(x)
        if tr.get("at_upper") and mpmath.mpf(tr["at_upper"][0]) > d * (1 + R):
            flags.append("unsound upper")  # delta at the upper eps exceeds the target
        if not _upper_only(rec) and tr.get("at_lower") and mpmath.mpf(tr["at_lower"][1]) < d * (1 - R) - A:
            flags.append("unsound lower")  # delta at the lower eps already below the target
    if flags:
        rec["status"] = "unsound"
        rec["flags"] = flags
        rec["error"] = f"{' and '.join(flags)}: interval [{lo!r}, {up!r}], truth {tr}"
    return rec


def _check_gaussian(rec, lo, up):
    t = gaussian_truth(rec["case"])
    if t is not None:
        import mpmath

        what, val = t
        if what == "delta":
            ok_lo = mpmath.mpf(lo) * (1 - 1e-12) - 1e-300 <= val
            ok_up = val <= mpmath.mpf(up) * (1 + 1e-12) + 1e-300
        else:
            d = rec["case"]["query"][1]
            ok_up = not math.isfinite(up) or val(up) <= d * (1 + 1e-12)
            ok_lo = not math.isfinite(lo) or val(lo) >= d * (1 - 1e-12)
        if not (ok_lo and ok_up):
            rec["status"] = "unsound"
            rec["flags"] = (["unsound upper"] if not ok_up else []) + (["unsound lower"] if not ok_lo else [])
            rec["error"] = "closed form outside the interval"
    return rec


def rel_width(rec):
    """Relative width of an answer: eps answers relative to |upper| (floor 1e-3); delta answers
    relative to |upper| (floor 1e-300); family delta / max_tpr answers with a representable truth
    (a normal double) relative to the truth, NaN (no width claim) where that truth is outside the
    normal doubles.  (By the 1e-300 floor a delta answer certified below about 1e-302, such as
    [0, 5e-324], counts as narrow.)"""
    if rec["status"] != "ok" or rec["case"].get("method") == "rdp":  # (RDP: an upper end only)
        return math.nan
    lo, up = rec["lower"], rec["upper"]
    tv = (rec.get("truth") or {}).get("value")
    if tv:
        t = float(tv[0])
        if not (2.3e-308 <= t < math.inf):
            return math.nan  # the truth is not representable: no width claim
        return (up - lo) / t if math.isfinite(up - lo) else math.inf
    if not (math.isfinite(lo) and math.isfinite(up)):
        return 0.0 if lo == up else math.inf
    return (up - lo) / max(abs(up), 1e-300 if rec["case"]["query"][0] == "delta" else 1e-3)


def width_cause(rec) -> str:
    """Why an answer is wider than 1% (the first that applies): shuffling (the ends are the
    zero-dataset pair's and no amplification's, docs/MATH.md 13.4-13.5), the method's own accuracy (prv,
    spa), the budgets (accuracy-limited), an explicit spacing, random allocation's proven gap, a
    delta answer below 1e-10 (the truncated tails' 1e-32-scale mass), eps at delta < 1e-12, eps < 0.1
    (relative to a small answer), otherwise "other"."""
    c = rec["case"]
    what, x = c["query"]
    if any(s.get("scheme") == "shuffle" for s, _ in c["steps"]):
        return "shuffle (its worst case is not known: between the zero-dataset pair and no amplification)"
    if c.get("method", "pld") != "pld":
        return f"method {c['method']} (its own accuracy)"
    if c.get("spacing"):
        return "explicit spacing (the user's accuracy)"
    if rec.get("limited"):
        return "accuracy-limited (memory or time budget)"
    if c.get("family") == "allocation" or any(s.get("kind") == "alloc" for s, _ in c["steps"]):
        return "random allocation (gap between its proven bounds)"
    if what == "delta" and rec["upper"] < 1e-10:
        return "delta < 1e-10 (truncated tails)"
    if what == "epsilon" and x < 1e-12:
        return "epsilon at delta < 1e-12"
    if what == "epsilon" and abs(rec["upper"]) < 0.1:
        return "epsilon < 0.1"
    return "other"


def width_breakdown(records) -> list:
    """Markdown lines: answers wider than 1% by :func:`width_cause`, and the share over the
    two-sided answers (pld, prv, spa) and over pld's alone."""
    from collections import Counter

    two = [r for r in records if r["status"] == "ok" and r["case"].get("method", "pld") in ("pld", "prv", "spa")]
    ws = [(w, r) for w, r in ((rel_width(r), r) for r in two) if not math.isnan(w)]
    wide = [r for w, r in ws if w > 0.01]
    pld = [(w, r) for w, r in ws if r["case"].get("method", "pld") == "pld"]
    pld_wide = sum(w > 0.01 for w, _ in pld)
    lines = ["Answers wider than 1% (relative width as in the families table; two-sided methods pld, prv, spa): "
             f"{len(wide)} of {len(ws)} ({100 * len(wide) / max(len(ws), 1):.1f}%); pld alone: {pld_wide} of "
             f"{len(pld)} ({100 * pld_wide / max(len(pld), 1):.1f}%).", "", "| why wider than 1% | answers |",
             "|---|---|"]
    for k, v in Counter(width_cause(r) for r in wide).most_common():
        lines.append(f"| {k} | {v} |")
    return lines


def run(n, seed, workers=2, time_limit=TIME_LIMIT, progress=None, families=("mixed",)):
    cases = make_cases(n, seed, families)
    import pldlib  # noqa: F401  (imported once, inherited by every fork)

    out = []
    with ThreadPoolExecutor(workers) as ex:
        for i, rec in enumerate(ex.map(lambda c: run_case(c, time_limit), cases)):
            out.append(rec)
            if progress:
                progress(i, rec)
    return out


def describe(case):
    parts = []
    exact = case.get("family", "mixed") != "mixed"  # (family failures carry the exact doubles)
    for s, k in case["steps"]:
        args = ", ".join(f"{a}={v!r}" if exact else (f"{a}={v:.3g}" if isinstance(v, float) else f"{a}={v}")
                         for a, v in s.items() if a != "kind")
        parts.append(f"{s['kind']}({args}) x {k:,}")
    head = case["relation"] if case.get("method", "pld") == "pld" else f"{case['method']} {case['relation']}"
    if case.get("spacing"):
        head += f" spacing={case['spacing']:.3g}"
    what, x = case["query"]
    return f"{head}: " + " + ".join(parts) + (f"; {what}({x!r})" if exact else f"; {what}({x:.3g})")


def report(records, title, cmd):
    from collections import Counter

    cnt = Counter(r["status"] for r in records)
    flg = Counter(f for r in records for f in r.get("flags", ()))
    ok = [r for r in records if r["status"] == "ok"]
    times = sorted(records, key=lambda r: -r["seconds"])
    mem = [r["peak_mb"] for r in records if not math.isnan(r.get("peak_mb", math.nan))]
    widths = [(rel_width(r), r) for r in ok]
    widths = [w for w in widths if not math.isnan(w[0])]
    widest = max(widths, key=lambda w: w[0]) if widths else (math.nan, None)
    limited = sum(1 for r in ok if r.get("limited"))
    lines = [f"## {title}", "", f"Command: `{cmd}`", "",
             f"- cases: {len(records)}",
             f"- answered: {cnt['ok']} (of which accuracy-limited by the memory budget: {limited})",
             f"- refused with a documented error (PrecisionLimitError, GridTooLargeError; "
             f"UnsupportedEventError where a method cannot take the event; the spacing argument's "
             f"error where an explicit spacing exceeds the pair's loss range): {cnt['refused'] + cnt['unsupported']}",
             f"- unsound: {cnt['unsound']} (upper end below the truth: {flg['unsound upper']}, lower end above "
             f"it: {flg['unsound lower']}, lower > upper or NaN: {flg['lower>upper']})",
             f"- other exceptions: {cnt['error']}",
             f"- out of memory (cap {MEM_CAP / 2**30:.0f} GB; explicit intervals "
             f"{MEM_CAP_EXPLICIT / 2**30:.0f} GB): {cnt['oom'] + cnt['crash']}",
             f"- over the time limit ({TIME_LIMIT:.0f} s; explicit intervals "
             f"{EXPLICIT_TIME_FACTOR * TIME_LIMIT:.0f} s): {cnt['timeout']}",
             f"- worst time: {times[0]['seconds']:.2f} s" if times else "- worst time: -",
             f"- worst peak memory (child RSS incl. ~100 MB of imports): {max(mem):.0f} MB" if mem else "",
             f"- median time: {np.median([r['seconds'] for r in records]):.2f} s",
             f"- widest relative interval: {widest[0]:.3g}"
             + (f" ({describe(widest[1]['case'])})" if widest[1] else ""),
             f"- answered intervals with relative width > 1%: {sum(1 for w, _ in widths if w > 0.01)}", "",
             "Slowest ten:", "", "| seconds | peak MB | status | interval | case |", "|---|---|---|---|---|"]
    for r in times[:10]:
        iv = f"[{r['lower']:.6g}, {r['upper']:.6g}]" if "lower" in r else r.get("error", "")[:80]
        lines.append(f"| {r['seconds']:.2f} | {r['peak_mb']:.0f} | {r['status']} | {iv} | {describe(r['case'])} |")
    if any(r["case"].get("family", "mixed") != "mixed" for r in records):
        lines += ["", *family_table(records)]
    lines += ["", *width_breakdown(records)]
    bad = [r for r in records if r["status"] in ("unsound", "error", "oom", "crash", "timeout")]
    if bad:
        lines += ["", "Failures:", ""]
        for r in bad[:200]:
            lines.append(f"- {r['status']}{' (' + ', '.join(r['flags']) + ')' if r.get('flags') else ''}"
                         f"{' [' + r['case']['family'] + ']' if r['case'].get('family') else ''}: "
                         f"{describe(r['case'])}: {r.get('error', '')[:400]}")
            if r.get("trace"):  # (the child's traceback: a failure that does not reproduce is still read)
                lines += ["", "  ```", *("  " + t for t in r["trace"].rstrip().splitlines()[-12:]), "  ```", ""]
    return "\n".join(lines) + "\n"


def family_table(records):
    """Per-family counts (issue 39): the truth used, and cases / answered / refused (documented) /
    unsound upper / unsound lower / bare exceptions / out of memory / over time / no truth, and the
    share of intervals wider than 1% where the truth is representable (certified two-sided
    answers: pld, prv, spa)."""
    from collections import Counter, defaultdict

    by = defaultdict(list)
    for r in records:
        by[r["case"].get("family", "mixed")].append(r)
    lines = ["Families: every answer checked at both ends against the truth named; "
             f"unsound upper: upper < truth (1 - {REL_SLACK:g}); unsound lower: lower > truth (1 + {REL_SLACK:g}) "
             f"+ {ABS_SLACK:g} (eps answers: through delta at the answer's ends).", "",
             "| family | truth | cases | answered | refused (documented) | unsound upper | unsound lower "
             "| lower > upper | bare exceptions | out of memory | over time | no truth | wider than 1% |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for fam in [f for f in FAMILIES if f in by] + [f for f in by if f not in FAMILIES]:
        rs = by[fam]
        c = Counter(r["status"] for r in rs)
        fl = Counter(f for r in rs for f in r.get("flags", ()))
        answered = [r for r in rs if r["status"] in ("ok", "unsound")]
        ref = Counter(r.get("error_class", "?") for r in rs if r["status"] in ("refused", "unsupported"))
        # (answers whose truth could not be computed in its time; explicit cases of k > 1 steps at
        # eps >= 0 have none by design and are checked for lower <= upper only)
        notruth = sum(1 for r in rs if r["status"] == "ok" and fam != "mixed" and (
            r.get("truth_error") or (not r.get("truth") and fam != "explicit")))
        two = [r for r in rs if r["status"] == "ok" and r["case"].get("method", "pld") in ("pld", "prv", "spa")]
        ws = [w for w in (rel_width(r) for r in two) if not math.isnan(w)]
        wide = f"{sum(w > 0.01 for w in ws)}/{len(ws)}" + (f" ({100 * sum(w > 0.01 for w in ws) / len(ws):.0f}%)"
                                                            if ws else "")
        refs = ", ".join(f"{k} {v}" for k, v in sorted(ref.items()))
        lines.append(f"| {fam} | {FAMILIES.get(fam, '-')} | {len(rs)} | {len(answered)} | "
                     f"{c['refused'] + c['unsupported']}{' (' + refs + ')' if refs else ''} | "
                     f"{fl['unsound upper']} | {fl['unsound lower']} | {fl['lower>upper']} | {c['error']} | "
                     f"{c['oom'] + c['crash']} | {c['timeout']} | {notruth} | {wide} |")
    meth = Counter((r["case"].get("family", "mixed"), r["case"].get("method", "pld")) for r in records)
    lines += ["", "Cases per family and method: " + "; ".join(
        f"{f}/{m} {n}" for (f, m), n in sorted(meth.items()))]
    return lines


def issue_cases():
    """The inputs enumerated in issue 22 (items 1-3 of its first list)."""
    out = []
    for k in (10, 1000):
        for d in (1e-5, 1e-3):
            out.append({"relation": "add_remove", "steps": [[{"kind": "approx", "eps0": 0.0, "delta0": 1e-6}, k]],
                        "query": ["epsilon", d]})
    for rel in RELATIONS:
        scheme = "poisson"
        out.append({"relation": rel, "steps": [[{"kind": "sgauss", "sigma": 0.1, "q": 1e-6, "scheme": scheme}, 1]],
                    "query": ["epsilon", 1e-5]})
    for sigma in (0.3, 0.5, 0.7):
        out.append({"relation": "add_remove",
                    "steps": [[{"kind": "sgauss", "sigma": sigma, "q": 1e-6, "scheme": "poisson"}, 1]],
                    "query": ["epsilon", 1e-5]})
    for q in (0.9, 0.999):
        out.append({"relation": "add_remove",
                    "steps": [[{"kind": "sgauss", "sigma": 0.1, "q": q, "scheme": "poisson"}, 1]],
                    "query": ["epsilon", 1e-5]})
    for sigma in (0.05, 0.1, 0.3):
        out.append({"relation": "add_remove", "steps": [[{"kind": "gauss", "sigma": sigma}, 10**7]],
                    "query": ["epsilon", 1e-5]})
    out.append({"relation": "add_remove", "steps": [[{"kind": "gauss", "sigma": 200.0}, 10**7]],
                "query": ["epsilon", 1e-30]})
    out.append({"relation": "add_remove", "steps": [[{"kind": "gauss", "sigma": 0.05}, 10**7]],
                "query": ["delta", 1.0]})
    return out


def issue39_cases():
    """The reproducers of issue 39 as family cases (each checked against its family's truth)."""
    def g(sigma, q, scheme, k, rel, query, family, method="pld", spacing=None):
        c = {"family": family, "method": method, "relation": rel,
             "steps": [[{"kind": "sgauss", "sigma": sigma, "q": q, "scheme": scheme}, k]], "query": query}
        if spacing:
            c["spacing"] = spacing
        return c

    def al(sigma, rel, query, method="pld"):
        return {"family": "allocation", "method": method, "relation": rel,
                "steps": [[{"kind": "alloc", "sigma": sigma, "t": 2, "scheme": "random_allocation"}, 2]],
                "query": query}

    def rr(eps0, k, query):
        return {"family": "rr", "method": "pld", "relation": "add_remove",
                "steps": [[{"kind": "rr", "eps0": eps0}, k]], "query": query}

    return [al(1.0, "add", ["delta", 8.0]), al(1.0, "add", ["max_tpr", 0.0]), al(0.7, "add_remove", ["delta", 6.0]),
            al(0.7, "add_remove", ["epsilon", 1e-5]),
            g(5.0, 1e-5, "poisson", 10**9, "add_remove", ["epsilon", 0.5], "negeps"),
            g(5.0, 1e-5, "poisson", 10**9, "add_remove", ["epsilon", 0.9], "negeps"),
            g(5.0, 1e-7, "poisson", 10**7, "add_remove", ["delta", -0.5], "negeps"),
            g(163.0, 7e-6, "wor", 125000, "add_remove", ["delta", -0.5], "negeps"),
            rr(0.1, 10, ["delta", 1.0]), rr(60.1, 10, ["delta", 601.0]), rr(30.0, 1, ["delta", 1.0]),
            g(0.5, 0.5, "poisson", 1, "add_remove", ["max_tpr", 0.3], "tradeoff", method="prv"),
            g(0.1178546231923773, 0.00020371970639318756, "wor", 15, "add_remove", ["delta", 0.0], "explicit",
              spacing=1e-4)]


def issue39_report(records):
    lines = ["## Known hard cases: allocation floors, long private compositions, rounded atoms, trade-off directions, explicit grids", "",
             "Each against its family's truth (see the families table below); explicit intervals under a "
             f"{MEM_CAP_EXPLICIT / 2**30:.0f} GB cap.", "",
             "| case | status | seconds | interval | truth |", "|---|---|---|---|---|"]
    for r in records:
        st = r["status"] + (f" ({', '.join(r['flags'])})" if r.get("flags") else "")
        iv = f"[{r['lower']!r}, {r['upper']!r}]" if "lower" in r else r.get("error", "")[:120]
        tr = r.get("truth") or r.get("truth_error") or "-"
        lines.append(f"| {describe(r['case'])} | {st} | {r['seconds']:.2f} | {iv} | {tr} |")
    return "\n".join(lines) + "\n"


def issue_report(records):
    lines = ["## Known hard cases: extreme parameters", "",
             f"Each in a forked child capped at {MEM_CAP / 2**30:.0f} GB (RLIMIT_AS), time limit "
             f"{TIME_LIMIT:.0f} s; peak memory is the child's max RSS (incl. ~100 MB of imports).", "",
             "| case | status | seconds | peak MB | interval |", "|---|---|---|---|---|"]
    for r in records:
        iv = (f"[{r['lower']:.10g}, {r['upper']:.10g}]" + (" (accuracy-limited)" if r.get("limited") else "")
              if r["status"] == "ok" else r.get("error", "")[:120])
        lines.append(f"| {describe(r['case'])} | {r['status']} | {r['seconds']:.2f} | {r['peak_mb']:.0f} | {iv} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=TIME_LIMIT)
    ap.add_argument("--out", default=None, help="write the report (markdown) here")
    ap.add_argument("--jsonl", default=None, help="append every record here")
    ap.add_argument("--issue-cases", action="store_true", help="run the known hard cases (extreme parameters, the reproducers with independent truths) instead")
    ap.add_argument("--family", default="all",
                    help="comma-separated families of random cases, or 'all' (default); one of: "
                         + ", ".join(FAMILIES) + " ('mixed' alone is the issue-22 sequence)")
    a = ap.parse_args(argv)
    if a.issue_cases:
        import pldlib  # noqa: F401

        recs = [run_case(c, a.time_limit) for c in issue_cases()]
        recs39 = [run_case(c, a.time_limit) for c in issue39_cases()]
        text = issue_report(recs) + "\n" + issue39_report(recs39)
        recs = recs + recs39
        print(text)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text)
        return 1 if any(r["status"] not in ("ok", "refused", "unsupported") for r in recs) else 0
    if a.cases < 1 or a.workers < 1:
        ap.error("--cases and --workers must be >= 1")
    fams = tuple(FAMILIES) if a.family == "all" else tuple(f.strip() for f in a.family.split(",") if f.strip())
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown or not fams:
        ap.error(f"--family: unknown {unknown or a.family!r}; choose from {', '.join(FAMILIES)} or 'all'")
    fh = open(a.jsonl, "a") if a.jsonl else None

    def prog(i, rec):
        if fh:
            fh.write(json.dumps(rec, default=str) + "\n")
            fh.flush()
        if rec["status"] not in ("ok", "refused"):
            print(f"[{i}] {rec['status']}: {describe(rec['case'])}: {rec.get('error', '')[:160]}", file=sys.stderr)

    recs = run(a.cases, a.seed, a.workers, a.time_limit, prog, fams)
    fam_arg = "" if a.family == "all" else f" --family {a.family}"
    text = report(recs, f"Random run: {a.cases} cases, seed {a.seed}" + (f", families {a.family}" if fam_arg else ""),
                  f"python -m pldlib.testing.robust --cases {a.cases} --seed {a.seed} --workers {a.workers}{fam_arg}")
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)
    bad = sum(1 for r in recs if r["status"] not in ("ok", "refused", "unsupported"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
