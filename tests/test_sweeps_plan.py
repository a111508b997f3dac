"""sweeps plan: blocks cover the grid exactly once and are exactly the zarr chunks (no Dask)."""
import numpy as np
import pytest

from sweeps.config import parse_config
from sweeps.plan import BLOCK_DIMS, DIMS, make_plan
from sweeps.testing import small_config


@pytest.fixture
def plan():
    d = small_config("results/x.zarr")
    d["grid"].update(sigma=[0.5, 1.0, 2.0], q=[0.01, 0.1, 1.0], sampling=["poisson", "wor"],
                     relation=["add", "add_remove"], steps=[1, 10, 100, 1000], delta=[1e-5, 1e-7, 1e-9])
    return make_plan(parse_config(d))


def test_blocks_cover_grid_exactly_once(plan):
    shape = tuple(plan.shape[d] for d in DIMS)
    count = np.zeros(shape, dtype=int)
    for b in plan.blocks:
        reg = plan.region(b)
        count[tuple(reg[d] for d in DIMS)] += 1
    assert (count == 1).all()
    assert len(plan.blocks) == 3 * 3 * 2 * 2 * 1
    assert plan.n_cells == count.size
    assert sorted(b.number for b in plan.blocks) == list(range(len(plan.blocks)))
    assert len({b.index for b in plan.blocks}) == len(plan.blocks)


def test_blocks_are_chunks(plan):
    chunks = plan.chunks
    assert chunks == {"sigma": 1, "q": 1, "steps": 4, "delta": 3, "sampling": 1, "relation": 1, "method": 1}
    for b in plan.blocks:
        for d, sl in plan.region(b).items():
            assert sl.start % chunks[d] == 0
            assert sl.stop - sl.start == chunks[d]  # exactly one chunk along every dim
        breg = plan.region(b, BLOCK_DIMS)
        assert set(breg) == set(BLOCK_DIMS) and all(s.stop - s.start == 1 for s in breg.values())


def test_block_params_and_spec(plan):
    for b in plan.blocks:
        for d, i in zip(BLOCK_DIMS, b.index):
            assert b.params[d] == plan.coords[d][i]
        spec = plan.spec(b)
        assert spec["steps"] == [1, 10, 100, 1000] and spec["deltas"] == [1e-5, 1e-7, 1e-9]
        assert spec["options"] == plan.config.options["pld"]
        assert spec["params"]["mechanism"] == "gaussian"
    # heaviest (smallest sigma) first
    sig = [b.params["sigma"] for b in plan.blocks]
    assert sig == sorted(sig)
