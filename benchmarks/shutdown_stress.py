"""Clean shutdown, counted: N consecutive short ``plait train`` runs of each layout through the real
launcher (torchrun, one process per rank), each in a fresh run directory; the figure is how many
exit 0, per layout.

A run that wrote every step but died in teardown (a gloo thread destroyed unjoined: "terminate
called without an active exception") counts as a failure, as torchrun reports it. The whole
output of every failed run is kept in ``--keep`` (one file per failure) to find its cause.

    python benchmarks/shutdown_stress.py [--runs 50] [--layouts zero3 default] [--keep DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The two layouts of issue 18's acceptance: 2-rank ZeRO-3 for 10 steps and the 8-rank default
# (dp2·tp2·pp2) for a few: each run's own steps, so that 50 of each take tens of minutes, not hours.
LAYOUTS = {
    "zero3": ["--model", "tiny", "--dp", "2", "--zero", "3", "--global-batch", "4", "--steps", "10"],
    "default": ["--model", "tiny", "--global-batch", "8", "--steps", "3"],
}


def one_run(run_dir: Path, layout: str) -> tuple[int, float, str]:
    """(exit status, wall seconds, its whole output)."""
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "plait", "train", *LAYOUTS[layout], "--run-dir", str(run_dir)],
                               capture_output=True, text=True, timeout=900)
    output = f"--- stdout\n{completed.stdout}\n--- stderr\n{completed.stderr}"
    return completed.returncode, time.perf_counter() - started, output


def stress(layout: str, runs: int, keep: Path) -> str:
    """Run ``layout`` ``runs`` times in a row; the count line, failures' output kept under ``keep``."""
    failures, seconds = [], []
    with tempfile.TemporaryDirectory() as root:
        for index in range(runs):
            status, wall, output = one_run(Path(root) / f"run{index}", layout)
            seconds.append(wall)
            if status != 0:
                failures.append(f"{index} (exit {status})")
                (keep / f"{layout}-run{index}.txt").write_text(output)
                print(f"{layout} run {index}: exit {status}; its output is in {keep}/{layout}-run{index}.txt",
                      flush=True)
    return (f"{runs - len(failures)}/{runs} runs of {layout} ({' '.join(LAYOUTS[layout])}) exited 0 "
            f"(median {statistics.median(seconds):.1f} s each); failed: {', '.join(failures) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="consecutive runs of each layout")
    parser.add_argument("--layouts", nargs="+", choices=tuple(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--keep", type=Path, default=Path("shutdown_failures"),
                        help="folder for the whole output of each failed run")
    args = parser.parse_args()
    args.keep.mkdir(parents=True, exist_ok=True)
    lines = [stress(layout, args.runs, args.keep) for layout in args.layouts]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
