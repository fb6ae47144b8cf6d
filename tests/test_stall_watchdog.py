"""A stalled rank is named within seconds, not after the 10-minute collective timeout: ``plait train``
runs through torchrun, one worker is stopped with SIGSTOP mid-run (or hangs alive, by a fault), and
the job must exit non-zero within --stall-timeout + 10 s with a line naming the stalled rank and
what its peers wait in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plait.config import TrainSpec
from plait.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
STALL_TIMEOUT = 3
# (layout flags, the rank stopped, its coordinates, what a peer is seen waiting in). Stopping rank 0
# under pp2 also holds that the store lives in torchrun's agent: a stopped rank 0 does not freeze it.
CASES = {
    "dp2": (["--dp", "2", "--global-batch", "4"], 1, "dp1", "rank 0 (dp0) waits in step"),
    "pp2": (["--pp", "2", "--microbatches", "4", "--global-batch", "8"], 0, "pp0", "rank 1 (pp1) waits in step"),
}


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the launcher's torchrun agent and its workers)."""
    found, stack = [], [pid]
    while stack:
        try:
            children = Path(f"/proc/{stack.pop()}/task").glob("*/children")
            kids = [int(kid) for file in children for kid in file.read_text().split()]
        except OSError:  # the process ended meanwhile
            continue
        found += kids
        stack += kids
    return found


def worker_of_rank(pids: list[int], rank: int) -> int | None:
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"TORCHELASTIC_RUN_ID" in b" ".join(environ):
            return pid
    return None


def start(flags: list[str], run_dir: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "plait", "train", "--model", "tiny", *flags, "--steps", "100000",
                             "--stall-timeout", str(STALL_TIMEOUT), "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def end_every_process(job: subprocess.Popen, seen: set[int]) -> None:
    """Leave nothing running: a stopped worker is woken to die."""
    below = seen | set(descendants(job.pid))  # before the launcher dies and its children are re-parented
    job.kill()
    for pid in below:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    job.communicate()


def error_lines(stderr: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.startswith("plait: error:")]
    assert lines, stderr[-3000:]
    return lines


def logged_steps(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    return metrics.read_text().count("\n") if metrics.exists() else 0


@pytest.mark.parametrize("case", tuple(CASES))
def test_a_stopped_rank_is_named_and_the_job_ends(tmp_path, case):
    flags, stopped_rank, label, peer_wait = CASES[case]
    run_dir = tmp_path / "run"
    job = start(flags, run_dir)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while logged_steps(run_dir) < 3:  # the steps are running: the watchdog is on
            assert job.poll() is None and time.monotonic() < deadline, "the run did not reach step 3"
            time.sleep(0.2)
        seen.update(descendants(job.pid))
        worker = worker_of_rank(sorted(seen), stopped_rank)
        assert worker is not None, f"no worker process of rank {stopped_rank} below {job.pid}"
        os.kill(worker, signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, stderr = job.communicate(timeout=STALL_TIMEOUT + 60)
        took = time.monotonic() - stopped_at
        assert job.returncode != 0
        assert took <= STALL_TIMEOUT + 10, f"the job took {took:.1f} s to end after the stop"
        for line in error_lines(stderr):
            assert line.startswith(f"plait: error: rank {stopped_rank} ({label}) made no progress for "), line
            assert "its process does not run" in line and peer_wait in line, line
        assert stderr.splitlines()[-1] == error_lines(stderr)[0]  # the last line; torchrun's report is in the run folder
        assert not Path(f"/proc/{worker}").exists() or Path(f"/proc/{worker}/stat").read_text().split()[2] == "Z"
    finally:
        end_every_process(job, seen)


def test_a_rank_hung_alive_is_named_with_what_its_peer_waits_in(tmp_path):
    """tests/stall_fault hangs rank 1 in its fifth optimizer step; its heartbeat goes on, so the
    watchdog names it as the rank furthest behind, not by a stopped process."""
    paths = [str(ROOT / "tests" / "stall_fault"), str(ROOT / "src"), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    job = start(["--dp", "2", "--global-batch", "4"], tmp_path / "run", env)
    seen: set[int] = set()
    try:
        _, stderr = job.communicate(timeout=240)
        assert job.returncode != 0
        for line in error_lines(stderr):
            assert line.startswith("plait: error: rank 1 (dp1) made no progress for "), line
            assert " s in step 4 optimizer; rank 0 (dp0) waits in step 4 loss all-reduce (dp);" in line, line
        assert logged_steps(tmp_path / "run") == 4
    finally:
        end_every_process(job, seen)


@pytest.mark.parametrize("value", [-1, 0.5, float("nan"), float("inf"), True, "3"])
def test_a_bad_stall_timeout_is_one_sentence(value):
    with pytest.raises(ConfigError, match=r"^stall-timeout must be 0 \(no watchdog\) or a number of seconds"):
        TrainSpec(stall_timeout=value).validate()
