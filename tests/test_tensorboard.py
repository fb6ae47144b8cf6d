"""``--tensorboard``: the event files, read back by tensorboard's own reader, hold the run's scalars."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.cases import run_config, train_losses

pytest.importorskip("tensorboard")

PER_STEP = {"loss": "loss/train", "eval_loss": "loss/eval", "lr": "lr", "grad_norm": "grad_norm",
            "step_time_s": "step_time_s", "tokens_per_s": "tokens_per_s"}


def test_event_files_hold_every_step_scalar_and_the_summary(pool, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = run_config("tiny", steps=3, dp=2)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, eval_every=2, tensorboard=True))
    run_dir = tmp_path / "run"
    pool.run(train_losses, 2, config, str(run_dir))
    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())

    for key, tag in PER_STEP.items():
        logged = [(event.step, event.value) for event in events.Scalars(tag)]
        assert logged == [(row["step"], pytest.approx(row[key], rel=1e-6)) for row in rows if key in row], tag
    assert [event.step for event in events.Scalars("loss/eval")] == [1, 2]
    # The summary's figures that exist on this device (MFU and comm fraction are null on a CPU run).
    figures = {f"summary/{key}": summary[key] for key in ("mfu", "peak_memory_bytes", "bubble_fraction", "comm_fraction")
               if summary[key] is not None}
    assert "summary/peak_memory_bytes" in figures
    assert set(events.Tags()["scalars"]) == set(PER_STEP.values()) | set(figures)
    for tag, value in figures.items():
        assert [(e.step, e.value) for e in events.Scalars(tag)] == [(2, pytest.approx(value, rel=1e-6))]


def test_a_resumed_run_shows_each_step_once(pool, tmp_path):
    """A run stopped after step 3 with its last checkpoint at step 2 resumes there and takes steps 2 and
    3 again: TensorBoard, as metrics.jsonl, holds each step once, the resumed run's."""
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from plait.train.checkpoint import checkpoint_root

    config = run_config("tiny", steps=4, dp=1)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, tensorboard=True, checkpoint_every=2))
    run_dir = tmp_path / "run"
    pool.run(train_losses, 1, config, str(run_dir))
    shutil.rmtree(checkpoint_root(run_dir) / "step_0000004")  # as if it stopped before saving step 4
    resumed = dataclasses.replace(config, train=dataclasses.replace(config.train, resume=True, lr=2 * config.train.lr))
    pool.run(train_losses, 1, resumed, str(run_dir))
    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    for tag, key in (("loss/train", "loss"), ("lr", "lr")):
        logged = [(event.step, event.value) for event in events.Scalars(tag)]
        assert logged == [(row["step"], pytest.approx(row[key], rel=1e-6)) for row in rows], tag


RAISES_BEFORE_CLOSE = """
import sys
from plait.observe.tensorboard import TensorBoardLog
board = TensorBoardLog(sys.argv[1], 0)
for step in range(200):
    board.add_step({"step": step, "loss": 1.5, "lr": 0.1, "grad_norm": 1.0, "step_time_s": 0.1, "tokens_per_s": 9.0})
raise RuntimeError("the run stops (NonFiniteLoss, say) before the log closes")
"""


def test_every_step_survives_a_process_that_dies_before_the_log_closes(tmp_path):
    """The writer's queue dies with the process; each step must be on disk when add_step returns."""
    import os
    import subprocess
    import sys

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from plait.observe.tensorboard import TENSORBOARD_DIR

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", RAISES_BEFORE_CLOSE, str(tmp_path)], env=env,
                          capture_output=True).returncode == 1
    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR), size_guidance={"scalars": 0}).Reload()
    assert [event.step for event in events.Scalars("loss/train")] == list(range(200))
