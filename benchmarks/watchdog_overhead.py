"""What the stall watchdog costs: the same ``plait train`` runs (through torchrun, where the watchdog
lives) with the watchdog off (``--stall-timeout 0``) and on (the default, and a 3 s timeout that
polls the store four times as often), interleaved round by round so that load from other processes
falls on all alike. The figure per layout: each setting's median step time (steps after the first
five, tracing off), the best over the rounds as in benchmarks.common, and its ratio to the watchdog
off.

    python benchmarks/watchdog_overhead.py [--rounds 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from plait.config import TrainSpec

LAYOUTS = {
    "dp2": ["--dp", "2", "--global-batch", "4"],
    "pp2 m8": ["--pp", "2", "--microbatches", "8", "--global-batch", "16"],  # a record per pipeline action
}
SETTINGS = {"off": "0", f"{TrainSpec().stall_timeout:g} s (default)": f"{TrainSpec().stall_timeout:g}", "3 s": "3"}
WARM_UP = 5


def step_times(layout: list[str], stall_timeout: str, steps: int, run_dir: Path) -> list[float]:
    """Every step time after warm-up of one run, from its metrics.jsonl."""
    subprocess.run([sys.executable, "-m", "plait", "train", "--model", "tiny", *layout, "--steps", str(steps),
                    "--stall-timeout", stall_timeout, "--trace-every", str(10 * steps), "--no-final-checkpoint",
                    "--run-dir", str(run_dir)], check=True, capture_output=True, timeout=900)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["step_time_s"] for row in rows[WARM_UP:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        for name, layout in LAYOUTS.items():
            best = {setting: float("inf") for setting in SETTINGS}
            for round_ in range(args.rounds):
                for setting, value in SETTINGS.items():
                    run_dir = Path(root) / f"{name}-{value}-{round_}"
                    median = statistics.median(step_times(layout, value, args.steps, run_dir))
                    best[setting] = min(best[setting], median)
            off = best["off"]
            print(f"{name}: " + ", ".join(f"{setting} {seconds * 1e3:.2f} ms ({seconds / off:.3f}×)"
                                          for setting, seconds in best.items()) +
                  f" (best of {args.rounds} runs' medians)", flush=True)


if __name__ == "__main__":
    main()
