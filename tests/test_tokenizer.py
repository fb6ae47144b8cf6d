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
EOS = "<|endoftext|>"  # GPT-2's end-of-document token, the first prepare-data looks for
TEXTS = sorted(Path(sysconfig.get_paths()["stdlib"], "json").glob("*.py"))


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train([str(t) for t in TEXTS], trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[EOS],
        show_progress=False))
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer_run(pool, tokenizer_file, tmp_path_factory):
    """A run of two tensor-parallel ranks trained on data prepared with the tokenizer: its directory, config and
    token file. Its checkpoint holds the vocabulary padded for tp (300 rows to 304), which readers leave out."""
    root = tmp_path_factory.mktemp("bpe")
    tokens = root / "tokens.u16"
    assert main(["prepare-data", *map(str, TEXTS), "--tokenizer", str(tokenizer_file), "--out", str(tokens)]) == 0
    config = run_config("tiny", steps=2, tp=2)
    config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, vocab=VOCAB),
        train=dataclasses.replace(config.train, data=str(tokens), tokenizer=str(tokenizer_file), checkpoint_every=2))
    pool.run(train_losses, 2, config, str(root / "run"))
    return root / "run", config, tokens


def reference_model(run: Path, config, tmp_path: Path) -> Transformer:
    """The run's final weights as torch's own converter reads them, not plait's loader."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(latest_checkpoint(run), tmp_path / "full.pt")
    model = Transformer(config.model)
    saved = torch.load(tmp_path / "full.pt", weights_only=True)["model"]
    model.load_state_dict({name: saved[name][:len(value)] for name, value in model.state_dict().items()})
    return model.eval()


def test_prepared_data_trains_and_sample_decodes_with_the_runs_tokenizer(tokenizer_run, tokenizer_file, tmp_path,
                                                                         capsys):
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    run, config, tokens = tokenizer_run
    eos = tokenizer.token_to_id(EOS)
    expected = [i for text in TEXTS for i in tokenizer.encode(text.read_text(), add_special_tokens=False).ids + [eos]]
    assert np.fromfile(tokens, dtype=np.uint16).tolist() == expected
    assert (run / "tokenizer.json").read_text() == tokenizer_file.read_text()

    model = reference_model(run, config, tmp_path)
    prompt = "def "
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", prompt, "--max-tokens", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == tokenizer.decode(ids) + "\n"


def test_the_export_of_a_tokenizer_run_loads_in_transformers_with_the_runs_tokenizer(tokenizer_run, tokenizer_file,
                                                                                    tmp_path):
    """Sharded weights and the run's tokenizer: AutoModelForCausalLM computes the run's logits, AutoTokenizer
    encodes and decodes as the run's tokenizer does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, config, _ = tokenizer_run
    folder = tmp_path / "hf"
    assert main(["export", str(run), "--to", str(folder), "--max-shard-size", "1MB"]) == 0
    assert len(list(folder.glob("model-*-of-*.safetensors"))) >= 2
    hf_tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    text = TEXTS[0].read_text()[:3000]
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert hf_tokenizer(text)["input_ids"] == ids
    assert hf_tokenizer.decode(ids) == tokenizer.decode(ids) == text
    hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    batch = torch.tensor([ids[:config.model.seq_len]])
    with torch.no_grad():
        assert (reference_model(run, config, tmp_path)(batch) - hf(batch).logits).abs().max().item() <= 1e-5


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


def test_each_document_ends_with_the_end_of_document_token_across_blocks_and_batches(tokenizer_file, tmp_path,
                                                                                     monkeypatch):
    """Three documents, one empty, in blocks of 200 bytes encoded three to a batch: each document's tokens
    in order, then the end-of-document token, which appears nowhere else."""
    from plait import tokenizer as module
    from plait.tokenizer import line_blocks, prepare_data

    monkeypatch.setattr(module, "BLOCK_BYTES", 200)
    monkeypatch.setattr(module, "BATCH_BLOCKS", 3)
    documents = {"a.txt": "".join(f"first {i}\n" for i in range(150)), "empty.txt": "",
                 "c.txt": "second document\nends without a newline"}
    for name, text in documents.items():
        (tmp_path / name).write_text(text)
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    eos = tokenizer.token_to_id(EOS)
    assert len(list(line_blocks(tmp_path / "a.txt", 200))) > 3 * 2  # the first document spans several batches

    tokens = tmp_path / "tokens.u16"
    count = prepare_data([str(tmp_path / name) for name in documents], str(tokenizer_file), str(tokens))
    written = np.fromfile(tokens, dtype=np.uint16).tolist()
    expected, ends = [], []
    for name in documents:
        for block, _ in line_blocks(tmp_path / name, 200):
            expected += tokenizer.encode(block, add_special_tokens=False).ids
        ends.append(len(expected))
        expected.append(eos)
    assert written == expected and count == len(expected)
    assert [i for i, token in enumerate(written) if token == eos] == ends == [ends[0], ends[0] + 1, len(written) - 1]


def test_a_tokenizer_without_an_end_of_document_token_is_refused_in_one_line(tokenizer_file, tmp_path, capsys):
    text, out = str(TEXTS[0]), str(tmp_path / "tokens.u16")
    assert_refused_in_one_line(["prepare-data", text, "--tokenizer", str(tokenizer_file), "--out", out,
                                "--eos-token", "</s>"], "has no token '</s>' to end each document with", capsys, tmp_path)
    assert main(["prepare-data", text, "--tokenizer", str(tokenizer_file), "--out", out, "--eos-token", "{"]) == 0
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    assert np.fromfile(out, dtype=np.uint16)[-1] == tokenizer.token_to_id("{")
    assert f"each document ended by {{, id {tokenizer.token_to_id('{')}" in capsys.readouterr().out


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


def test_prepared_data_keeps_its_id_range_beside_it_until_it_changes(tokenizer_file, tmp_path, monkeypatch):
    from plait.tokenizer import prepare_data
    from plait.train.data import training_tokens
    from tests.test_data import counted_scans, moved_on

    tokens = tmp_path / "tokens.u16"
    prepare_data([str(TEXTS[0])], str(tokenizer_file), str(tokens))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tokens.u16", "tokens.u16.range.json"]
    scans = counted_scans(monkeypatch)
    training_tokens(str(tokens), VOCAB, 16)
    assert scans == []  # even the launcher's check reads only the record
    moved_on(tokens)
    training_tokens(str(tokens), VOCAB, 16)
    assert len(scans) == 1
