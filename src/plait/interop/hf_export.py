"""``plait export``'s files: a model's weights as Hugging Face safetensors shards with their index,
its ``config.json``, and the run's tokenizer in the form ``AutoTokenizer`` loads.

The weights stream: each Hugging Face tensor is built from the plait parameters placed in it
(fetched one tensor's worth at a time) and written a block of rows at a time, so no more than the
largest tensor and one block is ever in memory, whatever the model's size. Every shard's header
is known before its first byte (the shapes come from the model's spec), so a shard is written
front to back. Shards follow ``save_pretrained``: ``model.safetensors`` when one holds everything,
else ``model-00001-of-0000N.safetensors``, ... with ``model.safetensors.index.json``. Each file
is written aside and renamed, so it appears whole or not at all.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path

import torch

from plait.errors import ConfigError
from plait.interop.hf_config import CONFIG_JSON, WEIGHTS_FILE, WEIGHTS_INDEX, hf_config
from plait.interop.hf_names import HFTensor, hf_rows, hf_tensors, parameter_shapes
from plait.models.spec import ModelSpec
from plait.tokenizer import TOKENIZER_FILE, load_tokenizer

# The file's dtype: its torch dtype and safetensors' name for it.
DTYPES = {"fp32": (torch.float32, "F32"), "bf16": (torch.bfloat16, "BF16")}
# Decimal units as save_pretrained's max_shard_size reads them ("5GB" is 5·10⁹ bytes), and binary ones.
SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
BLOCK_BYTES = 2**24  # the rows of a tensor converted and written at a time
TOKENIZER_CONFIG = "tokenizer_config.json"

# plait's full fp32 value of a parameter of the single-device model, by name and shape.
ParameterValue = Callable[[str, tuple[int, ...]], torch.Tensor]


def parse_size(text: str) -> int:
    """Bytes in ``text``: a whole number with an optional unit, "5GB", "500MB", "1GiB" (as save_pretrained)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).upper() not in SIZE_UNITS or int(match.group(1)) < 1:
        raise ConfigError(f"--max-shard-size {text!r} is not a size; give bytes as a positive whole number with an "
                          "optional unit, e.g. 5GB, 500MB or 2GiB")
    return int(match.group(1)) * SIZE_UNITS[match.group(2).upper()]


def shard_plan(tensors: list[HFTensor], bytes_per_value: int, max_shard_bytes: int) -> list[list[HFTensor]]:
    """The tensors in shards of at most ``max_shard_bytes`` each, in order; a larger tensor gets a shard of its own."""
    shards: list[list[HFTensor]] = [[]]
    size = 0
    for tensor in tensors:
        tensor_bytes = tensor.elements * bytes_per_value
        if shards[-1] and size + tensor_bytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor_bytes
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return [WEIGHTS_FILE]
    return [f"model-{index:05d}-of-{count:05d}.safetensors" for index in range(1, count + 1)]


def _header(tensors: list[HFTensor], dtype: str) -> bytes:
    """A safetensors header: each tensor's dtype, shape and byte range, in order, padded to 8 bytes."""
    bytes_per_value = DTYPES[dtype][0].itemsize
    entries: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        end = offset + tensor.elements * bytes_per_value
        entries[tensor.name] = {"dtype": DTYPES[dtype][1], "shape": list(tensor.shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(entries, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)


def _row_blocks(tensor: HFTensor) -> list[tuple[int, int]]:
    """The tensor's rows in blocks of about ``BLOCK_BYTES`` of fp32, each of whole heads where rows are permuted."""
    rows = tensor.shape[0]
    row_bytes = 4 * tensor.elements // max(rows, 1)
    multiple = tensor.rows_per_block_multiple
    per_block = max(multiple, BLOCK_BYTES // max(row_bytes, 1) // multiple * multiple)
    return [(start, min(start + per_block, rows)) for start in range(0, rows, per_block)]


def _write_tensor(stream, tensor: HFTensor, value_of: ParameterValue, shapes: dict, dtype: torch.dtype) -> None:
    values = [value_of(name, shapes[name]) for name, _ in tensor.parts]
    for rows in _row_blocks(tensor):
        block = hf_rows(tensor, values, rows).to(dtype).contiguous()
        stream.write(block.reshape(-1).view(torch.uint8).numpy())


def _write_whole(path: Path, write: Callable) -> None:
    """``write(stream)`` into ``path`` aside, then renamed into place."""
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as stream:
        write(stream)
    os.replace(partial, path)


def _write_shard(path: Path, tensors: list[HFTensor], value_of: ParameterValue, shapes: dict, dtype: str) -> None:
    header = _header(tensors, dtype)

    def write(stream) -> None:
        stream.write(struct.pack("<Q", len(header)) + header)
        for tensor in tensors:
            _write_tensor(stream, tensor, value_of, shapes, DTYPES[dtype][0])

    _write_whole(path, write)


def _write_json(path: Path, contents: dict) -> None:
    _write_whole(path, lambda stream: stream.write((json.dumps(contents, indent=2) + "\n").encode()))


def _write_index(path: Path, shards: dict[str, list[HFTensor]], bytes_per_value: int) -> None:
    """``save_pretrained``'s index of a sharded folder: the weights' total bytes and each tensor's shard."""
    total = sum(tensor.elements for shard in shards.values() for tensor in shard) * bytes_per_value
    weight_map = {tensor.name: name for name, shard in shards.items() for tensor in shard}
    _write_json(path, {"metadata": {"total_size": total}, "weight_map": weight_map})


def write_hf(spec: ModelSpec, value_of: ParameterValue, folder: Path, max_shard_bytes: int,
             dtype: str = "fp32") -> list[str]:
    """Write the Hugging Face folder of ``spec``'s model into ``folder``: its weights, whose plait parameters
    ``value_of(name, shape)`` gives one at a time, in ``dtype`` shards of at most ``max_shard_bytes``
    (with their index if more than one), then ``config.json``. Returns the weight files' names."""
    config = hf_config(spec)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = hf_tensors(spec)
    shards = shard_plan(tensors, DTYPES[dtype][0].itemsize, max_shard_bytes)
    names = shard_names(len(shards))
    shapes = parameter_shapes(spec)
    for name, shard in zip(names, shards):
        _write_shard(folder / name, shard, value_of, shapes, dtype)
    if len(shards) > 1:
        _write_index(folder / WEIGHTS_INDEX, dict(zip(names, shards)), DTYPES[dtype][0].itemsize)
    _write_json(folder / CONFIG_JSON, {**config, "torch_dtype": str(DTYPES[dtype][0]).removeprefix("torch.")})
    return names + ([WEIGHTS_INDEX] if len(shards) > 1 else [])


def write_tokenizer(run_dir: Path, folder: Path, spec: ModelSpec) -> bool:
    """The run's ``tokenizer.json`` beside the export, with a ``tokenizer_config.json`` that makes it a
    ``PreTrainedTokenizerFast`` for ``AutoTokenizer``; False, writing nothing, for a run that read bytes."""
    source = Path(run_dir) / TOKENIZER_FILE
    if not source.is_file():
        return False
    tokenizer, config = load_tokenizer(source), hf_config(spec)
    ids = {f"{role}_token": config[f"{role}_token_id"] for role in ("bos", "eos") if config[f"{role}_token_id"] is not None}
    special = {role: token for role, token_id in ids.items() if (token := tokenizer.id_to_token(token_id))}
    _write_whole(Path(folder) / TOKENIZER_FILE, lambda stream: stream.write(source.read_bytes()))
    # Decoding as the run's tokenizer does: no clean-up of spaces before punctuation, whatever the release's default.
    _write_json(Path(folder) / TOKENIZER_CONFIG, {"tokenizer_class": "PreTrainedTokenizerFast",
                                                  "model_max_length": spec.seq_len,
                                                  "clean_up_tokenization_spaces": False, **special})
    return True
