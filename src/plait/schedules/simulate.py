"""Play a schedule's action lists under the executor's blocking rules, with costs, to get a timeline.

The blocking rules (the same ones ``plait.parallel.pipeline_executor`` follows on torch.distributed):

* a rank performs its actions strictly in list order, one at a time;
* a send posts the message (``isend``) and the rank moves on: the executor never waits on it; a
  cost given to a send is what a stack that does wait spends on it (the planner's
  ``Kernels.blocking_sends``);
* a receive blocks until the matching message has arrived;
* messages travel on channels ``(sender, receiver, activation|grad)``; on each channel the receiver
  takes them in the order they were sent, so the n-th receive must expect the n-th send.

Under these rules a list can only deadlock through a cycle of receives, and playing it is exact:
each action starts when its rank reaches it (and, for a receive, ends once the message arrived).
The same player proves deadlock-freedom for the checker (any costs) and times a schedule for the
planner (its own costs)::

    timeline = simulate(schedule, cost=lambda a: 1.0 if a.kind is Kind.FORWARD else 2.0)
    timeline.step_time, timeline.bubble_fraction, timeline.spans[rank]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from plait.schedules.actions import COMPUTE_KINDS, RECV_KINDS, SEND_KINDS, Action, Kind, Schedule, crossed_boundary

CostFn = Callable[[Action], float]
Cost = CostFn | Mapping[Kind, float] | float

# Unit costs used for the theoretical bubble: a forward is 1, a full backward 2 (input and weight
# gradients cost a forward each, the usual matmul count), transfers are free.
UNIT_COSTS: Mapping[Kind, float] = {
    Kind.FORWARD: 1.0,
    Kind.BACKWARD: 2.0,
    Kind.BACKWARD_INPUT: 1.0,
    Kind.BACKWARD_WEIGHT: 1.0,
}


class ScheduleError(ValueError):
    """An action list that is incomplete, unmatched, out of dependency order or deadlocks."""


class Span(NamedTuple):
    """When one action ran on its rank (a tuple: the planner plays hundreds of thousands a search)."""

    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """Per-rank spans of one pipeline step, every rank starting at time 0."""

    spans: tuple[tuple[Span, ...], ...]

    @property
    def step_time(self) -> float:
        return max((s.end for rank in self.spans for s in rank), default=0.0)

    def busy(self, rank: int) -> float:
        """Time rank ``rank`` spends computing (transfers and waiting are not busy)."""
        return sum(s.end - s.start for s in self.spans[rank] if s.action.kind in COMPUTE_KINDS)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of ``ranks × step_time``: 1 − Σ busy / (pp · step_time)."""
        total = len(self.spans) * self.step_time
        return 0.0 if total == 0 else 1.0 - sum(self.busy(r) for r in range(len(self.spans))) / total


def as_cost_fn(cost: Cost) -> CostFn:
    """Accept a callable, a per-kind mapping (missing kinds cost 0) or one number for every action."""
    if callable(cost):
        return cost
    if isinstance(cost, Mapping):
        return lambda action: float(cost.get(action.kind, 0.0))
    return lambda action: float(cost)


# Each kind's row in a cost table (``Compiled.kinds``); the compute kinds come first.
KIND_INDEX = {kind: i for i, kind in enumerate(sorted(Kind, key=lambda k: k not in COMPUTE_KINDS))}
COMPUTE = -1  # ``Compiled.messages`` of an action that neither sends nor receives


@dataclass(frozen=True)
class Compiled:
    """A schedule's lists as numbers, matched once: per rank, each action's row in a cost table
    (``KIND_INDEX``) and chunk, and its message: a receive's message number n ≥ 0, a send's as
    −2 − n, ``COMPUTE`` otherwise. A search plays the same lists under many layouts' costs."""

    kinds: tuple[np.ndarray, ...]
    chunks: tuple[np.ndarray, ...]
    messages: tuple[tuple[int, ...], ...]
    count: int  # messages
    unreceived: str | None  # the first send nothing receives, if any
    boundaries: np.ndarray  # each message's stage boundary (crossed_boundary), and 0 for the one nothing sends

    def costs(self, table: np.ndarray) -> list[list[float]]:
        """Each action's seconds from ``table[kind row, chunk]``."""
        return [table[k, c].tolist() for k, c in zip(self.kinds, self.chunks)]


def _ordinals(channels: np.ndarray) -> np.ndarray:
    """Each entry's place among the entries of its channel, in list order (``channels`` in list order)."""
    order = np.argsort(channels, kind="stable")
    grouped = channels[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    ordinal = np.empty(len(channels), np.intp)
    ordinal[order] = np.arange(len(channels)) - np.repeat(starts, np.diff(np.r_[starts, len(channels)]))
    return ordinal


def compile_schedule(schedule: Schedule) -> Compiled:
    """Number every message: on each channel the n-th receive takes the n-th send, so matching is
    a property of the lists alone. Raises ScheduleError if a receive expects another message."""
    lists, pp = schedule.actions, len(schedule.actions)
    columns = [tuple(zip(*actions)) if actions else ((), (), (), ()) for actions in lists]
    kinds = tuple(np.fromiter(map(KIND_INDEX.__getitem__, c[0]), np.intp, len(c[0])) for c in columns)
    chunks = tuple(np.array(c[1], np.intp) for c in columns)
    every = np.concatenate(kinds)
    rank = np.repeat(np.arange(pp), [len(k) for k in kinds])
    position = np.concatenate([np.arange(len(k)) for k in kinds])
    chunk = np.concatenate(chunks)
    micro = np.concatenate([np.array(c[2], np.intp) for c in columns])
    peer = np.concatenate([np.array([-1 if p is None else p for p in c[3]], np.intp) for c in columns])
    grad = np.isin(every, [KIND_INDEX[Kind.SEND_GRAD], KIND_INDEX[Kind.RECV_GRAD]])
    send = np.flatnonzero(np.isin(every, [KIND_INDEX[k] for k in SEND_KINDS]))
    recv = np.flatnonzero(np.isin(every, [KIND_INDEX[k] for k in RECV_KINDS]))
    # A channel is (sender, receiver, activation or gradient): messages travel on channels. A send's
    # number is its place in channel order, so message n is the n-th send sorted by (channel, place);
    # a receive expects its sender's chunk (one before for an activation, one after for a gradient).
    send_channel = (rank[send] * pp + peer[send]) * 2 + grad[send]
    recv_channel = (peer[recv] * pp + rank[recv]) * 2 + grad[recv]
    span = len(send) + len(recv) + 1
    send_key = send_channel * span + _ordinals(send_channel)
    number = np.argsort(send_key, kind="stable")
    sorted_keys = send_key[number]
    message = np.empty(len(send), np.intp)
    message[number] = np.arange(len(send))
    recv_key = recv_channel * span + _ordinals(recv_channel)
    found = np.searchsorted(sorted_keys, recv_key)
    matched = found < len(send)
    matched[matched] = sorted_keys[found[matched]] == recv_key[matched]
    never = len(send)  # the message a receive nothing sends waits for (the play finds it waiting forever)
    taken = np.where(matched, found, never)
    sent = send[number[np.minimum(found, max(len(send) - 1, 0))]] if len(send) else found
    expected_chunk = chunk[recv] + np.where(grad[recv], 1, -1)
    wrong = matched & ((chunk[sent] != expected_chunk) | (micro[sent] != micro[recv]))
    if wrong.any():
        first = np.flatnonzero(wrong)[0]
        receiver, at, sender = rank[recv[first]], position[recv[first]], sent[first]
        action = lists[receiver][at]
        raise ScheduleError(
            f"rank {receiver} action {action} receives from rank {action.peer}, whose next message on that "
            f"channel is {lists[rank[sender]][position[sender]]}; sends and receives are in different orders")
    codes = np.full(len(every), COMPUTE, np.intp)
    codes[send] = -2 - message
    codes[recv] = taken
    received = np.zeros(len(send), bool)
    received[taken[matched]] = True
    left = send[number[~received]] if len(send) else send
    unreceived = None
    if len(left):
        first = left.min()
        unreceived = f"rank {rank[first]} action {lists[rank[first]][position[first]]}"
    bounds = np.cumsum([0] + [len(k) for k in kinds])
    messages = tuple(tuple(codes[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:]))
    senders = send[number] if len(send) else send
    boundaries = np.append(crossed_boundary(chunk[senders], grad[senders], pp), 0)
    return Compiled(kinds, chunks, messages, never + 1, unreceived, boundaries)


def play_compiled(compiled: Compiled, costs: list[list[float]], flights: list[float]) -> list[list[float]]:
    """Each action's end time on each rank under the blocking rules (a rank's action starts when its
    previous one ends); ``costs[rank][i]`` times action i, ``flights[n]`` message n's flight.
    A rank that waits forever stops short of its list's end."""
    messages = compiled.messages
    arrival: list[float | None] = [None] * compiled.count
    ends: list[list[float]] = [[] for _ in messages]
    progressed = True
    while progressed:
        progressed = False
        for rank, mine in enumerate(messages):
            done, cost = ends[rank], costs[rank]
            at = start = len(done)
            now = done[-1] if done else 0.0
            length, record = len(mine), done.append
            while at < length:
                message = mine[at]
                if message >= 0:  # a receive: ends when its message has arrived
                    arrived = arrival[message]
                    if arrived is None:
                        break
                    if arrived > now:
                        now = arrived
                else:
                    now += cost[at]
                    if message != COMPUTE:  # a send: its message arrives one flight after it ends
                        arrival[-2 - message] = now + flights[-2 - message]
                record(now)
                at += 1
            progressed = progressed or at != start
    return ends


def simulate(schedule: Schedule, cost: Cost = UNIT_COSTS, p2p_cost: Cost = 0.0) -> Timeline:
    """Play every rank's list; ``cost`` times compute and sends, ``p2p_cost`` is a message's flight time.

    ``cost`` is called for every action (a mapping without the send kinds makes sends free);
    a message sent by action ``a`` arrives ``p2p_cost(a)`` after the send ends.
    Raises ScheduleError naming the ranks and actions if the lists do not match or deadlock.
    """
    compiled = compile_schedule(schedule)
    cost_fn, flight = as_cost_fn(cost), as_cost_fn(p2p_cost)
    lists = schedule.actions
    flights = [0.0] * compiled.count
    for actions, messages in zip(lists, compiled.messages):
        for action, message in zip(actions, messages):
            if message < COMPUTE:
                flights[-2 - message] = flight(action)
    ends = play_compiled(compiled, [[cost_fn(a) for a in actions] for actions in lists], flights)
    blocked = [f"rank {r} at {lists[r][len(e)]}" for r, e in enumerate(ends) if len(e) < len(lists[r])]
    if blocked:
        raise ScheduleError(f"schedule {schedule.name!r} deadlocks: {', '.join(blocked)} wait(s) forever")
    if compiled.unreceived:
        raise ScheduleError(f"schedule {schedule.name!r}: {compiled.unreceived} is never received")
    return Timeline(tuple(tuple(Span(a, start, end) for a, start, end in zip(actions, [0.0, *rank_ends], rank_ends))
                          for actions, rank_ends in zip(lists, ends)))
def theoretical_bubble(schedule: Schedule) -> float:
    """The schedule's bubble fraction from its lists alone, with ``UNIT_COSTS`` and free transfers."""
    return simulate(schedule).bubble_fraction
