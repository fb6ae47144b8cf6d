"""The model's shape as plain data, and the named presets.

Pure Python (no torch): the planner imports this to reason about models far too large to build.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from plait.errors import ConfigError


@dataclass(frozen=True)
class BlockFeatures:
    """What a family's block is made of: the code reads these, never the family's name."""

    norm: str  # "layernorm" (weight and bias) or "rmsnorm" (weight only)
    positions: str  # "learned" (an embedding table) or "rotary" (q and k rotated)
    mlp: str  # "gelu" (w2(gelu(w1 x))) or "swiglu" (w2(silu(w1 x) * w3 x))
    biases: bool  # on every linear layer
    hf_model_type: str  # the Hugging Face model that computes the same block, and its files' layout


FAMILY_FEATURES: dict[str, BlockFeatures] = {
    "gpt2": BlockFeatures(norm="layernorm", positions="learned", mlp="gelu", biases=True, hf_model_type="gpt2"),
    "llama": BlockFeatures(norm="rmsnorm", positions="rotary", mlp="swiglu", biases=False, hf_model_type="llama"),
}
FAMILIES = tuple(FAMILY_FEATURES)

# The output projection's rows in a multiple of this: 16 bytes of bf16, what cuBLAS's tensor-core
# kernels load at a time. GPT-2's 50,257 rows otherwise ran an align-1 kernel at 0.10-0.14 of the
# H200's dense peak, a ninth of gpt2-xl's step (docs/VALIDATION.md). Without tensor parallelism only
# the matmul's bf16 cast of the weight is padded (plait.models.vocabulary); tensor parallelism pads the
# weights to a multiple of this a rank (plait.facts.model_state.padded_vocab).
ALIGNED_ROWS = 8
# The most layers a model may have: the deepest transformer trained has 1,000 (DeepNet, 2022). The
# stage split, the schedules and the planner walk the layers one by one (simulate takes about a
# minute at 1,000 on a loaded 2-core machine), so a mistyped 10^9 would run for days unrefused.
MAX_LAYERS = 1024
# Values a rank makes at a time while it fills its weights (plait.parallel.materialize): a block of
# rows drawn from one generator (plait.models.init), and the region of a weight it fills at once.
# Large enough that seeding costs nothing beside drawing; small enough that building a rank's part
# of any model holds a few MiB beside it (plait.facts.model_state.BUILD_WORKSPACE_BYTES).
FILL_BLOCK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    The family fixes the block's ingredients, as ``FAMILY_FEATURES`` lists them: ``gpt2`` is LayerNorm,
    GELU MLP, learned positions and biases on every linear layer; ``llama`` is RMSNorm, SwiGLU MLP,
    rotary positions, no biases. Code reads them through the properties (``norm_kind``,
    ``rotary_positions``, ...), never the family's name.
    ``kv_heads`` below ``heads`` gives grouped-query attention (one: multi-query). ``parallel_block``
    runs attention and MLP side by side on one norm's output, x + attention(norm(x)) + mlp(norm(x)),
    as GPT-J, PaLM and Falcon do, instead of one after the other.
    """

    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    tie_embeddings: bool
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    parallel_block: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def features(self) -> BlockFeatures:
        return FAMILY_FEATURES[self.family]

    @property
    def norm_kind(self) -> str:
        return self.features.norm

    @property
    def has_bias(self) -> bool:
        return self.features.biases

    @property
    def learned_positions(self) -> bool:
        return self.features.positions == "learned"

    @property
    def rotary_positions(self) -> bool:
        return self.features.positions == "rotary"

    @property
    def gated_mlp(self) -> bool:
        return self.features.mlp == "swiglu"

    @property
    def hf_model_type(self) -> str:
        return self.features.hf_model_type

    def validate(self) -> None:
        """Raise ConfigError with one actionable sentence if the dimensions do not fit together."""
        if self.family not in FAMILIES:
            raise ConfigError(f"model family {self.family!r} is unknown; use one of {', '.join(FAMILIES)}")
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model {name} must be a positive integer, got {value!r}")
        if self.layers > MAX_LAYERS:
            raise ConfigError(f"model layers {self.layers:,} is more than plait builds, {MAX_LAYERS:,} (the deepest "
                              "transformer trained has 1,000); choose fewer layers")
        for name in ("tie_embeddings", "parallel_block"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model {name} must be true or false, got {getattr(self, name)!r}")
        for name in ("rope_theta", "norm_eps"):  # a rotary base and a norm's epsilon of 0 or less train NaNs
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"model {name} must be a positive finite number, got {value!r}")
        if self.hidden % self.heads:
            raise ConfigError(
                f"hidden size {self.hidden} is not divisible by {self.heads} heads; "
                "choose heads that divide the hidden size"
            )
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"{self.heads} attention heads are not divisible by {self.kv_heads} kv-heads; "
                "kv-heads must divide heads (grouped-query attention)"
            )
        if self.rotary_positions and self.head_dim % 2:
            raise ConfigError(
                f"rotary positions need an even head dimension, got {self.head_dim}; "
                "change hidden or heads"
            )


def _gpt2(layers: int, hidden: int, heads: int, vocab: int = 50257, seq_len: int = 1024) -> ModelSpec:
    return ModelSpec("gpt2", layers, hidden, heads, heads, 4 * hidden, vocab, seq_len, tie_embeddings=True)


def _llama(layers: int, hidden: int, heads: int, kv_heads: int, ffn_hidden: int, tie: bool) -> ModelSpec:
    return ModelSpec(
        "llama", layers, hidden, heads, kv_heads, ffn_hidden, 128256, 8192,
        tie_embeddings=tie, rope_theta=500000.0,
    )


# Published shapes: GPT-2 (Radford et al. 2019), GPT-3 175B (Brown et al. 2020, table 2.1),
# Llama 3.2 1B/3B (tied embeddings) and Llama 3.1 8B/70B/405B (Meta model cards),
# Megatron 1T (Narayanan et al. 2021, table 1).
PRESETS: dict[str, ModelSpec] = {
    "tiny": _gpt2(layers=4, hidden=128, heads=4, vocab=256, seq_len=128),
    "tiny-llama": ModelSpec("llama", 4, 128, 4, 2, 352, 256, 128, tie_embeddings=False),
    "gpt2": _gpt2(12, 768, 12),
    "gpt2-medium": _gpt2(24, 1024, 16),
    "gpt2-large": _gpt2(36, 1280, 20),
    "gpt2-xl": _gpt2(48, 1600, 25),
    "llama-1b": _llama(16, 2048, 32, 8, 8192, tie=True),
    "llama-3b": _llama(28, 3072, 24, 8, 8192, tie=True),
    "llama-8b": _llama(32, 4096, 32, 8, 14336, tie=False),
    "llama-70b": _llama(80, 8192, 64, 8, 28672, tie=False),
    "llama-405b": _llama(126, 16384, 128, 8, 53248, tie=False),
    "gpt3-175b": _gpt2(96, 12288, 96, seq_len=2048),
    "megatron-1t": _gpt2(128, 25600, 160, vocab=51200, seq_len=2048),
}

SPEC_FIELDS = tuple(f.name for f in fields(ModelSpec))


def model_spec(name: str | None = None, **overrides) -> ModelSpec:
    """The preset ``name`` with ``overrides`` applied, or a spec built from ``overrides`` alone.

    Without a preset, unset fields follow the family's conventions (kv_heads = heads; an FFN of
    4·hidden for gpt2 or Llama's 8/3·hidden rounded up to 256; gpt2 ties its embeddings).
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(overrides) - set(SPEC_FIELDS))
    if unknown:
        raise ConfigError(f"unknown model field(s) {', '.join(unknown)}; known fields: {', '.join(SPEC_FIELDS)}")
    if name is not None:
        if name not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}")
        spec = replace(PRESETS[name], **overrides)
    else:
        missing = [k for k in ("layers", "hidden", "heads") if k not in overrides]
        if missing:
            raise ConfigError(
                f"no model preset given and model {', '.join(missing)} not set; "
                "pass --model NAME or all of --layers --hidden --heads"
            )
        family = overrides.setdefault("family", "gpt2")
        hidden = overrides["hidden"]
        overrides.setdefault("kv_heads", overrides["heads"])
        if family == "llama" and isinstance(hidden, int):
            overrides.setdefault("ffn_hidden", 256 * -(-(8 * hidden // 3) // 256))
        elif isinstance(hidden, int):
            overrides.setdefault("ffn_hidden", 4 * hidden)
        overrides.setdefault("vocab", 50257 if family == "gpt2" else 128256)
        overrides.setdefault("seq_len", 1024 if family == "gpt2" else 8192)
        overrides.setdefault("tie_embeddings", family == "gpt2")
        spec = ModelSpec(**overrides)
    spec.validate()
    return spec
