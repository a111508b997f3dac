"""pldlib behind Opacus' accountant contract (docs/MATH.md section 14).

:class:`OpacusAccountant` behaves as an ``opacus.accountants.IAccountant``
without importing torch or Opacus:

* ``step(noise_multiplier=..., sample_rate=...)`` records one DP-SGD step; equal
  consecutive steps are merged, so ``history`` is a list of
  ``(noise_multiplier, sample_rate, steps)`` as in Opacus;
* ``get_epsilon(delta)`` is computed from ``history`` alone, every time it
  changes -- Opacus' own ``get_noise_multiplier`` assigns
  ``accountant.history = [(sigma, sample_rate, steps)]`` and then calls
  ``get_epsilon`` -- and returns the **certified upper bound** of the chosen
  pldlib method (pessimistic; :meth:`OpacusAccountant.get_epsilon_interval`
  gives both ends);
* ``len(acc)``, ``mechanism()`` (``"pldlib"``), ``state_dict()`` /
  ``load_state_dict()`` (history and mechanism), ``get_optimizer_hook_fn``;
* Opacus' factory calls the class with no arguments: every constructor argument
  has a default (Poisson sampling, add/remove neighbours, method ``"pld"``).

Use it as ``privacy_engine.accountant = OpacusAccountant()``, or by name after
:func:`register` (``PrivacyEngine(accountant="pldlib")``,
``make_private_with_epsilon``).  :func:`get_noise_multiplier` has Opacus'
signature and returns a certified noise multiplier.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from copy import deepcopy

from .. import _validate as V
from .. import events as E
from ..methods import make_accountant, method_info, method_names
from ..methods.base import Interval

__all__ = ["OpacusAccountant", "get_noise_multiplier", "register", "MECHANISM"]

#: the name Opacus knows this accountant by (``mechanism()``, ``register``)
MECHANISM = "pldlib"


class OpacusAccountant:
    """Opacus accountant backed by a certified pldlib method (see the module docstring).

    Parameters
    ----------
    method : pldlib method with a certified upper bound (``"pld"``, ``"prv"``, ``"spa"``, ``"rdp"``)
    relation : neighbouring relation (default ``"add_remove"``, as Opacus assumes)
    sampling : how batches are drawn: ``"poisson"`` (Opacus' default DataLoader) or ``"wor"``
        (fixed-size batches: pldlib's certified without-replacement pairs)
    **options : the method's options (e.g. ``spacing=`` for ``pld``)
    """

    def __init__(self, method: str = "pld", relation: str = "add_remove", sampling: str = "poisson", **options):
        from ..sampling import scheme_names

        V.choice("method", method, method_names())
        if method_info(method).kind not in ("certified", "upper"):
            raise ValueError(f"method: {method!r} certifies no upper bound; use one of "
                             f"{', '.join(method_names(('certified', 'upper')))}")
        self._method = method
        self._relation = V.choice("relation", relation, V.RELATIONS)
        self._sampling = V.choice("sampling", sampling, scheme_names())
        self._options = dict(options)
        make_accountant(method, relation, **options)  # validates the options now
        self.history: list = []
        self._cache_key = None
        self._cache_acc = None

    # -- Opacus' contract ------------------------------------------------------------------
    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one step with ``noise_multiplier`` and ``sample_rate`` (merged with the last
        history entry when both are equal)."""
        if self.history:
            s, q, k = self.history[-1]
            if s == noise_multiplier and q == sample_rate:
                self.history[-1] = (s, q, k + 1)
                return
        self.history.append((noise_multiplier, sample_rate, 1))

    def get_epsilon(self, delta: float, *, spacing: float | None = None, interval: float | None = None) -> float:
        """Certified upper bound on epsilon at ``delta`` for the steps in ``history``
        (0 for an empty history; inf when a step has noise multiplier 0)."""
        return float(self.get_epsilon_interval(delta, spacing=spacing, interval=interval).upper)

    def get_epsilon_interval(self, delta: float, *, spacing: float | None = None, interval: float | None = None):
        """The method's whole answer (an ``Interval``, with ``estimate`` where the method has one) for ``history``
        (``spacing``: the grid spacing of ``pld``; ``interval`` is its older name)."""
        spacing = V.spacing_option(spacing, interval)
        delta = V.probability_open("delta", delta)
        acc, non_private = self._accountant(spacing)
        if non_private:
            return Interval(math.inf, math.inf)
        if acc is None:
            return Interval(0.0, 0.0)
        return acc.epsilon(delta)

    def __len__(self) -> int:
        return len(self.history)

    @classmethod
    def mechanism(cls) -> str:
        return MECHANISM

    def get_optimizer_hook_fn(self, sample_rate: float):
        """The callback Opacus attaches to its DPOptimizer: one :meth:`step` per optimizer step."""

        def hook_fn(optim):
            self.step(noise_multiplier=optim.noise_multiplier,
                      sample_rate=sample_rate * optim.accumulated_iterations)

        return hook_fn

    def state_dict(self, destination=None):
        """``{"history": ..., "mechanism": "pldlib"}`` (into ``destination`` if given)."""
        if destination is None:
            destination = OrderedDict()
        destination["history"] = deepcopy(self.history)
        destination["mechanism"] = self.mechanism()
        return destination

    def load_state_dict(self, state_dict) -> None:
        """Restore ``history`` from :meth:`state_dict`'s output (same checks as Opacus)."""
        if not state_dict:
            raise ValueError("state_dict: empty or None; cannot be loaded into the accountant")
        for key in ("history", "mechanism"):
            if key not in state_dict:
                raise ValueError(f"state_dict: has no key {key!r}")
        if state_dict["mechanism"] != self.mechanism():
            raise ValueError(f"state_dict: a {state_dict['mechanism']!r} accountant's state cannot be loaded "
                             f"into a {self.mechanism()!r} accountant")
        self.history = [tuple(h) for h in state_dict["history"]]

    # -- pldlib ------------------------------------------------------------------------------
    def _accountant(self, spacing):
        """(built pldlib accountant or None, non_private) for the current history (cached)."""
        hist = []
        for i, entry in enumerate(self.history):
            try:
                s, q, k = entry
            except (TypeError, ValueError):
                raise ValueError(f"history[{i}] must be (noise_multiplier, sample_rate, steps), "
                                 f"got {entry!r}") from None
            s = V.nonnegative_finite(f"history[{i}] noise_multiplier", s)
            q = float(q)
            if not (0.0 <= q <= 1.0):
                raise ValueError(f"history[{i}] sample_rate must be in [0, 1], got {V.fmt(q)}")
            k = V.steps(f"history[{i}] steps", k)
            hist.append((s, q, k))
        key = (tuple(hist), spacing)
        if key == self._cache_key:
            return self._cache_acc
        opts = dict(self._options)
        if spacing is not None:
            opts["spacing"] = spacing
        acc = make_accountant(self._method, self._relation, **opts)
        non_private, any_step = False, False
        for s, q, k in hist:
            if q == 0.0:
                continue
            if s == 0.0:
                non_private = True
                continue
            ev = E.GaussianEvent(s)
            acc.compose(E.Sampled(ev, q, self._sampling) if q < 1.0 else ev, k)
            any_step = True
        out = (acc if any_step else None, non_private)
        self._cache_key, self._cache_acc = key, out
        return out

    def __repr__(self) -> str:
        opts = "".join(f", {k}={E._fmt(v)}" for k, v in self._options.items())
        steps = sum(int(h[2]) for h in self.history) if self.history else 0
        return (f"<OpacusAccountant mechanism={MECHANISM!r} method={self._method!r} relation={self._relation!r} "
                f"sampling={self._sampling!r}{opts}: {len(self.history)} history entries, {steps} steps>")


def register(name: str = MECHANISM, accountant_class: type = OpacusAccountant, force: bool = True) -> None:
    """Register the accountant with Opacus (``opacus.accountants.register_accountant``) so that
    ``PrivacyEngine(accountant=name)`` and ``make_private_with_epsilon`` find it; also makes it a
    virtual subclass of Opacus' ``IAccountant``.  Needs Opacus (and so torch)."""
    from opacus.accountants import IAccountant, register_accountant

    IAccountant.register(accountant_class)
    register_accountant(name, accountant_class, force=force)


def get_noise_multiplier(*, target_epsilon: float, target_delta: float, sample_rate: float,
                         epochs: float | None = None, steps: int | None = None, accountant: str = MECHANISM,
                         epsilon_tolerance: float = 0.01, **kwargs) -> float:
    """Opacus' ``get_noise_multiplier`` signature, answered by certified calibration.

    Returns the noise multiplier sigma whose certified PLD upper bound on
    eps(target_delta) after ``steps`` Poisson-sampled steps at ``sample_rate``
    (or ``ceil(epochs / sample_rate)`` steps: never fewer than Opacus' training
    loop runs) is at most ``target_epsilon``.  ``accountant`` must be ``"pldlib"``
    (or ``"pld"``); Opacus' ``"rdp"``, ``"gdp"`` and ``"prv"`` are not certified
    here.  Other keyword arguments go to :func:`pldlib.calibrate` (``sampling``,
    ``relation``, ``tol``, ...); see :func:`pldlib.get_noise_multiplier`.

    Guarantee: both the calibration's certified upper bound and the one that
    ``OpacusAccountant()`` (default grid) reports for the returned sigma are at most
    ``target_epsilon``: sigma is raised in 0.1% steps until the latter holds, so a
    training run accounted with :class:`OpacusAccountant` never reads above the target.
    """
    from ..calibrate import get_noise_multiplier as gnm

    if accountant not in (MECHANISM, "pld"):
        raise ValueError(f"accountant: {accountant!r} is not certified here; use {MECHANISM!r}")
    if (steps is None) == (epochs is None):
        raise ValueError("steps/epochs: give exactly one of steps or epochs")
    q = V.sampling_rate("sample_rate", sample_rate)
    if steps is None:
        steps = int(math.ceil(V.positive_finite("epochs", epochs) / q))
    sigma = gnm(target_epsilon, target_delta, q, steps=steps, accountant="pld",
                epsilon_tolerance=epsilon_tolerance, **kwargs)
    # the calibration certifies sigma on its own (finer) grid; make the accountant users train with
    # (OpacusAccountant() at its default grid) certify it too, so that its reading never exceeds the
    # target: raise sigma by 0.1% steps while it does (eps falls with sigma; rarely more than 2 steps)
    acc = OpacusAccountant(relation=kwargs.get("relation", "add_remove"),
                           sampling=kwargs.get("sampling", "poisson"))
    for _ in range(100):
        acc.history = [(sigma, q, steps)]
        if acc.get_epsilon(target_delta) <= target_epsilon:
            return sigma
        sigma *= 1.001
    raise RuntimeError(f"get_noise_multiplier: the default accountant does not certify sigma {sigma!r}")
