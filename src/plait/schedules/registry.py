"""The pipeline schedules, one entry each: a schedule's one home.

An entry (``ScheduleSpec``) holds the schedule's generator (``plait.schedules.generators``) and what
the rest of plait reads of it instead of comparing its name: what it asks of pp, micro-batches and
chunks per rank, how many chunk activations each rank holds at its peak, how its fill and drain cost
a step in the planner's closed form, whether it splits the backward into input and weight halves and
whether it takes several chunks per rank. The layout's and the commands' choices, the planner's
search space and the tests' cases are read from here, and a name not registered is refused
everywhere. Adding a schedule is writing its generator and registering one entry
(docs/pipeline.md, "Adding a schedule").
"""

from __future__ import annotations

from collections.abc import Callable, KeysView
from dataclasses import dataclass
from enum import Enum

from plait.errors import ConfigError
from plait.schedules import generators
from plait.schedules.actions import Action, Schedule
from plait.schedules.generators import interleaved_warmup, with_transfers

# (pp, micro-batches, chunks per rank, rank) -> the rank's compute order, or what it holds at its peak
ComputeOrder = Callable[[int, int, int, int], list[Action]]
PeakHeld = Callable[[int, int, int, int], int]
# (pp, micro-batches, chunks per rank) -> the first unmet need as one actionable sentence, or None
Requirement = Callable[[int, int, int], "str | None"]


class Fill(Enum):
    """What the pipeline's fill and drain add to a step in the planner's closed form
    (``plait.plan.pipeline.estimate_step``), per stage of the p − 1 a micro-batch waits through."""

    SERIAL = "one stage works at a time: every micro-batch crosses every stage alone"
    WHOLE_PASSES = "a chunk's forward and whole backward, (F + B) / v"
    DEFERRED_WEIGHTS = "F + I − W: only input gradients travel back, deferred weight passes fill the drain"


@dataclass(frozen=True)
class ScheduleSpec:
    """One pipeline schedule: its generator and the facts of it that plait reads by descriptor."""

    name: str
    order: ComputeOrder  # each rank's compute order (plait.schedules.generators); transfers are added by rule
    in_flight: PeakHeld  # chunk activations the rank holds at its peak (tests hold it to the lists)
    fill: Fill = Fill.WHOLE_PASSES
    splits_backward: bool = False  # each backward as I (input gradient) then W (weight gradient)
    # Several chunks per rank (--virtual-stages), in Megatron's interleaved order: the order the
    # planner's per-chunk peaks (plait.facts.in_flight.held_chunk_counts) and the paired sends of a
    # stack whose sends block (generators.with_transfers) assume.
    takes_virtual_stages: bool = False
    # Micro-batches, in multiples of pp, after which each further one adds the same actions to every
    # rank (plait.plan.pipeline.play plays this many and pp more, then extends the line).
    steady_after: int = 1
    requirement: Requirement | None = None  # what it asks beyond positive sizes


_REGISTERED: dict[str, ScheduleSpec] = {}
# Every registered schedule's name in registration order; a live view, so that a choice list built
# from it when a parser is built takes a schedule registered since.
SCHEDULES: KeysView[str] = _REGISTERED.keys()


def register(schedule: ScheduleSpec) -> None:
    """Make ``schedule`` a choice everywhere: layout, commands, planner, checker and executor."""
    if schedule.name in _REGISTERED:
        raise ValueError(f"pipeline schedule {schedule.name!r} is registered already")
    _REGISTERED[schedule.name] = schedule


def unregister(name: str) -> None:
    """Take schedule ``name`` away again (a test's own schedule, once the test is done)."""
    del _REGISTERED[schedule_spec(name).name]


def schedule_spec(name: str) -> ScheduleSpec:
    """The registered schedule ``name``; a ConfigError naming the choices for any other name."""
    try:
        return _REGISTERED[name]
    except KeyError:
        raise ConfigError(f"unknown pipeline schedule {name!r}; use one of {', '.join(SCHEDULES)}") from None


def interleaving_schedules() -> str:
    """The registered schedules that take several chunks per rank, as a choice in a sentence."""
    return " or ".join(name for name, spec in _REGISTERED.items() if spec.takes_virtual_stages)


def check_virtual_stages(schedule: ScheduleSpec, virtual_stages: int) -> None:
    """Refuse more than one chunk per rank under a schedule that runs one."""
    if virtual_stages > 1 and not schedule.takes_virtual_stages:
        takers = interleaving_schedules()
        raise ConfigError(f"--virtual-stages {virtual_stages} only applies to the {takers} schedule; "
                          f"pass --schedule {takers} or drop --virtual-stages")


def validate(name: str, pp: int, microbatches: int, virtual_stages: int = 1) -> None:
    """Raise ConfigError with one actionable sentence if the schedule cannot run this way."""
    schedule = schedule_spec(name)
    for label, value in (("pp", pp), ("microbatches", microbatches), ("virtual-stages", virtual_stages)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"--{label} must be a positive integer, got {value!r}")
    check_virtual_stages(schedule, virtual_stages)
    problem = schedule.requirement(pp, microbatches, virtual_stages) if schedule.requirement else None
    if problem:
        raise ConfigError(problem)


def generate(name: str, pp: int, microbatches: int, virtual_stages: int = 1,
             sends_after_backward: bool = False) -> Schedule:
    """Every rank's action list (compute and transfers) for schedule ``name`` (``with_transfers``
    for ``sends_after_backward``: Megatron-LM's interleaved steady state, none where m = p runs every
    forward first)."""
    validate(name, pp, microbatches, virtual_stages)
    schedule = _REGISTERED[name]
    paired = sends_after_backward and schedule.takes_virtual_stages and microbatches != pp
    lists = tuple(with_transfers(schedule.order(pp, microbatches, virtual_stages, rank), rank, pp,
                                 pp * virtual_stages, paired)
                  for rank in range(pp))
    return Schedule(name, pp, virtual_stages, microbatches, lists)


def _interleaved_requirement(pp: int, microbatches: int, virtual_stages: int) -> str | None:
    if virtual_stages < 2:
        return "interleaved-1f1b needs --virtual-stages 2 or more; with 1 use --schedule 1f1b"
    if microbatches % pp:
        return (f"interleaved-1f1b needs micro-batches in multiples of pp={pp} (as Megatron-LM), "
                f"got {microbatches}; pass --microbatches {pp * -(-microbatches // pp)}")
    return None


def _zb_h1_requirement(pp: int, microbatches: int, virtual_stages: int) -> str | None:
    if microbatches < pp:
        return (f"zb-h1 needs at least pp={pp} micro-batches to fill the pipeline, got {microbatches}; "
                f"pass --microbatches {pp} or more")
    return None


def _interleaved_in_flight(p: int, m: int, v: int, rank: int) -> int:
    """Megatron's warm-up forwards plus the one before the first backward."""
    return min(interleaved_warmup(p, m, v, rank) + 1, m * v)


# In-flight peaks: naive one micro-batch; gpipe every one; 1f1b p − r (Narayanan et al. 2021); zb-h1 p,
# 1F1B's first rank's (Qi et al. 2023). Interleaving with m = p runs every forward first and zb-h1
# defers its weight passes: both settle by 2p.
register(ScheduleSpec("naive", generators.naive, lambda p, m, v, rank: 1, Fill.SERIAL))
register(ScheduleSpec("gpipe", generators.gpipe, lambda p, m, v, rank: m))
register(ScheduleSpec("1f1b", generators.one_f_one_b, lambda p, m, v, rank: min(p - rank, m)))
register(ScheduleSpec("interleaved-1f1b", generators.interleaved_one_f_one_b, _interleaved_in_flight,
                      takes_virtual_stages=True, steady_after=2, requirement=_interleaved_requirement))
register(ScheduleSpec("zb-h1", generators.zb_h1, lambda p, m, v, rank: min(p, m), Fill.DEFERRED_WEIGHTS,
                      splits_backward=True, steady_after=2, requirement=_zb_h1_requirement))
