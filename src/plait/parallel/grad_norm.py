"""Gradient clipping over parameters that may be DTensors (sharded or replicated) or plain tensors.

As torchtitan does: the total norm is made a plain tensor first (one all-reduce when the gradients
are sharded), then every gradient is scaled by it, as ``clip_grads_with_norm_`` scales them.
Calling ``torch.nn.utils.clip_grad_norm_`` on sharded gradients would reduce the norm once to
scale them, and the logged norm would need a second reduction. The gradients are passed in, not
the parameters: ZeRO-2's gradient shards live in its optimizer, not on the parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor


def clip_grad_norm(grads: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale ``grads`` so their global 2-norm is at most ``max_norm``; return the norm before."""
    grads = list(grads)
    total = total_norm(grads)
    scale_to_norm(grads, max_norm, total)
    return total


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of ``grads`` as a plain tensor, reduced over the meshes of the DTensors among them.

    Gradients that mix DTensors and plain tensors (tensor parallelism leaves norms and replicated
    kv-heads plain) cannot be stacked into one norm: each placement's group is normed and reduced
    on its own, one collective per group rather than per tensor."""
    groups: dict[object, list[torch.Tensor]] = {}
    for grad in grads:
        groups.setdefault((grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None, []).append(grad)
    norms = []
    for group in groups.values():
        # Each tensor's norm accumulated in fp32 (ZeRO-1's bf16 gradients would round it).
        local = torch.stack(torch._foreach_norm(group, 2, dtype=torch.float32))
        norm = torch.linalg.vector_norm(local, 2)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    return torch.linalg.vector_norm(torch.stack(norms)) if len(norms) > 1 else (norms or [torch.zeros(())])[0]


def scale_to_norm(grads: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    """Scale ``grads``, whose global norm is ``total``, down to ``max_norm`` if above it."""
    if math.isfinite(max_norm) and grads:
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # clip_grads_with_norm_'s
        # Scaling a DTensor's local tensor scales the DTensor; one multi-tensor kernel over them all.
        torch._foreach_mul_([grad.to_local() if isinstance(grad, DTensor) else grad for grad in grads], coefficient)
