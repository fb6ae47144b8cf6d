"""All-gather context parallelism: every rank gathers the whole sequence's K/V, then attends its own
queries over it.

Llama 3's (Dubey et al. 2024, §3.3.2). The sequence is cut as the ring cuts it
(``plait.parallel.ring_attention.zigzag_positions``: chunks r and 2cp-1-r on rank r, so the causal
work is equal on every rank). Forward: one all-gather of the K/V blocks (k and v stacked, kv-heads
only), then the ring's blockwise attention over the cp blocks already at hand. Backward: the same
blocks' gradients, accumulated per block in fp32, then one reduce-scatter that sums every rank's
share of each block's dK/dV on its holder.

Against the ring: two collectives a layer instead of cp-1 hops forward and 2cp-1 backward, nothing
to hide under the attention (the gather precedes it, the reduce-scatter follows it), and the whole
sequence's K/V kept for backward (cp times the ring's; Transformer Engine's variant gathers them
again in backward instead). Backward also holds every block's fp32 dK/dV until the reduce-scatter,
twice the kept blocks' bytes under bf16, for the span of one layer's attention backward. With
grouped-query attention K/V are a small share of the activations, which is why Llama 3 chose it at
128k tokens.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

from plait.parallel.ring_attention import attend_block, backward_start, block_backward, by_kv_head, empty_attention

# torch 2.13 renamed the functional single-tensor collectives and warns under the old names; torch
# before 2.13 has only those (same arguments).
all_gather_single = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
reduce_scatter_single = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


def gathered_forward(q: torch.Tensor, blocks: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Output (q's shape and dtype) and fp32 log-sum-exp of ``rank``'s queries over ``blocks``
    (cp, 2, batch, kv_heads, seq/cp, head_dim): every rank's K/V, in rank order."""
    queries = by_kv_head(q, blocks.shape[3])
    out, lse = empty_attention(queries)
    for source in range(blocks.shape[0]):
        attend_block(queries, blocks[source], rank, source, out, lse)
    return out.to(q.dtype).flatten(1, 2), lse


def gathered_backward(grad_out: torch.Tensor, q: torch.Tensor, blocks: torch.Tensor, out: torch.Tensor,
                      lse: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq in q's dtype, this rank's fp32 share of every block's dK/dV, shaped as ``blocks``)."""
    side = backward_start(grad_out, q, out, lse, blocks.shape[3])
    grad_blocks = torch.zeros(blocks.shape, dtype=torch.float32, device=q.device)
    for source in range(blocks.shape[0]):
        cols, block_kv = block_backward(side, blocks[source], rank, source)
        grad_blocks[source][..., cols, :] += block_kv
    return side.grad_q.flatten(1, 2).to(q.dtype), grad_blocks


class _GatheredAttention(torch.autograd.Function):
    """Forward gathers K/V once; backward reduce-scatters their gradients once. Keeps q, the gathered
    K/V, the output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup,
                rank: int) -> torch.Tensor:
        ctx.group, ctx.rank = group, rank
        with torch.autocast(q.device.type, enabled=False):  # the precision is chosen above, per product
            blocks = all_gather_single(torch.stack((k, v)).unsqueeze(0), 0, group).wait()
            out, lse = gathered_forward(q, blocks, rank)
        ctx.save_for_backward(q, blocks, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, blocks, out, lse = ctx.saved_tensors
        grad_q, grad_blocks = gathered_backward(grad_out.contiguous(), q, blocks, out, lse, ctx.rank)
        mine = reduce_scatter_single(grad_blocks, "sum", 0, ctx.group).wait()[0]
        return grad_q, mine[0].to(blocks.dtype), mine[1].to(blocks.dtype), None, None


class GatheredAttention(nn.Module):
    """Causal attention of zig-zag sequence shards, exact: K/V all-gathered over the cp group."""

    def __init__(self, group: dist.ProcessGroup):
        super().__init__()
        self.group, self.rank = group, dist.get_rank(group)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _GatheredAttention.apply(q, k, v, self.group, self.rank)
