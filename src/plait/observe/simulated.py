"""The simulated step as a Chrome/Perfetto trace (``plait simulate --trace FILE``) and as the
timeline real runs draw (``--timeline FILE.png``, plait.observe.timeline's renderer).

One track per pipeline rank (every dp/cp/tp rank of a stage does the same), one span per
forward or backward as the schedule simulator plays the real action lists, then the gradient
reduction and optimizer step that follow the flush. Trace files of real runs use the same event
format, so the same viewer or renderer shows prediction and measurement side by side.
"""

from __future__ import annotations

from plait.facts.collectives import norm_gradient_elements
from plait.facts.model_state import PipelineShare, rank_parameters, rank_tensors
from plait.layout import Layout
from plait.observe.trace import timeline_events
from plait.plan.compute import gradient_seconds
from plait.plan.costs import chunk_costs, stage_boundaries
from plait.hardware import Hardware, stack_hardware
from plait.plan.pipeline import action_costs, action_flights
from plait.plan.simulate import check_layout, flush_costs, gather_window
from plait.plan.workload import Workload
from plait.schedules import Timeline, generate, simulate, split_layers


def simulated_timeline(workload: Workload, hw: Hardware, gpus: int, layout: Layout) -> Timeline:
    """The schedule's full action lists played with this layout's per-action costs."""
    micro_batch = check_layout(workload, gpus, layout)
    spec, precision, hw = workload.spec, workload.precision, stack_hardware(hw, workload.kernels)
    counts = tuple(len(r) for r in split_layers(spec, layout.pp, layout.virtual_stages, layout.stage_layers))
    chunks = chunk_costs(spec, hw, layout, micro_batch, precision, workload.kernels, counts)
    boundaries = stage_boundaries(spec, hw, layout, micro_batch, precision, workload.kernels)
    schedule = generate(layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages,
                        workload.kernels.sends_after_backward(layout.schedule))
    return simulate(schedule, action_costs(chunks, boundaries), action_flights(boundaries))


def simulated_trace(workload: Workload, hw: Hardware, gpus: int, layout: Layout) -> dict:
    """Chrome trace events (microseconds) of one simulated step of ``layout``."""
    micro_batch = check_layout(workload, gpus, layout)
    spec, precision, hw = workload.spec, workload.precision, stack_hardware(hw, workload.kernels)
    pp, v = layout.pp, layout.virtual_stages
    counts = tuple(len(r) for r in split_layers(spec, pp, v, layout.stage_layers))
    chunks = chunk_costs(spec, hw, layout, micro_batch, precision, workload.kernels, counts)
    timeline = simulated_timeline(workload, hw, gpus, layout)
    events = timeline_events(timeline, busy_only=True)
    for rank in range(len(timeline.spans)):
        mine = range(rank, pp * v, pp)
        layers, first, last = sum(counts[c] for c in mine), 0 in mine, pp * v - 1 in mine
        params = rank_parameters(spec, layers, first, last, layout.tp)
        flush = flush_costs(workload, hw, layout, params, rank_tensors(spec, layers, first, last, pp),
                            norm_gradient_elements(spec, layers, last, layout.tp, layout.sp))
        exposed = flush.exposed(sum(chunks[c].backward for c in mine),
                                gather_window(sum(chunks[c].forward for c in mine), v, pp, layout.microbatches))
        gradients = gradient_seconds(workload, hw, layout, PipelineShare(layers, first, last))
        start = timeline.step_time
        for name, seconds in (("gradient accumulation", gradients), ("gradient sync (exposed)", exposed),
                              ("optimizer", flush.optimizer)):
            events.append({"name": name, "cat": "flush", "ph": "X", "pid": 0, "tid": rank, "ts": start * 1e6, "dur": seconds * 1e6})
            start += seconds
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"layout": layout.to_dict(), "simulated": True}}
