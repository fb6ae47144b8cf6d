"""The share of the data-parallel gradient reduction that backward hides, in dp2, dp2·tp2 and dp2·pp2.

Each layout (ZeRO 0: plait's bucketed all-reduce, per pipeline chunk on the 1F1B stages of pp2)
runs in its own world of local gloo ranks, one thread each. Every step is
timed three ways, interleaved step by step in a rotated order so that load from other work falls
on all alike: forward, backward and the dp reduction finished (what the optimizer waits for;
the optimizer itself is left out, it is the same in all three):

- overlapped: as plait trains, buckets sent while backward (or the schedule) goes on;
- after: the same reduction forced after backward: plait's buckets all held back to the end
  (``in_backward`` False);
- none: no data-parallel reduction at all.

hidden share = 1 − (overlapped − none) / (after − none), from the medians over the steps (the
first ``--warmup`` of each dropped): 1 when backward hides the whole reduction, 0 when none of it.

    PYTHONPATH=src python -m benchmarks.overlap_hidden [--steps 30] [--layers 4] [--hidden 384]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from plait.config import RunConfig, TrainSpec, validate_run
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.parallel.cross_entropy import cross_entropy
from plait.parallel.gradients import gradient_sync
from plait.parallel.parallelize import Parallelized
from plait.topology import build_topology
from plait.train.data import BatchSource, default_corpus
from plait.train.loop import parallelize_run

CPU = torch.device("cpu")
MODES = ("overlapped", "after", "none")
LAYOUTS = {
    "dp2": {"dp": 2},
    "dp2·tp2": {"dp": 2, "tp": 2},
    "dp2·pp2": {"dp": 2, "pp": 2, "schedule": "1f1b", "microbatches": 2},
}


def reduce_step(parallel: Parallelized, micro: list[tuple[torch.Tensor, torch.Tensor]], mode: str) -> None:
    """Forward, backward and the dp reduction of ``mode``; the gradients left for the optimizer."""
    model, optimizer, buckets = parallel.model, parallel.optimizer, parallel.gradient_buckets
    buckets.in_backward = mode == "overlapped"
    if parallel.pipeline is not None:
        parallel.pipeline.gradient_buckets = None if mode == "none" else buckets
        parallel.pipeline.forward_backward(micro, contextlib.nullcontext)
        if mode != "none":
            buckets.finish()
        return
    for index, (inputs, targets) in enumerate(micro):
        sync = mode != "none" and index == len(micro) - 1
        with gradient_sync(model, optimizer, sync, buckets):
            cross_entropy(model(inputs), targets, len(micro)).backward()


def _rank(rank: int, config: RunConfig, steps: int, warmup: int, port: int, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=config.layout.world_size, timeout=timedelta(minutes=5))
    topology = build_topology(config.layout, CPU)
    parallel = parallelize_run(config, topology)
    source = BatchSource(default_corpus(), config.model.seq_len, config.train.global_batch, config.train.seed)
    count = config.layout.microbatches
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for step in range(steps):
        inputs, targets = source.local_batch(step, topology.coordinate("dp"), topology.size("dp"))
        micro = list(zip(inputs.chunk(count), targets.chunk(count)))
        for mode in MODES[step % 3:] + MODES[:step % 3]:
            dist.barrier()
            start = time.perf_counter()
            reduce_step(parallel, micro, mode)
            dist.barrier()  # the slower rank's time
            times[mode].append(time.perf_counter() - start)
            parallel.optimizer.zero_grad(set_to_none=True)
    if rank == 0:
        results.put(({mode: statistics.median(values[warmup:]) for mode, values in times.items()},
                     len(parallel.gradient_buckets.buckets)))
    dist.destroy_process_group()


def measure(config: RunConfig, steps: int, warmup: int) -> tuple[dict[str, float], int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.get_context("spawn").Queue()
    mp.start_processes(_rank, args=(config, steps, warmup, port, results), nprocs=config.layout.world_size,
                       start_method="spawn")
    return results.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    spec = model_spec(None, family="gpt2", layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=256,
                      seq_len=args.seq_len)
    print(f"gpt2 {args.layers} layers, hidden {args.hidden}, vocab 256; global batch {args.global_batch}×"
          f"{args.seq_len}; ZeRO 0; one thread per rank; median of {args.steps - args.warmup} steps per mode")
    print(f"{'layout':9s} {'buckets':>7s} {'overlapped':>11s} {'after':>9s} {'none':>9s} {'reduction':>10s} "
          f"{'exposed':>9s} {'hidden':>7s}")
    for name, layout in LAYOUTS.items():
        config = RunConfig(spec, Layout(**layout), TrainSpec(steps=args.steps, global_batch=args.global_batch),
                           model_name="bench")
        validate_run(config)
        median, buckets = measure(config, args.steps, args.warmup)
        reduction, exposed = median["after"] - median["none"], median["overlapped"] - median["none"]
        print(f"{name:9s} {buckets:7d} {median['overlapped'] * 1e3:8.1f} ms {median['after'] * 1e3:6.1f} ms "
              f"{median['none'] * 1e3:6.1f} ms {reduction * 1e3:7.1f} ms {exposed * 1e3:6.1f} ms "
              f"{1 - exposed / reduction:7.2f}", flush=True)


if __name__ == "__main__":
    main()
