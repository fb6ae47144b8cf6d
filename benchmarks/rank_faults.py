"""Killing one rank of a real ``plait train`` run, and what the run left: shared by the kill-restart
benchmark and its one-run test.

A local launch is a process tree: the plait launcher, torchrun's elastic agent under it, and one
worker per rank under the agent. ``train_killing_a_rank`` starts that tree and, once the run has
logged a given number of steps (plus an optional extra wait), sends SIGKILL to one worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from plait.observe.run_files import METRICS_FILE


@dataclass(frozen=True)
class FaultedRun:
    returncode: int
    wall_s: float
    output: str
    killed_rank: int | None  # the local rank killed; None if the run ended before the moment came


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # the process has ended
        return []


def local_rank_of(pid: int) -> int | None:
    """The LOCAL_RANK torchrun gave a worker, from its environment (None: not readable, or not a worker)."""
    try:
        variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [v.split(b"=", 1)[1] for v in variables if v.startswith(b"LOCAL_RANK=")]
    return int(found[0]) if found else None


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def train_killing_a_rank(run_dir: Path, argv: list[str], after_steps: int | None, rank: int = 0,
                         extra_wait_s: float = 0.0, timeout_s: float = 600) -> FaultedRun:
    """Run ``plait train argv --run-dir run_dir``; once ``after_steps`` steps are logged and
    ``extra_wait_s`` more has passed, SIGKILL the worker of local rank ``rank`` (None: kill nothing)."""
    started = time.perf_counter()
    launcher = subprocess.Popen([sys.executable, "-m", "plait", "train", *argv, "--run-dir", str(run_dir)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = None
    try:
        due = None
        while after_steps is not None and killed is None and launcher.poll() is None:
            if due is None and len(logged_steps(run_dir)) >= after_steps:
                due = time.perf_counter() + extra_wait_s
            workers = [w for agent in children(launcher.pid) for w in children(agent) if local_rank_of(w) == rank]
            if due is not None and time.perf_counter() >= due and workers:
                os.kill(workers[0], signal.SIGKILL)
                killed = rank
            time.sleep(0.02)
        output = launcher.communicate(timeout=timeout_s)[0]
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return FaultedRun(launcher.returncode, time.perf_counter() - started, output, killed)


def final_state(run_dir: Path) -> tuple[float, str]:
    """The run's last logged loss and a SHA-256 of its newest checkpoint's full model, tensor by tensor."""
    from plait.train.full_model import load_run_model  # torch: only once a run has finished

    model, _ = load_run_model(run_dir)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    rows = (run_dir / METRICS_FILE).read_text().splitlines()
    return json.loads(rows[-1])["loss"], digest.hexdigest()
