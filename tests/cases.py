"""Functions the worker pool runs on every rank (module level, so they pickle by name)."""

from __future__ import annotations

from pathlib import Path

import torch

from plait.config import RunConfig
from plait.topology import build_topology
from plait.train.loop import train


def train_losses(config: RunConfig, run_dir: str | None = None) -> list[float]:
    """Per-step global losses of ``config`` on this rank's share of the world."""
    topology = build_topology(config.layout, torch.device("cpu"))
    return train(config, topology, Path(run_dir) if run_dir else None).losses


def run_config(model: str = "tiny", steps: int = 10, global_batch: int = 8, seq_len: int = 64, **layout) -> RunConfig:
    """A small validated config: ``layout`` holds Layout fields (dp=2, microbatches=2, ...)."""
    from plait.config import TrainSpec, validate_run
    from plait.layout import Layout
    from plait.models.spec import model_spec

    config = RunConfig(
        model=model_spec(model, seq_len=seq_len),
        layout=Layout(**layout),
        train=TrainSpec(steps=steps, global_batch=global_batch, warmup_steps=2),
        model_name=model,
    )
    validate_run(config)
    return config
