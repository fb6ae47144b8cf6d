"""Every collective and point-to-point transfer one rank issues while a step is traced, and when the
rank waited for it.

Every collective plait issues goes through PyTorch's dispatcher: ``c10d::*`` ops (``dist.*``
calls, DDP's reducer, FSDP2, the pipeline's ``isend``/``irecv``) and ``_c10d_functional::*`` ops
with ``wait_tensor`` (DTensor's tensor and sequence parallelism, plait's context-parallel
exchanges). A dispatch mode sees each with its process group and tensors, as PyTorch's own
``CommDebugMode`` does. Our own mode rather than torch.profiler because on gloo the profiler records
neither a collective's process group nor its bytes (no ``record_param_comms`` events), and nothing
that says when the rank waited.

When the rank waited: a ``c10d`` op returns a ``Work``, which the tracer polls
(``Work.is_completed``, the C++ state, so no callback waits for the GIL) at the start of each op
until it is complete. The main thread runs ops back to back unless it is blocked, so a transfer
found complete at an op's start completed in the gap before it (or in the op before, off by that
op at most), and the gap was the rank waiting for it (a sync ``dist.all_reduce``, ``Work.wait``,
DDP's wait at the end of backward); its completion time is that op's start. A functional collective is
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

    ``group_names`` maps a process group's name in torch (``ProcessGroup.group_name``) to its name
    in the layout (dp, tp, cp, pp, dp_replicate, dp_shard, dp_cp, dp_shard_cp:
    ``Topology.group_names``); other groups are named by their ranks."""

    def __init__(self, group_names: dict[str, str]):
        super().__init__()
        self.group_names = group_names
        self.transfers: list[Transfer] = []
        self.waits: list[Wait] = []
        self._unfinished: list[tuple[int, object]] = []  # transfers in flight, each with its Work
        self._functional: dict[int, int] = {}  # id of a functional collective's output -> its transfer
        self._last_end = time.perf_counter()
        self._ops: dict[object, str | None] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        started = time.perf_counter()
        if self._unfinished:
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
        """Transfers found complete now completed in the gap since the last op ended or in that op;
        the rank waited the gap for the last of them (until it resumed: a blocked wait, or
        a future chained to the transfer such as a DDP communication hook's)."""
        done = [index for index, work in self._unfinished if work.is_completed()]
        if done:
            done = self._with_earlier_collectives(done)
            self._unfinished = [(index, work) for index, work in self._unfinished if index not in done]
            for index in done:
                self.transfers[index].completed = now
            self.waits.append(Wait(self._last_end, now, max(done)))

    def _with_earlier_collectives(self, done: list[int]) -> set[int]:
        """``done`` and the unfinished collectives issued before one of them in its group: a process group
        runs its collectives in the order issued. (Gloo's reduce-scatter never reports completion; its
        Work, holding a layer's whole gradient, would otherwise be kept to the end of the step.)"""
        latest: dict[str, int] = {}
        for index in done:
            transfer = self.transfers[index]
            if transfer.peer is None:
                latest[transfer.group] = max(index, latest.get(transfer.group, -1))
        earlier = [index for index, _ in self._unfinished
                   if self.transfers[index].peer is None and index < latest.get(self.transfers[index].group, -1)]
        return {*done, *earlier}

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
        self._unfinished.append((index, dist.distributed_c10d.Work.unbox(work)))

    def _group(self, values: dict) -> tuple[str, tuple[int, ...]]:
        if "process_group" in values:
            group = dist.ProcessGroup.unbox(values["process_group"])
        else:
            group = dist.distributed_c10d._resolve_process_group(values["group_name"])
        ranks = tuple(dist.get_process_group_ranks(group))
        return self.group_names.get(group.group_name) or "ranks " + ",".join(map(str, ranks)), ranks
