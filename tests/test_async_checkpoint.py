"""--async-checkpoint writes checkpoints in the background while training goes on; what it writes is
the state of its own step (not of the steps taken while it was written), so a run resumed from it
ends bit for bit where an uninterrupted run ends."""

from __future__ import annotations

import shutil
import subprocess
import sys

from benchmarks.rank_faults import final_state

ARGV = ["--model", "tiny", "--dp", "2", "--global-batch", "8", "--checkpoint-every", "3", "--trace-every", "100"]


def _train(run_dir, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plait", "train", *ARGV, "--run-dir", str(run_dir), *extra],
                          capture_output=True, text=True, timeout=600)


def test_a_run_resumed_from_a_background_checkpoint_ends_bit_exact(tmp_path):
    whole = _train(tmp_path / "whole", "--steps", "9")
    assert whole.returncode == 0, whole.stderr[-2000:]
    first = _train(tmp_path / "async", "--steps", "6", "--async-checkpoint")
    assert first.returncode == 0, first.stderr[-2000:]
    checkpoints = tmp_path / "async" / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == ["step_0000003", "step_0000006"]
    shutil.rmtree(checkpoints / "step_0000006")  # resume from the one written while steps 3-5 ran
    resumed = _train(tmp_path / "async", "--steps", "9", "--async-checkpoint", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from step_0000003" in resumed.stdout
    assert final_state(tmp_path / "async") == final_state(tmp_path / "whole")
