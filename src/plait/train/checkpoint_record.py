"""What a checkpoint belongs to and whether it is whole: the ``run.json`` beside every checkpoint.

``save_checkpoint`` writes it once every rank's files are in place: the run's identity (model,
seed, data and its size, global batch, the share --eval-every holds out, layout, plait version),
the step and a CRC-32 of every file. Before any worker starts, ``--resume`` checks the newest checkpoint against it: a damaged
one (a file missing or changed) is set aside (renamed ``.damaged``; nothing is deleted) and the one
before it is used, saying so; with none left the run is refused unless ``--restart-from-scratch``
(then it starts again from step 0). A file the record names outside the checkpoint, a whole one whose
metadata is not metadata, or a checkpoint of another run (other model, seed, data or batch), is
refused in one line (the latter unless ``--resume-changed``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from plait.config import RunConfig
from plait.errors import ConfigError
from plait.train.checkpoint import (
    RUN_FILE, STEP_FILE, checkpoint_metadata, complete_checkpoints, crc32_of, inside, move_aside,
)
from plait.train.data import HELD_OUT_SHARE, held_out
from plait.version import plait_version

# What must match to continue a run; the layout may change (checkpoints load under any layout).
# held_out: --eval-every without --eval-data keeps the data's tail from training, so turning it on or off
# changes the steps.
SAME_RUN = ("model_spec", "seed", "data", "data_bytes", "global_batch", "held_out")


def run_identity(config: RunConfig) -> dict:
    """The facts that make a stream of steps one run."""
    data = config.train.data
    return {
        "model_spec": asdict(config.model), "seed": config.train.seed,
        "data": str(Path(data).resolve()) if data else None,
        "data_bytes": Path(data).stat().st_size if data else None,
        "global_batch": config.train.global_batch, "held_out": HELD_OUT_SHARE if held_out(config.train) else None,
        "layout": config.layout.to_dict(), "plait_version": plait_version(),
    }


def damage(folder: Path) -> str | None:
    """Evidence that a file of the checkpoint in ``folder`` is missing or changed (None: none found).

    A checkpoint written before plait recorded its checkpoints has no ``run.json`` to check against."""
    if not (Path(folder) / RUN_FILE).exists():
        return None
    try:
        record = json.loads((Path(folder) / RUN_FILE).read_text())
        step = json.loads((Path(folder) / STEP_FILE).read_text())["step"]
        expected = record["files"]
    except FileNotFoundError as error:
        return f"{Path(error.filename).name} is missing"
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        return f"its record is not readable ({type(error).__name__}: {error})"
    if not isinstance(expected, dict) or step != record.get("step"):
        return f"{STEP_FILE} and {RUN_FILE} disagree"
    for name, crc in expected.items():
        path = inside(folder, name, RUN_FILE)
        if not path.is_file():
            return f"{name} is missing"
        if crc32_of(path) != crc:
            return f"{name} does not match its checksum"
    return None


def changes(folder: Path, config: RunConfig) -> list[str]:
    """The identity fields in which ``config`` differs from the run that wrote ``folder``."""
    if not (Path(folder) / RUN_FILE).exists():
        return []
    record = json.loads((Path(folder) / RUN_FILE).read_text())
    now = run_identity(config)
    return [field for field in SAME_RUN if record.get(field) != now[field]]


def resumable_checkpoint(run_dir: Path, config: RunConfig, set_aside: bool = True) -> Path | None:
    """The newest whole checkpoint of ``run_dir`` that belongs to this run; damaged newer ones are set
    aside (or, without ``set_aside``, only named), each with a line saying why. None if there is none (the
    run starts from step 0); ConfigError if the run changed, or if every checkpoint is damaged and the user
    did not ask to start again (--restart-from-scratch): a run that lost all its steps is no success."""
    damaged: list[tuple[Path, str]] = []
    checkpoint = None
    for candidate in reversed(complete_checkpoints(run_dir)):
        problem = damage(candidate)
        if problem is None:
            checkpoint = candidate
            break
        damaged.append((candidate, problem))
    if checkpoint is None and damaged and not config.train.restart_from_scratch:
        newest, problem = damaged[0]
        raise ConfigError(f"{newest} is damaged ({problem}) and no intact checkpoint precedes it; restore it, or pass "
                          "--restart-from-scratch to set every checkpoint aside and train again from step 0")
    for candidate, problem in damaged:
        if not set_aside:
            print(f"plait: {candidate.name} is damaged ({problem}); the run will set it aside", flush=True)
            continue
        print(f"plait: {candidate.name} is damaged ({problem}); set aside as {move_aside(candidate).name}", flush=True)
    if checkpoint is None:
        return None
    checkpoint_metadata(checkpoint)  # whole files that are not metadata are refused, not set aside
    changed = changes(checkpoint, config)
    if changed and not config.train.resume_changed:
        raise ConfigError(f"{checkpoint} belongs to a run with another {', '.join(changed)}; resume with the same "
                          "settings, or pass --resume-changed to continue it on purpose")
    return checkpoint
