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
import re
import shutil
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from plait.errors import ConfigError

from plait.parallel.data_parallel.sharded_adamw import ShardedAdamW, master_weights

CHECKPOINT_DIR = "checkpoints"
PARTIAL = ".partial"
DAMAGED = ".damaged"  # set aside by --resume: kept, never loaded
STEP_FILE = "step.json"
RUN_FILE = "run.json"  # the run a checkpoint belongs to and a CRC-32 of every file (plait.train.checkpoint_record)
METADATA_FILE = ".metadata"
MAX_METADATA_BYTES = 2**28  # DCP's index of a checkpoint: megabytes even for the largest models
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
    "pathlib._local": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},  # Python 3.13's home
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
        path = Path(self.path) / METADATA_FILE
        if path.stat().st_size > MAX_METADATA_BYTES:
            raise pickle.UnpicklingError(f"{METADATA_FILE} is {path.stat().st_size:,} bytes, more than metadata takes")
        with path.open("rb") as stream:
            metadata = MetadataUnpickler(stream).load()
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise pickle.UnpicklingError(f"it holds a {type(metadata).__name__}, not checkpoint metadata")
        for stored in metadata.storage_data.values():  # every shard's file, checked before any is opened
            inside(Path(self.path), stored.relative_path, METADATA_FILE)
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


def inside(checkpoint: Path, name: str, source: str) -> Path:
    """``checkpoint / name``, a file that ``source`` (a file of the checkpoint) names; ConfigError, before
    anything is read there, when it lies outside the checkpoint's folder (``..``, an absolute path, a link)."""
    path = Path(checkpoint) / name
    if not path.resolve().is_relative_to(Path(checkpoint).resolve()):
        raise ConfigError(f"{checkpoint}'s {source} names {name}, a file outside the checkpoint, so plait did not "
                          f"write it; rename it to {Path(checkpoint).name}{DAMAGED} to use the checkpoint before")
    return path


def checkpoint_metadata(path: Path) -> dcp_metadata.Metadata:
    """The checkpoint's metadata, read without running anything; ConfigError if it is not metadata or
    names a file outside the checkpoint."""
    try:
        return SafeReader(str(path)).read_metadata()
    except ConfigError:
        raise
    except Exception as error:  # the file is untrusted input: whatever it makes the unpickler raise
        raise ConfigError(f"{path} is not a readable checkpoint ({type(error).__name__}: {error}); rename it to "
                          f"{Path(path).name}{DAMAGED} to resume from the one before, or choose another --run-dir to "
                          "start afresh") from None


def crc32_of(path: Path) -> int:
    crc = 0
    with Path(path).open("rb") as stream:
        while chunk := stream.read(2**20):
            crc = zlib.crc32(chunk, crc)
    return crc


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints of ``run_dir``, oldest first: folders named for their step (not partial,
    not set aside as damaged, not a link, nothing else a user put there) that hold their step file."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    named = [p for p in root.glob("step_*")
             if re.fullmatch(r"step_\d+", p.name) and not p.is_symlink() and (p / STEP_FILE).is_file()]
    return sorted(named, key=lambda p: int(p.name.removeprefix("step_")))


def move_aside(path: Path) -> Path:
    """Rename ``path`` (a damaged checkpoint, or whatever stands where one is written) to a name marked
    damaged that nothing holds yet, and return it: nothing a run saved is deleted."""
    aside = next(candidate for n in range(1, 1000)
                 if not (candidate := path.with_name(path.name + (f".{n}" if n > 1 else "") + DAMAGED)).exists())
    os.replace(path, aside)
    return aside


def checkpoint_step(path: Path) -> int:
    """The optimizer steps the checkpoint at ``path`` holds: its step file's count, which must be the step
    its folder is named for; ConfigError for a step file that says anything else."""
    try:
        step = json.loads((Path(path) / STEP_FILE).read_text())["step"]
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        step = None
    named = Path(path).name.removeprefix("step_")
    if isinstance(step, bool) or not isinstance(step, int) or not named.isdigit() or int(named) != step:
        raise ConfigError(f"{Path(path) / STEP_FILE} does not give the step its folder is named for ({step!r}); "
                          f"rename {Path(path).name} to {Path(path).name}{DAMAGED} to resume from the one before")
    return step


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir``, or None."""
    complete = complete_checkpoints(run_dir)
    return complete[-1] if complete else None


def weights_are_finite(model: nn.Module) -> bool:
    """Collective over every rank: whether all parameters (each rank's own shards) are finite. A step
    whose loss and gradient norm were finite can still overflow the weights (a huge learning rate)."""
    local = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    finite = torch.tensor([float(all(bool(torch.isfinite(p).all()) for p in local))],
                          device=local[0].device if local else None)
    dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite.item())


def begin_checkpoint(run_dir: Path, step: int) -> Path:
    """Collective: the empty ``.partial`` folder the checkpoint of ``step`` is written into."""
    partial = checkpoint_root(run_dir) / f"step_{step:07d}{PARTIAL}"
    if dist.get_rank() == 0 and partial.is_symlink():  # the link goes, never what it points to
        partial.unlink()
    elif dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)  # what an interrupted save left there is not this checkpoint's
    dist.barrier()
    return partial


def checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """What a checkpoint holds: the model's and the optimizer's state, as torch.distributed.checkpoint saves it."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    # The fp32 masters stand for their bf16 parameters, so every layout resumes at full precision.
    model_state.update(master_weights(model, optimizer))
    return {"model": model_state, "optimizer": optimizer_state}


def not_written(step: int, partial: Path, error: CheckpointException) -> CheckpointNotWritten:
    """DCP raises a failed save on every rank alike, so every rank stops with this error."""
    rank, (cause, _) = next(iter(error.failures.items()))
    return _not_written(step, partial, f"rank {rank}: {_in_words(cause)}")


def complete_checkpoint(run_dir: Path, step: int, partial: Path, identity: dict, keep: int) -> Path:
    """Collective, once every rank's files are in ``partial``: each rank takes the CRC-32 of the shards
    it wrote; rank 0 records them, with ``identity`` (the run the checkpoint belongs to), in
    ``run.json``, marks the folder complete by renaming it, and then, with ``keep`` > 0, deletes all
    but the newest ``keep`` complete checkpoints."""
    final = partial.with_name(partial.name.removesuffix(PARTIAL))
    mine = {p.name: crc32_of(p) for p in partial.glob(f"__{dist.get_rank()}_*")}
    shards: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(shards, mine)
    if dist.get_rank() == 0:
        files = {name: crc for rank in shards for name, crc in rank.items()}
        files[METADATA_FILE] = crc32_of(partial / METADATA_FILE)
        record = json.dumps({**identity, "step": step, "files": files}, indent=1) + "\n"
        try:
            (partial / RUN_FILE).write_text(record)
            (partial / STEP_FILE).write_text(json.dumps({"step": step}) + "\n")
        except OSError as error:  # the other ranks wait at the barrier below until the launcher ends them
            raise _not_written(step, partial, f"rank 0: {_in_words(error)}") from None
        if final.exists() or final.is_symlink():  # no complete checkpoint (resume takes the newest): a stray
            print(f"plait: {final.name} stood where this checkpoint goes, not a checkpoint this run resumed from; set "
                  f"aside as {move_aside(final).name}", flush=True)
        os.replace(partial, final)
        if keep:
            for old in complete_checkpoints(run_dir)[:-keep]:  # never one set aside as damaged
                shutil.rmtree(old)
    dist.barrier()
    return final


class CheckpointNotWritten(RuntimeError):
    """A checkpoint could not be written (a full disk, a quota, permissions): the run stops and the
    last complete checkpoint stays."""


def _not_written(step: int, partial: Path, cause: str) -> CheckpointNotWritten:
    """The error to stop on, once rank 0 has removed the unfinished folder (freeing what it took)."""
    if dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
    free = shutil.disk_usage(next(folder for folder in partial.parents if folder.exists())).free
    return CheckpointNotWritten(f"the checkpoint of step {step} could not be written to {partial.parent} ({cause}; "
                                f"{free / 2**20:,.0f} MiB free there); the last complete checkpoint is kept: free "
                                "space or fix the permissions, then pass --resume")


def _in_words(error: BaseException) -> str:
    """An error as one phrase: an OSError's own words ("No space left on device"), else its first line."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load ``path`` into the (already parallelised) model and optimizer; return its step."""
    if isinstance(optimizer, ShardedAdamW):
        optimizer.init_state()
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    masters = master_weights(model, optimizer)
    saved = checkpoint_metadata(path).state_dict_metadata
    # Hyperparameters only another optimizer keeps (torch's AdamW has amsgrad, fused, ... that
    # ShardedAdamW has not) stay as this run configured them; every tensor must be in the file.
    kept = {key: value for key, value in optimizer_state.items()
            if key.startswith("param_groups.") and f"optimizer.{key}" not in saved}
    state = {"model": {**model_state, **masters},
             "optimizer": {key: value for key, value in optimizer_state.items() if key not in kept}}
    try:
        dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafeLoadPlanner())
    except CheckpointException as error:  # e.g. an entry that is not plain data, refused by weights_only
        raise ConfigError(f"{path} could not be loaded as data ({str(error).splitlines()[0][:200]}); rename it to "
                          f"{Path(path).name}{DAMAGED} to resume from the one before") from None
    # A parameter with a master keeps its own tensor here and is then rounded from the loaded master.
    set_state_dict(model, optimizer, model_state_dict={**state["model"], **{name: model_state[name] for name in masters}},
                   optim_state_dict={**state["optimizer"], **kept}, options=OPTIONS)
    if masters:
        optimizer.parameters_from_masters()
    return checkpoint_step(path)
