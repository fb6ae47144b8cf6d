"""Data-parallel scaling: dp = 2 throughput over twice dp = 1 throughput, one thread per rank.

Two models: a light one (many parameters, few tokens per step: synchronising the gradients costs
more than computing them) and a heavy one (few parameters, many tokens per step). For each it
prints the scaling efficiency and the compute-to-sync ratio, where compute is one rank's forward
and backward pass on its share of the batch (the work a second rank halves) and sync is an
all-reduce of every gradient (Ψ fp32 values) between the two ranks. The rest of a step — the
optimizer, which every rank repeats in full at ZeRO stage 0 — is printed as well. Both worlds run under plait's own ``train``, alternating, in one job;
each figure is the fastest of the rounds' medians, the round least disturbed by other work on
the machine.

    python benchmarks/data_parallel_scaling.py [--steps 12] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from plait.config import RunConfig, TrainSpec
from plait.layout import Layout
from plait.models.flops import parameter_count
from plait.models.spec import model_spec
from plait.topology import build_topology
from plait.train.data import BatchSource, default_corpus
from plait.train.loop import train

# name → (model fields, global batch)
MODELS = {
    "light": ({"layers": 2, "hidden": 768, "heads": 12, "vocab": 256, "seq_len": 4}, 2),
    "heavy": ({"layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 256}, 16),
}
REPEATS = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def compute_time(model: nn.Module, config: RunConfig) -> float:
    """Median seconds of a forward and backward pass on one rank's batch (no gradient sync at dp = 1)."""
    source = BatchSource(default_corpus(), config.model.seq_len, config.train.global_batch, config.train.seed)
    inputs, targets = source.local_batch(0, 0, 1)
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()).backward()
        times.append(time.perf_counter() - started)
        model.zero_grad(set_to_none=True)
    return statistics.median(times)


def sync_time(parameters: int) -> float:
    """Median seconds of an all-reduce of ``parameters`` fp32 gradients over the world."""
    gradients = torch.ones(parameters)
    times = []
    for _ in range(REPEATS):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(gradients)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def worker(rank: int, world: int, port: int, config: RunConfig, results) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = train(config, build_topology(config.layout, torch.device("cpu")))
    step = statistics.median(result.step_times[1:])
    other = sync_time(parameter_count(config.model)) if world > 1 else compute_time(result.model, config)
    if rank == 0:
        results.put((step, other))
    dist.destroy_process_group()


def median_step(config: RunConfig, results) -> tuple[float, float]:
    """(median step seconds, then at dp = 1 the compute time, at dp = 2 the sync time)."""
    world = config.layout.world_size
    mp.start_processes(worker, args=(world, free_port(), config, results), nprocs=world, start_method="spawn")
    return results.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results = mp.get_context("spawn").SimpleQueue()
    for name, (fields, batch) in MODELS.items():
        spec = model_spec(None, family="gpt2", **fields)
        def config(dp: int, global_batch: int) -> RunConfig:
            return RunConfig(spec, Layout(dp=dp), TrainSpec(steps=args.steps, global_batch=global_batch), model_name=name)
        one, two, half, compute, sync = [], [], [], [], []
        for _ in range(args.rounds):
            one.append(median_step(config(1, batch), results)[0])
            step, all_reduce = median_step(config(2, batch), results)
            two.append(step)
            sync.append(all_reduce)
            step, forward_backward = median_step(config(1, batch // 2), results)
            half.append(step)
            compute.append(forward_backward)
        t1, t2, c, s = min(one), min(two), min(compute), min(sync)
        print(f"{name}: Ψ={parameter_count(spec) / 1e6:.2f}M, batch {batch}×{spec.seq_len}: step dp1 {t1 * 1e3:.1f} ms, "
              f"dp2 {t2 * 1e3:.1f} ms; efficiency {t1 / (2 * t2):.2f}; per rank: compute {c * 1e3:.1f} ms / "
              f"sync {s * 1e3:.1f} ms = {c / s:.2f}, optimizer and the rest {(min(half) - c) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
