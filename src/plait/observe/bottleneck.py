"""The bottleneck of a measured run in one sentence: what holds its median traced step above its
compute (``plait.observe.time_split``), and what would cut it. Pure Python."""

from __future__ import annotations

REMEDIES = {
    "dp": "the model is too light for this link: more work per rank between all-reduces (a larger batch per "
          "rank or a heavier model), fewer data-parallel ranks, or --grad-compression bf16 would cut it",
    "tp": "fewer tensor-parallel ranks, or tp only inside a node over its fastest link, would cut it",
    "cp": "context parallelism pays only at long sequences: fewer cp ranks, or another --cp-algorithm, would cut it",
    "bubble": "more micro-batches per step, an interleaved (--virtual-stages) or zero-bubble schedule, or fewer "
              "stages would cut it",
    "data": "the rank waits for its batch: pre-tokenized data on fast local storage (plait prepare-data), or a "
            "loader that reads ahead, would cut it",
    "host": "it is the host's own work between operations (Python, the loop's bookkeeping): larger micro-batches "
            "amortise it",
    "compute": "the run is compute-bound: more ranks of any kind cut it while their communication stays hidden",
}


# An overhead (exposed communication, bubble, data, other) this large a share of the step is what to cut
# first; below it, the run is bound by its compute.
WORTH_NAMING = 0.10


def bottleneck(split: dict) -> str:
    """One sentence naming what holds the median step above its compute (one group's exposed op,
    the bubble, waiting for data or host overhead, the largest of them if it is at least ``WORTH_NAMING`` of the step;
    otherwise compute itself) and what would cut it."""
    step = split["step_s"]["median"]
    overheads = {"bubble": split["bubble_s"]["median"], "host": split["host_s"]["median"],
                 "data": split.get("data_s", {}).get("median", 0.0)}
    overheads |= {f"exposed {name}": seconds for name, seconds in split["exposed_comm_by_op_s"].items()}
    name = max(overheads, key=overheads.get)
    if overheads[name] < WORTH_NAMING * step:
        return f"compute is {split['compute_s']['median'] / step:.0%} of the step: {REMEDIES['compute']}"
    group = name.split()[1].split("_")[0] if name.startswith("exposed ") else name
    subject = {"bubble": "the pipeline bubble", "host": "host overhead", "data": "waiting for data"}.get(name, name)
    return f"{subject} is {overheads[name] / step:.0%} of the step: {REMEDIES[group]}"
