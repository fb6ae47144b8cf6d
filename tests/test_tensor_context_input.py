"""Layouts a model cannot be split into: one clear line, exit status 2, before any worker starts."""

from __future__ import annotations

import pytest

from plait.facts.model_state import padded_vocab
from plait.models.spec import model_spec
from tests.cases import assert_refused_in_one_line

BAD_SPLITS = {
    "heads not divisible by tp": (["--tp", "3"], "4 attention heads cannot be split over --tp 3"),
    "kv-heads neither divisible by tp nor dividing it": (
        ["--model", "tiny-llama", "--hidden", "192", "--heads", "12", "--kv-heads", "4", "--tp", "6"],
        "4 kv-heads cannot be split or replicated over --tp 6",
    ),
    "ffn not divisible by tp": (["--model", "tiny-llama", "--ffn-hidden", "350", "--tp", "4"], "FFN hidden size 350"),
    "sequence not divisible by cp": (["--cp", "3"], "sequence length 128 is not divisible by --cp 3"),
    "heads per tp rank not divisible by cp": (["--tp", "2", "--cp", "4", "--seq-len", "64"], "2 heads per tensor-parallel rank"),
    "sequence shard not divisible by tp under sp": (
        ["--tp", "2", "--sp", "--cp", "2", "--seq-len", "66"], "choose a seq-len that is a multiple of cp·tp"
    ),
}


@pytest.mark.parametrize("case", list(BAD_SPLITS))
def test_bad_split_is_one_clear_line(case, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    flags, expected = BAD_SPLITS[case]
    assert_refused_in_one_line(["train", "--steps", "2", *flags], expected, capsys, tmp_path)


def test_vocabulary_is_padded_to_aligned_rows_a_rank_not_refused():
    """Each tp rank's rows a multiple of 8 (16 bytes of bf16); without tp the weights keep the vocabulary."""
    assert padded_vocab(model_spec("tiny", vocab=257).vocab, 2) == 272
    assert padded_vocab(256, 4) == 256
    assert padded_vocab(50257, 8) == 50304
    assert padded_vocab(50257, 1) == 50257
