"""``plait train`` names the layout, the world size and the run directory at once: before the launcher
and the training loop are even imported."""

from __future__ import annotations

import subprocess
import sys

import torch

from plait.layout import default_precision
from plait.train.start import device_text


def test_the_start_line_comes_before_the_launcher_is_imported(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")  # a run already there: refused once launched, so nothing trains
    # -v writes a line per import to stderr; -u keeps both streams unbuffered, so the merged order is true.
    completed = subprocess.run(
        [sys.executable, "-u", "-v", "-m", "plait", "train", "--dp", "2", "--tp", "2", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
    )
    lines = completed.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("plait: training"))
    precision = default_precision(on_gpu=torch.cuda.is_available())
    assert lines[start] == f"plait: training tiny under dp2·tp2 on {device_text(4)}, {precision}; files in {run_dir}/"
    launcher = next(i for i, line in enumerate(lines) if line.startswith("import 'plait.train.launch'"))
    assert start < launcher
    errors = [line for line in lines if line.startswith("plait: error:")]
    # Refused in one line: for the run already there, or on a CUDA host with fewer than 4 GPUs for those.
    assert completed.returncode == 2 and len(errors) == 1
    assert "already holds a run" in errors[0] or torch.cuda.is_available()
