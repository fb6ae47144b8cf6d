"""Gradient clipping over parameters that may be DTensors (sharded or replicated) or plain tensors.

As torchtitan does: the total norm is made a plain tensor first (one all-reduce when the gradients
are sharded), then ``clip_grads_with_norm_`` scales every gradient by it. Calling
``torch.nn.utils.clip_grad_norm_`` on sharded gradients would reduce the norm once to scale them,
and the logged norm would need a second reduction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def full_norm(grad: torch.Tensor) -> torch.Tensor:
    norm = torch.linalg.vector_norm(grad)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients so their global 2-norm is at most ``max_norm``; return the norm before.

    Gradients that mix DTensors and plain tensors (tensor parallelism leaves norms and replicated
    kv-heads plain) cannot be stacked into one norm, so theirs are reduced one by one."""
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    mixed = len({isinstance(grad, DTensor) for grad in grads}) > 1
    if mixed:
        total = torch.linalg.vector_norm(torch.stack([full_norm(grad) for grad in grads]))
    else:
        # All plain, or all DTensor (FSDP2): one norm over all of them, reduced once.
        total = torch.nn.utils.get_total_norm(grads)
        total = total.full_tensor() if isinstance(total, DTensor) else total
    if math.isfinite(max_norm):
        # A multi-tensor kernel cannot take DTensors and plain tensors in one list.
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total, foreach=False if mixed else None)
    return total
