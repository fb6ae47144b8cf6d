"""Data parallelism over the mesh's ``dp`` dimension, with the ZeRO stages 0–3.

- stage 0: PyTorch DDP, replicated parameters; bucketed gradient all-reduce overlapping backward.
- stage 1: DDP plus ``ShardedAdamW``: each rank keeps Adam's moments for 1/Nd of every parameter.
- stage 2: FSDP2 ``fully_shard`` with ``reshard_after_forward=False``: gradients reduce-scattered,
  parameters gathered once per forward and kept gathered through the backward pass.
- stage 3: FSDP2 ``fully_shard`` per block and on the root with ``reshard_after_forward=True``:
  parameters gathered block by block, just in time, with the next block's all-gather prefetched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from plait.topology import Topology


def apply_data_parallel(model: nn.Module, topology: Topology, precision: str = "fp32") -> nn.Module:
    """Replicate (stages 0, 1) or shard (stages 2, 3) ``model`` over the dp group."""
    if topology.size("dp") == 1 or topology.size("tp") > 1:
        # DDP cannot hold tensor-parallel (DTensor) weights: plait.parallel.replicas averages them.
        return model
    stage = topology.layout.zero
    if stage <= 1:
        # Gradients as views of DDP's buckets: the rank holds one copy of the gradients, not two.
        return DistributedDataParallel(model, process_group=topology.group("dp"), gradient_as_bucket_view=True)
    return fully_shard_model(model, topology.mesh["dp"], reshard_after_forward=stage == 3, precision=precision)


def fully_shard_model(model: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool, precision: str) -> nn.Module:
    """FSDP2 on every transformer block, then on the root (embeddings, final norm, head)."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16" \
        else MixedPrecisionPolicy()
    blocks = list(model.layers.values())
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    if reshard_after_forward:
        for current, following in zip(blocks, blocks[1:]):
            current.set_modules_to_forward_prefetch([following])
            following.set_modules_to_backward_prefetch([current])
    return model


def optimizer_shard_mesh(topology: Topology) -> DeviceMesh | None:
    """The mesh the optimizer itself shards its state over: the dp mesh for stage 1, else none.

    Stages 2 and 3 need none: their parameters are already DTensor shards, and so is Adam's state.
    """
    if topology.layout.zero == 1 and topology.size("dp") > 1:
        return topology.mesh["dp"]
    return None


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient reduction unless ``enabled`` (every micro-batch but the last)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif enabled or not isinstance(model, DistributedDataParallel):
        yield
    else:
        with model.no_sync():
            yield
