"""Step time of the three context-parallel algorithms (all-to-all, ring, all-gather) side by side,
at several lengths.

Same model, cp and tokens per step; configs interleaved in each round (benchmarks.common). Beside
the times, the bytes one rank hands per layer and step to the context-parallel exchange, from the
shared facts (plait.facts.collectives), which tests/test_tensor_context_costs.py holds equal to
what the engine sends.

    python -m benchmarks.cp_algorithms [--model tiny-llama] [--cp 2] [--lengths 256 1024] 2>/dev/null
"""

from __future__ import annotations

import argparse

from benchmarks.common import bench_config, step_times
from plait.facts.collectives import layer_collectives
from plait.layout import CP_ALGORITHMS as ALGORITHMS
from plait.layout import Layout
from plait.models.spec import model_spec


def exchange_bytes(model: str, length: int, batch: int, cp: int, algorithm: str) -> int:
    """Bytes one rank hands the cp exchange of one layer per step, forward and backward, fp32."""
    calls = layer_collectives(model_spec(model, seq_len=length), Layout(cp=cp, cp_algorithm=algorithm), batch)
    return sum((call.forward + call.backward) * call.handed_bytes for call in calls if call.group == "cp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per step (global batch × seq-len)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"model {args.model}, cp {args.cp}, {args.tokens} tokens per step, one thread per rank")
    print("seq-len   " + "   ".join(f"{name} ms/step" for name in ALGORITHMS) + "   "
          + "   ".join(f"{name} / all-to-all" for name in ALGORITHMS[1:]) + "   "
          + "   ".join(f"KiB/layer {name}" for name in ALGORITHMS))
    for length in args.lengths:
        batch = max(1, args.tokens // length)
        configs = {name: bench_config(args.model, length, batch, args.steps, cp=args.cp, cp_algorithm=name)
                   for name in ALGORITHMS}
        times = step_times(configs, args.rounds)
        volume = {name: exchange_bytes(args.model, length, batch, args.cp, name) / 1024 for name in ALGORITHMS}
        print(f"{length:7d}   " + "   ".join(f"{times[name] * 1000:.1f}" for name in ALGORITHMS) + "   "
              + "   ".join(f"{times[name] / times[ALGORITHMS[0]]:.2f}" for name in ALGORITHMS[1:]) + "   "
              + "   ".join(f"{volume[name]:.0f}" for name in ALGORITHMS))

if __name__ == "__main__":
    main()
