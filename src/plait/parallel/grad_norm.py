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


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients so their global 2-norm is at most ``max_norm``; return the norm before.

    Gradients that mix DTensors and plain tensors (tensor parallelism leaves norms and replicated
    kv-heads plain) cannot be stacked into one norm: each placement's group is normed and reduced
    on its own, one collective per group rather than per tensor."""
    parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    groups: dict[object, list[torch.Tensor]] = {}
    for grad in grads:
        groups.setdefault((grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None, []).append(grad)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack(norms)) if len(norms) > 1 else (norms or [torch.zeros(())])[0]
    if math.isfinite(max_norm):
        # A multi-tensor kernel cannot take DTensors and plain tensors in one list.
        mixed = len({isinstance(grad, DTensor) for grad in grads}) > 1
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total, foreach=False if mixed else None)
    return total
