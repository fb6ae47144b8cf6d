"""Step time of tp = 2 against dp = 2 (and a single rank) on the same model, measured in one run.

    python -m benchmarks.tensor_vs_data_parallel [--model tiny] [--seq-len 256] 2>/dev/null
"""

from __future__ import annotations

import argparse

from benchmarks.common import bench_config, step_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    layouts = {"single": {}, "dp2": {"dp": 2}, "tp2": {"tp": 2}, "tp2·sp": {"tp": 2, "sp": True}}
    configs = {
        name: bench_config(args.model, args.seq_len, args.global_batch, args.steps, **layout)
        for name, layout in layouts.items()
    }
    times = step_times(configs, args.rounds)
    print(f"model {args.model}, seq {args.seq_len}, global batch {args.global_batch}, one thread per rank")
    for name, seconds in times.items():
        print(f"{name:8s} {seconds * 1000:8.1f} ms/step   ×{times['single'] / seconds:.2f} vs single   "
              f"{seconds / times['dp2']:.2f}× dp2's step time")


if __name__ == "__main__":
    main()
