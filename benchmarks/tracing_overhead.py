"""What the span tracer costs: traced and untraced steps side by side in one run.

Each layout trains with ``--trace-every 2``, so every other step is traced (the first after warm-up,
then one in two) and its neighbours are not; load from other processes falls on both alike. The
figures: the median traced step over the median untraced one, and what tracing every K-th step
(the default ``--trace-every``) adds to the run's time, (ratio - 1) / K.

    python benchmarks/tracing_overhead.py [--model tiny] [--steps 41]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from benchmarks.common import bench_config, run_step_times
from plait.config import RunConfig, TrainSpec

LAYOUTS = {
    "dp2": {"dp": 2},
    "tp2": {"tp": 2},
    "cp2": {"cp": 2},
    "pp2 1f1b m4": {"pp": 2, "microbatches": 4},
    "dp2·tp2·pp2": {"dp": 2, "tp": 2, "pp": 2, "microbatches": 2},
}


def traced_and_untraced(config: RunConfig) -> tuple[float, float]:
    """Median traced and untraced step time of one run tracing every other step (step 0 left out)."""
    times = run_step_times(config)
    return statistics.median(times[1::2]), statistics.median(times[2::2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=41)
    args = parser.parse_args()
    every = TrainSpec().trace_every
    print(f"| layout | traced step (ms) | untraced step (ms) | ratio | run overhead at --trace-every {every} |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, layout in LAYOUTS.items():
        config = bench_config(args.model, 64, 16, args.steps, **layout)
        config = replace(config, train=replace(config.train, trace_every=2))
        traced, untraced = traced_and_untraced(config)
        ratio = traced / untraced
        print(f"| {name} | {traced * 1e3:.1f} | {untraced * 1e3:.1f} | {ratio:.3f} | {(ratio - 1) / every:+.2%} |",
              flush=True)


if __name__ == "__main__":
    main()
