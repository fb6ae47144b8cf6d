"""Every layout's gradient reduction: when the wrappers' hooks reduce, and what is left after backward.

Data-parallel gradients are averaged by the mechanism each ZeRO stage was built on, inside
backward: DDP's bucketed all-reduce (stages 0, 1), ``GradientReduceScatter``'s hooks (stage 2),
FSDP2's reduce-scatter (stage 3). ``gradient_sync`` switches them off for every micro-batch but the
last. What they cannot do is finished here, once per step, after backward
(``finish_gradients``), in this order:

1. tensor parallelism: every gradient laid out as its parameter is;
2. ZeRO-2 and ZeRO-3 on a pipeline stage: the stage's gradients reduce-scattered over dp, once,
   after the schedule's last backward (``scatter_after``);
3. tied embeddings over pipeline stages (GPT-2): the first and last stages' copies summed (their
   gradients, or the same rows of them), as in Megatron-LM, so they stay equal;
4. replicas no hook averaged: context-parallel ranks always (each saw its own slice of the
   sequences); data-parallel ranks below ZeRO-2 under tensor parallelism (DDP cannot hold DTensor
   weights) and on every pipeline stage (DDP's per-backward hooks cannot follow a backward split
   into input and weight halves); under hybrid sharding's ZeRO-2, the replica groups (the
   reduce-scatter ran inside each). Under ZeRO-2 these are the rank's gradient rows.

``clip_gradients`` then takes the global norm: over the optimizer's gradients on one stage, summed
over the stages (a tied weight counted once) under pipeline parallelism.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from plait.parallel.compression import average_flat
from plait.parallel.grad_norm import clip_grad_norm, scale_to_norm, total_norm
from plait.parallel.sharded_adamw import ShardedAdamW, gradients_by_parameter, gradients_of
from plait.parallel.tensor import finish_tensor_gradients
from plait.topology import Topology


@dataclass(frozen=True)
class GradientReduction:
    """What this rank's gradients still need after backward, decided once when the model is parallelized.

    ``replica_dims``: mesh dimensions averaged here. ``tied_peer``: the pp rank holding the other
    copy of a tied embedding (None: no copy elsewhere). ``stage_norm``: the norm is summed over the
    pp group. ``scatter_after``: the data-parallel reduce-scatter of a pipeline stage under ZeRO-2
    or 3, which runs here rather than in backward."""

    replica_dims: tuple[str, ...] = ()
    tied_peer: int | None = None
    stage_norm: bool = False
    scatter_after: Callable[[], None] | None = None


def gradient_reduction(topology: Topology, tied_peer: int | None = None,
                       scatter_after: Callable[[], None] | None = None) -> GradientReduction:
    """The reduction left after backward on ``topology``; ``tied_peer`` as the pipeline found it,
    ``scatter_after`` as ZeRO-2 or 3 built it on a pipeline stage."""
    zero, pipelined = topology.layout.zero, topology.size("pp") > 1
    # Below ZeRO-2, no hook averages dp where DDP cannot run: on a pipeline stage, or under tp.
    dp_after = topology.size("dp") > 1 and zero < 2 and (pipelined or topology.size("tp") > 1)
    # ZeRO-2 under hybrid sharding reduce-scatters inside a replica group; the groups average here.
    hybrid_rows = zero == 2 and topology.size("dp_replicate") > 1
    dims = ("dp",) * dp_after + ("dp_replicate",) * hybrid_rows + ("cp",) * (topology.size("cp") > 1)
    return GradientReduction(dims, tied_peer, stage_norm=pipelined, scatter_after=scatter_after)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, optimizer: torch.optim.Optimizer, enabled: bool) -> Iterator[None]:
    """Skip the hooks' gradient reduction unless ``enabled`` (every micro-batch but the last)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(optimizer, ShardedAdamW) and optimizer.gradient_shards is not None:
        optimizer.gradient_shards.sync = enabled
        try:
            yield
        finally:
            optimizer.gradient_shards.sync = True
        if enabled:
            optimizer.gradient_shards.flush()
    elif enabled or not isinstance(model, DistributedDataParallel):
        yield
    else:
        with model.no_sync():
            yield


@torch.no_grad()
def finish_gradients(model: nn.Module, optimizer: torch.optim.Optimizer, topology: Topology,
                     reduction: GradientReduction, laid_out: Callable[[], None] = lambda: None) -> None:
    """After the step's backward (and after the hooks' own reduction, which would overwrite a
    gradient changed while in flight): what the hooks left, in the order the module doc gives.
    ``laid_out`` is called once the gradients are laid out as their parameters, before the rest."""
    finish_tensor_gradients(model)  # laid out as the parameters are, so tied copies match
    laid_out()
    if reduction.scatter_after is not None:
        reduction.scatter_after()
    if reduction.tied_peer is not None:
        _sum_tied_embedding(gradients_by_parameter(optimizer)[model.tok_embeddings.weight], topology, reduction.tied_peer)
    average_gradients(gradients_of(optimizer), topology, reduction.replica_dims)


def _sum_tied_embedding(grad: torch.Tensor, topology: Topology, peer: int) -> None:
    grad = grad.to_local() if isinstance(grad, DTensor) else grad
    group = topology.group("pp")
    other = torch.empty_like(grad)
    send = dist.isend(grad.contiguous(), group=group, group_dst=peer)
    dist.recv(other, group=group, group_src=peer)
    send.wait()
    grad += other


@torch.no_grad()
def average_gradients(gradients: list[torch.Tensor], topology: Topology, dims: tuple[str, ...]) -> None:
    """Average ``gradients`` over the mesh dimensions ``dims``, in one flat all-reduce per
    dimension and dtype, so the collective's latency is paid once rather than per tensor."""
    grads = [grad.to_local() if isinstance(grad, DTensor) else grad for grad in gradients]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for dim in dims:
        for same in by_dtype.values():
            flat = average_flat(torch.cat([g.reshape(-1) for g in same]), topology, dim)  # dp: --grad-compression
            for grad, part in zip(same, flat.split([g.numel() for g in same])):
                grad.copy_(part.view_as(grad))


def clip_gradients(model: nn.Module, optimizer: torch.optim.Optimizer, topology: Topology,
                   reduction: GradientReduction, max_norm: float) -> torch.Tensor:
    """Clip by the global norm of the step's gradients; return the norm before clipping."""
    grads = gradients_by_parameter(optimizer)
    if not reduction.stage_norm:
        return clip_grad_norm(grads.values(), max_norm)
    # The tied embedding's two copies hold the same gradient: the first stage's counts it.
    tied = model.tok_embeddings.weight if reduction.tied_peer == 0 else None
    squares = total_norm([grad for param, grad in grads.items() if param is not tied]).square()
    dist.all_reduce(squares, group=topology.group("pp"))
    norm = squares.sqrt()
    scale_to_norm(list(grads.values()), max_norm, norm)
    return norm
