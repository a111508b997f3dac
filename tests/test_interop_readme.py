"""The three recipes of the guide's drop-in page (docs/dropins.md, section "The recipes"),
executed as written (the code is read from the page, not copied here); the Opacus recipe is
run with a small PyTorch model, which tests/test_docs.py does not have."""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

import pldlib

PAGE = Path(__file__).resolve().parent.parent / "docs" / "dropins.md"
HAVE_OPACUS = (importlib.util.find_spec("opacus") is not None and importlib.util.find_spec("torch") is not None
               and not os.environ.get("PLDLIB_TEST_NO_OPACUS"))


def _recipes() -> list[str]:
    text = PAGE.read_text()
    start = text.index("## The recipes")
    section = text[start:text.index("\n## ", start + 5)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 3
    return blocks


def test_recipes_are_at_most_five_lines():
    for b in _recipes():
        assert len(b.strip().splitlines()) <= 5, b


def test_dp_accounting_recipe():
    ns: dict = {}
    exec(_recipes()[0], ns)
    # the certified upper end: never below pldlib's certified lower bound, and equal to the
    # PLD accountant's upper bound for the same event
    ref = pldlib.PLDAccountant().compose(pldlib.Sampled(pldlib.GaussianEvent(1.0), 0.01), 10_000).epsilon(1e-5)
    assert ns["eps"] == ref.upper and ns["acc"].epsilon_interval(1e-5) == ref


@pytest.mark.skipif(not HAVE_OPACUS, reason="opacus/torch not installed: the recipe's contract is checked in "
                                            "test_interop_opacus.py (contract-only mode)")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_opacus_recipe():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    ns = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
          "data_loader": torch.utils.data.DataLoader(
              torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randn(40, 1)), batch_size=10)}
    exec(_recipes()[1], ns)
    for x, y in ns["data_loader"]:
        ns["optimizer"].zero_grad()
        ((ns["model"](x) - y) ** 2).mean().backward()
        ns["optimizer"].step()
    engine = ns["engine"]
    assert engine.accountant.history == [(1.0, 0.25, 4)]
    ref = pldlib.PLDAccountant().compose(pldlib.Sampled(pldlib.GaussianEvent(1.0), 0.25), 4).epsilon(1e-5)
    assert engine.get_epsilon(1e-5) == ref.upper


def test_get_noise_multiplier_recipe():
    ns: dict = {}
    exec(_recipes()[2], ns)
    from pldlib.interop.opacus import OpacusAccountant

    acc = OpacusAccountant()
    acc.history = [(ns["sigma"], 0.01, 1000)]       # epochs 10 at sample rate 0.01: 1,000 steps
    assert acc.get_epsilon(1e-5) <= 8.0
    acc.history = [(ns["sigma"] / 1.02, 0.01, 1000)]
    assert acc.get_epsilon_interval(1e-5).lower > 8.0   # 2% less noise certifiably misses: near-optimal
