"""ZeRO beyond parity: no gradient traffic while accumulating, mixed-precision memory, clipping by
the norm over every shard, and checkpoints that resume under another stage.
(Bad ZeRO input: tests/test_bad_input.py.)"""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from plait.models.flops import parameter_count
from plait.models.spec import model_spec
from plait.observe.run_files import read_metrics
from plait.train.checkpoint import checkpoint_root
from tests.cases import (
    averages_after_a_backward_that_reaches_no_parameter, collectives_per_microbatch, resumed_weights, run_config,
    train_losses, train_outcome, zero2_gradient_rows, zero2_rows_over_micro_batches,
)
from tests.zero_accounting import held_model_state_bytes, zero_paper_bytes

MICROBATCHES = 4


def is_reduction(name: str) -> bool:
    return "reduce" in name


@pytest.mark.parametrize("stage", [0, 1])
def test_accumulation_reduces_gradients_only_on_the_last_microbatch(pool, stage):
    config = run_config(dp=2, zero=stage, microbatches=MICROBATCHES, steps=1)
    for counts in pool.run(collectives_per_microbatch, 2, config):
        assert len(counts) == MICROBATCHES
        *accumulating, last = counts
        assert sum(n for name, n in last.items() if is_reduction(name)) > 0, last
        for index, issued in enumerate(accumulating):
            assert issued == {}, f"micro-batch {index} issued {issued}"


@pytest.mark.parametrize("stage", [2, 3])
def test_sharded_gradients_are_reduce_scattered_in_every_microbatch(pool, stage):
    """ZeRO-2 and ZeRO-3 keep their gradients sharded: each micro-batch's are reduce-scattered in its
    backward (under ZeRO-3 beside the gathers of its forward and backward), all alike."""
    config = run_config(dp=2, zero=stage, microbatches=MICROBATCHES, steps=1)
    for counts in pool.run(collectives_per_microbatch, 2, config):
        assert len(counts) == MICROBATCHES
        for index, issued in enumerate(counts):
            assert any(is_reduction(name) for name in issued), f"micro-batch {index}: {issued}"
            assert issued == counts[0], f"micro-batch {index}: {issued} against {counts[0]}"


@pytest.mark.parametrize("dp", [2, 4])
def test_zero2_reduces_buckets_during_backward_into_each_ranks_averaged_rows(pool, dp):
    for outcome in pool.run(zero2_gradient_rows, dp, run_config(dp=dp, zero=2), 64 * 1024):
        assert outcome["buckets"] >= 8
        assert outcome["relative_error"] < 1e-5
        assert outcome["gradients_after_first_scatter"] > 0.5, "the first bucket should go out early in backward"


def test_accumulated_gradients_are_reduced_even_when_the_last_backward_reaches_none(pool):
    errors = pool.run(averages_after_a_backward_that_reaches_no_parameter, 2, run_config(dp=2, zero=1))
    assert max(errors) < 1e-6


def test_zero2_sums_each_microbatchs_rows_in_fp32(pool):
    """Over bf16 weights: no whole gradient is left after a micro-batch's backward, and the rows hold
    the average of the micro-batches' gradients summed in fp32 (a bf16 sum would be off by up to
    2^-8 of the largest)."""
    for outcome in pool.run(zero2_rows_over_micro_batches, 2, run_config(dp=2, zero=2, precision="bf16")):
        assert outcome["whole_after"] == [False, False]
        assert outcome["dtypes"] == ["torch.float32"]
        assert outcome["error"] < 1e-6


@pytest.mark.parametrize("dp, stage", [(2, 0), (2, 1), (2, 2), (2, 3), (4, 1), (4, 2)])
def test_bf16_memory_is_the_paper_formula(pool, dp, stage):
    parameters = parameter_count(model_spec("tiny", seq_len=64))
    expected = held_model_state_bytes(stage, parameters, dp, "bf16")
    for outcome in pool.run(train_outcome, dp, run_config(dp=dp, zero=stage, steps=2, precision="bf16")):
        held = outcome["model_state_bytes"]
        for kind, measured in held.items():
            assert measured == pytest.approx(expected[kind], rel=0.01), kind
        fp32_rows = 2 * parameters / dp if stage == 2 else 0  # stage 2's rows in fp32, where the paper counts bf16
        assert sum(held.values()) == pytest.approx(zero_paper_bytes(stage, parameters, dp, "bf16") + fp32_rows, rel=0.01)


@pytest.mark.parametrize("written, resumed_as", [(3, 1), (2, 0)])
def test_checkpoint_of_one_stage_resumes_under_another(pool, tmp_path, written, resumed_as):
    """Both ways between PyTorch's AdamW (stages 0, 3) and plait's ShardedAdamW (stages 1, 2)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = run_config(dp=2, zero=written, steps=4)
    first = dataclasses.replace(first, train=dataclasses.replace(first.train, checkpoint_every=2))
    uninterrupted = pool.run(train_losses, 2, first, str(run_dir))[0]
    shutil.rmtree(checkpoint_root(run_dir) / "step_0000004")
    second = run_config(dp=2, zero=resumed_as, steps=4)
    second = dataclasses.replace(second, train=dataclasses.replace(second.train, resume=True))
    resumed = pool.run(train_losses, 2, second, str(run_dir))[0]
    assert resumed == pytest.approx(uninterrupted[2:], rel=1e-5)


def test_clipping_uses_the_norm_over_every_shard(pool, tmp_path):
    norms = {}
    for dp, stage in ((1, 0), (2, 2), (2, 3)):
        run_dir = tmp_path / f"zero{stage}"
        run_dir.mkdir()
        pool.run(train_losses, dp, run_config(dp=dp, zero=stage, steps=3), str(run_dir))
        norms[stage] = [row["grad_norm"] for row in read_metrics(run_dir)]
    assert norms[0][0] > 1, "the gradient norm should exceed the clipping threshold of 1"
    assert norms[2] == pytest.approx(norms[0], rel=1e-5)  # ZeRO-2: the optimizer's gradient shards
    assert norms[3] == pytest.approx(norms[0], rel=1e-5)  # FSDP2's


def test_bf16_checkpoint_holds_the_fp32_masters_and_any_layout_resumes_from_them(pool, tmp_path):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = run_config(dp=2, zero=2, steps=4, precision="bf16")
    first = dataclasses.replace(first, train=dataclasses.replace(first.train, checkpoint_every=2))
    uninterrupted = pool.run(train_losses, 2, first, str(run_dir))[0]
    shutil.rmtree(checkpoint_root(run_dir) / "step_0000004")
    dcp_to_torch_save(checkpoint_root(run_dir) / "step_0000002", tmp_path / "saved.pt")
    weights = torch.load(tmp_path / "saved.pt", weights_only=True)["model"]
    assert all(value.dtype == torch.float32 for value in weights.values())
    # Masters have drifted off the bf16 grid; bf16 parameters written as fp32 would all sit on it.
    off_grid = [name for name, value in weights.items() if not torch.equal(value, value.bfloat16().float())]
    assert len(off_grid) > len(weights) // 2, off_grid
    # Stage 3's parameters are fp32 shards: they load the masters exactly, not their bf16 rounding.
    stage3 = pool.run(resumed_weights, 2, run_config(dp=2, zero=3, precision="bf16"), str(run_dir))[0]
    assert stage3.keys() == weights.keys()
    assert all(torch.equal(stage3[name], weights[name]) for name in weights)
    second = dataclasses.replace(first, train=dataclasses.replace(first.train, resume=True))
    resumed = pool.run(train_losses, 2, second, str(run_dir))[0]
    assert resumed == pytest.approx(uninterrupted[2:], rel=1e-5)
