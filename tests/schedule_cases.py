"""Every registered pipeline schedule as the tests meet it: (name, chunks per rank), interleaving
schedules at two chunks a rank. Pure Python, read when a test module is collected, so a schedule
a test registers for itself is not among them."""

from __future__ import annotations

from plait.schedules import SCHEDULES, schedule_spec

EVERY_SCHEDULE = [(name, 2 if schedule_spec(name).takes_virtual_stages else 1) for name in SCHEDULES]
ONE_CHUNK_SCHEDULES = [name for name, v in EVERY_SCHEDULE if v == 1]
INTERLEAVING_SCHEDULES = [name for name, v in EVERY_SCHEDULE if v > 1]
