"""Runs that survive a lost rank: ``plait train --max-restarts 3`` with one rank SIGKILLed at a
random moment, N times, against one uninterrupted run of the same command, on ``--ranks`` ranks
under a ``--layout``: ``dp`` (plain data parallelism), ``tp-pp`` (tp2·pp2 and dp over the rest,
ZeRO-1) or ``zero3`` (dp with ZeRO-3). At three ranks or more a sum over the dp ranks rounds by
its order, so only a restart that reduces exactly as the uninterrupted run did ends bit-exact.

Each run must exit 0 with every step logged once, and end with the uninterrupted run's final loss
and weights bit for bit (the group restarts and resumes from its newest complete checkpoint). The
time lost is the faulted run's wall time less that of an uninterrupted run taken just before it
(pairs, so that load from other processes falls on both alike).

    python -m benchmarks.kill_restart [--runs 20] [--seed 0] [--ranks 4] [--layout dp]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

from benchmarks.rank_faults import final_state, logged_steps, train_killing_a_rank

STEPS = 12
COMMON = ["--model", "tiny", "--global-batch", "16", "--steps", str(STEPS), "--checkpoint-every", "3",
          "--max-restarts", "3"]


def layout_flags(layout: str, ranks: int) -> list[str]:
    """The mesh flags of ``layout`` on ``ranks`` ranks."""
    if layout == "tp-pp":
        if ranks % 4:
            raise SystemExit("--layout tp-pp needs a multiple of 4 ranks (tp2·pp2 times dp)")
        return ["--tp", "2", "--pp", "2", "--dp", str(ranks // 4), "--zero", "1", "--microbatches", "2"]
    return ["--dp", str(ranks), *(["--zero", "3"] if layout == "zero3" else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="seeds the choice of rank and moment")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layout", choices=("dp", "tp-pp", "zero3"), default="dp")
    args = parser.parse_args()
    argv = COMMON + layout_flags(args.layout, args.ranks)
    choose = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as root:
        reference = train_killing_a_rank(Path(root) / "reference", argv, after_steps=None)
        assert reference.returncode == 0, reference.output[-2000:]
        expected = final_state(Path(root) / "reference")
        print(f"uninterrupted: {reference.wall_s:.1f} s, final loss {expected[0]:.6f}", flush=True)
        finished = exact = 0
        lost = []
        for index in range(args.runs):
            run_dir = Path(root) / f"run{index}"
            after, rank, wait = choose.randrange(1, STEPS - 1), choose.randrange(args.ranks), choose.uniform(0, 0.1)
            paired = train_killing_a_rank(Path(root) / f"paired{index}", argv, after_steps=None)
            run = train_killing_a_rank(run_dir, argv, after_steps=after, rank=rank, extra_wait_s=wait)
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
