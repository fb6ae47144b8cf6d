"""The decoder-only transformer, written for one device.

No rank logic lives here: tensor, sequence, context and pipeline parallelism are applied from
outside (``plait.parallel``). Blocks sit in a ``ModuleDict`` keyed by layer index so a pipeline
stage can drop the layers it does not own and keep every parameter's name; a missing embedding
or head (``None``) means the stage does not own it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plait.models.spec import ModelSpec
from plait.models.vocabulary import VocabularyHead, vocabulary_logits


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class LayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x)


def make_norm(spec: ModelSpec) -> nn.Module:
    """The spec's norm, outside autocast: it runs in its input's dtype, which is its weights' (the
    residual stream's), and returns it, on every device. Under autocast a bf16 input would come
    back bf16 on a CPU and fp32 on a GPU (CUDA's autocast lists both norms among its fp32 ops), and
    with it the dtype of what the next linears read, keep for backward and gather under tensor
    parallelism would hang on the device."""
    if spec.norm_kind == "layernorm":
        return LayerNorm(spec.hidden, eps=spec.norm_eps)
    return RMSNorm(spec.hidden, spec.norm_eps)


def rotary_tables(spec: ModelSpec, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, shape (seq_len, head_dim // 2): computed on the host even
    when the model is built on the meta device (they are constants, not weights a source fills)."""
    steps = torch.arange(0, spec.head_dim, 2, dtype=torch.float64, device="cpu")
    inv_freq = 1.0 / spec.rope_theta ** (steps / spec.head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64, device="cpu"), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, heads, seq, head_dim) by the angles of each position (interleaved pairs)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


def expand_kv_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query k, v repeated to q's heads (each kv-head serves heads/kv_heads query heads)."""
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


class CausalAttention(nn.Module):
    """softmax(q kᵀ / √d, causal) v on (batch, heads, seq, head_dim), k and v with their kv-heads;
    context parallelism replaces it."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, *expand_kv_heads(q, k, v), is_causal=True)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.heads = spec.heads
        self.kv_heads = spec.kv_heads
        self.head_dim = spec.head_dim
        bias = spec.has_bias
        self.wq = nn.Linear(spec.hidden, spec.hidden, bias=bias)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=bias)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=bias)
        self.wo = nn.Linear(spec.hidden, spec.hidden, bias=bias)
        self.core = CausalAttention()

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Head counts come from the weights, so a tensor-parallel shard (fewer heads) runs unchanged.
        q = self.wq(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        out = self.core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    """GELU MLP (gpt2) or SwiGLU (llama: w2(silu(w1 x) * w3 x))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        bias = spec.has_bias
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=bias)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=bias)
        self.w3 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False) if spec.gated_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x), approximate="tanh"))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Attention then MLP, each on its own norm of the residual stream; or, with the spec's
    ``parallel_block``, both on one norm of the block's input, their outputs added together."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = make_norm(spec)
        self.attention = Attention(spec)
        self.mlp_norm = None if spec.parallel_block else make_norm(spec)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        if self.mlp_norm is None:
            normed = self.attention_norm(x)
            return x + self.attention(normed, rotary) + self.mlp(normed)
        x = x + self.attention(self.attention_norm(x), rotary)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Token ids (batch, seq) → logits (batch, seq, vocab); hidden states in and out on inner stages."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_embeddings = nn.Embedding(spec.seq_len, spec.hidden) if spec.learned_positions else None
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.layers)})
        self.norm = make_norm(spec)
        self.output = None if spec.tie_embeddings else VocabularyHead(spec.hidden, spec.vocab)
        if not spec.learned_positions:
            cos, sin = rotary_tables(spec, spec.seq_len)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions`` (seq,) defaults to 0..seq-1; a context-parallel shard passes its own."""
        seq = inputs.shape[1]
        if positions is None:
            positions = torch.arange(seq, device=inputs.device)
        h = inputs
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(inputs)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(positions)
        rotary = None if self.spec.learned_positions else (self.rope_cos[positions], self.rope_sin[positions])
        for block in self.layers.values():
            h = block(h, rotary)
        if self.norm is None:
            return h
        h = self.norm(h)
        if self.output is None:
            return vocabulary_logits(h, self.tok_embeddings.weight)
        return self.output(h)
