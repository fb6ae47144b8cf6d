"""Data-parallel scaling: dp = 2 throughput over twice dp = 1 throughput, one thread per rank.

Two models: a light one (many parameters, few tokens per step: synchronising the gradients costs
more than computing them) and a heavy one (few parameters, many tokens per step). Every run is
plait's own ``train`` (ZeRO stage 0: DDP, fused AdamW, clipping, the loss all-reduce it logs), in
fresh processes; a step time is the median over the steps after the first two. Each round runs,
in an order rotated from round to round so that load from other work falls on all alike:

- dp1: one rank, the global batch;
- dp2: two ranks, the same global batch (half on each);
- dp1 half: one rank, half the global batch: the work of one dp2 rank without a second rank;
- 2 × dp1 half: two unrelated dp1-half runs at once, sharing nothing: the machine as busy as at
  dp2 (both cores, their shared cache and memory), without data parallelism. Its step is the
  slower run's.

Every figure is the fastest of the rounds' (other work only ever slows a run down, so the fastest
round is the least disturbed), and the efficiencies of each round are printed beside it, to show
the spread. Two efficiencies: at the same global batch,
dp1 / (2 · dp2), what a second rank gives a fixed batch; and at the same batch per rank,
(dp1 half) / dp2, which holds each rank's working set equal, so that it leaves out how a
smaller per-rank batch changes the speed of the arithmetic itself (on a CPU, better cache reuse).
A third, (2 × dp1 half) / dp2, compares dp2 with the same two processes' worth of work run with no
communication, so it is what data parallelism itself costs, the machine's two-core ceiling left out.
It also prints the compute-to-sync ratio, where compute is one rank's forward and backward pass on
its half of the batch (the work a second rank halves) and sync is an all-reduce of every gradient
(Ψ fp32 values) between the two ranks; the rest of a step — the optimizer, which every rank
repeats in full at ZeRO stage 0, and the loop — is printed as well.

    python benchmarks/data_parallel_scaling.py [--steps 10] [--rounds 3]
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


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


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
    step = statistics.median(result.step_times[2:])
    other = sync_time(parameter_count(config.model)) if world > 1 else compute_time(result.model, config)
    if rank == 0:
        results.put((step, other))
    dist.destroy_process_group()


def unrelated_worker(index: int, ports: list[int], config: RunConfig, results) -> None:
    """One of several dp = 1 runs started together: each a world of its own, sharing no gradients."""
    worker(0, 1, ports[index], config, results)


def median_step(config: RunConfig, results, copies: int = 1) -> tuple[float, float]:
    """(median step seconds, then at dp = 1 the compute time, at dp = 2 the sync time). With
    ``copies`` > 1, that many unrelated dp = 1 runs at once, and the slower one's figures."""
    if copies > 1:
        mp.start_processes(unrelated_worker, args=(free_ports(copies), config, results), nprocs=copies,
                           start_method="spawn")
        return max(results.get() for _ in range(copies))
    world = config.layout.world_size
    mp.start_processes(worker, args=(world, free_ports(1)[0], config, results), nprocs=world, start_method="spawn")
    return results.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = mp.get_context("spawn").SimpleQueue()
    for name, (fields, batch) in MODELS.items():
        spec = model_spec(None, family="gpt2", **fields)
        # name → (dp, global batch, copies run at once)
        runs = {"dp1": (1, batch, 1), "dp2": (2, batch, 1), "dp1 half": (1, batch // 2, 1),
                "2 × dp1 half": (1, batch // 2, 2)}
        rounds = []
        for index in range(args.rounds):
            order = list(runs)[index % len(runs):] + list(runs)[:index % len(runs)]
            rounds.append({run: median_step(RunConfig(
                spec, Layout(dp=runs[run][0]), TrainSpec(steps=args.steps, global_batch=runs[run][1]), model_name=name,
            ), results, copies=runs[run][2]) for run in order})
        strong = [r["dp1"][0] / (2 * r["dp2"][0]) for r in rounds]
        weak = [r["dp1 half"][0] / r["dp2"][0] for r in rounds]
        unrelated = [r["2 × dp1 half"][0] / r["dp2"][0] for r in rounds]
        t1, t2, half, pair, compute, sync = (
            min(r[run][part] for r in rounds) for run, part in
            (("dp1", 0), ("dp2", 0), ("dp1 half", 0), ("2 × dp1 half", 0), ("dp1 half", 1), ("dp2", 1))
        )
        print(f"{name}: Ψ={parameter_count(spec) / 1e6:.2f}M, batch {batch}×{spec.seq_len}: step dp1 {t1 * 1e3:.1f} ms, "
              f"dp2 {t2 * 1e3:.1f} ms, dp1 at half the batch {half * 1e3:.1f} ms alone and {pair * 1e3:.1f} ms "
              f"two at once\n"
              f"  efficiency, same global batch {t1 / (2 * t2):.2f} (rounds {fmt(strong)}); "
              f"same batch per rank {half / t2:.2f} (rounds {fmt(weak)}); "
              f"against two unrelated runs {pair / t2:.2f} (rounds {fmt(unrelated)})\n"
              f"  per rank: compute {compute * 1e3:.1f} ms / sync {sync * 1e3:.1f} ms = {compute / sync:.2f}, "
              f"optimizer and the rest {(half - compute) * 1e3:.1f} ms")


def fmt(values: list[float]) -> str:
    return " ".join(f"{value:.2f}" for value in values)


if __name__ == "__main__":
    main()
