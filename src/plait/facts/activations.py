"""Activation bytes one transformer layer keeps for backward, per rank and micro-batch.

One entry point, ``activation_bytes_per_layer``, dispatching on the stack. For plait's own
kernels (``Kernels.plait_engine``: ``facts.stack.STACKS["plait"]``) it is ``saved_bytes_per_layer``,
exactly what plait's model keeps in fp32 and under bf16 autocast (tests measure it in real
steps). For reference stacks it is ``korthikanti_bytes_per_layer``, after Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", §4) for fused kernels: one layer
stores sbh(34 + 5as/h) bytes with 16-bit activations and 1-byte dropout masks, term by term below
so that each term can be sharded by what shards it and the model's own shapes can replace GPT's:
kv_heads for grouped-query attention, ffn_hidden for the MLP width, SwiGLU's four saved MLP
tensors instead of GELU's two. RoPE rotates Q and K in place of the unrotated ones and saves no
tensor of its own. Flash attention keeps only the softmax's fp32 log-sum-exp instead of the s²
score matrices.
"""

from __future__ import annotations

from plait.facts.model_state import padded_vocab
from plait.facts.stack import DEFAULT_STACK, STACKS, Kernels
from plait.layout import ZIGZAG_ALGORITHMS, Layout
from plait.models.flops import block_norms, kept_linears, kv_heads_per_rank, linear_shapes
from plait.models.spec import ModelSpec

ACTIVATION_BYTES = {"bf16": 2, "fp32": 4}
MASK_BYTES = 1
FP32 = 4
BF16 = 2


def activation_bytes_per_layer(spec: ModelSpec, layout: Layout, micro_batch: int, precision: str = "bf16",
                               kernels: Kernels = STACKS[DEFAULT_STACK]) -> float:
    """Activation bytes one transformer layer keeps for one micro-batch on one rank, on ``kernels``' stack.

    Of ``layout`` it reads tp, sp, cp, the recomputation and the cp algorithm, and, for plait's own
    kernels (``plait_engine``), the ZeRO stage and pp, which decide whether bf16 autocast keeps bf16
    copies of the layer's weights (``saved_bytes_per_layer``). A reference stack: Korthikanti et al.'s
    count (``korthikanti_bytes_per_layer``).
    """
    if kernels.plait_engine:
        return sum(saved_bytes_per_layer(spec, layout, micro_batch, precision).values())
    return korthikanti_bytes_per_layer(spec, layout, micro_batch, precision, kernels)


def recompute_working_bytes(spec: ModelSpec, layout: Layout, micro_batch: int, precision: str = "bf16",
                            kernels: Kernels = STACKS[DEFAULT_STACK]) -> float:
    """What one recomputed block holds beyond what it kept while its backward runs: its replayed
    forward brings back every tensor a block without recomputation saves. Nothing without
    recomputation."""
    if layout.recompute == "none":
        return 0.0
    kept = activation_bytes_per_layer(spec, layout, micro_batch, precision, kernels)
    whole = activation_bytes_per_layer(spec, layout.with_recompute("none"), micro_batch, precision, kernels)
    return max(0.0, whole - kept)


def replayed_block_bytes(working: float, splits_backward: bool, kept_in_every_chunk: bool, last_chunk_alone: bool,
                         freed_before_blocks: float) -> float:
    """What a rank's peak gains from the block its backward replays (``working``,
    ``recompute_working_bytes``), one block at a time beside everything else held. Nothing where every
    chunk of the rank keeps a block (partial recomputation keeps a chunk's last blocks, whose backward
    runs first and frees more); on a rank holding the last chunk alone, only what exceeds the head's
    and the loss's bytes (``freed_before_blocks``), freed before any block's backward. A schedule that
    ``splits_backward`` (zb-h1) keeps each graph until its weight pass, so there every byte of it counts."""
    if splits_backward:
        return working
    if kept_in_every_chunk:
        return 0.0
    if last_chunk_alone:
        return max(0.0, working - freed_before_blocks)
    return working


def held_between_passes(saved: float, offload: bool) -> float:
    """What a block's ``saved`` bytes hold on the device from its forward to its backward: all of
    them, or none under activation offload (plait.parallel.offload), where they wait in host memory.
    The one block running still has its own on the device (plait.plan.memory.other_bytes): its
    forward keeps what it copied out until it returns, and its backward brings them back."""
    return 0.0 if offload else saved


def korthikanti_bytes_per_layer(spec: ModelSpec, layout: Layout, micro_batch: int, precision: str = "bf16",
                                kernels: Kernels = Kernels()) -> float:
    """Korthikanti et al.'s activation bytes of one layer, one micro-batch, one rank, on fused kernels;
    under ``op`` what torchtitan's per-operation policy keeps (``op_recompute_bytes``: its ring
    context parallelism dispatches the attention kernel, which is kept, and exchanges no heads)."""
    tp, sp, cp, recompute = layout.tp, layout.sp, layout.cp, layout.recompute
    e = ACTIVATION_BYTES[precision]
    s = spec.seq_len // cp
    tokens = s * micro_batch
    h, f = spec.hidden, spec.ffn_hidden
    # Tensors of the full hidden width that tensor parallelism replicates unless sequence
    # parallelism splits them: the layer input, the two norm outputs, the two dropout masks.
    replicated_split = tp if sp else 1
    if recompute == "full":
        return tokens * h * e / replicated_split
    if recompute == "op":
        return sum(op_recompute_bytes(spec, layout, tokens, e, tokens * h * e // replicated_split, kernels).values())
    # The norm inputs, the QKV input and the MLP input: four, or two where one norm feeds both side by side.
    replicated = tokens * h * 2 * block_norms(spec) * e
    if kernels.dropout:
        replicated += 2 * tokens * h * MASK_BYTES
    kv = kv_heads_per_rank(spec, tp) * spec.head_dim
    sharded = tokens * e * (h / tp + 2 * kv + h / tp)  # Q, K, V, attention output
    # GELU: its input and output. SwiGLU as the fused stacks run it (Megatron-LM's bias_swiglu, Transformer
    # Engine): the fused gate-and-up output (2f), from which backward recomputes silu, and the product
    # that the down projection keeps (f); plait's eager engine keeps four (``saved_bytes_per_layer``).
    mlp_saved = (3 if kernels.fused else 4) if spec.gated_mlp else 2
    sharded += tokens * e * mlp_saved * f / tp
    attention_core = 0.0
    if recompute == "none":
        heads = spec.heads / tp
        if kernels.flash_attention:
            attention_core = tokens * heads * 4  # fp32 log-sum-exp per query and head
        else:
            scores = heads * s * spec.seq_len * micro_batch  # local queries × all keys
            attention_core = scores * e  # softmax output
            if kernels.dropout:
                attention_core += scores * (MASK_BYTES + e)  # dropout mask and output
    return replicated / replicated_split + sharded + attention_core


def _logit_elements(spec: ModelSpec, micro_batch: int, tp: int, cp: int) -> float:
    """One micro-batch's logits on a rank: its tokens by its share of the (padded) vocabulary."""
    return spec.seq_len // cp * micro_batch * padded_vocab(spec.vocab, tp) / tp


def head_activation_bytes(spec: ModelSpec, micro_batch: int, tp: int, sp: bool, cp: int, precision: str,
                          kernels: Kernels) -> float:
    """The last stage's extra activations: final-norm input, head input and what the loss keeps for
    its backward (fp32 log-probabilities, or plait's gradient in the logits' dtype, ``Kernels.fused_loss``)."""
    tokens = spec.seq_len // cp * micro_batch
    e = ACTIVATION_BYTES[precision]
    kept = e if kernels.fused_loss else FP32
    return 2 * tokens * spec.hidden * e / (tp if sp else 1) + _logit_elements(spec, micro_batch, tp, cp) * kept


def loss_backward_bytes(spec: ModelSpec, micro_batch: int, tp: int, cp: int, kernels: Kernels,
                        precision: str) -> float:
    """What the last stage's loss holds for a moment beside its activations, one micro-batch's:
    ``kernels``' fp32 copies of the logits' width (``Kernels.loss_backward_copies``), or plait's one
    tensor of the logits' dtype (``Kernels.fused_loss``)."""
    width = ACTIVATION_BYTES[precision] if kernels.fused_loss else 0
    return (kernels.loss_backward_copies * FP32 + width) * _logit_elements(spec, micro_batch, tp, cp)


def autocast_copies_weights(precision: str, zero: int = 0, pp: int = 1) -> bool:
    """Whether bf16 runs as autocast over fp32 weights, which keeps a bf16 copy of each layer weight
    per micro-batch: ZeRO 0, and ZeRO-3 on a pipeline stage (which gathers fp32 weights:
    plait.parallel.data_parallel.stage_sharding). Otherwise (ZeRO 1 and 2, whose weights are bf16 with or without
    stages, ``holds_bf16_weights``; ZeRO-3 without stages, whose FSDP2 gathers bf16 weights, casts
    the inputs to bf16 and frees the gathered weights after each block) the whole layer runs in bf16
    and keeps no copy."""
    return precision == "bf16" and (zero == 0 or zero == 3 and pp > 1)


def residual_stream_bytes(precision: str, zero: int, pp: int, kernels: Kernels) -> int:
    """Bytes of a value of the residual stream, which the norms and the column-parallel linears read:
    on plait's engine fp32 under bf16 autocast over fp32 weights (``autocast_copies_weights``), else
    the activations' precision (bf16 weights run the whole layer in bf16); a reference stack's in
    the activations' precision."""
    if kernels.plait_engine and autocast_copies_weights(precision, zero, pp):
        return FP32
    return ACTIVATION_BYTES[precision]


def layer_weight_elements(spec: ModelSpec, tp: int) -> int:
    """Elements of the weight matrices one tensor-parallel rank of a layer multiplies by: its shards,
    and under kv-heads fewer than tp the rows of its own kv-head of the replicated wk and wv."""
    return sum(inputs * outputs for inputs, outputs in linear_shapes(spec, tp).values())


def op_keeps_attention(kernels: Kernels, cp: int, cp_algorithm: str) -> bool:
    """Whether ``--recompute op`` keeps the attention's output: where attention is one kernel, which
    the policy keeps; plait's ring and all-gather run many (a block per rank), which the replay runs
    again."""
    return not (kernels.plait_engine and cp > 1 and cp_algorithm in ZIGZAG_ALGORITHMS)


def op_recompute_bytes(spec: ModelSpec, layout: Layout, tokens: int, e: int, input_bytes: int,
                       kernels: Kernels) -> dict[str, int]:
    """What ``--recompute op`` keeps of one layer (plait.parallel.recompute's policy, torchtitan's) of
    ``tokens`` tokens, ``e`` bytes a value: the block's input (``input_bytes``); the outputs of the
    matmuls it keeps (plait.models.flops.kept_linears), each its rank's width; the attention kernel's
    output and fp32 log-sum-exp when attention is one kernel (``op_keeps_attention``; plait's ring and
    all-gather run many, all recomputed); under plait's all-to-all context parallelism the head
    exchange's four results (q, k and v expanded to the query heads, and the output; a reference
    stack's ring dispatches the attention kernel and exchanges no heads); and sequence parallelism's
    two reduce-scatter results."""
    tp, sp, cp = layout.tp, layout.sp, layout.cp
    kernel_attention = op_keeps_attention(kernels, cp, layout.cp_algorithm)
    cp_exchanges = kernels.plait_engine and layout.cp_algorithm == "all-to-all"
    shapes = linear_shapes(spec, tp)
    stream = tokens * spec.hidden // tp  # one rank's share of a hidden-width tensor
    heads = spec.heads // tp
    return {
        "block_input": input_bytes,
        "kept_matmuls": tokens * sum(shapes[name][1] for name in kept_linears(spec)) * e,
        "attention": stream * e + heads * tokens * FP32 if kernel_attention else 0,
        "exchanges": 4 * stream * e if cp > 1 and cp_exchanges else 0,
        "reduce_scatters": 2 * stream * e if tp > 1 and sp else 0,
    }


def saved_bytes_per_layer(spec: ModelSpec, layout: Layout, micro_batch: int, precision: str = "fp32") -> dict[str, int]:
    """Bytes one layer keeps for backward, by region, as plait's model and kernels keep them, for one
    micro-batch of ``micro_batch`` sequences on a rank of ``layout``.

    Korthikanti et al. 2022 count sbh(10 + 24/t + 5as/ht) bytes (half precision, dropout, attention
    scores kept); here, without dropout, with a fused attention kernel that keeps one softmax
    statistic per query instead of the scores:
    - norms (two a block, one with ``parallel_block``; replicated over tp; divided by tp under sp),
      in the residual stream's dtype, outside autocast (plait.models.transformer.make_norm): fp32
      under autocast over fp32 weights; LayerNorm keeps its input, mean and rstd; RMSNorm its input,
      the normalised input and rstd;
    - linear inputs: the norms' outputs that wq/wk/wv and w1(/w3) read, whole on every rank even
      under sp (DTensor keeps the all-gathered copy; Megatron keeps the shard and gathers again).
      fp32: one per norm (a parallel block's one norm feeds both, but under sp attention and MLP
      each gather their own copy). bf16: autocast casts the input once per linear, so one bf16 copy
      per linear that reads it (3 for attention, 1 or 2 for the MLP);
    - attention (sharded over tp), in the activation precision: q, k, v (grouped-query k, v
      expanded to the query heads, save under ring context parallelism, which keeps their kv-heads,
      and all-gather, which keeps every rank's kv-heads),
      the output, a copy of the output re-laid for wo when the kernel returns it head-major (Llama,
      whose rotary q is head-major, or cp) with >1 head a rank; and one fp32 log-sum-exp per head
      and query;
    - MLP (sharded), in the activation precision: GELU input and output; SwiGLU w1, silu(w1), w3
      outputs and their product;
    - rotary tables (Llama), fp32: cos and sin of the positions, s·head_dim/2 each;
    - weights (bf16 autocast over fp32 weights, ``autocast_copies_weights``: ZeRO 0, and ZeRO-3 on
      a pipeline stage): the bf16 copy of every weight matrix each linear multiplies by
      (``layer_weight_elements``).

    bf16 without weight copies (bf16 weights: ZeRO 1–2, and ZeRO-3 without stages) runs the whole
    layer in bf16: the fp32 layout at 2 bytes a value, residual stream and block input included, save
    the fp32 log-sum-exp, the rotary tables (buffers stay fp32) and RMSNorm, which works on an fp32
    copy of its input (LayerNorm stays in bf16). Under ZeRO-3 without stages
    FSDP2's mixed precision casts the block's inputs to bf16, the rotary tables
    among them.

    ``selective`` recomputation keeps the attention core's inputs q, k, v (k, v with their kv-heads:
    the core expands them) instead of its output and statistics (its output survives only as wo's
    input, relaid or not); ``full`` keeps just
    the block's input, the fp32 residual stream (a sequence shard under sp). The rotary tables a
    recomputed block reads stay alive through its arguments, once for all blocks, unsaved.
    """
    tp, sp, cp, recompute, cp_algorithm = layout.tp, layout.sp, layout.cp, layout.recompute, layout.cp_algorithm
    e = ACTIVATION_BYTES[precision]
    autocast = autocast_copies_weights(precision, layout.zero, layout.pp)
    fsdp_inputs = layout.zero == 3 and layout.pp == 1
    stream = FP32 if precision == "fp32" or autocast else BF16  # residual stream and norms
    s, b, h, f = spec.seq_len // cp, micro_batch, spec.hidden, spec.ffn_hidden
    heads = spec.heads // tp
    sbh = s * b * h
    block_input = (sbh // tp if sp else sbh) * stream
    if recompute == "full":
        return {"block_input": block_input}
    if recompute == "op":
        return op_recompute_bytes(spec, layout, s * b, e, block_input, STACKS["plait"])
    layernorm = spec.norm_kind == "layernorm"
    norms = block_norms(spec) * ((sbh + 2 * s * b) if layernorm else (2 * sbh + s * b))
    relaid = (spec.rotary_positions or cp > 1) and heads > 1
    kv = s * b * kv_heads_per_rank(spec, tp) * spec.head_dim  # one of k, v with its kv-heads
    # the kernel's k, v: expanded to the query heads (all-to-all), this rank's kv-heads (ring) or
    # every rank's (all-gather)
    kept_kv = {"ring": kv, "all-gather": cp * kv}.get(cp_algorithm, sbh // tp) if cp > 1 else sbh // tp
    attention = ((2 + relaid) * sbh // tp + 2 * kept_kv) * e + heads * s * b * FP32
    if recompute == "selective":
        attention = (2 * sbh // tp + 2 * kv) * e  # q, k, v kept for the recomputation, and wo's input
    # fp32 or bf16 weights: one per norm output, or, side by side, the one both read (each module's
    # own all-gathered copy under sp)
    readers = 3 + (2 if spec.gated_mlp else 1) if autocast else (2 if sp else block_norms(spec))
    return {
        "norms": (norms // tp if sp else norms) * (stream if layernorm else FP32),
        "linear_inputs": readers * sbh * e,
        "attention": attention,
        "mlp": (4 if spec.gated_mlp else 2) * s * b * f // tp * e,
        "rotary": 0 if spec.learned_positions else s * spec.head_dim * (BF16 if fsdp_inputs and precision == "bf16" else FP32),
        "weights": layer_weight_elements(spec, tp) * BF16 if autocast else 0,
    }
