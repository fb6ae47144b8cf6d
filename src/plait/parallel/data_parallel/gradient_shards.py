"""ZeRO-2's gradient path: each gradient reduce-scattered into the rows of it this rank owns.

The hooks and buckets are ``plait.parallel.data_parallel.gradient_buckets``'s (shared with the all-reduce of
ZeRO 0/1): each full bucket is packed, its gradients freed, and
reduce-scattered asynchronously while the backward pass goes on, and a finished reduce-scatter's
buffer is released as soon as it is seen done. When the backward pass ends (on a pipeline stage,
once ``finish`` has waited for every chunk's buckets), the rank holds, for every parameter a
backward reached, only the averaged gradient of its own rows, in fp32: ``torch.chunk``'s split of dim 0,
as DTensor's ``Shard(0)`` and ``ShardedAdamW`` split it (of the rank's tp shard under tensor
parallelism: a gradient is first laid out as its parameter, which sums sequence-parallel partial
sums over tp). Every rank must reach the same parameters.

Without pipeline parallelism every micro-batch's backward reduce-scatters its gradients (as FSDP2
does under ZeRO-3) and the rows are summed over the micro-batches in fp32, as DeepSpeed's ZeRO-2
accumulates into its fp32 partitions: the rank never holds a whole gradient past the backward that
made it, and over bf16 weights the sum is not rounded to bf16 micro-batch by micro-batch. A
pipeline stage accumulates its whole gradients over the schedule and reduce-scatters them once.

Not FSDP2 ``fully_shard(reshard_after_forward=False)``: it keeps the parameters sharded and
gathers a second, full copy for compute, so a rank holds 4Ψ/Nd bytes more than ZeRO-2's
replicated parameters; here the parameters stay whole and only the gradients are sharded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from plait.parallel.data_parallel.gradient_buckets import GradientBuckets, InFlight
from plait.parallel.data_parallel.zero_rows import RowSplit

# torch 2.13 renamed the two single-tensor collectives and warns under the old names; torch
# before 2.13 has only those.
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


@dataclass(frozen=True)
class GradientSharding:
    """How ZeRO-2 reduce-scatters the gradients: ``chunks`` maps each chunk to the model's parameters
    in order (one chunk without pipeline parallelism), bucketed in the reverse of that order
    (``bucket_bytes``, None for plait.facts.buckets' rule), in backward or, on a pipeline stage
    (``per_chunk``), as its executor finishes each chunk."""

    chunks: Mapping[int, list[nn.Parameter]]
    bucket_bytes: int | None = None
    per_chunk: bool = False


class GradientReduceScatter(GradientBuckets):
    """Hooks that leave each dp rank of ``split`` holding only its rows of every averaged gradient.

    ``chunks`` and ``per_chunk`` as ``GradientBuckets``. Each bucket is packed into per-rank
    segments and reduce-scattered; without pipeline parallelism its gradients are freed as it goes
    out, on a pipeline stage (whose every chunk's gradients are whole until its last backward, so
    freeing early lowers no peak) when ``finish`` has taken all the rows, after the measurement of
    what the stage held (plait.parallel.gradients). ``shards`` maps each parameter to its gradient
    rows, a DTensor of the whole gradient, until ``clear``."""

    def __init__(self, chunks: Mapping[int, list[nn.Parameter]], split: RowSplit, bucket_bytes: int,
                 per_chunk: bool = False):
        super().__init__(chunks, bucket_bytes, per_chunk)
        self.split, self.group = split, split.group
        self.ranks, self.rank = split.ranks, split.rank
        self.shards: dict[nn.Parameter, DTensor] = {}
        params = list(self._bucket_of)
        # Each parameter's rows per rank and their shapes, fixed for the run: the hooks only look them up.
        self._rows = {param: [split.rows(param, rank) for rank in range(self.ranks)] for param in params}
        self._shapes = {param: [split.shape(param, rank) for rank in range(self.ranks)] for param in params}
        self.widths = [max(sum(math.prod(self._shapes[p][rank]) for p in bucket) for rank in range(self.ranks))
                       for bucket in self.buckets]

    def _send(self, index: int) -> InFlight:
        """Pack each rank's rows of the bucket's gradients into that rank's segment; reduce-scatter."""
        bucket, width = self.buckets[index], self.widths[index]
        grads = self._laid_out_gradients(index)
        packed = torch.zeros(width * self.ranks, dtype=self.wire_dtype or bucket[0].dtype, device=bucket[0].device)
        for rank in range(self.ranks):
            offset = rank * width
            for param in bucket:
                count = math.prod(self._shapes[param][rank])
                if param in grads:  # one this backward did not reach contributes zeros
                    packed[offset:offset + count].copy_(grads[param][self._rows[param][rank]].reshape(-1))
                offset += count
        if not self.per_chunk:
            for param in bucket:
                param.grad = None
        mine = torch.empty(width, dtype=packed.dtype, device=packed.device)
        # The work keeps ``packed`` alive until it is taken, and no longer.
        work = reduce_scatter_single(mine, packed, group=self.group, async_op=True)
        return InFlight(work, index, mine, grads)

    def _take(self, entry: InFlight) -> None:
        entry.work.wait()
        # The rows are kept, and summed over the micro-batches, in fp32 whatever the wire's dtype.
        mine = entry.buffer.to(torch.float32).div_(self.ranks)
        offset = 0
        for param in self.buckets[entry.index]:
            shape = self._shapes[param][self.rank]
            rows = mine[offset:offset + math.prod(shape)].view(shape)
            offset += rows.numel()
            if param not in entry.grads:  # no gradient, no step, as torch's optimizers skip grad=None
                continue
            if param in self.shards:  # a second synchronised backward before the optimizer step
                self.shards[param].to_local().add_(rows)
            else:
                self.shards[param] = self.split.as_dtensor(rows, param)

    def finish(self) -> None:
        super().finish()
        if self.per_chunk:
            for param in self._bucket_of:
                param.grad = None

    def clear(self) -> None:
        """Drop the shards, and whatever a backward pass that raised left behind."""
        super().clear()
        self.shards.clear()
