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

    python -m pldlib.testing.robust --cases 2000 --seed 1 --workers 2 --out results/ROBUSTNESS.md
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
TIME_LIMIT = 20.0


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


def _child(case, conn):
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEM_CAP, MEM_CAP))
    except (ValueError, OSError):
        pass
    t0 = time.perf_counter()
    out = {}
    try:
        import warnings

        from pldlib.pld.accountant import PLDAccountant

        acc = PLDAccountant(case["relation"])
        for s, k in case["steps"]:
            acc.compose(event_of(s), int(k))
        what, x = case["query"]
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = acc.epsilon(x) if what == "epsilon" else acc.delta(x)
        out = {"status": "ok", "lower": float(r.lower), "upper": float(r.upper),
               "limited": bool(getattr(acc, "accuracy_limited", False)) or any(
                   "AccuracyLimited" in type(m.message).__name__ for m in w)}
    except MemoryError as e:
        out = {"status": "oom" if type(e) is MemoryError else "error", "error": f"{type(e).__name__}: {e}"}
    except Exception as e:
        from pldlib import PrecisionLimitError

        st = "refused" if isinstance(e, PrecisionLimitError) else "error"
        out = {"status": st, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-800:]}
    out["seconds"] = time.perf_counter() - t0
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    conn.send(out)
    conn.close()


def run_case(case, time_limit=TIME_LIMIT):
    """Run one case in a forked child (memory cap, time limit); returns its record."""
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
    p.join(5)
    if p.is_alive():
        p.kill()
        p.join()
    wall = time.perf_counter() - t0
    if rec is None:
        rec = {"status": "timeout" if wall >= time_limit else "crash", "seconds": wall, "peak_mb": math.nan,
               "error": f"exit code {p.exitcode}"}
    rec["case"] = case
    return check(rec)


def check(rec):
    """Soundness: lower <= upper, not NaN; the closed form inside [lower, upper]."""
    if rec["status"] != "ok":
        return rec
    lo, up = rec["lower"], rec["upper"]
    if math.isnan(lo) or math.isnan(up) or lo > up:
        rec["status"] = "unsound"
        rec["error"] = f"lower={lo} upper={up}"
        return rec
    t = gaussian_truth(rec["case"])
    if t is not None:
        import mpmath

        what, val = t
        if what == "delta":
            ok = mpmath.mpf(lo) * (1 - 1e-12) - 1e-300 <= val <= mpmath.mpf(up) * (1 + 1e-12) + 1e-300
        else:
            d = rec["case"]["query"][1]
            ok = (not math.isfinite(up) or val(up) <= d * (1 + 1e-12)) and \
                 (not math.isfinite(lo) or val(lo) >= d * (1 - 1e-12))
        if not ok:
            rec["status"] = "unsound"
            rec["error"] = "closed form outside the interval"
    return rec


def rel_width(rec):
    if rec["status"] != "ok":
        return math.nan
    lo, up = rec["lower"], rec["upper"]
    if not (math.isfinite(lo) and math.isfinite(up)):
        return 0.0 if lo == up else math.inf
    return (up - lo) / max(abs(up), 1e-300 if rec["case"]["query"][0] == "delta" else 1e-3)


def run(n, seed, workers=2, time_limit=TIME_LIMIT, progress=None):
    rng = np.random.default_rng(seed)
    cases = [random_case(rng) for _ in range(n)]
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
    for s, k in case["steps"]:
        args = ", ".join(f"{a}={v:.3g}" if isinstance(v, float) else f"{a}={v}" for a, v in s.items() if a != "kind")
        parts.append(f"{s['kind']}({args}) x {k:,}")
    return f"{case['relation']}: " + " + ".join(parts) + f"; {case['query'][0]}({case['query'][1]:.3g})"


def report(records, title, cmd):
    from collections import Counter

    cnt = Counter(r["status"] for r in records)
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
             f"- refused with PrecisionLimitError (documented): {cnt['refused']}",
             f"- unsound: {cnt['unsound']}",
             f"- other exceptions: {cnt['error']}",
             f"- out of memory (cap {MEM_CAP / 2**30:.0f} GB): {cnt['oom'] + cnt['crash']}",
             f"- over the time limit ({TIME_LIMIT:.0f} s): {cnt['timeout']}",
             f"- worst time: {times[0]['seconds']:.2f} s" if times else "- worst time: -",
             f"- worst peak memory (child RSS incl. ~100 MB of imports): {max(mem):.0f} MB" if mem else "",
             f"- median time: {np.median([r['seconds'] for r in records]):.2f} s",
             f"- widest relative interval: {widest[0]:.3g}"
             + (f" ({describe(widest[1]['case'])})" if widest[1] else ""),
             f"- answered intervals with relative width > 1%: {sum(1 for w, _ in widths if w > 0.01)}", "",
             "Slowest ten:", "", "| seconds | peak MB | status | interval | case |", "|---|---|---|---|---|"]
    for r in times[:10]:
        iv = f"[{r['lower']:.6g}, {r['upper']:.6g}]" if r["status"] == "ok" else r.get("error", "")[:80]
        lines.append(f"| {r['seconds']:.2f} | {r['peak_mb']:.0f} | {r['status']} | {iv} | {describe(r['case'])} |")
    bad = [r for r in records if r["status"] in ("unsound", "error", "oom", "crash", "timeout")]
    if bad:
        lines += ["", "Failures:", ""]
        for r in bad[:50]:
            lines.append(f"- {r['status']}: {describe(r['case'])}: {r.get('error', '')[:200]}")
            if r.get("trace"):  # (the child's traceback: a failure that does not reproduce is still read)
                lines += ["", "  ```", *("  " + t for t in r["trace"].rstrip().splitlines()[-12:]), "  ```", ""]
    return "\n".join(lines) + "\n"


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


def issue_report(records):
    lines = ["## The cases enumerated in issue 22", "",
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
    ap.add_argument("--issue-cases", action="store_true", help="run the cases issue 22 enumerates instead")
    a = ap.parse_args(argv)
    if a.issue_cases:
        import pldlib  # noqa: F401

        recs = [run_case(c, a.time_limit) for c in issue_cases()]
        text = issue_report(recs)
        print(text)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text)
        return 1 if any(r["status"] not in ("ok",) for r in recs) else 0
    if a.cases < 1 or a.workers < 1:
        ap.error("--cases and --workers must be >= 1")
    fh = open(a.jsonl, "a") if a.jsonl else None

    def prog(i, rec):
        if fh:
            fh.write(json.dumps(rec, default=str) + "\n")
            fh.flush()
        if rec["status"] not in ("ok", "refused"):
            print(f"[{i}] {rec['status']}: {describe(rec['case'])}: {rec.get('error', '')[:160]}", file=sys.stderr)

    recs = run(a.cases, a.seed, a.workers, a.time_limit, prog)
    text = report(recs, f"Random run: {a.cases} cases, seed {a.seed}",
                  f"python -m pldlib.testing.robust --cases {a.cases} --seed {a.seed} --workers {a.workers}")
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)
    bad = sum(1 for r in recs if r["status"] not in ("ok", "refused"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
