"""What a rank is doing now: its step, phase and operation, for the stall watchdog to read.

The training thread writes it, the watchdog thread (plait.train.watchdog) reads it. Each write
replaces one tuple, which Python does atomically, so the reader sees a whole record without a lock;
a write costs a tuple and an attribute store, cheap enough for every pipeline action.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

Spans = Callable[..., contextlib.AbstractContextManager]
# The phases of a step in the order every rank runs them (the compute spans' names among them): of
# stalled ranks in one step, the one in the earliest phase is the one the others wait for.
STEP_PHASES = ("data", "forward", "backward", "forward and backward", "gradient sync", "optimizer",
               "loss all-reduce (dp)", "eval", "checkpoint", "final checkpoint", "gathering timelines and traces",
               "summary")


class Progress:
    """This rank's last record: (how many records so far, step, phase, operation, the global rank
    the operation waits for or None, when it began in wall-clock time)."""

    def __init__(self) -> None:
        self.record: tuple[int, int | None, str, str, int | None, float] = (0, None, "start-up", "", None, time.time())

    def step(self, step: int, phase: str) -> None:
        """A new step begins with ``phase``."""
        self.record = (self.record[0] + 1, step, phase, "", None, time.time())

    def phase(self, phase: str) -> None:
        count, step = self.record[:2]
        self.record = (count + 1, step, phase, "", None, time.time())

    def operation(self, operation: str, waits_for: int | None = None) -> None:
        """Within the phase: the operation, e.g. a pipeline receive and the rank it waits for."""
        count, step, phase = self.record[:3]
        self.record = (count + 1, step, phase, operation, waits_for, time.time())

    def marking(self, span: Spans) -> Spans:
        """``span`` (the tracer's compute spans) that also records each span's name as the phase."""

        def marked(name: str, **args) -> contextlib.AbstractContextManager:
            self.phase(name)
            return span(name, **args)

        return marked


def describe(step: int | None, phase: str, operation: str) -> str:
    """A record in words: 'step 3 backward', 'step 3 forward and backward, pp recv activation from rank 1'."""
    where = phase if step is None else f"step {step} {phase}"
    return f"{where}, {operation}" if operation else where
