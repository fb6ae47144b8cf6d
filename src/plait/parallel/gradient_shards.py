"""ZeRO-2's gradient path: each gradient reduce-scattered into the rows of it this rank owns.

A hook on every parameter sees its gradient once the backward pass has accumulated it. Buckets
follow the model's parameters in reverse, the order backward produces their gradients; each full
bucket is packed, its gradients freed, and reduce-scattered asynchronously while the backward
pass goes on, and a finished reduce-scatter's buffer is released as soon as it is seen done.
When the backward pass ends, the rank holds, for every parameter a backward reached, only the
averaged gradient of its own rows: ``torch.chunk``'s split of dim 0, as DTensor's ``Shard(0)``
and ``ShardedAdamW`` split it (of the rank's tp shard under tensor parallelism: a gradient is
first laid out as its parameter, which sums sequence-parallel partial sums over tp). Every rank
must reach the same parameters, as under DDP.

Not FSDP2 ``fully_shard(reshard_after_forward=False)``: it keeps the parameters sharded and
gathers a second, full copy for compute, so a rank holds 4Ψ/Nd bytes more than ZeRO-2's
replicated parameters; here the parameters stay whole and only the gradients are sharded.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.distributed.tensor import DTensor

from plait.parallel.tensor import laid_out_gradient
from plait.parallel.zero_rows import RowSplit, local_tensor

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket size
# torch 2.13 renamed the two single-tensor collectives and warns under the old names; torch
# before 2.13 has only those.
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


class GradientReduceScatter:
    """Hooks that leave each dp rank of ``split`` holding only its rows of every averaged gradient.

    ``params`` in the model's order. ``sync`` False (every micro-batch but the last) lets the
    gradients accumulate whole, untouched; so does ``in_backward`` False, for a pipeline stage,
    whose schedule interleaves many backward passes (``flush`` reduces them once, after it).
    ``shards`` maps each parameter to its gradient rows, a DTensor of the whole gradient, until
    ``clear``."""

    def __init__(self, params: list[nn.Parameter], split: RowSplit, bucket_bytes: int = BUCKET_BYTES,
                 in_backward: bool = True):
        self.split, self.group = split, split.group
        self.ranks, self.rank = split.ranks, split.rank
        self.sync = True
        self.wire_dtype: torch.dtype | None = None  # bf16 under --grad-compression bf16 (plait.parallel.compression)
        self.shards: dict[nn.Parameter, DTensor] = {}
        # The backward pass reaches the last parameters first: bucket them in that order.
        self.buckets = self._partition(list(reversed(params)), bucket_bytes)
        # Each parameter's rows per rank and their shapes, fixed for the run: the hooks only look them up.
        self._rows = {param: [split.rows(param, rank) for rank in range(self.ranks)] for param in params}
        self._shapes = {param: [split.shape(param, rank) for rank in range(self.ranks)] for param in params}
        self.widths = [max(sum(math.prod(self._shapes[p][rank]) for p in bucket) for rank in range(self.ranks))
                       for bucket in self.buckets]
        self._bucket_of = {param: index for index, bucket in enumerate(self.buckets) for param in bucket}
        self._ready = [0] * len(self.buckets)
        self._launched = 0
        self._in_flight: list[tuple[dist.Work, int, torch.Tensor, set[nn.Parameter]]] = []
        self._finish_queued = False
        if in_backward:  # a pipeline stage's hooks would only return: none are registered
            # A weak reference: a parameter that the autograd graph also holds from C++ hides its
            # hooks from Python's collector, so a bound method here would keep the model alive.
            gradient_ready = weakref.WeakMethod(self._gradient_ready)

            def hook(param: nn.Parameter) -> None:
                if (ready := gradient_ready()) is not None:  # None once the optimizer is gone
                    ready(param)

            for param in params:
                param.register_post_accumulate_grad_hook(hook)

    @staticmethod
    def _partition(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
        buckets: list[list[nn.Parameter]] = []
        size = 0
        for param in params:
            nbytes = local_tensor(param.detach()).numel() * param.element_size()
            if not buckets or size + nbytes > bucket_bytes or buckets[-1][0].dtype != param.dtype:
                buckets.append([])
                size = 0
            buckets[-1].append(param)
            size += nbytes
        return buckets

    def _gradient_ready(self, param: nn.Parameter) -> None:
        if not self.sync:
            return
        if not self._finish_queued:
            # What DDP and FSDP2 use too: a callback the autograd engine runs when this backward ends.
            Variable._execution_engine.queue_callback(self._finish)
            self._finish_queued = True
        self._ready[self._bucket_of[param]] += 1
        # Buckets go out in a fixed order, so every rank issues the same collectives in the same order.
        while self._launched < len(self.buckets) and self._ready[self._launched] == len(self.buckets[self._launched]):
            self._launch(self._launched)

    def _launch(self, index: int) -> None:
        """Pack each rank's rows of the bucket's gradients into that rank's segment; reduce-scatter."""
        self._release_finished()
        bucket, width = self.buckets[index], self.widths[index]
        grads = {param: local_tensor(laid_out_gradient(param)) for param in bucket if param.grad is not None}
        packed = torch.zeros(width * self.ranks, dtype=self.wire_dtype or bucket[0].dtype, device=bucket[0].device)
        for rank in range(self.ranks):
            offset = rank * width
            for param in bucket:
                count = math.prod(self._shapes[param][rank])
                if param in grads:  # one this backward did not reach contributes zeros
                    packed[offset:offset + count].copy_(grads[param][self._rows[param][rank]].reshape(-1))
                offset += count
        for param in bucket:
            param.grad = None
        mine = torch.empty(width, dtype=packed.dtype, device=packed.device)
        # The work keeps ``packed`` alive until it is released, and no longer.
        work = reduce_scatter_single(mine, packed, group=self.group, async_op=True)
        self._in_flight.append((work, index, mine, set(grads)))
        self._launched += 1

    def _release_finished(self) -> None:
        """Take the rows of every reduce-scatter already done, in launch order, freeing its buffer."""
        while self._in_flight and self._in_flight[0][0].is_completed():
            self._take_rows(*self._in_flight.pop(0))

    def _take_rows(self, work: dist.Work, index: int, mine: torch.Tensor, reached: set[nn.Parameter]) -> None:
        work.wait()
        mine = mine.to(self.buckets[index][0].dtype).div_(self.ranks)  # widened back from the wire's dtype
        offset = 0
        for param in self.buckets[index]:
            shape = self._shapes[param][self.rank]
            rows = mine[offset:offset + math.prod(shape)].view(shape)
            offset += rows.numel()
            if param not in reached:  # no gradient, no step, as torch's optimizers skip grad=None
                continue
            if param in self.shards:  # a second synchronised backward before the optimizer step
                self.shards[param].to_local().add_(rows)
            else:
                self.shards[param] = self.split.as_dtensor(rows, param)

    def _finish(self) -> None:
        while self._launched < len(self.buckets):
            self._launch(self._launched)
        while self._in_flight:
            self._take_rows(*self._in_flight.pop(0))
        self._restart()

    def _restart(self) -> None:
        self._ready = [0] * len(self.buckets)
        self._launched = 0
        self._finish_queued = False

    def flush(self) -> None:
        """Reduce what backward left whole: all of a pipeline stage's gradients, or those of earlier
        micro-batches after a synchronised backward that reached no parameter (after a normal one
        there is nothing left)."""
        if any(param.grad is not None for bucket in self.buckets for param in bucket):
            self._finish()

    def clear(self) -> None:
        """Drop the shards, and whatever a backward pass that raised left behind."""
        for work, *_ in self._in_flight:
            work.wait()  # its collective was issued on every rank; let it end before its buffers go
        self._in_flight.clear()
        self._restart()
        self.shards.clear()
