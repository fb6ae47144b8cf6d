"""Which blocks rerun their forward in backward (``--recompute``, ``--recompute-layers``).

One answer for the engine (``plait.parallel.recompute`` wraps these blocks), the facts (activation
bytes, collectives) and the planner (memory and time per chunk). Under ``--recompute-layers N``
the first N blocks of each pipeline chunk recompute fully and the others keep everything, as
Megatron-LM's block method does per chunk: the chunk's inputs are what any schedule keeps
longest, and a chunk of n blocks then holds N block inputs and n − N blocks' full activations.

Under ``--recompute op`` (torchtitan's per-operation selective checkpointing) every block keeps the
outputs of every second weight matmul its forward runs, the first among them
(``plait.models.flops.kept_linears``), and recomputes the others in backward.
"""

from __future__ import annotations

from collections import Counter

from plait.layout import Layout
from plait.models.spec import ModelSpec
from plait.schedules.split import split_layers


def chunk_recompute(layout: Layout, blocks: int) -> tuple[tuple[str, int], ...]:
    """(mode, blocks) of one chunk holding ``blocks`` blocks, first to last (no mode with none)."""
    if layout.recompute_layers is None:
        return ((layout.recompute, blocks),)
    full = min(layout.recompute_layers, blocks)
    return tuple((mode, n) for mode, n in (("full", full), ("none", blocks - full)) if n)


def block_recompute(spec: ModelSpec, layout: Layout) -> tuple[str, ...]:
    """Each block's mode, first block to last, over the chunks the stage split cuts."""
    chunks = split_layers(spec, layout.pp, layout.virtual_stages, layout.stage_layers)
    return tuple(mode for chunk in chunks for mode, n in chunk_recompute(layout, len(chunk)) for _ in range(n))


def rank_recompute(spec: ModelSpec, layout: Layout, pp_rank: int) -> Counter:
    """Blocks of each mode that pipeline rank ``pp_rank`` holds (its chunks are pp_rank, pp_rank + pp, ...)."""
    chunks = split_layers(spec, layout.pp, layout.virtual_stages, layout.stage_layers)
    held = Counter()
    for chunk in chunks[pp_rank::layout.pp]:
        for mode, n in chunk_recompute(layout, len(chunk)):
            held[mode] += n
    return held
