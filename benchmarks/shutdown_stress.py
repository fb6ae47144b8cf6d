"""Clean shutdown, counted: N consecutive short ``plait train`` runs through the real launcher
(torchrun, one process per rank), each in a fresh run directory; the figure is how many exit 0.

A run that wrote every step but died in teardown (a gloo thread destroyed unjoined: "terminate
called without an active exception") counts as a failure, as torchrun reports it.

    python benchmarks/shutdown_stress.py [--runs 50] [--layout zero3|default] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The two layouts of issue 18's acceptance: 2-rank ZeRO-3 and the 8-rank default (dp2·tp2·pp2).
LAYOUTS = {
    "zero3": ["--model", "tiny", "--dp", "2", "--zero", "3", "--global-batch", "4"],
    "default": ["--model", "tiny", "--global-batch", "8"],
}


def one_run(run_dir: Path, layout: str, steps: int) -> tuple[int, float, str]:
    """(exit status, wall seconds, the last lines of its output)."""
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "plait", "train", *LAYOUTS[layout], "--steps", str(steps),
                                "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=600)
    tail = "\n".join((completed.stdout + completed.stderr).strip().splitlines()[-5:])
    return completed.returncode, time.perf_counter() - started, tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--layout", choices=tuple(LAYOUTS), default="zero3")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    failures, seconds = [], []
    with tempfile.TemporaryDirectory() as root:
        for index in range(args.runs):
            status, wall, tail = one_run(Path(root) / f"run{index}", args.layout, args.steps)
            seconds.append(wall)
            if status != 0:
                failures.append(index)
                print(f"run {index}: exit {status}\n{tail}", flush=True)
    print(f"{args.runs - len(failures)}/{args.runs} runs of --layout {args.layout} exited 0 "
          f"(median {statistics.median(seconds):.1f} s each); failed: {failures or 'none'}")


if __name__ == "__main__":
    main()
