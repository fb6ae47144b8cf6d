"""Pipeline schedules as data: the action IR, generators and their registry, checker, simulator and
stage split.

Pure Python (no torch) so the planner can use the same lists as training; the torch executor
that runs them is the pipeline's runtime, ``plait.parallel.pipeline_executor``.
"""

from plait.schedules.actions import Action, Kind, Schedule
from plait.schedules.checker import check, peak_in_flight
from plait.schedules.registry import SCHEDULES, ScheduleSpec, generate, register, schedule_spec, unregister
from plait.schedules.simulate import UNIT_COSTS, ScheduleError, Span, Timeline, simulate, theoretical_bubble
from plait.schedules.split import chunk_costs, split_layers

__all__ = [
    "Action", "Kind", "Schedule", "check", "peak_in_flight", "SCHEDULES", "ScheduleSpec", "generate", "register",
    "schedule_spec", "unregister", "UNIT_COSTS", "ScheduleError", "Span", "Timeline", "simulate",
    "theoretical_bubble", "chunk_costs", "split_layers",
]
