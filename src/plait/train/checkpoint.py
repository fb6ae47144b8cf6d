"""Checkpoints through torch.distributed.checkpoint, so any layout can load any other's.

A checkpoint is written to ``checkpoints/step_NNNNNNN.partial`` and renamed to
``step_NNNNNNN`` only after every rank has finished, so a crash mid-save never replaces or
corrupts the last good checkpoint.

A checkpoint is data, never code: DCP's reader unpickles ``.metadata`` with ``pickle.load`` and
its planner loads non-tensor entries with ``torch.load(weights_only=False)``, either of which runs
whatever a crafted file asks. plait reads both through its own reader and planner instead:
``.metadata`` with an unpickler that builds only DCP's metadata types, and entries with
``weights_only=True``.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from plait.errors import ConfigError

from plait.parallel.sharded_adamw import master_weights

CHECKPOINT_DIR = "checkpoints"
PARTIAL = ".partial"
DAMAGED = ".damaged"  # set aside by --resume: kept, never loaded
STEP_FILE = "step.json"
# Optimizer state keyed per parameter name (as torchtitan does): pipeline stages hold different
# parameters, so whole param_groups saved by one rank would not fit another's.
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


# Everything a DCP .metadata file may name: its own dataclasses, paths, sizes, dtypes and layouts.
METADATA_TYPES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "ChunkStorageMetadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's checkpoint metadata and nothing else: any other global is refused."""

    def find_class(self, module: str, name: str):
        if name in METADATA_TYPES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not checkpoint metadata")


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader with ``.metadata`` read by ``MetadataUnpickler``."""

    def read_metadata(self, *args, **kwargs) -> dcp_metadata.Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = MetadataUnpickler(stream).load()
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise pickle.UnpicklingError(f"it holds a {type(metadata).__name__}, not checkpoint metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner with non-tensor entries (optimizer hyperparameters) read as weights only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def checkpoint_metadata(path: Path) -> dcp_metadata.Metadata:
    """The checkpoint's metadata, read without running anything; ConfigError if it is not metadata."""
    try:
        return SafeReader(str(path)).read_metadata()
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, TypeError, ValueError) as error:
        raise ConfigError(f"{path} is not a readable checkpoint ({error}); remove it or resume from another run") \
            from None


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints of ``run_dir``, oldest first (neither partial nor set aside as damaged)."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*")
                  if not p.name.endswith((PARTIAL, DAMAGED)) and (p / STEP_FILE).exists())


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir``, or None."""
    complete = complete_checkpoints(run_dir)
    return complete[-1] if complete else None


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    record: Callable[[Path], None]) -> Path:
    """Save the state after ``step`` optimizer steps; collective over all ranks. Rank 0 calls
    ``record`` on the folder once every rank's files are in it, before marking it complete."""
    final = checkpoint_root(run_dir) / f"step_{step:07d}"
    partial = final.with_name(final.name + PARTIAL)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    # The fp32 masters stand for their bf16 parameters, so every layout resumes at full precision.
    model_state.update(master_weights(model, optimizer))
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial))
    dist.barrier()
    if dist.get_rank() == 0:
        record(partial)
        (partial / STEP_FILE).write_text(json.dumps({"step": step}) + "\n")
        os.replace(partial, final)
    dist.barrier()
    return final


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load ``path`` into the (already parallelised) model and optimizer; return its step."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    masters = master_weights(model, optimizer)
    saved = checkpoint_metadata(path).state_dict_metadata
    # Hyperparameters only another optimizer keeps (torch's AdamW has amsgrad, fused, ... that
    # ShardedAdamW has not) stay as this run configured them; every tensor must be in the file.
    kept = {key: value for key, value in optimizer_state.items()
            if key.startswith("param_groups.") and f"optimizer.{key}" not in saved}
    state = {"model": {**model_state, **masters},
             "optimizer": {key: value for key, value in optimizer_state.items() if key not in kept}}
    dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafeLoadPlanner())
    # A parameter with a master keeps its own tensor here and is then rounded from the loaded master.
    set_state_dict(model, optimizer, model_state_dict={**state["model"], **{name: model_state[name] for name in masters}},
                   optim_state_dict={**state["optimizer"], **kept}, options=OPTIONS)
    if masters:
        optimizer.parameters_from_masters()
    return json.loads((Path(path) / STEP_FILE).read_text())["step"]
