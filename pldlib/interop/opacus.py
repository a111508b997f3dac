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

The loader you run is the loader accounted: :func:`describe_loader` reads a data
loader (by class names and attributes only; torch is never imported) and says how
it samples -- Opacus' ``DPDataLoader`` is Poisson, a ``DataLoader(shuffle=True)``
draws shuffled fixed-size batches, a plain ``DataLoader`` a fixed order (no
sampling) -- and :meth:`OpacusAccountant.attach_loader` makes the accountant
account that scheme (gradient accumulation over k Poisson micro-batches included:
user-level Poisson pair with ``group=k``, docs/MATH.md 13.1).  Where the accountant
sees that it is accounting something else (:meth:`OpacusAccountant.check_loader`,
or ``optim.accumulated_iterations > 1`` in the optimizer hook while it was not
told), it emits one :class:`LoaderMismatchWarning` per accountant.
"""
from __future__ import annotations

import math
import numbers
import warnings
from collections import Counter, OrderedDict
from copy import deepcopy
from dataclasses import dataclass

from .. import _validate as V
from .. import events as E
from ..methods import make_accountant, method_info, method_names
from ..methods.base import Interval

__all__ = ["OpacusAccountant", "get_noise_multiplier", "register", "MECHANISM", "describe_loader", "LoaderScheme",
           "LoaderMismatchWarning"]

#: the name Opacus knows this accountant by (``mechanism()``, ``register``)
MECHANISM = "pldlib"


class LoaderMismatchWarning(UserWarning):
    """The data loader (or the gradient accumulation) that runs is not what the accountant
    accounts; emitted at most once per :class:`OpacusAccountant`."""


#: Opacus' Poisson batch samplers (``opacus.utils.uniform_sampler``), recognised by class name
POISSON_SAMPLERS = ("UniformWithReplacementSampler", "DistributedUniformWithReplacementSampler")

_ADVICE = ("pass Opacus' DPDataLoader (make_private(..., poisson_sampling=True)), a DataLoader with "
           "shuffle=True (RandomSampler) or a sequential DataLoader (SequentialSampler); or skip the loader "
           "and state the sampling yourself: OpacusAccountant(sampling=...)")


@dataclass(frozen=True)
class LoaderScheme:
    """How a data loader samples, as :func:`describe_loader` reads it.

    Attributes
    ----------
    sampling : ``"poisson"`` (Opacus' DPDataLoader), ``"shuffle"`` (a shuffled epoch cut into
        fixed-size batches: ``DataLoader(shuffle=True)``) or ``"none"`` (a fixed order: every record
        in exactly one batch per epoch, no amplification)
    sample_rate : the rate of one (micro-)batch: Poisson's q; else batch_size / dataset_size
    batch_size : the fixed batch size (``"shuffle"``, ``"none"``) or the expected one (q times the
        dataset size, ``"poisson"``)
    dataset_size : the number of records the loader draws from
    group : ``accumulation_steps`` for Poisson (a record's count in an accumulated batch is
        Binomial(k, q): pldlib's user-level pair with ``group=k``), else 1
    steps_per_epoch : optimizer steps (history steps) per epoch: the loader's batches per epoch
        divided by ``accumulation_steps``, rounded up
    note : one line saying what the loader does (used in warnings)
    accumulation_steps : micro-batches per optimizer step
    """

    sampling: str
    sample_rate: float
    batch_size: float
    dataset_size: int
    group: int
    steps_per_epoch: int
    note: str
    accumulation_steps: int = 1

    @property
    def accounting(self) -> str:
        """What the scheme is accounted as, in words (for messages)."""
        if self.sampling == "poisson":
            if self.accumulation_steps > 1:
                return (f"Poisson sampling at rate {self.sample_rate:g} with {self.accumulation_steps} "
                        f"micro-batches per step (group={self.accumulation_steps})")
            return "Poisson sampling"
        if self.sampling == "shuffle":
            return "shuffled fixed-size batches"
        return "no sampling (a fixed order)"


def _accumulation(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (micro-batches per optimizer step), got {V.fmt(value)}")
    return int(value)


def _cls(obj) -> str:
    return type(obj).__name__


def _dataset_size(data_loader, where: str) -> int:
    ds = getattr(data_loader, "dataset", None)
    try:
        n = len(ds)
    except TypeError:
        raise ValueError(f"data_loader: its dataset ({_cls(ds)}) has no len(); {where} needs the number of "
                         f"records (an IterableDataset is not supported: {_ADVICE})") from None
    if n < 1:
        raise ValueError("data_loader: its dataset is empty")
    return int(n)


def describe_loader(data_loader, *, accumulation_steps: int = 1) -> LoaderScheme:
    """How ``data_loader`` samples its batches (a :class:`LoaderScheme`), read from class names and
    attributes only (neither torch nor Opacus is imported):

    * ``batch_sampler`` an Opacus ``UniformWithReplacementSampler`` or
      ``DistributedUniformWithReplacementSampler`` (``sample_rate``, ``num_samples`` or ``total_size``,
      ``steps`` or ``num_batches``): Poisson sampling at ``sample_rate``;
    * ``batch_sampler`` a torch ``BatchSampler`` (``sampler``, ``batch_size``, ``drop_last``), or no
      batch sampler (``batch_size=None``: batches of one record), over ``sampler``:

      - ``RandomSampler`` without replacement over the whole dataset: ``"shuffle"``;
      - ``SequentialSampler``: ``"none"`` (a fixed order: no amplification).

    ``accumulation_steps`` (an integer >= 1) is the number of micro-batches whose gradients are summed
    before each optimizer step.  Anything else is refused with a ValueError naming the class and what to
    pass instead."""
    k = _accumulation("accumulation_steps", accumulation_steps)
    if not (hasattr(data_loader, "batch_sampler") or hasattr(data_loader, "sampler")):
        raise ValueError(f"data_loader: a torch DataLoader (with batch_sampler / sampler attributes) or Opacus' "
                         f"DPDataLoader, got {_cls(data_loader)}")
    bs = getattr(data_loader, "batch_sampler", None)
    if bs is not None and _cls(bs) in POISSON_SAMPLERS:
        q = getattr(bs, "sample_rate", None)
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not (0.0 < float(q) <= 1.0):
            raise ValueError(f"data_loader: its {_cls(bs)} has sample_rate {V.fmt(q)}; a rate in (0, 1] is needed")
        q = float(q)
        n = getattr(bs, "total_size", None) if _cls(bs).startswith("Distributed") else getattr(bs, "num_samples", None)
        if n is None:
            n = _dataset_size(data_loader, "Poisson sampling")
        n = V.int_at_least("data_loader's dataset size", n, 1)
        batches = getattr(bs, "steps", None)
        if batches is None:
            batches = getattr(bs, "num_batches", None)
        if batches is None:
            batches = int(1 / q)
        batches = V.int_at_least("data_loader's steps per epoch", batches, 1)
        note = f"Poisson batches ({_cls(bs)}, rate {q:g} of {n:,} records)"
        if k > 1:
            note += f", {k} micro-batches per optimizer step"
        return LoaderScheme("poisson", q, q * n, n, k, -(-batches // k), note, k)
    if bs is not None and _cls(bs) != "BatchSampler":
        raise ValueError(f"data_loader: its batch_sampler is a {_cls(bs)}, which pldlib does not recognise; {_ADVICE}")
    if bs is not None:
        sampler, b = getattr(bs, "sampler", None), getattr(bs, "batch_size", None)
        drop_last = getattr(bs, "drop_last", False)
    else:
        sampler, b, drop_last = getattr(data_loader, "sampler", None), getattr(data_loader, "batch_size", None), False
        b = 1 if b is None else b   # no batch sampler: torch yields one record at a time
    if isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1:
        raise ValueError(f"data_loader: its batch_size must be an integer >= 1, got {V.fmt(b)}")
    b = int(b)
    name = _cls(sampler)
    if name not in ("RandomSampler", "SequentialSampler"):
        raise ValueError(f"data_loader: its sampler is a {name}, which pldlib does not recognise; {_ADVICE}")
    n = _dataset_size(data_loader, "a fixed-size batch loader")
    if name == "RandomSampler":
        if getattr(sampler, "replacement", False):
            raise ValueError("data_loader: its RandomSampler draws with replacement (replacement=True), which is "
                             f"neither shuffling nor Poisson sampling; {_ADVICE}")
        drawn = getattr(sampler, "num_samples", n)
        if drawn != n:
            raise ValueError(f"data_loader: its RandomSampler draws {V.fmt(drawn)} of {n} records per epoch "
                             f"(num_samples), not a shuffled whole epoch; {_ADVICE}")
    if b > n:
        raise ValueError(f"data_loader: batch_size {b} exceeds the dataset's {n} records")
    batches = n // b if drop_last else -(-n // b)
    if batches < 1:
        raise ValueError(f"data_loader: drop_last=True with batch_size {b} > {n} records yields no batch")
    steps = -(-batches // k)
    acc = f", {k} micro-batches per optimizer step" if k > 1 else ""
    if name == "RandomSampler":
        note = f"shuffled fixed-size batches ({name}, batch {b} of {n:,}{acc})"
        return LoaderScheme("shuffle", b / n, b, n, 1, steps, note, k)
    note = f"fixed-order batches ({name}, batch {b} of {n:,}{acc}): no sampling"
    return LoaderScheme("none", b / n, b, n, 1, steps, note, k)


class OpacusAccountant:
    """Opacus accountant backed by a certified pldlib method (see the module docstring).

    Parameters
    ----------
    method : pldlib method with a certified upper bound (``"pld"``, ``"prv"``, ``"spa"``, ``"rdp"``)
    relation : neighbouring relation (default ``"add_remove"``, as Opacus assumes)
    sampling : how batches are drawn: ``"poisson"`` (Opacus' DPDataLoader; the default) or another
        pldlib scheme, e.g. ``"wor"`` (fixed-size batches: pldlib's certified without-replacement pairs)
        or ``"shuffle"`` (then ``history``'s sample rate must be 1/t, t batches per epoch, and its steps
        whole epochs).  An attached loader (:meth:`attach_loader`) is accounted as it samples instead;
        leave ``sampling`` unset then (an explicit, different ``sampling`` is refused)
    accumulation_steps : micro-batches (Poisson batches at rate q) whose gradients are summed before each
        optimizer step (an integer >= 1; Poisson sampling only).  Opacus records such a step at rate
        ``q * accumulation_steps``; with ``accumulation_steps = k`` each ``history`` entry of rate r is
        accounted as *one* step of pldlib's user-level Poisson pair with ``group=k`` at rate ``r / k``
        (a record's count in the accumulated batch is Binomial(k, q), docs/MATH.md 13.1): the steps are
        not counted twice.  Where the micro-batch rate q is known (the hook's ``sample_rate``, an attached
        loader), an entry of rate ``j q`` with j < k (a shorter accumulation) is accounted with
        ``group=j``.  Opacus' own reading, Poisson at rate ``k q``, is not a certified bound for k > 1
    **options : the method's options (e.g. ``spacing=`` for ``pld``)
    """

    def __init__(self, method: str = "pld", relation: str = "add_remove", sampling: str | None = None,
                 accumulation_steps: int = 1, **options):
        from ..sampling import scheme_names

        V.choice("method", method, method_names())
        if method_info(method).kind not in ("certified", "upper"):
            raise ValueError(f"method: {method!r} certifies no upper bound; use one of "
                             f"{', '.join(method_names(('certified', 'upper')))}")
        self._method = method
        self._relation = V.choice("relation", relation, V.RELATIONS)
        self._sampling_explicit = sampling is not None
        self._sampling = V.choice("sampling", "poisson" if sampling is None else sampling, scheme_names())
        self._accumulation = _accumulation("accumulation_steps", accumulation_steps)
        if self._accumulation > 1 and self._sampling != "poisson":
            raise ValueError(f"accumulation_steps: {self._accumulation} micro-batches per step are accounted for "
                             f"Poisson sampling; with sampling={self._sampling!r} attach the loader instead: "
                             f"attach_loader(loader, accumulation_steps={self._accumulation})")
        self._options = dict(options)
        make_accountant(method, relation, **options)  # validates the options now
        self.history: list = []
        self._scheme: LoaderScheme | None = None
        self._hook_rate: float | None = None
        self._warned = False
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
        """The callback Opacus attaches to its DPOptimizer: one :meth:`step` per optimizer step.

        The step is recorded as Opacus records it, at rate ``sample_rate * optim.accumulated_iterations``
        (history stays Opacus' own); ``sample_rate`` is remembered as the micro-batch rate, and the
        accounting maps such entries back to it (``accumulation_steps``, :class:`OpacusAccountant`).
        Accumulation the accountant was not told of (``accumulated_iterations`` above its
        ``accumulation_steps``) emits a :class:`LoaderMismatchWarning` (once per accountant)."""
        self._hook_rate = float(sample_rate)

        def hook_fn(optim):
            j = optim.accumulated_iterations
            k = self.accumulation_steps
            if j > k:
                poisson = (self._scheme.sampling if self._scheme is not None else self._sampling) == "poisson"
                why = (f" (Opacus' rate {j} x q is not a certified bound: a record's count is Binomial({j}, q))"
                       if poisson else "")
                fix = f"OpacusAccountant(accumulation_steps={j}) or " if poisson and self._scheme is None else ""
                self._warn(f"pldlib: the optimizer summed {j} micro-batches per step (gradient accumulation) but "
                           f"this accountant assumes {k}{why}; use {fix}attach_loader(loader, accumulation_steps={j})")
            self.step(noise_multiplier=optim.noise_multiplier, sample_rate=sample_rate * j)

        return hook_fn

    # -- the loader --------------------------------------------------------------------------
    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step the accountant accounts (the attached loader's, if any)."""
        return self._scheme.accumulation_steps if self._scheme is not None else self._accumulation

    @property
    def loader_scheme(self) -> LoaderScheme | None:
        """The attached loader's :class:`LoaderScheme` (None: none attached)."""
        return self._scheme

    def attach_loader(self, data_loader, *, accumulation_steps: int | None = None) -> LoaderScheme:
        """Account ``history`` as ``data_loader`` samples (:func:`describe_loader`), from now on, and
        return its :class:`LoaderScheme`.  ``accumulation_steps``: micro-batches per optimizer step
        (default: the accountant's).

        * Poisson: each entry at the micro-batch rate q with ``group=k`` (k = ``accumulation_steps``;
          Opacus' recorded rate ``q k`` is mapped back to q, see :class:`OpacusAccountant`);
        * shuffle and fixed order: ``history``'s steps are cut into epochs of ``steps_per_epoch``
          steps from the first one (its sample rates, Opacus' 1/len(loader), are not used).  Each epoch
          puts a record in at most one optimizer step, so the upper bound composes one unsampled
          Gaussian step per epoch (at the epoch's smallest noise multiplier; a started epoch counts
          whole).  The lower end: for a fixed order, the same at the epoch's largest noise multiplier;
          for shuffling, pldlib's ``"shuffle"`` lower bound over the whole epochs when the epoch is
          exactly ``dataset_size / batch_size`` batches and ``accumulation_steps`` divides it (else 0).
          With gradient accumulation the optimizer must step at the end of each epoch (an
          accumulation that straddles two epochs can hold a record twice).

        Refused (ValueError) when the accountant was built with an explicit ``sampling`` that the
        loader contradicts."""
        k = self._accumulation if accumulation_steps is None else _accumulation("accumulation_steps",
                                                                                accumulation_steps)
        scheme = describe_loader(data_loader, accumulation_steps=k)
        if self._sampling_explicit and scheme.sampling != self._sampling:
            raise ValueError(f"data_loader: draws {scheme.note} but this accountant was built with "
                             f"sampling={self._sampling!r}; build it without sampling= to account the loader")
        self._scheme = scheme
        self._cache_key = self._cache_acc = None
        return scheme

    def check_loader(self, data_loader, *, accumulation_steps: int | None = None) -> LoaderScheme:
        """Compare ``data_loader`` (and ``accumulation_steps``, default: the accountant's) with what this
        accountant accounts, without changing the accounting: on a mismatch emit a
        :class:`LoaderMismatchWarning` (at most once per accountant) naming the right setting.
        Returns the loader's :class:`LoaderScheme`."""
        k = self.accumulation_steps if accumulation_steps is None else _accumulation("accumulation_steps",
                                                                                       accumulation_steps)
        scheme = describe_loader(data_loader, accumulation_steps=k)
        ours = self._scheme
        if ours is not None:
            if (ours.sampling, ours.accumulation_steps) != (scheme.sampling, scheme.accumulation_steps):
                self._warn(f"pldlib: the data loader draws {scheme.note} but this accountant accounts the "
                           f"attached loader's {ours.note}; use attach_loader(loader"
                           f"{f', accumulation_steps={k}' if k > 1 else ''})")
            return scheme
        names = {"poisson": "Poisson sampling", "wor": "fixed-size batches drawn without replacement",
                 "shuffle": "shuffled fixed-size batches", "random_allocation": "random allocation"}
        assumed = names.get(self._sampling, f"sampling {self._sampling!r}")
        if scheme.sampling != self._sampling:
            if scheme.sampling == "poisson":
                fix = (f"OpacusAccountant(accumulation_steps={k})" if k > 1 else "OpacusAccountant()")
            elif scheme.sampling == "shuffle" and k == 1:
                fix = 'OpacusAccountant(sampling="shuffle")'
            else:
                fix = None
            att = f"attach_loader(loader{f', accumulation_steps={k}' if k > 1 else ''})"
            self._warn(f"pldlib: the data loader draws {scheme.note} but this accountant assumes {assumed}; "
                       f"use {f'{fix} or ' if fix else ''}{att}")
        elif scheme.accumulation_steps != self._accumulation:
            fix = f"OpacusAccountant(accumulation_steps={k}) or " if scheme.sampling == "poisson" else ""
            self._warn(f"pldlib: the data loader draws {scheme.note} but this accountant assumes "
                       f"{self._accumulation} micro-batch{'es' if self._accumulation > 1 else ''} per step; use "
                       f"{fix}attach_loader(loader, accumulation_steps={k})")
        return scheme

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, LoaderMismatchWarning, stacklevel=3)

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
            top = float(self.accumulation_steps)   # Opacus records q * accumulated_iterations
            if not (0.0 <= q <= top):
                raise ValueError(f"history[{i}] sample_rate must be in [0, {V.fmt(top if top > 1 else 1)}], "
                                 f"got {V.fmt(q)}")
            k = V.steps(f"history[{i}] steps", k)
            hist.append((s, q, k))
        scheme = self._scheme
        key = (tuple(hist), spacing, scheme, self._accumulation, self._hook_rate)
        if key == self._cache_key:
            return self._cache_acc
        opts = dict(self._options)
        if spacing is not None:
            opts["spacing"] = spacing

        def new():
            return make_accountant(self._method, self._relation, **opts)

        if scheme is not None and scheme.sampling != "poisson":
            out = self._epoch_accountant(hist, scheme, new)
        else:
            acc = new()
            non_private, any_step = False, False
            for s, q, k in hist:
                if q == 0.0:
                    continue
                if s == 0.0:
                    non_private = True
                    continue
                acc.compose(self._poisson_step(E.GaussianEvent(s), q), k)
                any_step = True
            out = (acc if any_step else None, non_private)
        self._cache_key, self._cache_acc = key, out
        return out

    def _poisson_step(self, ev, r):
        """One step of history rate r: as before without accumulation; with accumulation_steps k > 1,
        the user-level Poisson step (group=j at the micro-batch rate q, r = j q; else group=k at r / k)."""
        k = self.accumulation_steps
        sampling = "poisson" if self._scheme is not None else self._sampling
        if k == 1:
            return E.Sampled(ev, r, sampling) if r < 1.0 else ev
        micro = self._scheme.sample_rate if self._scheme is not None else self._hook_rate
        q, g = r / k, k
        if micro is not None and micro > 0:
            j = r / micro
            if abs(j - round(j)) <= 1e-9 * max(1.0, j) and 1 <= round(j) <= k:
                q, g = micro, int(round(j))
        q = min(q, 1.0)
        if q >= 1.0:   # every record in every micro-batch: g copies of the record, unsampled
            return E.GaussianEvent(ev.sigma, sensitivity=float(g))
        return E.Sampled(ev, q, "poisson", group=g) if g > 1 else E.Sampled(ev, q, "poisson")

    def _epoch_accountant(self, hist, scheme: LoaderScheme, new):
        """(bounds or None, non_private) for a shuffle / fixed-order loader: history's steps cut into
        epochs of ``scheme.steps_per_epoch`` (see :meth:`attach_loader`)."""
        t = scheme.steps_per_epoch
        up, lo_whole, lo_all = Counter(), Counter(), Counter()
        pos, cur = 0, None

        def close(c, whole):
            up[c[0]] += 1
            lo_all[c[1]] += 1
            if whole:
                lo_whole[c[1]] += 1

        for s, q, k in hist:
            if q == 0.0:
                continue
            if s == 0.0:
                return None, True
            if pos:
                take = min(k, t - pos)
                cur = (min(cur[0], s), max(cur[1], s))
                pos += take
                k -= take
                if pos == t:
                    close(cur, True)
                    pos, cur = 0, None
                if not k:
                    continue
            whole, rem = divmod(k, t)
            if whole:
                up[s] += whole
                lo_whole[s] += whole
                lo_all[s] += whole
            if rem:
                pos, cur = rem, (s, s)
        if pos:
            close(cur, False)
        if not up:
            return None, False
        acc_up = new()
        for s, n in up.items():
            acc_up.compose(E.GaussianEvent(s), n)
        if scheme.sampling == "none":
            if lo_all == up:
                return acc_up, False
            acc_lo = new()
            for s, n in lo_all.items():
                acc_lo.compose(E.GaussianEvent(s), n)
            return _Bounds(acc_up, acc_lo), False
        # shuffle: pldlib's lower bound where an epoch is exactly t' = n / (b k) whole optimizer batches
        b, n_rec, ka = int(scheme.batch_size), scheme.dataset_size, scheme.accumulation_steps
        batches = n_rec // b
        regular = n_rec == batches * b and batches % ka == 0 and batches // ka == t and t >= 2
        if not regular or not lo_whole:
            return _Bounds(acc_up, None), False
        acc_lo = new()
        for s, n in lo_whole.items():
            acc_lo.compose(E.Sampled(E.GaussianEvent(s), 1.0 / t, "shuffle"), n * t)
        if lo_whole == up:   # whole epochs, one noise each: pldlib's shuffle answer as it stands
            return acc_lo, False
        return _Bounds(acc_up, acc_lo), False

    def __repr__(self) -> str:
        opts = "".join(f", {k}={E._fmt(v)}" for k, v in self._options.items())
        steps = sum(int(h[2]) for h in self.history) if self.history else 0
        acc = f", accumulation_steps={self.accumulation_steps}" if self.accumulation_steps > 1 else ""
        loader = f", loader={self._scheme.sampling!r}" if self._scheme is not None else ""
        return (f"<OpacusAccountant mechanism={MECHANISM!r} method={self._method!r} relation={self._relation!r} "
                f"sampling={self._sampling!r}{acc}{opts}{loader}: {len(self.history)} history entries, {steps} steps>")


class _Bounds:
    """Upper end of one accountant, lower end of another (0 without one): both certified."""

    def __init__(self, upper, lower):
        self.upper, self.lower = upper, lower

    def epsilon(self, delta):
        u = self.upper.epsilon(delta)
        if u.kind != "certified":
            return u
        lo = 0.0 if self.lower is None else self.lower.epsilon(delta).lower
        return Interval(lo, u.upper)


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
