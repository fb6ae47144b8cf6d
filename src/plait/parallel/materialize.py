"""A rank's parameters made real, and only its own: the last step before anything reads a value.

The model is built on the meta device (``plait.train.loop.build_run``) and every parallelism that
decides what a rank keeps is applied there: tensor-parallel DTensor shards, the pipeline's pruned
stage, ZeRO-3's FSDP2 shards, bf16 parameters where ZeRO 1 and 2 keep an fp32 master. Then each
parameter is allocated on the rank's device at the size the rank holds, and filled with its part of
the single-device value from a ``WeightSource`` (the seeded initial values, or a Hugging Face
folder read slice by slice): a rank never holds, or generates, a parameter whole unless it keeps it
whole. DDP, the optimizer and the gradient buckets come after, over the real parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from plait.models.init import Region, WeightSource
from plait.models.spec import FILL_BLOCK_ELEMENTS, ModelSpec

# Parameters whose rows are the vocabulary: tensor parallelism pads them with zero rows
# (plait.facts.model_state.padded_vocab), which no source holds.
VOCABULARY_ROWS = ("tok_embeddings.weight", "output.weight")


def held_region(param: torch.Tensor) -> Region:
    """The part of the whole (single-device, padded) parameter that this rank holds of ``param``:
    its DTensor shard's offsets, or all of it for a plain tensor."""
    if not isinstance(param, DTensor):
        return tuple((0, size) for size in param.shape)
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple((start, start + size) for start, size in zip(offset, shape))


def single_device_shape(spec: ModelSpec, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` of parameter ``name`` without tensor parallelism's vocabulary padding."""
    if name in VOCABULARY_ROWS:
        return (spec.vocab, *shape[1:])
    return shape


@torch.no_grad()
def fill(param: torch.Tensor, name: str, spec: ModelSpec, source: WeightSource) -> None:
    """Write this rank's region of parameter ``name`` from ``source``; padded rows are zero."""
    local = param.to_local() if isinstance(param, DTensor) else param
    region = held_region(param)
    shape = single_device_shape(spec, name, tuple(param.shape))
    (start, stop), rest = region[0], region[1:]
    kept = max(0, min(stop, shape[0]) - start)
    local[kept:].zero_()
    step = max(1, FILL_BLOCK_ELEMENTS // max(1, math.prod(local.shape[1:])))  # a few MiB at a time, however large the weight
    for first in range(0, kept, step):
        last = min(first + step, kept)
        local[first:last].copy_(source(name, shape, ((start + first, start + last), *rest)))


def materialize(model: nn.Module, source: WeightSource, device: torch.device) -> nn.Module:
    """Allocate ``model``'s meta parameters (at the size this rank holds) on ``device`` and fill
    them from ``source``; buffers built on the host move to ``device``. Goes through
    ``Module._apply``, as ``to_empty`` does, so FSDP2 re-registers its shards."""
    model._apply(lambda t: torch.empty_like(t, device=device) if t.is_meta else t.to(device))
    for name, param in model.named_parameters():
        fill(param, name, model.spec, source)
    return model
