"""A local run stopped by a signal to the one process a user or a supervisor knows (`kill`, `timeout`,
a terminal's Ctrl-C): every rank stops with it, and the launcher says so in one line. While it runs,
its directory is its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_launcher_stops_every_rank(tmp_path, stop):
    """SIGTERM is handed on to torchrun, whose agent stops the workers; even SIGKILL, which the launcher
    cannot catch, leaves nothing behind (torchrun gets SIGTERM when its parent dies)."""
    run_dir = tmp_path / f"stopped_{stop.name}"
    launcher = subprocess.Popen([sys.executable, "-m", "plait", "train", "--model", "tiny", "--dp", "2",
                                 "--global-batch", "4", "--steps", "100000", "--log-every", "1",
                                 "--run-dir", str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # the ranks are training
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read().decode()[-2000:]
        time.sleep(0.5)
    assert len(processes_naming(str(run_dir))) >= 3  # the launcher, torchrun, two workers
    if stop == signal.SIGTERM:  # meanwhile a second run into the same directory is refused, dry or not
        for dry in ([], ["--dry-run"]):
            second = subprocess.run([sys.executable, "-m", "plait", "train", "--model", "tiny", "--dp", "2",
                                     "--global-batch", "4", "--steps", "100000", "--run-dir", str(run_dir), "--resume",
                                     *dry], capture_output=True, text=True, timeout=60,
                                    env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            assert second.returncode == 2 and "is in use by another plait train" in second.stderr, second.stderr
    launcher.send_signal(stop)
    status = launcher.wait(timeout=60)
    deadline = time.monotonic() + 60
    while processes_naming(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_naming(str(run_dir)) == []
    if stop == signal.SIGTERM:
        assert status == 128 + signal.SIGTERM
        err = launcher.stderr.read().decode()
        assert "plait: stopped by SIGTERM; resume with --resume" in err
