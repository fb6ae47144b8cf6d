"""``--tensorboard``: the run's scalars as TensorBoard event files in ``RUN/tensorboard/``.

Per step, what metrics.jsonl holds (training and held-out loss, learning rate, gradient norm,
step time, tokens/s); at the last step, the summary's figures that exist on this device (MFU, peak
memory, pipeline bubble, communication fraction: each left out while it is null). Written through
PyTorch's ``SummaryWriter`` (the ``tensorboard`` package), by the logging rank only.

A resumed run's steps are each shown once: the run starts its writer with ``purge_step`` at its
first step, so TensorBoard hides what the stopped run wrote from that step on (the steps after its
last checkpoint, which the resumed run takes again), as metrics.jsonl drops them (``MetricsLog``).
"""

from __future__ import annotations

from pathlib import Path

TENSORBOARD_DIR = "tensorboard"
# metrics.jsonl's key → the scalar's tag
STEP_TAGS = {"loss": "loss/train", "eval_loss": "loss/eval", "lr": "lr", "grad_norm": "grad_norm",
             "step_time_s": "step_time_s", "tokens_per_s": "tokens_per_s"}
SUMMARY_TAGS = {"mfu": "summary/mfu", "peak_memory_bytes": "summary/peak_memory_bytes",
                "bubble_fraction": "summary/bubble_fraction", "comm_fraction": "summary/comm_fraction"}


class TensorBoardLog:
    def __init__(self, run_dir: Path, first_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / TENSORBOARD_DIR), purge_step=first_step)

    def add_step(self, row: dict) -> None:
        """One metrics.jsonl row, flushed at once so a run that stops on an error keeps its steps."""
        for key, tag in STEP_TAGS.items():
            if row.get(key) is not None:
                self.writer.add_scalar(tag, row[key], row["step"])
        self.writer.flush()

    def close(self, summary: dict | None, last_step: int) -> None:
        """Add the run's summary figures that exist at ``last_step``, then flush and close."""
        for key, tag in SUMMARY_TAGS.items():
            if summary is not None and summary.get(key) is not None:
                self.writer.add_scalar(tag, summary[key], last_step)
        self.writer.close()
