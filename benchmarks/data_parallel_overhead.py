"""plait's data parallelism (dp = 2) against PyTorch DDP and FSDP2 used directly.

Each pair trains the same model (same seeded weights) on the same batches and does the same
training work per step: set the learning rate, forward, cross-entropy, backward, clip the
gradients to norm 1 (the norm made a plain tensor, then ``clip_grads_with_norm_``, as torchtitan
does), step the same optimizer (``plait.parallel.optimizer.build_optimizer``: fused AdamW), and average
the loss over the ranks for logging. The plait side is ``plait.train.loop.train_step`` on the
model ``parallelize`` wrapped, plus the loop's learning-rate setting and loss all-reduce; the
loop's bookkeeping around it is measured by benchmarks/step_overhead.py.

All six step functions (three pairs) are built first and then interleaved: for each batch every
one takes a step, in an order rotated from batch to batch, so noise from other work on the machine
falls on all of them alike. A barrier before and after every timed step makes each time the step
of the slower rank, rather than a share of the skew the previous step left between the ranks.
It prints each side's median step time and the ratio plait / direct (target ≤ 1.03): the median,
over the batches, of a plait step's time over the direct step's on the same batch (taken moments
apart, so slow swings in the machine's load cancel), in wall-clock time and in the CPU time of
rank 0's process (all its threads): on a machine shared with other work the CPU-time ratio shows
plait's own extra work when waiting on a descheduled peer blurs the wall-clock one.

    zero 0 / DDP, zero 2 / FSDP2 with reshard_after_forward=False (the nearest FSDP2 comes to
    ZeRO-2; plait's stage 2 is its own), zero 3 / FSDP2 (defaults).

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
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from plait.config import RunConfig, TrainSpec
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.parallel.optimizer import build_optimizer
from plait.topology import build_topology
from plait.train.data import BatchSource, default_corpus
from plait.train.loop import autocast, build_model, parallelize_run, train_step
from plait.train.optim import learning_rate, set_learning_rate

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


def direct_step(config: RunConfig, wrap: Callable[[nn.Module], nn.Module]) -> Callable[[int, list[torch.Tensor]], None]:
    """A minimal hand-written data-parallel step around PyTorch's own wrapper."""
    model = wrap(build_model(config, CPU))
    optimizer = build_optimizer(model, config.train.lr, config.train.weight_decay)

    def step(index: int, batch: list[torch.Tensor]) -> None:
        lr = learning_rate(index, config.train)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = batch
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), config.train.grad_clip, norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss = loss.detach()
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        loss.item()
    return step


def plait_step(config: RunConfig) -> Callable[[int, list[torch.Tensor]], None]:
    topology = build_topology(config.layout, CPU)
    parallel = parallelize_run(config, topology)

    def step(index: int, batch: list[torch.Tensor]) -> None:
        set_learning_rate(parallel.optimizer, learning_rate(index, config.train))
        loss, _ = train_step(parallel, [tuple(batch)], config.train.grad_clip, lambda: autocast(config, CPU))
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=topology.group("dp"))
        loss.item()
    return step


def timed(function: Callable, *args) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of ``function(*args)``, between barriers over all ranks."""
    dist.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    function(*args)
    dist.barrier()
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
    steps = {}
    for stage, (_, wrap) in pairs.items():
        steps[stage, "plait"] = plait_step(configs[stage])
        steps[stage, "direct"] = direct_step(configs[stage], wrap)
    times: dict[tuple[int, str], list[tuple[float, float]]] = {key: [] for key in steps}
    for index in range(args.steps):
        batch = list(source.local_batch(index, rank, world))
        order = list(steps)
        # Every step function once per index, the order rotated so none always follows another.
        for key in order[index % len(order):] + order[:index % len(order)]:
            times[key].append(timed(steps[key], index, batch))
    if dist.get_rank() == 0:
        print(f"model {args.model}, global batch {args.global_batch}×{args.seq_len}, dp 2, "
              f"{torch.get_num_threads()} thread per rank, {args.steps - 2} interleaved steps each (2 warm-up)")
        for stage, (name, _) in pairs.items():
            mine, theirs = times[stage, "plait"][2:], times[stage, "direct"][2:]
            (wall, cpu), (wall_direct, cpu_direct) = ([statistics.median(column) for column in zip(*side)]
                                                      for side in (mine, theirs))
            # Each step against the direct step on the same batch, taken moments apart.
            wall_ratio, cpu_ratio = (statistics.median(a[kind] / b[kind] for a, b in zip(mine, theirs)) for kind in (0, 1))
            print(f"plait zero {stage} {wall * 1e3:7.1f} ms ({cpu * 1e3:6.1f} ms CPU)   {name:34s} "
                  f"{wall_direct * 1e3:7.1f} ms ({cpu_direct * 1e3:6.1f} ms CPU)   "
                  f"ratio {wall_ratio:.3f} wall, {cpu_ratio:.3f} CPU")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
