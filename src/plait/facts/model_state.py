"""Bytes of model state per rank under each ZeRO stage, and the parameters each rank holds.

One home for the engine (summaries, tests) and the planner; pure Python. Ψ is the parameter count and Nd the
data-parallel size. ``PAPER_BYTES`` is the accounting of the ZeRO paper (Rajbhandari et al.
2020) for mixed precision: bf16 parameters and gradients (2 + 2 bytes) and an fp32 master copy
plus Adam's two moments (12 bytes); ``rank_model_states`` is what one rank holds, in plait's engine
(measured by every run and reported in ``summary.json``) or on a reference stack.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from plait.facts.stack import Kernels
from plait.layout import Layout
from plait.models.flops import (block_norms, embedding_tensor_count, head_tensor_count, kv_heads_whole, layer_tensor_count,
                                norm_tensor_count)
from plait.models.spec import ALIGNED_ROWS, FILL_BLOCK_ELEMENTS, ModelSpec

ADAM_MOMENTS = 2
FP32 = 4
BF16 = 2
# Bytes per parameter of (parameters, gradients, optimizer state): mixed precision keeps bf16
# parameters and gradients and an fp32 master beside Adam's fp32 moments; fp32 needs no master.
PAPER_BYTES = {"bf16": (BF16, BF16, FP32 + ADAM_MOMENTS * FP32), "fp32": (FP32, FP32, ADAM_MOMENTS * FP32)}


# What a rank holds beside its own part while it builds it (plait.parallel.materialize): the region
# of a weight it fills at a time in fp32 and, for seeded weights, the generator's block of rows and its
# scaled part, each at most ``FILL_BLOCK_ELEMENTS`` values. A constant: the model is never held whole,
# so building costs a rank its own parameters and this, far below its training peak.
BUILD_WORKSPACE_BYTES = 3 * FILL_BLOCK_ELEMENTS * FP32


def holds_bf16_weights(precision: str, zero: int) -> bool:
    """Whether plait's engine holds a rank's parameters in bf16 and computes their gradients in bf16
    (with an fp32 master of the rows it owns in ``ShardedAdamW``): ZeRO 1 and 2 under bf16, with or
    without pipeline stages (plait.parallel.data_parallel.data.cast_parameters); ZeRO-2 then sums its reduced rows
    in fp32. ZeRO 0 runs autocast over fp32 parameters, their own master; ZeRO-3 holds FSDP2's fp32
    shards."""
    return precision == "bf16" and zero in (1, 2)


def sharded_split(stage: int, parameters: int, dp: int, per_parameter: tuple[int, int, int]) -> dict[str, float]:
    """Bytes per rank of each kind of model state: stage ≥ 1 shards the optimizer state, ≥ 2 the
    gradients, 3 the parameters, each over the ``dp`` ranks."""
    return {
        kind: nbytes * parameters / (dp if stage >= sharded_from else 1)
        for kind, nbytes, sharded_from in zip(("parameters", "gradients", "optimizer"), per_parameter, (3, 2, 1))
    }


@dataclass(frozen=True)
class ModelStates:
    """Bytes of parameters, gradients and optimizer state on one rank."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_state_bytes(parameters: float, precision: str, zero: int, shards: int,
                      kernels: Kernels | None = None) -> ModelStates:
    """Model states of ``parameters`` on one rank, with ZeRO ``zero`` over ``shards`` ranks: the ZeRO
    paper's bytes, or as a reference stack holds them (``reference_bytes``)."""
    per_parameter = PAPER_BYTES[precision] if kernels is None else reference_bytes(precision, zero, kernels)
    split = sharded_split(zero, parameters, shards, per_parameter)
    return ModelStates(params=split["parameters"], grads=split["gradients"], optimizer=split["optimizer"])


def rank_parameters(spec: ModelSpec, layers: int, first: bool, last: bool, tp: int) -> int:
    """Parameters one tensor-parallel rank of a pipeline stage holds: the elements of
    ``rank_tensor_shapes`` (kv-heads fewer than tp, norms and row-parallel biases whole)."""
    block, ends = _block_and_end_shapes(spec, first, last, tp)
    return layers * _elements(block) + _elements(ends)


def rank_layer_parameters(spec: ModelSpec, tp: int) -> int:
    """Parameters of one block on one tensor-parallel rank (``rank_parameters`` of one layer without
    the model's ends)."""
    return _elements(_block_and_end_shapes(spec, False, False, tp)[0])


def _elements(shapes: list[tuple[int, int]]) -> int:
    return sum(rows * columns for rows, columns in shapes)


def rank_tensors(spec: ModelSpec, layers: int, first: bool, last: bool, pp: int) -> int:
    """Parameter tensors one rank of a pipeline stage holds (sharded or not, each is one tensor)."""
    count = layers * layer_tensor_count(spec)
    if first:
        count += embedding_tensor_count(spec)
    if last:
        count += head_tensor_count(spec) + (1 if spec.tie_embeddings and pp > 1 else 0)
    return count


def padded_vocab(vocab: int, tp: int) -> int:
    """The embedding's and output projection's rows under tensor parallelism: the vocabulary rounded up
    so that each rank's share is a multiple of ``ALIGNED_ROWS``, as Megatron pads it (the extra rows are
    zero and their logits are masked out of the loss, so training is unchanged). Without tensor
    parallelism the weights keep the vocabulary's rows and the output's matmul alone is padded
    (``plait.models.vocabulary``)."""
    if tp == 1:
        return vocab
    return -(-vocab // (ALIGNED_ROWS * tp)) * ALIGNED_ROWS * tp


def rank_tensor_shapes(spec: ModelSpec, layers: int, first: bool, last: bool, tp: int, pp: int) -> list[tuple[int, int]]:
    """(rows, columns) of every parameter tensor one tensor-parallel rank of a pipeline stage holds,
    as plait lays them out: column-parallel weights and biases (wq, wk, wv, w1, w3) by rows, row-
    parallel weights (wo, w2) by columns with whole biases, norms whole, kv-heads fewer than tp
    whole (``ReplicatedKVHeads``), embedding and head by rows of the vocabulary as ``padded_vocab``
    pads it, learned positions whole; a tied head on a stage without the embedding keeps its own copy.
    A vector is one column."""
    block, ends = _block_and_end_shapes(spec, first, last, tp)
    return block * layers + ends


def rank_tensor_shape_counts(spec: ModelSpec, layers: int, first: bool, last: bool, tp: int, pp: int) -> Counter:
    """``rank_tensor_shapes`` as a count of each distinct shape, without listing every layer's."""
    block, ends = _block_and_end_shapes(spec, first, last, tp)
    counts = Counter({shape: n * layers for shape, n in Counter(block).items()})
    counts.update(ends)
    return counts


def _block_and_end_shapes(spec: ModelSpec, first: bool, last: bool, tp: int) -> tuple[list, list]:
    """One block's tensor shapes and those of the ends a stage holds (``rank_tensor_shapes``)."""
    h, f = spec.hidden, spec.ffn_hidden
    kv = spec.kv_dim if kv_heads_whole(spec, tp) else spec.kv_dim // tp
    norm = [(h, 1)] * norm_tensor_count(spec)
    block = [*norm, (h // tp, h), (kv, h), (kv, h), (h, h // tp), *(norm if block_norms(spec) == 2 else []),
             (f // tp, h), (h, f // tp)]
    if spec.has_bias:
        block += [(h // tp, 1), (kv, 1), (kv, 1), (h, 1), (f // tp, 1), (h, 1)]
    if spec.gated_mlp:
        block.append((f // tp, h))
    vocab_rows = padded_vocab(spec.vocab, tp) // tp
    ends = []
    if first:
        ends.append((vocab_rows, h))
        if spec.learned_positions:
            ends.append((spec.seq_len, h))
    if last:
        ends += norm
        if not spec.tie_embeddings or not first:
            ends.append((vocab_rows, h))
    return block, ends


def owned_slice(rows: int, rank: int, ranks: int) -> slice:
    """The rows of a ``rows``-row tensor that ``rank`` of ``ranks`` owns: torch.chunk's split, as
    DTensor's Shard(0) (ZeRO-1/2's rows, plait.parallel.data_parallel.zero_rows)."""
    chunk = -(-rows // ranks)
    start = min(rank * chunk, rows)
    return slice(start, min(start + chunk, rows))


def owned_rows(rows: int, rank: int, ranks: int) -> int:
    """How many rows ``owned_slice`` gives ``rank``."""
    owned = owned_slice(rows, rank, ranks)
    return owned.stop - owned.start


class PipelineShare(NamedTuple):
    """What one pipeline rank holds of the model: its ``layers`` blocks, and whether it holds the
    ``first`` chunk (the embedding) and the ``last`` (the final norm and head)."""

    layers: int
    first: bool
    last: bool


def pipeline_share(spec: ModelSpec, layout: Layout, pp_rank: int) -> PipelineShare:
    """What pipeline rank ``pp_rank`` holds (chunk c on rank c mod pp, as every plait schedule places
    them)."""
    from plait.schedules.split import split_layers

    chunks = layout.pp * layout.virtual_stages
    split = split_layers(spec, layout.pp, layout.virtual_stages, layout.stage_layers)
    mine = range(pp_rank, chunks, layout.pp)
    return PipelineShare(sum(len(split[c]) for c in mine), 0 in mine, chunks - 1 in mine)


def fullest_rank_model_states(spec: ModelSpec, layout: Layout, precision: str) -> float:
    """Bytes of parameters, gradients and optimizer state on the rank that holds the most: a floor under
    what any rank of the run needs (``plait_model_states`` of each pipeline rank's share)."""
    return max(plait_model_states(spec, layout, precision, pipeline_share(spec, layout, pp_rank)).total
               for pp_rank in range(layout.pp))


def sharded_elements(counts: Counter, rank: int, ranks: int) -> tuple[int, int, int]:
    """Elements of tensors of these shapes (``rank_tensor_shape_counts``): all of them, the rows
    ``rank`` of ``ranks`` owns (torch.chunk's split, ZeRO 1-2), and one rank's FSDP2 shard padded to
    the largest rank's rows (ZeRO 3)."""
    whole = sum(n * rows * cols for (rows, cols), n in counts.items())
    owned = sum(n * owned_rows(rows, rank, ranks) * cols for (rows, cols), n in counts.items())
    padded = sum(n * -(-rows // ranks) * cols for (rows, cols), n in counts.items())
    return whole, owned, padded


def zero_rank(layout: Layout, dp_rank: int, cp_rank: int = 0) -> int:
    """A rank's place in ZeRO's group of ``layout.dp_shard · layout.cp`` ranks
    (``Layout.zero_dim``) from its global dp and cp coordinates: dp_shard outer, cp inner."""
    return (dp_rank % layout.dp_shard) * layout.cp + cp_rank


def plait_model_states(spec: ModelSpec, layout: Layout, precision: str, share: PipelineShare, dp_rank: int = 0,
                       cp_rank: int = 0) -> ModelStates:
    """Bytes of parameters, gradients and optimizer state one rank holds in plait, at their largest,
    of its ``share`` of the model.

    ZeRO shards over the dp and cp ranks together (those of one replica group under hybrid sharding,
    HSDP; ``dp_rank`` and ``cp_rank`` are the global coordinates, ``zero_rank``): the cp ranks hold
    the same weights, and their gradients are averaged with dp's (plait.parallel.gradients), as
    Megatron-LM's distributed optimizer and torchtitan's FSDP2 shard. bf16 keeps fp32 parameters
    under autocast (ZeRO 0) or FSDP2's fp32 shards (ZeRO 3); ZeRO 1 and 2 hold bf16 parameters and an fp32 master of the rows the rank owns
    (``holds_bf16_weights``), ZeRO 1 bf16 gradients, ZeRO 2 the fp32 sum of each micro-batch's
    reduce-scattered rows (plait.parallel.data_parallel.gradient_shards). Under tensor parallelism the rows are those of the
    rank's tp shard. Stage 1 and 2 shard each tensor by rows, as torch.chunk;
    FSDP2 (stage 3) holds each parameter's and gradient's shard padded to the largest rank's rows.
    Adam keeps two fp32 moments per owned element and one fp32 step counter per tensor.
    """
    counts = rank_tensor_shape_counts(spec, *share, layout.tp, layout.pp)
    zero, ranks = layout.zero, zero_group(layout)[0]
    half = holds_bf16_weights(precision, zero)
    weight_bytes = BF16 if half else FP32
    whole, owned, padded = sharded_elements(counts, zero_rank(layout, dp_rank, cp_rank), ranks)
    owned = owned if zero >= 1 else whole
    params = padded * FP32 if zero == 3 else whole * weight_bytes
    grads = padded * FP32 if zero == 3 else owned * FP32 if zero == 2 else whole * weight_bytes
    if layout.pp > 1 and zero >= 2:
        # A pipeline stage accumulates its whole gradients over the schedule and reduce-scatters them
        # once after it (plait.parallel.gradients); under ZeRO-3 it also keeps its fp32 parameters
        # gathered for the whole step (plait.parallel.data_parallel.stage_sharding), and FSDP2 accumulates the
        # gradients in its reduce dtype, bf16 under --grad-compression bf16. (ZeRO-2's fp32 rows
        # after it outweigh the whole bf16 gradients only where a group of 2 gives this rank the larger half.)
        grads = max(whole * weight_bytes, grads)
        if zero == 3:
            params += whole * FP32
            grads = whole * (BF16 if layout.grad_compression == "bf16" else FP32)
    optimizer = owned * (ADAM_MOMENTS * FP32 + (FP32 if half else 0)) + FP32 * counts.total()
    return ModelStates(params=params, grads=grads, optimizer=optimizer)


def rank_model_states(spec: ModelSpec, layout: Layout, precision: str, share: PipelineShare,
                      kernels: Kernels | None = None, dp_rank: int = 0, cp_rank: int = 0) -> ModelStates:
    """Model-state bytes of one rank of a pipeline stage holding ``share`` of the model, on ``kernels``' stack.

    plait's own (``kernels`` None or ``plait_engine``): what plait's engine holds (``plait_model_states``).
    A reference stack: ``reference_bytes``' split of ``rank_parameters`` sharded over ZeRO's group
    (``zero_group``: the data- and context-parallel ranks together, one replica group's under hybrid sharding),
    and an fp32 copy of every gradient where the stack accumulates in one besides its bf16 gradients
    (``Kernels.fp32_grad_accumulation``).
    """
    if kernels is None or kernels.plait_engine:
        return plait_model_states(spec, layout, precision, share, dp_rank, cp_rank)
    params = rank_parameters(spec, *share, layout.tp)
    states = model_state_bytes(params, precision, layout.zero, zero_group(layout)[0], kernels)
    if kernels.fp32_grad_accumulation:
        return ModelStates(states.params, states.grads + FP32 * params, states.optimizer)
    return states


def reference_bytes(precision: str, zero: int, kernels: Kernels) -> tuple[int, int, int]:
    """Bytes per parameter of (parameters, gradients, optimizer state) on a reference stack: the ZeRO
    paper's, but for gradients held in fp32 under bf16 (``Kernels.fp32_gradients``): Megatron-LM's
    main_grad (``Kernels.main_grad_buffer``) beside its bf16 weights and fp32 master, or PyTorch's
    fp32 weights (FSDP's shards at ZeRO-3, whole under DDP), which are their own master; FSDP's
    SHARD_GRAD_OP (ZeRO-2) holds bf16 weights whole beside its fp32 shards, Megatron's split. A stack
    keeping an fp32 accumulation copy beside bf16 gradients (``Kernels.fp32_grad_accumulation``)
    holds one or the other, not both."""
    assert not (kernels.fp32_gradients and kernels.fp32_grad_accumulation), "one fp32 gradient copy, not two"
    if not (kernels.fp32_gradients and precision == "bf16"):
        return PAPER_BYTES[precision]
    if zero in (1, 2) or (kernels.main_grad_buffer and zero == 0):
        return BF16, FP32, FP32 + ADAM_MOMENTS * FP32
    return PAPER_BYTES["fp32"]


def zero_group(layout: Layout) -> tuple[int, int]:
    """(ranks, stride between neighbours in global ranks) of the group ZeRO shards over: the dp and cp
    ranks together, those of one replica group under hybrid sharding (``Layout.zero_dim``),
    as Megatron-LM's distributed optimizer and torchtitan's FSDP2 shard. Mesh order pp, dp, cp, tp:
    the group's neighbours are tp apart."""
    return layout.dp_shard * layout.cp, layout.tp


def checkpoint_workspace_bytes(spec: ModelSpec, layout: Layout, layers: int, first: bool, last: bool) -> int:
    """What a rank holds beside its state while torch.distributed.checkpoint loads it (and, at most,
    saves it) on the host: two of its largest tensors in fp32, an item read from the file and the copy
    narrowed into its place. The tensors as ``rank_tensor_shapes`` lays them out, their rows sharded
    over ZeRO's group under ZeRO-3; the optimizer's moments are never larger than their parameter."""
    shards = zero_group(layout)[0] if layout.zero == 3 else 1
    shapes = rank_tensor_shapes(spec, layers, first, last, layout.tp, layout.pp)
    return 2 * FP32 * max(-(-rows // shards) * columns for rows, columns in shapes)


def communicated_bytes(layout: Layout, precision: str, kernels: Kernels) -> tuple[int, int]:
    """Bytes per element of (gradients reduced, parameters gathered) by the data-parallel collectives.

    plait under bf16 keeps fp32 weights and gradients at ZeRO 0 (autocast); ZeRO 1–2 cast the
    weights to bf16 (``holds_bf16_weights``); ZeRO-3's FSDP2 gathers bf16 weights (fp32 on a
    pipeline stage) and reduce-scatters fp32 gradients (its MixedPrecisionPolicy in
    plait.parallel.data_parallel.data). A reference
    stack gathers the ZeRO paper's bf16 parameters and reduces its gradients as it holds them
    (``reference_bytes``: fp32 in Megatron-LM and torchtitan's FSDP). ``--grad-compression bf16`` puts
    every gradient on the wire in bf16; PowerSGD's factors travel in the gradients' own dtype
    (``reduced_gradient_elements`` counts them).
    """
    if not kernels.plait_engine:
        params, grads = PAPER_BYTES[precision][0], reference_bytes(precision, layout.zero, kernels)[1]
    elif precision == "fp32":
        grads, params = FP32, FP32
    elif layout.zero == 3:
        grads, params = FP32, (BF16 if layout.pp == 1 else FP32)  # a pipeline stage gathers fp32
    else:
        grads, params = (BF16, BF16) if holds_bf16_weights(precision, layout.zero) else (FP32, FP32)
    return (min(grads, BF16) if layout.grad_compression == "bf16" else grads), params


def held_gradient_bytes(layout: Layout, precision: str) -> int:
    """Bytes per element of the gradients a rank holds after the data-parallel reduction, which
    ZeRO-2's replica groups (hybrid sharding) average after backward: ZeRO-2's rows in
    fp32, else the gradients' own dtype (bf16 over ZeRO-1's bf16 weights, fp32 under autocast and
    in FSDP2's shards), uncompressed: --grad-compression is the dp·cp reduction's wire only, and
    FSDP2 widens its reduced shards back to fp32."""
    return BF16 if layout.zero != 2 and holds_bf16_weights(precision, layout.zero) else FP32


def reduction_rounds(layout: Layout) -> int:
    """How many times a step plait's hooks reduce the data-parallel gradients: ZeRO-2 without
    pipeline stages every micro-batch's, into fp32 rows (plait.parallel.gradients); every other
    ZeRO-0/1/2 layout once, after the last micro-batch (ZeRO-3's FSDP2 gathers and reduces layer by
    layer: plait.facts.step_volumes counts it)."""
    return layout.microbatches if layout.zero == 2 and layout.pp == 1 else 1


# PowerSGD (Vogels et al. 2019) as plait runs it through torch's powerSGD_hook: each gradient viewed
# as a (rows, everything else) matrix is sent as two rank-r factors, P (rows × r) and Q (cols × r),
# when that is at least MIN_COMPRESSION_RATE times smaller (torch's default); vectors and small
# matrices go whole. The first POWERSGD_START_STEP steps all-reduce uncompressed (torch's advice:
# no earlier than the learning-rate warm-up, plait's default 20 steps). Rank 8: on ``tiny`` at dp 2,
# 200 steps, rank 4 ended 2-4% above the uncompressed loss, rank 8 within 0.3% (rank 16 no closer);
# it still moves 10 times fewer bytes there, 66 times fewer on GPT-2.
POWERSGD_RANK = 8
POWERSGD_MIN_COMPRESSION_RATE = 2
POWERSGD_START_STEP = 20


def powersgd_elements(shapes: list[tuple[int, int]], rank: int = POWERSGD_RANK) -> tuple[int, int, int]:
    """Elements PowerSGD all-reduces per step for gradients of these (rows, cols), in its three
    all-reduces: (tensors sent whole, the P factors, the Q factors)."""
    whole = p = q = 0
    for rows, cols in shapes:
        r = min(rows, cols, rank)
        if (rows + cols) * r * POWERSGD_MIN_COMPRESSION_RATE < rows * cols:
            p, q = p + rows * r, q + cols * r
        else:
            whole += rows * cols
    return whole, p, q


def reduced_gradient_elements(spec: ModelSpec, layout: Layout, parameters: float) -> float:
    """Gradient elements one rank hands the data-parallel reduction per step (after PowerSGD's
    start), of ``parameters`` it holds: all of them, or under PowerSGD (which runs only where the
    rank holds the whole model: no tp, no pp) its factors plus the tensors it sends whole."""
    if layout.grad_compression != "powersgd":
        return parameters
    return sum(powersgd_elements(rank_tensor_shapes(spec, spec.layers, True, True, 1, 1)))
