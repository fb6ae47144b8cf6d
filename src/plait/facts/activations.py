"""Activation bytes one transformer layer keeps for backward, per rank and micro-batch.

Two accountings, one home. ``saved_bytes_per_layer`` is exactly what plait's own model and
kernels keep (tests measure it in real steps). ``activation_bytes_per_layer`` follows Korthikanti
et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4) for the fused
kernels of reference stacks: one layer stores sbh(34 + 5as/h) bytes with 16-bit activations and
1-byte dropout masks, term by term below so that each term can be sharded by what shards it and
the model's own shapes can replace GPT's: kv_heads for grouped-query attention, ffn_hidden for
the MLP width, SwiGLU's four saved MLP tensors instead of GELU's two. RoPE rotates Q and K in
place of the unrotated ones and saves no tensor of its own. Flash attention keeps only the
softmax's fp32 log-sum-exp instead of the s² score matrices.
"""

from __future__ import annotations

from plait.facts.stack import Kernels
from plait.models.spec import ModelSpec

ACTIVATION_BYTES = {"bf16": 2, "fp32": 4}
MASK_BYTES = 1
FP32 = 4


def kv_heads_per_rank(spec: ModelSpec, tp: int) -> int:
    """Key/value heads on one tensor-parallel rank: sharded, or replicated when tp exceeds them."""
    return max(spec.kv_heads // tp, 1)


def activation_bytes_per_layer(
    spec: ModelSpec,
    micro_batch: int,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    recompute: str = "none",
    precision: str = "bf16",
    kernels: Kernels = Kernels(),
) -> float:
    """Activation bytes one transformer layer keeps for one micro-batch on one rank."""
    e = ACTIVATION_BYTES[precision]
    s = spec.seq_len // cp
    tokens = s * micro_batch
    h, f = spec.hidden, spec.ffn_hidden
    # Tensors of the full hidden width that tensor parallelism replicates unless sequence
    # parallelism splits them: the layer input, the two norm outputs, the two dropout masks.
    replicated_split = tp if sp else 1
    if recompute == "full":
        return tokens * h * e / replicated_split
    replicated = tokens * h * 4 * e  # the two norm inputs, the QKV input and the MLP input
    if kernels.dropout:
        replicated += 2 * tokens * h * MASK_BYTES
    kv = kv_heads_per_rank(spec, tp) * spec.head_dim
    sharded = tokens * e * (h / tp + 2 * kv + h / tp)  # Q, K, V, attention output
    mlp_saved = 4 if spec.gated_mlp else 2  # SwiGLU: gate, up, silu(gate), product; GELU: in, out
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


def head_activation_bytes(spec: ModelSpec, micro_batch: int, tp: int, sp: bool, cp: int, precision: str) -> float:
    """The last stage's extra activations: final-norm input, head input and fp32 logits."""
    tokens = spec.seq_len // cp * micro_batch
    e = ACTIVATION_BYTES[precision]
    return 2 * tokens * spec.hidden * e / (tp if sp else 1) + tokens * spec.vocab * 4 / tp


def saved_bytes_per_layer(spec: ModelSpec, batch: int, seq: int, tp: int = 1, sp: bool = False,
                          cp: int = 1, recompute: str = "none") -> dict[str, int]:
    """Bytes one layer keeps for backward, by region, as plait's fp32 model and kernels keep them.

    Korthikanti et al. 2022 count sbh(10 + 24/t + 5as/ht) bytes (half precision, dropout, attention
    scores kept); here, in fp32, without dropout, with a fused attention kernel that keeps one
    softmax statistic per query instead of the scores:
    - norms (replicated over tp; divided by tp under sp): LayerNorm keeps its input, mean and rstd;
      RMSNorm its input, the normalised input and rstd;
    - linear inputs: the norms' outputs that wq/wk/wv and w1(/w3) read, whole on every rank even
      under sp (DTensor keeps the all-gathered copy; Megatron keeps the shard and gathers again);
    - attention (sharded over tp): q, k, v (grouped-query k, v expanded to the query heads), the
      output, one log-sum-exp per head and query, and a copy of the output re-laid for wo when the
      kernel returns it head-major (Llama, whose rotary q is head-major, or cp) with >1 head a rank;
    - MLP (sharded): GELU input and output; SwiGLU w1, silu(w1), w3 outputs and their product;
    - rotary tables (Llama): cos and sin of the positions, s·head_dim/2 each.

    ``selective`` recomputation keeps the attention core's inputs q, k, v instead of its output
    and statistics (its output survives only as wo's input, relaid or not); ``full`` keeps just
    the block's input, the residual stream (a sequence shard under sp). The rotary tables a
    recomputed block reads stay alive through its arguments, once for all blocks, unsaved.
    """
    s, b, h, f = seq // cp, batch, spec.hidden, spec.ffn_hidden
    heads = spec.heads // tp
    sbh = s * b * h
    if recompute == "full":
        return {"block_input": (sbh // tp if sp else sbh) * FP32}
    if spec.family == "gpt2":
        norms = 2 * (sbh + 2 * s * b)
    else:
        norms = 2 * (2 * sbh + s * b)
    relaid = (spec.family == "llama" or cp > 1) and heads > 1
    attention = (4 + relaid) * sbh // tp + heads * s * b
    if recompute == "selective":
        attention = 4 * sbh // tp  # q, k, v kept for the recomputation, and wo's input
    mlp = (4 if spec.gated_mlp else 2) * s * b * f // tp
    regions = {
        "norms": norms // tp if sp else norms,
        "linear_inputs": 2 * sbh,
        "attention": attention,
        "mlp": mlp,
        "rotary": 0 if spec.learned_positions else s * spec.head_dim,
    }
    return {name: count * FP32 for name, count in regions.items()}
