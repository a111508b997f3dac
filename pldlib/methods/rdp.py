"""The RDP (moments) accountant: a baseline upper bound (docs/MATH.md section 8).

:func:`account_rdp` -- the moments accountant / Renyi DP for the Gaussian
mechanism, Poisson-subsampled or not, at integer orders alpha = 2 .. 1024:

    A_alpha = sum_{j=0..alpha} C(alpha, j) (1-q)^{alpha-j} q^j exp((j^2 - j) / (2 sigma^2)),
    RDP(alpha) = k ln(A_alpha) / (alpha - 1)                       (Mironov, Talwar, Zhang 2019),

converted with the improved bound of Balle et al. 2020 (Thm 21; also
Canonne-Kamath-Steinke 2020, Prop 12), the one TensorFlow Privacy uses:

    eps = min_alpha [RDP(alpha) + ln((alpha-1)/alpha) - (ln delta + ln alpha) / (alpha - 1)],
    delta(eps) = min_alpha exp((alpha-1)(RDP(alpha) - eps) + (alpha-1) ln(1 - 1/alpha) - ln alpha).

Steps whose Renyi curve is known at every real order -- unsampled Gaussians (alpha / (2 sigma^2))
and zCDP guarantees (:class:`~pldlib.events.ZCDPEvent`: xi + rho alpha) -- are converted at the real
orders :data:`FRACTIONAL_ORDERS` too when every step is of that kind (docs/MATH.md 8.1).

It is an **upper bound** (a guarantee, loose by design): results are
``Interval(nan, x, estimate=x, kind="upper")`` -- no lower bound is offered.
The integer-order formula is the RDP of the Poisson *remove* pair; Mironov et
al. show it also bounds the add direction for the sampled Gaussian, so it
covers the relations add, remove and add_remove.  WOR sampling with
add/remove uses the same pair with sensitivity 2 (sigma / 2, docs/MATH.md
section 2); plain Gaussian substitution likewise.  Anything else (Laplace,
Poisson/WOR substitution, finite mechanisms) raises NotImplementedError.

``RDPAccountant.epsilon_grid(steps, deltas)`` answers a (steps x delta) grid
for a single mechanism in one vectorised pass.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from .. import _validate as V
from .. import events as E
from .base import Accountant, Interval, Step, UnsupportedEventError, components_of, transient

__all__ = ["account_rdp", "RDPAccountant", "GaussianFormulaAccountant", "RDP_ORDERS", "FRACTIONAL_ORDERS", "rdp_single_step",
           "gaussian_params"]

#: integer Renyi orders used by the RDP baseline
RDP_ORDERS = np.arange(2, 1025, dtype=float)
#: real orders added where every step's Renyi curve is known at real orders (unsampled Gaussians,
#: zCDP guarantees: linear in alpha): the conversion's minimum is then not held to integers >= 2
#: (relative spacing 1.5%: within ~0.1% of the continuous minimum)
FRACTIONAL_ORDERS = 1.0 + np.geomspace(1e-3, 1023.0, 900)


def gaussian_params(step, who: str) -> tuple[float, float]:
    """(effective sigma, q) of a supported Gaussian step, or :class:`UnsupportedEventError`."""
    base = step.base
    if not isinstance(base, E.GaussianEvent):
        raise UnsupportedEventError(
            f"{who}: only the Gaussian mechanism is supported (got {type(base).__name__}); "
            "use the PLD or SPA accountant")
    sigma = base.sigma  # noise multiplier: noise std / sensitivity
    sampling, rel = step.sampling, step.relation
    if step.group > 1:
        raise UnsupportedEventError(f"{who}: no formula for user-level accounting (group > 1); "
                                    "use the PLD, PRV or SPA accountant")
    if sampling == "none":
        if rel == "substitution":
            sigma = sigma / 2.0  # pair (B_0, B_2D)
        return sigma, 1.0
    if sampling not in ("poisson", "wor"):
        raise UnsupportedEventError(f"{who}: no formula for {sampling!r} sampling; use the PLD accountant")
    if rel == "substitution":
        raise UnsupportedEventError(
            f"{who}: {sampling} sampling with the substitution relation is not supported "
            "(no RDP/GDP formula for that dominating pair here); use the PLD or SPA accountant")
    if sampling == "wor":
        sigma = sigma / 2.0  # WOR add/remove = Poisson pair with sensitivity 2D (docs/MATH.md section 2)
    return sigma, float(step.q)


def rdp_single_step(sigma: float, q: float, orders=RDP_ORDERS) -> np.ndarray:
    """RDP epsilon of one step of the (Poisson-subsampled) Gaussian at integer orders."""
    orders = np.asarray(orders, dtype=float)
    if q == 1.0:
        return orders / (2.0 * sigma**2)
    if np.any(orders != np.round(orders)) or orders.min() < 2:
        raise ValueError("orders must be integers >= 2")
    amax = int(orders.max())
    a = orders[:, None]
    j = np.arange(amax + 1, dtype=float)[None, :]
    valid = j <= a
    with np.errstate(invalid="ignore"):
        logc = special.gammaln(a + 1) - special.gammaln(j + 1) - special.gammaln(np.maximum(a - j, 0) + 1)
        terms = logc + (a - j) * math.log1p(-q) + j * math.log(q) + (j * j - j) / (2.0 * sigma**2)
    terms = np.where(valid, terms, -np.inf)
    return special.logsumexp(terms, axis=1) / (orders - 1.0)


class GaussianFormulaAccountant(Accountant):
    """Base of the closed-form baselines (RDP, CLT): Gaussian steps only, answered on a
    (steps x delta) grid in one vectorised pass (``epsilon_grid``)."""

    def _unsupported(self, step):
        try:
            gaussian_params(step, self.method)
        except UnsupportedEventError as e:
            # the reason only: compose() prefixes the method name itself (no "rdp: rdp:")
            return str(e).removeprefix(f"{self.method}: ")
        return None

    def epsilon_per_steps(self, event, steps, deltas):
        acc = self.fresh().compose(event, 1)
        lo, est, up = acc.epsilon_grid(steps, deltas)
        return lo, est, up, []


class RDPAccountant(GaussianFormulaAccountant):
    """Moments accountant (integer orders, improved conversion): an upper bound only.

    ``RDPAccountant(relation, orders=RDP_ORDERS).compose(event, count)``; answers are
    ``Interval(nan, x, estimate=x, kind="upper")`` with x a certified upper bound.
    """

    method = "rdp"
    kind = "upper"

    def __init__(self, relation: str = "add_remove", *, orders=RDP_ORDERS):
        super().__init__(relation)
        self.orders = np.atleast_1d(np.asarray(orders, dtype=float))
        bad = ~(np.isfinite(self.orders) & (self.orders == np.round(self.orders)) & (self.orders >= 2))
        if self.orders.ndim != 1 or self.orders.size == 0 or bad.any():
            got = V.fmt(self.orders[bad][0]) if self.orders.ndim == 1 and bad.any() else "an empty list"
            raise ValueError(f"orders must be a list of integers >= 2 (Renyi orders), got {got}")

    def _options(self) -> dict:
        return {"orders": self.orders}

    def _unsupported(self, step):
        if isinstance(step.base, E.ZCDPEvent):
            return _zcdp_unsupported(step)
        if isinstance(step.base, E.RepeatAndSelectEvent):
            if step.sampling != "none" or step.group > 1:
                return "the best of several runs has no formula for subsampling or grouping here"
            for ev, _k in E.flatten(step.base.event):
                why = self._unsupported(Step(ev, step.relation))
                if why:
                    return f"its repeated event: {why}"
            return None
        return super()._unsupported(step)

    def _linear(self, m) -> tuple[float, float] | None:
        """(xi, rho) of a step whose Renyi curve is xi + rho alpha at every real alpha > 1 (a zCDP
        guarantee; an unsampled Gaussian: rho = 1 / (2 sigma_eff^2)), else None."""
        if isinstance(m.base, E.ZCDPEvent):
            return m.base.xi, m.base.rho
        if isinstance(m.base, E.GaussianEvent) and m.sampling == "none" and m.group == 1:
            sigma, _q = gaussian_params(m, "rdp")
            return 0.0, 1.0 / (2.0 * sigma * sigma)
        return None

    def _build(self):
        lin = [self._linear(m) for m, _ in self.components]
        default = self.orders.size == RDP_ORDERS.size and np.array_equal(self.orders, RDP_ORDERS)
        # (the conversion holds at every order: more orders only tighten the minimum)
        self._orders = np.concatenate([FRACTIONAL_ORDERS, self.orders]) if default and all(
            x is not None for x in lin) else self.orders
        self._per_step = [(self._curve(m, xr), k) for (m, k), xr in zip(self.components, lin)]
        self.rdp = sum(k * r for r, k in self._per_step)

    def _curve(self, m, lin=None) -> np.ndarray:
        """One step's Renyi curve at ``self._orders``."""
        if lin is not None:  # D_alpha <= xi + rho alpha (docs/MATH.md 8.1)
            return lin[0] + lin[1] * self._orders
        if isinstance(m.base, E.RepeatAndSelectEvent):
            inner = sum(k * self._curve(s, self._linear(s)) for s, k in
                        ((Step(ev, m.relation), k) for ev, k in E.flatten(m.base.event)))
            return repeat_and_select_rdp(self._orders, inner, m.base.mean, m.base.shape)
        sigma, q = gaussian_params(m, "rdp")
        return rdp_single_step(sigma, q, self._orders)

    def _eps(self, rdp, deltas):
        a = self._orders
        e = rdp[..., None, :] + np.log1p(-1.0 / a) - (np.log(deltas)[:, None] + np.log(a)) / (a - 1.0)
        return np.maximum(e.min(axis=-1), 0.0)

    def epsilon(self, delta) -> Interval:
        """eps(delta): ``Interval(nan, x, estimate=x, kind="upper")`` (x is an upper bound)."""
        scalar = np.ndim(delta) == 0
        deltas = V.delta_array("delta", delta)
        e = self._eps(self.rdp, deltas)
        nan = np.full_like(e, np.nan)
        if scalar:
            return Interval(math.nan, float(e[0]), estimate=float(e[0]), kind="upper")
        return Interval(nan, e, estimate=e, kind="upper")

    def delta(self, epsilon) -> Interval:
        """delta(eps): ``Interval(nan, x, estimate=x, kind="upper")`` (x is an upper bound)."""
        scalar = np.ndim(epsilon) == 0
        eps = V.epsilon_array("epsilon", epsilon)
        a = self._orders
        ld = (a - 1.0) * (self.rdp[None, :] - eps[:, None] + np.log1p(-1.0 / a)) - np.log(a)
        d = np.minimum(np.exp(ld.min(axis=1)), 1.0)
        # delta > 0 at every eps for the noises RDP takes (Gaussian): a bound that underflows is
        # the smallest double, never 0 (docs/MATH.md 8.2)
        d = np.where(d > 0, d, 5e-324)
        nan = np.full_like(d, np.nan)
        if scalar:
            return Interval(math.nan, float(d[0]), estimate=float(d[0]), kind="upper")
        return Interval(nan, d, estimate=d, kind="upper")

    def epsilon_grid(self, steps, deltas):
        """(lower, estimate, upper) on a (steps x delta) grid for a single mechanism (lower is NaN)."""
        if len(self._per_step) != 1:
            raise ValueError("epsilon_grid: needs an accountant for a single mechanism")
        r1 = self._per_step[0][0]
        steps = np.array([V.steps("steps", s) for s in np.atleast_1d(steps).tolist()], dtype=float)
        deltas = V.delta_array("delta", deltas)
        e = np.stack([self._eps(k * r1, deltas) for k in steps])
        return np.full_like(e, np.nan), e, e


def _tnb_gamma(shape: float, mean: float) -> float:
    """gamma in (0, 1] of the truncated negative binomial of shape ``shape`` with mean ``mean``:
    E[K] = shape (1 - gamma) / (gamma (1 - gamma^shape)) (shape 0: (1 - gamma) / (gamma ln(1/gamma))),
    decreasing in gamma from +inf to 1; solved by bisection on ln gamma."""
    def mean_of(g):
        if shape == 0:
            return (1 - g) / (g * -math.log(g))
        return shape * (1 - g) / (g * -math.expm1(shape * math.log(g)))

    if mean <= 1.0:
        return 1.0
    lo, hi = -1.0, -1e-12  # ln gamma
    while mean_of(math.exp(lo)) < mean:
        lo *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mean_of(math.exp(mid)) > mean:
            lo = mid
        else:
            hi = mid
    return math.exp(lo)  # (the smaller gamma: its mean is >= the given one, the safe side)


def repeat_and_select_rdp(orders, rdp, mean: float, shape: float) -> np.ndarray:
    """Renyi curve of the best of K runs of a mechanism with curve ``rdp`` at ``orders``
    (Papernot and Steinke 2022; docs/MATH.md 8.1): K Poisson of mean mu (shape inf, Theorem 6):
    eps'(l) = eps(l) + mu delta_hat + ln(mu) / (l - 1), delta_hat the conversion's delta at
    eps_hat = ln(l / (l - 1)); K truncated negative binomial (Theorem 2): eps'(l) = eps(l) +
    ln(mu) / (l - 1) + (1 + shape) min_j [(1 - 1/l_j) eps(l_j) + ln(1/gamma) / l_j], then the
    smallest value at any order >= l (Renyi divergences do not decrease with the order).
    A truncated negative binomial of mean exactly 1 is a single run (K = 1): the curve itself; a
    Poisson count of mean 1 is not (K may be 0 or several).  An upper bound."""
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if shape == math.inf:
        eps_hat = np.log(a / (a - 1.0))
        ld = (a[None, :] - 1.0) * (r[None, :] - eps_hat[:, None] + np.log1p(-1.0 / a)[None, :]) - np.log(a)[None, :]
        delta_hat = np.minimum(np.exp(ld.min(axis=1)), 1.0)
        return r + mean * delta_hat + math.log(mean) / (a - 1.0)
    if mean == 1.0:
        return r.copy()
    gamma = _tnb_gamma(shape, mean)
    c = (1.0 + shape) * float(np.min((1.0 - 1.0 / a) * r - math.log(gamma) / a))
    out = r + math.log(mean) / (a - 1.0) + c
    order = np.argsort(a)
    suffix = np.minimum.accumulate(out[order][::-1])[::-1]
    res = np.empty_like(out)
    res[order] = suffix
    return res


def _zcdp_unsupported(step) -> str | None:
    if step.sampling != "none" or step.group > 1:
        return ("a zCDP guarantee is taken as stated: subsampling or grouping it has no formula here "
                "(state the guarantee of the sampled or grouped mechanism instead)")
    return None


def account_rdp(mechanism, steps: int | None = None, *, orders=RDP_ORDERS) -> RDPAccountant:
    """RDP / moments-accountant baseline (upper bound only; see the module docstring).

    Raises NotImplementedError for mechanisms other than the Gaussian
    (none / Poisson / WOR with add, remove or add_remove; plain substitution).
    """
    return RDPAccountant.for_mechanism(mechanism, steps, orders=orders)


def rdp_floor_mask(event, relation: str, ks, deltas, floor: float) -> tuple[np.ndarray, str]:
    """``(mask, note)``: which steps values ``ks`` have a certified eps at most ``floor`` at every
    delta, by the Renyi-DP accountant's upper bounds (one RDP curve for every count: cheap).  Each
    masked steps value carries its own certificate (no monotonicity is assumed).  Where the RDP
    accountant cannot take the event (or fails), nothing is masked and the note says why."""
    ks = list(ks)
    mask = np.zeros(len(ks), dtype=bool)
    try:
        rdp = RDPAccountant(relation)
        why = rdp._refusal(event)
        if why:
            return mask, f"eps_floor not applied: no cheap certified upper bound ({why})"
        _lo, _est, up, _notes = rdp.epsilon_per_steps(event, ks, deltas)
    except Exception as e:
        if transient(e):
            raise
        return mask, f"eps_floor not applied: the RDP upper bound failed ({type(e).__name__}: {e})"
    up = np.asarray(up, dtype=float)
    mask = np.all(np.isfinite(up) & (up <= floor), axis=1)
    if not mask.any():
        return mask, ""
    k0 = max(k for k, m in zip(ks, mask) if m)
    return mask, (f"{int(mask.sum())} steps values (up to steps={k0}) not computed: eps <= eps_floor={floor:g} there "
                  "at every delta (certified Renyi-DP upper bound)")
