"""Measured against theoretical bubble fraction for every schedule, on equal-cost stages over gloo.

Each rank runs the generated list with plait's executor; every action's span is recorded and the
spans of all ranks form the step's measured timeline. Four figures per schedule:

* theory: the closed form, i.e. the lists played with unit costs (F = I = W = 1, B = 2);
* simulated: the lists played with this run's mean cost of each (chunk, action kind): what unequal
  stages alone cost;
* replayed: each step's lists played with that step's own compute spans and free transfers, median
  over steps: stages and their step-to-step jitter, but no transfer or executor time;
* measured: idle share of the measured timeline, median over steps.

So measured − replayed is what transfers and the executor cost, replayed − theory what the stages'
real costs do. The stages are equal: every chunk is the same layers, chunk 0's input requires a
gradient as a transformer's first block does (the embedding below needs it), and the last chunk's
loss is one mean-squared error, an elementwise pass beside four matmul layers.

    PYTHONPATH=src python benchmarks/pipeline_bubble.py --pp 2 --microbatches 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_common import batch, equal_chunks, run_on_ranks  # noqa: E402

from plait.schedules import Schedule, Span, Timeline, generate, simulate, theoretical_bubble  # noqa: E402
from plait.schedules.executor import Executor  # noqa: E402

SCHEDULES = [("naive", 1), ("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)]


def measure(m: int, steps: int, width: int, depth: int, rows: int, names: list[str]) -> list[dict]:
    rank, pp = dist.get_rank(), dist.get_world_size()
    inputs, targets = batch(m, rows, width)
    micro_inputs = [x.clone().requires_grad_() for x in inputs.chunk(m)]
    micro_targets = list(targets.chunk(m))
    rows_out = []
    for name, v in [(n, v) for n, v in SCHEDULES if n in names]:
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
            for x in micro_inputs:
                x.grad = None  # the input gradient is computed, not accumulated across steps
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
        replayed = statistics.median(replay(schedule, t).bubble_fraction for t in timelines)
        rows_out.append({
            "schedule": name if v == 1 else f"{name} (v={v})",
            "theory": theoretical_bubble(schedule),
            "simulated": simulated,
            "replayed": replayed,
            "measured": statistics.median(t.bubble_fraction for t in timelines),
            "step_ms": statistics.median(t.step_time for t in timelines) * 1e3,
        })
    return rows_out


def replay(schedule: Schedule, timeline: Timeline) -> Timeline:
    """The lists played with each compute action's measured duration in ``timeline``, transfers free."""
    took = {s.action: s.end - s.start for spans in timeline.spans for s in spans if s.action.kind.is_compute}
    return simulate(schedule, lambda a: took.get(a, 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4, help="Linear layers per rank (split over its v chunks)")
    parser.add_argument("--rows", type=int, default=512,
                        help="rows per micro-batch: enough that stage compute, not message latency, sets the step")
    parser.add_argument("--schedules", nargs="+", default=[n for n, _ in SCHEDULES], choices=[n for n, _ in SCHEDULES])
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = run_on_ranks(measure, args.pp, args.microbatches, args.steps, args.width, args.depth, args.rows,
                        args.schedules)
    print(f"pp={args.pp}, m={args.microbatches}, {args.depth}×Linear({args.width}) per rank, {args.rows} rows "
          f"per micro-batch, median of {args.steps} steps; 1-minute load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after (the run itself adds pp)")
    print("| schedule | theory | simulated (mean costs) | replayed (each step's costs) | measured | step (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['schedule']} | {row['theory']:.1%} | {row['simulated']:.1%} | {row['replayed']:.1%} "
              f"| {row['measured']:.1%} | {row['step_ms']:.1f} |")


if __name__ == "__main__":
    main()
