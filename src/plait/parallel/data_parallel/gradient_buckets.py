"""Data-parallel gradients reduced in buckets while backward goes on, where no wrapper does it.

A hook on every parameter sees its gradient once backward has accumulated it. Buckets follow the
parameters in reverse, the order backward produces their gradients; a bucket whose gradients are
all there goes out as one asynchronous collective, buckets in a fixed order so every rank issues
the same collectives in the same order, and what has finished is taken as later buckets go out.
The buckets are the same at every step, the first after a start included, so a resumed run sums
each element in the order the uninterrupted one did (``plait.parallel.data_parallel.data.uses_ddp``). Every rank
must reach the same parameters, as under DDP. Two reductions share this:

- ``GradientAllReduce``: ZeRO 0/1 (but PowerSGD's, which DDP runs): each bucket all-reduced and averaged in place, on the rank's local tp shards, its
  gradients first laid out as their parameters (so sequence-parallel partial sums are summed over
  tp before dp averages them);
- ``plait.parallel.data_parallel.gradient_shards.GradientReduceScatter``: ZeRO-2's reduce-scatter into each
  rank's rows.

Without pipeline parallelism one backward finishes every gradient: the hooks reduce while ``sync``
(the last micro-batch; every one for ZeRO-2's reduce-scatter), and a callback the autograd engine
runs at the end of that backward sends what is left and waits for all. A pipeline stage runs many backward passes per step, one per
(chunk, micro-batch), and a chunk's gradients are final only after its last one (the last B, or
the last W of a zero-bubble schedule): the executor ``arm``s the chunk's hooks for that action and
``close``s it after, sending whatever its hooks did not (PyTorch's weight half of a split backward
accumulates gradients itself, so no hook sees them), as Megatron-LM overlaps each model chunk's
reduction with the rest of the schedule; ``finish`` waits for all before the optimizer step.
``in_backward`` False holds every bucket back until ``finish`` (the benchmark's baseline).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

from plait.facts.buckets import bucket_bytes
from plait.parallel.data_parallel.zero_rows import local_tensor
from plait.parallel.tensor import laid_out_gradient


def gradient_bytes(params: list[nn.Parameter]) -> int:
    """Bytes of the gradients of ``params`` this rank reduces (local shards)."""
    return sum(local_tensor(param.detach()).numel() * param.element_size() for param in params)


def default_bucket_bytes(params: list[nn.Parameter]) -> int:
    """The bucket size plait uses for reducing the gradients of ``params`` (plait.facts.buckets)."""
    return bucket_bytes(gradient_bytes(params))


@dataclass
class InFlight:
    """One bucket's collective: its work, the buffer it reduces into, and the gradients it reached
    (local tensors, by parameter: one a backward did not reach sent zeros and takes nothing)."""

    work: dist.Work
    index: int
    buffer: torch.Tensor
    grads: dict[nn.Parameter, torch.Tensor] = field(default_factory=dict)


class GradientBuckets:
    """Bucketed, asynchronous reduction of the gradients of ``chunks`` (chunk → its parameters in
    the model's order: one chunk without pipeline parallelism), ``bucket_bytes`` at most a bucket
    (a larger tensor alone), never two dtypes or two chunks in one. ``per_chunk``: driven by a
    pipeline executor (``arm``, ``close``) rather than by each backward's end. Subclasses send a
    bucket (``_send``) and take its result (``_take``)."""

    def __init__(self, chunks: Mapping[int, list[nn.Parameter]], bucket_bytes: int, per_chunk: bool = False):
        self.sync, self.in_backward, self.per_chunk = True, True, per_chunk
        self.wire_dtype: torch.dtype | None = None  # bf16 under --grad-compression bf16 (plait.parallel.data_parallel.compression)
        self.buckets: list[list[nn.Parameter]] = []
        self._spans: dict[int, range] = {}
        for chunk, params in chunks.items():
            start = len(self.buckets)
            # Backward reaches the last parameters first: bucket them in that order.
            self.buckets += self._partition(list(reversed(params)), bucket_bytes)
            self._spans[chunk] = range(start, len(self.buckets))
        self._bucket_of = {param: index for index, bucket in enumerate(self.buckets) for param in bucket}
        self._chunk_of = {param: chunk for chunk, params in chunks.items() for param in params}
        self._in_flight: deque[InFlight] = deque()
        self.finishes = 0  # backward passes whose reduction has finished, to tell one that reached nothing
        self._restart()
        # A weak reference: a parameter that the autograd graph also holds from C++ hides its hooks
        # from Python's collector, so a bound method here would keep the model alive after training.
        gradient_ready = weakref.WeakMethod(self._gradient_ready)

        def hook(param: nn.Parameter) -> None:
            if (ready := gradient_ready()) is not None:  # None once the optimizer is gone
                ready(param)

        for param in self._bucket_of:
            param.register_post_accumulate_grad_hook(hook)

    @staticmethod
    def _partition(params: list[nn.Parameter], limit: int) -> list[list[nn.Parameter]]:
        buckets: list[list[nn.Parameter]] = []
        size = 0
        for param in params:
            nbytes = gradient_bytes([param])
            if not buckets or size + nbytes > limit or buckets[-1][0].dtype != param.dtype:
                buckets.append([])
                size = 0
            buckets[-1].append(param)
            size += nbytes
        return buckets

    def _restart(self) -> None:
        self._ready = [0] * len(self.buckets)
        self._next = {chunk: span.start for chunk, span in self._spans.items()}
        self._armed: set[int] = set()
        self._finish_queued = False

    def _gradient_ready(self, param: nn.Parameter) -> None:
        chunk = self._chunk_of[param]
        if not self.in_backward or (chunk not in self._armed if self.per_chunk else not self.sync):
            return
        if not self.per_chunk and not self._finish_queued:
            # What DDP and FSDP2 use too: a callback the autograd engine runs when this backward ends.
            Variable._execution_engine.queue_callback(self.finish)
            self._finish_queued = True
        self._ready[self._bucket_of[param]] += 1
        self._send_ready(chunk)

    def _send_ready(self, chunk: int, everything: bool = False) -> None:
        """Send the chunk's buckets in order while the next is complete (``everything``: all that are left)."""
        span = self._spans[chunk]
        while self._next[chunk] < span.stop:
            index = self._next[chunk]
            if not (everything or self._ready[index] == len(self.buckets[index])):
                return
            while self._in_flight and self._in_flight[0].work.is_completed():
                self._take(self._in_flight.popleft())  # frees its buffer as early as it can
            self._in_flight.append(self._send(index))
            self._next[chunk] += 1

    def arm(self, chunk: int) -> None:
        """Before ``chunk``'s last backward action of the step: its hooks send its buckets."""
        if self.in_backward:
            self._armed.add(chunk)

    def close(self, chunk: int) -> None:
        """After ``chunk``'s last backward action: send what its hooks did not, without waiting."""
        if chunk in self._armed:
            self._armed.discard(chunk)
            self._send_ready(chunk, everything=True)

    def finish(self) -> None:
        """Send every bucket not yet sent, wait for all and take their results."""
        for chunk in self._spans:
            self._send_ready(chunk, everything=True)
        while self._in_flight:
            self._take(self._in_flight.popleft())
        self._restart()
        self.finishes += 1

    @contextlib.contextmanager
    def synchronising(self, enabled: bool) -> Iterator[None]:
        """Around one micro-batch's backward (without pipeline parallelism): reduce only if ``enabled``.
        A synchronised backward that reached no parameter still reduces what earlier micro-batches
        accumulated."""
        self.sync, finishes = enabled, self.finishes
        try:
            yield
        finally:
            self.sync = True
        if enabled and self.finishes == finishes and any(p.grad is not None for p in self._bucket_of):
            self.finish()

    def clear(self) -> None:
        """Drop whatever a backward that raised left behind: let every collective issued end first."""
        for entry in self._in_flight:
            entry.work.wait()  # issued on every rank; let it end before its buffers go
        self._in_flight.clear()
        self._restart()

    def _send(self, index: int) -> InFlight:
        raise NotImplementedError

    def _take(self, entry: InFlight) -> None:
        raise NotImplementedError

    def _laid_out_gradients(self, index: int) -> dict[nn.Parameter, torch.Tensor]:
        """The local tensors of the bucket's gradients, each first laid out as its parameter."""
        grads = {}
        for param in self.buckets[index]:
            if param.grad is not None:
                param.grad = laid_out_gradient(param)
                grads[param] = local_tensor(param.grad)
        return grads


class GradientAllReduce(GradientBuckets):
    """Every gradient averaged over the dp·cp ``group`` in place, bucket by bucket: ZeRO 0/1."""

    def __init__(self, chunks: Mapping[int, list[nn.Parameter]], group: dist.ProcessGroup, bucket_bytes: int,
                 per_chunk: bool = False):
        super().__init__(chunks, bucket_bytes, per_chunk)
        self.group, self.ranks = group, dist.get_world_size(group)
        self._sizes = {param: local_tensor(param.detach()).numel() for param in self._bucket_of}

    def _send(self, index: int) -> InFlight:
        bucket = self.buckets[index]
        grads = self._laid_out_gradients(index)
        packed = torch.zeros(sum(self._sizes[param] for param in bucket), dtype=self.wire_dtype or bucket[0].dtype,
                             device=bucket[0].device)
        offset = 0
        for param in bucket:
            if param in grads:  # one this backward did not reach contributes zeros
                packed[offset:offset + self._sizes[param]].copy_(grads[param].reshape(-1))
            offset += self._sizes[param]
        return InFlight(dist.all_reduce(packed, group=self.group, async_op=True), index, packed, grads)

    def _take(self, entry: InFlight) -> None:
        entry.work.wait()
        bucket = self.buckets[entry.index]
        mean = entry.buffer.to(bucket[0].dtype).div_(self.ranks)  # widened back from the wire's dtype
        offset = 0
        for param in bucket:
            if param in entry.grads:
                entry.grads[param].copy_(mean[offset:offset + self._sizes[param]].view_as(entry.grads[param]))
            offset += self._sizes[param]
