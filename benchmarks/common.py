"""Run a layout for real on local gloo ranks (one thread each) and return its steady step time."""

from __future__ import annotations

import socket
import statistics
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from plait.config import RunConfig, TrainSpec, validate_run
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.topology import build_topology
from plait.train.loop import train


def bench_config(model: str, seq_len: int, global_batch: int, steps: int, **layout) -> RunConfig:
    config = RunConfig(
        model=model_spec(model, seq_len=seq_len),
        layout=Layout(**layout),
        train=TrainSpec(steps=steps, global_batch=global_batch, warmup_steps=1),
        model_name=model,
    )
    validate_run(config)
    return config


def _rank(rank: int, config: RunConfig, port: int, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=config.layout.world_size, timeout=timedelta(minutes=5))
    result = train(config, build_topology(config.layout, torch.device("cpu")))
    if rank == 0:
        results.put(result.step_times)
    dist.destroy_process_group()


def step_times(configs: dict, rounds: int) -> dict:
    """The best median step time of each config over ``rounds`` rounds, configs interleaved in each
    round so that load from other processes falls on all of them alike."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, config in configs.items():
            best[name] = min(best.get(name, float("inf")), step_time(config))
    return best


def step_time(config: RunConfig) -> float:
    """Median step time over all steps but the first two (warm-up)."""
    return statistics.median(run_step_times(config)[2:])


def run_step_times(config: RunConfig) -> list[float]:
    """Rank 0's time of every step of one run of ``config`` on fresh gloo ranks, one thread each."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.get_context("spawn").Queue()
    mp.start_processes(_rank, args=(config, port, results), nprocs=config.layout.world_size, start_method="spawn")
    return results.get()
