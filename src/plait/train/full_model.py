"""A run's newest checkpoint as one full single-device model, in this process, whatever layout wrote it.

The checkpoint's ``run.json`` names the model; torch.distributed.checkpoint reshards the saved
shards (data-, tensor- and pipeline-parallel, ZeRO) into the full tensors of the single-device
model without a process group, read through plait's safe reader (nothing in the files is run).
The fp32 masters are saved under their parameters' names, so a bf16 run loads at full precision.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch.distributed.checkpoint as dcp

from plait.errors import ConfigError
from plait.models.spec import ModelSpec
from plait.models.transformer import Transformer
from plait.train.checkpoint import RUN_FILE, SafeLoadPlanner, SafeReader, checkpoint_metadata, latest_checkpoint
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


def load_run_model(run_dir: Path) -> tuple[Transformer, Path]:
    """The full fp32 model of ``run_dir``'s newest checkpoint (in eval mode) and that checkpoint."""
    checkpoint = run_checkpoint(run_dir)
    model = Transformer(checkpoint_spec(checkpoint))
    state = model.state_dict()
    with warnings.catch_warnings():  # DCP warns that it loads without a process group, which is the point
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": state}, storage_reader=SafeReader(str(checkpoint)), planner=SafeLoadPlanner(), no_dist=True)
    model.load_state_dict(state)
    return model.eval(), checkpoint
