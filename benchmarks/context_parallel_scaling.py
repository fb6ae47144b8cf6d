"""Step time of cp = 2 against cp = 1 across sequence lengths, same model and tokens per step.

    python -m benchmarks.context_parallel_scaling [--model tiny] [--lengths 128 256 512 1024] 2>/dev/null
"""

from __future__ import annotations

import argparse

from benchmarks.common import bench_config, step_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per step (global batch × seq-len)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"model {args.model}, {args.tokens} tokens per step, one thread per rank")
    print("seq-len   cp1 ms/step   cp2 ms/step   cp2 / cp1")
    for length in args.lengths:
        batch = max(1, args.tokens // length)
        configs = {cp: bench_config(args.model, length, batch, args.steps, cp=cp) for cp in (1, 2)}
        times = step_times(configs, args.rounds)
        single, split = times[1], times[2]
        print(f"{length:7d}   {single * 1000:11.1f}   {split * 1000:11.1f}   {split / single:9.2f}")


if __name__ == "__main__":
    main()
