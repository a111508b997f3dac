"""Certified grouping of long schedules (pldlib/methods/schedule.py, docs/MATH.md 5.8)."""
from __future__ import annotations

import numpy as np
import pytest

import pldlib
from pldlib.methods.base import Step
from pldlib.methods import schedule as S


def _schedule(n, perq):
    sig = np.linspace(0.95, 1.0, n)
    qs = np.linspace(0.05, 0.051, n) if perq else np.full(n, 0.05)
    return [(pldlib.Gaussian(float(s), q=float(q), sampling="poisson"), 1) for s, q in zip(sig, qs)]


@pytest.mark.parametrize("relation", ["add", "remove", "add_remove", "substitution"])
def test_grouped_profiles_bracket_every_member(relation):
    """The dominance claims: the group's upper profile lies above, and its lower profile below,
    every member's exact hockey-stick curve (mixture closed forms), in every direction."""
    comps = [(Step(pldlib.Gaussian(float(s), q=float(q), sampling="poisson", relation=relation).event, relation), 1)
             for s, q in zip(np.linspace(0.8, 0.82, 7), np.linspace(0.1, 0.11, 7))]
    grouped = S.group_schedule(comps, relation, ratio=0.2, group_from=2)
    assert len(grouped) == 1 and isinstance(grouped[0][0], S.GroupedStep) and grouped[0][1] == 7
    eps = np.linspace(-1.0, 4.0, 41)
    for b in grouped[0][0].branches():
        up, lo = b.upper.delta(eps), b.lower.delta(eps)
        for s, _ in comps:
            member = {m.label: m for m in s.branches()}[b.label].upper.delta(eps)
            assert np.all(up >= member - 1e-15) and np.all(lo <= member + 1e-15)


@pytest.mark.parametrize("perq", [False, True])
def test_grouped_schedule_agrees_with_the_ungrouped_one(perq, monkeypatch):
    """80 distinct steps: grouped (cells of 2e-3) and ungrouped certified intervals both contain
    the truth, so they must overlap; the grouped one is no wider than 1% and uses fewer components."""
    comps = _schedule(80, perq)
    grouped = pldlib.account(comps)
    g = grouped.epsilon(1e-5)
    monkeypatch.setattr(S, "GROUP_FROM", 10**9)
    monkeypatch.setattr(pldlib.methods.pld, "group_schedule",
                        lambda eff, rel: S.group_schedule(eff, rel, group_from=10**9))
    plain = pldlib.account(comps)
    p = plain.epsilon(1e-5)
    assert len(grouped._eff) < len(plain._eff) == 80
    assert g.lower <= p.upper and p.lower <= g.upper
    assert (g.upper - g.lower) / g.upper < 0.01


def test_short_schedules_and_other_schemes_are_not_grouped():
    comps = [(Step(pldlib.Gaussian(1.0 + i * 1e-4, q=0.01, sampling="poisson").event, "add_remove"), 1)
             for i in range(10)]
    assert S.group_schedule(comps, "add_remove") == comps  # fewer than GROUP_FROM
    lap = [(Step(pldlib.Laplace(1.0 + i * 1e-4, q=0.01, sampling="poisson").event, "add_remove"), 1)
           for i in range(100)]
    assert S.group_schedule(lap, "add_remove") == lap      # only subsampled Gaussians are grouped
