"""Micro-batches each pipeline rank holds in flight, from the schedule's action lists.

The action lists are the truth (``plait.schedules.peak_in_flight`` counts them and the executor
records the same count in real runs); ``in_flight_chunks`` is their closed form, which the
planner's search uses on thousands of layouts, and tests hold it equal to the counted lists.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from plait.schedules.actions import Action, Kind


def peak_activation_bytes(actions: Iterable[Action], chunk_bytes: Mapping[int, float]) -> float:
    """Most activation bytes a rank holds at once while it plays its action list.

    A forward of chunk c stores ``chunk_bytes[c]``; the full backward, or in zero-bubble
    schedules the weight-gradient backward (which still reads the layer inputs), frees them.
    """
    held = peak = 0.0
    forward, freeing = Kind.FORWARD, (Kind.BACKWARD, Kind.BACKWARD_WEIGHT)
    for action in actions:
        kind = action.kind
        if kind is forward:
            held += chunk_bytes[action.chunk]
            if held > peak:
                peak = held
        elif kind in freeing:
            held -= chunk_bytes[action.chunk]
    return peak


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
