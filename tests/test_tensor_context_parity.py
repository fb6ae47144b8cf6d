"""Tensor, sequence and context parallelism give the single-process losses, step for step (fp32)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.cases import run_config, train_losses
from tests.test_data_parallel_parity import assert_same_losses

LAYOUTS = [
    {"tp": 2},
    {"tp": 4},  # tiny-llama: 2 kv-heads over 4 ranks, so each kv-head is replicated on 2 ranks
    {"tp": 2, "sp": True},
    {"cp": 2},
    {"cp": 4},
    {"tp": 2, "cp": 2},
    {"tp": 2, "dp": 2},  # gradients averaged over dp by plait.parallel.replicas (DDP cannot hold DTensors)
]


def world_size(layout: dict) -> int:
    return layout.get("tp", 1) * layout.get("cp", 1) * layout.get("dp", 1)


@pytest.fixture(scope="module")
def single_process(pool):
    """The reference losses of each model family, computed once for this module."""
    return {model: pool.run(train_losses, 1, run_config(model))[0] for model in ("tiny", "tiny-llama")}


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "-".join(f"{k}{v}" for k, v in layout.items()))
def test_layout_matches_single_process(pool, single_process, model, layout):
    reference = single_process[model]
    assert reference[-1] < reference[0], "the reference run should learn"
    for losses in pool.run(train_losses, world_size(layout), run_config(model, **layout)):
        assert_same_losses(reference, losses)


def test_padded_vocabulary_and_replicated_kv_heads_with_biases_train_as_single_process(pool):
    """Vocabulary 257 over tp = 2 is padded to 258 (the padded logit masked out of the loss), and a
    GPT-2 with one kv-head (biases on wk, wv) replicates it on both ranks, with sp on top."""
    def config(**layout):
        base = run_config("tiny", steps=4, **layout)
        return replace(base, model=replace(base.model, vocab=257, kv_heads=1))

    reference = pool.run(train_losses, 1, config())[0]
    for losses in pool.run(train_losses, 2, config(tp=2, sp=True)):
        assert_same_losses(reference, losses)


def test_checkpoint_of_one_layout_resumes_under_tensor_and_context_parallel(pool, tmp_path):
    """A checkpoint saved by a single rank loads into tp and cp models and training continues exactly."""
    straight = pool.run(train_losses, 1, run_config("tiny-llama", steps=4))[0]
    saved_dir = str(tmp_path / "saved")
    first_half = run_config("tiny-llama", steps=2)
    pool.run(train_losses, 1, replace(first_half, train=replace(first_half.train, checkpoint_every=2)), saved_dir)
    for layout in ({"tp": 2}, {"cp": 2}):
        config = run_config("tiny-llama", steps=4, **layout)
        resumed = pool.run(train_losses, 2, replace(config, train=replace(config.train, resume=True)), saved_dir)
        assert_same_losses(straight[2:], resumed[0])
