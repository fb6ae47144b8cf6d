"""What a checkpoint every step costs, written in the step's time or in the background
(``--async-checkpoint``), against the same run saving none: whole ``plait train`` runs, the three
alternating round by round so that load from other processes falls on all of them alike.

    python -m benchmarks.async_checkpoint [--rounds 3] [--steps 8]

The cost per checkpoint is (run's median wall time - the no-checkpoint run's) / checkpoints.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# About 25M parameters: a checkpoint (weights and Adam's two moments) is ~300 MB.
MODEL = ["--model", "tiny", "--layers", "8", "--hidden", "512", "--heads", "8", "--ffn-hidden", "2048",
         "--dp", "2", "--global-batch", "8", "--trace-every", "1000"]
MODES = {
    "none": ["--checkpoint-every", "0", "--no-final-checkpoint"],
    "sync": ["--checkpoint-every", "1", "--keep-checkpoints", "1"],
    "async": ["--checkpoint-every", "1", "--keep-checkpoints", "1", "--async-checkpoint"],
}


def wall_seconds(run_dir: Path, steps: int, mode: str) -> float:
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "plait", "train", *MODEL, *MODES[mode], "--steps", str(steps),
                                "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=900)
    if completed.returncode:
        raise SystemExit(f"--{mode} run failed:\n{completed.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as root:
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for mode in order:
                walls[mode].append(wall_seconds(Path(root) / f"{mode}{round_}", args.steps, mode))
    median = {mode: statistics.median(values) for mode, values in walls.items()}
    cost = {mode: (median[mode] - median["none"]) / args.steps for mode in ("sync", "async")}
    for mode, values in walls.items():
        print(f"{mode:>5}: median {median[mode]:.1f} s over {args.rounds} runs ({', '.join(f'{v:.1f}' for v in values)})")
    print(f"cost per checkpoint: sync {cost['sync']:.2f} s, async {cost['async']:.2f} s "
          f"(async/sync {cost['async'] / cost['sync']:.2f})")


if __name__ == "__main__":
    main()
