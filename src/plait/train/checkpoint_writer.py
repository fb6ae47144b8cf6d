"""Writing a run's checkpoints: in the step's time, or in the background (``--async-checkpoint``).

In the background, torch.distributed.checkpoint's ``async_save`` copies the state to host memory
and returns; a thread writes the files while training goes on. The checkpoint becomes complete
(CRCs recorded, ``.partial`` renamed) only once every rank's files are written, which the writer
waits for at the next checkpoint or at the end of the run, so a crash meanwhile leaves the
previous complete checkpoint the newest.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from plait.train.checkpoint import begin_checkpoint, checkpoint_state, complete_checkpoint, not_written


class CheckpointWriter:
    """Saves this run's checkpoints; collective over every rank."""

    def __init__(self, run_dir: Path, identity: dict, keep: int, background: bool):
        self.run_dir, self.identity, self.keep = run_dir, identity, keep
        # The writing thread's own collectives (DCP's plan exchange) go over a group of their own, on
        # CPU, so they never interleave with the training step's on the default group.
        self.group = dist.new_group(backend="gloo") if background else None
        self.pending: tuple[int, Path, Future] | None = None

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Save the state after ``step`` optimizer steps (in the background: start saving it)."""
        self.finish()
        partial = begin_checkpoint(self.run_dir, step)
        state = checkpoint_state(model, optimizer)
        if self.group is None:
            try:
                dcp.save(state, checkpoint_id=str(partial))
            except CheckpointException as error:
                raise not_written(step, partial, error) from None
            complete_checkpoint(self.run_dir, step, partial, self.identity, self.keep)
        else:
            self.pending = step, partial, dcp.async_save(state, checkpoint_id=str(partial), process_group=self.group)

    def finish(self) -> None:
        """Wait for a checkpoint still being written and make it complete."""
        if self.pending is None:
            return
        step, partial, written = self.pending
        self.pending = None
        try:
            written.result()
        except CheckpointException as error:
            raise not_written(step, partial, error) from None
        complete_checkpoint(self.run_dir, step, partial, self.identity, self.keep)
