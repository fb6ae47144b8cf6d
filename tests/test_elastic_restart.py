"""A lost rank does not end a run: under --max-restarts, torchrun's elastic agent restarts the group
and every rank resumes from the newest complete checkpoint by itself, ending where an
uninterrupted run ends, bit for bit."""

from __future__ import annotations

from benchmarks.rank_faults import final_state, logged_steps, train_killing_a_rank

ARGV = ["--model", "tiny", "--dp", "2", "--global-batch", "8", "--steps", "8", "--checkpoint-every", "3",
        "--max-restarts", "1", "--trace-every", "100"]


def test_a_rank_killed_mid_run_is_restarted_and_the_run_ends_bit_exact(tmp_path):
    uninterrupted = train_killing_a_rank(tmp_path / "whole", ARGV, after_steps=None)
    assert uninterrupted.returncode == 0, uninterrupted.output[-2000:]
    faulted = train_killing_a_rank(tmp_path / "faulted", ARGV, after_steps=5, rank=1)
    assert faulted.killed_rank == 1, faulted.output[-2000:]
    assert faulted.returncode == 0, faulted.output[-2000:]
    assert "plait: restart 1 of 1 after a lost rank: resuming from step_0000003" in faulted.output
    assert logged_steps(tmp_path / "faulted") == list(range(8))
    assert final_state(tmp_path / "faulted") == final_state(tmp_path / "whole")


def test_without_restarts_a_lost_rank_ends_the_run(tmp_path):
    no_restarts = [arg for arg in ARGV if arg not in ("--max-restarts", "1")]
    faulted = train_killing_a_rank(tmp_path / "faulted", no_restarts, after_steps=2, rank=1)
    assert faulted.killed_rank == 1 and faulted.returncode != 0
    assert "plait: restart" not in faulted.output
