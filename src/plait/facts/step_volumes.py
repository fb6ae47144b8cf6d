"""Bytes one rank hands each group's collectives and point-to-point transfers in one training step.

The sum, over a whole step of plait's engine, of the volumes the planner times one by one: the
layers' tensor- and context-parallel calls (``layer_collectives``), the model's two ends
(``embedding_collectives``, ``head_collectives``), the gradient sums of weights that tensor or
context parallelism replicates, the pipeline's stage transfers (``stage_boundary_bytes``,
``tied_embedding_bytes``), the data-parallel reduction and gathers of each ZeRO stage and hybrid
sharding (``communicated_bytes`` per element of the rank's parameters, ``rank_tensor_shape_counts``),
and the step's scalar reductions (the loss, the pipeline's gradient norm). The span tracer records
the same step on every rank; tests require the two equal for every layout of the parity matrix, and
``plait explain`` sets them side by side.
"""

from __future__ import annotations

from collections import Counter

from plait.facts.activations import ACTIVATION_BYTES, residual_stream_bytes
from plait.facts.collectives import (
    embedding_collectives, head_collectives, layer_collectives, replicated_layer_gradient_elements, stage_boundary_bytes,
    tied_embedding_bytes,
)
from plait.facts.model_state import (
    communicated_bytes, held_gradient_bytes, pipeline_share, rank_tensor_shape_counts, reduction_rounds,
    sharded_elements,
)
from plait.facts.recompute import rank_recompute
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.flops import norm_parameter_count
from plait.models.spec import ModelSpec

SCALAR = 4  # one fp32 value: the step's loss, the pipeline's squared gradient norm


def step_volumes(spec: ModelSpec, layout: Layout, global_batch: int, precision: str = "fp32",
                 pp_rank: int = 0, dp_rank: int = 0) -> dict[str, Counter]:
    """{group: {op: bytes}} the rank at pipeline coordinate ``pp_rank`` and data-parallel coordinate
    ``dp_rank`` hands in one step of plait's engine (groups of one rank move nothing and are left out;
    under hybrid sharding ZeRO's collectives run on ``dp_shard`` and ``dp_replicate``)."""
    volumes: dict[str, Counter] = {}
    sizes = {"dp": layout.dp, "tp": layout.tp, "cp": layout.cp, "pp": layout.pp, "dp_shard": layout.dp_shard,
             "dp_replicate": layout.dp_replicate}

    def add(group: str, op: str, count: int) -> None:
        if sizes[group] > 1:
            volumes.setdefault(group, Counter())[op] += int(count)

    layers, first, last = pipeline_share(spec, layout, pp_rank)
    micro_batch = global_batch // layout.dp // layout.microbatches
    _inside_the_model(spec, layout, micro_batch, pp_rank, layers, first, last, precision, add)
    _pipeline(spec, layout, micro_batch, pp_rank, dp_rank, first, last, precision, add)
    _data_parallel(spec, layout, layers, first, last, precision, dp_rank, add)
    add("dp", "all_reduce", SCALAR)  # the logged loss, averaged over dp
    add("cp", "all_reduce", SCALAR)  # and over cp
    return volumes


def _inside_the_model(spec: ModelSpec, layout: Layout, micro_batch: int, pp_rank: int, layers: int, first: bool,
                      last: bool, precision: str, add) -> None:
    """The layers' and ends' tensor- and context-parallel calls of every micro-batch (each block's
    by its own recomputation), and the sums of replicated weights' gradients over tp (a sequence
    shard's norms, kv-heads fewer than tp). What the matmuls write moves in the activations'
    precision, what the norms and column-parallel linears read in the residual stream's dtype
    (plait.facts.activations.residual_stream_bytes: fp32 under bf16 autocast over fp32 weights), as
    do the ends' calls and, in the weights' dtype alike, the replicated weights' gradients.
    """
    tp, sp, cp, seq = layout.tp, layout.sp, layout.cp, spec.seq_len
    e, stream = ACTIVATION_BYTES[precision], residual_stream_bytes(precision, layout.zero, layout.pp, STACKS["plait"])
    calls = [(call, blocks) for mode, blocks in rank_recompute(spec, layout, pp_rank).items()
             for call in layer_collectives(spec, micro_batch, seq, tp, sp, cp, mode, e, cp_algorithm=layout.cp_algorithm,
                                           stream_bytes=stream)]
    calls += [(call, 1) for call in (embedding_collectives(spec, micro_batch, seq, tp, sp, cp, stream) if first else ())]
    calls += [(call, 1) for call in (head_collectives(spec, micro_batch, seq, tp, sp, cp, stream) if last else ())]
    for call, count in calls:
        count *= layout.microbatches
        add(call.group, call.op, count * (call.forward + call.backward) * call.handed_bytes)
        if call.op == "send":  # each ring hop receives its like from the rank before
            add(call.group, "recv", count * (call.forward + call.backward) * call.handed_bytes)
    replicated = layers * replicated_layer_gradient_elements(spec, tp, sp)
    if last and tp > 1 and sp:
        replicated += norm_parameter_count(spec)  # the final norm's
    # (laid out as their parameters once a step, or by ZeRO-2's buckets every micro-batch's)
    add("tp", "all_reduce", reduction_rounds(layout) * replicated * stream)


def _pipeline(spec: ModelSpec, layout: Layout, micro_batch: int, pp_rank: int, dp_rank: int, first: bool, last: bool,
              precision: str, add) -> None:
    """Each chunk sends its micro-batch's output on and its input's gradient back (the model's first
    and last chunk one fewer), receiving as many; the end stages swap the tied embedding's gradient;
    a barrier starts the schedule, the last stage broadcasts the loss and the stages sum their
    gradients' squared norms."""
    if layout.pp == 1:
        return
    chunks = layout.pp * layout.virtual_stages
    mine = range(pp_rank, chunks, layout.pp)
    hops = sum((c < chunks - 1) + (c > 0) for c in mine)
    moved = layout.microbatches * hops * stage_boundary_bytes(spec, layout, micro_batch, precision, STACKS["plait"])
    tied = tied_embedding_bytes(spec, layout, precision, STACKS["plait"], dp_rank) if first != last else 0
    for op in ("send", "recv"):
        add("pp", op, moved + tied)
    add("pp", "barrier", 0)
    add("pp", "broadcast", SCALAR)
    add("pp", "all_reduce", SCALAR)


def _data_parallel(spec: ModelSpec, layout: Layout, layers: int, first: bool, last: bool, precision: str,
                   dp_rank: int, add) -> None:
    """ZeRO 0 all-reduces every gradient over dp; ZeRO 1 all-reduces them and gathers the updated
    rows each rank owns; ZeRO 2 reduce-scatters each micro-batch's (on a pipeline stage the
    accumulated ones) and gathers the rows, which it sums in fp32; ZeRO 3 (FSDP2) gathers
    every parameter in each micro-batch's forward and again in its backward and reduce-scatters each
    micro-batch's gradients (on a pipeline stage, which keeps them for the schedule, it gathers once
    a step and reduce-scatters the accumulated gradients). Under hybrid sharding ZeRO's collectives
    run in the replica group (``dp_shard``) and the shards' gradients are all-reduced across
    replicas (``dp_replicate``; ZeRO 1 all-reduces over all of dp as before). Then cp averages the
    gradients this rank keeps (all of them below ZeRO 2, its shard from it)."""
    counts = rank_tensor_shape_counts(spec, layers, first, last, layout.tp, layout.pp)
    grad_bytes, param_bytes = communicated_bytes(layout, precision, STACKS["plait"])
    shard_group = "dp_shard" if layout.dp_replicate > 1 else "dp"
    ranks = layout.dp_shard
    whole, owned, padded = sharded_elements(counts, dp_rank % ranks, ranks)
    zero = layout.zero
    if zero <= 1:
        add("dp", "all_reduce", whole * grad_bytes)
    if zero in (1, 2):
        add(shard_group, "all_gather", owned * param_bytes)
    per_micro_batch = (reduction_rounds(layout) if zero == 2 else
                       layout.microbatches if zero == 3 and layout.pp == 1 else 1)
    # cp averages the gradients as the rank holds them (``held_gradient_bytes``), which ZeRO-2's
    # replicas do too; FSDP2's replicas all-reduce its padded shards in the reduce dtype, cp
    # averages the unpadded ones.
    row_bytes = held_gradient_bytes(layout, precision)
    if zero >= 2:
        add(shard_group, "reduce_scatter", per_micro_batch * (padded * ranks if zero == 3 else whole) * grad_bytes)
        add("dp_replicate", "all_reduce", per_micro_batch * padded * grad_bytes if zero == 3 else owned * row_bytes)
    if zero == 3:
        add(shard_group, "all_gather", (2 * per_micro_batch if layout.pp == 1 else 1) * padded * param_bytes)
    add("cp", "all_reduce", (whole if zero < 2 else owned) * row_bytes)
