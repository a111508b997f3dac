"""Cost model of a sweep row: how many seconds one block (one row) is expected to take.

What it is: a log-linear model per method,

    log(seconds) = b0[m] + b_steps * log(n_steps) + b_delta * log(n_delta)
                   + b_sigma * log(1/sigma) + b_q * log(q) + b_sub * [sampling != none]

with one coefficient vector ``(b0, b_steps, b_delta, b_sigma, b_q, b_sub)`` per method
(``n_steps`` and ``n_delta`` are the numbers of steps and delta values a block spans, the
same for every block of a sweep); it predicts the method's own time (what a block records
as its ``seconds``), and a fixed :data:`OVERHEAD_SECONDS` per row is added when tasks are sized.  It is used for one thing only: to group the rows of a
sharded store into tasks of about a target duration (:func:`group_tasks`; default
:data:`DEFAULT_TASK_SECONDS`, config key ``task_seconds`` / ``sweeps run --task-seconds``),
and, when a store is made, to choose how many blocks a shard holds.  A wrong model makes
tasks longer or shorter than the target, never wrong results.

The built-in prior (:data:`PRIOR`) is a rough guess from timings of the methods on one
core (``pld``: fitted to the 40 seeded cluster-atlas rows of results/atlas/row_costs.json,
whose log seconds it predicts to a standard deviation of 0.76; the others guessed): the intercept ``b0`` per method (:data:`PRIOR_SECONDS`: seconds of a block of one
steps value and one delta at sigma = 1, q = 1, no sampling), the slopes shared
(:data:`PRIOR_SLOPES`: about linear in the number of steps values -- one accountant per steps
value --, nearly flat in the number of deltas -- one vectorised call --, slower for small
sigma and for subsampling).  Methods without a prior use :data:`DEFAULT_SECONDS`.

When a store is resumed, the model is refitted (:meth:`CostModel.refit`) from the measured
compute seconds of the store's completed blocks: a ridge regression per method, pulled
towards the prior (so a few blocks move the intercept, many blocks the slopes too; the
``n_steps``/``n_delta`` slopes cannot be learnt from one sweep, where they are constants, and
stay at the prior).  The model is kept in the store attrs as JSON (``cost_model``).
"""
from __future__ import annotations

import json
import math

import numpy as np

__all__ = ["CostModel", "OVERHEAD_SECONDS", "PRIOR", "PRIOR_SECONDS", "PRIOR_SLOPES", "DEFAULT_SECONDS", "DEFAULT_TASK_SECONDS",
           "features", "group_tasks"]

#: default target duration of one task (seconds of compute on one worker)
DEFAULT_TASK_SECONDS = 30.0
#: seconds a task spends per row beyond the method's own time (the run_block call around it, its
#: share of the shard write): added to every row's predicted cost when tasks are sized
#: (measured: ~0.2 ms per one-cell row on a 2-core machine)
OVERHEAD_SECONDS = 2e-4
#: prior seconds of a block of one steps value and one delta at sigma = 1, q = 1, no sampling
PRIOR_SECONDS = {
    "pld": 0.03, "prv": 0.03, "prv_accountant": 0.5, "dp_accounting": 1.0, "rdp": 0.002, "spa": 0.05,
    "clt": 0.002, "trivial": 0.00003,
}
#: seconds of a method without a prior
DEFAULT_SECONDS = 0.1
#: prior slopes (b_steps, b_delta, b_sigma, b_q, b_sub), shared by the methods
PRIOR_SLOPES = (1.0, 0.1, 0.5, 0.1, 0.7)
#: weight of the prior in a refit (in units of one measured block)
PRIOR_WEIGHT = 5.0


def _prior(method: str) -> list:
    return [math.log(PRIOR_SECONDS.get(method, DEFAULT_SECONDS)), *PRIOR_SLOPES]


#: the prior coefficients of the methods that have one
PRIOR = {m: _prior(m) for m in PRIOR_SECONDS}


def features(sigma, q, n_steps: int, n_delta: int, sampling) -> np.ndarray:
    """The model's feature matrix (rows x 6) for arrays of sigma, q, sampling (strings)."""
    sigma = np.atleast_1d(np.asarray(sigma, dtype=float))
    q = np.broadcast_to(np.asarray(q, dtype=float), sigma.shape)
    sub = np.broadcast_to(np.asarray(sampling) != "none", sigma.shape).astype(float)
    n = sigma.shape[0]
    return np.column_stack([np.ones(n), np.full(n, math.log(max(1, n_steps))), np.full(n, math.log(max(1, n_delta))),
                            -np.log(np.maximum(sigma, 1e-12)), np.log(np.clip(q, 1e-12, 1.0)), sub])


class CostModel:
    """Per-method coefficients of the log-linear cost model (see the module doc)."""

    def __init__(self, coef: dict | None = None, fitted: dict | None = None):
        self.coef = {m: list(map(float, c)) for m, c in (coef or {}).items()}
        self.fitted = dict(fitted or {})  # method -> number of measured blocks it was fitted on

    def coefficients(self, method: str) -> np.ndarray:
        return np.asarray(self.coef.get(method) or _prior(method), dtype=float)

    def predict(self, method: str, sigma, q, n_steps: int, n_delta: int, sampling) -> np.ndarray:
        """Expected seconds of each row (arrays of sigma, q, sampling; one method).  Evaluated in
        slices of 2^16 rows, so a million rows cost a few MB, not a feature matrix of 48 MB."""
        w = self.coefficients(method)
        sigma = np.atleast_1d(np.asarray(sigma, dtype=float))
        q = np.broadcast_to(np.asarray(q, dtype=float), sigma.shape)
        sampling = np.broadcast_to(np.asarray(sampling), sigma.shape)
        out = np.empty(sigma.shape[0])
        step = 1 << 16
        for i in range(0, len(out), step):
            x = features(sigma[i:i + step], q[i:i + step], n_steps, n_delta, sampling[i:i + step])
            out[i:i + step] = np.exp(np.clip(x @ w, -30, 30))
        return out

    def refit(self, method: str, sigma, q, n_steps: int, n_delta: int, sampling, seconds) -> "CostModel":
        """A new model whose ``method`` coefficients are refitted to measured ``seconds``
        (ridge regression of log seconds, pulled towards the current coefficients)."""
        seconds = np.asarray(seconds, dtype=float)
        ok = np.isfinite(seconds) & (seconds > 0)
        if not ok.any():
            return self
        x = features(np.asarray(sigma)[ok], np.asarray(q)[ok], n_steps, n_delta, np.asarray(sampling)[ok])
        y = np.log(np.maximum(seconds[ok], 1e-7))
        w0 = self.coefficients(method)
        lam = np.full(len(w0), PRIOR_WEIGHT)
        lam[1:3] = 1e9  # n_steps, n_delta: constants within a sweep, so not identifiable: keep the prior
        a = x.T @ x + np.diag(lam)
        b = x.T @ y + lam * w0
        w = np.linalg.solve(a, b)
        out = CostModel(self.coef, self.fitted)
        out.coef[method] = [float(v) for v in w]
        out.fitted[method] = int(ok.sum())
        return out

    def to_json(self) -> str:
        return json.dumps({"model": "log-linear per method: log s = b . (1, log n_steps, log n_delta, "
                                    "log 1/sigma, log q, subsampled)",
                           "coef": self.coef, "fitted_on_blocks": self.fitted}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> "CostModel":
        if not text:
            return cls()
        try:
            d = json.loads(text)
            return cls(d.get("coef") or {}, d.get("fitted_on_blocks") or {})
        except (ValueError, TypeError, AttributeError):
            return cls()


def group_tasks(costs, target: float, min_tasks: int = 1) -> list[list[int]]:
    """Group units (shards) of expected ``costs`` seconds into tasks of about ``target`` seconds.

    Units are taken heaviest first; a task is closed once its cost reaches ``target`` (a unit
    costlier than ``target`` is a task of its own: a unit is never split).  ``min_tasks``: the
    target is lowered so that there are at least that many tasks when there are that many
    units (keeps every worker busy in a small sweep).  Returns lists of unit indices."""
    costs = np.asarray(costs, dtype=float)
    n = len(costs)
    if n == 0:
        return []
    total = float(costs.sum())
    if min_tasks > 1:
        target = min(target, total / min(min_tasks, n))
    target = max(target, 1e-12)
    order = np.argsort(-costs, kind="stable")
    tasks, cur, acc = [], [], 0.0
    for i in order:
        cur.append(int(i))
        acc += costs[i]
        if acc >= target:
            tasks.append(cur)
            cur, acc = [], 0.0
    if cur:
        tasks.append(cur)
    return tasks
