"""A run's newest checkpoint, whatever layout wrote it, as one full single-device model in this process
(``plait sample``), or one full parameter at a time (``plait export``).

The checkpoint's ``run.json`` names the model. Each parameter is assembled from the chunks the
layout saved (data-, tensor- and pipeline-parallel, ZeRO), read straight from the byte ranges
DCP's metadata names, without a process group: the metadata through plait's safe unpickler, each
chunk with ``torch.load(weights_only=True)`` (nothing in the files is run). Rows tensor
parallelism padded the vocabulary with are left out. The fp32 masters are saved under their
parameters' names, so a bf16 run loads at full precision. One parameter at a time, ``plait
export`` holds no more than one tensor of a model of any size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex
from torch.distributed.checkpoint.utils import _create_file_view

from plait.errors import ConfigError
from plait.models.spec import ModelSpec
from plait.models.transformer import Transformer
from plait.train.checkpoint import RUN_FILE, checkpoint_metadata, latest_checkpoint
from plait.train.checkpoint_record import damage


def run_checkpoint(run_dir: Path) -> Path:
    """The newest complete and intact checkpoint of ``run_dir``; ConfigError saying what is wrong."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a directory; pass the run directory of a `plait train` run")
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise ConfigError(f"{run_dir} holds no complete checkpoint (a run saves one after its last step unless "
                          "--no-final-checkpoint); train it to the end, or resume it with --resume, to write one")
    problem = damage(checkpoint)
    if problem is not None:
        raise ConfigError(f"{checkpoint} is damaged ({problem}); set it aside (rename it) to use the one before")
    if not (checkpoint / RUN_FILE).is_file():
        raise ConfigError(f"{checkpoint} has no {RUN_FILE} naming its model; it was written by an older plait")
    checkpoint_metadata(checkpoint)  # refused in one line if it is not metadata
    return checkpoint


def checkpoint_spec(checkpoint: Path) -> ModelSpec:
    """The model the checkpoint's run trained."""
    spec = ModelSpec(**json.loads((Path(checkpoint) / RUN_FILE).read_text())["model_spec"])
    spec.validate()
    return spec


def _read_chunk(checkpoint: Path, metadata: Metadata, key: str, chunk: ChunkStorageMetadata) -> torch.Tensor:
    """One saved chunk of the entry ``key``, from the byte range of the file that holds it."""
    stored = metadata.storage_data[MetadataIndex(key, chunk.offsets)]
    with (Path(checkpoint) / stored.relative_path).open("rb") as file:
        loaded = torch.load(_create_file_view(file, stored.offset, stored.length), map_location="cpu", weights_only=True)
    if not isinstance(loaded, torch.Tensor) or tuple(loaded.shape) != tuple(chunk.sizes):
        raise ConfigError(f"{checkpoint}: a saved part of {key} is not the tensor its metadata records; it is damaged")
    return loaded


def _inside(chunk: ChunkStorageMetadata, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """The part of a saved chunk that lies inside ``shape``: (start, stop) per dimension of the full tensor."""
    return [(offset, min(offset + size, limit)) for offset, size, limit in zip(chunk.offsets, chunk.sizes, shape)]


def checkpoint_parameters(checkpoint: Path) -> Callable[[str, tuple[int, ...]], torch.Tensor]:
    """``value(name, shape)``: the full value of the single-device model's parameter ``name`` in ``checkpoint``,
    of ``shape`` (rows tensor parallelism padded the vocabulary with are left out), read chunk by chunk."""
    metadata = checkpoint_metadata(checkpoint)

    def value(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        key = f"model.{name}"
        if key not in metadata.state_dict_metadata:
            raise ConfigError(f"{checkpoint} holds no {name}; it is not a checkpoint of its run's model")
        entry = metadata.state_dict_metadata[key]
        if len(entry.chunks) == 1 and tuple(entry.size) == tuple(shape):  # saved whole: loaded as it is
            return _read_chunk(checkpoint, metadata, key, entry.chunks[0])
        full = torch.empty(shape, dtype=entry.properties.dtype)
        filled = 0
        for chunk in entry.chunks:
            part = _inside(chunk, shape)
            if all(start < stop for start, stop in part):
                loaded = _read_chunk(checkpoint, metadata, key, chunk)
                full[tuple(slice(start, stop) for start, stop in part)] = \
                    loaded[tuple(slice(0, stop - start) for start, stop in part)]
                filled += math.prod(stop - start for start, stop in part)
        if filled != math.prod(shape):
            raise ConfigError(f"{checkpoint} holds {filled} of the {math.prod(shape)} values of {name}; it is damaged")
        return full

    return value


def load_run_model(run_dir: Path) -> tuple[Transformer, Path]:
    """The full fp32 model of ``run_dir``'s newest checkpoint (in eval mode) and that checkpoint."""
    checkpoint = run_checkpoint(run_dir)
    model = Transformer(checkpoint_spec(checkpoint))
    value = checkpoint_parameters(checkpoint)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(value(name, tuple(param.shape)))
    return model.eval(), checkpoint
