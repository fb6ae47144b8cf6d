"""One GPU's checks in one command: calibrate it, train plait's single-rank runs of
docs/VALIDATION.md ("plait's own runs on one H100"), and set each run's step time and peak memory
beside the catalog entry's prediction and the calibrated profile's, a row as each run ends; last,
the largest Llama the planner fits on this GPU, built on the meta device and trained under the
planner's pick (``--auto``), its measured peak beside the predicted one.

    python benchmarks/gpu_checks.py [--out DIR] [--steps 8]

On an H100 the calibration took 52 s and each run 40–70 s, start-up included. Needs a GPU; on a
machine without one it says so and exits.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.gpu_mfu import train_one_rank
from plait.layout import Layout
from plait.explain.run import explain
from plait.hardware import load_profile

LLAMA_1B_8K = ["--model", "llama-1b", "--global-batch", "8", "--microbatches", "8"]
RUNS = {
    "llama-1b, 8 × 8k tokens": LLAMA_1B_8K,
    "the same, full recomputation": [*LLAMA_1B_8K, "--recompute", "full"],
    "the same, full recomputation, micro-batch 2": [*LLAMA_1B_8K[:-1], "4", "--recompute", "full"],
    "the same, selective recomputation": [*LLAMA_1B_8K, "--recompute", "selective"],
    "llama-1b, 32 × 2k tokens, micro-batch 4": ["--model", "llama-1b", "--seq-len", "2048", "--global-batch", "32",
                                                "--microbatches", "8"],
    "llama-3b, 4 × 8k tokens, full recomputation": ["--model", "llama-3b", "--global-batch", "4", "--microbatches", "4",
                                                    "--recompute", "full"],
    "gpt2-xl, 16 × 1k tokens, micro-batch 4": ["--model", "gpt2-xl", "--global-batch", "16", "--microbatches", "4"],
}


# Llamas of llama-3b's shape growing by depth, 4 × 4k tokens a step: the largest the planner fits is trained.
LARGEST_LAYERS = (28, 36, 44, 52, 60)
LARGEST_FLAGS = ["--model", "llama-3b", "--seq-len", "4096", "--global-batch", "4"]


def fits_one_gpu(layers: int) -> bool:
    """Whether ``plait plan`` finds any layout of that Llama on this one GPU."""
    plan = subprocess.run([sys.executable, "-m", "plait", "plan", *LARGEST_FLAGS, "--layers", str(layers), "--gpus", "1",
                           "--json", "--top", "1"], capture_output=True, text=True)
    return plan.returncode == 0 and bool(json.loads(plan.stdout or "[]"))


def largest_model_row(out: Path, steps: int) -> str:
    """The deepest Llama of ``LARGEST_LAYERS`` that fits, trained under ``--auto``: its peak against the prediction."""
    layers = max((n for n in LARGEST_LAYERS if fits_one_gpu(n)), default=None)
    if layers is None:
        return "| largest model | none of the Llamas fits |"
    run_dir = out / "largest"
    subprocess.run([sys.executable, "-m", "plait", "train", *LARGEST_FLAGS, "--layers", str(layers), "--auto",
                    "--ranks", "1", "--steps", str(steps), "--run-dir", str(run_dir), "--no-final-checkpoint"], check=True)
    explanation = explain(run_dir)
    measured, predicted = explanation.summary["peak_memory_bytes"], explanation.prediction.peak_memory_bytes
    layout = Layout(**explanation.summary["layout"]).describe()
    return (f"| largest model: llama-3b shape, {layers} layers, {layout} | peak measured "
            f"{measured / 1e9:.1f} GB | predicted {predicted / 1e9:.1f} GB ({predicted / measured - 1:+.1%}) |")


def percent(predicted: float, measured: float) -> str:
    return f"{predicted:.3f} ({predicted / measured - 1:+.1%})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the profile and the runs go (default: a temporary folder)")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_checks: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "plait", "calibrate", "--device", "cuda", "--out", str(out / "profile.json")],
                       check=True, stdout=subprocess.DEVNULL)
        profile = load_profile(out / "profile.json")
        print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, median of the plain steps of {args.steps} each")
        print("| run | measured (s) | catalog (s) | calibrated (s) | peak measured (GB) | peak predicted (GB) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |", flush=True)
        for name, flags in RUNS.items():
            run_dir = out / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
            train_one_rank(run_dir, [*flags, "--steps", str(args.steps)])
            catalog, calibrated = explain(run_dir), explain(run_dir, profile=profile)
            measured = catalog.summary["step_time_s"]
            print(f"| {name} | {measured:.3f} | {percent(catalog.prediction.step_time_s, measured)} | "
                  f"{percent(calibrated.prediction.step_time_s, measured)} | "
                  f"{catalog.summary['peak_memory_bytes'] / 1e9:.1f} | {catalog.prediction.peak_memory_bytes / 1e9:.1f} |",
                  flush=True)
        print(largest_model_row(out, args.steps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
