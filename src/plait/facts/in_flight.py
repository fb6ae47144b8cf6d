"""Micro-batches each pipeline rank holds in flight, from the schedule's action lists.

The action lists are the truth (``plait.schedules.peak_in_flight`` counts them and the executor
records the same count in real runs); ``in_flight_chunks`` is their closed form, and
``held_chunk_counts`` which of a rank's chunks those are, which the planner's search uses on
thousands of layouts; tests hold both equal to the counted lists.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from plait.schedules.actions import Kind
from plait.schedules.generators import interleaved_warmup
from plait.schedules.registry import schedule_spec
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
    """Chunk activations rank ``rank`` holds at its peak: the schedule's own closed form
    (``ScheduleSpec.in_flight``), which tests hold equal to counting over the generated lists."""
    return schedule_spec(name).in_flight(pp, microbatches, virtual_stages, rank)


def peak_microbatches(pp: int, virtual_stages: int, microbatches: int) -> int:
    """The micro-batch count whose peaks a schedule's repeat: interleaving's from 2p on (below,
    m = p runs all forwards first); with one chunk a rank, the count itself."""
    return min(microbatches, 2 * pp) if virtual_stages > 1 else microbatches


def held_chunk_counts(name: str, pp: int, virtual_stages: int, microbatches: int, rank: int) -> tuple[tuple[int, ...], ...]:
    """How many activations of each of its chunks (local chunk j is chunk rank + j·pp) rank ``rank``
    holds at each of its peaks, those no other peak holds as many of every chunk: the most bytes it
    holds for any chunk sizes is the largest of these counts weighed by them.

    With one chunk a rank that is ``in_flight_chunks``. With interleaving, in Megatron's order
    (plait.schedules.generators), the warm-up's forwards and then each forward before its paired
    backward end a peak: the warm-up holds the first chunks most, later peaks more of the last, whose
    forward carries the head; they are counted at ``peak_microbatches``."""
    if virtual_stages == 1:
        return ((in_flight_chunks(name, pp, 1, microbatches, rank),),)
    p, v = pp, virtual_stages
    counted = peak_microbatches(p, v, microbatches)
    total = counted * v
    forwards, backwards = _chunks_run(p, v, total)
    warmup = interleaved_warmup(p, counted, v, rank)
    rows = forwards[warmup + 1:] - backwards[:total - warmup] if warmup < total else forwards[total:]
    # (distinct rows sorted, as numpy's unique gives them, at a fraction of its cost on small arrays)
    peaks = np.array(sorted(set(map(tuple, rows.tolist()))), dtype=np.int64).reshape(-1, v)
    covered = (peaks[:, None, :] <= peaks[None, :, :]).all(axis=2).sum(axis=1) > 1  # by another, distinct row
    return tuple(map(tuple, peaks[~covered].tolist()))


@functools.lru_cache(maxsize=256)
def _chunks_run(p: int, v: int, total: int) -> tuple[np.ndarray, np.ndarray]:
    """How many of each chunk's forwards, and of each chunk's backwards, the first i of ``total`` have
    run, row i, in Megatron's interleaved order: the k-th forward's chunk is k // p mod v, the k-th
    backward's v − 1 − that. Every rank of a schedule reads the same rows (remembered: the search asks
    for each rank it examines)."""
    local = np.arange(total) // p % v
    one_hot = np.eye(v, dtype=np.int64)
    forwards = np.vstack([np.zeros(v, np.int64), np.cumsum(one_hot[local], axis=0)])
    backwards = np.vstack([np.zeros(v, np.int64), np.cumsum(one_hot[v - 1 - local], axis=0)])
    forwards.flags.writeable = backwards.flags.writeable = False  # shared by every caller
    return forwards, backwards
