"""Micro-batches each pipeline rank holds in flight, from the schedule's action lists.

The action lists are the truth (``plait.schedules.peak_in_flight`` counts them and the executor
records the same count in real runs); ``in_flight_chunks`` is their closed form, which the
planner's search uses on thousands of layouts, and tests hold it equal to the counted lists.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from plait.schedules.actions import Kind
from plait.schedules.simulate import KIND_INDEX


def peak_activation_bytes(kinds: np.ndarray, chunks: np.ndarray, chunk_bytes: Sequence[float]) -> float:
    """Most activation bytes a rank holds at once while it plays its action list, given as each
    action's kind row (``plait.schedules.simulate.KIND_INDEX``) and chunk.

    A forward of chunk c stores ``chunk_bytes[c]``; the full backward, or in zero-bubble
    schedules the weight-gradient backward (which still reads the layer inputs), frees them.
    """
    if not len(kinds):
        return 0.0
    held = np.zeros((len(KIND_INDEX), len(chunk_bytes)))
    held[KIND_INDEX[Kind.FORWARD]] = chunk_bytes
    held[KIND_INDEX[Kind.BACKWARD]] = held[KIND_INDEX[Kind.BACKWARD_WEIGHT]] = np.negative(chunk_bytes)
    return max(0.0, float(np.cumsum(held[kinds, chunks]).max()))


def in_flight_chunks(name: str, pp: int, virtual_stages: int, microbatches: int, rank: int) -> int:
    """Chunk activations rank ``rank`` holds at its peak, from each generator's documented warm-up.

    gpipe holds every micro-batch; naive one; 1f1b p − r (Narayanan et al. 2021); zb-h1 p
    (Qi et al. 2023); interleaved Megatron's warm-up 2(p − r − 1) + (v − 1)p plus one.
    Tests hold these equal to counting over the generated lists.
    """
    p, m, v = pp, microbatches, virtual_stages
    if name == "gpipe":
        return m
    if name == "naive":
        return 1
    if name == "1f1b":
        return min(p - rank, m)
    if name == "zb-h1":
        return min(p, m)
    total = m * v
    return total if m == p else min(2 * (p - rank - 1) + (v - 1) * p + 1, total)
