"""Tensor, sequence and context parallelism give the single-process losses, step for step (fp32):
alone, with data parallelism, cut into pipeline stages, and with activation recomputation."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from plait.config import DEFAULT_LAYOUT
from plait.facts.recompute import block_recompute
from plait.layout import Layout
from tests.cases import (
    assert_traced_volumes_are_the_facts, block_classes, layout_world_size, run_config, train_losses, train_outcome,
)
from tests.test_data_parallel_parity import assert_same_losses

LAYOUTS = [
    {"tp": 2},
    # tiny-llama: 2 kv-heads over 4 ranks, so each kv-head is replicated on 2 ranks, its gradient summed
    # over tp in each micro-batch's backward
    {"tp": 4, "microbatches": 2},
    {"tp": 2, "sp": True},
    {"cp": 2},
    {"cp": 4},
    {"tp": 2, "cp": 2},
    {"tp": 2, "dp": 2},  # gradients averaged over dp by plait.parallel.gradients (DDP cannot hold DTensors)
    {"tp": 2, "dp": 2, "zero": 3},  # FSDP2 over dp shards the tensor-parallel shards (2-D)
    {"tp": 2, "sp": True, "dp": 2, "zero": 3},
    {"cp": 2, "dp": 2, "zero": 3},
    # Recomputation (on one process: test_recomputation_on_one_process_changes_no_bit)
    {"dp": 2, "zero": 3, "recompute": "full"},  # FSDP2 gathers the block's weights again to recompute it
    {"dp": 2, "zero": 2, "recompute": "full", "microbatches": 2},
    {"tp": 2, "sp": True, "recompute": "full"},
    {"cp": 2, "recompute": "selective"},  # the recomputed core exchanges heads again
    {"pp": 2, "schedule": "zb-h1", "microbatches": 4, "recompute": "full"},  # recomputed for I, then for W
    {"pp": 2, "schedule": "1f1b", "microbatches": 4, "recompute": "selective"},
    # per-operation checkpointing: kept matmul, attention, reduce-scatter and all-to-all results
    {"tp": 2, "sp": True, "dp": 2, "zero": 3, "recompute": "op"},
    {"cp": 2, "recompute": "op"},
    {"cp": 2, "cp_algorithm": "ring", "recompute": "op"},  # the ring reruns whole, K/V sent again
    {"cp": 2, "cp_algorithm": "all-gather", "recompute": "op"},  # the replay gathers K/V again
    # Pipeline stages cut from the tensor- or context-parallel model
    {"pp": 2, "tp": 2, "schedule": "1f1b", "microbatches": 4},
    {"pp": 2, "tp": 2, "sp": True, "schedule": "zb-h1", "microbatches": 4},
    {"pp": 2, "tp": 2, "schedule": "interleaved-1f1b", "virtual_stages": 2, "microbatches": 2},
    {"pp": 2, "tp": 2, "schedule": "interleaved-1f1b", "virtual_stages": 2, "microbatches": 2, "recompute": "op"},
    {"pp": 2, "cp": 2, "schedule": "gpipe", "microbatches": 2},
    {"pp": 2, "tp": 2, "schedule": "1f1b", "microbatches": 2, "recompute": "full"},
    # only the first block of each stage's two recomputes (its collectives rerun, the other's do not)
    {"pp": 2, "tp": 2, "sp": True, "schedule": "1f1b", "microbatches": 2, "recompute": "full", "recompute_layers": 1},
    {"pp": 2, "dp": 2, "zero": 1, "schedule": "zb-h1", "microbatches": 2},  # Megatron's distributed optimizer
    # plait train's default, a 3-D layout (dp2·tp2·pp2)
    {f.name: getattr(DEFAULT_LAYOUT, f.name) for f in fields(Layout) if getattr(DEFAULT_LAYOUT, f.name) != f.default},
]


@pytest.fixture(scope="module")
def single_process(pool):
    """The reference losses of each model family, computed once for this module."""
    return {model: pool.run(train_losses, 1, run_config(model))[0] for model in ("tiny", "tiny-llama")}


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "-".join(f"{k}{v}" for k, v in layout.items()))
def test_layout_matches_single_process(pool, single_process, model, layout):
    reference = single_process[model]
    assert reference[-1] < reference[0], "the reference run should learn"
    config = run_config(model, **layout)
    outcomes = pool.run(train_outcome, layout_world_size(layout), config)
    for outcome in outcomes:
        assert_same_losses(reference, outcome["losses"])
    assert_traced_volumes_are_the_facts(config, outcomes[0]["volumes"])


def test_padded_vocabulary_and_replicated_kv_heads_with_biases_train_as_single_process(pool):
    """Vocabulary 257 over tp = 2 is padded to 272 (the padded logits masked out of the loss), and a
    GPT-2 with one kv-head (biases on wk, wv) replicates it on both ranks, with sp on top."""
    def config(**layout):
        base = run_config("tiny", steps=4, **layout)
        return replace(base, model=replace(base.model, vocab=257, kv_heads=1))

    reference = pool.run(train_losses, 1, config())[0]
    for losses in pool.run(train_losses, 2, config(tp=2, sp=True)):
        assert_same_losses(reference, losses)
    for losses in pool.run(train_losses, 4, config(pp=2, tp=2, schedule="1f1b", microbatches=2)):
        assert_same_losses(reference, losses)  # the mask must reach the logits, not the hidden states


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


def test_checkpoint_of_pipeline_with_tensor_parallel_resumes_under_other_layouts(pool, tmp_path):
    """A pp2·tp2 checkpoint (GPT-2's tied embedding on both stages, vocabulary-sharded) resumes on
    one process, under tp alone and under pp·cp, continuing the uninterrupted run's losses."""
    def config(steps: int, **layout):
        base = run_config("tiny", steps=steps, **layout)
        return replace(base, train=replace(base.train, checkpoint_every=3))

    straight = pool.run(train_losses, 1, config(6))[0]
    saved = str(tmp_path / "saved")
    pool.run(train_losses, 4, config(3, pp=2, tp=2, schedule="1f1b", microbatches=2), saved)
    for layout in ({}, {"tp": 2}, {"pp": 2, "cp": 2, "schedule": "gpipe", "microbatches": 2}):
        resumed_config = config(6, **layout)
        resumed_config = replace(resumed_config, train=replace(resumed_config.train, resume=True, checkpoint_every=0))
        resumed = pool.run(train_losses, layout_world_size(layout), resumed_config, saved)[0]
        assert_same_losses(straight[3:], resumed)


def test_zero3_over_tensor_parallel_shards_each_ranks_state_over_dp(pool):
    """dp2·tp2 with ZeRO-3 holds half of what tp2 alone holds of each kind of model state."""
    from tests.cases import train_outcome

    alone = pool.run(train_outcome, 2, run_config("tiny-llama", steps=2, tp=2))
    sharded = pool.run(train_outcome, 4, run_config("tiny-llama", steps=2, tp=2, dp=2, zero=3))
    for kind in ("parameters", "gradients", "optimizer"):
        whole = max(outcome["model_state_bytes"][kind] for outcome in alone)
        for outcome in sharded:
            assert outcome["model_state_bytes"][kind] == pytest.approx(whole / 2, rel=0.01), kind


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
def test_recomputation_on_one_process_changes_no_bit(pool, single_process, model):
    for mode, blocks in (("selective", None), ("op", None), ("full", None), ("full", 2)):
        config = run_config(model, recompute=mode, recompute_layers=blocks)
        assert pool.run(train_losses, 1, config)[0] == single_process[model], (mode, blocks)


def test_pipeline_stages_recompute_their_blocks(pool):
    """Parity cannot show recomputation happened: the stages' blocks must run under checkpoint."""
    config = run_config("tiny", steps=1, pp=2, schedule="1f1b", microbatches=2, recompute="full")
    for classes in pool.run(block_classes, 2, config):
        assert classes and all(name == "RecomputedBlock" for name in classes), classes


def test_recompute_layers_wraps_the_first_blocks_of_each_chunk(pool):
    """pp2 with two blocks a stage and --recompute-layers 1: the first block of each stage
    recomputes and the second keeps its activations, as plait.facts.recompute says."""
    config = run_config("tiny", steps=1, pp=2, schedule="1f1b", microbatches=2, recompute="full", recompute_layers=1)
    modes = block_recompute(config.model, config.layout)
    expected = [["RecomputedBlock" if mode == "full" else "Block" for mode in modes[rank * 2:rank * 2 + 2]]
                for rank in range(2)]
    assert pool.run(block_classes, 2, config) == expected == [["RecomputedBlock", "Block"]] * 2


def test_zero1_under_pipeline_shards_each_stages_optimizer_state_over_dp(pool):
    """pp2·dp2 with ZeRO-1 holds half the optimizer state of pp2·dp2 without it, and the same
    parameters and gradients."""
    from tests.cases import train_outcome

    layout = {"pp": 2, "dp": 2, "schedule": "1f1b", "microbatches": 2}
    whole = pool.run(train_outcome, 4, run_config("tiny-llama", steps=2, **layout))
    sharded = pool.run(train_outcome, 4, run_config("tiny-llama", steps=2, zero=1, **layout))
    for plain, zero in zip(whole, sharded):
        held, shared = plain["model_state_bytes"], zero["model_state_bytes"]
        assert shared["parameters"] == held["parameters"] and shared["gradients"] == held["gradients"]
        assert shared["optimizer"] == pytest.approx(held["optimizer"] / 2, rel=0.01)
