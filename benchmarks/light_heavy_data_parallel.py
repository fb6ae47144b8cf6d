"""Data parallelism helps a heavy model and not a light one: the tracer's figures beside the scaling.

``tiny`` (64 tokens) and tiny on 1,024 tokens, with 36× its FLOPs per sequence for 15% more
gradient bytes, each train under dp1 and dp2 on the same global batch, every step after the first
traced. The figures: the dp2 run's exposed communication share (``comm_fraction``) and
compute-to-synchronisation ratio, and the speed-up of dp2 over dp1 (median step times), which the
shares should explain.

    python benchmarks/light_heavy_data_parallel.py [--steps 6] [--global-batch 16]
"""

from __future__ import annotations

import argparse
import socket
import statistics
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from plait.config import RunConfig, TrainSpec, validate_run
from plait.layout import Layout
from plait.models.flops import flops_per_sequence
from plait.models.spec import model_spec
from plait.observe.time_split import run_time_split
from plait.topology import build_topology
from plait.train.loop import train

# Heavy in the lesson's sense: far more compute for each byte the replicas synchronise. The same
# small model on sequences 16 times longer does 36 times tiny's FLOPs per sequence with 15% more
# parameters (its learned positions); a wider, deeper model would grow its gradients with its FLOPs.
SHAPES = {"tiny": {}, "heavy: tiny at 1,024 tokens": {"seq_len": 1024}}


def _rank(rank: int, config: RunConfig, port: int, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=config.layout.world_size, timeout=timedelta(minutes=10))
    result = train(config, build_topology(config.layout, torch.device("cpu")))
    if rank == 0:
        results.put((statistics.median(result.step_times[1:]), run_time_split(result.traces)))
    dist.destroy_process_group()


def measure(config: RunConfig) -> tuple[float, dict]:
    """Rank 0's median step time (the first left out) and the run's time split."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.get_context("spawn").Queue()
    mp.start_processes(_rank, args=(config, port, results), nprocs=config.layout.world_size, start_method="spawn")
    return results.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--global-batch", type=int, default=16)
    args = parser.parse_args()
    print("| model | FLOPs per sequence | dp2 comm_fraction | dp2 compute : sync | dp2 speed-up over dp1 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, shape in SHAPES.items():
        spec = model_spec("tiny", **{"seq_len": 64, **shape})
        times = {}
        for dp in (1, 2):
            train_spec = TrainSpec(steps=args.steps, global_batch=args.global_batch, warmup_steps=1, trace_every=1)
            config = RunConfig(model=spec, layout=Layout(dp=dp), train=train_spec, model_name="tiny")
            validate_run(config)
            times[dp], split = measure(config)
        ratio = split["compute_to_sync_ratio"]
        print(f"| {name} | {flops_per_sequence(spec).model:.3g} | {split['comm_fraction']['median']:.1%} | "
              f"{'∞' if ratio is None else f'{ratio:.1f}'} | {times[1] / times[2]:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
