"""Runs that survive a lost rank: ``plait train --max-restarts 3`` with one rank SIGKILLed at a
random moment, N times, against one uninterrupted run of the same command.

Each run must exit 0 with every step logged once, and end with the uninterrupted run's final loss
and weights bit for bit (the group restarts and resumes from its newest complete checkpoint). The
time lost is the faulted run's wall time less that of an uninterrupted run taken just before it
(pairs, so that load from other processes falls on both alike).

    python -m benchmarks.kill_restart [--runs 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

from benchmarks.rank_faults import final_state, logged_steps, train_killing_a_rank

STEPS = 12
RANKS = 2
ARGV = ["--model", "tiny", "--dp", str(RANKS), "--global-batch", "8", "--steps", str(STEPS),
        "--checkpoint-every", "3", "--max-restarts", "3"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="seeds the choice of rank and moment")
    args = parser.parse_args()
    choose = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as root:
        reference = train_killing_a_rank(Path(root) / "reference", ARGV, after_steps=None)
        assert reference.returncode == 0, reference.output[-2000:]
        expected = final_state(Path(root) / "reference")
        print(f"uninterrupted: {reference.wall_s:.1f} s, final loss {expected[0]:.6f}", flush=True)
        finished = exact = 0
        lost = []
        for index in range(args.runs):
            run_dir = Path(root) / f"run{index}"
            after, rank, wait = choose.randrange(1, STEPS - 1), choose.randrange(RANKS), choose.uniform(0, 0.1)
            paired = train_killing_a_rank(Path(root) / f"paired{index}", ARGV, after_steps=None)
            run = train_killing_a_rank(run_dir, ARGV, after_steps=after, rank=rank, extra_wait_s=wait)
            whole = run.returncode == 0 and logged_steps(run_dir) == list(range(STEPS))
            same = whole and final_state(run_dir) == expected
            finished += whole
            exact += same
            lost.append(run.wall_s - paired.wall_s)
            print(f"run {index}: rank {run.killed_rank} killed after step {after - 1} (+{wait:.2f} s): "
                  f"exit {run.returncode}, {'all steps' if whole else 'steps missing'}, "
                  f"{'bit-exact' if same else 'DIFFERS'}, {run.wall_s:.1f} s (uninterrupted {paired.wall_s:.1f} s)", flush=True)
            if not whole:  # plait's own lines and every error line, without torchrun's tracebacks
                print("\n".join(line for line in run.output.splitlines()
                                if line.startswith("plait") or "Error" in line or "error" in line), flush=True)
    print(f"{finished}/{args.runs} finished, {exact}/{args.runs} bit-exact with the uninterrupted run; "
          f"median time lost {statistics.median(lost):.1f} s (min {min(lost):.1f}, max {max(lost):.1f})")


if __name__ == "__main__":
    main()
