"""Functions the worker pool runs on every rank for the span tracer's tests (module level, so they pickle)."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from plait.config import RunConfig
from plait.layout import Layout
from plait.observe.step_trace import StepTracer
from plait.topology import build_topology
from plait.train.loop import train


def traced_run(config: RunConfig, run_dir: str) -> tuple[list[dict] | None, dict[int, float]]:
    """Train ``config`` tracing every step after the first: every rank's traced steps (on rank 0, None
    elsewhere) and this rank's own step times as the loop measured them, by step."""
    config = replace(config, train=replace(config.train, trace_every=1))
    topology = build_topology(config.layout, torch.device("cpu"))
    result = train(config, topology, Path(run_dir))
    return result.traces, dict(enumerate(result.step_times, start=result.first_step))


def _delaying_hook(delay_s: float):
    """A DDP communication hook: on every other step rank 1 issues the bucket's all-reduce ``delay_s``
    late, so on rank 0 that collective completes ``delay_s`` later than it would."""
    calls = itertools.count()

    def hook(state, bucket):
        if dist.get_rank() == 1 and next(calls) % 2:
            time.sleep(delay_s)
        work = dist.all_reduce(bucket.buffer(), async_op=True)
        return work.get_future().then(lambda future: future.value()[0] / dist.get_world_size())

    return hook


def ddp_steps_with_delay(delay_s: float, steps: int) -> list[dict]:
    """Train a small DDP model for ``steps`` traced steps, its one gradient bucket's all-reduce issued
    ``delay_s`` late by rank 1 on every other step (the odd ones, counting the untraced warm-up as
    step 0); returns this rank's traced steps."""
    topology = build_topology(Layout(dp=dist.get_world_size()), torch.device("cpu"))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)))
    model.register_comm_hook(None, _delaying_hook(delay_s))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracer = StepTracer(topology, every=1, first_step=0, end_step=steps + 1)
    inputs = torch.randn(64, 256)
    for step in range(steps + 1):  # the first step is warm-up, not traced
        with tracer.step(step):
            with tracer.span("forward"):
                loss = model(inputs).square().mean()
            with tracer.span("backward"):
                loss.backward()
            with tracer.span("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
    return tracer.records


def profiled_run(config: RunConfig, run_dir: str, steps: str) -> None:
    """Train ``config`` with ``--profile-steps steps``."""
    config = replace(config, train=replace(config.train, profile_steps=steps))
    train(config, build_topology(config.layout, torch.device("cpu")), Path(run_dir))


def _traced_with_a_delay(config: RunConfig, run_dir: str, owner: type, method: str, delay_s: float) -> None:
    """``traced_run`` with ``owner.method`` sleeping ``delay_s`` before each call."""
    original = getattr(owner, method)

    def slow(self, *args, **kwargs):
        time.sleep(delay_s)
        return original(self, *args, **kwargs)

    setattr(owner, method, slow)
    try:
        traced_run(config, run_dir)
    finally:
        setattr(owner, method, original)


def run_with_a_slow_loader(config: RunConfig, run_dir: str, delay_s: float) -> None:
    """``traced_run`` with every batch read ``delay_s`` late: a run starved by its data loader."""
    from plait.train.data import BatchSource

    _traced_with_a_delay(config, run_dir, BatchSource, "local_batch", delay_s)


def run_with_a_slow_host(config: RunConfig, run_dir: str, delay_s: float) -> None:
    """``traced_run`` whose host spends ``delay_s`` on every learning-rate step, between the step's
    operations: a run bound by its host's own work."""
    from torch.optim.lr_scheduler import LambdaLR

    _traced_with_a_delay(config, run_dir, LambdaLR, "step", delay_s)
