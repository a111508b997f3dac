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
from typing import NamedTuple

import numpy as np

from .. import _validate as V
from ..methods.base import Interval, Step, components_of
from ..profiles.base import FiniteProfile, GaussianProfile, LaplaceProfile

__all__ = ["delta_interval", "events_delta_interval", "banded_mixture", "sample_losses", "allocation_delta", "AllocationMC",
           "laplace_allocation_delta"]


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
    return events_delta_interval(relation, events, epsilon, n_samples=n_samples, beta=beta, seed=seed, chunk=chunk)


def events_delta_interval(relation: str, events, epsilon=(0.0,), *, n_samples: int = 100_000, beta: float = 1e-3,
                          seed=None, chunk: int = 50_000, bound: str = "hoeffding") -> Interval:
    """:func:`delta_interval` of a list of (event, count) under ``relation``: the same Monte Carlo
    interval (each branch's dominating pair sampled under P, a union bound over the epsilons and
    branches).  ``bound="bernstein"``: the empirical Bernstein half-width of Maurer and Pontil
    (2009, Theorem 4, both sides), sqrt(2 V ln(4/b) / N) + 7 ln(4/b) / (3 (N - 1)) with V the
    sample variance and b = beta / (|E| B): far narrower than Hoeffding's where delta is small
    (the terms' variance is at most their mean)."""
    V.choice("relation", relation, V.RELATIONS)
    V.choice("bound", bound, ("hoeffding", "bernstein"))
    comps = [(Step(e, relation), V.steps("count", k)) for e, k in events]
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
        acc2 = np.zeros(eps.size)
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
            acc2 += np.square(w).sum(axis=1)
            done += n
        est = acc / n_samples
        half = eta
        if bound == "bernstein":
            var = np.maximum(acc2 / n_samples - est * est, 0.0) * n_samples / max(n_samples - 1, 1)
            ln = math.log(4 * eps.size * len(labels) / beta)
            half = np.sqrt(2 * var * ln / n_samples) + 7 * ln / (3 * max(n_samples - 1, 1))
        lo = np.maximum(lo, np.clip(est - half, 0.0, 1.0))
        up = np.maximum(up, np.clip(est + half, 0.0, 1.0))
    return Interval(lo, up)


def banded_mixture(bands: int, decay: float, p: float, sigma: float):
    """A mixture-of-Gaussians event of banded-matrix shape, for validation runs (a test shape, not an
    accounting of BandMF): band coefficients c_j proportional to decay^j (unit norm); one round's
    output given which of the ``bands`` rounds its band covers the example took part in (each
    independently with probability ``p``) is Gaussian with sensitivity sum_{j in S} c_j, so the
    mixture has sensitivities sum_{j in S} c_j with probabilities p^|S| (1-p)^(bands-|S|) (equal
    sensitivities merged)."""
    import itertools

    from .. import events as E

    c = float(decay) ** np.arange(int(bands))
    c = c / np.linalg.norm(c)
    comps: dict = {}
    for pattern in itertools.product((0, 1), repeat=int(bands)):
        s = round(float(np.dot(pattern, c)), 15)
        comps[s] = comps.get(s, 0.0) + p ** sum(pattern) * (1 - p) ** (bands - sum(pattern))
    sens = sorted(comps)
    return E.MixtureOfGaussiansEvent(float(sigma), tuple(sens), tuple(comps[s] for s in sens))


class AllocationMC(NamedTuple):
    """Monte Carlo delta(eps) of random allocation (docs/MATH.md 13): per-direction estimates,
    the Hoeffding half-width ``eta`` (all estimates within eta of the truth with probability
    >= 1 - beta) and the standard errors; ``lower``/``upper`` is the add_remove interval
    [max_d (est_d - eta), max_d (est_d + eta)] clipped to [0, 1]."""

    epsilon: np.ndarray
    remove: np.ndarray
    add: np.ndarray
    eta: float
    se_remove: np.ndarray
    se_add: np.ndarray
    n_samples: int
    lower: np.ndarray
    upper: np.ndarray


def _log_elementary_symmetric(b, k: int):
    """ln e_k(exp(b_1), ..., exp(b_t)) per row of ``b`` (the elementary symmetric polynomial of degree
    k), by the recurrence E_j <- E_j + y_i E_{j-1} on rows scaled by their largest entry."""
    top = b.max(axis=1, keepdims=True)
    y = np.exp(b - top)
    e = np.zeros((b.shape[0], k + 1))
    e[:, 0] = 1.0
    for i in range(b.shape[1]):
        e[:, 1:] = e[:, 1:] + y[:, i:i + 1] * e[:, :-1]
    with np.errstate(divide="ignore"):
        return np.log(e[:, k]) + k * top[:, 0]


def allocation_delta(sigma: float, t: int, epochs: int, epsilon, *, n_samples: int = 1_000_000,
                     beta: float = 1e-3, seed=None, chunk: int = 100_000, selections: int = 1) -> AllocationMC:
    """Monte Carlo estimate of delta(eps) of ``epochs`` epochs of random allocation with t steps
    per epoch (sum query of sensitivity 1, Gaussian noise ``sigma`` per step, one differing
    record, the others contributing 0 -- the worst case, realised by a dataset).

    Per epoch the t noisy batch sums y_1..y_t are N(0, sigma^2) each, plus 1 in the record's
    batch under P (remove: the record is present; by symmetry its batch is the first one).
    The privacy loss of an epoch is

        L(y) = ln( (1/t) sum_j exp((2 y_j - 1) / (2 sigma^2)) ),

    the log of the average over the record's possible batches of the Gaussian likelihood
    ratios; epochs add.  delta_remove(eps) = E_P[(1 - e^{eps - L})_+] and
    delta_add(eps) = E_Q[(1 - e^{eps + L})_+] (the add loss is -L, sampled under Q).
    Each average is of values in [0, 1], so Hoeffding with a union bound over the
    2 |eps| estimates gives ``eta``.  A statistical check, not a certified bound.

    ``selections`` = k > 1: the record in k of the t batches (uniform k-subset; by symmetry the
    first k under P), L(y) = ln( e_k(exp((2 y - 1) / (2 sigma^2))) / C(t, k) ) with e_k the
    elementary symmetric polynomial (the average over the k-subsets of the likelihood ratios).
    """
    eps = V.epsilon_array("epsilon", epsilon)
    n_samples = V.steps("n_samples", n_samples)
    beta = V.probability_open("beta", beta)
    rng = np.random.default_rng(seed)
    s, t, epochs = float(sigma), int(t), int(epochs)
    k = V.positive_int("selections", selections)
    if k >= t:
        raise ValueError(f"selections: need k < t, got k={k}, t={t}")
    # (2y - 1)/(2 s^2) = y/s^2 - 1/(2 s^2); with y = s z: z/s - 1/(2 s^2)
    off = -0.5 / s**2 - math.log(t)
    if k > 1:
        off = -0.5 * k / s**2 - (math.lgamma(t + 1) - math.lgamma(k + 1) - math.lgamma(t - k + 1))
    sums = {"remove": np.zeros(eps.size), "add": np.zeros(eps.size)}
    sq = {"remove": np.zeros(eps.size), "add": np.zeros(eps.size)}
    buf = np.empty((min(chunk, n_samples), t))
    for direction in ("remove", "add"):
        done = 0
        while done < n_samples:
            m = min(chunk, n_samples - done)
            y = np.zeros(m)
            b = buf[:m]
            for _ in range(epochs):
                rng.standard_normal(out=b)
                b *= 1.0 / s
                if direction == "remove":
                    b[:, :k] += 1.0 / s**2  # the record's batches: y_j + 1, i.e. z/s + 1/s^2
                if k > 1:
                    y += _log_elementary_symmetric(b, k) + off
                    continue
                with np.errstate(over="ignore"):
                    np.exp(b, out=b)
                y += np.log(b.sum(axis=1)) + off
            loss = y if direction == "remove" else -y
            with np.errstate(over="ignore", invalid="ignore"):
                w = -np.expm1(np.minimum(eps[:, None] - loss[None, :], 0.0))
            sums[direction] += w.sum(axis=1)
            sq[direction] += (w * w).sum(axis=1)
            done += m
    n = n_samples
    est = {d: sums[d] / n for d in sums}
    se = {d: np.sqrt(np.maximum(sq[d] / n - est[d] ** 2, 0.0) / n) for d in sums}
    eta = math.sqrt(math.log(2 * 2 * eps.size / beta) / (2 * n))
    lo = np.clip(np.maximum(est["remove"], est["add"]) - eta, 0.0, 1.0)
    up = np.clip(np.maximum(est["remove"], est["add"]) + eta, 0.0, 1.0)
    return AllocationMC(eps, est["remove"], est["add"], eta, se["remove"], se["add"], n, lo, up)


def laplace_allocation_delta(b: float, t: int, epochs: int, epsilon, *, n_samples: int = 1_000_000,
                             seed=None, chunk: int = 50_000, beta: float = 1e-3):
    """(estimate, eta): Monte Carlo delta(eps) (the larger direction) of ``epochs`` epochs of random
    allocation with Laplace noise of scale ``b`` (sum query of sensitivity 1, one dimension, the others
    contributing 0): per coordinate the likelihood ratio is exp((|x| - |x - 1|) / b), the epoch's the
    mean over the t coordinates (remove: sampled under P, the record in the first step by symmetry;
    add: under Q, loss negated); eta = Hoeffding half-width with a union bound over the 2 |eps|
    estimates at failure probability ``beta``.  A statistical check, not a certified bound."""
    eps = V.epsilon_array("epsilon", epsilon)
    n = V.steps("n_samples", n_samples)
    rng = np.random.default_rng(seed)
    est = []
    for direction in ("remove", "add"):
        acc = np.zeros(eps.size)
        for c in range(0, n, chunk):
            m = min(chunk, n - c)
            x = rng.laplace(0.0, b, (m, epochs, t))
            if direction == "remove":
                x[:, :, 0] += 1.0
            y = (np.abs(x) - np.abs(x - 1.0)) / b
            loss = (np.logaddexp.reduce(y, axis=2) - math.log(t)).sum(axis=1)
            if direction == "add":
                loss = -loss
            acc += (-np.expm1(np.minimum(eps[:, None] - loss[None, :], 0.0))).sum(axis=1)
        est.append(acc / n)
    eta = math.sqrt(math.log(2 * 2 * eps.size / beta) / (2 * n))
    return np.maximum(est[0], est[1]), eta

