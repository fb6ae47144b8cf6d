"""Activation recomputation changes no number: every layout trains as the single process does."""

from __future__ import annotations

import pytest

from tests.cases import run_config, train_losses
from tests.test_data_parallel_parity import assert_same_losses

LAYOUTS = [
    {"recompute": "selective"},
    {"recompute": "full"},
    {"dp": 2, "zero": 3, "recompute": "full"},  # FSDP2 gathers the block's weights again to recompute it
    {"dp": 2, "zero": 2, "recompute": "full", "microbatches": 2},
    {"tp": 2, "sp": True, "recompute": "full"},
    {"cp": 2, "recompute": "selective"},  # the recomputed core exchanges heads again
    {"pp": 2, "schedule": "zb-h1", "microbatches": 4, "recompute": "full"},  # recomputed for I, then for W
    {"pp": 2, "schedule": "1f1b", "microbatches": 4, "recompute": "selective"},
]


def world_size(layout: dict) -> int:
    return layout.get("dp", 1) * layout.get("tp", 1) * layout.get("cp", 1) * layout.get("pp", 1)


@pytest.fixture(scope="module")
def single_process(pool):
    return {model: pool.run(train_losses, 1, run_config(model))[0] for model in ("tiny", "tiny-llama")}


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "-".join(f"{k}{v}" for k, v in layout.items()))
def test_recomputed_layout_matches_single_process(pool, single_process, model, layout):
    reference = single_process[model]
    assert reference[-1] < reference[0], "the reference run should learn"
    for losses in pool.run(train_losses, world_size(layout), run_config(model, **layout)):
        assert_same_losses(reference, losses)
