"""Stage split: which consecutive transformer blocks each of the pp × v stage chunks holds.

The embedding sits on chunk 0 and the final norm, output projection and loss on the last chunk.
Costs are exact FLOPs from ``plait.models.flops`` (forward + backward of one sequence); the
embedding lookup is free there, the head is not, so a balanced split gives the last chunk fewer
blocks when the vocabulary is large. Layers need not divide evenly by pp × v: every chunk just
needs at least one block, or none at either end of a split the user gives.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from plait.errors import ConfigError
from plait.models.flops import head_forward_flops, layer_flops
from plait.models.spec import ModelSpec
from plait.schedules.registry import interleaving_schedules


def chunk_costs(spec: ModelSpec, counts: Sequence[int], seq_len: int | None = None) -> tuple[int, ...]:
    """Forward + backward FLOPs per sequence of each chunk holding ``counts[i]`` blocks."""
    seq_len = spec.seq_len if seq_len is None else seq_len
    layer = layer_flops(spec, seq_len).model
    costs = [n * layer for n in counts]
    costs[-1] += 3 * head_forward_flops(spec, seq_len)
    return tuple(costs)


@functools.lru_cache(maxsize=64)
def _balanced_counts(spec: ModelSpec, chunks: int, seq_len: int | None) -> tuple[int, ...]:
    """Block counts minimising the most expensive chunk, then the spread (sum of squared costs),
    then ascending. Every block costs the same and only the last chunk adds the head, so for each
    size of the last chunk the others are best as even as they can be, smaller first; the answer
    is the best over the last chunk's sizes (remembered: a search splits one model many times)."""
    layer = layer_flops(spec, spec.seq_len if seq_len is None else seq_len).model
    head = 3 * head_forward_flops(spec, spec.seq_len if seq_len is None else seq_len)
    layers = spec.layers
    if chunks == 1:
        return (layers,)
    best = None
    for last in range(1, layers - chunks + 2):
        size, larger = divmod(layers - last, chunks - 1)
        end = last * layer + head
        option = (max((size + (larger > 0)) * layer, end),
                  (chunks - 1 - larger) * (size * layer) ** 2 + larger * ((size + 1) * layer) ** 2 + end * end,
                  (size,) * (chunks - 1 - larger) + (size + 1,) * larger + (last,))
        if best is None or option < best:
            best = option
    return best[2]


def split_problems(spec: ModelSpec, pp: int, virtual_stages: int = 1,
                   layers_per_chunk: Sequence[int] | None = None) -> list[str]:
    """Why the model's blocks cannot be cut into pp × v chunks ([] if they can): every chunk holds at
    least one block, except that a given split may leave the first chunk the embedding alone and the
    last the head alone (Megatron-Core's account-for-embedding and -loss in the pipeline split)."""
    chunks = pp * virtual_stages
    if layers_per_chunk is not None:
        counts = tuple(layers_per_chunk)
        if pp == 1 and len(counts) != chunks:
            return [f"--stage-layers gives {len(counts)} chunk sizes and --pp 1 holds {chunks} chunk(s) "
                    f"(--virtual-stages); pass --pp {len(counts)} to split the blocks over that many stages, or drop "
                    "--stage-layers"]
        if len(counts) != chunks and len(counts) % pp == 0 and len(counts) > pp:
            return [f"--stage-layers gives {len(counts)} chunk sizes, {len(counts) // pp} for each of the {pp} stages; "
                    f"pass --virtual-stages {len(counts) // pp} --schedule {interleaving_schedules()}"]
        inner = counts[1:-1] if len(counts) > 1 else counts
        if len(counts) != chunks or sum(counts) != spec.layers or min(counts, default=0) < 0 or min(inner, default=1) < 1:
            return [f"--stage-layers must give {chunks} chunk sizes (pp × virtual-stages) summing to the model's "
                    f"{spec.layers} layers, each of at least one layer (the first and last may be 0: the embedding "
                    f"or the head alone), got {','.join(map(str, counts))}"]
        return []
    if pp > spec.layers:
        return [f"--pp {pp} is larger than the model's {spec.layers} layers; each pipeline stage needs "
                f"at least one layer, so use --pp {spec.layers} or fewer"]
    if chunks > spec.layers:
        return [f"{spec.layers} layers cannot be divided into pp × virtual-stages = {chunks} chunks of at "
                f"least one layer each; use --virtual-stages {spec.layers // pp} or fewer"]
    return []


def split_layers(
    spec: ModelSpec,
    pp: int,
    virtual_stages: int = 1,
    layers_per_chunk: Sequence[int] | None = None,
    seq_len: int | None = None,
) -> tuple[range, ...]:
    """The block indices of each of the pp × v chunks, balanced by cost or as the user gave them."""
    problems = split_problems(spec, pp, virtual_stages, layers_per_chunk)
    if problems:
        raise ConfigError(problems[0])
    if layers_per_chunk is None:
        counts = _balanced_counts(spec, pp * virtual_stages, seq_len)
    else:
        counts = tuple(layers_per_chunk)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return tuple(range(start, start + n) for start, n in zip(starts, counts))
