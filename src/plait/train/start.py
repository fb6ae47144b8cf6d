"""What ``plait train`` settles before the launcher's heavy imports: whether torchrun started this
process, the default run directory, and the start-up line printed at once (the layout, the world
size, the device and the run directory), seconds before the first rank is up."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from plait.config import RunConfig


def inside_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def default_run_dir() -> str:
    return str(Path("runs") / time.strftime("%Y%m%d-%H%M%S"))


def device_text(world: int) -> str:
    """The start-up line's devices: ``world`` GPUs on NCCL where CUDA is, else CPU processes on gloo."""
    import torch  # already loaded by the device's default precision, unless --precision was given

    return f"{world} GPU(s), NCCL" if torch.cuda.is_available() else f"{world} CPU process(es), gloo"


def announce(config: RunConfig) -> RunConfig:
    """Print the start-up line (not inside torchrun, where the launcher spoke already) and return the
    config with its run directory fixed (``runs/<time>`` unless given; --resume must name one)."""
    if inside_torchrun():
        return config
    if config.train.run_dir is None:
        if config.train.resume:
            return config  # the launcher refuses it in one line
        config = replace(config, train=replace(config.train, run_dir=default_run_dir()))
    device = device_text(config.layout.world_size)
    print(f"plait: training {config.model_name or 'a custom model'} under {config.layout.describe()} on {device}, "
          f"{config.train.precision}; files in {config.train.run_dir}/", flush=True)
    return config
