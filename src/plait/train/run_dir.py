"""The run directory a run writes: refused before any worker starts when it would overwrite a started
run, when it cannot be written, when it holds a symbolic link, or (with --resume) when its newest whole
checkpoint belongs to another run or has taken the steps asked for, or none is intact. A dry run makes the
same checks without changing anything."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from plait.config import RunConfig
from plait.errors import ConfigError
from plait.observe.run_files import METRICS_FILE, read_metrics
from plait.train.checkpoint import checkpoint_root, checkpoint_step
from plait.train.checkpoint_record import resumable_checkpoint
from plait.train.start import default_run_dir


class RunDirLock:
    """An exclusive lock on a run directory for the run's life (flock on the directory itself: nothing
    is written). The launcher holds it until ``release`` and hands it to torchrun (``fd``), so that it
    lasts until every rank has stopped; the kernel releases it when the last holder ends, however it
    ends. A second run into a held directory is refused before it reads or writes anything there.
    Where the file system cannot lock (some network mounts), nothing is held."""

    def __init__(self, run_dir: Path, hold: bool):
        self.fd: int | None = None
        try:
            fd = os.open(run_dir, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"--run-dir {run_dir} is in use by another plait train; wait for it to end or choose "
                              "another --run-dir") from None
        except OSError:
            os.close(fd)
            return
        if hold:
            self.fd = fd
        else:
            os.close(fd)  # (a dry run only asks)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def refuse_links(run_dir: Path) -> None:
    """A run directory is plait's alone: it writes, moves and deletes there, and a symbolic link in it (or in
    its checkpoints folder) would take that to the folder the link points to, so one is refused, named."""
    root = checkpoint_root(run_dir)
    entries = [*(run_dir.iterdir() if run_dir.is_dir() else ()),
               *(root.iterdir() if root.is_dir() and not root.is_symlink() else ())]
    link = next((entry for entry in sorted(entries) if entry.is_symlink()), None)
    if link is not None:
        raise ConfigError(f"{link} is a symbolic link, and plait writes into a run directory only what it made itself; "
                          "replace the link with a copy of its target, remove it, or choose another --run-dir")


def prepare_run_dir(config: RunConfig, create: bool = True) -> tuple[Path, Path | None, RunDirLock | None]:
    """Resolve and create the run directory, refusing to overwrite a started run; with --resume, also
    the checkpoint to continue (checked whole and this run's), or None: a run directory with no checkpoint
    (killed before its first, or new) starts from step 0, so no run is ever stuck; one whose every checkpoint
    is damaged only with --restart-from-scratch.
    Without ``create`` (a dry run) the same checks change nothing: no directory is made and a damaged
    checkpoint is named, not set aside. The lock it returns must live as long as the run."""
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
    lock = RunDirLock(run_dir, hold=create) if run_dir.is_dir() else None
    try:
        return run_dir, _checked_run_dir(config, run_dir, create), lock
    except ConfigError:  # (a refusal in this process, as in tests, leaves the directory free)
        if lock is not None:
            lock.release()
        raise


def _checked_run_dir(config: RunConfig, run_dir: Path, create: bool) -> Path | None:
    """The checks of ``prepare_run_dir`` made under the run directory's lock; the checkpoint to resume."""
    train_spec = config.train
    if checkpoint_root(run_dir).exists() and not checkpoint_root(run_dir).is_dir():
        raise ConfigError(f"{checkpoint_root(run_dir)} is a file where the run keeps its checkpoints; move it away or "
                          "choose another --run-dir")
    refuse_links(run_dir)
    checkpoint = None
    if train_spec.resume:
        read_metrics(run_dir)  # the lines the resumed run keeps, readable
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
    return checkpoint
