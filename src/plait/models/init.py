"""Seeded weight initialisation that gives every layout the same full weights, a rank at a time.

A rank never builds the whole model (``plait.parallel.materialize``): it asks for the part of each
parameter it keeps, a ``Region`` of the single-device parameter, and only that part is generated.
So a value must not depend on which part is asked for. Each random matrix is cut into blocks of
whole rows (``FILL_BLOCK_ELEMENTS`` values or one row), each drawn from its own generator seeded by
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

from plait.models.spec import FILL_BLOCK_ELEMENTS, ModelSpec

INIT_STD = 0.02
# Projections that write into the residual stream are scaled down by depth (GPT-2, Radford 2019).
RESIDUAL_PROJECTIONS = ("attention.wo.weight", "mlp.w2.weight")

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


def _normal_block(seed: int, name: str, shape: tuple[int, int], block: int, per_block: int) -> torch.Tensor:
    """Row block ``block`` of parameter ``name``'s (rows, columns) standard normal matrix: the
    matrix's last block holds only the rows it has."""
    rows, columns = shape
    generator = torch.Generator().manual_seed(block_seed(seed, name, block))
    return torch.randn(min(per_block, rows - block * per_block), columns, generator=generator)


def _normal_region(seed: int, name: str, shape: tuple[int, int], region: Region, std: float) -> torch.Tensor:
    """``region`` of parameter ``name``'s normal matrix scaled by ``std``, drawn a row block at a time:
    what it holds beside the region is one block and its scaled part (``FILL_BLOCK_ELEMENTS`` values at most each)."""
    (start, stop), (first_column, last_column) = region
    per_block = max(1, FILL_BLOCK_ELEMENTS // shape[1])
    out = torch.empty(stop - start, last_column - first_column)
    for block in range(start // per_block, -(-stop // per_block)):
        first = block * per_block
        values = _normal_block(seed, name, shape, block, per_block)
        rows = slice(max(start - first, 0), min(stop - first, per_block))
        out[rows.start + first - start:rows.stop + first - start] = values[rows, first_column:last_column] * std
    return out


def seeded_source(spec: ModelSpec, seed: int) -> WeightSource:
    """The seeded initial values: biases zero, norms one, every matrix normal (``_normal_rows``)."""

    def values(name: str, shape: tuple[int, ...], region: Region) -> torch.Tensor:
        sizes = [stop - start for start, stop in region]
        if name.endswith(".bias"):
            return torch.zeros(sizes)
        if "norm" in name:
            return torch.ones(sizes)
        return _normal_region(seed, name, shape, region, _std(spec, name))

    return values


@torch.no_grad()
def init_weights(model: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Fill every parameter of ``model`` (the full, unsharded module) with its seeded value."""
    source = seeded_source(spec, seed)
    for name, param in model.named_parameters():
        param.copy_(source(name, tuple(param.shape), whole(tuple(param.shape))).to(param.dtype))
