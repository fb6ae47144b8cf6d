"""The output projection onto the vocabulary, its matmul over rows in a multiple of ``ALIGNED_ROWS``.

A vocabulary such as GPT-2's 50,257 is no multiple of 8, so in 16-bit cuBLAS cannot run the
projection with its tensor-core kernels' 16-byte loads and picks an align-1 kernel, several times
slower (``plait.models.spec.ALIGNED_ROWS``). Under autocast over fp32 weights the matmul keeps a
16-bit cast of the weight for its backward anyway; here that cast is padded with zero rows before
the matmul, so the padded cast takes the cast's place, and the padded logits are dropped again.
Weights already in 16-bit (ZeRO 1 and 2, FSDP2) project as they are: padding them would keep a
copy beside the parameter. Tensor parallelism pads the weights themselves
(``plait.facts.model_state.padded_vocab``) and so never needs this.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plait.models.spec import ALIGNED_ROWS


def vocabulary_logits(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """h · weightᵀ, one logit a row of ``weight``: over aligned rows where autocast casts the weight
    (the logits then a view of the padded ones, which the loss reads in place), else as it is."""
    device, rows = h.device.type, weight.shape[0]
    if rows % ALIGNED_ROWS == 0 or not torch.is_autocast_enabled(device):
        return F.linear(h, weight)
    dtype = torch.get_autocast_dtype(device)
    if weight.dtype == dtype:  # autocast would keep the weight itself, not a cast
        return F.linear(h, weight)
    return F.linear(h, F.pad(weight.to(dtype), (0, 0, 0, -rows % ALIGNED_ROWS)))[..., :rows]


class VocabularyHead(nn.Linear):
    """The untied output projection (no bias), projecting through ``vocabulary_logits``; tensor
    parallelism shards it as the ``nn.Linear`` it is."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__(hidden, vocab, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return vocabulary_logits(h, self.weight)
