"""What ``plait explain`` suggests, trained: for runs on this machine, the layout explain says to change
to is trained with the command it printed, beside the run it was suggested for, and its measured gain
is set against the predicted gain's lower bound (the gain less the planner's own error).

    python -m benchmarks.suggestion_gain --hardware-profile this-machine.json [--out DIR] [--steps N]

The profile is ``plait calibrate --device cpu``'s for this machine. Each case is a two-rank run whose
layout leaves time on the table (a pipeline's bubble, tensor parallelism's all-reduces on a light model,
context parallelism's exchanges at a short sequence).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from plait.explain.run import explain
from plait.hardware import load_profile

CASES = {
    "pp2 (1f1b, m=2)": ["--pp", "2", "--microbatches", "2"],
    "pp2 (gpipe, m=4)": ["--pp", "2", "--microbatches", "4", "--schedule", "gpipe"],
    "tp2": ["--tp", "2"],
    "cp2": ["--cp", "2"],
}
COMMON = ["--model", "tiny", "--dp", "1", "--tp", "1", "--pp", "1", "--global-batch", "16"]


def train(argv: list[str], run_dir: Path, steps: int) -> dict:
    """Train ``argv`` into ``run_dir`` (once: a finished run is read again) and return its summary."""
    if not (run_dir / "summary.json").exists():
        command = [sys.executable, "-m", "plait", "train", *argv, "--steps", str(steps), "--run-dir", str(run_dir)]
        finished = subprocess.run(command, capture_output=True, text=True)
        if finished.returncode:
            raise SystemExit(f"{' '.join(command)} failed:\n{finished.stderr[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware-profile", required=True)
    parser.add_argument("--out", default="runs/suggestion_gain")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    profile, out = load_profile(args.hardware_profile), Path(args.out)
    print("| run | suggested | predicted gain | lower bound | measured gain | held |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for index, (name, flags) in enumerate(CASES.items()):
        run_dir = out / f"case{index}"
        before = train([*COMMON, *flags], run_dir, args.steps)
        suggestion = explain(run_dir, profile=profile).suggestion()
        if suggestion is None:
            print(f"| {name} | none (within the planner's error) | | | | |", flush=True)
            continue
        argv = suggestion["train_command"][2:]
        argv[argv.index("--run-dir") + 1] = str(out / f"case{index}-suggested")
        after = train(argv, Path(argv[argv.index("--run-dir") + 1]), args.steps)
        measured = before["step_time_s"] / after["step_time_s"] - 1
        lower = suggestion["gain"] - suggestion["error"]
        print(f"| {name} | {suggestion['name']} | {suggestion['gain']:+.1%} | {lower:+.1%} | {measured:+.1%} | "
              f"{'yes' if measured >= lower else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
