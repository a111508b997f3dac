"""The PRV accountant's memory budget: every query answers or refuses with GridTooLargeError
before allocating, never a bare MemoryError (robustness harness, "0 out of memory").

The large case is run in a forked child under an address-space cap, as the harness runs it.
"""
import math
import multiprocessing as mp
import resource

import numpy as np
import pytest

import pldlib
from pldlib import GridTooLargeError
from pldlib.methods import prv as PRV
from pldlib.pld import compose as _C

# the harness's case: K = 481125491 steps of a WOR-subsampled Gaussian, delta at eps < 0
SIGMA, Q, K, EPS = 30.808678141642957, 4.370182318414207e-05, 481125491, -2.3558004344806194


def _big_case(cap, budget, conn):
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        kw = {} if budget is None else {"memory_budget": budget}
        acc = pldlib.make_accountant("prv", "add_remove", **kw)
        acc = acc.compose(pldlib.Sampled(pldlib.GaussianEvent(sigma=SIGMA), q=Q, sampling="wor"), K)
        r = acc.delta(EPS)
        conn.send(("answer", (r.lower, r.estimate, r.upper)))
    except GridTooLargeError as e:
        conn.send(("GridTooLargeError", str(e)))
    except BaseException as e:  # noqa: BLE001  (reported to the parent, which fails on it)
        conn.send((type(e).__name__, str(e)))
    finally:
        conn.close()


def _run_child(cap, budget=None, timeout=120):
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_big_case, args=(cap, budget, send))
    p.start()
    send.close()
    try:
        if not recv.poll(timeout):
            p.kill()
            pytest.fail("child did not answer in time")
        return recv.recv()
    finally:
        p.join(5)


def test_harness_case_under_2gib_answers_or_refuses():
    kind, payload = _run_child(2 * 2**30)
    assert kind in ("answer", "GridTooLargeError"), (kind, payload)
    if kind == "GridTooLargeError":
        assert "memory_budget" in payload and "eps_error" in payload
        assert "Unable to allocate" not in payload  # not numpy's text
    else:
        # for eps < 0: delta(eps) = 1 - e^eps + e^eps delta_rev(-eps), and delta_rev(2.36) is
        # astronomically small here (mu-GDP with mu ~ q sqrt(K) / sigma ~ 0.03), so the truth
        # is 1 - e^eps to far below 1e-12
        truth = -math.expm1(EPS)
        lo, _est, up = payload
        assert lo <= truth + 1e-12 and up >= truth


def test_process_limit_below_budget_is_reported_as_grid_too_large():
    # a budget of 4 GiB in a process capped at 1 GiB: numpy's MemoryError at the allocation
    # is said as GridTooLargeError (naming memory_budget), never a bare MemoryError
    kind, payload = _run_child(2**30, budget=4 * 2**30)
    assert kind in ("answer", "GridTooLargeError"), (kind, payload)
    if kind == "GridTooLargeError":
        assert "memory_budget" in payload and "Unable to allocate" not in payload


def test_small_budget_refuses_before_allocating(monkeypatch):
    def no_compose(*a, **k):
        raise AssertionError("composed although the budget was already known to be too small")

    monkeypatch.setattr(_C, "_compose_side", no_compose)
    acc = pldlib.make_accountant("prv", "add_remove", eps_error=0.05, memory_budget=300_000)
    acc = acc.compose(pldlib.Sampled(pldlib.GaussianEvent(sigma=1.0), q=0.01, sampling="poisson"), 300)
    with pytest.raises(GridTooLargeError, match="composition needs .* memory_budget=300,000") as ei:
        acc.delta(1.0)
    # the largest FFT length that fits is reported (a caller may coarsen by the right factor)
    assert ei.value.limit == 300_000 // PRV.BYTES_PER_BIN and ei.value.need > ei.value.limit
    with pytest.raises(GridTooLargeError, match="memory_budget"):
        acc.epsilon(1e-6)


def test_step_beyond_budget_refuses_before_discretising():
    acc = pldlib.make_accountant("prv", "add_remove", eps_error=0.05, memory_budget=10**4)
    acc = acc.compose(pldlib.GaussianEvent(sigma=1.0), 300)
    with pytest.raises(GridTooLargeError, match="one step needs .* memory_budget=10,000"):
        acc.delta(1.0)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "1e9"])
def test_memory_budget_validated(bad):
    with pytest.raises((ValueError, TypeError), match="memory_budget"):
        pldlib.make_accountant("prv", "add_remove", memory_budget=bad)


def test_cached_compositions_dropped_without_changing_answers(monkeypatch):
    """A budget holding one composition at a time: the cache is released between branches
    and tilts, and the answers are those of the default budget (only work depends on the cache)."""
    ev = pldlib.Sampled(pldlib.GaussianEvent(sigma=1.0), q=0.01, sampling="poisson")
    ref = pldlib.make_accountant("prv", "add_remove", eps_error=0.05).compose(ev, 300)
    orig = PRV.PRVAccountant._release
    released = []

    def spy(self, keep=()):
        released.append(sum(c.comp.n_bins for sd in self._sides() for c in sd.cache.values()))
        return orig(self, keep)

    monkeypatch.setattr(PRV.PRVAccountant, "_release", spy)
    ref_e, ref_d = ref.epsilon([1e-3, 1e-6]), ref.delta([0.5, 2.0])
    sizes = []
    for br in ref._branches:
        sizes += [c.comp.n_bins for c in br.up.cache.values()]
    assert released == []  # the default budget holds them all
    big = max(sizes)
    budget = big * PRV.BYTES_PER_BIN + 1000  # the largest fits alone, not with another cached
    acc = pldlib.make_accountant("prv", "add_remove", eps_error=0.05, memory_budget=budget).compose(ev, 300)
    e, d = acc.epsilon([1e-3, 1e-6]), acc.delta([0.5, 2.0])
    assert any(n > 0 for n in released)
    for a, b in ((e, ref_e), (d, ref_d)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    held = sum(c.comp.n_bins for sd in acc._sides() for c in sd.cache.values())
    assert held * PRV.RETAINED_BYTES_PER_BIN <= budget


def test_pinned_composition_counts_against_budget():
    """A branch whose two profiles differ needs both compositions at once: when they cannot
    fit together the query refuses (naming the one in use) instead of over-allocating."""
    ev = pldlib.Sampled(pldlib.GaussianEvent(sigma=2.0), q=0.1, sampling="wor")
    ref = pldlib.make_accountant("prv", "substitution", eps_error=0.05).compose(ev, 300)
    ref.delta(1.0)
    (br,) = ref._branches
    assert br.up is not br.lo
    n_up = next(iter(br.up.cache.values())).comp.n_bins
    n_lo = next(iter(br.lo.cache.values())).comp.n_bins
    alone = max(n_up, n_lo) * PRV.BYTES_PER_BIN
    together = n_lo * PRV.BYTES_PER_BIN + n_up * PRV.RETAINED_BYTES_PER_BIN
    assert alone < together
    acc = pldlib.make_accountant("prv", "substitution", eps_error=0.05,
                                 memory_budget=(alone + together) // 2).compose(ev, 300)
    with pytest.raises(GridTooLargeError, match="in use"):
        acc.delta(1.0)
    ok = pldlib.make_accountant("prv", "substitution", eps_error=0.05, memory_budget=together + 10**6).compose(ev, 300)
    assert tuple(ok.delta(1.0)) == tuple(ref.delta(1.0))


def test_numpy_memory_error_at_allocation_becomes_grid_too_large(monkeypatch):
    def oom(*a, **k):
        raise MemoryError("Unable to allocate 65.9 MiB for an array with shape (8640000,)")

    ev = pldlib.Sampled(pldlib.GaussianEvent(sigma=1.0), q=0.01, sampling="poisson")
    acc = pldlib.make_accountant("prv", "add_remove", eps_error=0.05).compose(ev, 300)
    monkeypatch.setattr(_C, "_compose_side", oom)
    with pytest.raises(GridTooLargeError, match="ran out of memory composing .* memory_budget") as ei:
        acc.delta(1.0)
    assert "Unable to allocate" not in str(ei.value)


def test_memory_budget_kept_by_options():
    acc = pldlib.make_accountant("prv", "add_remove", memory_budget=123456789)
    assert acc._options()["memory_budget"] == 123456789
    assert "memory_budget" not in pldlib.make_accountant("prv", "add_remove")._options()
