"""Context parallelism: the sequence split over cp ranks, attention exact across the split.

We exchange heads with an all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023) rather than pass
key/value blocks round a ring (Liu et al. 2023). Before attention each rank holds q, k, v for its
contiguous slice of positions and all heads; one all-to-all per tensor gives it the whole
sequence for heads/cp heads, it runs the ordinary causal attention kernel, and one all-to-all
returns the output to sequence shards. Why: the kernel is the single-device one, so results match
a single process to rounding, the causal mask needs no load balancing (every rank attends over
all positions of its heads), and it needs only all-to-all, which gloo has. The trade-off: cp is
capped by the heads per tensor-parallel rank (cp must divide heads/tp), and grouped-query k, v
travel expanded to the query heads; a ring has no such cap, moves only the kv-heads and overlaps
its transfers with compute, but merges partial softmaxes (its result differs by summation order),
needs zig-zag chunking to balance the causal mask, and moves (cp-1)/cp of all k, v per layer
where the all-to-all moves 4 tensors' (cp-1)/cp share once each: volume per rank that does not
grow with cp.

Every rank of a cp group holds the same weights; each computes gradients from its own tokens, so
gradients are averaged over cp after backward (``plait.parallel.gradients``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plait.models.transformer import Transformer
from plait.parallel.context_communications import scatter_heads_gather_sequence, scatter_sequence_gather_heads
from plait.topology import Topology


class HeadExchangeAttention(nn.Module):
    """Causal attention of sequence shards, exact: all-to-all to head shards, attend, all-to-all back."""

    def __init__(self, group: dist.ProcessGroup):
        super().__init__()
        self.group = group

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (scatter_heads_gather_sequence(t, self.group) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return scatter_sequence_gather_heads(out, self.group)


def apply_context_parallel(model: Transformer, topology: Topology) -> Transformer:
    """Swap each block's attention kernel for the head exchange."""
    cp = topology.size("cp")
    if cp == 1:
        return model
    group = topology.group("cp")
    for block in model.layers.values():
        block.attention.core = HeadExchangeAttention(group)
    return model


def context_shard(
    inputs: torch.Tensor, targets: torch.Tensor, topology: Topology
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """This cp rank's contiguous slice of the sequences, and the positions it holds (None if cp = 1)."""
    cp = topology.size("cp")
    if cp == 1:
        return inputs, targets, None
    length = inputs.shape[1] // cp
    start = topology.coordinate("cp") * length
    window = slice(start, start + length)
    return inputs[:, window], targets[:, window], torch.arange(start, start + length)


def average_over_context(value: torch.Tensor, topology: Topology) -> None:
    """In place: the mean of ``value`` over the cp group (each rank's loss covers its own tokens)."""
    if topology.size("cp") > 1:
        dist.all_reduce(value, group=topology.group("cp"))
        value /= topology.size("cp")
