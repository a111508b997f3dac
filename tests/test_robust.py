"""A fixed-seed sample of the robustness suite (issue 22; the long run is `make robust`).

Each case is a random valid input run in a forked child under a 2 GB address-space cap
and a 20 s limit (pldlib/testing/robust.py).  It must answer lower <= upper (and contain
the closed form where one exists: lists of unsampled Gaussians, checked at 40 digits by
the runner's own mpmath formula) or refuse with PrecisionLimitError; a bare exception,
running out of memory or time fails the test.
"""
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pldlib.testing import robust as R

RELS = st.sampled_from(R.RELATIONS)
LOGU = lambda lo, hi: st.floats(math.log10(lo), math.log10(hi)).map(lambda x: float(10 ** x))  # noqa: E731

step = st.one_of(
    st.tuples(st.builds(lambda s: {"kind": "gauss", "sigma": s}, LOGU(0.05, 1e3)), LOGU(1, 1e12).map(int)),
    st.tuples(st.builds(lambda s, q: {"kind": "sgauss", "sigma": s, "q": q, "scheme": "poisson"},
                        LOGU(0.3, 1e3), LOGU(1e-4, 1.0)), LOGU(1, 1e4).map(int)),
    st.tuples(st.builds(lambda e: {"kind": "rr", "eps0": e}, LOGU(1e-3, 10)), LOGU(1, 1e8).map(int)),
    st.tuples(st.builds(lambda e, d: {"kind": "approx", "eps0": e, "delta0": d},
                        st.one_of(st.just(0.0), LOGU(1e-3, 10)), LOGU(1e-12, 1e-3)), LOGU(1, 1e8).map(int)),
    st.tuples(st.builds(lambda b: {"kind": "laplace", "scale": b}, LOGU(0.5, 1e3)), LOGU(1, 1e3).map(int)),
)
query = st.one_of(st.tuples(st.just("epsilon"), LOGU(1e-30, 0.99)), st.tuples(st.just("delta"), st.floats(0, 500)))


@st.composite
def cases(draw):
    rel = draw(RELS)
    steps = draw(st.lists(step, min_size=1, max_size=2))
    return {"relation": rel, "steps": [[s, k] for s, k in steps], "query": list(draw(query))}


@settings(max_examples=16, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(cases())
def test_random_valid_inputs_answer(case):
    rec = R.run_case(case)
    # (the child's own traceback in the message: a failure that does not reproduce is still read)
    assert rec["status"] in ("ok", "refused"), (rec["status"], R.describe(case), rec.get("error"), rec.get("trace"))
    if rec["status"] == "refused":  # (documented: PrecisionLimitError and its subclasses, GridTooLargeError)
        assert rec["error_class"] in ("PrecisionLimitError", "LossRangeError", "UntiltError", "GridTooLargeError",
                                      "TimeBudgetError"), rec["error"]


def test_runner_catches_a_wrong_interval():
    # the checker itself can fail: a Gaussian interval that misses the closed form is unsound
    case = {"relation": "add", "steps": [[{"kind": "gauss", "sigma": 1.0}, 4]], "query": ["delta", 1.0]}
    rec = R.check({"status": "ok", "lower": 0.1, "upper": 0.2, "case": case, "seconds": 0.0, "peak_mb": 0.0})
    assert rec["status"] == "unsound"
    rec = R.check({"status": "ok", "lower": 0.0, "upper": 1.0, "case": case, "seconds": 0.0, "peak_mb": 0.0})
    assert rec["status"] == "ok"


def test_report_carries_the_childs_traceback():
    """A case that failed in its child is reported with the child's own traceback (the last
    lines), so a failure that does not reproduce can still be read."""
    case = {"relation": "add", "steps": [[{"kind": "gauss", "sigma": 1.0}, 1]], "query": ["epsilon", 1e-5]}
    rec = {"status": "error", "error": "SystemError: error return without exception set", "seconds": 0.1,
           "peak_mb": 50.0, "case": case,
           "trace": "Traceback (most recent call last):\n  File \"x.py\", line 3, in f\nSystemError: error return\n"}
    text = R.report([rec], "t", "cmd")
    assert "- other exceptions: 1" in text and 'File "x.py", line 3, in f' in text


def test_width_causes_name_shuffling_before_the_method():
    """A wide shuffled-epoch answer is put down to shuffling (its worst case is unknown: the ends are
    the zero-dataset pair's and no amplification's), whatever the method; others keep their cause."""
    from pldlib.testing.robust import width_cause

    def rec(method, scheme, query=("delta", 1.0), upper=0.5):
        step = {"kind": "alloc", "sigma": 1.0, "t": 2, "scheme": scheme}
        return {"case": {"method": method, "relation": "add", "steps": [[step, 2]], "query": list(query)},
                "upper": upper, "lower": 0.1}

    assert width_cause(rec("prv", "shuffle")).startswith("shuffle")
    assert width_cause(rec("pld", "shuffle")).startswith("shuffle")
    assert width_cause(rec("prv", "random_allocation")).startswith("method prv")
    assert width_cause(rec("pld", "random_allocation")).startswith("random allocation")
