"""The stall watchdog: every rank publishes a heartbeat and its last operation to the rendezvous
store, reads every other rank's, and when one has made no progress for ``--stall-timeout`` seconds
names it and what its peers wait in, then ends this process.

Without it a stalled rank shows only after the 10-minute collective timeout, as a gloo or NCCL
timeout that names no rank, and torchrun blames whichever rank raised first. The store is the
rendezvous's TCPStore: under torchrun its server lives in the agent process, not in a worker, so a
frozen rank 0 does not freeze it. A rank whose heartbeat stops too (stopped, or hung holding the
interpreter) runs no code that could end it; a peer on the same host ends it with SIGKILL, since
the agent would otherwise wait 30 s on it before its own SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from plait.progress import STEP_PHASES, Progress, describe
from plait.topology import Topology


@dataclass
class Seen:
    """One rank as this watchdog saw it: its last record, and when its heartbeat and its progress
    last changed (this process's monotonic clock)."""

    record: dict | None
    beat_at: float
    progress_at: float


class Watchdog:
    """A daemon thread that publishes ``progress`` every ``interval`` seconds and judges all ranks."""

    def __init__(self, progress: Progress, timeout: float, store: dist.Store, rank: int, world: int, label: str):
        self.progress, self.timeout, self.store = progress, timeout, store
        self.rank, self.world, self.label = rank, world, label
        self.interval = min(1.0, timeout / 4)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="plait-stall-watchdog", daemon=True)
        self.beat = 0
        self.present: list[int] = []  # the ranks whose record is in the store

    def start(self) -> None:
        self._publish()  # at once: a rank stopped before the thread's first beat is still seen, as frozen
        self.thread.start()

    def stop(self) -> None:
        """Stop watching; the peers then never judge this rank, which left the steps on purpose."""
        self.stopped.set()
        self.thread.join()
        with contextlib.suppress(Exception):  # the job may be ending already; nothing left to tell
            self._publish(done=True)

    def _publish(self, done: bool = False) -> None:
        self.beat += 1
        count, step, phase, operation, waits_for, when = self.progress.record
        self.store.set(f"rank{self.rank}", json.dumps({
            "beat": self.beat, "count": count, "step": step, "phase": phase, "operation": operation,
            "waits_for": waits_for, "when": when,
            "label": self.label, "host": self.host, "pid": self.pid, "done": done}))

    def _read(self) -> dict[int, dict]:
        """Every rank's record that is in the store (once all are, one request reads them all)."""
        if len(self.present) < self.world:
            self.present = [rank for rank in range(self.world) if self.store.check([f"rank{rank}"])]
        present = self.present
        values = self.store.multi_get([f"rank{rank}" for rank in present]) if present else []
        return {rank: json.loads(value) for rank, value in zip(present, values)}

    def _watch(self) -> None:
        started = time.monotonic()
        seen = {rank: Seen(None, started, started) for rank in range(self.world)}
        store_failed_at = None
        while not self.stopped.wait(self.interval):
            try:
                self._publish()
                records = self._read()
                store_failed_at = None
            except Exception as error:  # the store's client raises its own and the socket's errors
                now = time.monotonic()
                store_failed_at = store_failed_at or now
                if now - store_failed_at > self.timeout:
                    self._end(f"the rendezvous store does not answer ({error}) for {now - store_failed_at:.0f} s; "
                              "its host (the torchrun agent, or rank 0) has stopped")
                continue
            now = time.monotonic()
            for rank, record in records.items():
                last = seen[rank].record
                if last is None or record["beat"] != last["beat"]:
                    seen[rank].beat_at = now
                if last is None or record["count"] != last["count"]:
                    seen[rank].progress_at = now
                seen[rank].record = record
            verdict = self._verdict(seen, now)
            if verdict is not None:
                self._end(*verdict)

    def _verdict(self, seen: dict[int, Seen], now: float) -> tuple[str, list[dict]] | None:
        """The error line and the frozen ranks to end, once a rank in the steps has waited too long."""
        judged = {rank: s for rank, s in seen.items() if s.record is None or not s.record["done"]}
        waiting = [rank for rank, s in judged.items()
                   if s.record is not None and s.record["count"] > 0 and now - s.progress_at > self.timeout]
        if not waiting or len(judged) < 2:  # the last rank in the steps (rank 0 writing the run files) blocks no one
            return None
        silent = [rank for rank, s in judged.items() if s.record is None]
        if silent:  # never published: its process stalled before it reached the steps
            frozen, culprits = [], silent
        else:
            frozen = [rank for rank, s in judged.items() if now - s.beat_at > self.timeout / 2]
            culprits = frozen or [self._furthest_behind(judged)]
        blamed = "; ".join(self._blame(rank, seen[rank], now, rank in frozen) for rank in culprits)
        waits: dict[str, list[int]] = {}
        for rank, s in judged.items():
            if rank not in culprits and s.record is not None:
                waits.setdefault(describe(s.record["step"], s.record["phase"], s.record["operation"]), []).append(rank)
        others = "; ".join(f"{self._ranks(ranks, seen)} wait{'s' if len(ranks) == 1 else ''} in {where}"
                           for where, ranks in waits.items())
        line = blamed + (f"; {others}" if others else "")
        return line, [seen[rank].record for rank in frozen]

    @staticmethod
    def _furthest_behind(judged: dict[int, Seen]) -> int:
        """The live rank the others wait for: the earliest in the program (step, then phase, then the
        oldest record), followed along the ranks a pipeline receive waits for."""

        def position(rank: int) -> tuple:
            record = judged[rank].record
            phase = STEP_PHASES.index(record["phase"]) if record["phase"] in STEP_PHASES else len(STEP_PHASES)
            return record["step"] if record["step"] is not None else -1, phase, record["when"]

        rank, visited = min(judged, key=position), set()
        while (peer := judged[rank].record["waits_for"]) in judged and peer not in visited:
            visited.add(rank)
            rank = peer
        return rank

    def _blame(self, rank: int, s: Seen, now: float, frozen: bool) -> str:
        if s.record is None:
            return f"rank {rank} sent no heartbeat for {now - s.progress_at:.0f} s: it has not reached the steps"
        where, label = describe(s.record["step"], s.record["phase"], s.record["operation"]), s.record["label"]
        if frozen:  # its last record is up to one interval older than the moment it stopped
            return (f"rank {rank} ({label}) made no progress for {now - s.progress_at:.0f} s and its process does not "
                    f"run (stopped, or hung holding the interpreter); it was last seen in {where}")
        return f"rank {rank} ({label}) made no progress for {max(0.0, time.time() - s.record['when']):.0f} s in {where}"

    @staticmethod
    def _ranks(ranks: list[int], seen: dict[int, Seen]) -> str:
        named = ", ".join(f"{rank} ({seen[rank].record['label']})" for rank in ranks)
        return f"rank {named}" if len(ranks) == 1 else f"ranks {named}"

    def _end(self, line: str, frozen: list[dict] | None = None) -> None:
        """Report and end this process: the collective it is stuck in never returns."""
        print(f"plait: error: {line}; raise --stall-timeout (now {self.timeout:g} s) if this phase is "
              "slow rather than stuck", file=sys.stderr, flush=True)
        for record in frozen or []:
            if record["host"] == self.host:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(record["pid"], signal.SIGKILL)
        sys.stdout.flush()
        os._exit(1)


@contextlib.contextmanager
def stall_watchdog(timeout: float, progress: Progress, topology: Topology) -> Iterator[None]:
    """Watch every rank of this job while the block runs (``timeout`` 0, or one rank: nothing to watch).

    Connects its own client to the rendezvous store (MASTER_ADDR/MASTER_PORT, as torchrun sets
    them), so that its requests never queue behind the process group's."""
    world = dist.get_world_size()
    if timeout == 0 or world == 1:
        yield
        return
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                           timeout=timedelta(seconds=max(timeout, 1.0)), wait_for_workers=False)
    # One namespace per torchrun attempt: an elastic restart must not read the last attempt's records.
    store = dist.PrefixStore(f"plait/watchdog/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", client)
    watchdog = Watchdog(progress, timeout, store, dist.get_rank(), world, topology.layout.rank_name(dist.get_rank()))
    watchdog.start()
    try:
        yield
    finally:
        watchdog.stop()
