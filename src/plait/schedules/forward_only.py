"""A schedule's forward pass alone, for evaluation: each rank's forwards and activation transfers, in
the schedule's own order, with every backward action and gradient transfer left out.

Dropping backward work removes waits and adds none: every receive left still follows the same
sends, so a deadlock-free schedule stays deadlock-free (``plait.schedules.simulate`` plays it).
"""

from __future__ import annotations

from dataclasses import replace

from plait.schedules.actions import Kind, Schedule

FORWARD_KINDS = frozenset({Kind.FORWARD, Kind.SEND_ACTIVATION, Kind.RECV_ACTIVATION})


def forward_only(schedule: Schedule) -> Schedule:
    return replace(schedule, name=f"{schedule.name} (forward only)",
                   actions=tuple(tuple(a for a in actions if a.kind in FORWARD_KINDS) for actions in schedule.actions))
