"""The smallest and largest token id of a token file, scanned once per start.

A run refuses a token id outside the model's vocabulary before it trains, and that means reading
the whole file (seconds per GiB). So the file is scanned once, a chunk at a time in one buffer, into a
``TokenRange`` record naming the file's path, size, modification time and dtype; whoever finds a
record that still names the file as it is now reads the range from it instead of scanning, and a
file changed since (another size or modification time) is scanned again, never trusted.

A record travels in the environment (``RANGE_ENV``), as the launcher's checked --resume checkpoint
does, rather than in a file: plait writes nothing beside a user's data, the launcher checks before
the run folder exists (a dry run makes none), and a rank's loader knows only the data's path. The
launcher hands its record to the ranks it starts; under a torchrun plait did not start, rank 0
checks once and hands its record to the others (``plait.train.launch.agreed_data_range``). The one
record kept in a file sits beside a token file plait itself wrote (``plait prepare-data``'s
``FILE.range.json``), so that even the launcher's check of such a file reads only the record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

RANGE_ENV = "PLAIT_TOKEN_RANGE"
RECORD_SUFFIX = ".range.json"
SCAN_CHUNK_BYTES = 16 * 2**20


@dataclass(frozen=True)
class TokenRange:
    """The id range of the token file at ``path`` as it was (size, modification time and dtype) when read."""

    path: str
    size: int
    mtime_ns: int
    dtype: str
    smallest: int
    largest: int

    def describes(self, tokens: np.memmap) -> bool:
        """Whether this record is of ``tokens``' file as it is now."""
        return (self.path, self.size, self.mtime_ns, self.dtype) == file_identity(tokens)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def file_identity(tokens: np.memmap) -> tuple[str, int, int, str]:
    """(path, size, modification time, dtype) of the file ``tokens`` maps."""
    stat = os.stat(tokens.filename)
    return os.path.realpath(tokens.filename), stat.st_size, stat.st_mtime_ns, tokens.dtype.str


def file_chunks(tokens: np.memmap) -> Iterator[np.ndarray]:
    """``tokens``, read from its file into one buffer of ``SCAN_CHUNK_BYTES`` at a time: the file is never
    held whole in this process's memory (``tokens.min()`` would fault every page of it in)."""
    buffer = np.empty(max(1, SCAN_CHUNK_BYTES // tokens.itemsize), dtype=tokens.dtype)
    left = len(tokens)
    with open(tokens.filename, "rb") as stream:
        stream.seek(tokens.offset)
        while left and (count := stream.readinto(buffer[:min(left, len(buffer))]) // tokens.itemsize):
            left -= count
            yield buffer[:count]


def scanned_range(tokens: np.memmap) -> TokenRange:
    """The id range of ``tokens`` (at least one token), scanned chunk by chunk. The file's identity is taken
    first, so a write during the scan leaves a record that no longer describes the file."""
    identity = file_identity(tokens)
    bounds = [(int(chunk.min()), int(chunk.max())) for chunk in file_chunks(tokens)]
    return TokenRange(*identity, min(low for low, _ in bounds), max(high for _, high in bounds))


def record_path(token_file: str | Path) -> Path:
    return Path(f"{token_file}{RECORD_SUFFIX}")


def parsed_record(text: str | None) -> TokenRange | None:
    """The record ``text`` holds; None for none or a damaged one."""
    try:
        record = TokenRange(**json.loads(text))
    except (TypeError, ValueError):
        return None
    numbers = (record.size, record.mtime_ns, record.smallest, record.largest)
    return record if all(type(number) is int for number in numbers) else None


def record_beside(token_file: str) -> str | None:
    """The text of the record ``plait prepare-data`` wrote beside ``token_file``, if it did."""
    try:
        return record_path(token_file).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def recorded_range(tokens: np.memmap) -> TokenRange | None:
    """A record that still describes ``tokens``' file: the launcher's (in the environment) or the one beside
    it; None if neither does."""
    for text in (os.environ.get(RANGE_ENV), record_beside(tokens.filename)):
        record = parsed_record(text)
        if record is not None and record.describes(tokens):
            return record
    return None


def token_range(tokens: np.memmap) -> TokenRange:
    """The id range of ``tokens``: from a record that still describes its file, else one scan."""
    return recorded_range(tokens) or scanned_range(tokens)


def write_record_beside(token_file: Path, dtype: type[np.integer]) -> None:
    """Scan the token file plait just wrote (at least one token) and keep its record beside it."""
    record_path(token_file).write_text(scanned_range(np.memmap(token_file, dtype=dtype, mode="r")).to_json())
