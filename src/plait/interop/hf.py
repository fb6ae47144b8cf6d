"""``plait train --init-from DIR``: a Hugging Face model folder checked and read, a slice at a time.

The folder holds ``config.json`` and its weights as ``model.safetensors``, or as shards
(``model-00001-of-0000N.safetensors``, ...) with ``model.safetensors.index.json``, whose
``weight_map`` names the shard of each tensor, as ``save_pretrained`` writes them. Both are data:
JSON and safetensors (a header and raw tensors), nothing in them is ever executed.

A rank asks for the part of each parameter it keeps (``plait.models.init.WeightSource``), and
``hf_weight_source`` reads just that slice of the file through safetensors' lazy ``get_slice``:
no rank reads, or holds, the whole model.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from plait.errors import ConfigError
from plait.interop.hf_config import (
    CONFIG_JSON, WEIGHTS_FILE, WEIGHTS_INDEX, check_model_fits, require_hf_folder, spec_from_hf_config,
)
from plait.interop.hf_names import hf_tensors, placements, region_from_hf
from plait.models.init import Region, WeightSource
from plait.models.spec import ModelSpec

Located = dict[str, tuple[Path, str]]  # a Hugging Face tensor's name → the file holding it, and its name there
Held = dict[str, tuple[tuple[int, ...], str]]  # a tensor's name → its shape and safetensors dtype ("F32", "I8", ...)
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # what reads as fp32 without a scale: quantized integers do not


def _names_in(path: Path) -> Held:
    """The tensors of a safetensors file with their shapes and dtypes, from its header alone."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as weights:
            return {name: (tuple(weights.get_slice(name).get_shape()), weights.get_slice(name).get_dtype())
                    for name in weights.keys()}
    except (SafetensorError, OSError) as error:
        raise ConfigError(f"{path} is not a readable safetensors file ({error})") from None


def _weight_map(index: Path) -> dict[str, Path]:
    """A sharded folder's index: each tensor's name → its shard; ConfigError for an index that is not one."""
    try:
        contents = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ConfigError(f"{index} is not a readable JSON file ({error}); pass a folder written by plait export "
                          "or save_pretrained") from None
    weight_map = contents.get("weight_map") if isinstance(contents, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(shard, str) for shard in weight_map.values()):
        raise ConfigError(f"{index} has no weight_map of tensor names to shard files; pass a folder written by "
                          "plait export or save_pretrained")
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard or not (index.parent / shard).is_file():
            raise ConfigError(f"{index} names the shard {shard!r}, which is not a file of {index.parent}; "
                              "copy the whole folder, every shard with its index")
    return {name: index.parent / shard for name, shard in weight_map.items()}


def _with_gpt2_prefix(spec: ModelSpec, located: Located) -> Located:
    """The Hub's stock GPT-2 files name their tensors without ``transformer.`` (``wte.weight``, ``h.0.…``);
    give them the prefix plait's export writes, so either spelling reads the same (``lm_head.…`` has none)."""
    if spec.hf_model_type != "gpt2" or "transformer.wte.weight" in located or "wte.weight" not in located:
        return located
    return {name if name.startswith("lm_head.") else f"transformer.{name}": place for name, place in located.items()}


def located_tensors(folder: Path, spec: ModelSpec) -> Located:
    """Where each tensor of the folder's weights lies: ``model.safetensors``, else the shard its index names."""
    folder = Path(folder)
    single = folder / WEIGHTS_FILE
    files = dict.fromkeys(_names_in(single), single) if single.is_file() else _weight_map(folder / WEIGHTS_INDEX)
    return _with_gpt2_prefix(spec, {name: (path, name) for name, path in files.items()})


def _held_tensors(folder: Path, spec: ModelSpec, located: Located) -> Held:
    """The shape and dtype of each tensor ``spec``'s model needs that the folder holds, read from the headers
    of the files that hold them; ConfigError where the index names a shard that lacks its tensor."""
    needed = {tensor.name: located[tensor.name] for tensor in hf_tensors(spec) if tensor.name in located}
    headers = {path: _names_in(path) for path in {path for path, _ in needed.values()}}
    held = {}
    for name, (path, stored_name) in needed.items():
        if stored_name not in headers[path]:
            raise ConfigError(f"{Path(folder) / WEIGHTS_INDEX} places the tensor {stored_name} in {path.name}, which "
                              "does not hold it; copy the folder again, every shard with its index")
        held[name] = headers[path][stored_name]
    return held


def check_hf_folder(folder: Path, spec: ModelSpec) -> None:
    """Refuse, in one sentence, a folder whose config or tensors do not describe ``spec``; reads only the
    index and the safetensors headers, so it is quick for any size."""
    folder = Path(folder)
    require_hf_folder(folder)
    folder_model = spec_from_hf_config(folder / CONFIG_JSON)
    check_model_fits(folder, folder_model, asdict(spec))
    held = _held_tensors(folder, folder_model, located_tensors(folder, folder_model))
    for tensor in hf_tensors(folder_model):
        shape, dtype = held.get(tensor.name, (None, None))
        if shape != tensor.shape:
            found = "missing" if shape is None else f"of shape {list(shape)}"
            raise ConfigError(f"{folder}: tensor {tensor.name} is {found}, expected shape {list(tensor.shape)}; "
                              f"the weights do not match their {CONFIG_JSON}")
        if dtype not in FLOAT_DTYPES:
            raise ConfigError(f"{folder}: tensor {tensor.name} is stored as {dtype}, and plait reads floating-point "
                              f"weights only ({', '.join(FLOAT_DTYPES)}); dequantize the folder, or export it in "
                              "fp32 or bf16")


def check_init_from(config) -> None:
    """``check_hf_folder`` for the run's --init-from (a ``RunConfig``), if it has one, before any worker starts."""
    if config.train.init_from:
        check_hf_folder(Path(config.train.init_from), config.model)


def hf_weight_source(folder: Path, spec: ModelSpec) -> WeightSource:
    """The weights of a folder ``check_hf_folder`` accepted for ``spec``: each region of a plait parameter
    read from just the slice of the file that holds it (``region_from_hf``), as fp32."""
    from safetensors import safe_open

    located = located_tensors(Path(folder), spec)
    placed = placements(spec)

    def values(name: str, shape: tuple[int, ...], region: Region) -> torch.Tensor:
        path, stored_name = located[placed[name].hf_name]
        with safe_open(str(path), framework="pt") as weights:
            stored = weights.get_slice(stored_name)
            return region_from_hf(placed[name], region, lambda index: stored[index]).float().contiguous()

    return values
