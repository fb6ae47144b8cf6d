"""The schedule simulator (plait.schedules) wrapped for the planner: exact play and quick estimates.

``play`` runs the schedule's real action lists through the player of ``plait.schedules.simulate``
(compiled once, ``play_compiled``; the generated lists are deadlock-free by test). Past the
warm-up every micro-batch adds the same pattern of actions to every rank, so step time and peak
activation bytes are affine in the micro-batch count m; for long schedules ``play`` plays two
short ones (p and 2p micro-batches; 2p and 3p for interleaved and zb-h1, as each schedule's
``steady_after`` says) and extends the line. Tests hold this equal to playing the full list when
stages cost the same, and within 0.5% when they do not (the steady state then repeats over a few
micro-batches rather than one). ``estimate_step`` is the closed form the search ranks thousands of layouts
with before playing the best ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from plait.facts.in_flight import peak_activation_bytes
from plait.layout import Layout
from plait.plan.costs import Boundaries, ChunkCost
from plait.schedules import Action, Kind, Schedule, ScheduleSpec, generate, schedule_spec
from plait.schedules.actions import COMPUTE_KINDS, crossed_boundary
from plait.schedules.registry import Fill
from plait.schedules.simulate import KIND_INDEX, Compiled, compile_schedule, play_compiled


@dataclass(frozen=True)
class Played:
    """A played step: time, per-rank busy compute time, per-rank peak activation bytes and per-rank
    time spent in blocking sends."""

    step_time: float
    busy: tuple[float, ...]
    peak_activations: tuple[float, ...]
    sending: tuple[float, ...]

    @property
    def bubble_fraction(self) -> float:
        # Idle: neither computing nor in a send the stack waits on. (Clamped: without stages busy
        # equals the step time, and rounding can leave it a hair over.)
        return (max(0.0, 1.0 - (sum(self.busy) + sum(self.sending)) / (len(self.busy) * self.step_time))
                if self.step_time else 0.0)


COMPUTE_ROWS = len(COMPUTE_KINDS)  # KIND_INDEX puts the compute kinds first


def cost_table(chunks: Sequence[ChunkCost], boundaries: Boundaries | None = None) -> np.ndarray:
    """Seconds of each kind (a row of ``KIND_INDEX``) on each chunk: the compute, and a send what its
    sender spends on it (chunk c's activation crosses boundary c mod pp, its gradient boundary c − 1)."""
    table = np.zeros((len(KIND_INDEX), len(chunks)))
    for kind, field in ((Kind.FORWARD, "forward"), (Kind.BACKWARD, "backward"),
                        (Kind.BACKWARD_INPUT, "backward_input"), (Kind.BACKWARD_WEIGHT, "backward_weight")):
        table[KIND_INDEX[kind]] = [getattr(c, field) for c in chunks]
    if boundaries is not None:
        pp, sends = len(boundaries.sends), np.asarray(boundaries.sends)
        for kind, gradient in ((Kind.SEND_ACTIVATION, 0), (Kind.SEND_GRAD, 1)):
            table[KIND_INDEX[kind]] = sends[crossed_boundary(np.arange(len(chunks)), gradient, pp)]
    return table


def action_costs(chunks: Sequence[ChunkCost], boundaries: Boundaries | None = None) -> Callable[[Action], float]:
    """Seconds of one action (``cost_table`` as a function, for ``simulate``)."""
    table = cost_table(chunks, boundaries).tolist()
    return lambda action: table[KIND_INDEX[action.kind]][action.chunk]


def action_flights(boundaries: Boundaries) -> Callable[[Action], float]:
    """Flight of the message a send posts (for ``simulate``)."""
    pp = len(boundaries.flights)
    return lambda action: boundaries.flights[crossed_boundary(action.chunk, action.kind is Kind.SEND_GRAD, pp)]


def play_list(schedule: Schedule | Compiled, chunks: Sequence[ChunkCost], boundaries: Boundaries,
              chunk_bytes: Sequence[float]) -> Played:
    """Step time, busy time and peak activations of the whole lists played with these costs."""
    compiled = schedule if isinstance(schedule, Compiled) else compile_schedule(schedule)
    table = cost_table(chunks, boundaries)
    flights = np.asarray(boundaries.flights)[compiled.boundaries].tolist()
    ends = play_compiled(compiled, compiled.costs(table), flights)
    per_action = [table[k, c] for k, c in zip(compiled.kinds, compiled.chunks)]
    busy = tuple(float(t[k < COMPUTE_ROWS].sum()) for t, k in zip(per_action, compiled.kinds))
    sending = tuple(float(t[k >= COMPUTE_ROWS].sum()) for t, k in zip(per_action, compiled.kinds))
    peaks = tuple(peak_activation_bytes(k, c, chunk_bytes) for k, c in zip(compiled.kinds, compiled.chunks))
    return Played(max(e[-1] for e in ends if e), busy, peaks, sending)


@functools.lru_cache(maxsize=16)
def action_lists(schedule: ScheduleSpec, pp: int, microbatches: int, virtual_stages: int,
                 sends_after_backward: bool = False) -> Compiled:
    """``generate``, compiled and remembered: a search plays the same schedule under several
    layouts' costs, and its lists on 64 ranks hold hundreds of thousands of actions (a pure
    function of these five: remembered by the registered entry, not its name, so that a schedule
    registered again under the name is generated afresh). A search plays about ten layouts, two lists
    each, several sharing a schedule: sixteen lists of a few MB each keep those."""
    return compile_schedule(generate(schedule.name, pp, microbatches, virtual_stages, sends_after_backward))


def play(layout: Layout, chunks: Sequence[ChunkCost], boundaries: Boundaries, chunk_bytes: Sequence[float],
         sends_after_backward: bool = False) -> Played:
    """Step time, busy time and peak activations of ``layout``'s schedule over its pp, virtual stages
    and micro-batches, played with these per-chunk costs (``sends_after_backward``:
    plait.schedules.generators.with_transfers)."""
    schedule = schedule_spec(layout.schedule)
    pp, virtual_stages, microbatches = layout.pp, layout.virtual_stages, layout.microbatches
    short = schedule.steady_after * pp
    longer = short + pp
    if pp == 1 or microbatches <= longer:
        return play_list(action_lists(schedule, pp, microbatches, virtual_stages, sends_after_backward), chunks,
                         boundaries, chunk_bytes)
    a = play_list(action_lists(schedule, pp, short, virtual_stages, sends_after_backward), chunks, boundaries,
                  chunk_bytes)
    b = play_list(action_lists(schedule, pp, longer, virtual_stages, sends_after_backward), chunks, boundaries,
                  chunk_bytes)
    scale = (microbatches - short) / (longer - short)

    def extend(x: float, y: float) -> float:
        return x + (y - x) * scale

    return Played(
        extend(a.step_time, b.step_time),
        tuple(extend(x, y) for x, y in zip(a.busy, b.busy)),
        tuple(extend(x, y) for x, y in zip(a.peak_activations, b.peak_activations)),
        tuple(extend(x, y) for x, y in zip(a.sending, b.sending)),
    )


class StageWork(NamedTuple):
    """Seconds a pipeline's closed form (``estimate_step``) reads, per micro-batch.

    ``mean`` and ``slowest`` are the average and the largest forward + backward seconds per
    micro-batch of one rank over all its chunks; ``fill`` is the work that cannot overlap while
    the pipeline fills and drains, per stage, as the schedule's ``Fill`` says: (F + B)/v for gpipe,
    1f1b and interleaved (Narayanan et al. 2021), F + I − W for zb-h1 (Qi et al. 2023), each with the
    stack's own cost of a chunk's two passes (``Kernels.chunk_pass_s``); ``flight`` is a boundary's
    transfer in flight.
    """

    mean: float
    slowest: float
    fill: float
    flight: float


def estimate_step(name: str, pp: int, virtual_stages: int, microbatches: int, work: StageWork) -> float:
    """Closed-form pipeline time: m times the slowest rank's work per micro-batch plus the bubble;
    naive runs one stage at a time. (The planner's scan calls it for every schedule it weighs, before
    any Layout of that schedule exists, so it takes the schedule's sizes.)"""
    m, p = microbatches, pp
    if schedule_spec(name).fill is Fill.SERIAL:
        return m * (p * work.mean + 2 * (p - 1) * work.flight)
    return m * work.slowest + (p - 1) * work.fill + 2 * (p - 1) * work.flight * virtual_stages
