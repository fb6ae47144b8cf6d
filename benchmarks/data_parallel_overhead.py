"""plait's data parallelism (dp = 2) against PyTorch DDP and FSDP2 used directly.

Each pair trains the same model (same seeded weights) on the same batches with the same AdamW and
clipping; the pairs run in alternating rounds in one job so machine noise hits both alike. Each
round gives a ratio of median step times, plait / direct; the figure is the median over rounds
(target ≤ 1.03):

    zero 0 / DDP, zero 2 / FSDP2 (reshard_after_forward=False), zero 3 / FSDP2 (defaults).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 benchmarks/data_parallel_overhead.py \
        [--model tiny] [--seq-len 128] [--global-batch 16] [--steps 20] [--rounds 3]
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
from plait.topology import build_topology
from plait.train.data import BatchSource, default_corpus
from plait.train.loop import build_model, train
from plait.train.optim import BETAS


def direct_ddp(model: nn.Module) -> nn.Module:
    return DistributedDataParallel(model)


def direct_fsdp(reshard_after_forward: bool | None) -> Callable[[nn.Module], nn.Module]:
    def wrap(model: nn.Module) -> nn.Module:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.layers.values():
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
        return fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return wrap


def direct_steps(config: RunConfig, wrap: Callable[[nn.Module], nn.Module], steps: int) -> list[float]:
    """A minimal hand-written data-parallel loop around PyTorch's own wrapper."""
    model = wrap(build_model(config, torch.device("cpu")))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    keep = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.train.weight_decay}, {"params": keep, "weight_decay": 0.0}],
        lr=config.train.lr, betas=BETAS, foreach=False,
    )
    source = BatchSource(default_corpus(), config.model.seq_len, config.train.global_batch, config.train.seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    times = []
    for step in range(steps):
        started = time.perf_counter()
        inputs, targets = source.local_batch(step, rank, world)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - started)
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    spec = model_spec(args.model, seq_len=args.seq_len)
    train_spec = TrainSpec(steps=args.steps, global_batch=args.global_batch)
    configs = {stage: RunConfig(spec, Layout(dp=2, zero=stage), train_spec, model_name=args.model) for stage in (0, 2, 3)}
    pairs = {0: ("DDP", direct_ddp), 2: ("FSDP2 reshard_after_forward=False", direct_fsdp(False)),
             3: ("FSDP2 defaults", direct_fsdp(None))}
    plait_times = {stage: [] for stage in pairs}
    direct_times = {stage: [] for stage in pairs}
    for _ in range(args.rounds):
        for stage, (_, wrap) in pairs.items():
            config = configs[stage]
            steps = train(config, build_topology(config.layout, torch.device("cpu"))).step_times[1:]
            plait_times[stage].append(statistics.median(steps))
            direct_times[stage].append(statistics.median(direct_steps(config, wrap, args.steps)))
    if dist.get_rank() == 0:
        print(f"model {args.model}, global batch {args.global_batch}×{args.seq_len}, dp 2, "
              f"{torch.get_num_threads()} thread per rank, {args.rounds} rounds × {args.steps - 1} steps")
        for stage, (name, _) in pairs.items():
            mine, theirs = statistics.median(plait_times[stage]), statistics.median(direct_times[stage])
            ratios = [a / b for a, b in zip(plait_times[stage], direct_times[stage])]
            print(f"plait zero {stage} {mine * 1e3:8.2f} ms   {name:34s} {theirs * 1e3:8.2f} ms   "
                  f"ratio {statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
