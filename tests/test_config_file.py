"""A run directory reproduces itself: RUN/config.toml, given back to plait train, repeats RUN's losses."""

from __future__ import annotations

import subprocess
import sys

from plait.observe.run_files import CONFIG_FILE, read_metrics


def _train(*argv: str) -> None:
    completed = subprocess.run([sys.executable, "-m", "plait", "train", *argv], capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]


def test_config_toml_repeats_the_run_bit_for_bit(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    _train("--model", "tiny-llama", "--dp", "2", "--steps", "3", "--global-batch", "8", "--lr", "0.002", "--seed", "5",
           "--warmup-steps", "1", "--run-dir", str(first))
    written = (first / CONFIG_FILE).read_text()
    assert 'name = "tiny-llama"' in written and "seed = 5" in written and "run_dir" not in written
    _train("--config", str(first / CONFIG_FILE), "--run-dir", str(again))
    losses = [[row["loss"] for row in read_metrics(run)] for run in (first, again)]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    assert (again / CONFIG_FILE).read_text() == written
