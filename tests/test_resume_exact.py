"""A stopped run resumed from its checkpoint ends bit for bit where the uninterrupted run ends, at
four ranks, where the order of a sum over the data-parallel ranks can change its rounding: every
loss after the resume and every tensor of the next checkpoint (weights and optimizer state) equal.

DDP's first backward after a start all-reduces the whole model as one bucket and later ones in
rebuilt buckets, so over four ranks the resumed run's first step summed otherwise than the
uninterrupted run's and drifted from it (plait.parallel.data_parallel.data.uses_ddp)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from plait.train.checkpoint import checkpoint_root
from tests.cases import layout_world_size, run_config, train_losses

LAYOUTS = [
    {"dp": 4},
    {"dp": 4, "zero": 1},
    {"dp": 4, "zero": 2},
    {"dp": 4, "zero": 3},
    {"dp": 2, "tp": 2, "zero": 1},
    {"dp": 2, "pp": 2, "zero": 1, "schedule": "1f1b", "microbatches": 2},
]


def saved_tensors(checkpoint, into) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint (model and optimizer), flattened to dotted names."""
    dcp_to_torch_save(checkpoint, into)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}", inner)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    walk("", torch.load(into, weights_only=True))
    return flat


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "-".join(f"{k}{v}" for k, v in layout.items()))
def test_a_resumed_run_ends_bit_exact_with_the_uninterrupted_run(pool, tmp_path, layout):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = run_config("tiny-llama", steps=4, global_batch=16, **layout)
    first = dataclasses.replace(first, train=dataclasses.replace(first.train, checkpoint_every=2))
    uninterrupted = pool.run(train_losses, layout_world_size(layout), first, str(run_dir))[0]
    expected = saved_tensors(checkpoint_root(run_dir) / "step_0000004", tmp_path / "uninterrupted.pt")
    shutil.rmtree(checkpoint_root(run_dir) / "step_0000004")
    resumed_config = dataclasses.replace(first, train=dataclasses.replace(first.train, resume=True))
    resumed = pool.run(train_losses, layout_world_size(layout), resumed_config, str(run_dir))[0]
    assert resumed == uninterrupted[2:]
    saved = saved_tensors(checkpoint_root(run_dir) / "step_0000004", tmp_path / "resumed.pt")
    assert saved.keys() == expected.keys()
    differing = [name for name in expected if not torch.equal(saved[name], expected[name])]
    assert not differing, differing
