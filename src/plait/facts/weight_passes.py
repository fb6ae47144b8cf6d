"""The elementwise passes plait's engine makes over a layer's weights every micro-batch.

Two kinds, beside the matmuls, each a read and a write of every element, so bound by memory:

- autocast's casts: under bf16 over fp32 weights (``autocast_copies_weights``) each linear's
  weight and bias are cast to bf16 for the forward (read 4 bytes, write 2), and their bf16
  gradients back to fp32 in the backward (read 2, write 4): 6 bytes an element each way. A
  recomputed forward casts again (plait.plan.compute.layer_times counts it with the forward).
- the gradients' accumulation: from the second micro-batch of a step on, autograd adds each new
  gradient into the one the parameter holds (read both, write one), in the gradients' own dtype:
  once a step per micro-batch but the first, so the step pays it, not each micro-batch.

A layer of llama-1b (60.8M weights) so moves 1.46 GB a micro-batch at ZeRO 0 in bf16, as much as
the planner's elementwise kernels of its forward and backward over 2,048 tokens.

FSDP2 without pipeline stages (ZeRO-3) casts no weight in autocast (it gathers them in bf16) and
accumulates only its shard of the gradients; its own copies take the casts' place (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py):
each all-gather, the forward's and the backward's, first copies the rank's shard into the gather's
input in the parameters' dtype (``all_gather_copy_in``, cast from fp32) and then every gathered
element out into its parameter (``split_with_sizes_copy``); each backward copies the unsharded
gradients into the reduce-scatter's input in the reduce dtype (``foreach_reduce_scatter_copy_in``),
and the reduced shard accumulates into the one the rank holds. tests/test_weight_passes.py counts
the casts' and the accumulation's bytes in the real model's ops.
"""

from __future__ import annotations

import functools

from plait.facts.activations import BF16, FP32, autocast_copies_weights
from plait.facts.model_state import padded_vocab, rank_tensor_shape_counts
from plait.facts.stack import Kernels
from plait.layout import Layout
from plait.models.flops import block_norms
from plait.models.spec import ALIGNED_ROWS, ModelSpec

CAST_BYTES = FP32 + BF16  # one element read in one dtype and written in the other
NO_PASSES = (0.0, 0.0)


@functools.lru_cache(maxsize=256)
def layer_elements(spec: ModelSpec, tp: int) -> tuple[int, int]:
    """(every parameter element of one layer on a tensor-parallel rank, those of its linears: the
    weights and biases autocast casts; the rest are the norms', which run in fp32)."""
    counts = rank_tensor_shape_counts(spec, 1, False, False, tp, 1)
    elements = sum(n * rows * cols for (rows, cols), n in counts.items())
    norms = block_norms(spec) * (2 if spec.family == "gpt2" else 1) * spec.hidden
    return elements, elements - norms


def passes_bytes(spec: ModelSpec, tp: int, casts: bool, grad_bytes: int, accumulating: float) -> tuple[float, float]:
    """(forward, backward) bytes of one layer's weight passes in one micro-batch: autocast's casts where
    ``casts``, and where ``accumulating`` (1: it does; 0: the step's first) the accumulation of
    ``grad_bytes``-byte gradients."""
    elements, linear = layer_elements(spec, tp)
    cast = CAST_BYTES * linear if casts else 0.0
    return cast, cast + 3 * grad_bytes * elements * accumulating


def fsdp2_copies_bytes(elements: float, shards: int, precision: str, reduce_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes of FSDP2's copies of a module's ``elements`` in one micro-batch over
    ``shards`` ranks: a gather's copy in (the fp32 shard cast to the parameters' dtype) and out (every
    element) in the forward and again in the backward, and the gradients' copy into the reduce dtype."""
    unsharded = unsharded_bytes(precision)
    gather = elements / shards * (FP32 + unsharded) + elements * 2 * unsharded
    return gather, gather + elements * (unsharded + reduce_bytes)


def unsharded_bytes(precision: str) -> int:
    """Bytes an element of the parameters FSDP2 gathers, and of their gradients, in plait's policy."""
    return BF16 if precision == "bf16" else FP32


def reduce_bytes_of(layout: Layout) -> int:
    """Bytes an element of FSDP2's reduce-scatter: fp32, bf16 under bf16 gradient compression."""
    return BF16 if layout.grad_compression == "bf16" else FP32


def fsdp2_without_stages(layout: Layout) -> bool:
    """ZeRO-3 without pipeline stages: FSDP2 gathers each layer every micro-batch and reduce-scatters
    its gradients (on a stage, plait.parallel.stage_sharding gathers once a step)."""
    return layout.zero == 3 and layout.pp == 1


def weight_pass_bytes(spec: ModelSpec, layout: Layout, precision: str, kernels: Kernels) -> tuple[float, float]:
    """(forward, backward) bytes of one layer's weight passes in each micro-batch of ``layout`` on
    plait's engine, the accumulation apart (``accumulation_bytes``); none on a reference stack, whose
    published runs its fitted figures already hold."""
    if not kernels.plait_engine:
        return NO_PASSES
    if fsdp2_without_stages(layout):
        return fsdp2_copies_bytes(layer_elements(spec, layout.tp)[0], layout.dp_shard, precision, reduce_bytes_of(layout))
    return passes_bytes(spec, layout.tp, autocast_copies_weights(precision, layout.zero, layout.pp), FP32, 0.0)


def gradient_bytes(layout: Layout, precision: str) -> int:
    """Bytes an element of the gradients a rank computes and accumulates, as
    plait.facts.model_state.plait_model_states holds them: fp32, but bf16 for ZeRO 1 and 2 without
    stages (bf16 weights), for FSDP2's gathered parameters under bf16 and for a stage's FSDP2 under
    bf16 gradient compression (its reduce dtype)."""
    if fsdp2_without_stages(layout):
        return unsharded_bytes(precision)
    half = precision == "bf16" and (layout.zero in (1, 2) and layout.pp == 1
                                    or layout.zero == 3 and layout.grad_compression == "bf16")
    return BF16 if half else FP32


def accumulated_bytes(elements: float, layout: Layout, precision: str) -> float:
    """Bytes the accumulation of ``elements`` gradients moves in one micro-batch: in their own dtype,
    or FSDP2's reduced fp32 shard where it reduce-scatters every micro-batch."""
    if fsdp2_without_stages(layout):
        return 3 * FP32 * elements / layout.dp_shard
    return 3 * gradient_bytes(layout, precision) * elements


def accumulation_bytes(spec: ModelSpec, layout: Layout, precision: str, kernels: Kernels) -> float:
    """Bytes one layer's gradient accumulation moves in each micro-batch of a step but the first, on
    plait's engine."""
    if not kernels.plait_engine:
        return 0.0
    return accumulated_bytes(layer_elements(spec, layout.tp)[0], layout, precision)


def end_elements(spec: ModelSpec, tp: int, first: bool, last: bool) -> tuple[int, int]:
    """(the embedding's, the output projection's own) elements a rank holding the first and the last
    stage (as ``first`` and ``last`` say) keeps, their rows as ``padded_vocab`` pads them; a tied
    head on the embedding's rank holds none of its own."""
    table = padded_vocab(spec.vocab, tp) // tp * spec.hidden
    return (table if first else 0), (table if last and not (spec.tie_embeddings and first) else 0)


def end_pass_bytes(spec: ModelSpec, layout: Layout, precision: str, kernels: Kernels, first: bool,
                   last: bool) -> tuple[float, float]:
    """(forward, backward) bytes per micro-batch of the passes over the embedding and the output
    projection that a rank of the first and last stage (as ``first`` and ``last`` say) makes, the
    accumulation apart: the embedding's backward writes its whole gradient table; the head's weight is
    cast as a layer's is, and where GPT-2's vocabulary is no multiple of ``ALIGNED_ROWS`` its cast
    padded and the padding's gradient cut off (plait.models.vocabulary), one more bf16 pass each
    way; a tied weight's two gradients are summed; FSDP2 copies them as a layer's."""
    if not kernels.plait_engine or not (first or last):
        return NO_PASSES
    embedding, head = end_elements(spec, layout.tp, first, last)
    table = padded_vocab(spec.vocab, layout.tp) // layout.tp * spec.hidden
    grad = gradient_bytes(layout, precision)
    forward, backward = 0.0, grad * embedding
    if last:
        if autocast_copies_weights(precision, layout.zero, layout.pp) and not fsdp2_without_stages(layout):
            padded = 2 * BF16 if table % (ALIGNED_ROWS * spec.hidden) else 0
            forward += (CAST_BYTES + padded) * table
            backward += (CAST_BYTES + padded) * table
        if spec.tie_embeddings and first:
            backward += 3 * grad * table
    if fsdp2_without_stages(layout):
        copies = fsdp2_copies_bytes(embedding + head, layout.dp_shard, precision, reduce_bytes_of(layout))
        forward, backward = forward + copies[0], backward + copies[1]
    return forward, backward


def end_accumulation_bytes(spec: ModelSpec, layout: Layout, precision: str, kernels: Kernels, first: bool,
                           last: bool) -> float:
    """Bytes the accumulation of the embedding's and output projection's gradients a rank holds moves
    in each micro-batch of a step but the first."""
    if not kernels.plait_engine:
        return 0.0
    return accumulated_bytes(sum(end_elements(spec, layout.tp, first, last)), layout, precision)
