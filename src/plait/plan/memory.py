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
from typing import Iterable, Mapping

from plait.layout import Layout
from plait.models.flops import (
    embedding_tensor_count, head_tensor_count, layer_parameter_count, layer_tensor_count, norm_parameter_count,
)
from plait.models.spec import ModelSpec
from plait.parallel.zero_memory import PAPER_BYTES, sharded_split
from plait.schedules.actions import Action, Kind

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


def model_state_bytes(parameters: float, precision: str, zero: int, shards: int) -> ModelStates:
    """Model states of ``parameters`` on one rank, with ZeRO ``zero`` over ``shards`` ranks."""
    split = sharded_split(zero, parameters, shards, PAPER_BYTES[precision])
    return ModelStates(params=split["parameters"], grads=split["gradients"], optimizer=split["optimizer"])


@dataclass(frozen=True)
class Kernels:
    """How the layer's kernels run: dropout masks and the s² attention scores (no flash) are
    saved; ``fused`` elementwise kernels (Megatron-LM, torchtitan) or one eager PyTorch kernel per
    operation (plait's own single-device model), which moves more bytes (plait.plan.compute)."""

    dropout: bool = False
    flash_attention: bool = True
    fused: bool = True
    # How context-parallel attention sees the whole sequence: K/V blocks round a ring (Megatron-LM,
    # torchtitan) or an all-to-all of heads (DeepSpeed-Ulysses, plait's own).
    context_exchange: str = "ring"


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


def rank_parameters(spec: ModelSpec, layers: int, first: bool, last: bool, tp: int, pp: int) -> float:
    """Parameters one tensor-parallel rank of a pipeline stage holds.

    Weights and biases are split over tp (the embedding and head by vocabulary rows), norms are
    replicated. With tied embeddings and pp > 1 the last stage keeps its own copy of the
    embedding matrix for the head, as Megatron-LM does.
    """
    norms = 2 * norm_parameter_count(spec)
    count = layers * ((layer_parameter_count(spec) - norms) / tp + norms)
    if first:
        count += spec.vocab * spec.hidden / tp + (spec.seq_len * spec.hidden if spec.learned_positions else 0)
    if last:
        count += norm_parameter_count(spec)
        if not spec.tie_embeddings or pp > 1:
            count += spec.vocab * spec.hidden / tp
    return count


def rank_tensors(spec: ModelSpec, layers: int, first: bool, last: bool, pp: int) -> int:
    """Parameter tensors one rank of a pipeline stage holds (sharded or not, each is one tensor)."""
    count = layers * layer_tensor_count(spec)
    if first:
        count += embedding_tensor_count(spec)
    if last:
        count += head_tensor_count(spec) + (1 if spec.tie_embeddings and pp > 1 else 0)
    return count


def peak_activation_bytes(actions: Iterable[Action], chunk_bytes: Mapping[int, float]) -> float:
    """Most activation bytes a rank holds at once while it plays its action list.

    A forward of chunk c stores ``chunk_bytes[c]``; the full backward, or in zero-bubble
    schedules the weight-gradient backward (which still reads the layer inputs), frees them.
    """
    held = peak = 0.0
    for action in actions:
        if action.kind is Kind.FORWARD:
            held += chunk_bytes[action.chunk]
            peak = max(peak, held)
        elif action.kind in (Kind.BACKWARD, Kind.BACKWARD_WEIGHT):
            held -= chunk_bytes[action.chunk]
    return peak


@dataclass(frozen=True)
class RankMemory:
    """Everything one rank holds at its peak, in bytes."""

    params: float
    grads: float
    optimizer: float
    activations: float
    other: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    def breakdown(self) -> dict[str, int]:
        return {k: int(round(getattr(self, k))) for k in ("params", "grads", "optimizer", "activations", "other")}


def other_bytes(
    spec: ModelSpec, layout: Layout, micro_batch: int, precision: str, reserved: float
) -> float:
    """Stated assumptions beyond model states and activations.

    ``reserved`` for the runtime (context, communication workspaces, allocator slack); with pp > 1
    one send and one receive buffer of a micro-batch's boundary activation; with ZeRO-3 the
    gathered weights of two layers (the current one and the prefetched next) and the unsharded
    gradients of one.
    """
    extra = reserved
    e = ACTIVATION_BYTES[precision]
    if layout.pp > 1:
        extra += 2 * micro_batch * spec.seq_len // layout.cp * spec.hidden * e / (layout.tp if layout.sp else 1)
    if layout.zero == 3:
        params, grads, _ = PAPER_BYTES[precision]
        extra += layer_parameter_count(spec) / layout.tp * (2 * params + grads)
    return extra
