"""A model whose whole copies would not fit the host, once a rank, trains under ZeRO-3 on 8 CPU ranks.

A 0.7B-parameter Llama: its fp32 weights alone are 2.8 GB, so eight whole copies (what every rank
built before the model was built on the meta device) take 22 GB, and with Adam's state 90 GB. Under
``--dp 8 --zero 3`` each rank allocates only its eighth. The run's every rank's peak resident memory
is printed beside the planner's figure for it; then ``plait verify`` holds the same layout to the
single process on a smaller twin (same shape, fewer and narrower layers), losses and final weights.

    python -m benchmarks.zero3_larger_than_host [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from plait.facts.model_state import PipelineShare
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.flops import parameter_count
from plait.models.spec import model_spec
from plait.hardware import hardware
from plait.plan.simulate import stage_memory
from plait.plan.workload import Workload

LARGE = {"layers": 24, "hidden": 1536, "heads": 12, "kv_heads": 4, "ffn_hidden": 4096, "vocab": 32000, "seq_len": 64}
TWIN = {**LARGE, "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 704}
LAYOUT = {"dp": 8, "zero": 3}
GLOBAL_BATCH = 8


def flags(model: dict, steps: int) -> list[str]:
    out = ["--model", "tiny-llama", "--steps", str(steps), "--global-batch", str(GLOBAL_BATCH)]
    for name, value in {**model, **LAYOUT}.items():
        out += [f"--{name.replace('_', '-')}", str(value)]
    return out


def plait(*args: str) -> subprocess.CompletedProcess:
    completed = subprocess.run([sys.executable, "-m", "plait", *args], capture_output=True, text=True)
    if completed.returncode:
        raise SystemExit(f"plait {' '.join(args)} failed:\n{completed.stderr[-3000:]}")
    return completed


def predicted_peak(model: dict) -> float:
    spec = model_spec("tiny-llama", **model)
    layout = Layout(**LAYOUT)
    workload = Workload(spec, GLOBAL_BATCH, "fp32", STACKS["plait"])
    micro_batch = GLOBAL_BATCH // layout.dp
    return stage_memory(workload, hardware("a100-80gb"), layout, micro_batch, PipelineShare(spec.layers, True, True), 0.0, False).total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    parameters = parameter_count(model_spec("tiny-llama", **LARGE))
    print(f"model: {parameters / 1e9:.2f}B parameters; whole fp32 weights {parameters * 4 / 1e9:.1f} GB a copy, "
          f"{parameters * 4 * 8 / 1e9:.1f} GB for eight")
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / "large"
        plait("train", *flags(LARGE, args.steps), "--run-dir", str(run_dir), "--no-final-checkpoint")
        summary = json.loads((run_dir / "summary.json").read_text())
        peaks = summary["peak_memory_bytes_per_rank"]
        print(f"dp8 zero3: every rank's peak {min(peaks) / 1e9:.2f}-{max(peaks) / 1e9:.2f} GB resident "
              f"(planner {predicted_peak(LARGE) / 1e9:.2f} GB with its device reserve), "
              f"all eight {sum(peaks) / 1e9:.1f} GB; loss {summary['final_loss']:.4f}")
        verified = plait("verify", *flags(TWIN, args.steps), "--run-dir", str(Path(scratch) / "twin"))
        print("smaller twin, dp8 zero3 against one process:", verified.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
