"""A few summands: the PRV and saddle-point accountants read the PLD accountant's certified ends
too (docs/MATH.md 0.9).  Pinned against mpmath truths of one epoch of random allocation (the exact
two-step epoch pair, :mod:`pldlib.testing.robust_truths`), not against the PLD accountant."""
from __future__ import annotations

import mpmath
import numpy as np
import pytest

from pldlib import events as E
from pldlib.methods import few_summands as FS
from pldlib.methods.pld import PLDAccountant
from pldlib.methods.prv import PRVAccountant
from pldlib.methods.spa import SPAAccountant
from pldlib.testing import robust_truths as T

METHODS = [PRVAccountant, SPAAccountant]


def _epoch(sigma, relation, cls, epochs=1, scheme="random_allocation"):
    return cls(relation).compose(E.Sampled(E.GaussianEvent(sigma), 0.5, scheme), 2 * epochs)


def test_summands_count_epochs_of_per_epoch_schemes_and_steps_of_the_others():
    ev = E.Sampled(E.GaussianEvent(1.0), 0.25, "random_allocation")
    acc = PRVAccountant("add").compose(ev, 12).compose(E.GaussianEvent(2.0), 3)
    assert FS.summands(acc.components) == 12 // 4 + 3
    acc = PRVAccountant("add").compose(E.Sampled(E.GaussianEvent(1.0), 0.25, "poisson"), 12)
    assert FS.summands(acc.components) == 12


def test_no_companion_beyond_a_few_summands_nor_where_the_curve_is_read_exactly():
    ev = E.Sampled(E.GaussianEvent(1.0), 0.01, "poisson")
    assert FS.companion(PRVAccountant("add_remove").compose(ev, FS.FEW + 1)) is None
    assert FS.companion(PRVAccountant("add_remove").compose(ev, FS.FEW)) is not None
    assert FS.companion(PLDAccountant("add_remove").compose(ev, 2)) is None
    # one step composed once and closed forms are read exactly already (docs/MATH.md 0.8)
    assert FS.companion(PRVAccountant("add_remove").compose(ev, 1)) is None
    assert FS.companion(SPAAccountant("add_remove").compose(E.GaussianEvent(3.0), 4)) is None


@pytest.mark.parametrize("cls", METHODS)
@pytest.mark.parametrize("relation,sigma,eps", [("add", 1.72, 0.237), ("remove", 0.703, 1.27),
                                               ("add_remove", 4.88, 0.0318)])
def test_one_epoch_of_random_allocation_is_certified_and_tight(cls, relation, sigma, eps):
    # the saddle-point accountant's own lower end here is 0 (Berry-Esseen for two summands) and
    # its upper end 2-10x the truth; with the PLD accountant's ends the interval holds the truth
    # to 1%
    acc = _epoch(sigma, relation, cls)
    iv = acc.delta(eps)
    lo_t, hi_t = T.allocation_delta(sigma, 2, eps, relation)
    assert iv.lower <= hi_t and iv.upper >= lo_t
    assert iv.upper - iv.lower <= 0.01 * float(lo_t)
    assert iv.lower <= iv.estimate <= iv.upper


@pytest.mark.parametrize("cls", METHODS)
def test_one_epoch_epsilon_brackets_the_target(cls):
    sigma, relation, delta = 0.806, "remove", 6.57e-3
    iv = _epoch(sigma, relation, cls).epsilon(delta)
    at_up = T.allocation_delta(sigma, 2, iv.upper, relation)
    at_lo = T.allocation_delta(sigma, 2, iv.lower, relation)
    assert at_up[0] <= delta * (1 + 1e-9)      # delta(upper eps) <= target: upper eps sound
    assert at_lo[1] >= delta * (1 - 1e-9)      # delta(lower eps) >= target: lower eps sound
    assert iv.upper - iv.lower <= 0.01 * iv.upper


def test_one_epoch_max_tpr_of_the_saddle_point_accountant():
    sigma, relation, alpha = 1.16, "remove", 3.88e-4
    iv = _epoch(sigma, relation, SPAAccountant).max_tpr(alpha)
    lo_t, hi_t = T.allocation_power(sigma, alpha, relation)
    assert iv.lower <= hi_t and iv.upper >= lo_t
    assert iv.upper - iv.lower <= 0.01 * float(lo_t)


def test_the_companion_only_narrows():
    # the intersection keeps the method's own ends where they are tighter (never loosens them)
    sigma, relation = 1.2, "add_remove"
    acc = _epoch(sigma, relation, PRVAccountant)
    eps = np.array([0.5, 2.0])
    both = acc.delta(eps)
    comp = FS.delta_bounds(acc, eps)
    assert np.all(both.lower >= comp[0]) and np.all(both.upper <= comp[1])
    for e, lo, up in zip(eps, both.lower, both.upper):
        t = T.allocation_delta(sigma, 2, float(e), relation)
        assert lo <= t[1] and up >= t[0]


def test_a_refusing_companion_leaves_the_answer(monkeypatch):
    # the companion's refusals (any documented error) give NaN ends, ignored by the intersection
    acc = _epoch(1.5, "add", SPAAccountant)
    own = acc.delta(0.5)

    def refuse(self, *a, **k):
        raise MemoryError("grid too large")

    fresh = _epoch(1.5, "add", SPAAccountant)
    monkeypatch.setattr(PLDAccountant, "delta", refuse)
    iv = fresh.delta(0.5)
    assert iv.upper >= own.upper and iv.lower <= own.lower
    assert mpmath.mpf(iv.upper) >= T.allocation_delta(1.5, 2, 0.5, "add")[0]


def test_a_companion_never_builds_another(monkeypatch):
    # the PLD companion's sharpening may ask the saddle-point accountant, whose own companion would
    # be a PLD accountant again: while a companion answers, no other is read
    seen = []
    real = FS.companion

    def spy(acc):
        seen.append(type(acc).__name__)
        return real(acc)

    def sharpen_with_spa(self, kind, x, lo, up, t_start, **kw):  # (the companion asks SPA, as sharpening may)
        SPAAccountant(self.relation, on_edge="flag").compose(*[(s.event, k) for s, k in self._steps][0]).delta(x)
        return lo, up

    monkeypatch.setattr(FS, "companion", spy)
    monkeypatch.setattr(PLDAccountant, "_sharpen", sharpen_with_spa)
    iv = _epoch(1.5, "add", SPAAccountant).delta(np.array([0.5]))
    assert seen == ["SPAAccountant"] and iv.lower[0] <= iv.upper[0]
