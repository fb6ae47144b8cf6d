"""Shared pieces of the pipeline benchmarks: equal stages, data, and a gloo world of spawned ranks."""

from __future__ import annotations

import os
import socket
from typing import Callable

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
