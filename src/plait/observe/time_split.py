"""Where a traced step's time went, from the step records of ``plait.observe.step_trace``.

Pure Python. On each rank a step splits into

* bubble: the pipeline executor's send and receive spans and any wait on the pipeline group (a
  stage waiting for a neighbour's activation, or for the last stage's loss, gradient norm or barrier:
  a wait for a pipeline peer is bubble wherever the schedule put it);
* exposed communication, per group: waiting for any other group's collective, outside those spans;
* compute: the compute spans (forward, backward, gradient sync, optimizer; pipeline actions) less
  the waits inside them;
* data: reading the step's batch (the ``data`` span): a rank waiting for its data loader;
* host: the rest of the step less its waits: the host's own work between plait's operations (the
  loop's Python, the loss average, the optimizer's bookkeeping outside its span); on a CPU, the
  interpreter, and on a GPU, what the host adds where the device waits for it.

The five add up to the step's duration; exposed communication is also given per group and op
(``dp all_reduce``); overlapped communication (per group) is the time while at least one of the
group's transfers was in flight and the rank did not wait for it, so it never exceeds the step.
"""

from __future__ import annotations

import statistics


def _overlap(start: float, end: float, spans: list[dict]) -> float:
    return sum(max(0.0, min(end, s["end"]) - max(start, s["start"])) for s in spans)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The disjoint intervals covering ``intervals``, in order."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _overlapped(transfers: list[dict], waits: list) -> dict[str, float]:
    """Per group, the time at least one of its transfers was in flight while the rank waited for none of them."""
    groups = {t["group"] for t in transfers if t["completed"] is not None}
    overlapped = {}
    for group in sorted(groups):
        flying = _union([(t["issued"], t["completed"]) for t in transfers if t["group"] == group and t["completed"] is not None])
        waiting = _union([(start, end) for start, end, index in waits if transfers[index]["group"] == group])
        waited_in_flight = sum(max(0.0, min(end, w_end) - max(start, w_start))
                               for start, end in flying for w_start, w_end in waiting)
        overlapped[group] = max(0.0, _length(flying) - waited_in_flight)
    return overlapped


def _part(span: dict) -> str:
    """Which part of the step a span is: reading the batch, compute, or a pipeline transfer."""
    if span["args"].get("part") == "data":
        return "data"
    return "compute" if span["args"].get("compute", True) else "pipeline"


def split_step(record: dict) -> dict:
    """One rank's traced step as seconds of compute, exposed communication (and per group),
    overlapped communication per group, bubble, data and host."""
    transfers = record["transfers"]
    compute = [s for s in record["spans"] if _part(s) == "compute"]
    pipeline_transfers = [s for s in record["spans"] if _part(s) == "pipeline"]
    data = sum(s["end"] - s["start"] for s in record["spans"] if _part(s) == "data")
    in_compute = waited = 0.0
    bubble = sum(s["end"] - s["start"] for s in pipeline_transfers)
    exposed: dict[str, float] = {}
    by_op: dict[str, float] = {}
    for start, end, index in record["waits"]:
        outside = end - start - _overlap(start, end, pipeline_transfers)  # those are the bubble already
        in_compute += _overlap(start, end, compute)
        waited += outside
        group, op = transfers[index]["group"], transfers[index]["op"]
        if group == "pp":  # waiting for a pipeline peer
            bubble += outside
            continue
        exposed[group] = exposed.get(group, 0.0) + outside
        by_op[f"{group} {op}"] = by_op.get(f"{group} {op}", 0.0) + outside
    computing = sum(s["end"] - s["start"] for s in compute)
    exposed_total = sum(exposed.values())
    return {
        "step_s": record["duration"],
        "compute_s": computing - in_compute,
        "exposed_comm_s": exposed_total,
        "bubble_s": bubble,
        "data_s": data,
        "host_s": record["duration"] - computing - sum(s["end"] - s["start"] for s in pipeline_transfers) - data
        - (waited - in_compute),
        "exposed_comm_by_group_s": exposed,
        "exposed_comm_by_op_s": by_op,
        "overlapped_comm_by_group_s": _overlapped(transfers, record["waits"]),
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def run_time_split(ranks: list[dict]) -> dict | None:
    """Medians over the traced steps (each step: the mean over ranks) with their min and max, the
    per-rank medians, each part's share of the step (``shares``: median over the steps with its min
    and max), ``comm_fraction`` (exposed communication's share) and the
    compute-to-synchronisation ratio (compute / exposed communication). ``median_step`` is one whole
    step, the traced step of median duration (the lower of two), whose parts add up to its time as
    the medians of the parts need not. None without a traced step."""
    steps = sorted({r["step"] for rank in ranks for r in rank["steps"]})
    if not steps:
        return None
    splits = {step: [split_step(r) for rank in ranks for r in rank["steps"] if r["step"] == step] for step in steps}
    scalars = ("step_s", "compute_s", "exposed_comm_s", "bubble_s", "data_s", "host_s")
    per_step = {key: [_mean([s[key] for s in splits[step]]) for step in steps] for key in scalars}
    by_group = {}
    for key in ("exposed_comm_by_group_s", "exposed_comm_by_op_s", "overlapped_comm_by_group_s"):
        names = sorted({name for step in steps for s in splits[step] for name in s[key]})
        by_group[key] = {name: statistics.median(_mean([s[key].get(name, 0.0) for s in splits[step]]) for step in steps)
                         for name in names}
    shares = {part: _spread([p / t for p, t in zip(per_step[f"{part}_s"], per_step["step_s"])])
              for part in ("compute", "exposed_comm", "bubble", "data", "host")}
    middle = per_step["step_s"].index(statistics.median_low(per_step["step_s"]))
    median_step = {"step": steps[middle], **{key: per_step[key][middle] for key in scalars},
                   "exposed_comm_by_group_s": {name: _mean([s["exposed_comm_by_group_s"].get(name, 0.0)
                                                           for s in splits[steps[middle]]])
                                               for name in by_group["exposed_comm_by_group_s"]}}
    compute, exposed = statistics.median(per_step["compute_s"]), statistics.median(per_step["exposed_comm_s"])
    per_rank = []
    for rank in ranks:
        mine = [split_step(r) for r in rank["steps"]]
        per_rank.append({"rank": rank["rank"], "name": rank["name"],
                         **{key: statistics.median(s[key] for s in mine) for key in scalars}})
    return {
        "traced_steps": steps,
        **{key: _spread(values) for key, values in per_step.items()},
        **by_group,
        "shares": shares,
        "comm_fraction": shares["exposed_comm"],
        "compute_to_sync_ratio": compute / exposed if exposed > 0 else None,
        "per_rank": per_rank,
        "median_step": median_step,
    }


def proportions(split: dict) -> str:
    """``compute : exposed communication : bubble``, each its median share of the step."""
    return " : ".join(f"{split['shares'][part]['median']:.0%}" for part in ("compute", "exposed_comm", "bubble"))
