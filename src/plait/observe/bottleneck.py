"""The bottleneck of a measured run in one sentence: the largest part of its median traced step
(``plait.observe.time_split``), and what would cut it. Pure Python."""

from __future__ import annotations

REMEDIES = {
    "dp": "the model is too light for this link: more work per rank between all-reduces (a larger batch per "
          "rank or a heavier model), fewer data-parallel ranks, or --grad-compression bf16 would cut it",
    "tp": "fewer tensor-parallel ranks, or tp only inside a node over its fastest link, would cut it",
    "cp": "context parallelism pays only at long sequences: fewer cp ranks, or the other --cp-algorithm, would cut it",
    "pp": "the stages wait on each other outside the schedule: fewer stages or a more even --stage-layers would cut it",
    "bubble": "more micro-batches per step, an interleaved (--virtual-stages) or zero-bubble schedule, or fewer "
              "stages would cut it",
    "other": "it is time outside compute and communication (the batch, Python between operations): larger "
             "micro-batches amortise it",
    "compute": "the run is compute-bound: more ranks of any kind cut it while their communication stays hidden",
}


def bottleneck(split: dict) -> str:
    """One sentence naming the largest part of the median step (compute, one group's exposed op,
    the bubble or other) and what would cut it."""
    step = split["step_s"]["median"]
    parts = {"compute": split["compute_s"]["median"], "bubble": split["bubble_s"]["median"],
             "other": split["other_s"]["median"]}
    parts |= {f"exposed {name}": seconds for name, seconds in split["exposed_comm_by_op_s"].items()}
    name = max(parts, key=parts.get)
    group = name.split()[1].split("_")[0] if name.startswith("exposed ") else name
    subject = {"bubble": "the pipeline bubble", "other": "other time"}.get(name, name)
    return f"{subject} is {parts[name] / step:.0%} of the step: {REMEDIES[group]}"
