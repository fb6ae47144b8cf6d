"""One ``parallelize`` step: the single-device model, built on the meta device, spread over the
mesh, top to bottom.

As torchtitan's ``parallelize``: tensor/sequence → context → recomputation or offload → pipeline split →
ZeRO's shards → materialize → DDP (PowerSGD only) → optimizer, each an ``apply_*`` step from outside the model. The
order is forced: context parallelism swaps the attention core that selective recomputation wraps, a
stage is a slice of the tensor-parallel model, every step that decides what a rank keeps runs on
the meta device so that only that is ever allocated (``plait.parallel.materialize``), and DDP and
ZeRO's optimizer hooks wrap the real parameters the rank finally holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from plait.facts.recompute import block_recompute
from plait.models.init import WeightSource
from plait.models.transformer import Transformer
from plait.parallel.context import apply_context_parallel
from plait.parallel.cross_entropy import CROSS_ENTROPY_ONLY, TrainingLoss
from plait.parallel.data_parallel.compression import compress_gradients
from plait.parallel.data_parallel.data import hold_weights, replicate_data_parallel, shard_data_parallel
from plait.parallel.data_parallel.gradient_buckets import GradientBuckets
from plait.parallel.data_parallel.stage_sharding import ShardedStage
from plait.parallel.gradients import GradientReduction, data_parallel_buckets, gradient_reduction
from plait.parallel.materialize import materialize
from plait.parallel.offload import apply_activation_offload
from plait.parallel.optimizer import build_optimizer
from plait.parallel.pipeline import Pipeline, build_pipeline
from plait.parallel.recompute import apply_recompute
from plait.parallel.tensor import apply_tensor_parallel
from plait.topology import Topology


@dataclass
class Parallelized:
    """What a rank trains: its model (a pipeline stage's pruned model under pp), the optimizer over
    it, the pipeline (None without pp), what its gradients still need after backward, what
    holds them until then (``unreduced_gradients``), and plait's own hooks that reduce them over dp
    in backward (ZeRO-2's, or ZeRO 0/1's all-reduce; None under DDP and FSDP2)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    pipeline: Pipeline | None
    reduction: GradientReduction
    topology: Topology
    unreduced_gradients: Callable[[], list[torch.Tensor]]
    gradient_buckets: GradientBuckets | None = None
    loss: TrainingLoss = CROSS_ENTROPY_ONLY


def apply_within_stage(model: Transformer, topology: Topology) -> Transformer:
    """Tensor and context parallelism, then recomputation or activation offload: what a pipeline stage
    keeps of them."""
    model = apply_tensor_parallel(model, topology)
    model = apply_context_parallel(model, topology)
    model = apply_recompute(model, block_recompute(model.spec, topology.layout))
    return apply_activation_offload(model, topology.layout.offload_activations)


def parallelize(model: Transformer, topology: Topology, precision: str, lr: float, weight_decay: float,
                source: WeightSource) -> Parallelized:
    """Spread ``model`` (on the meta device) over ``topology``'s mesh, fill what this rank keeps of
    it from ``source`` and build its optimizer.

    ``precision`` ("fp32" or "bf16") sets how ZeRO holds parameters; ``lr`` and ``weight_decay``
    are the optimizer's."""
    model = apply_within_stage(model, topology)
    layout, pipeline, scatter_after, stage = topology.layout, None, None, None
    if topology.size("pp") > 1:
        # No DDP on a stage (its hooks cannot follow a backward split into input and weight halves):
        # plait's buckets reduce each chunk's gradients once its last backward is done, ZeRO-3's
        # FSDP2 after the schedule (plait.parallel.gradients).
        pipeline = build_pipeline(model, topology)
        model = pipeline.model
        hold_weights(model, topology, precision)
        if layout.zero == 3:
            stage = ShardedStage(model, topology.fsdp_mesh, layout.grad_compression)
            scatter_after = stage.reduce
        materialize(model, source, topology.device)
    else:
        model = shard_data_parallel(model, topology, precision)
        materialize(model, source, topology.device)
        model = replicate_data_parallel(model, topology)
    # A stage's gradients are final chunk by chunk (plait.parallel.data_parallel.gradient_buckets).
    chunks = {c: list(view.parameters()) for c, view in pipeline.chunks.items()} if pipeline is not None else None
    optimizer = build_optimizer(model, lr, weight_decay, topology, chunks)
    buckets = data_parallel_buckets(model, optimizer, topology, chunks)
    compress_gradients(model, optimizer, topology, buckets)  # --grad-compression, into the reduction backward runs
    if pipeline is not None and buckets is not None:
        pipeline.gradient_buckets, scatter_after = buckets, buckets.finish
    reduction = gradient_reduction(topology, pipeline.tied_peer if pipeline is not None else None, scatter_after)
    unreduced = stage.unreduced_gradients if stage is not None else \
        (lambda: [param.grad for param in model.parameters() if param.grad is not None])
    return Parallelized(model, optimizer, pipeline, reduction, topology, unreduced, buckets)
