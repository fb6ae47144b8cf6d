"""``--wandb PROJECT``: the run's scalars in a Weights & Biases run, beside or instead of TensorBoard.

The same scalars under the same names as ``--tensorboard`` (``STEP_TAGS`` per step, ``SUMMARY_TAGS``
at the last step), with the resolved configuration as the run's config, by the logging rank only.
Offline unless told otherwise: the mode is ``WANDB_MODE`` when set, else ``offline``, so a run never
needs the network; its files go to ``RUN/wandb/``, and ``wandb sync RUN/wandb/offline-run-*``
uploads them later (``WANDB_MODE=online`` logs live). The ``wandb`` package is optional; the run is
refused before it starts without it (``TrainSpec.validate``).
"""

from __future__ import annotations

import os
from pathlib import Path

from plait.observe.tensorboard import STEP_TAGS, SUMMARY_TAGS


class WandbLog:
    def __init__(self, run_dir: Path, project: str, config: dict):
        import wandb

        self.run = wandb.init(project=project, name=Path(run_dir).resolve().name, dir=str(run_dir), config=config,
                              mode=os.environ.get("WANDB_MODE", "offline"))

    def add_step(self, row: dict) -> None:
        """One metrics.jsonl row, at its step."""
        self.run.log({tag: row[key] for key, tag in STEP_TAGS.items() if row.get(key) is not None}, step=row["step"])

    def close(self, summary: dict | None, last_step: int) -> None:
        """Add the run's summary figures that exist, then finish the run."""
        figures = {tag: summary[key] for key, tag in SUMMARY_TAGS.items() if summary and summary.get(key) is not None}
        if figures:
            self.run.log(figures, step=last_step)
        self.run.finish()
