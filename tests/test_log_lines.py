"""Output that is not a terminal gets one plain line every --log-every steps, and an immediate start line."""

from __future__ import annotations

import subprocess
import sys


def test_a_run_redirected_to_a_file_logs_plain_lines(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "plait", "train", "--dp", "1", "--steps", "7", "--global-batch", "4", "--log-every", "3",
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("plait: training tiny under single on 1 CPU process(es)")
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == ["step 0/7", "step 3/7", "step 6/7"]
    assert "\r" not in completed.stdout + completed.stderr  # no progress bar redrawn into the file
