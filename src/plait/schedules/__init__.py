"""Pipeline schedules as data: the action IR, generators, checker, simulator and stage split.

Pure Python (no torch) so the planner can use the same lists as training; the torch executor
lives in ``plait.schedules.executor`` and is imported only by workers.
"""

from plait.schedules.actions import Action, Kind, Schedule
from plait.schedules.checker import check, peak_in_flight
from plait.schedules.generators import GENERATORS, generate
from plait.schedules.simulate import UNIT_COSTS, ScheduleError, Span, Timeline, simulate, theoretical_bubble
from plait.schedules.split import chunk_costs, split_layers

__all__ = [
    "Action", "Kind", "Schedule", "check", "peak_in_flight", "GENERATORS", "generate", "UNIT_COSTS",
    "ScheduleError", "Span", "Timeline", "simulate", "theoretical_bubble", "chunk_costs", "split_layers",
]
