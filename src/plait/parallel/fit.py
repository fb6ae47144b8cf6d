"""Does a model fit a layout's tensor and context split? Pure Python, checked before any worker starts."""

from __future__ import annotations

from plait.errors import ConfigError
from plait.layout import Layout
from plait.models.spec import ModelSpec


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of tp, as Megatron pads it (the extra rows are zero and
    their logits are masked out of the loss, so training is unchanged)."""
    return -(-vocab // tp) * tp


def check_parallel_fit(spec: ModelSpec, layout: Layout) -> None:
    """Raise ConfigError with one actionable sentence if ``spec`` cannot be split as ``layout`` asks."""
    tp, cp = layout.tp, layout.cp
    if spec.heads % tp:
        raise ConfigError(f"{spec.heads} attention heads cannot be split over --tp {tp}; choose a tp that divides the heads")
    if spec.kv_heads % tp and tp % spec.kv_heads:
        raise ConfigError(
            f"{spec.kv_heads} kv-heads cannot be split or replicated over --tp {tp}; "
            "choose a tp that divides the kv-heads or that they divide"
        )
    if spec.ffn_hidden % tp:
        raise ConfigError(f"FFN hidden size {spec.ffn_hidden} is not divisible by --tp {tp}; choose a tp that divides it")
    if spec.seq_len % cp:
        raise ConfigError(f"sequence length {spec.seq_len} is not divisible by --cp {cp}; choose a seq-len that is a multiple of cp")
    if (spec.heads // tp) % cp:
        raise ConfigError(
            f"context parallel exchanges heads: the {spec.heads // tp} heads per tensor-parallel rank "
            f"are not divisible by --cp {cp}; choose cp dividing heads/tp"
        )
    if layout.sp and (spec.seq_len // cp) % tp:
        raise ConfigError(
            f"sequence parallel splits each rank's {spec.seq_len // cp} positions over --tp {tp}; "
            "choose a seq-len that is a multiple of cp·tp"
        )
