"""Predict one training step of a layout: per-rank memory, step time, bubble, throughput.

The pipeline part is the schedule's own action lists (plait.schedules.generate) played by the
schedule simulator with this module's per-action costs; data-parallel gradient reduction and the
optimizer step follow the pipeline flush, with the overlap rules of plait.plan.comm.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from plait.facts.activations import (
    activation_bytes_per_layer, head_activation_bytes, held_between_passes, loss_backward_bytes, op_keeps_attention,
    recompute_working_bytes, replayed_block_bytes, residual_stream_bytes,
)
from plait.facts.buckets import BUCKET_CAP_BYTES, bucket_bytes
from plait.facts.collectives import norm_gradient_elements, tied_embedding_bytes
from plait.facts.recompute import block_recompute, chunk_recompute
from plait.facts.model_state import (
    PipelineShare,
    communicated_bytes, held_gradient_bytes, powersgd_elements, rank_layer_parameters, rank_model_states, rank_parameters,
    rank_tensor_shapes, rank_tensors, reduced_gradient_elements, reduction_rounds, zero_group,
)
from plait.facts.stack import Kernels
from plait.facts.validity import check_run
from plait.layout import Layout
from plait.models.flops import attention_core_forward_flops, flops_per_sequence, layer_flops
from plait.models.spec import ModelSpec
from plait.plan.comm import (
    all_gather_seconds, all_reduce_seconds, exposed_under, group_link, merged_link, pipeline_link, reduce_scatter_seconds,
    send_seconds, strided_link,
)
from plait.plan.compute import gradient_seconds, optimizer_seconds
from plait.plan.costs import Boundaries, ChunkCost, chunk_costs, stage_boundaries, wrapper_overhead
from plait.hardware import Hardware, stack_hardware
from plait.plan.memory import RankMemory, other_bytes
from plait.plan.pipeline import play
from plait.plan.workload import Workload
from plait.schedules import schedule_spec, split_layers

# DDP's default gradient bucket, for the other stacks (plait's own: plait.facts.buckets); the last
# bucket cannot overlap anything.
BUCKET_BYTES = BUCKET_CAP_BYTES


@dataclass(frozen=True)
class Prediction:
    """One layout's predicted step; the time breakdown is for the rank that computes the most."""

    layout: Layout
    micro_batch_size: int
    step_time_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    peak_memory_bytes: int
    memory_breakdown: dict[str, int]
    fits: bool
    time_breakdown: dict[str, float] = field(default_factory=dict)
    host_memory_bytes: int = 0  # offloaded activations in host memory on the rank holding the most

    def to_dict(self) -> dict:
        return {
            "layout": self.layout.to_dict(), "micro_batch_size": self.micro_batch_size,
            "step_time_s": self.step_time_s, "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu, "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction, "peak_memory_bytes": self.peak_memory_bytes,
            "memory_breakdown": self.memory_breakdown, "fits": self.fits, "time_breakdown": self.time_breakdown,
            "host_memory_bytes": self.host_memory_bytes,
        }


def check_layout(workload: Workload, gpus: int, layout: Layout) -> int:
    """Raise ConfigError if the run is invalid (the one validation train uses); return the micro-batch size."""
    check_run(workload.spec, layout, gpus, workload.global_batch, workload.kernels)
    return workload.global_batch // (layout.dp * layout.microbatches)


def stage_memory(workload: Workload, hw: Hardware, layout: Layout, micro_batch: int, share: PipelineShare,
                 activations: float, kept_in_every_chunk: bool) -> RankMemory:
    """Peak bytes of one rank of a pipeline stage holding ``share`` of the model and ``activations``,
    and under recomputation what the block its backward replays adds (``replayed_block_bytes``)."""
    spec, precision, kernels = workload.spec, workload.precision, workload.kernels
    layers, last = share.layers, share.last
    states = rank_model_states(spec, layout, precision, share, kernels)
    other = other_bytes(spec, layout, micro_batch, precision, hw.reserved_bytes, kernels)
    loss = loss_backward_bytes(spec, micro_batch, layout.tp, layout.cp, kernels, precision) if last else 0.0
    head = head_activation_bytes(spec, micro_batch, layout.tp, layout.sp, layout.cp, precision, kernels) if last else 0.0
    working = recompute_working_bytes(spec, layout, micro_batch, precision, kernels) if layers else 0.0
    replayed = replayed_block_bytes(working, schedule_spec(layout.schedule).splits_backward, kept_in_every_chunk,
                                    last and layout.virtual_stages == 1, head + loss)
    return RankMemory(states.params, states.grads, states.optimizer, activations + replayed, other + loss)


def chunk_activation_bytes(workload: Workload, layout: Layout, micro_batch: int, counts: tuple[int, ...]) -> list[float]:
    """Activation bytes one forward of each chunk stores (the last chunk adds the head's), each block
    by its own recomputation (plait.facts.recompute)."""
    spec, precision = workload.spec, workload.precision

    def per_layer(mode: str) -> float:
        return held_between_passes(activation_bytes_per_layer(spec, layout.with_recompute(mode), micro_batch,
                                                              precision, workload.kernels), layout.offload_activations)

    head = head_activation_bytes(spec, micro_batch, layout.tp, layout.sp, layout.cp, precision, workload.kernels)
    return [sum(n * per_layer(mode) for mode, n in chunk_recompute(layout, blocks)) + (head if c == len(counts) - 1 else 0.0)
            for c, blocks in enumerate(counts)]


def chunk_offloaded_bytes(workload: Workload, layout: Layout, micro_batch: int, counts: tuple[int, ...]) -> list[float]:
    """What activation offload keeps in host memory for one forward of each chunk: its blocks' saved bytes."""
    saved = activation_bytes_per_layer(workload.spec, layout, micro_batch, workload.precision, workload.kernels)
    return [n * saved for n in counts]


@dataclass(frozen=True)
class FlushCosts:
    """What follows the pipeline flush on one rank: gradient reduction, parameter gather, the small
    all-reduces (``scalars``: the gradient norm, the logged loss, the norms' gradients under sp), and
    the optimizer."""

    reduce: float
    last_bucket: float
    gather: float
    scalars: float
    optimizer: float
    overlap: float = 1.0
    after: float = 0.0  # reduction that waits for the end of backward (no hook runs it inside)
    first_gather: float | None = None  # the gather's first bucket when it overlaps the next forward
    rounds: int = 1  # backward passes that each run ``reduce`` beside themselves (ZeRO-2: every micro-batch's)

    def exposed(self, window: float, forward: float = 0.0) -> float:
        """Communication left exposed when each round of the reduction overlaps ``window`` seconds of
        backward and an overlapped parameter gather the ``forward`` seconds of the next step's first
        forward."""
        reduce = self.rounds * (self.last_bucket + exposed_under(self.reduce - self.last_bucket, window, self.overlap))
        gather = self.gather if self.first_gather is None else \
            self.first_gather + exposed_under(self.gather - self.first_gather, forward, self.overlap)
        return reduce + self.after + gather + self.scalars


def gather_window(forward: float, virtual_stages: int, pp: int, microbatches: int) -> float:
    """Seconds of forward compute a parameter gather overlapped with the next step can hide under,
    given ``forward``, one micro-batch's forward over the rank's chunks. Without interleaving, that
    forward, layer by layer. With v chunks a rank, each chunk's gather but the first is first needed
    after min(p, m) forwards of the chunk before it (Megatron-LM's warm-up order, which runs p
    micro-batches through a chunk before the next), so the window is (1 + (v − 1)·min(p, m))/v of it."""
    v = virtual_stages
    return forward * (1 + (v - 1) * min(pp, microbatches)) / v


def plait_reduction_seconds(hw: Hardware, layout: Layout, grads: float, grad_bytes: int,
                            held_bytes: int) -> tuple[float, float]:
    """(in backward, after backward) seconds of plait's data-parallel reduction of ``grads`` bytes,
    ``grad_bytes`` an element on the wire and ``held_bytes`` as the rank holds it after
    (plait.facts.model_state.held_gradient_bytes) (plait.parallel.gradients): over every rank holding
    the same weights (dp·cp), an all-reduce below ZeRO-2 and a reduce-scatter over ZeRO's group from
    it, run by hooks inside backward bucket by bucket (DDP, plait's own buckets under tp or on a
    pipeline stage, ZeRO-2's, FSDP2's), on a pipeline stage from each chunk's last backward action
    on, except ZeRO-3 on a pipeline stage, whose FSDP2 reduce-scatter follows the schedule
    (plait.parallel.data_parallel.stage_sharding). Under hybrid sharding the reduce-scatter runs inside a replica
    group and an all-reduce of the rows across the groups follows it (in FSDP2's backward hook at
    ZeRO-3, after backward at ZeRO-2)."""
    after = 0.0
    if layout.zero < 2:
        reduce = all_reduce_seconds(grads, layout.dp * layout.cp, merged_link(hw, layout, ("dp", "cp")))
    else:
        shards, stride = zero_group(layout)
        rows = grads / shards
        reduce = reduce_scatter_seconds(grads, shards, strided_link(hw, shards, stride, layout.world_size))
        replica_link = strided_link(hw, layout.dp_replicate, shards * stride, layout.world_size)
        # FSDP2's replicas all-reduce in the wire's dtype, in its backward hook; ZeRO-2's the rows as held
        if layout.zero == 3:
            reduce += all_reduce_seconds(rows, layout.dp_replicate, replica_link)
        else:
            after = all_reduce_seconds(rows * held_bytes / grad_bytes, layout.dp_replicate, replica_link)
    in_backward = layout.pp == 1 or layout.zero < 3
    return (reduce, after) if in_backward else (0.0, reduce + after)


def flush_costs(workload: Workload, hw: Hardware, layout: Layout, params: float, tensors: int,
                norms: int) -> FlushCosts:
    """Data-parallel reduction of ``params`` parameters' gradients, the tp sum of the ``norms``
    gradient elements of the norms under sp (plait.facts.collectives.norm_gradient_elements), ZeRO's
    gathers and Adam."""
    precision, kernels = workload.precision, workload.kernels
    replicas, replica_link = layout.dp * layout.cp, merged_link(hw, layout, ("dp", "cp"))
    shards, stride = zero_group(layout)
    link = strided_link(hw, shards, stride, layout.world_size)
    g_bytes, p_bytes = communicated_bytes(layout, precision, kernels)
    # ZeRO-3 without stages reduces each layer's gradients in that layer's backward, where
    # plait.plan.costs.layer_cost charges them beside its gathers; what is left here is the
    # embedding's and head's, reduced at the end of a backward with nothing to hide under: on plait's
    # engine every micro-batch's (plait.parallel.gradients), so once for each.
    per_layer = layout.zero == 3 and layout.pp == 1
    reduced = params - workload.spec.layers * rank_layer_parameters(workload.spec, layout.tp) if per_layer else params
    grads = reduced_gradient_elements(workload.spec, layout, reduced) * g_bytes
    after = 0.0
    if layout.grad_compression == "powersgd":
        # Three all-reduces over dp·cp in turn (the tensors sent whole, then P, then Q).
        shapes = rank_tensor_shapes(workload.spec, workload.spec.layers, True, True, 1, 1)
        reduce = sum(all_reduce_seconds(n * g_bytes, replicas, replica_link) for n in powersgd_elements(shapes))
    elif kernels.plait_engine:
        held_bytes = held_gradient_bytes(layout, precision)
        reduce, after = plait_reduction_seconds(hw, layout, grads, g_bytes, held_bytes)
        if per_layer:  # every micro-batch's; hybrid ZeRO-3's all-reduce across replicas is in FSDP2's hook
            reduce *= layout.microbatches
    elif layout.zero == 0 or (layout.zero == 1 and not (kernels.main_grad_buffer or kernels.zero1_reduces_partitions)):
        reduce = all_reduce_seconds(grads, replicas, replica_link)
    else:  # reduce-scatter over the ZeRO group; replica groups (hybrid sharding) average the shard
        reduce = reduce_scatter_seconds(grads, shards, link)
        reduce += all_reduce_seconds(grads / shards, replicas // shards,
                                     strided_link(hw, replicas // shards, shards * stride, layout.world_size))
    if kernels.reduce_after_schedule:
        reduce, after = 0.0, after + reduce
    tied = tied_embedding_bytes(workload.spec, layout, workload.precision, kernels)
    if tied:  # the first and last stages swap their tied embedding's gradient after backward
        after += send_seconds(tied, pipeline_link(hw, layout, layout.pp - 1))
    # Buckets hold the gradients as computed, before any compression.
    bucketed = params * communicated_bytes(replace(layout, grad_compression="none"), precision, kernels)[0]
    bucket = bucket_bytes(bucketed) if kernels.plait_engine else BUCKET_BYTES  # plait's rule; DDP's default
    last_bucket = reduce if per_layer else reduce * min(1.0, bucket / bucketed) if bucketed else 0.0
    # ZeRO-1/2 gather the updated rows after the step; ZeRO-3 on a pipeline stage gathers its
    # parameters once per step, before its first forward (plait.parallel.data_parallel.stage_sharding).
    once = layout.zero in (1, 2) or (layout.zero == 3 and layout.pp > 1)
    gather = all_gather_seconds(params * p_bytes, shards, link) if once else 0.0
    first_gather = gather * min(1.0, bucket / bucketed) if kernels.param_gather_overlap and bucketed else None
    # plait's ZeRO-2 without stages reduce-scatters every micro-batch's gradients in its backward
    # (plait.parallel.gradients), each waited for at that backward's end.
    rounds = reduction_rounds(layout) if kernels.plait_engine else 1
    # The logged loss is averaged over the replicas; a tensor-parallel gradient norm sums over tp
    # (ZeRO-2/3's sum over dp is left out: one latency), as do the norms' gradients under sp, in
    # the weights' dtype, each round.
    scalars = all_reduce_seconds(4, replicas, replica_link)
    if layout.tp > 1:
        tp_link = group_link(hw, layout, "tp")
        scalars += all_reduce_seconds(4, layout.tp, tp_link)
        if norms:
            stream = residual_stream_bytes(precision, layout.zero, layout.pp, kernels)
            scalars += rounds * all_reduce_seconds(norms * stream, layout.tp, tp_link)
    local = params / shards if layout.zero >= 1 else params
    optimizer = optimizer_seconds(hw, local, tensors, precision) + wrapper_overhead(hw, workload.spec, layout).step
    return FlushCosts(reduce, last_bucket, gather, scalars, optimizer, hw.comm_overlap, after, first_gather, rounds)


def hardware_flops(spec: ModelSpec, layout: Layout, kernels: Kernels) -> float:
    """FLOPs one sequence costs with each block's recomputation (plait.facts.recompute) on ``kernels``'
    stack; under ``op`` plait's ring or gathered attention runs again (plait.facts.activations.op_keeps_attention)."""
    def rerun(mode: str) -> int:
        flops = layer_flops(spec, spec.seq_len, mode, kernels.recompute_whole_forward).recompute
        if mode == "op" and not op_keeps_attention(kernels, layout.cp, layout.cp_algorithm):
            flops += attention_core_forward_flops(spec, spec.seq_len)
        return flops

    return flops_per_sequence(spec).hardware + sum(n * rerun(mode) for mode, n in Counter(block_recompute(spec, layout)).items())


@dataclass(frozen=True)
class StepCosts:
    """What a layout's step is played with: the checked micro-batch size, the hardware as the stack
    runs on it, each chunk's blocks and seconds, and the transfers between stages."""

    micro_batch: int
    hw: Hardware
    counts: tuple[int, ...]
    chunks: list[ChunkCost]
    boundaries: Boundaries


def step_costs(workload: Workload, hw: Hardware, gpus: int, layout: Layout) -> StepCosts:
    """``layout``'s checked costs for ``workload`` on ``gpus`` devices of ``hw``."""
    micro_batch = check_layout(workload, gpus, layout)
    spec, precision, kernels = workload.spec, workload.precision, workload.kernels
    hw = stack_hardware(hw, kernels)
    counts = tuple(len(r) for r in split_layers(spec, layout.pp, layout.virtual_stages, layout.stage_layers))
    return StepCosts(micro_batch, hw, counts, chunk_costs(spec, hw, layout, micro_batch, precision, kernels, counts),
                     stage_boundaries(spec, hw, layout, micro_batch, precision, kernels))


def held_chunks(layout: Layout, counts: tuple[int, ...], rank: int) -> tuple[range, PipelineShare]:
    """The chunks pipeline rank ``rank`` runs (chunk c on rank c mod pp) and what it holds of the model."""
    mine = range(rank, len(counts), layout.pp)
    return mine, PipelineShare(sum(counts[c] for c in mine), 0 in mine, len(counts) - 1 in mine)


class StepTail(NamedTuple):
    """Seconds one pipeline rank spends after its schedule: data-parallel communication left exposed,
    the optimizer, and the step's gradient accumulation (plait.plan.compute.gradient_seconds)."""

    exposed: float
    optimizer: float
    gradients: float


def step_tail(workload: Workload, layout: Layout, costs: StepCosts, rank: int) -> StepTail:
    """What follows the flush on pipeline rank ``rank`` (every dp, cp and tp rank of a stage alike)."""
    spec, hw, chunks = workload.spec, costs.hw, costs.chunks
    mine, share = held_chunks(layout, costs.counts, rank)
    layers, first, last = share
    params = rank_parameters(spec, layers, first, last, layout.tp)
    flush = flush_costs(workload, hw, layout, params, rank_tensors(spec, layers, first, last, layout.pp),
                        norm_gradient_elements(spec, layers, last, layout.tp, layout.sp))
    forward = gather_window(sum(chunks[c].forward for c in mine), layout.virtual_stages, layout.pp, layout.microbatches)
    return StepTail(flush.exposed(sum(chunks[c].backward for c in mine), forward), flush.optimizer,
                    gradient_seconds(workload, hw, layout, share))


def evaluate(workload: Workload, hw: Hardware, gpus: int, layout: Layout) -> Prediction:
    """Predict ``layout`` for ``workload`` on ``gpus`` devices of ``hw``: play its schedule with costs."""
    costs = step_costs(workload, hw, gpus, layout)
    micro_batch, hw, counts, chunks, boundaries = costs.micro_batch, costs.hw, costs.counts, costs.chunks, costs.boundaries
    spec, precision = workload.spec, workload.precision
    pp, v, m = layout.pp, layout.virtual_stages, layout.microbatches
    paired = workload.kernels.sends_after_backward(layout.schedule)
    played = play(layout, chunks, boundaries, chunk_activation_bytes(workload, layout, micro_batch, counts), paired)
    tails, memories = [], []
    for rank in range(pp):
        mine, share = held_chunks(layout, counts, rank)
        tails.append(step_tail(workload, layout, costs, rank))
        kept = (layout.recompute_layers is not None
                and min((counts[c] for c in mine if counts[c]), default=0) > layout.recompute_layers)
        memories.append(stage_memory(workload, hw, layout, micro_batch, share, played.peak_activations[rank], kept))
    step = played.step_time + max(sum(tail) for tail in tails)
    # Offloaded activations in host memory, at the most any rank holds (as the device's peak, from the play).
    host = max(play(layout, chunks, boundaries, chunk_offloaded_bytes(workload, layout, micro_batch, counts),
                    paired).peak_activations) \
        if layout.offload_activations else 0.0
    busiest = max(range(pp), key=lambda r: played.busy[r])
    comm_inside = m * sum(chunks[c].comm for c in range(busiest, pp * v, pp))
    model_tflops = workload.global_batch * flops_per_sequence(spec).model / step / gpus / 1e12
    hardware_tflops = workload.global_batch * hardware_flops(spec, layout, workload.kernels) / step / gpus / 1e12
    peak = max(memories, key=lambda mem: mem.total)
    return Prediction(
        layout=layout, micro_batch_size=micro_batch, step_time_s=step,
        model_tflops_per_gpu=model_tflops, hardware_tflops_per_gpu=hardware_tflops,
        mfu=model_tflops / hw.peak_tflops(precision), bubble_fraction=played.bubble_fraction,
        peak_memory_bytes=int(peak.total), memory_breakdown=peak.breakdown(), fits=peak.total <= hw.usable_memory_bytes,
        host_memory_bytes=int(host),
        time_breakdown={
            "compute_s": played.busy[busiest] - comm_inside + tails[busiest].gradients,
            "critical_path_comm_s": comm_inside + played.sending[busiest],
            "bubble_s": max(0.0, played.step_time - played.busy[busiest] - played.sending[busiest]),  # (rounding leaves a hair without stages)
            "exposed_dp_comm_s": tails[busiest].exposed,
            "optimizer_s": tails[busiest].optimizer,
        },
    )
