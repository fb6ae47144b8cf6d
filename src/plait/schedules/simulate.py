"""Play a schedule's action lists under the executor's blocking rules, with costs, to get a timeline.

The blocking rules (the same ones ``plait.parallel.pipeline_executor`` follows on torch.distributed):

* a rank performs its actions strictly in list order, one at a time;
* a send never blocks: it posts the message (``isend``) and the rank moves on;
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

from collections import deque
from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Union

from plait.schedules.actions import COMPUTE_KINDS, RECV_KINDS, SEND_KINDS, Action, Kind, Schedule

CostFn = Callable[[Action], float]
Cost = Union[CostFn, Mapping[Kind, float], float]

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


# The message a transfer kind carries: messages travel on channels (sender, receiver, message).
MESSAGE = {Kind.SEND_ACTIVATION: "activation", Kind.RECV_ACTIVATION: "activation",
           Kind.SEND_GRAD: "grad", Kind.RECV_GRAD: "grad"}


def _sent_as(action: Action) -> tuple[int, int]:
    """The (chunk, micro-batch) a receive expects its sender to have named."""
    step = -1 if action.kind is Kind.RECV_ACTIVATION else 1
    return action.chunk + step, action.microbatch


def simulate(schedule: Schedule, cost: Cost = UNIT_COSTS, p2p_cost: Cost = 0.0) -> Timeline:
    """Play every rank's list; ``cost`` times compute and sends, ``p2p_cost`` is a message's flight time.

    ``cost`` is called for every action (a mapping without the send kinds makes sends free);
    a message sent by action ``a`` arrives ``p2p_cost(a)`` after the send ends.
    Raises ScheduleError naming the ranks and actions if the lists do not match or deadlock.
    """
    cost_fn, flight = as_cost_fn(cost), as_cost_fn(p2p_cost)
    lists = schedule.actions
    position = [0] * len(lists)
    clock = [0.0] * len(lists)
    spans: list[list[Span]] = [[] for _ in lists]
    channels: dict[tuple[int, int, str], deque[tuple[Action, float]]] = {}
    receives, sends, message, span = RECV_KINDS, SEND_KINDS, MESSAGE, Span  # locals: the loop runs per action
    progressed = True
    while progressed:
        progressed = False
        for rank, actions in enumerate(lists):
            at, now, played = position[rank], clock[rank], spans[rank]
            length, record = len(actions), played.append
            while at < length:
                action = actions[at]
                kind = action.kind
                if kind in receives:
                    queue = channels.get((action.peer, rank, message[kind]))
                    if not queue:
                        break
                    sent, arrival = queue.popleft()
                    if (sent.chunk, sent.microbatch) != _sent_as(action):
                        raise ScheduleError(
                            f"rank {rank} action {action} receives from rank {action.peer}, whose next "
                            f"message on that channel is {sent}; sends and receives are in different orders"
                        )
                    end = arrival if arrival > now else now
                else:
                    end = now + cost_fn(action)
                    if kind in sends:
                        channels.setdefault((rank, action.peer, message[kind]), deque()).append(
                            (action, end + flight(action)))
                record(span(action, now, end))
                now = end
                at += 1
            if at != position[rank]:
                position[rank], clock[rank] = at, now
                progressed = True
    blocked = [f"rank {r} at {lists[r][p]}" for r, p in enumerate(position) if p < len(lists[r])]
    if blocked:
        raise ScheduleError(f"schedule {schedule.name!r} deadlocks: {', '.join(blocked)} wait(s) forever")
    unreceived = [f"rank {key[0]} action {q[0][0]}" for key, q in channels.items() if q]
    if unreceived:
        raise ScheduleError(f"schedule {schedule.name!r}: {unreceived[0]} is never received")
    return Timeline(tuple(tuple(s) for s in spans))


def theoretical_bubble(schedule: Schedule) -> float:
    """The schedule's bubble fraction from its lists alone, with ``UNIT_COSTS`` and free transfers."""
    return simulate(schedule).bubble_fraction
