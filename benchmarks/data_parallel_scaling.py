"""Data-parallel scaling: dp = 2 throughput over twice dp = 1 throughput, one thread per rank.

Two models: a light one (many parameters, few tokens per step: synchronising the gradients costs
more than computing them) and a heavy one (few parameters, many tokens per step). For each it
prints the scaling efficiency and the compute-to-sync ratio, where compute is one rank's step at
dp = 1 on its share of the batch and sync is an all-reduce of every gradient (Ψ fp32 values)
between the two ranks. Both worlds run under plait's own ``train``, alternating, in one job;
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

from plait.config import RunConfig, TrainSpec
from plait.layout import Layout
from plait.models.flops import parameter_count
from plait.models.spec import model_spec
from plait.topology import build_topology
from plait.train.loop import train

# name → (model fields, global batch)
MODELS = {
    "light": ({"layers": 2, "hidden": 768, "heads": 12, "vocab": 256, "seq_len": 4}, 2),
    "heavy": ({"layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 256}, 16),
}
SYNC_REPEATS = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker(rank: int, world: int, port: int, config: RunConfig, results) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    step_times = train(config, build_topology(config.layout, torch.device("cpu"))).step_times[1:]
    gradients = torch.ones(parameter_count(config.model))
    sync_times = []
    for _ in range(SYNC_REPEATS):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(gradients)
        sync_times.append(time.perf_counter() - started)
    if rank == 0:
        results.put((statistics.median(step_times), statistics.median(sync_times)))
    dist.destroy_process_group()


def median_step(config: RunConfig, results) -> tuple[float, float]:
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
        one, two, compute, sync = [], [], [], []
        for _ in range(args.rounds):
            one.append(median_step(config(1, batch), results)[0])
            step, all_reduce = median_step(config(2, batch), results)
            two.append(step)
            sync.append(all_reduce)
            compute.append(median_step(config(1, batch // 2), results)[0])
        t1, t2, c, s = min(one), min(two), min(compute), min(sync)
        print(f"{name}: Ψ={parameter_count(spec) / 1e6:.2f}M, batch {batch}×{spec.seq_len}: step dp1 {t1 * 1e3:.1f} ms, "
              f"dp2 {t2 * 1e3:.1f} ms; efficiency {t1 / (2 * t2):.2f}; compute {c * 1e3:.1f} ms / sync "
              f"{s * 1e3:.1f} ms = {c / s:.2f}")


if __name__ == "__main__":
    main()
