"""A pool of rank processes started once per test session.

Starting a torch process costs seconds on a 2-core machine, so the session spawns ``size``
processes once; each case then forms a fresh gloo world of just the ranks it needs (a new TCP
rendezvous per case), runs a module-level function on every rank, and tears the world down.

A worker that dies before answering (a long-lived torch process has been seen to abort once in
some thousand worlds on glibc's "malloc(): unaligned tcache chunk detected") is noticed within
seconds; the pool restarts every worker and runs the case once more in fresh processes, with a
warning in the session's summary, and a second death fails the case with the worker's exit code. A
case that writes files meets what its first try left.

A torn-down world does not give back all its gloo threads and sockets (DTensor's caches keep
device meshes, and so their process groups, alive), so a worker that holds more than
``RETIRE_AT_OPEN_FILES`` open files retires after its case and the pool starts a fresh one; a
case that times out replaces every worker, so one hung world cannot starve the cases after it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta

CASE_TIMEOUT_S = 300
POLL_S = 2
RETIRE_AT_OPEN_FILES = 1000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


def _serve(rank: int, tasks: mp.Queue, results: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    retire = False
    while not retire and (task := tasks.get()) is not None:
        function, args, world_size, port = task
        try:
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                timeout=timedelta(seconds=CASE_TIMEOUT_S // 2),
            )
            outcome = (True, function(*args))
        except BaseException:  # noqa: BLE001 - report every failure to the test, then keep serving
            outcome = (False, traceback.format_exc())
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            _forget_meshes()
        retire = _open_files() > RETIRE_AT_OPEN_FILES
        results.put((rank, *outcome, retire))


def _forget_meshes() -> None:
    """Clear DTensor's caches, which hold the meshes (and so the process groups) of the world just
    torn down: a later world whose meshes compare equal would get them back, and
    its groups are numbered differently once it makes more of them (hybrid sharding does)."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._collective_utils import MeshTopoInfo
    from torch.distributed.tensor._redistribute import _gen_transform_infos, clear_redistribute_planner_cache

    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch fast path's
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    type(propagator)._propagate_tensor_meta_cached.cache_clear()
    clear_redistribute_planner_cache()  # these three hold the meshes themselves, and so their groups
    _gen_transform_infos.cache_clear()
    MeshTopoInfo.build_from_mesh.cache_clear()


class WorkerDied(RuntimeError):
    """A worker process ended before answering its case."""


class WorkerPool:
    """``run(fn, world_size, *args)`` calls ``fn(*args)`` on ranks 0..world_size-1 of a new world."""

    def __init__(self, size: int):
        self.context = mp.get_context("spawn")
        self.size = size
        self._start_all()

    def _start_all(self) -> None:
        self.results = self.context.Queue()
        self.tasks = [self.context.Queue() for _ in range(self.size)]
        self.processes = [self._start(rank) for rank in range(self.size)]

    def _start(self, rank: int):
        process = self.context.Process(target=_serve, args=(rank, self.tasks[rank], self.results), daemon=True)
        process.start()
        return process

    def run(self, function: Callable, world_size: int, *args) -> list:
        """Per-rank return values, in rank order; raises with the rank's traceback if any failed."""
        if world_size > self.size:
            raise ValueError(f"the pool has {self.size} ranks, the case needs {world_size}")
        if any(not process.is_alive() for process in self.processes):  # died since its last case
            self._replace_all()
        try:
            return self._run_once(function, world_size, args)
        except WorkerDied as died:
            warnings.warn(f"{died}; ran it again in fresh workers", stacklevel=2)
            return self._run_once(function, world_size, args)

    def _run_once(self, function: Callable, world_size: int, args: tuple) -> list:
        port = _free_port()
        for rank in range(world_size):
            self.tasks[rank].put((function, args, world_size, port))
        values: dict[int, object] = {}
        failures = []
        answered: set[int] = set()
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while len(answered) < world_size:
            try:
                rank, ok, value, retired = self.results.get(timeout=POLL_S)
            except queue.Empty:
                missing = sorted(set(range(world_size)) - answered)
                dead = [(r, self.processes[r].exitcode) for r in missing if not self.processes[r].is_alive()]
                if dead and self.results.empty():  # (an answer sent just before a retiring worker exits)
                    self._replace_all()
                    raise WorkerDied(
                        f"rank {dead[0][0]} died (exit code {dead[0][1]}) running {function.__name__}") from None
                if time.monotonic() > deadline:
                    self._replace_all()
                    raise TimeoutError(
                        f"ranks {missing} gave no answer to {function.__name__} in {CASE_TIMEOUT_S}s") from None
                continue
            answered.add(rank)
            if retired:
                self.processes[rank].join()
                self.processes[rank] = self._start(rank)
            if ok:
                values[rank] = value
            else:
                failures.append(f"rank {rank}:\n{value}")
        if failures:
            raise RuntimeError(f"{function.__name__} failed on {len(failures)} rank(s)\n" + "\n".join(failures))
        return [values[rank] for rank in range(world_size)]

    def _replace_all(self) -> None:
        for process in self.processes:
            process.kill()
            process.join()
        self._start_all()

    def close(self) -> None:
        for tasks in self.tasks:
            tasks.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
