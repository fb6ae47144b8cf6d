"""Every layout's gradient reduction: which hooks reduce in backward, and what is left after it.

Data-parallel gradients are averaged inside backward over every rank holding the same weights: the
dp ranks and the cp ranks beside them (``Topology.replica_dim``; each cp rank saw its own slice of
the sequences), bucket by bucket as backward produces them, by the mechanism each layout was built
on: ``GradientAllReduce`` (ZeRO 0, 1; DDP's all-reduce under PowerSGD, ``plait.parallel.data_parallel.data.uses_ddp``),
``GradientReduceScatter`` (ZeRO-2), FSDP2's reduce-scatter (ZeRO-3), the last two over ZeRO's
group (``Topology.zero_dim``); the buckets' size is ``plait.facts.buckets``' rule.
``gradient_sync`` switches them off for every micro-batch but the last, but for the
reduce-scatters (FSDP2's, ZeRO-2's), which run every micro-batch's. A pipeline stage runs one
backward per (chunk, micro-batch), split into input and weight halves under zero-bubble
schedules, which DDP's per-backward hooks cannot follow: there plait's buckets reduce each chunk's
gradients from its last backward action on, overlapping the rest of the schedule
(``plait.parallel.data_parallel.gradient_buckets``), and ZeRO-3's FSDP2 reduce-scatters once after the schedule
(``plait.parallel.data_parallel.stage_sharding``). What is left is finished here, once per step, after backward
(``finish_gradients``), in this order:

1. tensor parallelism: every gradient laid out as its parameter is;
2. a pipeline stage's dp·cp reduction: waiting for its chunks' buckets, or ZeRO-3's reduce-scatter
   (``scatter_after``);
3. tied embeddings over pipeline stages (GPT-2): the first and last stages' copies summed (their
   gradients, or the same rows of them), as in Megatron-LM, so they stay equal;
4. under hybrid sharding's ZeRO-2, the replica groups' gradient rows averaged (the reduce-scatter
   ran inside each).

``gradient_norm`` then takes the global norm (over the optimizer's gradients on one stage, summed
over the stages, a tied weight counted once, under pipeline parallelism) and ``clip_gradients`` scales
to it. ``local_group_squares`` is each parameter group's share of its square that this rank holds
(``gradient_groups``), counted once over the ranks: summed over every rank, one small all-reduce
where a step's record wants it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from plait.parallel.data_parallel.gradient_buckets import GradientAllReduce, GradientBuckets, default_bucket_bytes
from plait.parallel.data_parallel.gradient_shards import GradientReduceScatter
from plait.parallel.data_parallel.sharded_adamw import ShardedAdamW, gradients_by_parameter, gradients_of
from plait.parallel.grad_norm import scale_to_norm, total_norm
from plait.parallel.tensor import finish_tensor_gradients
from plait.topology import Topology


@dataclass(frozen=True)
class GradientReduction:
    """What this rank's gradients still need after backward, decided once when the model is parallelized.

    ``replica_dims``: groups averaged here (``dp_replicate`` under hybrid-sharded ZeRO-2, else none).
    ``tied_peer``: the pp rank holding the other copy of a tied embedding (None: no copy elsewhere).
    ``stage_norm``: the norm is summed over the pp group. ``scatter_after``: what finishes a pipeline
    stage's data-parallel reduction after the schedule (waiting for its chunks' buckets, or ZeRO-3's
    reduce-scatter)."""

    replica_dims: tuple[str, ...] = ()
    tied_peer: int | None = None
    stage_norm: bool = False
    scatter_after: Callable[[], None] | None = None


def gradient_reduction(topology: Topology, tied_peer: int | None = None,
                       scatter_after: Callable[[], None] | None = None) -> GradientReduction:
    """The reduction left after backward on ``topology``; ``tied_peer`` as the pipeline found it,
    ``scatter_after`` as ``parallelize`` built it on a pipeline stage."""
    # ZeRO-2 under hybrid sharding reduce-scatters inside a replica group; the groups average here.
    hybrid_rows = topology.layout.zero == 2 and topology.size("dp_replicate") > 1
    return GradientReduction(("dp_replicate",) * hybrid_rows, tied_peer, stage_norm=topology.size("pp") > 1,
                             scatter_after=scatter_after)


def data_parallel_buckets(model: nn.Module, optimizer: torch.optim.Optimizer, topology: Topology,
                          chunks: Mapping[int, list[nn.Parameter]] | None = None) -> GradientBuckets | None:
    """plait's own hooks that reduce the gradients over dp·cp in backward: ZeRO-2's (the optimizer's),
    or below it the all-reduce (on a pipeline stage, whose ``chunks`` are given, one bucket list per
    chunk); None where DDP (PowerSGD) or FSDP2 reduce, or nothing does."""
    if isinstance(optimizer, ShardedAdamW) and optimizer.gradient_shards is not None:
        return optimizer.gradient_shards
    pipelined = chunks is not None
    replicas = topology.replica_dim
    if topology.size(replicas) == 1 or topology.layout.zero >= 2 or isinstance(model, DistributedDataParallel):
        return None
    chunks = chunks or {0: list(model.parameters())}
    params = [param for params in chunks.values() for param in params]
    return GradientAllReduce(chunks, topology.group(replicas), default_bucket_bytes(params), per_chunk=pipelined)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, optimizer: torch.optim.Optimizer, enabled: bool,
                  buckets: GradientBuckets | None = None) -> Iterator[None]:
    """Skip the hooks' gradient reduction unless ``enabled`` (every micro-batch but the last), but
    the reduce-scatters'. ``buckets``: plait's own (``data_parallel_buckets``; default ZeRO-2's, from
    the optimizer)."""
    buckets = buckets or getattr(optimizer, "gradient_shards", None)
    if isinstance(model, FSDPModule):
        # FSDP2 (ZeRO-3) and ZeRO-2 reduce-scatter every micro-batch's gradients, as torchtitan and
        # DeepSpeed run them: with their sync off each would keep every gradient whole until the
        # last micro-batch, what sharding the gradients exists to spare.
        yield
    elif isinstance(buckets, GradientReduceScatter):
        with buckets.synchronising(True):
            yield
    elif buckets is not None:
        with buckets.synchronising(enabled):
            yield
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
            flat = funcol.all_reduce(torch.cat([g.reshape(-1) for g in same]), "sum", topology.group(dim)).wait()
            flat /= topology.size(dim)
            for grad, part in zip(same, flat.split([g.numel() for g in same])):
                grad.copy_(part.view_as(grad))


def gradient_norm(model: nn.Module, optimizer: torch.optim.Optimizer, topology: Topology,
                  reduction: GradientReduction) -> torch.Tensor:
    """The global norm of the step's gradients, the same on every rank."""
    grads = gradients_by_parameter(optimizer)
    if not reduction.stage_norm:
        return total_norm(list(grads.values()))
    # The tied embedding's two copies hold the same gradient: the first stage's counts it.
    tied = model.tok_embeddings.weight if reduction.tied_peer == 0 else None
    squares = total_norm([grad for param, grad in grads.items() if param is not tied]).square()
    dist.all_reduce(squares, group=topology.group("pp"))
    return squares.sqrt()


def clip_gradients(optimizer: torch.optim.Optimizer, max_norm: float, norm: torch.Tensor) -> None:
    """Scale the step's gradients, of global norm ``norm`` (``gradient_norm``), down to ``max_norm``."""
    scale_to_norm(gradients_of(optimizer), max_norm, norm)


BLOCK_PARAMETER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _root_dims(name: str, hybrid: bool) -> tuple[str, ...]:
    """The root mesh's dimensions (``build_topology``'s) that the group ``name`` spans."""
    data, shard = (("dp_replicate", "dp_shard"), ("dp_shard",)) if hybrid else (("dp",), ("dp",))
    return {"dp": data, "dp_replicate": ("dp_replicate",), "dp_shard": shard, "dp_cp": (*data, "cp"),
            "dp_shard_cp": (*shard, "cp"), "cp": ("cp",), "tp": ("tp",)}[name]


def gradient_groups(layers: int) -> list[str]:
    """The parameter groups whose gradient norms a step can report: the embeddings, each block, and
    the head (the final norm and the output projection)."""
    return ["embeddings", *(f"block {i}" for i in range(layers)), "head"]


def _group_of(name: str, layers: int) -> int:
    """``name``'s index in ``gradient_groups(layers)``."""
    if block := BLOCK_PARAMETER.search(name):
        return 1 + int(block.group(1))
    return 0 if "embeddings" in name else layers + 1


def _counted_here(grad: torch.Tensor, topology: Topology) -> bool:
    """Whether this rank's copy of ``grad`` is the one counted: the ranks sharing a copy (over the data,
    context or tensor dimensions it is not sharded over) count the one at coordinate 0."""
    hybrid = topology.layout.dp_replicate > 1
    sharded: set[str] = set()
    if isinstance(grad, DTensor):
        for name, placement in zip(grad.device_mesh.mesh_dim_names, grad.placements):
            if not placement.is_replicate():
                sharded.update(_root_dims(name, hybrid))
    return all(topology.coordinate(dim) == 0 for dim in (*_root_dims("dp", hybrid), "cp", "tp")
               if dim not in sharded and topology.size(dim) > 1)


@torch.no_grad()
def local_group_squares(model: nn.Module, optimizer: torch.optim.Optimizer, topology: Topology,
                        reduction: GradientReduction) -> torch.Tensor:
    """Per ``gradient_groups`` group, the squared norm of the gradients this rank counts (before
    clipping): summed over all ranks, each group's squared norm, which add up to the global norm's
    square. No collective: the caller sums them where it wants them."""
    grads = gradients_by_parameter(optimizer)
    layers = getattr(model, "module", model).spec.layers
    names = {param: name for name, param in model.named_parameters()}
    tied = model.tok_embeddings.weight if reduction.stage_norm and reduction.tied_peer == 0 else None
    counted = [(names[param], grad) for param, grad in grads.items() if param is not tied
               and _counted_here(grad, topology)]
    squares = torch.zeros(layers + 2, dtype=torch.float32, device=topology.device)
    if counted:
        local = [grad.to_local() if isinstance(grad, DTensor) else grad for _, grad in counted]
        norms = torch.stack(torch._foreach_norm(local, 2, dtype=torch.float32)).to(topology.device)
        groups = torch.tensor([_group_of(name, layers) for name, _ in counted], device=topology.device)
        squares.index_add_(0, groups, norms.square())
    return squares
