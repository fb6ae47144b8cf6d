"""Measured against theoretical bubble fraction for every schedule, on equal-cost stages over gloo.

Each rank runs the generated list with plait's executor; every action's span is recorded and the
spans of all ranks form the step's measured timeline. Three figures per schedule:

* theory: the closed form, i.e. the lists played with unit costs (F = I = W = 1, B = 2);
* simulated: the lists played with this run's measured mean cost of each (chunk, action kind);
* measured: idle share of the measured timeline, median over steps.

    PYTHONPATH=src python benchmarks/pipeline_bubble.py --pp 2 --microbatches 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_common import batch, equal_chunks, run_on_ranks  # noqa: E402

from plait.schedules import Span, Timeline, generate, simulate, theoretical_bubble  # noqa: E402
from plait.schedules.executor import Executor  # noqa: E402

SCHEDULES = [("naive", 1), ("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)]


def measure(m: int, steps: int, width: int, depth: int, rows: int) -> list[dict]:
    rank, pp = dist.get_rank(), dist.get_world_size()
    inputs, targets = batch(m, rows, width)
    micro_inputs, micro_targets = list(inputs.chunk(m)), list(targets.chunk(m))
    rows_out = []
    for name, v in SCHEDULES:
        schedule = generate(name, pp, m, v)
        chunks = equal_chunks(pp * v, width, depth // v)  # the same layers per rank for every v
        mine = {c: chunks[c] for c in schedule.chunks_of(rank)}

        def loss_fn(output: torch.Tensor, mb: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(output, micro_targets[mb]) / m

        executor = Executor(schedule, rank, mine, loss_fn, lambda mb: (rows, width), None, torch.device("cpu"))
        timelines = []
        for step in range(steps + 1):
            dist.barrier()
            spans = executor.run(micro_inputs).spans
            origin = spans[0].start
            local = [Span(s.action, s.start - origin, s.end - origin) for s in spans]
            gathered: list = [None] * pp
            dist.all_gather_object(gathered, local)
            if step:  # the first step warms up
                timelines.append(Timeline(tuple(tuple(r) for r in gathered)))
        costs: dict = defaultdict(list)
        for timeline in timelines:
            for spans in timeline.spans:
                for s in spans:
                    if s.action.kind.is_compute:
                        costs[(s.action.chunk, s.action.kind)].append(s.end - s.start)
        mean = {key: statistics.mean(values) for key, values in costs.items()}
        simulated = simulate(schedule, lambda a: mean.get((a.chunk, a.kind), 0.0)).bubble_fraction
        rows_out.append({
            "schedule": name if v == 1 else f"{name} (v={v})",
            "theory": theoretical_bubble(schedule),
            "simulated": simulated,
            "measured": statistics.median(t.bubble_fraction for t in timelines),
            "step_ms": statistics.median(t.step_time for t in timelines) * 1e3,
        })
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4, help="Linear layers per rank (split over its v chunks)")
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args()
    rows = run_on_ranks(measure, args.pp, args.microbatches, args.steps, args.width, args.depth, args.rows)
    print(f"pp={args.pp}, m={args.microbatches}, {args.depth}×Linear({args.width}) per rank, {args.rows} rows "
          f"per micro-batch, median of {args.steps} steps")
    print("| schedule | theory | simulated (measured costs) | measured | step (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['schedule']} | {row['theory']:.1%} | {row['simulated']:.1%} | {row['measured']:.1%} "
              f"| {row['step_ms']:.1f} |")


if __name__ == "__main__":
    main()
