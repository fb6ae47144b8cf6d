"""Shared pieces of the pipeline benchmarks: equal stages, data, stage clocks, a gloo world of spawned ranks."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def equal_chunks(count: int, width: int, depth: int) -> list[nn.Module]:
    """``count`` identical-cost stage chunks (``depth`` Linear+GELU layers of ``width``), seeded."""
    torch.manual_seed(0)
    return [nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.GELU())])
            for _ in range(count)]


def batch(m: int, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``m`` micro-batches of ``rows`` rows, inputs and regression targets."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(m * rows, width, generator=generator), torch.randn(m * rows, width, generator=generator)


def _entry(rank: int, world: int, port: int, function: Callable, args: tuple, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)  # one compute thread per rank: the development machine has two cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        value = function(*args)
        if rank == 0:
            results.put(value)
    finally:
        dist.destroy_process_group()


def run_on_ranks(function: Callable, world: int, *args):
    """Call ``function(*args)`` on ``world`` fresh gloo ranks (one thread each); return rank 0's value."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    mp.start_processes(_entry, args=(world, port, function, args, results), nprocs=world, start_method="spawn")
    return results.get()



def alternating_medians(steps: int, plait_step: Callable[[], None], torch_step: Callable[[], None]) -> dict[str, float]:
    """Median seconds of ``steps`` steps of each (after two warm-up steps), the two alternating which
    goes first so machine noise hits both alike; every step between barriers, timed on this rank."""
    times: dict[str, list[float]] = {"plait": [], "torch": []}
    for step in range(steps + 2):
        order = (("plait", plait_step), ("torch", torch_step)) if step % 2 else (("torch", torch_step), ("plait", plait_step))
        for name, run in order:
            dist.barrier()
            start = time.perf_counter()
            run()
            dist.barrier()
            if step >= 2:  # the first two steps warm up both runtimes
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}

class StageClock:
    """Fixed durations for one stage chunk's forward and backward, so that every chunk costs the same.

    A control for the bubble benchmark: the chunk still does its real work, then waits (spinning, so
    it holds its core as compute does) until the action's fixed duration has passed. Set the durations
    above the slowest real action and the host's variation from one action to the next vanishes.
    """

    def __init__(self, forward_s: float, backward_s: float):
        self.forward_s, self.backward_s, self.started = forward_s, backward_s, 0.0


def _spin_until(deadline: float) -> None:
    while time.perf_counter() < deadline:
        pass


class _StartClock(torch.autograd.Function):
    """At the chunk's input: the forward starts the clock; the backward (the last step of B) waits it out."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, clock: StageClock) -> torch.Tensor:
        clock.started, ctx.clock = time.perf_counter(), clock
        return x.clone()  # not a view: the split backward detaches outputs in place

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        _spin_until(ctx.clock.started + ctx.clock.backward_s)
        return grad, None


class _StopClock(torch.autograd.Function):
    """At the chunk's output: the forward waits the clock out; the backward (the first step of B) starts it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, clock: StageClock) -> torch.Tensor:
        _spin_until(clock.started + clock.forward_s)
        ctx.clock = clock
        return x.clone()  # not a view: the split backward detaches outputs in place

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.clock.started = time.perf_counter()
        return grad, None


def start_clock(x: torch.Tensor, clock: StageClock) -> torch.Tensor:
    return _StartClock.apply(x, clock)


def stop_clock(x: torch.Tensor, clock: StageClock) -> torch.Tensor:
    return _StopClock.apply(x, clock)


class TimedChunk(nn.Module):
    """``chunk`` with its forward and backward held to ``clock``'s durations.

    An action whose real work outlasts its duration takes its real time. With ``stop=False`` (the
    last chunk) the caller stops the clock itself, after the loss, so the loss is held too.
    """

    def __init__(self, chunk: nn.Module, clock: StageClock, stop: bool = True):
        super().__init__()
        self.chunk, self.clock, self.stop = chunk, clock, stop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.chunk(start_clock(x, self.clock))
        return stop_clock(y, self.clock) if self.stop else y


def time_stage(chunk: nn.Module, x: torch.Tensor, iterations: int, warmup: int = 3) -> tuple[list, list]:
    """``iterations`` timings (seconds) of ``chunk``'s forward and of its backward on ``x``, after ``warmup``."""
    forward, backward = [], []
    for iteration in range(warmup + iterations):
        started = time.perf_counter()
        y = chunk(x)
        middle = time.perf_counter()
        y.backward(torch.ones_like(y))
        if iteration >= warmup:
            forward.append(middle - started)
            backward.append(time.perf_counter() - middle)
    chunk.zero_grad(set_to_none=True)
    return forward, backward


def slowest_action(chunk: nn.Module, rows: int, width: int, iterations: int = 12) -> tuple[float, float]:
    """The 90th percentile of ``chunk``'s forward and backward times here, the largest over all ranks.

    Every rank times its chunk at once, so the figures include what the ranks cost each other.
    """
    forward, backward = time_stage(chunk, torch.randn(rows, width, requires_grad=True), iterations)
    p90 = torch.tensor([sorted(forward)[iterations * 9 // 10], sorted(backward)[iterations * 9 // 10]])
    dist.all_reduce(p90, op=dist.ReduceOp.MAX)
    return float(p90[0]), float(p90[1])
