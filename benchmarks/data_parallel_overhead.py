"""plait's data parallelism (dp = 2) against PyTorch DDP and FSDP2 used directly.

Each pair trains the same model (same seeded weights) on the same batches with the same AdamW and
clipping. The two alternate step by step — a plait step, then a direct step — so noise from
other work on the machine hits both alike. A plait step is what ``plait.train.loop.train`` does
per step: set the learning rate, take the rank's batch, ``train_step`` (forward, backward,
clipping, optimizer) and the all-reduce of the loss it logs; the loop's bookkeeping around it is
measured by benchmarks/step_overhead.py. The figures are ratios of median step times,
plait / direct (target ≤ 1.03), in wall-clock time and in the CPU time of rank 0's process (all its
threads): on a machine shared with other work the CPU-time ratio shows plait's own extra work
when waiting on a descheduled peer blurs the wall-clock one.

    zero 0 / DDP, zero 2 / FSDP2 (reshard_after_forward=False), zero 3 / FSDP2 (defaults).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 benchmarks/data_parallel_overhead.py \
        [--model tiny] [--seq-len 128] [--global-batch 16] [--steps 60]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from plait.config import RunConfig, TrainSpec
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.parallel.data import apply_data_parallel, optimizer_shard_mesh
from plait.topology import build_topology
from plait.train.data import BatchSource, default_corpus
from plait.train.loop import build_model, train_step
from plait.train.optim import BETAS, build_optimizer, learning_rate, set_learning_rate

CPU = torch.device("cpu")


def direct_ddp(model: nn.Module) -> nn.Module:
    return DistributedDataParallel(model)


def direct_fsdp(reshard_after_forward: bool | None) -> Callable[[nn.Module], nn.Module]:
    def wrap(model: nn.Module) -> nn.Module:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.layers.values():
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
        return fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return wrap


def direct_step(config: RunConfig, wrap: Callable[[nn.Module], nn.Module]) -> Callable[[list[torch.Tensor]], None]:
    """A minimal hand-written data-parallel step around PyTorch's own wrapper."""
    model = wrap(build_model(config, CPU))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    keep = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.train.weight_decay}, {"params": keep, "weight_decay": 0.0}],
        lr=config.train.lr, betas=BETAS, foreach=False,
    )

    def step(batch: list[torch.Tensor]) -> None:
        inputs, targets = batch
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
    return step


def plait_step(config: RunConfig) -> Callable[[int, list[torch.Tensor]], None]:
    topology = build_topology(config.layout, CPU)
    model = apply_data_parallel(build_model(config, CPU), topology, config.train.precision)
    optimizer = build_optimizer(model, config.train, shard_over=optimizer_shard_mesh(topology))

    def step(index: int, batch: list[torch.Tensor]) -> None:
        set_learning_rate(optimizer, learning_rate(index, config.train))
        loss, _ = train_step(model, optimizer, [tuple(batch)], config, CPU, topology)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=topology.group("dp"))
        loss.item()
    return step


def timed(function: Callable, *args) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of ``function(*args)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    function(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    spec = model_spec(args.model, seq_len=args.seq_len)
    train_spec = TrainSpec(steps=args.steps, global_batch=args.global_batch)
    configs = {stage: RunConfig(spec, Layout(dp=2, zero=stage), train_spec, model_name=args.model) for stage in (0, 2, 3)}
    pairs = {0: ("DDP", direct_ddp), 2: ("FSDP2 reshard_after_forward=False", direct_fsdp(False)),
             3: ("FSDP2 defaults", direct_fsdp(None))}
    source = BatchSource(default_corpus(), spec.seq_len, args.global_batch, train_spec.seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    plait_times: dict[int, list[tuple[float, float]]] = {}
    direct_times: dict[int, list[tuple[float, float]]] = {}
    for stage, (_, wrap) in pairs.items():
        mine, theirs = plait_step(configs[stage]), direct_step(configs[stage], wrap)
        plait_times[stage], direct_times[stage] = [], []
        for index in range(args.steps):
            batch = list(source.local_batch(index, rank, world))
            plait_times[stage].append(timed(mine, index, batch))
            direct_times[stage].append(timed(theirs, batch))
    if dist.get_rank() == 0:
        print(f"model {args.model}, global batch {args.global_batch}×{args.seq_len}, dp 2, "
              f"{torch.get_num_threads()} thread per rank, {args.steps - 2} alternating steps each (2 warm-up)")
        for stage, (name, _) in pairs.items():
            (wall, cpu), (wall_direct, cpu_direct) = (
                [statistics.median(column) for column in zip(*times[stage][2:])] for times in (plait_times, direct_times)
            )
            print(f"plait zero {stage} {wall * 1e3:7.1f} ms ({cpu * 1e3:6.1f} ms CPU)   {name:34s} "
                  f"{wall_direct * 1e3:7.1f} ms ({cpu_direct * 1e3:6.1f} ms CPU)   "
                  f"ratio {wall / wall_direct:.3f} wall, {cpu / cpu_direct:.3f} CPU")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
