"""Token streams and the deterministic global batch.

The default corpus is the Python standard library's own source, which every machine with Python
has, read as bytes (vocabulary 256). Users pass text files (read as UTF-8 bytes) or pre-tokenized
files: ``.u16``/``.bin`` (uint16, nanoGPT's format), ``.u32`` (uint32) or ``.npy``. A file is
memory-mapped, never read whole, and its id range is scanned once per start (``plait.token_range``).

The global batch of step k depends only on (seed, k): its sequence offsets are drawn from a
generator seeded by both, so every layout sees the same sequences, and each data-parallel rank
reads only the rows of its own slice.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from plait.errors import ConfigError
from plait.paths import require_input_file
from plait.token_range import TokenRange, token_range
from plait.tokenizer import check_tokenizer

DEFAULT_CORPUS_BYTES = 4 * 2**20
TOKEN_FILE_DTYPES = {".u16": np.uint16, ".bin": np.uint16, ".u32": np.uint32}


def default_corpus() -> np.ndarray:
    """The standard library's top-level ``.py`` files, sorted by name, up to 4 MiB of bytes."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= DEFAULT_CORPUS_BYTES:
            break
    return np.frombuffer(b"".join(chunks)[:DEFAULT_CORPUS_BYTES], dtype=np.uint8)


def load_tokens(path: str | None, flag: str = "--data") -> np.ndarray:
    """The token stream of ``path`` (memory-mapped where it can be), or the default corpus; ``flag``
    names the setting the path came from (``--data`` or ``--eval-data``) in an error."""
    if path is None:
        return default_corpus()
    file, what = Path(path), flag.strip("-").replace("-", " ")
    require_input_file(f"{what} file", path, f"pass {flag} with a text or token file")
    if file.stat().st_size == 0:
        raise ConfigError(f"{what} file {path} is empty; it needs at least one sequence of tokens")
    if file.suffix == ".npy":
        try:
            tokens = np.load(file, mmap_mode="r")  # never unpickles: allow_pickle stays False
        except (ValueError, OSError, EOFError) as error:
            raise ConfigError(f"{path} is not a readable .npy array ({error}); write it with numpy.save") from None
        if tokens.ndim != 1 or tokens.dtype.kind not in "ui":
            raise ConfigError(f"{path} must hold a 1-D array of integer token ids, got {tokens.dtype} {tokens.shape}")
        return tokens
    dtype = TOKEN_FILE_DTYPES.get(file.suffix)
    if dtype is None:
        return np.memmap(file, dtype=np.uint8, mode="r")
    itemsize = np.dtype(dtype).itemsize
    if file.stat().st_size % itemsize:
        raise ConfigError(
            f"{path} is {file.stat().st_size} bytes, not a whole number of {np.dtype(dtype).name} tokens; "
            "check the file's suffix (.u16/.bin for uint16, .u32 for uint32)"
        )
    return np.memmap(file, dtype=dtype, mode="r")


def check_length(tokens: np.ndarray, seq_len: int, source: str) -> None:
    """Reject a stream too short for one sequence and its target."""
    if len(tokens) < seq_len + 1:
        raise ConfigError(
            f"{source} holds {len(tokens)} tokens, fewer than one sequence of {seq_len} plus its target; "
            "use more data or a shorter --seq-len"
        )


def check_ids(smallest: int, largest: int, vocab: int, source: str) -> None:
    """Reject token ids outside the vocabulary."""
    if smallest < 0:
        raise ConfigError(f"{source} holds the negative token id {smallest}; token ids count from 0")
    if largest >= vocab:
        raise ConfigError(
            f"{source} holds token id {largest} but the model's vocabulary is {vocab}; "
            "choose a model whose vocabulary covers the data"
        )


def checked_tokens(path: str | None, vocab: int, seq_len: int,
                   flag: str = "--data") -> tuple[np.ndarray, TokenRange | None]:
    """The token stream of ``path`` (or the default corpus) checked against the model, with the id range
    of its file that the check read (None for the default corpus): a record that still describes the
    file, else one chunked scan (``plait.token_range``). ``flag`` as ``load_tokens`` takes it."""
    tokens = load_tokens(path, flag)
    source = path or "the default corpus"
    check_length(tokens, seq_len, source)
    if path is None:
        check_ids(int(tokens.min()), int(tokens.max()), vocab, source)
        return tokens, None
    ids = token_range(tokens)
    check_ids(ids.smallest, ids.largest, vocab, source)
    return tokens, ids


def training_tokens(path: str | None, vocab: int, seq_len: int, flag: str = "--data") -> np.ndarray:
    """The token stream of ``path`` (or the default corpus), checked against the model."""
    return checked_tokens(path, vocab, seq_len, flag)[0]


HELD_OUT_SHARE = 0.1  # --eval-every scores the last tenth of the stream, which training never reads


def held_out(train) -> bool:
    """Whether a run (a ``TrainSpec``) holds the data's tail out of training: --eval-every without --eval-data."""
    return bool(train.eval_every) and not train.eval_data


def held_out_split(tokens: np.ndarray, seq_len: int, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(training tokens, held-out tokens): the last tenth (at least one sequence and its target) held out.
    Training's ``BatchSource`` over the first part reads no token of the second."""
    held = max(seq_len + 1, int(len(tokens) * HELD_OUT_SHARE))
    if len(tokens) - held < seq_len + 1:
        raise ConfigError(f"{source} holds {len(tokens)} tokens, too few to hold out {held} for --eval-every and "
                          f"train on one sequence of {seq_len} plus its target; use more data or drop --eval-every")
    return tokens[:-held], tokens[-held:]


@dataclass(frozen=True)
class BatchSource:
    """Draws the rows of the global batch of each step that one data-parallel rank owns."""

    tokens: np.ndarray
    seq_len: int
    global_batch: int
    seed: int

    def offsets(self, step: int) -> np.ndarray:
        """Start offsets of every sequence of the global batch of ``step``."""
        generator = np.random.default_rng([self.seed, step])
        return generator.integers(0, len(self.tokens) - self.seq_len, size=self.global_batch)

    def local_batch(self, step: int, dp_rank: int, dp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, (global_batch / dp_size, seq_len) each, for this rank."""
        rows = self.global_batch // dp_size
        mine = self.offsets(step)[dp_rank * rows:(dp_rank + 1) * rows]
        window = np.stack([np.asarray(self.tokens[o:o + self.seq_len + 1], dtype=np.int64) for o in mine])
        sequences = torch.from_numpy(window)
        return sequences[:, :-1], sequences[:, 1:]


def check_token_files(train) -> None:
    """With --tokenizer, the data and the eval data (a ``TrainSpec``'s) must be files of its token ids."""
    named = [("--data", train.data)] + ([("--eval-data", train.eval_data)] if train.eval_data else [])
    for flag, data in named:
        if Path(data or "").suffix not in (*TOKEN_FILE_DTYPES, ".npy"):
            raise ConfigError(f"--tokenizer needs {flag} of token ids (.u16/.bin/.u32/.npy), but "
                              f"{data or 'the default corpus'} is read as bytes; make a token file with `plait "
                              f"prepare-data TEXT --tokenizer {train.tokenizer} --out FILE.u16`, or drop --tokenizer")


def check_data(config) -> TokenRange | None:
    """Open the run's data and eval data and check they fit the model (a ``RunConfig``), before any worker
    starts; return the id range of the data's file, which the workers then read instead of scanning (None:
    the default corpus)."""
    train = config.train
    if train.tokenizer:
        check_token_files(train)
    tokens, ids = checked_tokens(train.data, config.model.vocab, config.model.seq_len)
    if train.tokenizer:
        check_tokenizer(train.tokenizer, config.model.vocab)
    if train.eval_data:
        checked_tokens(train.eval_data, config.model.vocab, config.model.seq_len, "--eval-data")
    if held_out(train):
        held_out_split(tokens, config.model.seq_len, train.data or "the default corpus")
    return ids
