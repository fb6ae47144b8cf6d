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
from collections.abc import Iterator
from itertools import chain

from plait.facts.activations import ACTIVATION_BYTES, residual_stream_bytes
from plait.facts.collectives import (
    embedding_collectives, head_collectives, layer_collectives, norm_gradient_elements, stage_boundary_bytes,
    tied_embedding_bytes,
)
from plait.facts.model_state import (
    PipelineShare, communicated_bytes, held_gradient_bytes, pipeline_share, rank_tensor_shape_counts, reduction_rounds,
    sharded_elements, zero_rank,
)
from plait.facts.recompute import rank_recompute
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.spec import ModelSpec

SCALAR = 4  # one fp32 value: the step's loss, the pipeline's squared gradient norm
Transfer = tuple[str, str, int]  # (group, op, bytes the rank hands it in one step)


def step_volumes(spec: ModelSpec, layout: Layout, global_batch: int, precision: str = "fp32",
                 pp_rank: int = 0, dp_rank: int = 0, cp_rank: int = 0) -> dict[str, Counter]:
    """{group: {op: bytes}} the rank at pipeline coordinate ``pp_rank`` and data-parallel coordinate
    ``dp_rank`` and context-parallel coordinate ``cp_rank`` hands in one step of plait's engine (groups
    of one rank move nothing and are left out; the gradients' reduction runs on ``Layout.replica_dim``
    and ZeRO's on ``Layout.zero_dim``, and under hybrid sharding on ``dp_replicate`` too)."""
    volumes: dict[str, Counter] = {}

    def add(group: str, op: str, count: int) -> None:
        if layout.group_size(group) > 1:
            volumes.setdefault(group, Counter())[op] += int(count)

    share = pipeline_share(spec, layout, pp_rank)
    micro_batch = global_batch // layout.dp // layout.microbatches
    in_zero_group = zero_rank(layout, dp_rank, cp_rank)
    for group, op, count in chain(_inside_the_model(spec, layout, micro_batch, pp_rank, share, precision),
                                  _pipeline(spec, layout, micro_batch, pp_rank, in_zero_group, share, precision),
                                  _data_parallel(spec, layout, share, precision, in_zero_group)):
        add(group, op, count)
    add("dp", "all_reduce", SCALAR)  # the logged loss, averaged over dp
    add("cp", "all_reduce", SCALAR)  # and over cp
    return volumes


def _inside_the_model(spec: ModelSpec, layout: Layout, micro_batch: int, pp_rank: int, share: PipelineShare,
                      precision: str) -> Iterator[Transfer]:
    """The layers' and ends' tensor- and context-parallel calls of every micro-batch (each block's
    by its own recomputation, whole wk and wv summed in each backward among them), and the norms'
    gradients under sp summed over tp after the backward. What the matmuls write moves in the activations'
    precision, what the norms and column-parallel linears read in the residual stream's dtype
    (plait.facts.activations.residual_stream_bytes: fp32 under bf16 autocast over fp32 weights), as
    do the ends' calls and, in the weights' dtype alike, the weights' gradients summed over tp.
    """
    tp, sp, cp, seq = layout.tp, layout.sp, layout.cp, spec.seq_len
    layers, first, last = share
    e, stream = ACTIVATION_BYTES[precision], residual_stream_bytes(precision, layout.zero, layout.pp, STACKS["plait"])
    calls = [(call, blocks) for mode, blocks in rank_recompute(spec, layout, pp_rank).items()
             for call in layer_collectives(spec, layout.with_recompute(mode), micro_batch, e, stream)]
    calls += [(call, 1) for call in (embedding_collectives(spec, micro_batch, seq, tp, sp, cp, stream) if first else ())]
    calls += [(call, 1) for call in (head_collectives(spec, micro_batch, seq, tp, sp, cp, stream) if last else ())]
    for call, count in calls:
        count *= layout.microbatches
        yield call.group, call.op, count * (call.forward + call.backward) * call.handed_bytes
        if call.op == "send":  # each ring hop receives its like from the rank before
            yield call.group, "recv", count * (call.forward + call.backward) * call.handed_bytes
    norms = norm_gradient_elements(spec, layers, last, tp, sp)
    # (laid out as their parameters once a step, or by ZeRO-2's buckets every micro-batch's)
    yield "tp", "all_reduce", reduction_rounds(layout) * norms * stream


def _pipeline(spec: ModelSpec, layout: Layout, micro_batch: int, pp_rank: int, in_zero_group: int,
              share: PipelineShare, precision: str) -> Iterator[Transfer]:
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
    tied = tied_embedding_bytes(spec, layout, precision, STACKS["plait"], in_zero_group) if share.first != share.last else 0
    for op in ("send", "recv"):
        yield "pp", op, moved + tied
    yield "pp", "barrier", 0
    yield "pp", "broadcast", SCALAR
    yield "pp", "all_reduce", SCALAR


def _data_parallel(spec: ModelSpec, layout: Layout, share: PipelineShare, precision: str,
                   rank: int) -> Iterator[Transfer]:
    """Over the replica group (dp·cp, ``Layout.replica_dim``) ZeRO 0 all-reduces every gradient; ZeRO 1
    all-reduces them and gathers the updated rows each rank owns in ZeRO's group (``Layout.zero_dim``,
    where the rank is ``rank``); ZeRO 2 reduce-scatters each micro-batch's (on a pipeline stage the
    accumulated ones) and gathers the rows, which it sums in fp32; ZeRO 3 (FSDP2) gathers every
    parameter in each micro-batch's forward and again in its backward and reduce-scatters each
    micro-batch's gradients (on a pipeline stage, which keeps them for the schedule, it gathers once
    a step and reduce-scatters the accumulated gradients). Under hybrid sharding ZeRO's group is one
    replica group's and the shards' gradients are all-reduced across replicas (``dp_replicate``)."""
    counts = rank_tensor_shape_counts(spec, *share, layout.tp, layout.pp)
    grad_bytes, param_bytes = communicated_bytes(layout, precision, STACKS["plait"])
    shard_group, ranks = layout.zero_dim, layout.group_size(layout.zero_dim)
    whole, owned, padded = sharded_elements(counts, rank, ranks)
    zero = layout.zero
    if zero <= 1:
        yield layout.replica_dim, "all_reduce", whole * grad_bytes
    if zero in (1, 2):
        yield shard_group, "all_gather", owned * param_bytes
    per_micro_batch = (reduction_rounds(layout) if zero == 2 else
                       layout.microbatches if zero == 3 and layout.pp == 1 else 1)
    # ZeRO-2's replicas average the rows as the rank holds them (``held_gradient_bytes``); FSDP2's
    # all-reduce its padded shards in the reduce dtype.
    row_bytes = held_gradient_bytes(layout, precision)
    if zero >= 2:
        yield shard_group, "reduce_scatter", per_micro_batch * (padded * ranks if zero == 3 else whole) * grad_bytes
        yield "dp_replicate", "all_reduce", per_micro_batch * padded * grad_bytes if zero == 3 else owned * row_bytes
    if zero == 3:
        yield shard_group, "all_gather", (2 * per_micro_batch if layout.pp == 1 else 1) * padded * param_bytes
