"""Gradient clipping over parameters that may be DTensors (sharded or replicated) or plain tensors.

torch.nn.utils.clip_grad_norm_ stacks per-parameter norms, which fails when a model mixes DTensor
and plain parameters (tensor parallelism leaves norms and replicated kv-heads plain).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients so their global 2-norm is at most ``max_norm``; return the norm before.

    Gradients that mix DTensors and plain tensors (tensor parallelism) are reduced in groups of
    one placement each, so the whole norm costs one collective per group, not one per tensor."""
    parameters = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in parameters]
    if len({isinstance(grad, DTensor) for grad in grads}) == 1:
        # All plain or all DTensor (FSDP2): PyTorch's own clipping reduces every norm at once.
        total = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return total.full_tensor() if isinstance(total, DTensor) else total
    groups: dict[object, list[torch.Tensor]] = defaultdict(list)
    for grad in grads:
        groups[(grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None].append(grad)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack(norms))
    if math.isfinite(max_norm):
        # A Python number, as a DTensor gradient cannot be multiplied by a plain tensor.
        coefficient = min(max_norm / (total.item() + 1e-6), 1.0)
        for grad in grads:
            grad.mul_(coefficient)
    return total
