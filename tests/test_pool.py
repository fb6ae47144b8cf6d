"""The test pool itself: a worker that dies before answering is noticed within seconds, the case
runs once more in fresh workers with a warning, and a second death fails it with the worker's exit
code."""

from __future__ import annotations

import os
import time

import pytest

from tests.pool import CASE_TIMEOUT_S, WorkerDied, WorkerPool


def _die_the_first_time(marker: str) -> int:
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(134)  # as glibc's abort on a corrupted heap ends the process
    return os.getpid()


def _always_die() -> None:
    os._exit(134)


def test_a_worker_that_dies_is_replaced_and_its_case_run_again(tmp_path):
    pool = WorkerPool(1)
    try:
        started = time.monotonic()
        with pytest.warns(UserWarning, match=r"rank 0 died \(exit code 134\) running _die_the_first_time"):
            (pid,) = pool.run(_die_the_first_time, 1, str(tmp_path / "died"))
        assert pid == pool.processes[0].pid
        with pytest.raises(WorkerDied, match="exit code 134"), pytest.warns(UserWarning):
            pool.run(_always_die, 1)
        assert time.monotonic() - started < CASE_TIMEOUT_S / 2
    finally:
        pool.close()
