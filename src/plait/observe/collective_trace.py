"""Every collective and point-to-point transfer one rank issues while a step is traced, and when the
rank waited for it.

Every collective plait issues goes through PyTorch's dispatcher: ``c10d::*`` ops (``dist.*``
calls, DDP's reducer, FSDP2, the pipeline's ``isend``/``irecv``) and ``_c10d_functional::*`` ops
with ``wait_tensor`` (DTensor's tensor and sequence parallelism, plait's context-parallel
exchanges). A dispatch mode sees each with its process group and tensors, as PyTorch's own
``CommDebugMode`` does. Our own mode rather than torch.profiler because on gloo the profiler records
neither a collective's process group nor its bytes (no ``record_param_comms`` events), and nothing
that says when the rank waited.

When the rank waited: a ``c10d`` op returns a ``Work`` whose future calls back when the transfer
completes (on gloo's thread); gloo's point-to-point work has none and is polled at each op
(``Work.is_completed``), so it is seen complete at the start of the op after its wait. The main thread runs ops back to back unless it is blocked; a gap
between two ops in which a transfer completed is time the rank waited for that transfer (a sync
``dist.all_reduce``, ``Work.wait``, DDP's wait at the end of backward). A functional collective is
waited for by its ``wait_tensor`` op, whose whole duration is the wait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

# The dispatcher's names for the ops plait issues, by the name a trace gives them.
OP_NAMES = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast", "broadcast": "broadcast", "barrier": "barrier", "send": "send", "recv_": "recv",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter",
}
INPUT_ARGUMENTS = ("input_tensors", "input_tensor", "inputs", "input", "tensors", "tensor")


@dataclass
class Transfer:
    """One collective or point-to-point transfer: times in seconds of ``time.perf_counter``."""

    op: str
    group: str
    bytes: int
    issued: float
    completed: float | None = None
    peer: int | None = None  # a send's destination or a receive's source (global rank)


@dataclass(frozen=True)
class Wait:
    """The rank blocked from ``start`` to ``end`` for transfer number ``transfer``."""

    start: float
    end: float
    transfer: int


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


class CollectiveTracer(TorchDispatchMode):
    """``with CollectiveTracer(group_names) as tracer: ...`` then ``tracer.transfers``, ``tracer.waits``.

    ``group_names`` maps a process group's ranks (a sorted tuple of global ranks) to its name in
    the layout (dp, tp, cp, pp, dp_replicate, dp_shard); other groups are named by their ranks."""

    def __init__(self, group_names: dict[tuple[int, ...], str]):
        super().__init__()
        self.group_names = group_names
        self.transfers: list[Transfer] = []
        self.waits: list[Wait] = []
        self._completions: list[tuple[float, int]] = []  # appended by gloo's thread (list.append is atomic)
        self._unfinished: list[tuple[int, object]] = []  # transfers whose work has no future, and that work
        self._functional: dict[int, int] = {}  # id of a functional collective's output -> its transfer
        self._last_end = time.perf_counter()
        self._ops: dict[object, str | None] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        started = time.perf_counter()
        if self._completions or self._unfinished:
            self._settle(started)
        name = self._ops.get(func)
        if name is None and func not in self._ops:
            name = self._ops[func] = self._op_name(func)
        if name is None:
            out = func(*args, **kwargs)
        elif name == "wait":
            out = func(*args, **kwargs)
            index = self._functional.pop(id(args[0]), None)
            if index is not None:
                self.transfers[index].completed = time.perf_counter()
                self.waits.append(Wait(started, self.transfers[index].completed, index))
        else:
            out = func(*args, **kwargs)
            self._record(func, name, args, kwargs, out, started)
        self._last_end = time.perf_counter()
        return out

    @staticmethod
    def _op_name(func) -> str | None:
        namespace, op = func.namespace, func._overloadpacket.__name__
        if namespace == "_c10d_functional" and op == "wait_tensor":
            return "wait"
        return OP_NAMES.get(op) if namespace in ("c10d", "_c10d_functional") else None

    def _settle(self, now: float) -> None:
        """The gap since the last op ended: if a transfer completed in it, the rank was waiting for the
        last of them until now (until it resumed, which also covers what a future chained to the
        transfer does, such as a DDP communication hook's)."""
        if self._unfinished:
            self._poll(now)
        done, self._completions = self._completions, []
        in_gap = [(at, index) for at, index in done if self._last_end < at <= now]
        if in_gap:
            self.waits.append(Wait(self._last_end, now, max(in_gap)[1]))

    def _poll(self, now: float) -> None:
        """Transfers without a future found complete now: they completed by ``now`` (an upper bound)."""
        unfinished = []
        for index, work in self._unfinished:
            if work.is_completed():
                self.transfers[index].completed = now
                self._completions.append((now, index))
            else:
                unfinished.append((index, work))
        self._unfinished = unfinished

    def _record(self, func, name: str, args, kwargs, out, started: float) -> None:
        schema = func._schema.arguments
        values = {argument.name: value for argument, value in zip(schema, args)} | kwargs
        payload = next(values[n] for n in INPUT_ARGUMENTS if n in values)
        group, ranks = self._group(values)
        if len(ranks) == 1:  # a group of one rank (a dimension of size 1) moves nothing
            return
        peer = None
        for key in ("dst", "src"):
            if key in values:
                peer = ranks[values[key]] if func.namespace == "c10d" else values[key]
        index = len(self.transfers)
        self.transfers.append(Transfer(name, group, 0 if name == "barrier" else _tensor_bytes(payload), started, peer=peer))
        if func.namespace == "_c10d_functional":
            self._functional[id(out)] = index
            return
        work = out[-1] if isinstance(out, (tuple, list)) else out
        work = dist.distributed_c10d.Work.unbox(work)
        try:
            future = work.get_future()
        except RuntimeError:  # gloo's send and receive have no future: polled at each op instead
            self._unfinished.append((index, work))
            return
        future.add_done_callback(lambda _: self._complete(index))

    def _complete(self, index: int) -> None:
        at = time.perf_counter()
        self.transfers[index].completed = at
        self._completions.append((at, index))

    def _group(self, values: dict) -> tuple[str, tuple[int, ...]]:
        if "process_group" in values:
            group = dist.ProcessGroup.unbox(values["process_group"])
        else:
            group = dist.distributed_c10d._resolve_process_group(values["group_name"])
        ranks = tuple(dist.get_process_group_ranks(group))
        name = self.group_names.get(tuple(sorted(ranks)))
        return name or "ranks " + ",".join(map(str, ranks)), ranks
