"""Exact parameter counts and FLOPs, from the spec alone.

Pure Python, shared by training (MFU) and the planner. FLOPs follow torch.utils.flop_counter's
conventions so the two can be compared exactly: a multiply-add is 2 FLOPs, bias adds, norms,
activations and softmax are free, and attention is counted over the full s×s score matrix
(causal masking is not subtracted). Attention's backward is 2.5× its forward, as flash-style
kernels recompute the scores.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.models.spec import ModelSpec

RECOMPUTE_MODES = ("none", "selective", "op", "full")


def norm_parameter_count(spec: ModelSpec) -> int:
    return norm_tensor_count(spec) * spec.hidden


def attention_parameter_count(spec: ModelSpec) -> int:
    weights = 2 * spec.hidden * spec.hidden + 2 * spec.hidden * spec.kv_dim
    biases = 2 * spec.hidden + 2 * spec.kv_dim if spec.has_bias else 0
    return weights + biases


def mlp_parameter_count(spec: ModelSpec) -> int:
    """w1 and w2 (and the gate w3), with biases on w1 and w2: the gate has none."""
    biases = spec.ffn_hidden + spec.hidden if spec.has_bias else 0
    return (3 if spec.gated_mlp else 2) * spec.hidden * spec.ffn_hidden + biases


def linear_shares(spec: ModelSpec) -> tuple[float, ...]:
    """Each of a block's linears' share of its weights, in forward order: the q/k/v projection, the
    output projection, the MLP's input (with its gate) and output projections."""
    size = {name: rows * columns for name, (rows, columns) in linear_shapes(spec).items()}
    weights = (size["wq"] + size["wk"] + size["wv"], size["wo"], size["w1"] + size.get("w3", 0), size["w2"])
    return tuple(w / sum(weights) for w in weights)


def neighbour_share(spec: ModelSpec) -> float:
    """The largest share of a block's weights two neighbouring linears hold (the block's last and the
    next block's first are neighbours too)."""
    shares = linear_shares(spec)
    return max(a + b for a, b in zip(shares, shares[1:] + shares[:1]))


def block_norms(spec: ModelSpec) -> int:
    """Norms of one block: one before attention and one before the MLP, or one they share."""
    return 1 if spec.parallel_block else 2


def layer_parameter_count(spec: ModelSpec) -> int:
    """Parameters of one transformer block (its norms, attention, MLP)."""
    return block_norms(spec) * norm_parameter_count(spec) + attention_parameter_count(spec) + mlp_parameter_count(spec)


def embedding_parameter_count(spec: ModelSpec) -> int:
    """Token (and learned position) embeddings, held by the first pipeline stage."""
    positions = spec.seq_len * spec.hidden if spec.learned_positions else 0
    return spec.vocab * spec.hidden + positions


def head_parameter_count(spec: ModelSpec) -> int:
    """Final norm and output projection (none of its own when tied), held by the last stage."""
    return norm_parameter_count(spec) + (0 if spec.tie_embeddings else spec.vocab * spec.hidden)


def layer_tensor_count(spec: ModelSpec) -> int:
    """Parameter tensors of one block: what per-tensor work (optimizer, clipping) loops over."""
    bias = 1 if spec.has_bias else 0
    attention = 4 * (1 + bias)  # q, k, v, o
    mlp = (3 if spec.gated_mlp else 2) + 2 * bias  # w1, w2 (and w3); biases on w1 and w2
    return block_norms(spec) * norm_tensor_count(spec) + attention + mlp


def norm_tensor_count(spec: ModelSpec) -> int:
    return 2 if spec.norm_kind == "layernorm" else 1  # LayerNorm's weight and bias, or RMSNorm's weight


def embedding_tensor_count(spec: ModelSpec) -> int:
    return 2 if spec.learned_positions else 1


def head_tensor_count(spec: ModelSpec) -> int:
    return norm_tensor_count(spec) + (0 if spec.tie_embeddings else 1)


def parameter_count(spec: ModelSpec) -> int:
    """Every parameter of the model, counting a tied embedding once."""
    return embedding_parameter_count(spec) + spec.layers * layer_parameter_count(spec) + head_parameter_count(spec)


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one sequence through the model: forward, backward and recomputation."""

    forward: int
    backward: int
    recompute: int

    @property
    def model(self) -> int:
        """Forward plus backward: the FLOPs MFU counts (recomputation excluded)."""
        return self.forward + self.backward

    @property
    def hardware(self) -> int:
        """Everything the device executes, recomputation included."""
        return self.forward + self.backward + self.recompute


def kv_heads_whole(spec: ModelSpec, tp: int) -> bool:
    """Whether every tensor-parallel rank holds wk and wv whole: tp does not split the kv-heads evenly
    (fewer of them than tp ranks), so each rank keeps them all and slices the head its queries read."""
    return tp > 1 and spec.kv_heads % tp != 0


def kv_heads_per_rank(spec: ModelSpec, tp: int) -> int:
    """Key/value heads on one tensor-parallel rank: sharded, or replicated when tp exceeds them."""
    return max(spec.kv_heads // tp, 1)


def block_linears(spec: ModelSpec) -> tuple[str, ...]:
    """A block's weight matmuls in the order its forward runs them (plait.models.transformer)."""
    return ("wq", "wk", "wv", "wo", "w1") + (("w3",) if spec.gated_mlp else ()) + ("w2",)


def kept_linears(spec: ModelSpec) -> tuple[str, ...]:
    """The matmuls whose outputs ``--recompute op`` keeps (plait.parallel.recompute's policy,
    torchtitan's): the 1st, 3rd, ... of the block."""
    return block_linears(spec)[::2]


def recomputed_linears(spec: ModelSpec) -> tuple[str, ...]:
    """The matmuls ``--recompute op`` runs again in backward: the 2nd, 4th, ... of the block, but
    for a closing w2 (GELU's sixth): its output feeds only the residual add, which keeps nothing,
    and torch's replay stops at the last tensor backward needs."""
    return tuple(name for name in block_linears(spec)[1::2] if name != "w2")


def linear_shapes(spec: ModelSpec, tp: int = 1) -> dict[str, tuple[int, int]]:
    """(input, output) width of each of a block's weight matmuls on one tensor-parallel rank: the
    column-parallel ones split their output, the row-parallel ones (wo, w2) their input, and their
    output is a whole-width partial sum until reduced."""
    h, f = spec.hidden, spec.ffn_hidden
    kv = kv_heads_per_rank(spec, tp) * spec.head_dim
    shapes = {"wq": (h, h // tp), "wk": (h, kv), "wv": (h, kv), "wo": (h // tp, h), "w1": (h, f // tp), "w2": (f // tp, h)}
    if spec.gated_mlp:
        shapes["w3"] = (h, f // tp)
    return shapes


def layer_matmul_forward_flops(spec: ModelSpec, seq_len: int) -> int:
    """Forward FLOPs of one block's weight matmuls for one sequence."""
    attention = 2 * spec.hidden * spec.hidden + 2 * spec.hidden * spec.kv_dim
    mlp = (3 if spec.gated_mlp else 2) * spec.hidden * spec.ffn_hidden
    return 2 * seq_len * (attention + mlp)


def attention_core_forward_flops(spec: ModelSpec, seq_len: int) -> int:
    """Forward FLOPs of softmax(QKᵀ)V in one block for one sequence (two batched matmuls)."""
    return 2 * 2 * seq_len * seq_len * spec.hidden


def head_forward_flops(spec: ModelSpec, seq_len: int) -> int:
    """Forward FLOPs of the output projection to the vocabulary for one sequence."""
    return 2 * seq_len * spec.hidden * spec.vocab


def layer_flops(spec: ModelSpec, seq_len: int, recompute: str = "none", whole_forward: bool = False) -> FlopCount:
    """FLOPs of one transformer block for one sequence. ``full`` recomputation reruns the forward
    but for the closing w2, whose output no backward needs (torch's checkpoint stops at the last
    tensor backward needs), unless the stack reruns the ``whole_forward`` (Megatron-LM)."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    matmul = layer_matmul_forward_flops(spec, seq_len)
    core = attention_core_forward_flops(spec, seq_len)
    forward = matmul + core
    backward = 2 * matmul + core * 5 // 2
    shapes = linear_shapes(spec)
    rerun = 2 * seq_len * sum(shapes[name][0] * shapes[name][1] for name in recomputed_linears(spec))
    closing = 0 if whole_forward else 2 * seq_len * shapes["w2"][0] * shapes["w2"][1]
    extra = {"none": 0, "selective": core, "op": rerun, "full": forward - closing}[recompute]
    return FlopCount(forward, backward, extra)


def flops_per_sequence(spec: ModelSpec, seq_len: int | None = None, recompute: str = "none") -> FlopCount:
    """FLOPs of one training sequence through the whole model (embedding lookups are free)."""
    seq_len = spec.seq_len if seq_len is None else seq_len
    layer = layer_flops(spec, seq_len, recompute)
    head = head_forward_flops(spec, seq_len)
    return FlopCount(
        forward=spec.layers * layer.forward + head,
        backward=spec.layers * layer.backward + 2 * head,
        recompute=spec.layers * layer.recompute,
    )
