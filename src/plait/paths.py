"""Paths a user names, judged by what they are (``os.stat``), never by reading them: an input must be a
regular file, an output a regular file or a new name in a writable folder. A folder, a device or a named
pipe is called what it is, never "missing", and nothing waits on a pipe or reads a device to find out."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from plait.errors import ConfigError

MISSING = "does not exist"


def not_a_file(path: str | Path) -> str | None:
    """What keeps ``path`` from being a regular file, in words (None: it is one)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there, or a file where a folder of it should be
        return MISSING
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    if stat.S_ISREG(mode):
        return None
    return "is a folder" if stat.S_ISDIR(mode) else "is not a regular file (a device, a pipe or a socket)"


def require_input_file(what: str, path: str | Path, fix: str) -> None:
    """Refuse ``path`` (``what`` names it: "data file", "tokenizer") unless it is a regular file."""
    problem = not_a_file(path)
    if problem:
        raise ConfigError(f"{what} {path} {problem}; {fix}")


def check_output_path(flag: str, path: str | Path) -> bool:
    """Refuse ``path`` (given by ``flag``) unless it is a regular file or a new name in a folder this process
    may write; whether a file is there already."""
    problem = not_a_file(path)
    if problem == "is a folder":
        raise ConfigError(f"{flag} {path} is a folder; name a file to write")
    if problem not in (None, MISSING):
        raise ConfigError(f"{flag} {path} {problem}; name a regular file to write")
    folder = Path(path).parent
    if not_a_file(folder) == MISSING:
        raise ConfigError(f"{flag} {path}: the folder {folder} {MISSING}; create it or name another")
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: {folder} is a file, not a folder; name a file inside a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: the folder {folder} is not writable; name a folder you can write to")
    return problem is None
