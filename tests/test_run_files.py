"""The run directory, and resuming from a checkpoint under the same or another layout."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

from plait.observe.run_files import read_metrics
from tests.cases import run_config, train_losses


def test_plait_train_writes_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, "-m", "plait", "train", "--dp", "2", "--steps", "4", "--global-batch", "8",
         "--seq-len", "32", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    for row in rows:
        assert {"step", "loss", "step_time_s", "tokens_per_s"} <= set(row)
        assert row["tokens_per_s"] == 8 * 32 / row["step_time_s"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"layout", "world_size", "final_loss", "tokens_per_s", "bubble_fraction", "comm_fraction", "mfu",
            "peak_memory_bytes"} <= set(summary)
    assert summary["world_size"] == 2 and summary["layout"]["dp"] == 2
    assert summary["final_loss"] == rows[-1]["loss"]
    assert len(summary["peak_memory_bytes_per_rank"]) == 2 and summary["peak_memory_bytes"] > 0
    assert (run_dir / "loss.png").stat().st_size > 0


def test_resume_continues_exactly_under_any_layout(pool, tmp_path):
    straight = pool.run(train_losses, 1, run_config(steps=6))[0]
    saved_dir = str(tmp_path / "saved")
    first_half = replace(run_config(steps=3, dp=2), train=replace(run_config(steps=3).train, checkpoint_every=3))
    pool.run(train_losses, 2, first_half, saved_dir)

    for layout in ({"dp": 2}, {"dp": 1}):
        config = run_config(steps=6, **layout)
        resumed = pool.run(train_losses, layout["dp"], replace(config, train=replace(config.train, resume=True)), saved_dir)
        for a, b in zip(straight[3:], resumed[0], strict=True):
            assert abs(a - b) <= 1e-5 * abs(a), (layout, straight[3:], resumed[0])
    assert [row["step"] for row in read_metrics(tmp_path / "saved")] == list(range(6))
