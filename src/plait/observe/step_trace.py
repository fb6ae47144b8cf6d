"""The span tracer the training loop runs on every rank: every ``--trace-every`` K-th step (and the
first after the warm-up step) it records compute spans (forward, backward, gradient sync, optimizer;
the pipeline's actions), every collective and point-to-point transfer, and the waits; over the
steps of ``--profile-steps A:B`` it also runs torch.profiler, for kernel-level digging.

A traced step is one plain dict (times in seconds from the step's start) so that rank 0 can gather
them all and the pure ``plait.observe.time_split`` and ``plait.observe.rank_trace`` read them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from plait.observe.collective_trace import CollectiveTracer
from plait.schedules.simulate import Span
from plait.topology import Topology

def rank_name(topology: Topology) -> str:
    """This rank's coordinates on the layout's dimensions that are split, e.g. ``dp1·tp0·pp1``."""
    return topology.layout.rank_name(topology.rank)


class StepTracer:
    """Records the traced steps of one rank: ``with tracer.step(k): ...``, ``with tracer.span(name)``."""

    def __init__(self, topology: Topology, every: int, first_step: int, end_step: int,
                 profiled: range = range(0), profile_dir: Path | None = None):
        self.every, self.first_step, self.end_step = every, first_step, end_step
        self.profiled, self.profile_dir = profiled, profile_dir
        self.group_names = topology.group_names()
        self.name = rank_name(topology)
        self.coordinates = {dim: topology.coordinate(dim) for dim in ("dp", "cp", "tp", "pp")}
        self.records: list[dict] = []
        self._spans: list[dict] | None = None

    def traces(self, step: int) -> bool:
        """The first step after warm-up and every ``every``-th after it (a one-step run: that step)."""
        after = step - self.first_step
        return (after >= 1 and (after - 1) % self.every == 0) or self.end_step - self.first_step == 1

    def observes(self, step: int) -> bool:
        """Whether the step runs traced or under torch.profiler, and so slower than a plain step: the
        tracer's dispatch mode calls into Python on every operator."""
        return self.traces(step) or (step in self.profiled and self.profile_dir is not None)

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        with self._profiled(step), self._traced(step):
            yield

    @contextlib.contextmanager
    def _profiled(self, step: int) -> Iterator[None]:
        """torch.profiler over a step of ``profiled`` (kernels and operators), one file per rank and step."""
        if step not in self.profiled or self.profile_dir is None:
            yield
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as profiler:
            yield
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(self.profile_dir / f"rank{dist.get_rank()}_step{step}.json"))

    @contextlib.contextmanager
    def _traced(self, step: int) -> Iterator[None]:
        if not self.traces(step):
            yield
            return
        self._spans = []
        tracer = CollectiveTracer(self.group_names)
        started = time.perf_counter()
        try:
            with tracer:
                yield
        finally:
            ended = time.perf_counter()
            self.records.append(_step_record(step, started, ended, self._spans, tracer))
            self._spans = None

    @contextlib.contextmanager
    def span(self, name: str, **args) -> Iterator[None]:
        """A compute span of the step being traced (nothing when the step is not traced)."""
        if self._spans is None:
            yield
            return
        started = time.perf_counter()
        yield
        self._spans.append({"name": name, "start": started, "end": time.perf_counter(), "args": args})

    def add_spans(self, spans: list[dict]) -> None:
        """Spans measured elsewhere (the pipeline executor's actions), in ``time.perf_counter`` seconds."""
        if self._spans is not None:
            self._spans.extend(spans)

    def add_actions(self, spans: list[Span]) -> None:
        """The pipeline executor's action spans (``time.perf_counter`` seconds); transfers are not compute."""
        self.add_spans([{"name": str(s.action), "start": s.start, "end": s.end,
                         "args": {"kind": s.action.kind.value, "chunk": s.action.chunk,
                                  "microbatch": s.action.microbatch, "peer": s.action.peer,
                                  "compute": s.action.kind.is_compute}} for s in spans])

    def gather(self) -> list[dict] | None:
        """Collective: every rank's traced steps, on rank 0 (None elsewhere)."""
        mine = {"rank": dist.get_rank(), "name": self.name, "coordinates": self.coordinates, "steps": self.records}
        gathered: list[dict | None] = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        return gathered


def _step_record(step: int, started: float, ended: float, spans: list[dict], tracer: CollectiveTracer) -> dict:
    """One traced step, every time relative to its start."""
    exposed = [0.0] * len(tracer.transfers)
    for wait in tracer.waits:
        exposed[wait.transfer] += wait.end - wait.start
    return {
        "step": step,
        "duration": ended - started,
        "spans": [{**s, "start": s["start"] - started, "end": s["end"] - started} for s in spans],
        "transfers": [
            {"op": t.op, "group": t.group, "bytes": t.bytes, "issued": t.issued - started, "peer": t.peer,
             "completed": None if t.completed is None else min(t.completed, ended) - started, "exposed": exposed[i]}
            for i, t in enumerate(tracer.transfers)
        ],
        "waits": [[w.start - started, min(w.end, ended) - started, w.transfer] for w in tracer.waits],
    }
