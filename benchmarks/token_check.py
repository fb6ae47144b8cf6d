"""How long a run's check of a token file's ids takes: scanned (once per start, by the launcher, or by
rank 0 under a torchrun plait did not start) against read from the record of that scan (every rank).

    PYTHONPATH=src python benchmarks/token_check.py [--gib 1]

Writes a synthetic .u16 file of about ``--gib`` GiB to a temporary folder (removed after) and times
``plait.train.data.checked_tokens`` on it without a record, then with the launcher's record in the
environment, then, for comparison, the whole-file ``min()``/``max()`` every rank ran before. Each line
gives the wall time and how much the process's peak resident memory grew. The file was just written,
so it is read from the page cache: a cold read is bound by the disk instead.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from plait.token_range import RANGE_ENV
from plait.train.data import checked_tokens, load_tokens

VOCAB = 50304
WRITE_CHUNK_TOKENS = 2**22


def write_tokens(path: Path, count: int) -> None:
    """``count`` uint16 ids below ``VOCAB``, written a chunk at a time."""
    with path.open("wb") as sink:
        for start in range(0, count, WRITE_CHUNK_TOKENS):
            ids = np.arange(start, min(count, start + WRITE_CHUNK_TOKENS), dtype=np.int64) * 7919 % VOCAB
            sink.write(ids.astype(np.uint16).tobytes())


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(label: str, work: Callable[[], object]) -> object:
    peak, start = peak_rss_mib(), time.perf_counter()
    result = work()
    print(f"{label:<44} {(time.perf_counter() - start) * 1e3:8.1f} ms   peak memory +{peak_rss_mib() - peak:,.0f} MiB")
    return result


def whole_file_range(path: str) -> tuple[int, int]:
    tokens = load_tokens(path)
    return int(tokens.min()), int(tokens.max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the synthetic token file")
    gib = parser.parse_args().gib
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "tokens.u16")
        write_tokens(Path(path), int(gib * 2**30) // 2)
        print(f"{gib:g} GiB token file ({int(gib * 2**30) // 2:,} uint16 ids), page cache warm")
        os.environ.pop(RANGE_ENV, None)
        _, record = timed("scanned once (launcher, or rank 0)", lambda: checked_tokens(path, VOCAB, 1024))
        os.environ[RANGE_ENV] = record.to_json()
        timed("read from the record (every rank)", lambda: checked_tokens(path, VOCAB, 1024))
        os.environ.pop(RANGE_ENV)
        timed("whole-file min()/max() (every rank, before)", lambda: whole_file_range(path))


if __name__ == "__main__":
    main()
