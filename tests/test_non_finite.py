"""A step whose gradients or loss turn NaN stops the run in one line, naming the step, before the
optimizer takes it; metrics.jsonl stays JSON and no NaN weights are saved."""

from __future__ import annotations

import json
import subprocess
import sys


def test_a_diverging_run_stops_at_the_first_non_finite_loss(tmp_path):
    run_dir = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, "-m", "plait", "train", "--dp", "1", "--lr", "1e30", "--warmup-steps", "0", "--steps", "6",
         "--global-batch", "4", "--checkpoint-every", "1", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 1
    errors = [line for line in completed.stderr.splitlines() if line.startswith("plait:")]
    assert len(errors) == 1 and ("the gradient norm is nan" in errors[0] or "the loss is nan" in errors[0]), \
        completed.stderr[-2000:]
    stopped_at = int(errors[0].split("step ")[1].split(":")[0])
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in logged] == list(range(stopped_at))
    assert all(entry["loss"] == entry["loss"] for entry in logged)  # no NaN was written
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert saved == [f"step_{step:07d}" for step in range(1, stopped_at + 1)]


def test_weights_that_overflow_are_never_saved(tmp_path):
    """A learning rate past float32's range: step 0's loss and gradient norm are finite, its update is not."""
    run_dir = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, "-m", "plait", "train", "--dp", "1", "--lr", "1e39", "--warmup-steps", "0", "--steps", "4",
         "--global-batch", "4", "--checkpoint-every", "1", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 1
    errors = [line for line in completed.stderr.splitlines() if line.startswith("plait:")]
    assert errors == ["plait: error: step 0: the weights are not finite after the step, so it was not saved; resume "
                      "from an earlier checkpoint with a lower --lr"], completed.stderr[-2000:]
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0]
    assert not list((run_dir / "checkpoints").glob("step_*"))
