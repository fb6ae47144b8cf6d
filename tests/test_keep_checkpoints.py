"""--keep-checkpoints K keeps the newest K complete checkpoints, deleting older ones only once a newer
one is complete, never touching one set aside as damaged; the run resumes from what is kept."""

from __future__ import annotations

import subprocess
import sys


def _train(run_dir, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plait", "train", "--dp", "1", "--global-batch", "4",
                           "--checkpoint-every", "1", "--run-dir", str(run_dir), *extra],
                          capture_output=True, text=True, timeout=300)


def test_only_the_newest_checkpoints_are_kept_and_the_run_resumes_from_them(tmp_path):
    run_dir = tmp_path / "run"
    aside = run_dir / "checkpoints" / "step_0000001.damaged"
    aside.mkdir(parents=True)
    first = _train(run_dir, "--steps", "4", "--keep-checkpoints", "2")
    assert first.returncode == 0, first.stderr[-2000:]
    kept = sorted(path.name for path in (run_dir / "checkpoints").iterdir())
    assert kept == ["step_0000001.damaged", "step_0000003", "step_0000004"]
    resumed = _train(run_dir, "--steps", "6", "--keep-checkpoints", "1", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from step_0000004" in resumed.stdout
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == ["step_0000001.damaged",
                                                                               "step_0000006"]


def test_a_negative_count_is_refused_in_one_line(tmp_path):
    refused = _train(tmp_path / "run", "--steps", "2", "--keep-checkpoints", "-1")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "keep-checkpoints must be a non-negative integer" in refused.stderr
    assert not (tmp_path / "run").exists()
