"""Functions the worker pool runs on every rank for the divergence tests (module level, so they pickle):
training with a gradient spike injected into one block at one step."""

from __future__ import annotations

from pathlib import Path

import torch

import plait.train.loop as loop
from plait.config import RunConfig
from plait.parallel.data_parallel.sharded_adamw import gradients_by_parameter
from plait.topology import build_topology

SPIKE = 1e4  # what the injected step's block gradients are multiplied by


def _spiking(measure, step: int, block: int, factor: float):
    """``gradient_norm`` (the first to read a step's finished gradients, once a step) that first
    multiplies block ``block``'s gradients by ``factor`` at ``step``."""
    calls = iter(range(10**9))

    def measure_with_spike(model, optimizer, topology, reduction):
        if next(calls) == step:
            names = {param: name for name, param in model.named_parameters()}
            for param, grad in gradients_by_parameter(optimizer).items():
                if f"layers.{block}." in names[param]:
                    grad.mul_(factor)
        return measure(model, optimizer, topology, reduction)

    return measure_with_spike


def train_with_a_spike(config: RunConfig, run_dir: str, step: int, block: int, factor: float = SPIKE) -> list[int] | str:
    """Train ``config`` with block ``block``'s gradients multiplied by ``factor`` at ``step`` (the run
    starts at step 0): the steps whose update this rank skipped, or why the run stopped."""
    measure = loop.gradient_norm
    loop.gradient_norm = _spiking(measure, step, block, factor)
    try:
        return loop.train(config, build_topology(config.layout, torch.device("cpu")), Path(run_dir)).skipped_steps
    except loop.NonFiniteLoss as error:
        return str(error)
    finally:
        loop.gradient_norm = measure
