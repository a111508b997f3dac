"""The loader you run is the loader accounted (pldlib/interop/opacus.py: describe_loader,
OpacusAccountant.attach_loader / check_loader, LoaderMismatchWarning).

Neither torch nor Opacus is installed here, so the loaders are small fake classes that carry
the real ones' class names and the attributes pldlib reads:

* ``UniformWithReplacementSampler`` (opacus.utils.uniform_sampler): ``num_samples``,
  ``sample_rate``, ``steps``;
* ``DistributedUniformWithReplacementSampler`` (same module): ``total_size``, ``sample_rate``,
  ``num_samples`` (this replica's share), ``num_batches`` (older releases) or ``steps``;
* ``RandomSampler`` / ``SequentialSampler`` (torch.utils.data.sampler): ``data_source``, and
  ``replacement`` and ``num_samples`` for RandomSampler;
* ``BatchSampler`` (torch.utils.data.sampler): ``sampler``, ``batch_size``, ``drop_last``;
* ``DataLoader`` (torch.utils.data.dataloader): ``dataset``, ``batch_size``, ``drop_last``,
  ``sampler``, ``batch_sampler`` -- as torch sets them: ``DataLoader(ds, batch_size=b,
  shuffle=True)`` has a RandomSampler wrapped in a BatchSampler; Opacus' ``DPDataLoader`` is
  built with ``batch_sampler=UniformWithReplacementSampler(...)``, so its ``batch_size`` is None
  and its ``sampler`` torch's default SequentialSampler.
"""
from __future__ import annotations

import math
import types
import warnings

import mpmath as mp
import pytest

import pldlib
from pldlib import events as E
from pldlib.interop.opacus import LoaderMismatchWarning, LoaderScheme, OpacusAccountant, describe_loader

DELTA = 1e-5


# ---------------------------------------------------------------- fakes named as the real classes
class RandomSampler:
    def __init__(self, data_source, replacement=False, num_samples=None):
        self.data_source, self.replacement, self._num_samples = data_source, replacement, num_samples

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples


class SequentialSampler:
    def __init__(self, data_source):
        self.data_source = data_source


class BatchSampler:
    def __init__(self, sampler, batch_size, drop_last):
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last


class UniformWithReplacementSampler:
    def __init__(self, *, num_samples, sample_rate, steps=None):
        self.num_samples, self.sample_rate = num_samples, sample_rate
        self.steps = int(1 / sample_rate) if steps is None else steps


class DistributedUniformWithReplacementSampler:
    def __init__(self, *, total_size, sample_rate, num_replicas=2, rank=0):
        self.total_size, self.sample_rate = total_size, sample_rate
        self.num_samples = total_size // num_replicas + (rank < total_size % num_replicas)
        self.num_batches = int(1 / sample_rate)


class DataLoader:
    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None, drop_last=False):
        self.dataset = dataset
        if batch_sampler is not None:
            batch_size, drop_last = None, False
        if sampler is None:
            sampler = RandomSampler(dataset) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size, self.drop_last = batch_size, drop_last
        self.sampler, self.batch_sampler = sampler, batch_sampler


class DPDataLoader(DataLoader):
    def __init__(self, dataset, sample_rate):
        super().__init__(dataset, batch_sampler=UniformWithReplacementSampler(num_samples=len(dataset),
                                                                              sample_rate=sample_rate))


def data(n):
    return list(range(n))


def mismatch_warnings(record):
    return [w for w in record if issubclass(w.category, LoaderMismatchWarning)]


# ---------------------------------------------------------------- describe_loader
def test_poisson_loader_is_recognised():
    s = describe_loader(DPDataLoader(data(50_000), 0.01))
    assert isinstance(s, LoaderScheme)
    assert (s.sampling, s.sample_rate, s.dataset_size, s.group, s.steps_per_epoch) == ("poisson", 0.01, 50_000, 1, 100)
    assert s.batch_size == pytest.approx(500)
    assert "UniformWithReplacementSampler" in s.note and "50,000" in s.note
    with pytest.raises(Exception):
        s.sampling = "shuffle"                      # frozen
    acc = describe_loader(DPDataLoader(data(50_000), 0.01), accumulation_steps=4)
    assert (acc.sampling, acc.sample_rate, acc.group, acc.steps_per_epoch, acc.accumulation_steps) == \
        ("poisson", 0.01, 4, 25, 4)
    dist = DataLoader(data(1000), batch_sampler=DistributedUniformWithReplacementSampler(total_size=1000,
                                                                                        sample_rate=0.05))
    d = describe_loader(dist)
    assert (d.sampling, d.sample_rate, d.dataset_size, d.steps_per_epoch) == ("poisson", 0.05, 1000, 20)


def test_shuffle_and_sequential_loaders_are_recognised():
    s = describe_loader(DataLoader(data(50_000), batch_size=64, shuffle=True))
    assert (s.sampling, s.batch_size, s.dataset_size, s.group, s.steps_per_epoch) == ("shuffle", 64, 50_000, 1, 782)
    assert s.sample_rate == 64 / 50_000 and "RandomSampler, batch 64 of 50,000" in s.note
    s = describe_loader(DataLoader(data(50_000), batch_size=64, shuffle=True, drop_last=True))
    assert s.steps_per_epoch == 781
    s = describe_loader(DataLoader(data(1000), batch_size=10, shuffle=True), accumulation_steps=4)
    assert (s.sampling, s.group, s.steps_per_epoch, s.accumulation_steps) == ("shuffle", 1, 25, 4)
    q = describe_loader(DataLoader(data(100), batch_size=10))
    assert (q.sampling, q.steps_per_epoch, q.batch_size) == ("none", 10, 10) and "no sampling" in q.note
    # a user's BatchSampler over a RandomSampler, and torch's batch_size=None (one record per step)
    bs = BatchSampler(RandomSampler(data(90)), 9, False)
    assert describe_loader(DataLoader(data(90), batch_sampler=bs)).steps_per_epoch == 10
    one = describe_loader(DataLoader(data(20), batch_size=None, shuffle=True))
    assert (one.sampling, one.batch_size, one.steps_per_epoch) == ("shuffle", 1, 20)
    # a plain namespace with the same attributes is read the same way
    ns = types.SimpleNamespace(dataset=data(100), batch_size=10, drop_last=False,
                               sampler=SequentialSampler(data(100)), batch_sampler=None)
    assert describe_loader(ns).sampling == "none"


def test_unrecognised_loaders_and_bad_arguments_are_refused_clearly():
    class WeightedRandomSampler:
        pass

    class CustomBatches:
        pass

    cases = [
        (DataLoader(data(10), batch_size=2, sampler=WeightedRandomSampler()),
         r"data_loader: its sampler is a WeightedRandomSampler, which pldlib does not recognise; pass Opacus' "
         r"DPDataLoader .*OpacusAccountant\(sampling=\.\.\.\)"),
        (DataLoader(data(10), batch_sampler=CustomBatches()), r"its batch_sampler is a CustomBatches"),
        (DataLoader(data(10), batch_size=2, sampler=RandomSampler(data(10), replacement=True)),
         r"RandomSampler draws with replacement"),
        (DataLoader(data(10), batch_size=2, sampler=RandomSampler(data(10), num_samples=5)), r"draws 5 of 10"),
        (DataLoader(data(10), batch_size=20, shuffle=True), r"batch_size 20 exceeds the dataset's 10"),
        (DataLoader(data(10), batch_size=0, shuffle=True), r"batch_size must be an integer >= 1, got 0"),
        (object(), r"data_loader: a torch DataLoader .* got object"),
        (DataLoader(iter(range(3)), batch_size=2, shuffle=True), r"has no len\(\)"),
        (DataLoader(data(10), batch_sampler=UniformWithReplacementSampler(num_samples=10, sample_rate=1.5)),
         r"sample_rate 1.5"),
    ]
    for loader, words in cases:
        with pytest.raises(ValueError, match=words):
            describe_loader(loader)
    for bad in (0, -1, 2.5, True, "2"):
        with pytest.raises(ValueError, match=r"accumulation_steps must be an integer >= 1"):
            describe_loader(DPDataLoader(data(10), 0.5), accumulation_steps=bad)
    with pytest.raises(ValueError, match=r"accumulation_steps must be an integer >= 1"):
        OpacusAccountant(accumulation_steps=0)
    with pytest.raises(ValueError, match=r"accumulation_steps: 2 .* attach_loader"):
        OpacusAccountant(sampling="shuffle", accumulation_steps=2)
    with pytest.raises(ValueError, match=r"built with sampling='poisson'"):
        OpacusAccountant(sampling="poisson").attach_loader(DataLoader(data(100), batch_size=10, shuffle=True))


# ---------------------------------------------------------------- warnings
def test_a_shuffling_loader_checked_against_a_poisson_accountant_warns_once():
    acc = OpacusAccountant()
    loader = DataLoader(data(50_000), batch_size=64, shuffle=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        acc.check_loader(loader)
        acc.check_loader(loader)
        acc.check_loader(DataLoader(data(100), batch_size=10))
        acc.get_optimizer_hook_fn(0.01)(types.SimpleNamespace(noise_multiplier=1.0, accumulated_iterations=3))
    got = mismatch_warnings(rec)
    assert len(got) == 1 and issubclass(LoaderMismatchWarning, UserWarning)
    msg = str(got[0].message)
    assert msg == ('pldlib: the data loader draws shuffled fixed-size batches (RandomSampler, batch 64 of 50,000) '
                   'but this accountant assumes Poisson sampling; use OpacusAccountant(sampling="shuffle") or '
                   'attach_loader(loader)')
    assert "\n" not in msg
    # a second accountant warns again (once per accountant), here for a fixed-order loader
    with pytest.warns(LoaderMismatchWarning, match=r"fixed-order batches \(SequentialSampler, batch 10 of 100\): "
                                                   r"no sampling but this accountant assumes Poisson sampling; "
                                                   r"use attach_loader\(loader\)$"):
        OpacusAccountant().check_loader(DataLoader(data(100), batch_size=10))


def test_no_warning_when_the_accountant_matches_the_loader():
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoaderMismatchWarning)
        OpacusAccountant().check_loader(DPDataLoader(data(1000), 0.01))
        OpacusAccountant(sampling="shuffle").check_loader(DataLoader(data(1000), batch_size=10, shuffle=True))
        OpacusAccountant(accumulation_steps=4).check_loader(DPDataLoader(data(1000), 0.01), accumulation_steps=4)
        acc = OpacusAccountant()
        acc.attach_loader(DataLoader(data(1000), batch_size=10, shuffle=True))
        acc.check_loader(DataLoader(data(1000), batch_size=10, shuffle=True))
        hook = acc.get_optimizer_hook_fn(0.01)
        hook(types.SimpleNamespace(noise_multiplier=1.0, accumulated_iterations=1))
        told = OpacusAccountant(accumulation_steps=4)
        hook = told.get_optimizer_hook_fn(0.01)
        for j in (4, 4, 2):                    # a shorter last accumulation is no mismatch
            hook(types.SimpleNamespace(noise_multiplier=1.0, accumulated_iterations=j))


def test_untold_accumulation_warns_once_from_the_hook_and_keeps_opacus_reading():
    acc = OpacusAccountant()
    hook = acc.get_optimizer_hook_fn(sample_rate=0.01)
    with pytest.warns(LoaderMismatchWarning) as rec:
        for _ in range(5):
            hook(types.SimpleNamespace(noise_multiplier=1.0, accumulated_iterations=4))
    got = mismatch_warnings(rec)
    assert len(got) == 1
    assert str(got[0].message) == (
        "pldlib: the optimizer summed 4 micro-batches per step (gradient accumulation) but this accountant "
        "assumes 1 (Opacus' rate 4 x q is not a certified bound: a record's count is Binomial(4, q)); use "
        "OpacusAccountant(accumulation_steps=4) or attach_loader(loader, accumulation_steps=4)")
    assert acc.history == [(1.0, 0.04, 5)]      # recorded as Opacus records it; accounted as before
    ref = pldlib.PLDAccountant().compose(E.Sampled(E.GaussianEvent(1.0), 0.04), 5).epsilon(DELTA)
    assert acc.get_epsilon_interval(DELTA) == ref
    with pytest.warns(LoaderMismatchWarning, match=r"assumes 1 micro-batch per step; use "
                                                   r"OpacusAccountant\(accumulation_steps=2\) or"):
        OpacusAccountant().check_loader(DPDataLoader(data(100), 0.1), accumulation_steps=2)


# ---------------------------------------------------------------- accounting under the scheme
def test_accumulation_is_accounted_as_group_k_at_the_micro_rate():
    s, q, k, n = 1.0, 0.01, 4, 200
    ref = pldlib.PLDAccountant().compose(E.Sampled(E.GaussianEvent(s), q, "poisson", group=k), n).epsilon(DELTA)
    told = OpacusAccountant(accumulation_steps=k)
    hook = told.get_optimizer_hook_fn(sample_rate=q)
    for _ in range(n):
        hook(types.SimpleNamespace(noise_multiplier=s, accumulated_iterations=k))
    assert told.history == [(s, q * k, n)]           # Opacus' history, not counted twice
    assert told.get_epsilon_interval(DELTA) == ref
    # the same through an attached DPDataLoader, and with history assigned directly (rate q k -> q)
    att = OpacusAccountant()
    scheme = att.attach_loader(DPDataLoader(data(10_000), q), accumulation_steps=k)
    assert (scheme.group, att.accumulation_steps) == (k, k)
    att.history = [(s, q * k, n)]
    assert att.get_epsilon_interval(DELTA) == ref
    bare = OpacusAccountant(accumulation_steps=k)
    bare.history = [(s, q * k, n)]
    assert bare.get_epsilon_interval(DELTA) == ref
    # a shorter accumulation (j = 2 micro-batches) at a known micro rate: group=2
    att.history = [(s, q * 2, n)]
    short = pldlib.PLDAccountant().compose(E.Sampled(E.GaussianEvent(s), q, "poisson", group=2), n).epsilon(DELTA)
    assert att.get_epsilon_interval(DELTA) == short
    # what is true of Opacus' reading here: Poisson at rate k q lies below the certified group=k answer
    opacus_reading = pldlib.PLDAccountant().compose(E.Sampled(E.GaussianEvent(s), k * q), n).epsilon(DELTA)
    assert opacus_reading.upper < ref.lower


def _group2_truth(s, q, eps):
    """delta(eps) of one step, a record's count Bin(2, q): P = sum_j Bin(2,q)(j) N(j, s^2), Q = N(0, s^2);
    max of remove H(P||Q) and add H(Q||P) (add_remove), by mpmath quadrature at 30 digits over the
    half-lines where the integrand is positive (the likelihood ratio is increasing in x)."""
    mp.mp.dps = 30
    s, q, eps = mp.mpf(s), mp.mpf(q), mp.mpf(eps)
    w = [(1 - q) ** 2, 2 * q * (1 - q), q ** 2]

    def dens(x, m):
        return mp.exp(-(x - m) ** 2 / (2 * s ** 2)) / (s * mp.sqrt(2 * mp.pi))

    def p(x):
        return sum(wj * dens(x, j) for j, wj in enumerate(w))

    def ratio(x):
        return mp.log(p(x)) - mp.log(dens(x, 0))

    def root(level):   # ratio is increasing: bisection on a bracket
        lo, hi = mp.mpf(-60), mp.mpf(60)
        for _ in range(130):                    # 120 / 2^130: below 1e-36
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ratio(mid) < level else (lo, mid)
        return (lo + hi) / 2

    e = mp.exp(eps)
    x_rem = root(eps)
    rem = mp.quad(lambda x: p(x) - e * dens(x, 0), [x_rem, x_rem + 5 * s, x_rem + 40 * s, mp.inf])
    if 2 * mp.log(1 - q) >= -eps:   # the ratio never falls to e^-eps: H(Q||P) = 0
        add = mp.mpf(0)
    else:
        x_add = root(-eps)
        add = mp.quad(lambda x: dens(x, 0) - e * p(x), [-mp.inf, x_add - 40 * s, x_add - 5 * s, x_add])
    # the closed form (normal tails) agrees with the quadrature
    cf = sum(wj * mp.ncdf((j - x_rem) / s) for j, wj in enumerate(w)) - e * mp.ncdf(-x_rem / s)
    assert abs(cf - rem) < mp.mpf(10) ** -20 * max(rem, mp.mpf(10) ** -30)
    return float(max(rem, add))


def test_group_k_one_step_brackets_an_mpmath_truth():
    s, q = 0.9, 0.2
    for eps in (0.25, 1.0):
        truth = _group2_truth(s, q, eps)
        iv = pldlib.PLDAccountant().compose(E.Sampled(E.GaussianEvent(s), q, "poisson", group=2)).delta(eps)
        assert iv.lower <= truth <= iv.upper, (eps, iv, truth)
        assert iv.upper - iv.lower < 1e-3 * truth
    # and through the Opacus accountant (one optimizer step of 2 micro-batches at rate q)
    acc = OpacusAccountant(accumulation_steps=2)
    acc.history = [(s, 2 * q, 1)]
    iv = acc.get_epsilon_interval(1e-3)
    lo_delta, up_delta = _group2_truth(s, q, iv.lower), _group2_truth(s, q, iv.upper)
    assert up_delta <= 1e-3 <= lo_delta        # eps(1e-3) of the truth lies in [lower, upper]


def test_shuffle_loader_is_accounted_per_epoch():
    s = 1.0
    loader = DataLoader(data(100), batch_size=10, shuffle=True)       # t = 10 batches per epoch
    acc = OpacusAccountant()
    assert acc.attach_loader(loader).steps_per_epoch == 10
    acc.history = [(s, 0.1, 30)]                                      # Opacus' rate 1/len(loader)
    ref = pldlib.PLDAccountant().compose(E.Sampled(E.GaussianEvent(s), 0.1, "shuffle"), 30).epsilon(DELTA)
    iv = acc.get_epsilon_interval(DELTA)
    assert iv == ref
    gauss3 = pldlib.PLDAccountant().compose(E.GaussianEvent(s), 3).epsilon(DELTA)
    assert iv.upper == pytest.approx(gauss3.upper, rel=1e-9)          # no amplification: one Gaussian per epoch
    # a started epoch counts whole on the upper side; the lower side keeps the whole epochs only
    acc.history = [(s, 0.1, 25)]
    iv = acc.get_epsilon_interval(DELTA)
    two = pldlib.PLDAccountant().compose(E.Sampled(E.GaussianEvent(s), 0.1, "shuffle"), 20).epsilon(DELTA)
    assert iv.upper == pytest.approx(gauss3.upper, rel=1e-9) and iv.lower == two.lower
    # a noise change inside an epoch: the smaller noise on the upper side
    acc.history = [(2.0, 0.1, 15), (s, 0.1, 5)]
    mixed = pldlib.PLDAccountant().compose(E.GaussianEvent(2.0), 1).compose(E.GaussianEvent(s), 1).epsilon(DELTA)
    assert acc.get_epsilon_interval(DELTA).upper == pytest.approx(mixed.upper, rel=1e-9)
    # epochs that are not whole batches (50,000 / 64): the unamplified upper bound, a trivial lower end
    big = OpacusAccountant()
    big.attach_loader(DataLoader(data(50_000), batch_size=64, shuffle=True))
    big.history = [(s, 1 / 782, 782 * 2)]
    iv = big.get_epsilon_interval(DELTA)
    assert iv.upper == pytest.approx(pldlib.PLDAccountant().compose(E.GaussianEvent(s), 2).epsilon(DELTA).upper,
                                     rel=1e-9) and iv.lower == 0.0
    # the Poisson reading of the same history is far below: the mismatch the warning is about
    poisson = OpacusAccountant()
    poisson.history = [(s, 1 / 782, 782 * 2)]
    assert poisson.get_epsilon(DELTA) < iv.upper / 5


def test_sequential_loader_is_one_unsampled_step_per_epoch():
    acc = OpacusAccountant()
    acc.attach_loader(DataLoader(data(100), batch_size=10))
    acc.history = [(1.5, 0.1, 40)]
    ref = pldlib.PLDAccountant().compose(E.GaussianEvent(1.5), 4).epsilon(DELTA)
    assert acc.get_epsilon_interval(DELTA) == ref
    acc.history = [(1.5, 0.1, 10), (0.0, 0.1, 1)]
    assert acc.get_epsilon(DELTA) == math.inf
    acc.history = []
    assert acc.get_epsilon(DELTA) == 0.0
    # shuffled with accumulation over 2 micro-batches: 5 optimizer steps per epoch, pldlib's shuffle at t = 5
    sh = OpacusAccountant()
    assert sh.attach_loader(DataLoader(data(100), batch_size=10, shuffle=True),
                            accumulation_steps=2).steps_per_epoch == 5
    sh.history = [(1.0, 0.2, 10)]
    ref = pldlib.PLDAccountant().compose(E.Sampled(E.GaussianEvent(1.0), 0.2, "shuffle"), 10).epsilon(DELTA)
    assert sh.get_epsilon_interval(DELTA) == ref
    assert "loader='shuffle'" in repr(sh) and "accumulation_steps=2" in repr(sh)
