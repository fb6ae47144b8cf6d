"""Prove an action list runnable: complete, in dependency order, matched and deadlock-free.

``check(schedule)`` raises ``ScheduleError`` naming the rank and the action at the first fault,
and otherwise returns each rank's peak number of in-flight activations. Dependencies across ranks
are proved through the transfers: a compute that consumes another rank's output must follow its
receive, a send must follow the compute that produced it, and playing the lists
(``plait.schedules.simulate``) proves every receive meets its send in order and that no cycle of
receives blocks forever.
"""

from __future__ import annotations

from plait.schedules.actions import Action, Kind, Schedule
from plait.schedules.simulate import ScheduleError, simulate

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT


def _fail(rank: int, action: Action | None, problem: str) -> ScheduleError:
    where = f"rank {rank}" + (f" action {action}" if action is not None else "")
    return ScheduleError(f"{where}: {problem}")


def _prerequisites(action: Action, schedule: Schedule, rank: int) -> list[tuple[Kind, int]]:
    """(kind, chunk) that must come earlier in the same rank's list, for the same micro-batch."""
    c, last = action.chunk, schedule.num_chunks - 1
    local_prev = c > 0 and schedule.rank_of(c - 1) == rank
    local_next = c < last and schedule.rank_of(c + 1) == rank
    kind = action.kind
    if kind is F:
        return [(F, c - 1)] if local_prev else ([(Kind.RECV_ACTIVATION, c)] if c > 0 else [])
    if kind in (B, I):
        upstream = [(B, c + 1)] if local_next else ([(Kind.RECV_GRAD, c)] if c < last else [])
        return [(F, c)] + upstream
    if kind is W:
        return [(I, c)]
    if kind is Kind.SEND_ACTIVATION:
        return [(F, c)]
    if kind is Kind.SEND_GRAD:
        return [(B, c)]
    return []


def _expected_peer(action: Action, schedule: Schedule) -> int | None:
    """The rank a transfer must name, or None if the neighbouring chunk is local / absent."""
    step = 1 if action.kind in (Kind.SEND_ACTIVATION, Kind.RECV_GRAD) else -1
    neighbour = action.chunk + step
    if not 0 <= neighbour < schedule.num_chunks:
        return None
    peer = schedule.rank_of(neighbour)
    return None if peer == schedule.rank_of(action.chunk) else peer


def _check_rank(schedule: Schedule, rank: int) -> None:
    seen: set[tuple[Kind, int, int]] = set()
    for action in schedule.actions[rank]:
        c, mb = action.chunk, action.microbatch
        if not (0 <= c < schedule.num_chunks and 0 <= mb < schedule.microbatches):
            raise _fail(rank, action, f"chunk or micro-batch out of range (chunks 0..{schedule.num_chunks - 1}, "
                                      f"micro-batches 0..{schedule.microbatches - 1})")
        if schedule.rank_of(c) != rank:
            raise _fail(rank, action, f"chunk {c} lives on rank {schedule.rank_of(c)}")
        if not action.kind.is_compute and action.peer != _expected_peer(action, schedule):
            raise _fail(rank, action, f"transfer must name peer rank {_expected_peer(action, schedule)}")
        key = (action.kind, c, mb)
        if key in seen:
            raise _fail(rank, action, "appears twice")
        for need, chunk in _prerequisites(action, schedule, rank):
            if need is B:  # a full backward or an input-gradient backward both produce the gradient
                done = (B, chunk, mb) in seen or (I, chunk, mb) in seen
            else:
                done = (need, chunk, mb) in seen
            if not done:
                raise _fail(rank, action, f"comes before {Action(need, chunk, mb)} it depends on")
        seen.add(key)
    for c in schedule.chunks_of(rank):
        for mb in range(schedule.microbatches):
            if (F, c, mb) not in seen:
                raise _fail(rank, None, f"missing the forward {Action(F, c, mb)}")
            full, split = (B, c, mb) in seen, ((I, c, mb) in seen, (W, c, mb) in seen)
            if full == any(split) or (not full and not all(split)):
                raise _fail(rank, None, f"needs exactly one of {Action(B, c, mb)} or both "
                                        f"{Action(I, c, mb)} and {Action(W, c, mb)}")


def peak_in_flight(schedule: Schedule) -> tuple[int, ...]:
    """Per rank, the most (chunk, micro-batch) activations held at once: from F until B or W.

    With one chunk per rank this is micro-batches; with v chunks each counts 1/v of the rank's
    layers. A weight-gradient backward still needs the layer inputs, so I does not release them.
    """
    peaks = []
    for actions in schedule.actions:
        held = peak = 0
        for action in actions:
            if action.kind is F:
                held += 1
                peak = max(peak, held)
            elif action.kind in (B, W):
                held -= 1
        peaks.append(peak)
    return tuple(peaks)


def check(schedule: Schedule) -> tuple[int, ...]:
    """Raise ScheduleError at the first fault; return each rank's peak in-flight activations."""
    if len(schedule.actions) != schedule.pp:
        raise ScheduleError(f"schedule {schedule.name!r} has {len(schedule.actions)} rank lists for pp={schedule.pp}")
    for rank in range(schedule.pp):
        _check_rank(schedule, rank)
    simulate(schedule)
    return peak_in_flight(schedule)
