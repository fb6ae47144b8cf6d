"""A pool of rank processes started once per test session.

Starting a torch process costs seconds on a 2-core machine, so the session spawns ``size``
processes once; each case then forms a fresh gloo world of just the ranks it needs (a new TCP
rendezvous per case), runs a module-level function on every rank, and tears the world down.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta

CASE_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(rank: int, tasks: mp.Queue, results: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    while (task := tasks.get()) is not None:
        function, args, world_size, port = task
        try:
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                timeout=timedelta(seconds=CASE_TIMEOUT_S // 2),
            )
            results.put((rank, True, function(*args)))
        except BaseException:  # noqa: BLE001 - report every failure to the test, then keep serving
            results.put((rank, False, traceback.format_exc()))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            _forget_meshes()


def _forget_meshes() -> None:
    """Clear DTensor's sharding caches, which hold the meshes (and so the process-group names) of
    the world just torn down: a later world whose meshes compare equal would get them back, and
    its groups are numbered differently once it makes more of them (hybrid sharding does)."""
    import torch
    from torch.distributed.tensor import DTensor

    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch fast path's
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    type(propagator)._propagate_tensor_meta_cached.cache_clear()


class WorkerPool:
    """``run(fn, world_size, *args)`` calls ``fn(*args)`` on ranks 0..world_size-1 of a new world."""

    def __init__(self, size: int):
        context = mp.get_context("spawn")
        self.size = size
        self.results = context.Queue()
        self.tasks = [context.Queue() for _ in range(size)]
        self.processes = [
            context.Process(target=_serve, args=(rank, self.tasks[rank], self.results), daemon=True)
            for rank in range(size)
        ]
        for process in self.processes:
            process.start()

    def run(self, function: Callable, world_size: int, *args) -> list:
        """Per-rank return values, in rank order; raises with the rank's traceback if any failed."""
        if world_size > self.size:
            raise ValueError(f"the pool has {self.size} ranks, the case needs {world_size}")
        port = _free_port()
        for rank in range(world_size):
            self.tasks[rank].put((function, args, world_size, port))
        values: dict[int, object] = {}
        failures = []
        for _ in range(world_size):
            try:
                rank, ok, value = self.results.get(timeout=CASE_TIMEOUT_S)
            except queue.Empty:
                missing = sorted(set(range(world_size)) - set(values))
                raise TimeoutError(f"ranks {missing} gave no answer to {function.__name__} in {CASE_TIMEOUT_S}s")
            if ok:
                values[rank] = value
            else:
                failures.append(f"rank {rank}:\n{value}")
        if failures:
            raise RuntimeError(f"{function.__name__} failed on {len(failures)} rank(s)\n" + "\n".join(failures))
        return [values[rank] for rank in range(world_size)]

    def close(self) -> None:
        for tasks in self.tasks:
            tasks.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
