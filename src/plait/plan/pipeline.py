"""The schedule simulator (plait.schedules) wrapped for the planner: exact play and quick estimates.

``play`` runs the schedule's real action lists through ``plait.schedules.simulate``. Past the
warm-up every micro-batch adds the same pattern of actions to every rank, so step time and peak
activation bytes are affine in the micro-batch count m; for long schedules ``play`` plays two
short ones (p and 2p micro-batches; 2p and 3p for interleaved and zb-h1) and extends the line. Tests hold this equal to playing the
full list when stages cost the same, and within 0.5% when they do not (the steady state then
repeats over a few micro-batches rather than one). ``estimate`` is the closed form the search ranks thousands of layouts with before
playing the best ones.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

from plait.facts.in_flight import peak_activation_bytes
from plait.plan.costs import ChunkCost
from plait.schedules import Action, Kind, Schedule, generate, simulate


@dataclass(frozen=True)
class Played:
    """A played step: time, per-rank busy compute time and per-rank peak activation bytes."""

    step_time: float
    busy: tuple[float, ...]
    peak_activations: tuple[float, ...]

    @property
    def bubble_fraction(self) -> float:
        return 1.0 - sum(self.busy) / (len(self.busy) * self.step_time) if self.step_time else 0.0


def action_costs(chunks: Sequence[ChunkCost]) -> Callable[[Action], float]:
    """Seconds of one action: compute by kind, transfers free on the sender (flight time apart).
    A table by kind, then chunk: the search plays lists of hundreds of thousands of actions."""
    table = {
        Kind.FORWARD: [c.forward for c in chunks], Kind.BACKWARD: [c.backward for c in chunks],
        Kind.BACKWARD_INPUT: [c.backward_input for c in chunks], Kind.BACKWARD_WEIGHT: [c.backward_weight for c in chunks],
    }

    def cost(action: Action) -> float:
        by_chunk = table.get(action.kind)
        return by_chunk[action.chunk] if by_chunk is not None else 0.0

    return cost


def play_list(schedule: Schedule, chunks: Sequence[ChunkCost], flight: float, chunk_bytes: Sequence[float]) -> Played:
    timeline = simulate(schedule, action_costs(chunks), lambda a: flight)
    peaks = tuple(
        peak_activation_bytes(schedule.actions[r], {c: chunk_bytes[c] for c in schedule.chunks_of(r)})
        for r in range(schedule.pp)
    )
    return Played(timeline.step_time, tuple(timeline.busy(r) for r in range(schedule.pp)), peaks)


@functools.lru_cache(maxsize=16)
def action_lists(name: str, pp: int, microbatches: int, virtual_stages: int) -> Schedule:
    """``generate``, remembered: a search plays the same schedule under several layouts' costs, and
    its lists on 64 ranks hold hundreds of thousands of actions (a pure function of these four). A
    search plays about ten layouts, two lists each, several sharing a schedule: sixteen lists of a
    few MB each keep those."""
    return generate(name, pp, microbatches, virtual_stages)


def play(
    name: str, pp: int, virtual_stages: int, microbatches: int,
    chunks: Sequence[ChunkCost], flight: float, chunk_bytes: Sequence[float],
) -> Played:
    """Step time, busy time and peak activations of ``name`` played with these per-chunk costs."""
    # Interleaving with m = p runs all forwards first and zb-h1 defers weights: both settle by 2p.
    short = 2 * pp if name in ("interleaved-1f1b", "zb-h1") else pp
    longer = short + pp
    if pp == 1 or microbatches <= longer:
        return play_list(action_lists(name, pp, microbatches, virtual_stages), chunks, flight, chunk_bytes)
    a = play_list(action_lists(name, pp, short, virtual_stages), chunks, flight, chunk_bytes)
    b = play_list(action_lists(name, pp, longer, virtual_stages), chunks, flight, chunk_bytes)
    scale = (microbatches - short) / (longer - short)

    def extend(x: float, y: float) -> float:
        return x + (y - x) * scale

    return Played(
        extend(a.step_time, b.step_time),
        tuple(extend(x, y) for x, y in zip(a.busy, b.busy)),
        tuple(extend(x, y) for x, y in zip(a.peak_activations, b.peak_activations)),
    )


def estimate_step(name: str, pp: int, virtual_stages: int, microbatches: int,
                  mean: float, slowest: float, fill: float, flight: float) -> float:
    """Closed-form pipeline time: m times the slowest rank's work per micro-batch plus the bubble.

    ``mean`` and ``slowest`` are the average and the largest forward + backward seconds per
    micro-batch of one rank over all its chunks; ``fill`` is the work that cannot overlap while
    the pipeline fills and drains, per stage: (F + B)/v for gpipe, 1f1b and interleaved
    (Narayanan et al. 2021), F + I − W for zb-h1 (Qi et al. 2023); naive runs one stage at a time.
    """
    m, p = microbatches, pp
    if name == "naive":
        return m * (p * mean + 2 * (p - 1) * flight)
    return m * slowest + (p - 1) * fill + 2 * (p - 1) * flight * virtual_stages
