"""Context-parallel communication as autograd pairs: each all-to-all's backward is its mirror."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def _all_to_all(chunks: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Send ``chunks[j]`` to rank j; row i of the result came from rank i."""
    return funcol.all_to_all_single(chunks.contiguous(), None, None, group).wait()


def _sequence_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(batch, heads, seq/cp, d) on each rank → (batch, heads/cp, seq, d): whole sequence, fewer heads."""
    size = dist.get_world_size(group)
    batch, heads, local_seq, dim = x.shape
    chunks = x.reshape(batch, size, heads // size, local_seq, dim).transpose(0, 1)
    received = _all_to_all(chunks, group)  # (cp: sequence piece, batch, heads/cp, seq/cp, d)
    return received.permute(1, 2, 0, 3, 4).reshape(batch, heads // size, size * local_seq, dim)


def _heads_to_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(batch, heads/cp, seq, d) → (batch, heads, seq/cp, d): the inverse of ``_sequence_to_heads``."""
    size = dist.get_world_size(group)
    batch, heads, seq, dim = x.shape
    chunks = x.reshape(batch, heads, size, seq // size, dim).permute(2, 0, 1, 3, 4)
    received = _all_to_all(chunks, group)  # (cp: head group, batch, heads/cp, seq/cp, d)
    return received.transpose(0, 1).reshape(batch, size * heads, seq // size, dim)


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _sequence_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _heads_to_sequence(grad, ctx.group), None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _heads_to_sequence(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _sequence_to_heads(grad, ctx.group), None


def scatter_heads_gather_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Forward: all-to-all from sequence shards to head shards. Backward: the reverse all-to-all."""
    return _SequenceToHeads.apply(x, group)


def scatter_sequence_gather_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Forward: all-to-all from head shards back to sequence shards. Backward: the reverse all-to-all."""
    return _HeadsToSequence.apply(x, group)
