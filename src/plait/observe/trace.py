"""A pipeline step's timeline as Chrome/Perfetto trace events, one track per pipeline rank.

Pure Python: a simulated step (``simulated_trace``) is written in this format; a run's trace.json
(``plait.observe.rank_trace``) carries the same arguments on its pipeline actions. Every event carries its action
in ``args``, so ``timeline_from_trace`` reads a measured step back for ``plait explain`` to draw
beside the simulated one, and ``traced_step_volumes`` a rank's bytes per group and op.
"""

from __future__ import annotations

from collections.abc import Sequence

from plait.layout import Layout
from plait.schedules.actions import Action, Kind
from plait.schedules.simulate import Span, Timeline

TRACE_FILE = "trace.json"


def timeline_events(timeline: Timeline, busy_only: bool = False) -> list[dict]:
    """One track-name event per rank and one complete event (microseconds) per action; with
    ``busy_only`` only the actions that keep the rank busy (compute, and sends a stack waits on)."""
    events = []
    for rank, spans in enumerate(timeline.spans):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank, "args": {"name": f"pipeline rank {rank}"}})
        for span in spans:
            action = span.action
            if busy_only and not (action.kind.is_compute or action.kind.is_send and span.end > span.start):
                continue
            events.append({
                "name": str(action), "cat": action.kind.name.lower(), "ph": "X", "pid": 0, "tid": rank,
                "ts": span.start * 1e6, "dur": (span.end - span.start) * 1e6,
                "args": {"kind": action.kind.value, "chunk": action.chunk, "microbatch": action.microbatch,
                         "peer": action.peer},
            })
    return events


def simulated_trace(timeline: Timeline, flush: Sequence[Sequence[tuple[str, float]]], layout: Layout) -> dict:
    """Chrome trace events (microseconds) of one simulated step of ``layout``: each rank's busy
    actions, then from the step's end the named spans that follow its flush
    (``plait.plan.simulated_step.flush_spans``)."""
    events = timeline_events(timeline, busy_only=True)
    for rank, spans in enumerate(flush):
        start = timeline.step_time
        for name, seconds in spans:
            events.append({"name": name, "cat": "flush", "ph": "X", "pid": 0, "tid": rank, "ts": start * 1e6,
                           "dur": seconds * 1e6})
            start += seconds
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"layout": layout.to_dict(), "simulated": True}}


def timeline_from_trace(trace: dict) -> Timeline:
    """The per-action timeline in ``trace``'s events: those ``timeline_events`` writes (one track per
    pipeline rank), or in a run's trace.json the last traced step of one rank per pipeline stage,
    each rank's spans from the step's first action."""
    actions = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "kind" in e.get("args", {})]
    if any("pp_rank" in e["args"] for e in actions):
        last = max(e["args"]["step"] for e in actions if "pp_rank" in e["args"])
        actions = [e for e in actions if e["args"].get("pp_rank") is not None and e["args"]["step"] == last]
    origin = min((e["ts"] for e in actions), default=0.0)
    ranks: dict[int, list[Span]] = {}
    for event in actions:
        args = event["args"]
        action = Action(Kind(args["kind"]), args["chunk"], args["microbatch"], args["peer"])
        start = (event["ts"] - origin) / 1e6
        ranks.setdefault(args.get("pp_rank", event["tid"]), []).append(Span(action, start, start + event["dur"] / 1e6))
    return Timeline(tuple(tuple(sorted(ranks[r], key=lambda s: s.start)) for r in sorted(ranks)))


def traced_step_volumes(trace: dict, rank: int) -> dict[tuple[str, str], int]:
    """{(group, op): bytes} that ``rank`` handed its collectives and transfers in the last step a run's
    trace.json holds."""
    issued = [e for e in trace["traceEvents"] if e.get("cat") == "collective" and e["ph"] == "b" and e["pid"] == rank]
    last = max((e["args"]["step"] for e in issued), default=None)
    volumes: dict[tuple[str, str], int] = {}
    for event in issued:
        if event["args"]["step"] == last:
            key = (event["args"]["group"], event["args"]["op"])
            volumes[key] = volumes.get(key, 0) + event["args"]["bytes"]
    return volumes
