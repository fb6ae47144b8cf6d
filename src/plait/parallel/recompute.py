"""Activation recomputation (``--recompute``), applied from outside the model.

- ``full``: each block keeps only its inputs (the residual stream, and the rotary angles on
  Llama); its whole forward runs again in backward (Chen et al. 2016; Megatron-LM's "full").
- ``selective``: only the attention core (softmax(q kᵀ) v) runs again; it keeps q, k and v
  instead of its output and softmax statistics (Korthikanti et al. 2022, §4).
- ``full`` with ``--recompute-layers N``: only the first N blocks of each pipeline chunk
  (plait.facts.recompute says which).

``torch.utils.checkpoint`` (non-reentrant) does the work. The module's class is swapped for a
subclass whose forward runs the original under it, as FSDP2's ``fully_shard`` swaps classes: no
wrapper module, so parameter names (and with them tensor-parallel plans, pipeline pruning and
checkpoints) stay the single-device ones. Not ``torch.distributed._composable.checkpoint``, which
also keeps names: it cannot recompute a module twice, and the zero-bubble schedules' split backward
(input gradients, then weight gradients in a second pass) recomputes twice. Apply it after tensor
and context parallelism (context parallelism swaps the attention core that ``selective``
recomputes) and before data parallelism, as torchtitan does.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from plait.models.transformer import Transformer


class Recomputed:
    """Mixin placed before a module's class: its forward keeps only its inputs for backward."""

    def forward(self, *args, **kwargs):
        return checkpoint(super().forward, *args, use_reentrant=False, **kwargs)


def recomputed_modules(model: Transformer, modes: tuple[str, ...]) -> list[nn.Module]:
    """The modules whose forward reruns in backward: each block's own mode (``modes``, first block
    to last, from plait.facts.recompute.block_recompute) names the block or its attention core."""
    out = []
    for mode, block in zip(modes, model.layers.values(), strict=True):
        if mode == "full":
            out.append(block)
        elif mode == "selective":
            out.append(block.attention.core)
    return out


def apply_recompute(model: Transformer, modes: tuple[str, ...]) -> Transformer:
    """Recompute each block (``full``) or its attention core (``selective``) in backward, block by block."""
    for module in recomputed_modules(model, modes):
        if not isinstance(module, Recomputed):
            module.__class__ = recomputed_class(type(module))
    return model


@functools.cache
def recomputed_class(cls: type) -> type:
    """One recomputed subclass per module class, as FSDP2 keeps one per class it wraps."""
    return type(f"Recomputed{cls.__name__}", (Recomputed, cls), {})
