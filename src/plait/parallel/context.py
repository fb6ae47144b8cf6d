"""Context parallelism: the sequence split over cp ranks, attention exact across the split.

Three algorithms, chosen by ``Layout.cp_algorithm`` (``--cp-algorithm``):

- ``all-to-all`` (DeepSpeed-Ulysses, Jacobs et al. 2023; the default). Each rank holds a contiguous
  slice of positions and all heads; one all-to-all per tensor of q, k, v gives it the whole
  sequence for heads/cp heads, it runs the ordinary causal kernel, and one all-to-all returns the
  output to sequence shards. The kernel is the single-device one, so results match a single process
  to rounding and the causal mask needs no balancing. But cp must divide the heads per
  tensor-parallel rank, and grouped-query k, v travel expanded to the query heads.
- ``ring`` (Liu et al. 2023; ``plait.parallel.ring_attention``). Each rank holds two zig-zag chunks
  of the sequence (so the causal work is equal on every rank) and K/V blocks, with their kv-heads
  only, pass round the cp ranks under the blockwise attention, partial softmaxes merged by their
  log-sum-exp. No heads limit: cp may exceed heads/tp; the sequence must split into 2·cp chunks.
- ``all-gather`` (Llama 3; ``plait.parallel.gathered_attention``). The ring's zig-zag shards and
  blockwise kernel, but every rank's K/V gathered in one all-gather before the attention and their
  gradients reduce-scattered in one call after its backward: no per-hop steps, nothing hidden, and
  the whole sequence's K/V (kv-heads only) kept for backward.

Volume per rank and layer, forward (s·b tokens held, h hidden, kv = kv-heads·head_dim per tp rank):
the all-to-all hands 4 tensors of s·b·h/tp, of which (cp-1)/cp leaves the rank, a share that does not
grow with cp; the ring sends (cp-1) K/V blocks of 2·s·b·kv, growing with cp, but hidden under the
attention of the block before; the all-gather receives the same (cp-1) blocks at once, before the
attention. Backward: the all-to-all mirrors its forward; the ring sends K/V (cp-1) times again and
their fp32 gradients cp times; the all-gather reduce-scatters the fp32 gradients of all cp blocks.
Measured side by side on a 2-core CPU (``python -m benchmarks.cp_algorithms``,
docs/context_parallel.md), tiny-llama, cp 2: the ring sends half the bytes (kv-heads only) but takes
1.18× the all-to-all's step at seq-len 256 and 2.24× at 1024, its blockwise kernel being plain
PyTorch against the fused one, with nothing for its transfers to hide under; the all-gather, on the
same kernel, takes the ring's time. So the all-to-all stays the default; the ring and the all-gather
are for cp beyond heads/tp and grouped-query models, the ring where its hops hide under long
attention, the all-gather where many ranks would make them many small steps.

Every rank of a cp group holds the same weights; each computes gradients from its own tokens, so
the cp ranks average their gradients together with the dp ranks, in backward, and ZeRO shards over
both (``plait.parallel.gradients``, ``Layout.zero_dim``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plait.layout import ZIGZAG_ALGORITHMS
from plait.models.transformer import Transformer, expand_kv_heads
from plait.parallel.context_communications import scatter_heads_gather_sequence, scatter_sequence_gather_heads
from plait.parallel.gathered_attention import GatheredAttention
from plait.parallel.ring_attention import RingAttention, zigzag_positions
from plait.topology import Topology


class HeadExchangeAttention(nn.Module):
    """Causal attention of sequence shards, exact: all-to-all to head shards, attend, all-to-all back."""

    def __init__(self, group: dist.ProcessGroup):
        super().__init__()
        self.group = group

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = expand_kv_heads(q, k, v)  # the heads split over cp must be whole query heads with their k, v
        q, k, v = (scatter_heads_gather_sequence(t, self.group) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return scatter_sequence_gather_heads(out, self.group)


ATTENTION_CORES = {"all-to-all": HeadExchangeAttention, "ring": RingAttention, "all-gather": GatheredAttention}


def apply_context_parallel(model: Transformer, topology: Topology) -> Transformer:
    """Swap each block's attention kernel for the layout's: the head exchange, the ring or the gather."""
    cp = topology.size("cp")
    if cp == 1:
        return model
    group = topology.group("cp")
    core = ATTENTION_CORES[topology.layout.cp_algorithm]
    for block in model.layers.values():
        block.attention.core = core(group)
    return model


def context_shard(
    inputs: torch.Tensor, targets: torch.Tensor, topology: Topology
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """This cp rank's share of the sequences and the positions it holds (None if cp = 1): a contiguous
    slice under the all-to-all, zig-zag chunks r and 2cp-1-r under the ring and the all-gather."""
    cp = topology.size("cp")
    if cp == 1:
        return inputs, targets, None
    rank, length = topology.coordinate("cp"), inputs.shape[1]
    if topology.layout.cp_algorithm in ZIGZAG_ALGORITHMS:
        positions = zigzag_positions(length, rank, cp).to(inputs.device)
        return inputs[:, positions], targets[:, positions], positions
    start, local = rank * length // cp, length // cp
    return inputs[:, start:start + local], targets[:, start:start + local], torch.arange(start, start + local)


def average_over_context(value: torch.Tensor, topology: Topology) -> None:
    """In place: the mean of ``value`` over the cp group (each rank's loss covers its own tokens)."""
    if topology.size("cp") > 1:
        dist.all_reduce(value, group=topology.group("cp"))
        value /= topology.size("cp")
