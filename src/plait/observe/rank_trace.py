"""trace.json for every layout: the traced steps of every rank as Chrome/Perfetto trace events.

One process track per rank, named by its coordinates (``dp1·tp0·pp1``), holding a ``compute`` thread
(forward, backward, gradient sync and optimizer spans, or the pipeline's actions), a ``waiting``
thread (each wait, named by the group and op it waited for) and every collective and
point-to-point transfer as its own async slice from issue to completion, with group, op and bytes
in its args. A flow joins each send to the receive that matched it. Traced steps are laid one after
the other, each rank's spans from its own start of the step (ranks on different hosts share no
clock). Pipeline actions carry ``kind``, ``chunk``, ``microbatch``, ``peer`` and ``pp_rank``, so
``plait.observe.trace.timeline_from_trace`` reads the last traced step back for ``plait explain``.
"""

from __future__ import annotations

from collections import defaultdict

STEP_GAP_S = 1e-3
COMPUTE, WAITING = 0, 1


def _us(seconds: float) -> float:
    return seconds * 1e6


def _step_offsets(ranks: list[dict]) -> dict[int, float]:
    longest: dict[int, float] = defaultdict(float)
    for rank in ranks:
        for record in rank["steps"]:
            longest[record["step"]] = max(longest[record["step"]], record["duration"])
    offsets, at = {}, 0.0
    for step in sorted(longest):
        offsets[step], at = at, at + longest[step] + STEP_GAP_S
    return offsets


def _pipeline_representative(rank: dict) -> bool:
    """One rank per pipeline stage carries the actions ``timeline_from_trace`` reads."""
    return all(rank["coordinates"][dim] == 0 for dim in ("dp", "cp", "tp"))


def rank_events(ranks: list[dict]) -> list[dict]:
    """Every rank's traced steps as trace events (microseconds)."""
    offsets = _step_offsets(ranks)
    events: list[dict] = []
    sends: dict[tuple[int, int, int], list[tuple[float, int]]] = defaultdict(list)
    receives: dict[tuple[int, int, int], list[tuple[float, int]]] = defaultdict(list)
    for rank in ranks:
        pid = rank["rank"]
        events += [
            {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": rank["name"]}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": COMPUTE, "args": {"name": "compute"}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": WAITING, "args": {"name": "waiting"}},
        ]
        for record in rank["steps"]:
            offset, step = offsets[record["step"]], record["step"]
            for span in record["spans"]:
                args = {**span["args"], "step": step}
                if "kind" in args and _pipeline_representative(rank):
                    args["pp_rank"] = rank["coordinates"]["pp"]
                events.append({"name": span["name"], "cat": "compute" if args.get("compute", True) else "transfer",
                               "ph": "X", "pid": pid, "tid": COMPUTE, "ts": _us(offset + span["start"]),
                               "dur": _us(span["end"] - span["start"]), "args": args})
            transfers = record["transfers"]
            for start, end, index in record["waits"]:
                transfer = transfers[index]
                events.append({"name": f"wait {transfer['group']} {transfer['op']}", "cat": "wait", "ph": "X",
                               "pid": pid, "tid": WAITING, "ts": _us(offset + start), "dur": _us(end - start),
                               "args": {"group": transfer["group"], "op": transfer["op"], "step": step}})
            for number, transfer in enumerate(transfers):
                issued = offset + transfer["issued"]
                done = offset + transfer["completed"] if transfer["completed"] is not None else issued
                name, ident = f"{transfer['group']} {transfer['op']}", f"{pid}.{step}.{number}"
                args = {"group": transfer["group"], "op": transfer["op"], "bytes": transfer["bytes"],
                        "exposed_ms": transfer["exposed"] * 1e3, "peer": transfer["peer"], "step": step}
                events.append({"name": name, "cat": "collective", "ph": "b", "id": ident, "pid": pid, "tid": COMPUTE,
                               "ts": _us(issued), "args": args})
                events.append({"name": name, "cat": "collective", "ph": "e", "id": ident, "pid": pid, "tid": COMPUTE,
                               "ts": _us(done)})
                if transfer["op"] == "send":
                    sends[pid, transfer["peer"], step].append((issued, pid))
                elif transfer["op"] == "recv":
                    receives[transfer["peer"], pid, step].append((done, pid))
    events += _flows(sends, receives)
    return events


def _flows(sends: dict, receives: dict) -> list[dict]:
    """A flow from each send to the receive that took it: the n-th send of a (sender, receiver) pair
    in a step meets that pair's n-th receive."""
    flows = []
    for key, sent in sends.items():
        for number, ((at, sender), (got, receiver)) in enumerate(zip(sent, receives.get(key, []))):
            ident = f"{key[0]}>{key[1]}.{key[2]}.{number}"
            flows.append({"name": "send", "cat": "p2p", "ph": "s", "id": ident, "pid": sender, "tid": COMPUTE,
                          "ts": _us(at)})
            flows.append({"name": "send", "cat": "p2p", "ph": "f", "bp": "e", "id": ident, "pid": receiver,
                          "tid": COMPUTE, "ts": _us(max(got, at))})
    return flows
