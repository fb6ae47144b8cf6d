"""The data path: file formats, and a global batch that depends only on (seed, step)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plait.train.data import BatchSource, default_corpus, load_tokens


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
