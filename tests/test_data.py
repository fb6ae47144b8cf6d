"""The data path: file formats, a global batch that depends only on (seed, step), and a token file's
id range scanned once per start, in bounded chunks, and scanned again once the file changes."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from plait import token_range
from plait.errors import ConfigError
from plait.token_range import RANGE_ENV, scanned_range
from plait.train.data import BatchSource, check_data, default_corpus, load_tokens, training_tokens
from tests.cases import assert_refused_in_one_line, run_config


@pytest.fixture(scope="module")
def corpus() -> np.ndarray:
    return default_corpus()


def test_default_corpus_is_bytes_of_python_source(corpus):
    assert corpus.dtype == np.uint8 and len(corpus) > 1_000_000
    assert b"def " in corpus[:200_000].tobytes()


def global_batch(source: BatchSource, step: int, dp: int) -> torch.Tensor:
    return torch.cat([source.local_batch(step, rank, dp)[0] for rank in range(dp)])


def test_global_batch_is_the_same_for_every_data_parallel_size(corpus):
    source = BatchSource(corpus, seq_len=32, global_batch=8, seed=3)
    for step in (0, 7):
        whole = global_batch(source, step, 1)
        assert torch.equal(whole, global_batch(source, step, 2))
        assert torch.equal(whole, global_batch(source, step, 4))
    assert not torch.equal(global_batch(source, 0, 1), global_batch(source, 1, 1))


def test_batch_depends_on_seed_and_step_only(corpus):
    first = BatchSource(corpus, seq_len=32, global_batch=4, seed=1)
    again = BatchSource(corpus, seq_len=32, global_batch=4, seed=1)
    other = BatchSource(corpus, seq_len=32, global_batch=4, seed=2)
    np.random.seed(99)  # the global generators play no part
    torch.manual_seed(99)
    assert torch.equal(first.local_batch(5, 0, 1)[0], again.local_batch(5, 0, 1)[0])
    assert not torch.equal(first.local_batch(5, 0, 1)[0], other.local_batch(5, 0, 1)[0])


def test_targets_are_the_next_tokens(corpus):
    inputs, targets = BatchSource(corpus, seq_len=16, global_batch=2, seed=0).local_batch(0, 0, 1)
    assert inputs.shape == targets.shape == (2, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    offset = BatchSource(corpus, seq_len=16, global_batch=2, seed=0).offsets(0)[0]
    assert inputs[0].tolist() == corpus[offset:offset + 16].tolist()


def test_every_file_format_reads_the_same_tokens(tmp_path):
    tokens = np.arange(1000, dtype=np.int64) % 250
    tokens.astype(np.uint16).tofile(tmp_path / "t.u16")
    tokens.astype(np.uint16).tofile(tmp_path / "t.bin")
    tokens.astype(np.uint32).tofile(tmp_path / "t.u32")
    np.save(tmp_path / "t.npy", tokens.astype(np.int32))
    (tmp_path / "t.txt").write_bytes(tokens.astype(np.uint8).tobytes())
    for name in ("t.u16", "t.bin", "t.u32", "t.npy", "t.txt"):
        assert np.array_equal(np.asarray(load_tokens(str(tmp_path / name)), dtype=np.int64), tokens), name


def counting(read, scans: list[int]):
    """``read`` (``plait.token_range.file_chunks``), adding the token count of each file it scans to ``scans``."""
    def chunks(tokens):
        scans.append(len(tokens))
        return read(tokens)

    return chunks


def counted_scans(monkeypatch) -> list[int]:
    """The token counts of the files scanned (read chunk by chunk) from now on, one entry a scan."""
    scans: list[int] = []
    monkeypatch.setattr(token_range, "file_chunks", counting(token_range.file_chunks, scans))
    return scans


def data_config(path: Path):
    config = run_config("tiny", seq_len=16)
    return dataclasses.replace(config, train=dataclasses.replace(config.train, data=str(path)))


def moved_on(path: Path) -> None:
    """Set ``path``'s modification time a second later, as a write would."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_a_scan_reads_the_file_in_bounded_chunks_and_misses_no_token(tmp_path, monkeypatch):
    monkeypatch.setattr(token_range, "SCAN_CHUNK_BYTES", 64)
    tokens = np.full(1000, 7, dtype=np.int32)
    tokens[500], tokens[-1] = -3, 255
    np.save(tmp_path / "t.npy", tokens)  # (read after the .npy header)
    np.abs(tokens).astype(np.uint16).tofile(tmp_path / "t.u16")
    for name, smallest, chunk_tokens in (("t.npy", -3, 16), ("t.u16", 3, 32)):
        mapped = load_tokens(str(tmp_path / name))
        chunks = [len(chunk) for chunk in token_range.file_chunks(mapped)]
        assert max(chunks) == chunk_tokens and sum(chunks) == 1000, name
        record = scanned_range(mapped)
        assert (record.smallest, record.largest) == (smallest, 255), name


def test_a_worker_reads_the_launchers_record_without_scanning(tmp_path, monkeypatch):
    from plait.train.launch import agreed_data_range

    (np.arange(1000) % 250).astype(np.uint16).tofile(tmp_path / "t.u16")
    config = data_config(tmp_path / "t.u16")
    scans = counted_scans(monkeypatch)
    record = check_data(config)  # the launcher's check: one scan
    assert scans == [1000] and (record.smallest, record.largest) == (0, 249)
    monkeypatch.setenv(RANGE_ENV, record.to_json())  # as the launcher hands it to its ranks
    agreed_data_range(config)  # (no process group: a rank the launcher started asks no other)
    tokens = training_tokens(config.train.data, config.model.vocab, config.model.seq_len)
    assert scans == [1000] and len(tokens) == 1000


@pytest.mark.parametrize("change", ["rewritten in place", "grown"])
def test_a_file_changed_since_its_record_is_scanned_again(change, tmp_path, monkeypatch):
    path = tmp_path / "t.u16"
    (np.arange(1000) % 250).astype(np.uint16).tofile(path)
    config = data_config(path)
    monkeypatch.setenv(RANGE_ENV, check_data(config).to_json())
    wide = np.full(1000 if change == "rewritten in place" else 1001, 300, dtype=np.uint16)
    wide.tofile(path)
    moved_on(path)  # (a write within the file system's clock tick could keep the old time)
    scans = counted_scans(monkeypatch)
    with pytest.raises(ConfigError, match="holds token id 300 but the model's vocabulary is 256"):
        training_tokens(config.train.data, config.model.vocab, config.model.seq_len)
    assert scans == [len(wide)]


def test_a_token_out_of_range_in_the_last_chunk_is_refused_before_any_worker_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(token_range, "SCAN_CHUNK_BYTES", 256)
    tokens = np.arange(10_000, dtype=np.uint16) % 256
    tokens[-1] = 256
    tokens.tofile(tmp_path / "t.u16")
    assert_refused_in_one_line(["train", "--steps", "2", "--data", "t.u16"], "holds token id 256 but the model's "
                               "vocabulary is 256", capsys, tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["t.u16"]  # nothing written beside the data


def scans_under_a_foreign_torchrun(config) -> tuple[int, str | None]:
    """On each rank of a run no plait launcher checked: how many times this rank scanned the data before its
    tokens were ready, and why the run was refused (None: it was not)."""
    from plait.train.launch import agreed_data_range

    scans: list[int] = []
    read = token_range.file_chunks
    token_range.file_chunks = counting(read, scans)
    try:
        agreed_data_range(config)
        training_tokens(config.train.data, config.model.vocab, config.model.seq_len)
        return len(scans), None
    except ConfigError as error:
        return len(scans), str(error)
    finally:
        token_range.file_chunks = read
        os.environ.pop(RANGE_ENV, None)  # (a pool worker serves later cases)


def test_under_a_torchrun_plait_did_not_start_rank_0_alone_checks_the_data(pool, tmp_path):
    (np.arange(1000) % 250).astype(np.uint16).tofile(tmp_path / "t.u16")
    assert pool.run(scans_under_a_foreign_torchrun, 2, data_config(tmp_path / "t.u16")) == [(1, None), (0, None)]
    np.full(1000, 300, dtype=np.uint16).tofile(tmp_path / "wide.u16")
    refused = pool.run(scans_under_a_foreign_torchrun, 2, data_config(tmp_path / "wide.u16"))
    assert [scans for scans, _ in refused] == [1, 0]
    assert refused[0][1] == refused[1][1] and "holds token id 300" in refused[0][1]
