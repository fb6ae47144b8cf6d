"""Tensor-parallel communication that DTensor's plans do not express, as autograd pairs.

Named as Megatron names its mappings: what happens forward, and its mirror backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


class _SliceReplicatedRows(torch.autograd.Function):
    """Forward: keep rows ``[start, stop)`` of a weight every tp rank holds in full.
    Backward: scatter the rows' gradient into a full-size zero gradient and all-reduce it over tp,
    so every rank ends with the full weight's gradient (ranks sharing rows add their parts)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, start: int, stop: int, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.shape, ctx.start, ctx.stop, ctx.group = weight.shape, start, stop, group
        return weight[start:stop]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        full = grad.new_zeros(ctx.shape)
        full[ctx.start:ctx.stop] = grad
        return funcol.all_reduce(full, "sum", ctx.group).wait(), None, None, None


def slice_replicated_rows(weight: torch.Tensor, start: int, stop: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Rows ``[start, stop)`` of a tensor-parallel-replicated ``weight``; its gradient is summed over tp."""
    return _SliceReplicatedRows.apply(weight, start, stop, group)
