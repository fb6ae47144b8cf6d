"""Seeded weight initialisation that gives every layout the same full weights, a rank at a time.

A rank never builds the whole model (``plait.parallel.materialize``): it asks for the part of each
parameter it keeps, a ``Region`` of the single-device parameter, and only that part is generated.
So a value must not depend on which part is asked for. Each random matrix is cut into blocks of
whole rows (``ROW_BLOCK_ELEMENTS`` values or one row), each drawn from its own generator seeded by
(seed, parameter name, block): the values do not depend on construction order, on which layers a
pipeline stage holds, on the tensor- or data-parallel slice, or on the rank. A rank generates the
row blocks its region touches, one at a time, and keeps its columns of them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import torch
from torch import nn

from plait.models.spec import ModelSpec

INIT_STD = 0.02
# Projections that write into the residual stream are scaled down by depth (GPT-2, Radford 2019).
RESIDUAL_PROJECTIONS = ("attention.wo.weight", "mlp.w2.weight")
# Values drawn from one generator: large enough that seeding costs nothing beside drawing, small
# enough that a block a rank draws and partly discards is a few MiB at most.
ROW_BLOCK_ELEMENTS = 1 << 20

# (start, stop) per dimension of the single-device parameter: the part of it a rank holds.
Region = tuple[tuple[int, int], ...]
# name, the parameter's single-device shape, the region → that region's fp32 values.
WeightSource = Callable[[str, tuple[int, ...], Region], torch.Tensor]


def whole(shape: tuple[int, ...]) -> Region:
    return tuple((0, size) for size in shape)


def block_seed(seed: int, name: str, block: int) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode()) + block * 998_244_353) % (2**63)


def _std(spec: ModelSpec, name: str) -> float:
    return INIT_STD / math.sqrt(2 * spec.layers) if name.endswith(RESIDUAL_PROJECTIONS) else INIT_STD


def _normal_rows(seed: int, name: str, columns: int, rows: tuple[int, int], std: float) -> torch.Tensor:
    """Rows ``rows`` of a (·, columns) standard normal matrix scaled by ``std``, drawn block by block."""
    per_block = max(1, ROW_BLOCK_ELEMENTS // columns)
    start, stop = rows
    parts = []
    for block in range(start // per_block, -(-stop // per_block)):
        first = block * per_block
        generator = torch.Generator().manual_seed(block_seed(seed, name, block))
        values = torch.randn(per_block, columns, generator=generator)
        parts.append(values[max(start - first, 0):min(stop - first, per_block)] * std)
    return torch.cat(parts) if parts else torch.empty(0, columns)


def seeded_source(spec: ModelSpec, seed: int) -> WeightSource:
    """The seeded initial values: biases zero, norms one, every matrix normal (``_normal_rows``)."""

    def values(name: str, shape: tuple[int, ...], region: Region) -> torch.Tensor:
        sizes = [stop - start for start, stop in region]
        if name.endswith(".bias"):
            return torch.zeros(sizes)
        if "norm" in name:
            return torch.ones(sizes)
        (rows, (first_column, last_column)) = region
        return _normal_rows(seed, name, shape[1], rows, _std(spec, name))[:, first_column:last_column]

    return values


def state_source(state: dict[str, torch.Tensor]) -> WeightSource:
    """Regions of the tensors of a whole state dict."""

    def values(name: str, shape: tuple[int, ...], region: Region) -> torch.Tensor:
        return state[name][tuple(slice(start, stop) for start, stop in region)]

    return values


@torch.no_grad()
def init_weights(model: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Fill every parameter of ``model`` (the full, unsharded module) with its seeded value."""
    source = seeded_source(spec, seed)
    for name, param in model.named_parameters():
        param.copy_(source(name, tuple(param.shape), whole(tuple(param.shape))).to(param.dtype))
