"""The output projection onto the vocabulary, its matmul over rows in a multiple of ``ALIGNED_ROWS``.

A vocabulary such as GPT-2's 50,257 is no multiple of 8, so in 16-bit cuBLAS cannot run the
projection with its tensor-core kernels' 16-byte loads and picks an align-1 kernel, several times
slower (``plait.models.spec.ALIGNED_ROWS``). The projection here pads the weight with zero rows for
the matmul alone and drops their logits again; it keeps the unpadded weight for its backward and
pads it again there, so it holds what a plain ``F.linear`` holds. Tensor parallelism pads the
weights themselves (``plait.facts.model_state.padded_vocab``) and so never needs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plait.models.spec import ALIGNED_ROWS

HALF = (torch.bfloat16, torch.float16)


def _aligned(weight: torch.Tensor) -> torch.Tensor:
    return F.pad(weight, (0, 0, 0, -weight.shape[0] % ALIGNED_ROWS))


class _AlignedProjection(torch.autograd.Function):
    """h · weightᵀ over ``weight`` padded to aligned rows (their logits included), both in one dtype."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, weight)
        return F.linear(h, _aligned(weight))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        h, weight = ctx.saved_tensors
        grad_h = grad @ _aligned(weight) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad.flatten(0, -2).T @ h.flatten(0, -2))[:weight.shape[0]]
        return grad_h, grad_weight


def vocabulary_logits(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """h · weightᵀ, one logit a row of ``weight``; in 16-bit (autocast or 16-bit weights) over aligned
    rows when the vocabulary's are not (the logits a view of the padded ones: the loss reads it in
    place). Under autocast both are cast first, as autocast's own linear casts them."""
    device = h.device.type
    autocast = torch.is_autocast_enabled(device)
    rows = weight.shape[0]
    if rows % ALIGNED_ROWS == 0 or not (autocast or weight.dtype in HALF):
        return F.linear(h, weight)
    if autocast:
        dtype = torch.get_autocast_dtype(device)
        h, weight = h.to(dtype), weight.to(dtype)
    with torch.autocast(device, enabled=False):
        return _AlignedProjection.apply(h, weight)[..., :rows]


class VocabularyHead(nn.Linear):
    """The untied output projection (no bias), projecting through ``vocabulary_logits``; tensor
    parallelism shards it as the ``nn.Linear`` it is."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__(hidden, vocab, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return vocabulary_logits(h, self.weight)
