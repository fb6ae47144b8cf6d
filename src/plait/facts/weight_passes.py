"""The elementwise passes plait's engine makes over its weights and their gradients.

Beside the matmuls, each reads and writes every element, so each is bound by memory:

- autocast's casts, where bf16 runs over fp32 weights (``autocast_copies_weights``: ZeRO 0, and
  ZeRO-3 on a pipeline stage): each linear's weight and bias cast to bf16 in every forward (read 4 bytes,
  write 2), again in a recomputed one, and their bf16 gradients cast back to fp32 in every backward;
- FSDP2's copies on the compute stream without pipeline stages (ZeRO-3; torch/distributed/fsdp/
  _fully_shard/_fsdp_collectives.py): each all-gather, the forward's and the backward's (a
  recomputed forward runs inside the latter), copies every gathered element out into its parameter
  (``split_with_sizes_copy``), and each backward copies the gradients into the reduce-scatter's
  input in the reduce dtype (``foreach_reduce_scatter_copy_in``): it reduce-scatters every
  micro-batch's (plait.parallel.gradients). Its copy of the shard into a gather's input and its
  accumulation of the reduced shards run on its side streams, under the compute, and are not
  counted;
- the gradients' accumulation: from a step's second micro-batch on, autograd adds each new gradient
  into the one the parameter holds (read both, write one) in the gradients' dtype; not where every
  micro-batch's gradients are reduce-scattered (FSDP2 and ZeRO-2 without stages,
  ``reduces_every_microbatch``), whose sums of the reduced shards, 1/dp of the elements, are not
  counted.

A layer of llama-1b (60.8M weights) so moves 1.46 GB a micro-batch at ZeRO 0 in bf16 (casts both
ways and the accumulation), as much as the planner's elementwise kernels of its forward and
backward over 2,048 tokens. The embedding's backward also writes its whole gradient table every
micro-batch, and a tied table's two gradients are summed. tests/test_weight_passes.py counts the
casts', the padding's, the gradients' and the accumulation's bytes in the real model's ops. DDP's
copy of each gradient into its bucket is not counted.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from plait.facts.activations import BF16, FP32, autocast_copies_weights
from plait.facts.model_state import holds_bf16_weights, padded_vocab, rank_tensor_shape_counts, reduction_rounds
from plait.facts.stack import Kernels
from plait.layout import Layout
from plait.models.flops import block_norms, norm_parameter_count
from plait.models.spec import ALIGNED_ROWS, ModelSpec

CAST_BYTES = FP32 + BF16  # one element read in one dtype and written in the other


class WeightPasses(NamedTuple):
    """Bytes of passes over weights in one micro-batch: its forward's, its backward's, and those a
    recomputed forward makes again."""

    forward: float = 0.0
    backward: float = 0.0
    recomputed: float = 0.0


NO_PASSES = WeightPasses()


@functools.lru_cache(maxsize=256)
def layer_elements(spec: ModelSpec, tp: int) -> tuple[int, int]:
    """(every parameter element of one layer on a tensor-parallel rank, those of its linears: the
    weights and biases autocast casts; the rest are the norms', which run in fp32)."""
    counts = rank_tensor_shape_counts(spec, 1, False, False, tp, 1)
    elements = sum(n * rows * cols for (rows, cols), n in counts.items())
    norms = block_norms(spec) * norm_parameter_count(spec)
    return elements, elements - norms


def cast_passes(elements: float, casts: bool) -> WeightPasses:
    """autocast's casts of ``elements`` fp32 weights, forward (again when recomputed) and their
    gradients' back in the backward, where it ``casts``."""
    cast = CAST_BYTES * elements if casts else 0.0
    return WeightPasses(cast, cast, cast)


def fsdp2_without_stages(layout: Layout) -> bool:
    """ZeRO-3 without pipeline stages: FSDP2 gathers each layer every micro-batch, forward and
    backward (on a stage, plait.parallel.data_parallel.stage_sharding gathers once a step)."""
    return layout.zero == 3 and layout.pp == 1


def unsharded_bytes(precision: str) -> int:
    """Bytes an element of the parameters FSDP2 gathers, and of their gradients, in plait's policy."""
    return BF16 if precision == "bf16" else FP32


def fsdp2_copy_out_bytes(elements: float, precision: str) -> float:
    """One FSDP2 gather's copy of ``elements`` gathered elements out into their parameters."""
    return elements * 2 * unsharded_bytes(precision)


def layer_passes(spec: ModelSpec, layout: Layout, precision: str, kernels: Kernels) -> WeightPasses:
    """One layer's passes over its weights in each micro-batch of ``layout`` on plait's engine, the
    gradients' apart (``layer_gradient_bytes``); none on a reference stack, whose fitted figures
    already hold what its published runs paid."""
    if not kernels.plait_engine:
        return NO_PASSES
    elements, linear = layer_elements(spec, layout.tp)
    if fsdp2_without_stages(layout):
        gather = fsdp2_copy_out_bytes(elements, precision)
        return WeightPasses(gather, gather + fsdp2_reduce_copy_bytes(elements, layout, precision), 0.0)
    return cast_passes(linear, autocast_copies_weights(precision, layout.zero, layout.pp))


def gradient_bytes(layout: Layout, precision: str) -> int:
    """Bytes an element of the gradients a rank's backward computes: fp32, but bf16 for ZeRO 1 and 2
    (bf16 weights, ``holds_bf16_weights``), for FSDP2's gathered
    bf16 parameters, and for a stage's FSDP2 under bf16 gradient compression (its reduce dtype)."""
    if fsdp2_without_stages(layout):
        return unsharded_bytes(precision)
    half = holds_bf16_weights(precision, layout.zero) or (precision == "bf16" and layout.zero == 3
                                                          and layout.grad_compression == "bf16")
    return BF16 if half else FP32


def fsdp2_reduce_copy_bytes(elements: float, layout: Layout, precision: str) -> float:
    """FSDP2's copy of ``elements`` gradients into its reduce-scatter's input, in the reduce dtype
    (fp32, bf16 under bf16 gradient compression)."""
    return (unsharded_bytes(precision) + (BF16 if layout.grad_compression == "bf16" else FP32)) * elements


def reduces_every_microbatch(layout: Layout) -> bool:
    """Whether plait's engine reduce-scatters every micro-batch's gradients, holding none whole from
    one to the next: FSDP2 and ZeRO-2 without stages (plait.parallel.gradients)."""
    return fsdp2_without_stages(layout) or reduction_rounds(layout) > 1


def gradient_step_bytes(elements: float, layout: Layout, precision: str) -> float:
    """Bytes the accumulation of ``elements`` parameters' gradients moves in a step on the compute
    stream: in every micro-batch but the first, in the gradients' dtype; none where every
    micro-batch's are reduce-scattered (``reduces_every_microbatch``)."""
    if reduces_every_microbatch(layout):
        return 0.0
    return (layout.microbatches - 1) * 3 * gradient_bytes(layout, precision) * elements


def layer_gradient_bytes(spec: ModelSpec, layout: Layout, precision: str, kernels: Kernels) -> float:
    """``gradient_step_bytes`` of one layer on plait's engine; none on a reference stack."""
    if not kernels.plait_engine:
        return 0.0
    return gradient_step_bytes(layer_elements(spec, layout.tp)[0], layout, precision)


def end_elements(spec: ModelSpec, tp: int, first: bool, last: bool) -> tuple[int, int]:
    """(the embedding's, the output projection's own) elements a rank holding the first and the last
    stage (as ``first`` and ``last`` say) keeps, their rows as ``padded_vocab`` pads them; a tied
    head on the embedding's rank holds none of its own."""
    table = padded_vocab(spec.vocab, tp) // tp * spec.hidden
    return (table if first else 0), (table if last and not (spec.tie_embeddings and first) else 0)


def end_passes(spec: ModelSpec, layout: Layout, precision: str, kernels: Kernels, first: bool,
               last: bool) -> WeightPasses:
    """The passes over the embedding and the output projection in each micro-batch on a rank of the
    first and last stage (as ``first`` and ``last`` say), the gradients' accumulation apart: the
    embedding's backward writes its whole gradient table; the head's weight is cast as a layer's is,
    and where the vocabulary is no multiple of ``ALIGNED_ROWS`` its cast is padded and the padding's
    gradient cut off (plait.models.vocabulary), one more bf16 pass each way; a tied table's two
    gradients are summed; FSDP2 copies them as a layer's."""
    if not kernels.plait_engine or not (first or last):
        return NO_PASSES
    embedding, head = end_elements(spec, layout.tp, first, last)
    table = padded_vocab(spec.vocab, layout.tp) // layout.tp * spec.hidden
    grad = gradient_bytes(layout, precision)
    forward, backward = 0.0, grad * embedding
    if last and autocast_copies_weights(precision, layout.zero, layout.pp):
        padding = 2 * BF16 if (table // spec.hidden) % ALIGNED_ROWS else 0
        forward += (CAST_BYTES + padding) * table
        backward += (CAST_BYTES + padding) * table
    if last and spec.tie_embeddings and first:
        backward += 3 * grad * table
    if fsdp2_without_stages(layout):
        gather = fsdp2_copy_out_bytes(embedding + head, precision)
        forward, backward = forward + gather, backward + gather + fsdp2_reduce_copy_bytes(embedding + head, layout, precision)
    return WeightPasses(forward, backward, 0.0)


def end_gradient_bytes(spec: ModelSpec, layout: Layout, precision: str, kernels: Kernels, first: bool,
                       last: bool) -> float:
    """``gradient_step_bytes`` of the embedding and output projection a rank holds."""
    if not kernels.plait_engine:
        return 0.0
    return gradient_step_bytes(sum(end_elements(spec, layout.tp, first, last)), layout, precision)
