"""Pipeline functions the worker pool runs on every rank (module level, so they pickle by name)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from plait.parallel.pipeline_executor import BoundaryTransfers, Executor
from plait.schedules import generate

WIDTH = 8


def toy_chunks(count: int) -> list[nn.Module]:
    """Equal stage chunks with fixed weights: every rank builds the same ones."""
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(count)]


def toy_data(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(m, 2, WIDTH, generator=generator), torch.randn(m, 2, WIDTH, generator=generator)


def toy_gradients(pp: int, m: int, v: int) -> list[list[torch.Tensor]]:
    """Single-process reference: each chunk's parameter gradients after accumulating every micro-batch."""
    chunks = toy_chunks(pp * v)
    inputs, targets = toy_data(m)
    for mb in range(m):
        h = inputs[mb]
        for chunk in chunks:
            h = chunk(h)
        (((h - targets[mb]) ** 2).mean() / m).backward()
    return [[p.grad for p in chunk.parameters()] for chunk in chunks]


def run_toy_schedule(name: str, m: int, v: int) -> dict:
    """Run the generated list on this rank; report what ran, the peak activations and the gradients."""
    pp, rank = dist.get_world_size(), dist.get_rank()
    schedule = generate(name, pp, m, v)
    chunks = toy_chunks(pp * v)
    mine = {c: chunks[c] for c in schedule.chunks_of(rank)}
    inputs, targets = toy_data(m)

    def loss_fn(output: torch.Tensor, mb: int) -> torch.Tensor:
        return ((output - targets[mb]) ** 2).mean() / m

    executor = Executor(schedule, rank, mine, loss_fn, BoundaryTransfers(None, torch.device("cpu"), lambda mb: (2, WIDTH)))
    record = executor.run(list(inputs))
    return {
        "executed": [span.action for span in record.spans],
        "peak": record.peak_in_flight,
        "grads": {c: [p.grad for p in chunk.parameters()] for c, chunk in mine.items()},
    }


def pipeline_losses(configs: list) -> list[tuple[list[float], dict | None]]:
    """Per-step losses of each config, all on one mesh (their layouts differ only in schedule and m),
    with every rank's traced volumes of its last step on rank 0 (tests.cases.traced_volumes).

    Building the mesh once for many runs keeps the parity matrix fast on a 2-core machine.
    """
    from dataclasses import replace

    from plait.topology import build_topology
    from plait.train.loop import train
    from tests.cases import traced_volumes, tracing_the_last_step

    topology = build_topology(configs[0].layout, torch.device("cpu"))
    out = []
    for config in configs:
        config = tracing_the_last_step(config)
        result = train(config, replace(topology, layout=config.layout))
        out.append((result.losses, traced_volumes(result.traces)))
    return out
