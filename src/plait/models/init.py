"""Seeded weight initialisation that gives every layout the same full weights.

Each parameter draws from its own generator, seeded by (seed, parameter name), so the values do
not depend on construction order, on which layers a pipeline stage holds, or on the rank.
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn

from plait.models.spec import ModelSpec

INIT_STD = 0.02
# Projections that write into the residual stream are scaled down by depth (GPT-2, Radford 2019).
RESIDUAL_PROJECTIONS = ("attention.wo.weight", "mlp.w2.weight")


def parameter_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def initial_value(spec: ModelSpec, name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """The full fp32 initial value of parameter ``name`` of the single-device model."""
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if "norm" in name:
        return torch.ones(shape)
    std = INIT_STD / math.sqrt(2 * spec.layers) if name.endswith(RESIDUAL_PROJECTIONS) else INIT_STD
    generator = torch.Generator().manual_seed(parameter_seed(seed, name))
    return torch.randn(shape, generator=generator) * std


@torch.no_grad()
def init_weights(model: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Fill every parameter of ``model`` (the full, unsharded module) with its seeded value."""
    for name, param in model.named_parameters():
        param.copy_(initial_value(spec, name, param.shape, seed).to(param.dtype))
