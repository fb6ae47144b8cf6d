"""Checkpoints through torch.distributed.checkpoint, so any layout can load any other's.

A checkpoint is written to ``checkpoints/step_NNNNNNN.partial`` and renamed to
``step_NNNNNNN`` only after every rank has finished, so a crash mid-save never replaces or
corrupts the last good checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from plait.parallel.sharded_adamw import master_weights

CHECKPOINT_DIR = "checkpoints"
PARTIAL = ".partial"
STEP_FILE = "step.json"
# Optimizer state keyed per parameter name (as torchtitan does): pipeline stages hold different
# parameters, so whole param_groups saved by one rank would not fit another's.
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir``, or None."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return None
    complete = sorted(p for p in root.glob("step_*") if not p.name.endswith(PARTIAL) and (p / STEP_FILE).exists())
    return complete[-1] if complete else None


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    """Save the state after ``step`` optimizer steps; collective over all ranks."""
    final = checkpoint_root(run_dir) / f"step_{step:07d}"
    partial = final.with_name(final.name + PARTIAL)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    # The fp32 masters stand for their bf16 parameters, so every layout resumes at full precision.
    model_state.update(master_weights(model, optimizer))
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial))
    dist.barrier()
    if dist.get_rank() == 0:
        (partial / STEP_FILE).write_text(json.dumps({"step": step}) + "\n")
        os.replace(partial, final)
    dist.barrier()
    return final


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load ``path`` into the (already parallelised) model and optimizer; return its step."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    masters = master_weights(model, optimizer)
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    # Hyperparameters only another optimizer keeps (torch's AdamW has amsgrad, fused, ... that
    # ShardedAdamW has not) stay as this run configured them; every tensor must be in the file.
    kept = {key: value for key, value in optimizer_state.items()
            if key.startswith("param_groups.") and f"optimizer.{key}" not in saved}
    state = {"model": {**model_state, **masters},
             "optimizer": {key: value for key, value in optimizer_state.items() if key not in kept}}
    dcp.load(state, checkpoint_id=str(path))
    # A parameter with a master keeps its own tensor here and is then rounded from the loaded master.
    set_state_dict(model, optimizer, model_state_dict={**state["model"], **{name: model_state[name] for name in masters}},
                   optim_state_dict={**state["optimizer"], **kept}, options=OPTIONS)
    if masters:
        optimizer.parameters_from_masters()
    return json.loads((Path(path) / STEP_FILE).read_text())["step"]
