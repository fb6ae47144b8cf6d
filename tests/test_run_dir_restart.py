"""A run directory never locks: one killed before its first checkpoint is refused without --resume,
with advice that works, and --resume starts it again from step 0, as it does, with
--restart-from-scratch, when every checkpoint is damaged (each set aside, not deleted)."""

from __future__ import annotations

import json
import subprocess
import sys


def _train(run_dir, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plait", "train", "--dp", "1", "--steps", "3", "--global-batch", "4",
                           "--run-dir", str(run_dir), *extra], capture_output=True, text=True, timeout=300)


def test_a_run_killed_before_its_first_checkpoint_restarts_with_resume(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # What a run killed (kill -9) in its third step leaves: two steps logged, the third cut mid-line.
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "loss": 5.6}\n{"step": 1, "loss": 5.5}\n{"step": 2, "lo')
    refused = _train(run_dir)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "pass --resume to continue it" in refused.stderr
    resumed = _train(run_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "holds no complete checkpoint; the run starts from step 0" in resumed.stdout
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [0, 1, 2]
    assert logged[0]["loss"] != 5.6  # the steps were run again, not kept from the killed attempt


def test_a_run_whose_every_checkpoint_is_damaged_restarts_from_step_0_when_asked(tmp_path):
    run_dir = tmp_path / "run"
    assert _train(run_dir, "--steps", "2", "--checkpoint-every", "1").returncode == 0
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    for checkpoint in checkpoints:
        (checkpoint / ".metadata").unlink()
    refused = _train(run_dir, "--resume")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-2000:]
    assert "no intact checkpoint precedes it" in refused.stderr and "--restart-from-scratch" in refused.stderr
    resumed = _train(run_dir, "--resume", "--restart-from-scratch")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "holds no complete checkpoint; the run starts from step 0" in resumed.stdout
    assert "steps 0–2" in resumed.stdout
    assert all(checkpoint.with_name(f"{checkpoint.name}.damaged").is_dir() for checkpoint in checkpoints)
