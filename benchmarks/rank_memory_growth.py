"""A model N parameters bigger costs each rank what the planner says, not the whole model.

Whole ``plait train`` runs of a Llama and of the same Llama with more layers, under each layout;
each rank's measured peak (host memory on CPU: ``peak_memory_bytes_per_rank`` in summary.json, the
process's maximum resident set, through the build, every step and the final checkpoint's save)
grows by the ratio printed of what the planner predicts for the busiest rank's growth (its parameters,
gradients, optimizer state, activations and runtime buffers, ``plan.simulate.evaluate``).

    python -m benchmarks.rank_memory_growth [--layers 4 12] [--hidden 1024]

The acceptance bound is a ratio of at most 1.2 on the busiest rank's growth. Before the model was
built on the meta device, every rank of ``--dp 8 --zero 3`` first held the whole fp32 model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.flops import parameter_count
from plait.models.spec import model_spec
from plait.hardware import hardware
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload

LAYOUTS = {
    "dp8 zero3": {"dp": 8, "zero": 3},
    "tp2 pp2 dp2 zero1": {"tp": 2, "pp": 2, "dp": 2, "zero": 1, "microbatches": 2},
}
GLOBAL_BATCH = 8
SEQ_LEN = 128


def model_flags(layers: int, hidden: int) -> dict:
    return {"layers": layers, "hidden": hidden, "heads": hidden // 64, "kv_heads": hidden // 128,
            "ffn_hidden": hidden * 11 // 4, "vocab": 256, "seq_len": SEQ_LEN}


def measured_peaks(layout: dict, model: dict, run_dir: Path) -> list[int]:
    """Every rank's peak resident bytes over one whole run of two steps."""
    flags = ["--model", "tiny-llama", "--steps", "2", "--global-batch", str(GLOBAL_BATCH), "--run-dir", str(run_dir)]
    for name, value in {**model, **layout}.items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    completed = subprocess.run([sys.executable, "-m", "plait", "train", *flags], capture_output=True, text=True)
    if completed.returncode:
        raise SystemExit(f"plait train {' '.join(flags)} failed:\n{completed.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())["peak_memory_bytes_per_rank"]


def predicted_peak(layout: dict, model: dict) -> float:
    """The planner's peak of the busiest rank (``plan.simulate.evaluate``)."""
    spec, lay = model_spec("tiny-llama", **model), Layout(**layout)
    workload = Workload(spec, GLOBAL_BATCH, "fp32", STACKS["plait"])
    return evaluate(workload, hardware("a100-80gb"), lay.world_size, lay).peak_memory_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs=2, default=(4, 12), help="the small and the grown model's layers")
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()
    small, grown = (model_flags(layers, args.hidden) for layers in args.layers)
    added = parameter_count(model_spec("tiny-llama", **grown)) - parameter_count(model_spec("tiny-llama", **small))
    print(f"growth: {args.layers[0]} -> {args.layers[1]} layers of hidden {args.hidden}, {added / 1e6:.1f}M parameters")
    for name, layout in LAYOUTS.items():
        with tempfile.TemporaryDirectory() as scratch:
            before = measured_peaks(layout, small, Path(scratch) / "small")
            after = measured_peaks(layout, grown, Path(scratch) / "grown")
        predicted = predicted_peak(layout, grown) - predicted_peak(layout, small)
        growth = max(after) - max(before)
        print(f"{name}: the busiest rank's peak grew {growth / 2**20:,.0f} MiB ({max(before) / 2**20:,.0f} -> "
              f"{max(after) / 2**20:,.0f}), the planner's {predicted / 2**20:,.0f} MiB: ratio {growth / predicted:.2f}; "
              f"the whole model's fp32 weights {added * 4 / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
