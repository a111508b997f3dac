"""Monte Carlo validation of privacy curves (seed 002, section 5; docs/MATH.md section 8).

Samples the composed privacy loss Y = sum of per-step losses under P and
estimates delta(eps) = E[(1 - e^{eps - Y})_+].  Each term lies in [0, 1], so by
Hoeffding's inequality and a union bound over the |E| epsilons and the
branches, with probability >= 1 - beta every estimate is within

    eta = sqrt(ln(2 |E| B / beta) / (2 N))

of the truth.  This is an independent check (it never discretises), useful
for delta >~ 1e-3; it is a statistical statement, not a certified bound.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from ..methods.base import Interval, Step, components_of
from ..profiles.base import FiniteProfile, GaussianProfile, LaplaceProfile

__all__ = ["delta_interval", "sample_losses"]


def sample_losses(profile, rng: np.random.Generator, n: int) -> np.ndarray:
    """n samples of the privacy loss L under P for one step of ``profile``."""
    if hasattr(profile, "sample_p"):
        return profile.sample_p(rng, n)
    if isinstance(profile, GaussianProfile):
        r = profile.r
        return rng.normal(0.5 * r * r, r, n)
    if isinstance(profile, LaplaceProfile):
        x = rng.laplace(0.0, profile.scale, n)
        return (np.abs(x - profile.sensitivity) - np.abs(x)) / profile.scale
    if isinstance(profile, FiniteProfile):
        vals = np.append(profile.losses, np.inf)
        probs = np.append(profile.p_masses, profile.p_inf)
        return rng.choice(vals, size=n, p=probs / probs.sum())
    raise NotImplementedError(f"Monte Carlo sampling is not available for {type(profile).__name__} "
                              "(e.g. the max-profile of WOR substitution is not a sampleable pair)")


def delta_interval(mechanism, steps=None, epsilon=(0.0,), *, n_samples: int = 100_000,
                   beta: float = 1e-3, seed=None, chunk: int = 50_000) -> Interval:
    """Monte Carlo interval for delta(eps), valid with probability >= 1 - beta.

    Parameters
    ----------
    mechanism, steps : as for :func:`pldlib.account` (a list of (mechanism, steps) works too)
    epsilon : epsilons at which to estimate delta
    n_samples : number of composed samples N
    beta : failure probability of the whole interval family

    Returns
    -------
    Interval(lower, upper) of arrays, the max over the mechanism's branches.
    """
    relation, events = components_of(mechanism, steps)
    comps = [(Step(e, relation), k) for e, k in events]
    eps = V.epsilon_array("epsilon", epsilon)
    n_samples = V.steps("n_samples", n_samples)
    beta = V.probability_open("beta", beta)
    rng = np.random.default_rng(seed)
    per_comp = [m.branches() for m, _ in comps]
    labels = []
    for bl in per_comp:
        for b in bl:
            if b.label not in labels:
                labels.append(b.label)
    eta = math.sqrt(math.log(2 * eps.size * len(labels) / beta) / (2 * n_samples))
    lo = np.zeros(eps.size)
    up = np.zeros(eps.size)
    for label in labels:
        acc = np.zeros(eps.size)
        done = 0
        while done < n_samples:
            n = min(chunk, n_samples - done)
            y = np.zeros(n)
            for (m, k), bl in zip(comps, per_comp):
                prof = next((b for b in bl if b.label == label), bl[0]).upper
                for _ in range(k):
                    y += sample_losses(prof, rng, n)
            with np.errstate(over="ignore", invalid="ignore"):
                w = np.where(np.isposinf(y)[None, :], 1.0, -np.expm1(np.minimum(eps[:, None] - y[None, :], 0.0)))
            acc += w.sum(axis=1)
            done += n
        est = acc / n_samples
        lo = np.maximum(lo, np.clip(est - eta, 0.0, 1.0))
        up = np.maximum(up, np.clip(est + eta, 0.0, 1.0))
    return Interval(lo, up)
