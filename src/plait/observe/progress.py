"""What a rank is doing now: its step, phase and operation, for the stall watchdog to read.

The training thread writes it, the watchdog thread (plait.train.watchdog) reads it. Each write
replaces one tuple, which Python does atomically, so the reader sees a whole record without a lock;
a write costs a tuple and an attribute store, cheap enough for every pipeline action.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

Spans = Callable[..., contextlib.AbstractContextManager]


class Progress:
    """This rank's last record: (how many records so far, step, phase, operation)."""

    def __init__(self) -> None:
        self.record: tuple[int, int | None, str, str] = (0, None, "start-up", "")

    def step(self, step: int, phase: str) -> None:
        """A new step begins with ``phase``."""
        self.record = (self.record[0] + 1, step, phase, "")

    def phase(self, phase: str) -> None:
        count, step, _, _ = self.record
        self.record = (count + 1, step, phase, "")

    def operation(self, operation: str) -> None:
        """Within the phase: the operation, e.g. a pipeline transfer naming its peer."""
        count, step, phase, _ = self.record
        self.record = (count + 1, step, phase, operation)

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
