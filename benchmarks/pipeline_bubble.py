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
real costs do. The stages are equal in what they compute: every chunk is the same layers, chunk 0's
input requires a gradient as a transformer's first block does (the embedding below needs it), and
the last chunk's loss is one mean-squared error, an elementwise pass beside four matmul layers.

``--hold H`` is the control that makes their costs equal in fact: every forward and full backward
does its real work and is then held to H × the slowest (90th percentile over ranks) of its kind, so
the host's variation from one action to the next drops out while transfers and the executor's own
work stay as they are (``pipeline_common.TimedChunk``).

    PYTHONPATH=src python benchmarks/pipeline_bubble.py --pp 2 --microbatches 8 [--hold 1.1]
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
from pipeline_common import StageClock, TimedChunk, batch, equal_chunks, run_on_ranks, slowest_action, stop_clock  # noqa: E402

from plait.errors import ConfigError  # noqa: E402
from plait.parallel.pipeline_executor import BoundaryTransfers, Executor  # noqa: E402
from plait.schedules import Kind, Schedule, Span, Timeline, generate, simulate, theoretical_bubble  # noqa: E402
from plait.schedules import SCHEDULES as REGISTERED, schedule_spec  # noqa: E402

# Every registered schedule, those that interleave at two chunks per rank.
SCHEDULES = [(name, 2 if schedule_spec(name).takes_virtual_stages else 1) for name in REGISTERED]


def measure(m: int, steps: int, width: int, depth: int, rows: int, names: list[str], hold: float) -> list[dict]:
    rank, pp = dist.get_rank(), dist.get_world_size()
    inputs, targets = batch(m, rows, width)
    micro_inputs = [x.clone().requires_grad_() for x in inputs.chunk(m)]
    micro_targets = list(targets.chunk(m))
    rows_out = []
    for name, v in [(n, v) for n, v in SCHEDULES if n in names]:
        schedule = generate(name, pp, m, v)
        chunks = equal_chunks(pp * v, width, depth // v)  # the same layers per rank for every v
        mine = {c: chunks[c] for c in schedule.chunks_of(rank)}
        last = schedule.num_chunks - 1
        clocks: dict[int, StageClock] = {}
        if hold:
            forward_s, backward_s = slowest_action(next(iter(mine.values())), rows, width)
            clocks = {c: StageClock(hold * forward_s, hold * backward_s) for c in mine}
            mine = {c: TimedChunk(chunk, clocks[c], stop=c != last) for c, chunk in mine.items()}

        def loss_fn(output: torch.Tensor, mb: int) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(output, micro_targets[mb]) / m
            return stop_clock(loss, clocks[last]) if clocks else loss  # the last chunk's clock covers its loss

        executor = Executor(schedule, rank, mine, loss_fn, BoundaryTransfers(None, torch.device("cpu"), lambda mb: (rows, width)))
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
            "costs": stage_costs(mean),
        })
    return rows_out


def stage_costs(mean: dict) -> str:
    """Each chunk's mean compute spans in ms, e.g. ``0: F 41 B 83 · 1: F 42 B 80``: equal stages read alike."""
    chunks = sorted({chunk for chunk, _ in mean})
    return " · ".join(f"{c}: " + " ".join(f"{kind.value} {mean[(c, kind)] * 1e3:.0f}" for kind in Kind
                                          if (c, kind) in mean) for c in chunks)


def splits_backward(schedule: Schedule) -> bool:
    return any(action.kind is Kind.BACKWARD_INPUT for actions in schedule.actions for action in actions)


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
    parser.add_argument("--hold", type=float, default=0.0,
                        help="a control: hold every forward and backward to HOLD × the slowest (90th percentile) "
                             "real one, so stage costs are exactly equal and steady; 0 (default) runs them free")
    parser.add_argument("--schedules", nargs="+", choices=[n for n, _ in SCHEDULES],
                        help="default: every schedule (with --hold, every one without a split backward)")
    args = parser.parse_args()
    names = args.schedules or [n for n, _ in SCHEDULES]
    try:  # every schedule is generated here first, so a bad --pp or --microbatches is one line
        split = [n for n, v in SCHEDULES if n in names and splits_backward(generate(n, args.pp, args.microbatches, v))]
    except ConfigError as error:
        parser.error(str(error))
    if args.hold and split and args.schedules:
        parser.error(f"--hold holds forwards and full backwards only; leave out {', '.join(split)}, "
                     "whose backward is split into I and W")
    args.schedules = [n for n in names if not (args.hold and n in split)]
    load_before = os.getloadavg()[0]
    rows = run_on_ranks(measure, args.pp, args.microbatches, args.steps, args.width, args.depth, args.rows,
                        args.schedules, args.hold)
    print(f"pp={args.pp}, m={args.microbatches}, {args.depth}×Linear({args.width}) per rank, {args.rows} rows "
          f"per micro-batch, median of {args.steps} steps"
          + (f", every F and B held to {args.hold}× its slowest" if args.hold else ", stages run free")
          + f"; 1-minute load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after (the run itself adds pp)")
    print("| schedule | theory | simulated (mean costs) | replayed (each step's costs) | measured | step (ms) "
          "| chunk costs (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['schedule']} | {row['theory']:.1%} | {row['simulated']:.1%} | {row['replayed']:.1%} "
              f"| {row['measured']:.1%} | {row['step_ms']:.1f} | {row['costs']} |")


if __name__ == "__main__":
    main()
