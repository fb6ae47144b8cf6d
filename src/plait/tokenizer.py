"""Hugging Face ``tokenizers`` files: ``plait prepare-data`` turns text into a token file with one,
a run keeps it (``RUN/tokenizer.json``) and ``plait sample`` encodes and decodes with it.

A ``tokenizer.json`` is data (JSON read by the ``tokenizers`` library); nothing in it is executed.
Text is tokenized in blocks of whole lines (about ``BLOCK_BYTES`` each), so a file of any size
streams through bounded memory; a line never spans two blocks. The blocks, of one file or of many,
go to the library's ``encode_batch`` ``BATCH_BLOCKS`` at a time, which tokenizes them on every core
(as ``TOKENIZERS_PARALLELISM`` allows). Each text file is one document, and its tokens are followed
by the tokenizer's end-of-document token (the first of ``EOS_TOKENS`` the tokenizer has, or the one
``--eos-token`` names), so training sees where one document ends and the next begins. No other
special tokens are added (a tokenizer's post-processor would otherwise put them at every block), in
the data or the prompt.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import numpy as np

from plait.errors import ConfigError
from plait.paths import check_output_path, require_input_file
from plait.token_range import write_record_beside

TOKENIZER_FILE = "tokenizer.json"  # the copy a run keeps
BLOCK_BYTES = 2**16
BATCH_BLOCKS = 64  # blocks per encode_batch call: about 4 MiB of text spread over every core
# End-of-document tokens by family: GPT-2 and most BPE tokenizers, Llama 1-2 and Mistral, Llama 3, Gemma
EOS_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
OUT_DTYPES = {".u16": np.uint16, ".u32": np.uint32}


def load_tokenizer(path: str | Path):
    """The tokenizer in ``path``; ConfigError if it is missing or not a tokenizers file."""
    from tokenizers import Tokenizer

    require_input_file("tokenizer", path, "pass a tokenizer.json saved by the tokenizers library")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # the file is user input: whatever the library raises on it
        raise ConfigError(f"{path} is not a tokenizers file ({str(error)[:200]}); pass a tokenizer.json saved by "
                          "the tokenizers library") from None


def check_tokenizer(path: str | Path, vocab: int) -> None:
    """Refuse a tokenizer whose ids do not fit the model's vocabulary."""
    size = load_tokenizer(path).get_vocab_size()
    if size > vocab:
        raise ConfigError(f"tokenizer {path} has {size} tokens but the model's vocabulary is {vocab}; "
                          f"pass --vocab {size} (or more)")


def line_blocks(path: Path, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[str, int]]:
    """The UTF-8 text of ``path`` in blocks of whole lines, each with its size in bytes; a line longer than
    a block is cut (between characters), so no block exceeds two ``block_bytes``."""
    decoder = codecs.getincrementaldecoder("utf-8")()  # holds a character a cut split until the next block
    with Path(path).open("rb") as stream:
        try:
            while block := stream.read(block_bytes):
                block += stream.readline(block_bytes)  # finish the line the block cut, unless it runs on further
                yield decoder.decode(block), len(block)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as error:
            raise ConfigError(f"{path} is not UTF-8 text ({error}); convert it before tokenizing") from None


def _new_file(partial: Path, out: str):
    """``partial`` (``--out out`` written aside) opened to write; ConfigError where the folder refuses it."""
    try:
        return partial.open("wb")
    except OSError as error:
        raise ConfigError(f"--out {out} cannot be written ({error.strerror}); name a folder you can write to") from None


def end_of_document(tokenizer, tokenizer_path: str, eos_token: str | None = None) -> tuple[str, int]:
    """The end-of-document token put after each document, and its id: ``eos_token`` if given, else the
    first of ``EOS_TOKENS`` the tokenizer has; ConfigError if it has none."""
    for token in (eos_token,) if eos_token is not None else EOS_TOKENS:
        if (token_id := tokenizer.token_to_id(token)) is not None:
            return token, token_id
    wanted = repr(eos_token) if eos_token is not None else f"any of {', '.join(EOS_TOKENS)}"
    raise ConfigError(f"tokenizer {tokenizer_path} has no token {wanted} to end each document with; name its "
                      "end-of-document token with --eos-token TOKEN")


def text_blocks(texts: list[str]) -> Iterator[tuple[str, int, bool]]:
    """Every block of every text file (``line_blocks``), each with its bytes and whether it ends its file,
    a document; an empty file is one empty block."""
    for text in texts:
        held = ("", 0)
        for index, block in enumerate(line_blocks(Path(text), BLOCK_BYTES)):
            if index:
                yield *held, False
            held = block
        yield *held, True


def prepare_data(texts: list[str], tokenizer_path: str, out: str, eos_token: str | None = None) -> int:
    """Tokenize ``texts``, each a document followed by the end-of-document token (``end_of_document``), one
    after another into the token file ``out`` (``.u16`` or ``.u32``); return the token count. The file
    appears whole or not at all (written aside, then renamed), with the record of its id range beside it
    (``OUT.range.json``), which spares a run's check the scan while the file is unchanged."""
    from tqdm import tqdm

    target = Path(out)
    if target.suffix not in OUT_DTYPES:
        raise ConfigError(f"--out {out} must end in .u16 or .u32, the token file types plait train reads")
    if check_output_path("--out", out):
        raise ConfigError(f"--out {out} already exists; choose another name or remove it")
    for text in texts:
        require_input_file("text file", text, "pass UTF-8 text files to tokenize")
    tokenizer = load_tokenizer(tokenizer_path)
    dtype = OUT_DTYPES[target.suffix]
    if tokenizer.get_vocab_size() > np.iinfo(dtype).max + 1:
        raise ConfigError(f"the tokenizer's {tokenizer.get_vocab_size()} token ids do not fit {target.suffix}; "
                          "write a .u32 file")
    end = [end_of_document(tokenizer, tokenizer_path, eos_token)[1]]
    partial = target.with_name(target.name + ".partial")
    count, blocks = 0, text_blocks(texts)
    try:
        with _new_file(partial, out) as sink, tqdm(total=sum(Path(t).stat().st_size for t in texts), unit="B",
                                              unit_scale=True, desc="tokenize") as progress:
            while batch := list(islice(blocks, BATCH_BLOCKS)):
                encodings = tokenizer.encode_batch([block for block, _, _ in batch], add_special_tokens=False)
                for (_, size, last), encoding in zip(batch, encodings, strict=True):
                    ids = np.asarray(encoding.ids + (end if last else []), dtype=dtype)
                    sink.write(ids.tobytes())
                    count += len(ids)
                    progress.update(size)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, target)
    write_record_beside(target, dtype)
    return count
