"""Data parallelism with the ZeRO stages 0–3, over every rank that holds the same weights: the dp
ranks and, under context parallelism, the cp ranks beside them (``dp_cp``; each saw its own slice of
the same sequences), whose gradients are averaged together and over which ZeRO shards, as in
Megatron-LM's distributed optimizer and torchtitan's FSDP2 (``plait.topology``).

- stage 0: replicated parameters; plait's bucketed gradient all-reduce overlapping backward
  (``plait.parallel.data_parallel.gradient_buckets``), or PyTorch DDP where PowerSGD compresses (``uses_ddp``).
- stage 1: the same plus ``ShardedAdamW``: each rank keeps the optimizer state of 1/Nd of every parameter.
- stage 2: ``ShardedAdamW`` with a ``GradientSharding``: replicated parameters, no wrapper; the
  optimizer's hooks reduce-scatter the gradients in buckets, overlapping backward, into fp32 rows:
  every micro-batch's, or on a pipeline stage the schedule's accumulated ones.
- stages 1 and 2 under tensor parallelism: the same, on the rows of each rank's tp shard, as
  Megatron's distributed optimizer.
- stage 3: FSDP2 ``fully_shard`` per block and on the root: parameters gathered block by block,
  just in time, with the next block's all-gather prefetched. Under tensor parallelism FSDP2
  shards each rank's tensor-parallel shard further over dp (torchtitan's 2-D layout).

In bf16, stages 1 and 2 hold bf16 parameters with the fp32 master in the optimizer (the ZeRO
paper's accounting), on pipeline stages too (``hold_weights``), stage 1 bf16 gradients and stage 2
the fp32 rows; stage 0 runs autocast
over fp32 parameters, which are their own master; stage 3 uses FSDP2's mixed precision, whose fp32
shards are the master.

When these reductions run, and what is still averaged after backward: ``plait.parallel.gradients``.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from plait.facts.model_state import holds_bf16_weights
from plait.parallel.data_parallel.compression import compressed_policy
from plait.parallel.data_parallel.gradient_buckets import default_bucket_bytes
from plait.topology import Topology

# Newer torch names DDP's per-forward buffer broadcast ``forward_sync_buffers`` and deprecates the old
# ``broadcast_buffers``; older torch (GPU users may run one) knows only the old name.
NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                  if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                  else {"broadcast_buffers": False})


def apply_data_parallel(model: nn.Module, topology: Topology, precision: str = "fp32") -> nn.Module:
    """Replicate (stages 0, 1) or shard (stages 2, 3) ``model``, already real, over the dp (and cp)
    ranks: ``shard_data_parallel`` then ``replicate_data_parallel``."""
    return replicate_data_parallel(shard_data_parallel(model, topology, precision), topology)


def shard_data_parallel(model: nn.Module, topology: Topology, precision: str = "fp32") -> nn.Module:
    """What decides what a rank keeps, applied on the meta device too: ZeRO 1 and 2's bf16
    parameters, ZeRO-3's FSDP2 shards (over ZeRO's group, 2-D over DTensors already split over tp).
    Stage 2 needs no wrapper: ``ShardedAdamW(gradient_sharding=...)`` reduce-scatters the gradients
    itself."""
    if topology.size(topology.replica_dim) == 1:
        return model
    hold_weights(model, topology, precision)
    if topology.layout.zero == 3:
        return fully_shard_model(model, topology.fsdp_mesh, precision, topology.layout.grad_compression)
    return model


def replicate_data_parallel(model: nn.Module, topology: Topology) -> nn.Module:
    """DDP where PowerSGD compresses the gradients (ZeRO 0 and 1 without tensor parallelism), over real
    parameters (DDP broadcasts them from the first rank as it starts); elsewhere ZeRO 0 and 1 average
    with plait's ``GradientAllReduce`` (``plait.parallel.gradients.data_parallel_buckets``)."""
    if topology.size(topology.replica_dim) == 1 or not uses_ddp(topology):
        return model
    # Gradients as views of DDP's buckets: the rank holds one copy of the gradients, not two. The
    # buckets are plait's size (plait.facts.buckets), so a model under DDP's 25 MiB overlaps too.
    # The model's buffers (RoPE's tables) are constants every rank computes alike: DDP's default
    # broadcast of them before every forward would move them each step for nothing.
    bucket_mb = default_bucket_bytes(list(model.parameters())) / 2**20
    return DistributedDataParallel(model, process_group=topology.group(topology.replica_dim),
                                   gradient_as_bucket_view=True, bucket_cap_mb=bucket_mb, **NO_BUFFER_SYNC)


def uses_ddp(topology: Topology) -> bool:
    """Whether DDP averages the gradients: only for PowerSGD, which exists as DDP's communication hook.
    Everywhere else plait's own buckets do, because DDP falls short on restarts: its first backward
    after a start all-reduces the whole model as one bucket, later ones in buckets rebuilt in the
    order gradients arrived, and over three or more ranks a sum's order follows an element's place
    in its bucket, so a resumed run would not sum as the uninterrupted one did. (Where PowerSGD may
    run, ZeRO 0–1 without tp or pp, is ``plait.facts.validity``'s rule.)"""
    return topology.layout.grad_compression == "powersgd"


def hold_weights(model: nn.Module, topology: Topology, precision: str) -> None:
    """Parameters in bf16 where ZeRO 1 or 2 keeps their fp32 master (plait.facts.model_state.
    holds_bf16_weights): the parameters only (buffers such as RoPE's tables stay fp32, as in every
    other layout); ``ShardedAdamW`` keeps the fp32 master of each rank's rows."""
    if holds_bf16_weights(precision, topology.layout.zero) and topology.size(topology.replica_dim) > 1:
        cast_parameters(model, torch.bfloat16)


@torch.no_grad()
def cast_parameters(model: nn.Module, dtype: torch.dtype) -> None:
    """Every parameter of ``model`` replaced by one of ``dtype`` (assigning ``.data`` would leave a
    tensor-parallel DTensor's local shard in its old dtype); a parameter shared by two modules
    stays shared."""
    cast: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in cast:
                cast[id(param)] = nn.Parameter(param.to(dtype), requires_grad=param.requires_grad)
            setattr(module, name, cast[id(param)])


def fsdp_policy(precision: str, grad_compression: str = "none") -> MixedPrecisionPolicy:
    """FSDP2's mixed precision: bf16 compute over fp32 shards, fp32 gradient reduction unless compressed."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16" \
        else MixedPrecisionPolicy()
    return compressed_policy(policy, grad_compression)


def fully_shard_model(model: nn.Module, mesh: DeviceMesh, precision: str, grad_compression: str = "none",
                      reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2 on every transformer block, then on the root (embeddings, final norm, head); each
    block's parameters freed after its forward (``reshard_after_forward``) and gathered again in
    backward."""
    policy = fsdp_policy(precision, grad_compression)
    blocks = list(model.layers.values())
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # Explicit on the root too: FSDP2's default keeps the root's parameters gathered after forward.
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    for current, following in zip(blocks, blocks[1:]):
        current.set_modules_to_forward_prefetch([following])
        following.set_modules_to_backward_prefetch([current])
    return model


def zero_optimizer_mesh(topology: Topology) -> DeviceMesh | None:
    """The mesh ``ShardedAdamW`` shards over: ZeRO's group for stages 1 and 2, else none (with
    ``topology.tp_dp_mesh`` for tensor-parallel parameters).

    Stage 3 needs none: its parameters are already DTensor shards, and so is Adam's state.
    """
    if topology.layout.zero in (1, 2) and topology.size(topology.replica_dim) > 1:
        return topology.zero_mesh
    return None

