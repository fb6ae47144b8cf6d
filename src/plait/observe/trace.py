"""trace.json: a step's timeline as Chrome/Perfetto trace events, one track per pipeline rank.

Pure Python (the planner writes simulated steps in the same format). Every event carries its action
in ``args``, so ``timeline_from_trace`` reads a measured step back for ``plait explain`` to draw
beside the simulated one.
"""

from __future__ import annotations

from plait.schedules.actions import Action, Kind
from plait.schedules.simulate import Span, Timeline

TRACE_FILE = "trace.json"


def timeline_events(timeline: Timeline, compute_only: bool = False) -> list[dict]:
    """One track-name event per rank and one complete event (microseconds) per action."""
    events = []
    for rank, spans in enumerate(timeline.spans):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank, "args": {"name": f"pipeline rank {rank}"}})
        for span in spans:
            action = span.action
            if compute_only and not action.kind.is_compute:
                continue
            events.append({
                "name": str(action), "cat": action.kind.name.lower(), "ph": "X", "pid": 0, "tid": rank,
                "ts": span.start * 1e6, "dur": (span.end - span.start) * 1e6,
                "args": {"kind": action.kind.value, "chunk": action.chunk, "microbatch": action.microbatch,
                         "peer": action.peer},
            })
    return events


def timeline_from_trace(trace: dict) -> Timeline:
    """The per-action timeline in ``trace``'s events (those written by ``timeline_events``)."""
    ranks: dict[int, list[Span]] = {}
    for event in trace["traceEvents"]:
        args = event.get("args", {})
        if event.get("ph") != "X" or "kind" not in args:
            continue
        action = Action(Kind(args["kind"]), args["chunk"], args["microbatch"], args["peer"])
        start = event["ts"] / 1e6
        ranks.setdefault(event["tid"], []).append(Span(action, start, start + event["dur"] / 1e6))
    return Timeline(tuple(tuple(sorted(ranks[r], key=lambda s: s.start)) for r in sorted(ranks)))
