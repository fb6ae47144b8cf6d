"""What a checkpoint belongs to and whether it is whole: the ``run.json`` beside every checkpoint.

Rank 0 writes it once every rank's files are in place: the run's identity (model, seed, data and
its size, global batch, layout, plait version) and a CRC-32 of every file. Before any worker
starts, ``--resume`` checks the newest checkpoint against it: a damaged one is set aside (renamed
``.damaged``; nothing is deleted) and the one before it is used, saying so; a checkpoint of
another run (other model, seed, data or batch) is refused unless ``--resume-changed``.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import asdict
from pathlib import Path

from plait.config import RunConfig
from plait.errors import ConfigError
from plait.train.checkpoint import DAMAGED, STEP_FILE, checkpoint_metadata, complete_checkpoints
from plait.version import plait_version

RUN_FILE = "run.json"
# What must match to continue a run; the layout may change (checkpoints load under any layout).
SAME_RUN = ("model_spec", "seed", "data", "data_bytes", "global_batch")


def run_identity(config: RunConfig) -> dict:
    """The facts that make a stream of steps one run."""
    data = config.train.data
    return {
        "model_spec": asdict(config.model), "seed": config.train.seed,
        "data": str(Path(data).resolve()) if data else None,
        "data_bytes": Path(data).stat().st_size if data else None,
        "global_batch": config.train.global_batch, "layout": config.layout.to_dict(), "plait_version": plait_version(),
    }


def file_checksums(folder: Path) -> dict[str, int]:
    """CRC-32 of every file of a checkpoint folder but its own record and step marker."""
    sums = {}
    for path in sorted(Path(folder).iterdir()):
        if path.name in (RUN_FILE, STEP_FILE) or not path.is_file():
            continue
        crc = 0
        with path.open("rb") as stream:
            while chunk := stream.read(2**20):
                crc = zlib.crc32(chunk, crc)
        sums[path.name] = crc
    return sums


def write_record(folder: Path, identity: dict) -> None:
    """Write ``run.json`` into a checkpoint folder whose files are all written (rank 0 only)."""
    record = {**identity, "files": file_checksums(folder)}
    partial = Path(folder) / (RUN_FILE + ".tmp")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, Path(folder) / RUN_FILE)


def damage(folder: Path) -> str | None:
    """Why the checkpoint in ``folder`` cannot be loaded (None if it is whole)."""
    if not (Path(folder) / RUN_FILE).exists():
        return None  # written before plait recorded its checkpoints: nothing to check it against
    try:
        record = json.loads((Path(folder) / RUN_FILE).read_text())
        json.loads((Path(folder) / STEP_FILE).read_text())["step"]
    except FileNotFoundError as error:
        return f"{Path(error.filename).name} is missing"
    except (ValueError, KeyError, TypeError) as error:
        return f"its record is not readable ({error})"
    expected = record.get("files") if isinstance(record, dict) else None
    if not isinstance(expected, dict):
        return "its record lists no files"
    found = file_checksums(folder)
    for name, crc in expected.items():
        if name not in found:
            return f"{name} is missing"
        if found[name] != crc:
            return f"{name} does not match its checksum"
    try:
        checkpoint_metadata(Path(folder))
    except ConfigError as error:
        return str(error)
    return None


def changes(folder: Path, config: RunConfig) -> list[str]:
    """The identity fields in which ``config`` differs from the run that wrote ``folder``."""
    if not (Path(folder) / RUN_FILE).exists():
        return []
    record = json.loads((Path(folder) / RUN_FILE).read_text())
    now = run_identity(config)
    return [field for field in SAME_RUN if record.get(field) != now[field]]


def resumable_checkpoint(run_dir: Path, config: RunConfig) -> Path:
    """The newest whole checkpoint of ``run_dir`` that belongs to this run; damaged newer ones are set
    aside, each with a line saying why. ConfigError if none is left or the run changed."""
    for checkpoint in reversed(complete_checkpoints(run_dir)):
        problem = damage(checkpoint)
        if problem is None:
            break
        aside = next(path for n in range(1, 1000)
                     if not (path := checkpoint.with_name(checkpoint.name + (f".{n}" if n > 1 else "") + DAMAGED)).exists())
        os.replace(checkpoint, aside)
        print(f"plait: {checkpoint.name} is damaged ({problem}); set aside as {aside.name}, resuming from an "
              "earlier checkpoint", flush=True)
    else:
        raise ConfigError(f"{run_dir} holds no intact checkpoint to resume from; drop --resume to start afresh")
    changed = changes(checkpoint, config)
    if changed and not config.train.resume_changed:
        raise ConfigError(f"{checkpoint} belongs to a run with another {', '.join(changed)}; resume with the same "
                          "settings, or pass --resume-changed to continue it on purpose")
    return checkpoint
