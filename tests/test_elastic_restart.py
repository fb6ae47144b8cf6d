"""A lost rank does not end a run: under --max-restarts, torchrun's elastic agent restarts the group
and every rank resumes from the newest complete checkpoint by itself, ending where an
uninterrupted run ends, bit for bit, at four ranks. A run that does end says why in one plait line,
the last on the terminal, naming the rank; torchrun's own report goes to the run folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.rank_faults import final_state, logged_steps, train_killing_a_rank
from plait.train.torchrun_report import TORCHRUN_LOG

ROOT = Path(__file__).resolve().parents[1]

ARGV = ["--model", "tiny", "--dp", "4", "--global-batch", "8", "--steps", "8", "--checkpoint-every", "3",
        "--max-restarts", "1", "--trace-every", "100"]


def test_a_rank_killed_mid_run_is_restarted_and_the_run_ends_bit_exact(tmp_path):
    uninterrupted = train_killing_a_rank(tmp_path / "whole", ARGV, after_steps=None)
    assert uninterrupted.returncode == 0, uninterrupted.output[-2000:]
    faulted = train_killing_a_rank(tmp_path / "faulted", ARGV, after_steps=5, rank=2)
    assert faulted.killed_rank == 2, faulted.output[-2000:]
    assert faulted.returncode == 0, faulted.output[-2000:]
    assert "plait: restart 1 of 1 after a lost rank: resuming from step_0000003" in faulted.output
    assert logged_steps(tmp_path / "faulted") == list(range(8))
    assert final_state(tmp_path / "faulted") == final_state(tmp_path / "whole")


def test_without_restarts_a_lost_rank_ends_the_run(tmp_path):
    no_restarts = [arg for arg in ARGV if arg not in ("--max-restarts", "1")]
    faulted = train_killing_a_rank(tmp_path / "faulted", no_restarts, after_steps=2, rank=1)
    assert faulted.killed_rank == 1 and faulted.returncode != 0
    assert "plait: restart" not in faulted.output
    assert_one_plait_line_ends(faulted.output, "plait: error: rank 1 (dp1) was ended by SIGKILL (killed, or out of "
                               f"memory); torchrun's report is in {tmp_path / 'faulted' / TORCHRUN_LOG}", tmp_path / "faulted")


def test_used_up_restarts_end_in_one_line_quoting_the_rank_s_exception(tmp_path):
    """tests/crash_fault raises on rank 1 in every attempt's third step: the one restart is used and
    the run ends with the exception's own words."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / part) for part in ("tests/crash_fault", "src", ""))}
    run_dir = tmp_path / "run"
    job = subprocess.run([sys.executable, "-m", "plait", "train", "--model", "tiny", "--dp", "2", "--global-batch", "4",
                          "--steps", "10", "--max-restarts", "1", "--run-dir", str(run_dir)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert job.returncode != 0
    assert "plait: restart 1 of 1 after a lost rank" in job.stderr
    assert_one_plait_line_ends(job.stdout + job.stderr, "plait: error: rank 1 (dp1) exited with code 1: RuntimeError: "
                               "injected crash on rank 1; all 1 restarts (--max-restarts) are used; torchrun's report "
                               f"is in {run_dir / TORCHRUN_LOG}", run_dir)


def assert_one_plait_line_ends(output: str, last_line: str, run_dir: Path) -> None:
    """``last_line`` ends the output, no line of torchrun's report or a traceback is on the terminal, and
    the run folder's log holds the report."""
    assert output.rstrip("\n").splitlines()[-1] == last_line, output[-3000:]
    assert "Root Cause" not in output and "Traceback" not in output, output[-3000:]
    assert "Root Cause (first observed failure)" in (run_dir / TORCHRUN_LOG).read_text()
