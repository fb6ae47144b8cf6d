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

RECOMPUTE_MODES = ("none", "selective", "full")


def norm_parameter_count(spec: ModelSpec) -> int:
    return 2 * spec.hidden if spec.family == "gpt2" else spec.hidden


def attention_parameter_count(spec: ModelSpec) -> int:
    weights = 2 * spec.hidden * spec.hidden + 2 * spec.hidden * spec.kv_dim
    biases = 2 * spec.hidden + 2 * spec.kv_dim if spec.has_bias else 0
    return weights + biases


def mlp_parameter_count(spec: ModelSpec) -> int:
    if spec.gated_mlp:
        return 3 * spec.hidden * spec.ffn_hidden
    biases = spec.ffn_hidden + spec.hidden if spec.has_bias else 0
    return 2 * spec.hidden * spec.ffn_hidden + biases


def layer_parameter_count(spec: ModelSpec) -> int:
    """Parameters of one transformer block (two norms, attention, MLP)."""
    return 2 * norm_parameter_count(spec) + attention_parameter_count(spec) + mlp_parameter_count(spec)


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
    return 2 * norm_tensor_count(spec) + attention + mlp


def norm_tensor_count(spec: ModelSpec) -> int:
    return 2 if spec.family == "gpt2" else 1  # LayerNorm's weight and bias, or RMSNorm's weight


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


def layer_flops(spec: ModelSpec, seq_len: int, recompute: str = "none") -> FlopCount:
    """FLOPs of one transformer block for one sequence."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    matmul = layer_matmul_forward_flops(spec, seq_len)
    core = attention_core_forward_flops(spec, seq_len)
    forward = matmul + core
    backward = 2 * matmul + core * 5 // 2
    extra = {"none": 0, "selective": core, "full": forward}[recompute]
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
