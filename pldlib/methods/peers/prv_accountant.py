"""Microsoft's ``prv_accountant`` (0.2) as a pldlib accountant (method ``prv_accountant``, kind ``peer``).

Its answers are ``(lower, estimate, upper)`` of eps(delta) as the library states
them, for an ``eps_error`` and a ``delta_error`` (default: the smallest queried
delta / 1000, the convention of its own ``Accountant`` class).  Its
discretisation domain is refused above ``max_points`` points (default 2^24) with
:class:`~pldlib.GridTooLargeError` instead of exhausting memory.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ... import _validate as V
from ... import events as E
from ..base import Accountant, Interval

__all__ = ["PrvAccountantPeer"]


class PrvAccountantPeer(Accountant):
    """prv_accountant 0.2 behind the pldlib interface (supported events: :mod:`pldlib.methods.peers`)."""

    method = "prv_accountant"
    kind = "peer"

    def __init__(self, relation: str = "add_remove", *, eps_error: float | None = 0.01,
                 delta_error: float | None = None, max_points: int | None = 2**24):
        super().__init__(relation)
        self.eps_error = 0.01 if eps_error is None else V.positive_finite("eps_error", eps_error)
        if delta_error is not None:
            delta_error = V.positive_finite("delta_error", delta_error)
            if delta_error >= 1.0:
                raise ValueError(f"delta_error: must be in (0, 1), got {V.fmt(delta_error)}")
        self.delta_error = delta_error
        self.max_points = 2**24 if max_points is None else V.positive_int("max_points", max_points)

    def _options(self) -> dict:
        return {"eps_error": self.eps_error, "delta_error": self.delta_error, "max_points": self.max_points}

    def _unsupported(self, step) -> str | None:
        ev = step.event
        base = ev.event if isinstance(ev, E.Sampled) else ev
        sampled = isinstance(ev, E.Sampled) and ev.q < 1.0
        if isinstance(ev, E.Sampled) and ev.group > 1:
            return "prv_accountant 0.2 has no user-level (group > 1) accounting"
        if sampled and ev.sampling != "poisson":
            return f"prv_accountant 0.2 has no sampling without replacement or other scheme {ev.sampling!r} (Poisson only)"
        if self.relation == "substitution":
            return "prv_accountant 0.2 has no substitution relation"
        if isinstance(base, E.GaussianEvent):
            if sampled and self.relation != "remove":
                return (f"prv_accountant 0.2 models the remove pair of the Poisson-subsampled Gaussian only "
                        f"(relation {self.relation!r} needs the add direction too)")
            return None
        if isinstance(base, E.LaplaceEvent):
            return "prv_accountant 0.2 has no subsampled Laplace mechanism" if sampled else None
        return f"prv_accountant 0.2 takes Gaussian and Laplace steps only, not {type(base).__name__}"

    def _variable(self, ev):
        import prv_accountant as prv

        base = ev.event if isinstance(ev, E.Sampled) else ev
        q = ev.q if isinstance(ev, E.Sampled) else 1.0
        if isinstance(base, E.GaussianEvent):
            if q < 1.0:
                return prv.PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=base.sigma)
            return prv.GaussianMechanism(noise_multiplier=base.sigma)
        return prv.LaplaceMechanism(mu=base.sensitivity / base.scale)  # privacy loss in [-1/b, 1/b]

    def _composed(self, delta_error: float):
        """The library's composition for this delta_error (cached per value)."""
        cache = self.__dict__.setdefault("_by_delta_error", {})
        if delta_error not in cache:
            import prv_accountant as prv
            from prv_accountant.accountant import compute_safe_domain_size

            variables = [self._variable(s.event) for s, _ in self._steps]
            counts = [int(k) for _, k in self._steps]
            # the domain the accountant would allocate (its own formulas): refuse it when too big
            L = compute_safe_domain_size(variables, counts, eps_error=self.eps_error, delta_error=delta_error)
            mesh = self.eps_error / math.sqrt(sum(counts) / 2 * math.log(12 / delta_error))
            points = 2 * L / mesh
            if points > self.max_points:
                raise V.GridTooLargeError(f"refused: prv_accountant would discretise {points:.3g} points "
                                          f"(max_points {self.max_points})", need=int(min(points, 2**62)),
                                          limit=self.max_points)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                acc = prv.PRVAccountant(variables, eps_error=self.eps_error, delta_error=delta_error,
                                        max_self_compositions=counts)
                cache[delta_error] = (acc.compute_composition(counts), delta_error)
        return cache[delta_error]

    def _build(self) -> None:
        self._by_delta_error = {}

    def epsilon(self, delta):
        """prv_accountant's ``compute_epsilon(delta)``: (lower, estimate, upper) as it states them."""
        self._ensure_built()
        scalar = np.ndim(delta) == 0
        ds = V.delta_array("delta", np.atleast_1d(delta))
        de = self.delta_error if self.delta_error is not None else float(ds.min()) / 1000.0
        composed, de = self._composed(de)
        out = np.array([composed.compute_epsilon(float(d), de, self.eps_error) for d in ds], dtype=float)
        lo, est, up = out[:, 0], out[:, 1], out[:, 2]
        if scalar:
            return Interval(float(lo[0]), float(up[0]), estimate=float(est[0]), kind="peer")
        return Interval(lo, up, estimate=est, kind="peer")

    def delta(self, epsilon):
        """prv_accountant 0.2's ``compute_delta_estimate(eps)``: an estimate only (the library gives
        no bounds on delta): ``lower`` and ``upper`` are NaN."""
        self._ensure_built()
        scalar = np.ndim(epsilon) == 0
        es = np.atleast_1d(np.asarray(epsilon, dtype=float))
        de = self.delta_error if self.delta_error is not None else 1e-12
        composed, de = self._composed(de)
        est = np.array([composed.compute_delta_estimate(float(e)) for e in es], dtype=float)
        nan = np.full(est.shape, np.nan)
        if scalar:
            return Interval(math.nan, math.nan, estimate=float(est[0]), kind="peer")
        return Interval(nan, nan.copy(), estimate=est, kind="peer")

    def epsilon_per_steps(self, event, steps, deltas):
        """One composition per steps value with delta_error = min(deltas)/1000 unless set (as the
        library's own ``Accountant`` class does)."""
        deltas = V.delta_array("deltas", deltas)
        ks = [V.steps(f"steps[{i}]", k) for i, k in enumerate(steps)]
        opts = self._options()
        if opts["delta_error"] is None:
            opts["delta_error"] = float(deltas.min()) / 1000.0
        return self._table(ks, deltas, lambda k: type(self)(self.relation, **opts).compose(event, k))
