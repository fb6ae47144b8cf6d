"""Bytes held by one rank: model states (ZeRO accounting) and activations (Korthikanti et al.).

Model states follow Rajbhandari et al. 2020 (ZeRO, §3.1): bf16 mixed precision with Adam keeps
2Ψ bytes of bf16 parameters, 2Ψ of bf16 gradients and KΨ = 12Ψ of optimizer state (fp32 master
weights, momentum, variance). Pure fp32 keeps 4Ψ + 4Ψ + 8Ψ. ZeRO stage 1 shards the optimizer
state over the data-parallel group, stage 2 the gradients too, stage 3 the parameters too.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", §4): one layer stores sbh(34 + 5as/h) bytes with 16-bit activations and
1-byte dropout masks, term by term below so that each term can be sharded by what shards it and
the model's own shapes can replace GPT's: kv_heads for grouped-query attention, ffn_hidden for
the MLP width, SwiGLU's four saved MLP tensors instead of GELU's two. RoPE rotates Q and K in
place of the unrotated ones and saves no tensor of its own. Flash attention keeps only the
softmax's fp32 log-sum-exp instead of the s² score matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.models.spec import ModelSpec

ACTIVATION_BYTES = {"bf16": 2, "fp32": 4}
MASK_BYTES = 1


@dataclass(frozen=True)
class ModelStates:
    """Bytes of parameters, gradients and optimizer state on one rank."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def bytes_per_parameter(precision: str) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer) bytes per parameter: ZeRO's 2 + 2 + K with K = 12."""
    return (2, 2, 12) if precision == "bf16" else (4, 4, 8)


def model_state_bytes(parameters: float, precision: str, zero: int, shards: int) -> ModelStates:
    """Model states of ``parameters`` on one rank, with ZeRO ``zero`` over ``shards`` ranks."""
    p, g, o = (b * parameters for b in bytes_per_parameter(precision))
    return ModelStates(
        params=p / shards if zero >= 3 else p,
        grads=g / shards if zero >= 2 else g,
        optimizer=o / shards if zero >= 1 else o,
    )


@dataclass(frozen=True)
class Kernels:
    """What the layer's kernels save: dropout masks and the s² attention scores (no flash)."""

    dropout: bool = False
    flash_attention: bool = True


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


def peak_in_flight(rank_actions: list[list[tuple[str, int]]]) -> list[int]:
    """Per rank, the most (stage, micro-batch) forwards whose activations are held at once.

    ``rank_actions[r]`` lists that rank's compute actions in order as (kind, key) pairs: a kind
    of ``F`` stores activations for ``key``, ``B`` (backward, or backward-input in zero-bubble
    schedules) releases them; other kinds leave memory as it is.
    """
    peaks = []
    for actions in rank_actions:
        held = peak = 0
        for kind, _ in actions:
            if kind == "F":
                held += 1
                peak = max(peak, held)
            elif kind == "B":
                held -= 1
        peaks.append(peak)
    return peaks
