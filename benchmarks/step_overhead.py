"""plait's single-process training step against a minimal hand-written PyTorch loop.

Both train the same model (same seeded weights) on the same batches with the same AdamW and
clipping; they run in alternating rounds in one process so machine noise hits both alike. The
figure is the ratio of median step times, plait / hand-written (target ≤ 1.05).

    python benchmarks/step_overhead.py [--model tiny] [--steps 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from plait.config import RunConfig, TrainSpec
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.parallel.optimizer import build_optimizer
from plait.topology import build_topology
from plait.train.data import BatchSource, default_corpus
from plait.train.loop import build_model, train


def hand_written_steps(config: RunConfig, steps: int) -> list[float]:
    model = build_model(config, torch.device("cpu"))
    optimizer = build_optimizer(model, config.train.lr, config.train.weight_decay)  # the same optimizer as plait's
    source = BatchSource(default_corpus(), config.model.seq_len, config.train.global_batch, config.train.seed)
    times = []
    for step in range(steps):
        started = time.perf_counter()
        inputs, targets = source.local_batch(step, 0, 1)
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
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    config = RunConfig(
        model_spec(args.model, seq_len=args.seq_len), Layout(),
        TrainSpec(steps=args.steps, global_batch=args.global_batch), model_name=args.model,
    )
    topology = build_topology(config.layout, torch.device("cpu"))
    plait_times, hand_times = [], []
    for _ in range(args.rounds):
        plait_times += train(config, topology).step_times[1:]
        hand_times += hand_written_steps(config, args.steps)
    dist.destroy_process_group()
    plait_median, hand_median = statistics.median(plait_times), statistics.median(hand_times)
    print(f"model {args.model}, batch {args.global_batch}×{args.seq_len}, {torch.get_num_threads()} threads")
    print(f"plait step        {plait_median * 1e3:8.2f} ms (median of {len(plait_times)})")
    print(f"hand-written step {hand_median * 1e3:8.2f} ms (median of {len(hand_times)})")
    print(f"ratio plait / hand-written = {plait_median / hand_median:.3f}")


if __name__ == "__main__":
    main()
