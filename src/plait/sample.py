"""Text from a trained model: the prompt's tokens, then one token at a time from the model's last logits.

Runs on one process with the full model (``plait.train.full_model``). A run that kept a tokenizer
(``RUN/tokenizer.json``, from ``plait train --tokenizer``) encodes the prompt and decodes the text
with it; a byte-level run (vocabulary of at most 256: the default corpus and text files) reads the
prompt as its UTF-8 bytes and writes bytes back. Temperature 0 is greedy (the argmax); otherwise the logits are divided by
the temperature, cut to the ``top_k`` largest (0: all) and sampled from a generator seeded by
``seed``. A context longer than the model's sequence length keeps its newest ``seq_len`` tokens.
"""

from __future__ import annotations

import torch

from pathlib import Path

from plait.errors import ConfigError
from plait.models.transformer import Transformer
from plait.tokenizer import TOKENIZER_FILE, load_tokenizer

BYTES = 256


def encode_bytes(prompt: str, vocab: int) -> list[int]:
    """The prompt's UTF-8 bytes as token ids; ConfigError if the model does not read bytes."""
    if vocab > BYTES:
        raise ConfigError(f"the run's vocabulary has {vocab} tokens, not bytes; plait sample decodes byte-level runs "
                          "(vocabulary 256: the default corpus or a text file)")
    ids = list(prompt.encode())
    if not ids:
        raise ConfigError("--prompt is empty; give at least one character for the model to continue")
    outside = [i for i in ids if i >= vocab]
    if outside:
        raise ConfigError(f"the prompt holds byte {outside[0]} but the model's vocabulary has only {vocab} tokens; "
                          "use characters whose UTF-8 bytes are below it")
    return ids


def decode_bytes(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


class Codec:
    """Text ↔ token ids for one run: its kept tokenizer, or UTF-8 bytes."""

    def __init__(self, run_dir: Path, vocab: int):
        path = Path(run_dir) / TOKENIZER_FILE
        self.tokenizer = load_tokenizer(path) if path.is_file() else None
        self.vocab = vocab

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            return encode_bytes(prompt, self.vocab)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        if not ids:
            raise ConfigError("--prompt is empty; give at least one character for the model to continue")
        if max(ids) >= self.vocab:
            raise ConfigError(f"the prompt encodes to token {max(ids)} but the model's vocabulary has only "
                              f"{self.vocab} tokens; the run's tokenizer does not fit its model")
        return ids

    def decode(self, ids: list[int]) -> str:
        return decode_bytes(ids) if self.tokenizer is None else self.tokenizer.decode(ids)


@torch.no_grad()
def generate(model: Transformer, prompt: list[int], max_tokens: int, temperature: float = 0.0, top_k: int = 0,
             seed: int = 0) -> list[int]:
    """``max_tokens`` new token ids continuing ``prompt``."""
    generator = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    for _ in range(max_tokens):
        logits = model(torch.tensor([ids[-model.spec.seq_len:]]))[0, -1].float()
        if temperature == 0:
            ids.append(int(logits.argmax()))
            continue
        # The top logit subtracted first, in float64, so no temperature above zero overflows or divides 0 by 0.
        logits = (logits.double() - logits.max()) / temperature
        if 0 < top_k < logits.numel():
            logits = logits.masked_fill(logits < logits.topk(top_k).values[-1], float("-inf"))
        ids.append(int(torch.multinomial(logits.softmax(-1), 1, generator=generator)))
    return ids[len(prompt):]
