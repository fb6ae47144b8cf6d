"""Ring attention: exact causal attention over zig-zag sequence shards, K/V passed round the cp ranks.

Liu et al. 2023 ("Ring Attention with Blockwise Transformers"), with the zig-zag load balance of
Megatron-LM and torchtitan. The sequence is cut into 2·cp chunks and rank r holds chunks r and
2cp-1-r (``zigzag_positions``), so under the causal mask every rank has the same work: at ring step
0 it attends its own K/V causally; at every later step the K/V block of a rank ``source`` needs no
mask and exactly half the work of step 0 (``step_blocks``): from an earlier rank, all local queries
see the block's first chunk; from a later one, the local second chunk sees the whole block.

Each block's softmax is normalised by its own log-sum-exp; blocks merge exactly by rescaling with
the running log-sum-exp (``merge_into``), as flash attention merges tiles. Backward recomputes each
block's probabilities from the final log-sum-exp and passes dK/dV round the ring with their K/V,
home after cp hops. Grouped-query K/V keep their kv-heads throughout: the query heads of a kv-head
are one broadcast dimension, so nothing is expanded before it travels. Statistics, accumulators and
travelling gradients are fp32; the matrix products run in the inputs' precision.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from plait.parallel.ring_communications import Ring


def zigzag_positions(length: int, rank: int, size: int) -> torch.Tensor:
    """The positions ``rank`` of ``size`` ring ranks holds: chunks rank and 2·size-1-rank of 2·size."""
    chunk = length // (2 * size)
    second = 2 * size - 1 - rank
    return torch.cat((torch.arange(rank * chunk, (rank + 1) * chunk), torch.arange(second * chunk, (second + 1) * chunk)))


def step_blocks(rank: int, source: int, length: int) -> tuple[slice, slice, bool]:
    """(local query rows, rows of ``source``'s K/V, causal?) that ``rank`` attends at a ring step."""
    if source == rank:
        return slice(None), slice(None), True  # both chunks in increasing order: one causal block
    half = length // 2
    if source < rank:
        return slice(None), slice(0, half), False  # its first chunk precedes both of ours
    return slice(half, None), slice(None), False  # both its chunks precede our second


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """fp32 q kᵀ · scale, future keys at -inf when ``causal`` (q and k aligned on the diagonal)."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, -math.inf)
    return scores


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scale) v of one block and its log-sum-exp, both fp32.

    q: (batch, kv_heads, group, rows, d); k, v: (batch, kv_heads, 1, keys, d)."""
    scores = _scores(q, k, causal, scale)
    lse = scores.logsumexp(-1)
    probabilities = (scores - lse.unsqueeze(-1)).exp()
    return torch.matmul(probabilities.to(v.dtype), v).float(), lse


def merge_into(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """In place: ``out``, ``lse`` become the attention over their keys and the block's together."""
    merged = torch.logaddexp(lse, block_lse)
    out.mul_((lse - merged).exp().unsqueeze(-1)).add_(block_out * (block_lse - merged).exp().unsqueeze(-1))
    lse.copy_(merged)


# (eight parameters: a numeric kernel's tensors, its mask flag and scale, as block_attention's)
def block_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, lse: torch.Tensor,
                    delta: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, ...]:
    """fp32 (dq, dk, dv) of one block, given the whole attention's log-sum-exp and delta = rowsum(dO·O).

    dk and dv are summed over the query heads that share each kv-head."""
    probabilities = (_scores(q, k, causal, scale) - lse.unsqueeze(-1)).exp()
    grad_v = torch.matmul(probabilities.to(grad_out.dtype).transpose(-1, -2), grad_out).float().sum(2)
    grad_p = torch.matmul(grad_out, v.transpose(-1, -2)).float()
    grad_s = (probabilities * (grad_p - delta.unsqueeze(-1)) * scale).to(q.dtype)
    grad_q = torch.matmul(grad_s, k).float()
    grad_k = torch.matmul(grad_s.transpose(-1, -2), q).float().sum(2)
    return grad_q, grad_k, grad_v


def by_kv_head(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(batch, heads, seq, d) → (batch, kv_heads, heads/kv_heads, seq, d): a view."""
    return x.unflatten(1, (kv_heads, x.shape[1] // kv_heads))


def attend_block(queries: torch.Tensor, kv: torch.Tensor, rank: int, source: int, out: torch.Tensor,
                 lse: torch.Tensor) -> None:
    """In place: ``out`` and ``lse`` (fp32, queries' shape) take in this rank's attention over the K/V
    block ``kv`` (k and v stacked, kv-heads) that rank ``source`` holds."""
    rows, cols, causal = step_blocks(rank, source, queries.shape[-2])
    block = block_attention(queries[..., rows, :], kv[0, ..., cols, :].unsqueeze(2), kv[1, ..., cols, :].unsqueeze(2),
                            causal, queries.shape[-1] ** -0.5)
    merge_into(out[..., rows, :], lse[..., rows], *block)


def empty_attention(queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 output and log-sum-exp over no keys yet, for ``attend_block`` to fill."""
    return (torch.zeros(queries.shape, dtype=torch.float32, device=queries.device),
            torch.full(queries.shape[:-1], -math.inf, dtype=torch.float32, device=queries.device))


class QuerySide(NamedTuple):
    """This rank's queries' side of the attention backward, by kv-head: the queries, the output's
    gradient, the forward's fp32 log-sum-exp, delta = rowsum(dO·O), and the fp32 dQ the blocks add to."""

    queries: torch.Tensor
    grad_out: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor
    grad_q: torch.Tensor


def block_backward(side: QuerySide, kv: torch.Tensor, rank: int, source: int) -> tuple[slice, torch.Tensor]:
    """Adds to ``side.grad_q`` the gradient through ``source``'s K/V block and returns (its rows of the
    block, the fp32 dK and dV of those rows stacked) for the block's holder to accumulate."""
    queries = side.queries
    rows, cols, causal = step_blocks(rank, source, queries.shape[-2])
    block_q, block_k, block_v = block_gradients(
        queries[..., rows, :], kv[0, ..., cols, :].unsqueeze(2), kv[1, ..., cols, :].unsqueeze(2),
        side.grad_out[..., rows, :], side.lse[..., rows], side.delta[..., rows], causal, queries.shape[-1] ** -0.5)
    side.grad_q[..., rows, :] += block_q
    return cols, torch.stack((block_k, block_v))


def backward_start(grad_out: torch.Tensor, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   kv_heads: int) -> QuerySide:
    """The queries' side of the backward for ``block_backward``, its dQ zeros."""
    queries, grad_out = by_kv_head(q, kv_heads), by_kv_head(grad_out, kv_heads)
    delta = (grad_out.float() * by_kv_head(out, kv_heads).float()).sum(-1)
    return QuerySide(queries, grad_out, lse, delta, torch.zeros(queries.shape, dtype=torch.float32, device=q.device))


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring) -> tuple[torch.Tensor, torch.Tensor]:
    """Output (q's shape and dtype) and fp32 log-sum-exp of this rank's queries over every rank's keys."""
    queries = by_kv_head(q, k.shape[1])
    out, lse = empty_attention(queries)
    kv = torch.stack((k, v))
    for step in range(ring.size):
        transfer = ring.pass_on(kv) if step + 1 < ring.size else None  # the next block, under this one
        attend_block(queries, kv, ring.rank, (ring.rank - step) % ring.size, out, lse)
        if transfer is not None:
            kv = transfer.wait()
    return out.to(q.dtype).flatten(1, 2), lse


def ring_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, ring: Ring) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in the inputs' dtypes: K/V go round again, each block's fp32 dK/dV travelling with it."""
    side = backward_start(grad_out, q, out, lse, k.shape[1])
    kv = torch.stack((k, v))
    grad_kv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)  # for the K/V block held now
    returning = None
    for step in range(ring.size):
        transfer = ring.pass_on(kv) if step + 1 < ring.size else None
        cols, block_kv = block_backward(side, kv, ring.rank, (ring.rank - step) % ring.size)
        if returning is not None:
            grad_kv = returning.wait()  # the gradient of the block just received, from the previous rank
        grad_kv[..., cols, :] += block_kv
        returning = ring.pass_on(grad_kv)  # on to the next holder; after cp hops, home
        if transfer is not None:
            kv = transfer.wait()
    grad_kv = returning.wait()
    return side.grad_q.flatten(1, 2).to(q.dtype), grad_kv[0].to(k.dtype), grad_kv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """Forward and backward each go round the ring once; keeps q, k, v, the output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring) -> torch.Tensor:
        ctx.ring = ring
        with torch.autocast(q.device.type, enabled=False):  # the precision is chosen above, per product
            out, lse = ring_forward(q, k, v, ctx.ring)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        return (*ring_backward(grad_out.contiguous(), q, k, v, out, lse, ctx.ring), None)


class RingAttention(nn.Module):
    """Causal attention of zig-zag sequence shards, exact: K/V blocks passed round the cp group."""

    def __init__(self, group: dist.ProcessGroup):
        super().__init__()
        self.ring = Ring(group)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _RingAttention.apply(q, k, v, self.ring)
