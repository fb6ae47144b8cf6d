"""Single-GPU MFU of ``llama-1b`` in bf16 against the catalog's peak, beside the planner's prediction.

Trains the model on one CUDA device with ``plait train`` (NCCL, one rank, every layout dimension 1)
and sets what the run measured beside ``plait explain``'s prediction of the same run on the device's
catalog entry: step time, tokens per second and MFU (model FLOPs per second over the catalog's dense
bf16 peak). Needs a GPU; on a machine without one it says so and exits.

    python benchmarks/gpu_mfu.py [--model llama-1b] [--steps 30] [--global-batch 8] [--microbatches 8]
                                 [--recompute none|selective|op|full] [--hardware-profile FILE]

With ``--hardware-profile`` (a profile ``plait calibrate`` measured on this GPU) the prediction is
that profile's instead of the catalog entry's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from plait.explain.run import explain
from plait.hardware import load_profile


def train_one_rank(run_dir: Path, flags: list[str]) -> None:
    """``plait train`` on this machine's first GPU, every layout dimension 1, bf16, no checkpoint kept."""
    subprocess.run([sys.executable, "-m", "plait", "train", "--dp", "1", "--tp", "1", "--pp", "1", "--cp", "1",
                    "--precision", "bf16", "--run-dir", str(run_dir), "--no-final-checkpoint", *flags], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=8)  # micro-batch 1: 8k tokens fit 80 GB
    parser.add_argument("--recompute", default="none", choices=("none", "selective", "op", "full"))
    parser.add_argument("--hardware-profile", metavar="FILE", help="predict with this calibrated profile")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_mfu: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        train_one_rank(run_dir, ["--model", args.model, "--steps", str(args.steps), "--global-batch", str(args.global_batch),
                                 "--microbatches", str(args.microbatches), "--recompute", args.recompute])
        explanation = explain(run_dir, profile=load_profile(args.hardware_profile) if args.hardware_profile else None)
        print(f"{args.model} on {explanation.summary['device_name']} (predicted as {explanation.hardware.name}, "
              f"{explanation.hardware.bf16_tflops:.0f} dense bf16 TFLOP/s), global batch {args.global_batch} "
              f"in {args.microbatches} micro-batches, recompute {args.recompute}, median of {args.steps} steps")
        print("| quantity | predicted | measured |\n| --- | ---: | ---: |")
        for quantity, predicted, measured, unit in explanation.rows():
            if predicted is not None or measured is not None:
                fmt = (lambda x: "—" if x is None else f"{x:.1%}") if unit == "fraction" else \
                    (lambda x: "—" if x is None else f"{x:,.4g}")
                print(f"| {quantity} | {fmt(predicted)} | {fmt(measured)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
