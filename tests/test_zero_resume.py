"""Checkpoints written under the new compositions (ZeRO-1/2 under tp, ZeRO-3 on pipeline stages,
hybrid sharding) resume under another layout: the optimizer state and the fp32 masters are
DTensors of the whole parameter, so the resumed run's losses are the uninterrupted run's."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from plait.train.checkpoint import checkpoint_root
from tests.cases import layout_world_size, resumed_weights, run_config, train_losses

PAIRS = [
    ("tiny-llama", {"dp": 2, "tp": 2, "zero": 1}, {"dp": 2, "zero": 3}),
    ("tiny", {"dp": 2, "pp": 2, "zero": 3, "schedule": "1f1b", "microbatches": 2}, {"dp": 2, "tp": 2, "zero": 2}),
    ("tiny-llama", {"dp": 4, "dp_replicate": 2, "zero": 3}, {"dp": 2, "cp": 2, "zero": 2}),
]


@pytest.mark.parametrize("model, written, resumed_as", PAIRS,
                         ids=lambda value: "-".join(f"{k}{v}" for k, v in value.items()) if isinstance(value, dict) else value)
def test_a_new_composition_resumes_under_another_layout(pool, tmp_path, model, written, resumed_as):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = run_config(model, steps=4, **written)
    first = dataclasses.replace(first, train=dataclasses.replace(first.train, checkpoint_every=2))
    uninterrupted = pool.run(train_losses, layout_world_size(written), first, str(run_dir))[0]
    shutil.rmtree(checkpoint_root(run_dir) / "step_0000004")
    second = run_config(model, steps=4, **resumed_as)
    second = dataclasses.replace(second, train=dataclasses.replace(second.train, resume=True))
    resumed = pool.run(train_losses, layout_world_size(resumed_as), second, str(run_dir))[0]
    assert resumed == pytest.approx(uninterrupted[2:], rel=1e-5)


def test_bf16_masters_of_tensor_parallel_shards_load_exactly_under_another_layout(pool, tmp_path):
    """ZeRO-2 under tp in bf16 saves the fp32 masters of each tp shard's rows; ZeRO-3 (fp32 shards)
    on two ranks loads them bit for bit, not their bf16 rounding."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = run_config("tiny", steps=2, precision="bf16", dp=2, tp=2, zero=2)
    pool.run(train_losses, 4, dataclasses.replace(first, train=dataclasses.replace(first.train, checkpoint_every=2)),
             str(run_dir))
    dcp_to_torch_save(checkpoint_root(run_dir) / "step_0000002", tmp_path / "saved.pt")
    saved = torch.load(tmp_path / "saved.pt", weights_only=True)["model"]
    off_grid = [name for name, value in saved.items() if not torch.equal(value, value.bfloat16().float())]
    assert len(off_grid) > len(saved) // 2, off_grid  # masters, not bf16 parameters widened
    loaded = pool.run(resumed_weights, 2, run_config("tiny", precision="bf16", dp=2, zero=3), str(run_dir))[0]
    assert loaded.keys() == saved.keys()
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)


@pytest.mark.parametrize("zero", (0, 1, 2, 3))
def test_a_resumed_run_holds_what_a_fresh_run_of_its_layout_holds(pool, tmp_path, zero):
    """Loading a checkpoint allocates no state beyond the layout's own: torch's state-dict helper
    would make the optimizer state with a step over whole zero gradients, which ZeRO-2 never holds."""
    from tests.cases import held_model_state_bytes

    config = run_config("tiny-llama", steps=4, dp=2, zero=zero)
    fresh = pool.run(held_model_state_bytes, 2,
                     dataclasses.replace(config, train=dataclasses.replace(config.train, checkpoint_every=2)),
                     str(tmp_path))
    shutil.rmtree(checkpoint_root(tmp_path) / "step_0000004")
    resumed = pool.run(held_model_state_bytes, 2,
                       dataclasses.replace(config, train=dataclasses.replace(config.train, resume=True)), str(tmp_path))
    assert resumed == fresh
