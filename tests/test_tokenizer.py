"""Real tokenizers: a tokenizer trained here with ``tokenizers`` prepares the data, a run trains on it
and keeps the tokenizer, and ``plait sample`` decodes the model's greedy tokens with it."""

from __future__ import annotations

import dataclasses
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from plait.cli import main
from plait.models.transformer import Transformer
from plait.train.checkpoint import latest_checkpoint
from tests.cases import assert_refused_in_one_line, run_config, train_losses

tokenizers = pytest.importorskip("tokenizers")
VOCAB = 300
TEXTS = sorted(Path(sysconfig.get_paths()["stdlib"], "json").glob("*.py"))


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train([str(t) for t in TEXTS], trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_prepared_data_trains_and_sample_decodes_with_the_runs_tokenizer(pool, tokenizer_file, tmp_path, capsys):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    tokens = tmp_path / "tokens.u16"
    assert main(["prepare-data", *map(str, TEXTS), "--tokenizer", str(tokenizer_file), "--out", str(tokens)]) == 0
    expected = [i for text in TEXTS for i in tokenizer.encode(text.read_text(), add_special_tokens=False).ids]
    assert np.fromfile(tokens, dtype=np.uint16).tolist() == expected

    config = run_config("tiny", steps=2, dp=2)
    config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, vocab=VOCAB),
        train=dataclasses.replace(config.train, data=str(tokens), tokenizer=str(tokenizer_file), checkpoint_every=2))
    pool.run(train_losses, 2, config, str(tmp_path / "run"))
    assert (tmp_path / "run" / "tokenizer.json").read_text() == tokenizer_file.read_text()

    dcp_to_torch_save(latest_checkpoint(tmp_path / "run"), tmp_path / "full.pt")
    model = Transformer(config.model)
    model.load_state_dict(torch.load(tmp_path / "full.pt", weights_only=True)["model"])
    prompt = "def "
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "run"), "--prompt", prompt, "--max-tokens", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == tokenizer.decode(ids) + "\n"


def test_bad_prepare_data_input_is_refused_in_one_line(tokenizer_file, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = str(TEXTS[0])
    assert_refused_in_one_line(["prepare-data", text, "--tokenizer", str(tokenizer_file), "--out", "tokens.txt"],
                               "must end in .u16 or .u32", capsys, tmp_path)
    assert_refused_in_one_line(["prepare-data", text, "--tokenizer", text, "--out", "tokens.u16"],
                               "is not a tokenizers file", capsys, tmp_path)
    assert_refused_in_one_line(["prepare-data", "missing.txt", "--tokenizer", str(tokenizer_file), "--out", "t.u16"],
                               "text file missing.txt does not exist", capsys, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written, not even a partial file


def test_text_streams_in_blocks_of_whole_lines(tmp_path):
    from plait.tokenizer import line_blocks

    text = "".join(f"line {i} é {'x' * (i % 37)}\n" for i in range(2000)) + "no newline at the end"
    (tmp_path / "text.txt").write_text(text)
    blocks = list(line_blocks(tmp_path / "text.txt", block_bytes=1000))
    assert len(blocks) > 20 and "".join(block for block, _ in blocks) == text
    assert all(block.endswith("\n") for block, _ in blocks[:-1])
    assert sum(size for _, size in blocks) == len(text.encode())


def test_a_file_without_newlines_streams_in_bounded_blocks(tmp_path):
    from plait.tokenizer import line_blocks

    text = "é" * 5000 + "x"  # 10,001 bytes, no newline; a block may end inside a two-byte character
    (tmp_path / "text.txt").write_text(text)
    blocks = list(line_blocks(tmp_path / "text.txt", block_bytes=999))
    assert len(blocks) > 5 and all(size <= 2 * 999 for _, size in blocks)
    assert "".join(block for block, _ in blocks) == text and sum(size for _, size in blocks) == len(text.encode())
