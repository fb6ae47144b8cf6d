"""What ``plait export`` holds in memory: a run whose model is many times its largest tensor is
exported (in shards, GPT-2's transposed and fused tensors included), and the exporting process's
peak resident memory above its baseline (everything imported, nothing read) must stay under twice
the largest tensor's bytes: the export streams a tensor at a time, never the model.

    python -m benchmarks.export_memory [--layers 24]

About a minute on two cores: one training step of the model (a real checkpoint, 1 GB with Adam's
moments), then the export in a fresh process that measures itself (``resource.getrusage``'s peak
resident size).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

HIDDEN, VOCAB = 512, 16384  # the token embedding, 32 MiB of fp32, is the largest tensor


def model_flags(layers: int) -> list[str]:
    return ["--family", "gpt2", "--layers", str(layers), "--hidden", str(HIDDEN), "--heads", "8",
            "--vocab", str(VOCAB), "--seq-len", "64"]


def train_one_step(run: Path, layers: int) -> None:
    completed = subprocess.run([sys.executable, "-m", "plait", "train", *model_flags(layers), "--dp", "1",
                                "--steps", "1", "--global-batch", "2", "--trace-every", "1000", "--run-dir", str(run)],
                               capture_output=True, text=True, timeout=600)
    if completed.returncode:
        raise SystemExit(f"the training run failed:\n{completed.stderr[-2000:]}")


def measure_export(run: str, folder: str) -> None:
    """In this (fresh) process: the peak resident memory of ``plait export`` above the baseline, as JSON."""
    import plait.interop.hf_export  # noqa: F401 (everything the export imports is in the baseline)
    from plait.cli import main
    from plait.interop.hf_names import hf_tensors
    from plait.train.full_model import checkpoint_spec, run_checkpoint

    tensors = hf_tensors(checkpoint_spec(run_checkpoint(Path(run))))
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert main(["export", run, "--to", folder, "--max-shard-size", "100MB"]) == 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"model_bytes": 4 * sum(tensor.elements for tensor in tensors),
                      "largest_tensor_bytes": 4 * max(tensor.elements for tensor in tensors),
                      "baseline_bytes": baseline, "peak_bytes": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--measure", nargs=2, metavar=("RUN", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        return measure_export(*args.measure)
    with tempfile.TemporaryDirectory() as root:
        train_one_step(Path(root) / "run", args.layers)
        completed = subprocess.run([sys.executable, "-m", "benchmarks.export_memory", "--measure",
                                    str(Path(root) / "run"), str(Path(root) / "hf")],
                                   capture_output=True, text=True, timeout=600)
        if completed.returncode:
            raise SystemExit(f"the export failed:\n{completed.stderr[-2000:]}")
        figures = json.loads(completed.stdout.strip().splitlines()[-1])
        shards = len(list((Path(root) / "hf").glob("model-*.safetensors")))
    mib = 2**20
    growth = figures["peak_bytes"] - figures["baseline_bytes"]
    largest = figures["largest_tensor_bytes"]
    print(f"model {figures['model_bytes'] / mib:,.0f} MiB of fp32 weights ({args.layers} GPT-2 blocks, hidden {HIDDEN}), "
          f"largest tensor {largest / mib:,.0f} MiB, exported into {shards} shards")
    print(f"export's peak resident memory {figures['peak_bytes'] / mib:,.0f} MiB, {growth / mib:,.0f} MiB above its "
          f"baseline of {figures['baseline_bytes'] / mib:,.0f} MiB: {growth / largest:.2f}× the largest tensor "
          f"(bound 2×), {growth / figures['model_bytes']:.2f}× the model")
    if growth >= 2 * largest:
        raise SystemExit("the export held more than twice its largest tensor")


if __name__ == "__main__":
    main()
