"""Files a command writes, checked before any work: the folder must exist, and a file already there is
replaced only when it is one plait wrote of that kind (a profile, a trace, a drawing), never a file of
the user's that a mistyped path names."""

from __future__ import annotations

import json
from pathlib import Path

from plait.errors import ConfigError
from plait.paths import check_output_path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _is_json_object_with(path: Path, key: str) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and key in data


def _is_png(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return file.read(len(PNG_SIGNATURE)) == PNG_SIGNATURE
    except OSError:
        return False


# What plait writes, by kind: how to recognise one, its name in a sentence, and the file name's ending.
KINDS = {
    "profile": (lambda path: _is_json_object_with(path, "bf16_tflops"), "a hardware profile", ".json"),
    "trace": (lambda path: _is_json_object_with(path, "traceEvents"), "a Chrome trace", ".json"),
    "png": (_is_png, "a PNG drawing", ".png"),
}


def check_output_file(flag: str, path: str | None, kind: str) -> None:
    """Refuse ``path`` (given by ``flag``) before any work if it is not a regular file or a new name in a
    writable folder, is a file other than the ``kind`` plait writes there (only a regular file is read),
    or its name does not end as that kind's files do."""
    if path is None:
        return
    recognise, what, suffix = KINDS[kind]
    if check_output_path(flag, path) and not recognise(Path(path)):
        raise ConfigError(f"{flag} {path} exists and is not {what} plait would replace; name another file, "
                          "or move that one away first")
    if Path(path).suffix.lower() != suffix:
        raise ConfigError(f"{flag} {path} must end in {suffix}: plait writes {what} there; name a {suffix} file")
