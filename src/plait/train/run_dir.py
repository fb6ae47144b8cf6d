"""The run directory a run writes: refused before any worker starts when it would overwrite a started
run, when it cannot be written, or (with --resume) when its newest whole checkpoint belongs to another
run or has taken the steps asked for. A dry run makes the same checks without changing anything."""

from __future__ import annotations

import os
from pathlib import Path

from plait.config import RunConfig
from plait.errors import ConfigError
from plait.observe.run_files import METRICS_FILE
from plait.train.checkpoint import checkpoint_step
from plait.train.checkpoint_record import resumable_checkpoint
from plait.train.start import default_run_dir


def prepare_run_dir(config: RunConfig, create: bool = True) -> tuple[Path, Path | None]:
    """Resolve and create the run directory, refusing to overwrite a started run; with --resume, also
    the checkpoint to continue (checked whole and this run's), or None: a run directory with no whole
    checkpoint (killed before its first, or new) starts from step 0, so no directory is ever locked.
    Without ``create`` (a dry run) the same checks change nothing: no directory is made and a damaged
    checkpoint is named, not set aside."""
    train_spec = config.train
    if train_spec.run_dir is None:
        if train_spec.resume:
            raise ConfigError("--resume needs --run-dir naming the run to continue")
        run_dir = Path(default_run_dir())
    else:
        run_dir = Path(train_spec.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} is a file, not a directory; choose another --run-dir")
    if create:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"--run-dir {run_dir} cannot be created ({error.strerror}); choose a --run-dir you can "
                              "write to") from None
    if run_dir.is_dir() and not os.access(run_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--run-dir {run_dir} is not writable; make it writable or choose another --run-dir")
    checkpoint = None
    if train_spec.resume:
        # whole, this run's, read without running anything
        checkpoint = resumable_checkpoint(run_dir, config, set_aside=create) if run_dir.is_dir() else None
        if checkpoint is None:
            print(f"plait: {run_dir} holds no complete checkpoint; the run starts from step 0", flush=True)
        elif checkpoint_step(checkpoint) >= train_spec.steps:
            raise ConfigError(f"{checkpoint} has already taken {checkpoint_step(checkpoint)} steps; pass a larger "
                              f"--steps than {train_spec.steps} to train the run further")
        else:
            print(f"plait: {'resuming' if create else 'the run would resume'} from {checkpoint.name}", flush=True)
    elif (run_dir / METRICS_FILE).exists():
        raise ConfigError(
            f"{run_dir} already holds a run; pass --resume to continue it (from its newest complete checkpoint, "
            "or from step 0 if it has none) or choose another --run-dir"
        )
    return run_dir, checkpoint
