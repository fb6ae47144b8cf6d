"""Activation recomputation (``--recompute``), applied from outside the model.

- ``full``: each block keeps only its inputs (the residual stream, and the rotary angles on
  Llama); its whole forward runs again in backward (Chen et al. 2016; Megatron-LM's "full").
- ``selective``: only the attention core (softmax(q kᵀ) v) runs again; it keeps q, k and v
  instead of its output and softmax statistics (Korthikanti et al. 2022, §4).
- ``op``: per-operation selective checkpointing, torchtitan's default: each block runs under
  ``torch.utils.checkpoint`` with a policy that keeps the outputs of every second weight matmul
  (the first, third, ... of the block: plait.models.flops.kept_linears names them for the facts
  and the planner), of the attention kernel, and of sp's reduce-scatters and cp's all-to-alls,
  and recomputes everything else (norms, activations, rotary, casts, the other matmuls).
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

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from plait.models.transformer import Transformer


class Recomputed:
    """Mixin placed before a module's class: its forward keeps only its inputs for backward."""

    def forward(self, *args, **kwargs):
        return checkpoint(super().forward, *args, use_reentrant=False, **kwargs)


aten = torch.ops.aten
WEIGHT_MATMULS = frozenset({aten.mm.default, aten.addmm.default, aten.linear.default})
# The fused attention kernels (the CPU one among them), whose outputs and statistics are kept.
ATTENTION_KERNELS = frozenset({aten._scaled_dot_product_flash_attention_for_cpu.default,
                               aten._scaled_dot_product_flash_attention.default,
                               aten._scaled_dot_product_efficient_attention.default,
                               aten._scaled_dot_product_cudnn_attention.default})
# Collectives whose results are kept rather than exchanged again in backward, as torchtitan keeps
# them: sequence parallelism's reduce-scatters and the head exchange's all-to-alls.
KEPT_COLLECTIVES = frozenset({torch.ops._c10d_functional.reduce_scatter_tensor.default,
                              torch.ops._c10d_functional.all_to_all_single.default})
KEPT_KERNELS = ATTENTION_KERNELS | KEPT_COLLECTIVES


def every_other_matmul_policy():
    """The per-operation policy of one block's forward (and its replay in backward): keep the
    attention kernel's outputs, the reduce-scatters' and all-to-alls', and the 1st, 3rd, ... weight
    matmul's; recompute the rest. torch replays the forward's decisions in backward, so the count
    runs over the forward only."""
    matmuls = 0

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        nonlocal matmuls
        if func in WEIGHT_MATMULS:
            matmuls += 1
            return CheckpointPolicy.MUST_SAVE if matmuls % 2 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in KEPT_KERNELS else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_contexts():
    return create_selective_checkpoint_contexts(every_other_matmul_policy())


class OpRecomputed:
    """Mixin placed before a block's class: its forward keeps its inputs and the outputs the
    per-operation policy keeps."""

    def forward(self, *args, **kwargs):
        return checkpoint(super().forward, *args, use_reentrant=False, context_fn=selective_contexts, **kwargs)


def recomputed_modules(model: Transformer, modes: tuple[str, ...]) -> list[tuple[nn.Module, str]]:
    """(module, mode) of each module whose forward reruns in backward: each block's own mode
    (``modes``, first block to last, from plait.facts.recompute.block_recompute) names the block
    (``full``, ``op``) or its attention core (``selective``)."""
    out = []
    for mode, block in zip(modes, model.layers.values(), strict=True):
        if mode in ("full", "op"):
            out.append((block, mode))
        elif mode == "selective":
            out.append((block.attention.core, mode))
    return out


def apply_recompute(model: Transformer, modes: tuple[str, ...]) -> Transformer:
    """Recompute each block (``full``), its attention core (``selective``) or a block's unkept
    operations (``op``) in backward, block by block."""
    for module, mode in recomputed_modules(model, modes):
        if not isinstance(module, (Recomputed, OpRecomputed)):
            module.__class__ = recomputed_class(type(module), OpRecomputed if mode == "op" else Recomputed)
    return model


@functools.cache
def recomputed_class(cls: type, mixin: type) -> type:
    """One recomputed subclass per module class and mixin, as FSDP2 keeps one per class it wraps."""
    return type(f"{mixin.__name__}{cls.__name__}", (mixin, cls), {})
