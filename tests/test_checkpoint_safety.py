"""A checkpoint is data: a crafted .metadata runs nothing on resume and is refused in one line."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys


class Payload:
    """What an attacker puts in .metadata: unpickling it would create ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _train(run_dir, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plait", "train", "--dp", "1", "--steps", "2", "--global-batch", "4",
                           "--checkpoint-every", "1", "--run-dir", str(run_dir), *extra],
                          capture_output=True, text=True, timeout=300)


def test_a_pickle_payload_in_metadata_runs_nothing(tmp_path):
    run_dir = tmp_path / "run"
    assert _train(run_dir).returncode == 0
    newest = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    marker = tmp_path / "pwned"
    (newest / ".metadata").write_bytes(pickle.dumps(Payload(str(marker))))
    resumed = _train(run_dir, "--resume", "--steps", "3")
    assert resumed.returncode == 2
    assert resumed.stderr.count("\n") == 1 and "is not checkpoint metadata" in resumed.stderr, resumed.stderr
    assert not marker.exists()
    # The genuine metadata of an untouched checkpoint still loads: the run resumes from it.
    (newest / ".metadata").unlink()
    os.rename(newest, newest.with_name("step_broken.partial"))
    resumed = _train(run_dir, "--resume", "--steps", "3")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not marker.exists()
