"""Bytes each collective of tensor, sequence and context parallelism moves, on paper, and what
crosses between pipeline stages.

One home for the engine's tests and the planner: ``layer_collectives`` lists one layer's calls,
``embedding_collectives`` / ``head_collectives`` those of the model's two ends and
``stage_boundary_bytes`` one pipeline transfer, which the planner times (plait.plan.costs) and tests
measure in a real step, requiring equality. ``batch`` sequences
of ``seq`` tokens go through the model on each rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.facts.activations import residual_stream_bytes
from plait.facts.model_state import FP32, held_gradient_bytes, owned_rows, padded_vocab, reference_bytes
from plait.facts.stack import Kernels
from plait.layout import Layout
from plait.models.flops import block_norms, kv_heads_per_rank, kv_heads_whole, norm_parameter_count
from plait.models.spec import ModelSpec


@dataclass(frozen=True)
class Collective:
    """One kind of collective a layer issues per micro-batch on one rank, and how often.

    ``tensor_bytes`` is the whole tensor it reduces, gathers or exchanges on this rank (an
    all-gather's output); ``forward`` and ``backward`` count its calls, recomputed forwards in the
    backward's. ``input_gradient``: the backward's reduction of the column-parallel linears' input
    gradients (all-reduced, or reduce-scattered under sp), which can run under their weight
    gradients.
    """

    op: str  # all_reduce, all_gather, reduce_scatter, all_to_all, send (point-to-point round a ring)
    group: str  # tp or cp
    size: int
    tensor_bytes: int
    forward: int
    backward: int
    input_gradient: bool = False

    @property
    def handed_bytes(self) -> int:
        """What each rank hands one call: an all-gather its shard, any other the whole tensor."""
        return self.tensor_bytes // self.size if self.op == "all_gather" else self.tensor_bytes


def layer_collectives(spec: ModelSpec, layout: Layout, micro_batch: int, element_bytes: int = FP32,
                      stream_bytes: int | None = None, recompute_whole_forward: bool = False) -> tuple[Collective, ...]:
    """The tensor- and context-parallel collectives of one layer and micro-batch on one rank of
    ``layout`` (its tp, sp, cp, cp algorithm and recomputation).

    Tensor parallel: an all-reduce after wo and after w2 forward, and of the input gradients of
    attention and MLP backward; with sp each becomes an all-gather before and a reduce-scatter after
    (mirrored in backward). Context parallel, all-to-all: q, k, v (grouped-query k, v expanded to the
    query heads) and the output exchanged over heads, forward and backward. Ring: each rank sends its
    neighbour cp-1 K/V blocks (k and v in one tensor, kv-heads only) forward and again in backward,
    and the blocks' fp32 gradients cp times in backward (the last hop takes them home). All-gather:
    the K/V blocks of every rank gathered once forward, their fp32 gradients reduce-scattered once in
    backward; every recomputation reruns the gather with the attention it feeds. Recomputation
    issues the recomputed forward's collectives again in backward; PyTorch's checkpoint (plait)
    stops at the last tensor backward needs: under ``full`` every one but the MLP's closing
    all-reduce or reduce-scatter, under ``selective`` the exchange of q, k and v (the output's comes
    after the attention kernel's last saved tensor; the ring's K/V all go round before its outputs are
    saved, so both modes send them again). ``recompute_whole_forward`` (Megatron-LM) reissues all of them.
    ``op`` keeps the reduce-scatters' and all-to-alls' results (plait.facts.activations.op_recompute_bytes)
    and reissues the rest as ``full`` does: sp's two all-gathers, or wo's all-reduce, and the ring or the K/V gather.
    Where every tp rank holds wk and wv whole (``kv_heads_whole``), each backward all-reduces their
    gradient (and their biases') over tp, in the weights' dtype, and waits for it
    (plait.parallel.tensor_communications).

    ``element_bytes`` is a value of what the matmuls write (the row-parallel linears' outputs and
    their gradients, q, k, v), ``stream_bytes`` (default the same) one of the residual stream the
    column-parallel linears read (sp's gather of their input, the reduction of its gradient): fp32
    under bf16 autocast over fp32 weights (plait.facts.activations.residual_stream_bytes).
    """
    tp, sp, cp, recompute, cp_algorithm = layout.tp, layout.sp, layout.cp, layout.recompute, layout.cp_algorithm
    batch, seq = micro_batch, spec.seq_len
    stream = batch * (seq // cp) * spec.hidden * element_bytes  # the residual stream this rank holds, whole over tp
    read = batch * (seq // cp) * spec.hidden * (stream_bytes or element_bytes)  # as the column-parallel linears read it
    full = recompute == "full"
    rerun = recompute in ("full", "op")  # the block's forward runs again, kept results aside
    out = []
    if tp > 1:
        closing = 1 if recompute_whole_forward else 0  # the MLP's closing collective, rerun or not
        if sp:
            out.append(Collective("all_gather", "tp", tp, read, 2, 2 * rerun))
            out.append(Collective("all_gather", "tp", tp, stream, 0, 2))  # the row-parallel outputs' gradients
            out.append(Collective("reduce_scatter", "tp", tp, stream, 2, full * (1 + closing)))
            out.append(Collective("reduce_scatter", "tp", tp, read, 0, 2, input_gradient=True))
        else:
            out.append(Collective("all_reduce", "tp", tp, stream, 2, rerun * (1 + closing)))
            out.append(Collective("all_reduce", "tp", tp, read, 0, 2, input_gradient=True))
        if kv_heads_whole(spec, tp):
            whole = 2 * spec.kv_dim * (spec.hidden + (1 if spec.has_bias else 0)) * (stream_bytes or element_bytes)
            out.append(Collective("all_reduce", "tp", tp, whole, 0, 1))
    if cp > 1 and cp_algorithm == "ring":
        kv_elements = 2 * batch * (seq // cp) * kv_heads_per_rank(spec, tp) * spec.head_dim
        again = 0 if recompute == "none" else cp - 1
        out.append(Collective("send", "cp", cp, kv_elements * element_bytes, cp - 1, cp - 1 + again))
        out.append(Collective("send", "cp", cp, kv_elements * FP32, 0, cp))
    elif cp > 1 and cp_algorithm == "all-gather":
        kv_elements = 2 * batch * seq * kv_heads_per_rank(spec, tp) * spec.head_dim  # every rank's block
        out.append(Collective("all_gather", "cp", cp, kv_elements * element_bytes, 1, 0 if recompute == "none" else 1))
        out.append(Collective("reduce_scatter", "cp", cp, kv_elements * FP32, 0, 1))
    elif cp > 1:
        again = {"none": 0, "selective": 3, "op": 0, "full": 4}[recompute]
        out.append(Collective("all_to_all", "cp", cp, stream // tp, 4, 4 + again))
    return tuple(out)


def embedding_collectives(spec: ModelSpec, batch: int, seq: int, tp: int = 1, sp: bool = False, cp: int = 1,
                          element_bytes: int = FP32) -> tuple[Collective, ...]:
    """The tensor-parallel collectives of the embedding, per micro-batch on one rank.

    The token embedding is split by vocabulary rows, so each rank's lookup is a partial sum: all-
    reduced forward, or with sp reduce-scattered into sequence shards (its backward all-gathers the
    gradient). Learned positions are replicated and sliced to the rank's shard under sp, so their
    gradient is all-gathered in backward, in the weights' dtype, which the residual stream's follows
    (``element_bytes``)."""
    if tp == 1:
        return ()
    stream = batch * (seq // cp) * spec.hidden * element_bytes
    if not sp:
        return (Collective("all_reduce", "tp", tp, stream, 1, 0),)
    out = [Collective("reduce_scatter", "tp", tp, stream, 1, 0), Collective("all_gather", "tp", tp, stream, 0, 1)]
    if spec.learned_positions:
        out.append(Collective("all_gather", "tp", tp, (seq // cp) * spec.hidden * element_bytes, 0, 1))
    return tuple(out)


def head_collectives(spec: ModelSpec, batch: int, seq: int, tp: int = 1, sp: bool = False, cp: int = 1,
                     element_bytes: int = FP32) -> tuple[Collective, ...]:
    """The tensor-parallel collectives of the output projection, per micro-batch on one rank.

    Split by vocabulary columns, the head reads the whole residual stream: its input gradient (the
    ranks' partial sums) is all-reduced in backward, or with sp its input is all-gathered forward and
    the gradient reduce-scattered back. The vocabulary-parallel loss (plait.parallel.cross_entropy)
    all-reduces fp32 values per token in its forward: the maxima, then the sums of exponentials and
    the target's logit together."""
    if tp == 1:
        return ()
    tokens = batch * (seq // cp)
    stream = tokens * spec.hidden * element_bytes
    loss = (Collective("all_reduce", "tp", tp, tokens * FP32, 1, 0),
            Collective("all_reduce", "tp", tp, 2 * tokens * FP32, 1, 0))
    if not sp:
        return (Collective("all_reduce", "tp", tp, stream, 0, 1), *loss)
    return (Collective("all_gather", "tp", tp, stream, 1, 0), Collective("reduce_scatter", "tp", tp, stream, 0, 1), *loss)


def outside_layer_collective_bytes(spec: ModelSpec, batch: int, seq: int, tp: int = 1, sp: bool = False,
                                   cp: int = 1) -> dict[str, int]:
    """Bytes each rank hands each collective per step outside the layers (a one-stage model in plait's
    fp32): the embedding's and head's calls, plus the final norm's gradient summed over tp under sp
    (it saw a sequence shard). The cp ranks' gradient average is the data-parallel reduction's, over
    dp·cp (plait.facts.step_volumes)."""
    volumes: dict[str, int] = {}
    for call in embedding_collectives(spec, batch, seq, tp, sp, cp) + head_collectives(spec, batch, seq, tp, sp, cp):
        volumes[call.op] = volumes.get(call.op, 0) + (call.forward + call.backward) * call.handed_bytes
    if tp > 1 and sp:
        volumes["all_reduce"] = volumes.get("all_reduce", 0) + norm_parameter_count(spec) * FP32
    return volumes


def collective_bytes_per_layer(spec: ModelSpec, layout: Layout, micro_batch: int) -> dict[str, int]:
    """Bytes each rank hands each collective per layer and step (forward, backward, gradient sync),
    in plait's fp32 model: ``layer_collectives`` plus the tp sum of the norms' gradients under sp
    (the cp ranks' gradient average is the data-parallel reduction's, over dp·cp)."""
    volumes: dict[str, int] = {}

    def add(name: str, count: int) -> None:
        if count:
            volumes[name] = volumes.get(name, 0) + count

    for call in layer_collectives(spec, layout, micro_batch):
        add(call.op, (call.forward + call.backward) * call.handed_bytes)
    add("all_reduce", norm_gradient_elements(spec, 1, False, layout.tp, layout.sp) * FP32)
    return volumes


def norm_gradient_elements(spec: ModelSpec, layers: int, last: bool, tp: int, sp: bool) -> int:
    """Gradient elements the tp ranks of a pipeline stage sum after their backward under sp: the norms'
    (whole on every rank, each of which saw only its sequence shard) of its ``layers`` blocks and, on
    the last stage, the final norm's. (The whole wk and wv of ``kv_heads_whole`` are summed in each
    backward: ``layer_collectives``.)"""
    if tp == 1 or not sp:
        return 0
    return (layers * block_norms(spec) + (1 if last else 0)) * norm_parameter_count(spec)


def boundary_split_over_tp(layout: Layout, kernels: Kernels) -> bool:
    """Whether each tensor-parallel rank sends only its 1/tp piece of a stage's boundary tensor, the
    receiving stage all-gathering the pieces over tp (``Kernels.pipeline_boundary_split``); under sp
    the tensor is a sequence shard already."""
    return kernels.pipeline_boundary_split and layout.tp > 1 and not layout.sp


def stage_boundary_bytes(spec: ModelSpec, layout: Layout, micro_batch: int, precision: str, kernels: Kernels) -> int:
    """Bytes of one micro-batch's hidden states, or of their gradient, sent from one pipeline stage to
    the next by one rank: its cp shard of the sequence (a tp shard of that under sp, or where the
    stack splits the boundary over tp) at the whole hidden width, in the residual stream's dtype
    (``residual_stream_bytes``: on plait's engine fp32 under autocast over fp32 weights, bf16 over
    bf16 weights)."""
    element = residual_stream_bytes(precision, layout.zero, layout.pp, kernels)
    tokens = spec.seq_len // layout.cp // (layout.tp if layout.sp else 1)
    return micro_batch * tokens * spec.hidden * element // (layout.tp if boundary_split_over_tp(layout, kernels) else 1)


def tied_embedding_bytes(spec: ModelSpec, layout: Layout, precision: str, kernels: Kernels, zero_rank: int = 0) -> int:
    """Bytes the first and the last pipeline stage each send the other after backward when the embedding
    and the head share one weight (GPT-2): the gradient of its copy, this tensor-parallel rank's rows
    (plait.parallel.gradients sums the two); in plait's engine as the stage holds them after its
    reduction (``held_gradient_bytes``), from ZeRO 2 on only the rows it owns as ``zero_rank`` of ZeRO's group;
    a reference stack all-reduces the whole gradient as it holds it (``reference_bytes``: Megatron-LM's
    main_grad, fp32 in bf16), or its fp32 copy where it keeps one (DeepSpeed's BF16_Optimizer swaps
    ``_hp_grad``, ``Kernels.fp32_grad_accumulation``). None without stages or without tied weights."""
    if layout.pp == 1 or not spec.tie_embeddings:
        return 0
    rows = padded_vocab(spec.vocab, layout.tp) // layout.tp
    if kernels.plait_engine and layout.zero >= 2:
        rows = owned_rows(rows, zero_rank, layout.group_size(layout.zero_dim))
    element = (held_gradient_bytes(layout, precision) if kernels.plait_engine
               else FP32 if kernels.fp32_grad_accumulation else reference_bytes(precision, layout.zero, kernels)[1])
    return rows * spec.hidden * element
