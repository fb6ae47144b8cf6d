"""The simulated step rank by rank, as ``plait simulate --trace/--timeline`` and ``plait explain``
draw it: one track per pipeline rank (every dp/cp/tp rank of a stage does the same), every action
of the schedule's full lists played with ``plait.plan.simulate.evaluate``'s costs, then what follows
the flush (``step_tail``, whose sum ``evaluate`` adds to the step). ``plait.observe.trace`` writes
them as a trace real runs share the format of.
"""

from __future__ import annotations

from plait.hardware import Hardware
from plait.layout import Layout
from plait.plan.pipeline import action_costs, action_flights
from plait.plan.simulate import step_costs, step_tail
from plait.plan.workload import Workload
from plait.schedules import Timeline, generate, simulate


def simulated_timeline(workload: Workload, hw: Hardware, gpus: int, layout: Layout) -> Timeline:
    """The schedule's full action lists played with this layout's per-action costs."""
    costs = step_costs(workload, hw, gpus, layout)
    schedule = generate(layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages,
                        workload.kernels.sends_after_backward(layout.schedule))
    return simulate(schedule, action_costs(costs.chunks, costs.boundaries), action_flights(costs.boundaries))


def flush_spans(workload: Workload, hw: Hardware, gpus: int, layout: Layout) -> list[tuple[tuple[str, float], ...]]:
    """For each pipeline rank, the named spans (seconds) that follow its schedule, in order."""
    costs = step_costs(workload, hw, gpus, layout)
    tails = (step_tail(workload, layout, costs, rank) for rank in range(layout.pp))
    return [(("gradient accumulation", tail.gradients), ("gradient sync (exposed)", tail.exposed),
             ("optimizer", tail.optimizer)) for tail in tails]
