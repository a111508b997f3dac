"""pldlib behind Opacus' accountant contract (pldlib/interop/opacus.py).

Two modes, reported in the test output: with the real Opacus package installed
(CPU torch) the accountant is driven by Opacus itself (PrivacyEngine,
register_accountant, Opacus' own get_noise_multiplier, a tiny training loop);
without it the same contract is checked by code that drives the accountant
the way Opacus does (factory with no arguments, ``history`` assigned directly
before ``get_epsilon``).  The contract tests run in both modes.
"""
from __future__ import annotations

import importlib.util
import inspect
import math
import os
import types

import pytest
from dp_accounting import dp_event as D
from dp_accounting.pld import pld_privacy_accountant as dpa_pld

import pldlib
from pldlib.interop.opacus import MECHANISM, OpacusAccountant, get_noise_multiplier

#: PLDLIB_TEST_NO_OPACUS=1 runs the contract-only mode even where Opacus is installed
HAVE_OPACUS = (importlib.util.find_spec("opacus") is not None and importlib.util.find_spec("torch") is not None
               and not os.environ.get("PLDLIB_TEST_NO_OPACUS"))
needs_opacus = pytest.mark.skipif(not HAVE_OPACUS, reason="opacus/torch not installed: contract-only mode ran")
DELTA = 1e-5


def test_report_mode(capsys):
    with capsys.disabled():
        if HAVE_OPACUS:
            import opacus

            print(f"\n[opacus interop] mode: real Opacus {opacus.__version__} (plus the contract checks)")
        else:
            print("\n[opacus interop] mode: contract-only (Opacus not installed; its driving code is mimicked)")


def _opacus_style_get_noise_multiplier(factory, target_epsilon, target_delta, sample_rate, steps,
                                       epsilon_tolerance=0.01):
    """What opacus.accountants.utils.get_noise_multiplier does with an accountant: a factory
    call with no arguments, then ``history`` assigned directly before each ``get_epsilon``."""
    accountant = factory()
    eps_high, sigma_low, sigma_high = math.inf, 0.0, 10.0
    while eps_high > target_epsilon:
        sigma_high = 2 * sigma_high
        accountant.history = [(sigma_high, sample_rate, steps)]
        eps_high = accountant.get_epsilon(delta=target_delta)
    while target_epsilon - eps_high > epsilon_tolerance:
        sigma = (sigma_low + sigma_high) / 2
        accountant.history = [(sigma, sample_rate, steps)]
        eps = accountant.get_epsilon(delta=target_delta)
        if eps < target_epsilon:
            sigma_high, eps_high = sigma, eps
        else:
            sigma_low = sigma
    return sigma_high


def test_contract_history_len_mechanism_state_and_hook():
    acc = OpacusAccountant()                     # Opacus' factory: no arguments
    assert acc.history == [] and len(acc) == 0 and acc.get_epsilon(DELTA) == 0.0
    for _ in range(3):
        acc.step(noise_multiplier=1.0, sample_rate=0.01)
    acc.step(noise_multiplier=2.0, sample_rate=0.01)
    assert acc.history == [(1.0, 0.01, 3), (2.0, 0.01, 1)] and len(acc) == 2
    assert OpacusAccountant.mechanism() == acc.mechanism() == MECHANISM == "pldlib"
    hook = acc.get_optimizer_hook_fn(sample_rate=0.01)
    hook(types.SimpleNamespace(noise_multiplier=2.0, accumulated_iterations=1))
    assert acc.history[-1] == (2.0, 0.01, 2)
    sd = acc.state_dict()
    assert dict(sd) == {"history": [(1.0, 0.01, 3), (2.0, 0.01, 2)], "mechanism": "pldlib"}
    sd["history"].append((9.0, 0.5, 1))          # a deep copy: the accountant is unaffected
    assert len(acc) == 2
    other = OpacusAccountant()
    other.load_state_dict(acc.state_dict())
    assert other.history == acc.history and other.get_epsilon(DELTA) == acc.get_epsilon(DELTA)
    for bad, words in [({}, "empty"), ({"history": []}, "mechanism"), ({"mechanism": "pldlib"}, "history"),
                       ({"history": [], "mechanism": "rdp"}, "'rdp' accountant's state")]:
        with pytest.raises(ValueError, match=words):
            OpacusAccountant().load_state_dict(bad)
    assert "OpacusAccountant" in repr(acc) and "0x" not in repr(acc)


def test_epsilon_is_computed_from_history_not_from_state_beside_it():
    acc = OpacusAccountant()
    acc.step(noise_multiplier=1.0, sample_rate=0.01)
    e1 = acc.get_epsilon(DELTA)
    acc.history = [(1.0, 0.01, 1000)]            # as Opacus' get_noise_multiplier does
    e2 = acc.get_epsilon(DELTA)
    ref = pldlib.PLDAccountant().compose(pldlib.Sampled(pldlib.GaussianEvent(1.0), 0.01), 1000).epsilon(DELTA)
    assert e2 == ref.upper and e2 > e1
    acc.history = [(0.0, 0.01, 5)]
    assert acc.get_epsilon(DELTA) == math.inf    # zero noise: non-private
    acc.history = [(1.0, 0.0, 5)]
    assert acc.get_epsilon(DELTA) == 0.0         # nothing sampled: nothing released
    acc.history = [(1.0, 1.5, 5)]
    with pytest.raises(ValueError, match=r"history\[0\] sample_rate must be in \[0, 1\], got 1.5"):
        acc.get_epsilon(DELTA)


def test_heterogeneous_history_brackets_dp_accountings_fine_grid():
    acc = OpacusAccountant(spacing=5e-4)
    acc.history = [(1.0, 0.01, 1000), (2.0, 0.05, 500)]
    iv = acc.get_epsilon_interval(DELTA)
    event = D.ComposedDpEvent([D.SelfComposedDpEvent(D.PoissonSampledDpEvent(q, D.GaussianDpEvent(s)), k)
                               for s, q, k in acc.history])
    ref = dpa_pld.PLDAccountant(value_discretization_interval=2e-4).compose(event).get_epsilon(DELTA)
    assert iv.lower <= ref <= iv.upper, (iv, ref)
    assert acc.get_epsilon(DELTA) == iv.upper


def test_opacus_style_calibration_gives_a_certified_sigma():
    sigma = _opacus_style_get_noise_multiplier(OpacusAccountant, 6.0, DELTA, 0.01, 1000)
    acc = OpacusAccountant()
    acc.history = [(sigma, 0.01, 1000)]
    assert acc.get_epsilon(DELTA) <= 6.0
    ours = get_noise_multiplier(target_epsilon=6.0, target_delta=DELTA, sample_rate=0.01, steps=1000)
    acc.history = [(ours, 0.01, 1000)]
    assert acc.get_epsilon(DELTA) <= 6.0
    assert ours <= sigma * 1.001          # the certified calibration is at least as tight as bisection


def test_get_noise_multiplier_has_opacus_signature():
    params = inspect.signature(get_noise_multiplier).parameters
    names = ["target_epsilon", "target_delta", "sample_rate", "epochs", "steps", "accountant",
             "epsilon_tolerance", "kwargs"]
    assert list(params) == names
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in names[:-1])
    if HAVE_OPACUS:
        from opacus.accountants.utils import get_noise_multiplier as theirs

        assert list(inspect.signature(theirs).parameters) == names
    with pytest.raises(TypeError):
        get_noise_multiplier(6.0, 1e-5, 0.01, steps=100)   # keyword-only, as Opacus
    with pytest.raises(ValueError, match="accountant: 'rdp' is not certified"):
        get_noise_multiplier(target_epsilon=6.0, target_delta=1e-5, sample_rate=0.01, steps=100, accountant="rdp")
    with pytest.raises(ValueError, match="exactly one of steps or epochs"):
        get_noise_multiplier(target_epsilon=6.0, target_delta=1e-5, sample_rate=0.01)


def test_readme_recipe_get_noise_multiplier():
    from pldlib.interop.opacus import get_noise_multiplier

    sigma = get_noise_multiplier(target_epsilon=8.0, target_delta=1e-5, sample_rate=0.01, epochs=10)
    acc = OpacusAccountant()
    acc.history = [(sigma, 0.01, 1000)]
    assert acc.get_epsilon(1e-5) <= 8.0 and 0.5 < sigma < 1.5


def test_constructor_arguments_are_checked():
    with pytest.raises(ValueError, match="method: 'clt' certifies no upper bound"):
        OpacusAccountant(method="clt")
    with pytest.raises(ValueError, match="sampling"):
        OpacusAccountant(sampling="bogus")
    wor = OpacusAccountant(sampling="wor")
    wor.history = [(1.0, 0.01, 100)]
    poi = OpacusAccountant()
    poi.history = [(1.0, 0.01, 100)]
    assert wor.get_epsilon(DELTA) > poi.get_epsilon(DELTA)   # fixed-size batches: sensitivity 2 (MATH.md 2)


# ---------------------------------------------------------------- the real Opacus package
@pytest.fixture(scope="module")
def opacus_env():
    import torch
    from opacus import PrivacyEngine
    from opacus.accountants import create_accountant

    from pldlib.interop.opacus import register

    register()
    return types.SimpleNamespace(torch=torch, PrivacyEngine=PrivacyEngine, create_accountant=create_accountant)


def _tiny_training(env, engine, epochs=1, **private_kwargs):
    torch = env.torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    if "target_epsilon" in private_kwargs:
        model, opt, loader = engine.make_private_with_epsilon(module=model, optimizer=opt, data_loader=loader,
                                                              max_grad_norm=1.0, epochs=epochs, **private_kwargs)
    else:
        model, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                                 max_grad_norm=1.0, **private_kwargs)
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    return opt


@needs_opacus
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_real_opacus_accountant_swap(opacus_env):
    # README recipe: swap the accountant of a PrivacyEngine
    engine = opacus_env.PrivacyEngine()
    engine.accountant = OpacusAccountant()
    _tiny_training(opacus_env, engine, noise_multiplier=1.0)
    hist = engine.accountant.history
    assert len(hist) == 1 and hist[0][0] == 1.0 and hist[0][1] == pytest.approx(1 / 8) and hist[0][2] == 8
    eps = engine.get_epsilon(DELTA)
    ref = pldlib.PLDAccountant().compose(pldlib.Sampled(pldlib.GaussianEvent(1.0), 1 / 8), 8).epsilon(DELTA)
    assert eps == ref.upper
    rdp = opacus_env.create_accountant("rdp")
    rdp.history = list(hist)
    assert ref.lower <= rdp.get_epsilon(DELTA)         # Opacus' RDP is an upper bound: never below ours
    sd = engine.accountant.state_dict()
    fresh = opacus_env.create_accountant("pldlib")     # registered by name; built with no arguments
    assert isinstance(fresh, OpacusAccountant)
    fresh.load_state_dict(sd)
    assert fresh.get_epsilon(DELTA) == eps


@needs_opacus
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_real_opacus_by_name_and_make_private_with_epsilon(opacus_env):
    engine = opacus_env.PrivacyEngine(accountant="pldlib")
    assert isinstance(engine.accountant, OpacusAccountant)
    opt = _tiny_training(opacus_env, engine, epochs=2, target_epsilon=3.0, target_delta=DELTA)
    # Opacus' own get_noise_multiplier drove our accountant through `history`
    assert engine.get_epsilon(DELTA) <= 3.0
    assert opt.noise_multiplier > 0


@needs_opacus
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_real_opacus_get_noise_multiplier_with_our_accountant(opacus_env):
    from opacus.accountants.utils import get_noise_multiplier as theirs

    sigma = theirs(target_epsilon=6.0, target_delta=DELTA, sample_rate=0.01, steps=1000, accountant="pldlib")
    acc = OpacusAccountant()
    acc.history = [(sigma, 0.01, 1000)]
    assert acc.get_epsilon(DELTA) <= 6.0
    ours = get_noise_multiplier(target_epsilon=6.0, target_delta=DELTA, sample_rate=0.01, steps=1000)
    assert ours <= sigma * 1.001
