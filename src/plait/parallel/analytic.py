"""Per-layer costs of tensor, sequence and context parallelism, worked out on paper.

Pure Python: the planner may import it. ``batch`` sequences of ``seq`` tokens go through one
layer on each rank; tensors are fp32 (4 bytes). Tests measure the same quantities in a real step
(``plait.observe.collectives``, ``plait.observe.saved_activations``) and require equality.
"""

from __future__ import annotations

from plait.models.flops import layer_parameter_count, norm_parameter_count
from plait.models.spec import ModelSpec

FP32 = 4


def collective_bytes_per_layer(spec: ModelSpec, batch: int, seq: int, tp: int = 1, sp: bool = False,
                               cp: int = 1, recompute: str = "none") -> dict[str, int]:
    """Bytes each rank hands each collective per layer and step (forward, backward, gradient sync).

    An all-gather is handed a shard, an all-reduce or reduce-scatter the whole tensor.
    Recomputation issues the recomputed forward's collectives again in backward, up to the last
    tensor backward needs (PyTorch's checkpoint stops there): under ``full`` every one but the
    MLP's closing all-reduce or reduce-scatter; under ``selective`` context parallelism's exchange
    of q, k and v (the output's comes after the attention kernel's last saved tensor).
    """
    stream = batch * (seq // cp) * spec.hidden * FP32  # the residual stream this rank holds, whole over tp
    volumes: dict[str, int] = {}

    def add(name: str, count: int) -> None:
        if count:
            volumes[name] = volumes.get(name, 0) + count

    full = recompute == "full"
    if tp > 1 and sp:
        # forward: all-gather before attention and MLP, reduce-scatter after wo and w2; backward: mirrored
        add("all_gather", (4 + 2 * full) * stream // tp)
        add("reduce_scatter", (4 + full) * stream)
        # the norms' replicated weights (and biases) saw only a sequence shard: their gradients are summed
        add("all_reduce", 2 * norm_parameter_count(spec) * FP32)
    elif tp > 1:
        # forward: all-reduce after wo and w2; backward: all-reduce of the input gradient of attention and MLP
        add("all_reduce", (4 + full) * stream)
    if tp > 1 and spec.kv_heads % tp:
        # kv-heads replicated over tp: the whole wk and wv gradients (and biases) are summed over tp
        add("all_reduce", 2 * spec.kv_dim * (spec.hidden + (1 if spec.has_bias else 0)) * FP32)
    if cp > 1:
        # q, k, v (grouped-query k, v expanded to the query heads) and the output, forward and backward
        again = {"none": 0, "selective": 3, "full": 4}[recompute]
        add("all_to_all", (8 + again) * stream // tp)
        # gradients averaged over cp: this rank's share of the layer's parameters
        add("all_reduce", _local_layer_parameters(spec, tp) * FP32)
    return volumes


def _local_layer_parameters(spec: ModelSpec, tp: int) -> int:
    """Parameters of one block that a tp rank holds: sharded matrices, replicated norms and row biases."""
    if tp == 1:
        return layer_parameter_count(spec)
    h, f = spec.hidden, spec.ffn_hidden
    kv_local = spec.kv_dim // tp if spec.kv_heads % tp == 0 else spec.kv_dim
    bias = spec.has_bias
    attention = 2 * h * h // tp + 2 * h * kv_local + (h // tp + 2 * kv_local + h if bias else 0)
    mlp = (3 if spec.gated_mlp else 2) * h * f // tp + (f // tp + h if bias else 0)
    return attention + mlp + 2 * norm_parameter_count(spec)


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
