"""``plait schedule NAME --pp P --microbatches M [--virtual-stages V]``: a pipeline schedule as a
person learns it, each rank's action list (the lists training runs) and their timeline drawn with
unit costs (a forward 1, a backward 2, its input and weight halves 1 each, transfers free)."""

from __future__ import annotations

import argparse
from pathlib import Path

from plait.cli.outputs import check_output_file
from plait.errors import ConfigError
from plait.schedules.registry import SCHEDULES, interleaving_schedules

UNIT_SECONDS = 1e-3  # one forward is drawn as 1 ms: the picture's axis counts forwards
# The largest schedule the command lists and draws: 64 ranks of 128 micro-batches take seconds on a
# loaded 2-core machine; the checker and the bars grow with the actions, four times that is minutes.
MAX_DRAWN_RANKS, MAX_DRAWN_FORWARDS = 64, 64 * 128


def add_schedule_command(subparsers) -> None:
    schedule = subparsers.add_parser(
        "schedule", help="print and draw a pipeline schedule's action lists",
        description="Print each pipeline rank's action list for schedule NAME (short forms: 2F0 is chunk 2's "
                    "forward of micro-batch 0, 1SEND_B3@r0 sends chunk 1's input gradient of micro-batch 3 to "
                    "rank 0; I and W are the input and weight halves of a backward B) and draw it with unit costs.")
    schedule.add_argument("name", metavar="NAME", choices=SCHEDULES, help=f"one of {', '.join(SCHEDULES)}")
    schedule.add_argument("--pp", type=int, required=True, default=argparse.SUPPRESS, help="pipeline ranks")
    schedule.add_argument("--microbatches", type=int, required=True, default=argparse.SUPPRESS,
                          help="micro-batches per step")
    schedule.add_argument("--virtual-stages", type=int, default=1,
                          help=f"chunks per rank, for {interleaving_schedules()} (default 1)")
    schedule.add_argument("--out", metavar="FILE.png", default="schedule.png",
                          help="where to draw the timeline (default schedule.png)")
    schedule.set_defaults(handler=run_schedule)


def check_drawable(pp: int, microbatches: int, virtual_stages: int) -> None:
    """Refuse a schedule too large to list and draw in seconds (a bad size is left to the generator)."""
    forwards = pp * microbatches * virtual_stages
    if pp > MAX_DRAWN_RANKS or forwards > MAX_DRAWN_FORWARDS:
        raise ConfigError(f"plait schedule draws at most {MAX_DRAWN_RANKS} ranks and {MAX_DRAWN_FORWARDS:,} chunk "
                          f"forwards (pp × micro-batches × virtual stages), and this one has {pp} and {forwards:,}; "
                          "draw a smaller pipeline, or simulate this one with plait simulate --timeline")


def run_schedule(args: argparse.Namespace, argv: list[str]) -> int:
    from plait.observe.timeline import draw_timeline
    from plait.schedules import UNIT_COSTS, check, generate, simulate

    check_output_file("--out", args.out, "png")
    check_drawable(args.pp, args.microbatches, args.virtual_stages)
    schedule = generate(args.name, args.pp, args.microbatches, args.virtual_stages)  # bad sizes: one line
    in_flight = check(schedule)
    timeline = simulate(schedule, cost={kind: cost * UNIT_SECONDS for kind, cost in UNIT_COSTS.items()})
    print(f"plait schedule: {args.name}, pp {args.pp}, {args.microbatches} micro-batches, {args.virtual_stages} "
          f"chunk(s) per rank: bubble {timeline.bubble_fraction:.1%} with unit costs, step "
          f"{timeline.step_time / UNIT_SECONDS:g} forwards long")
    for rank, actions in enumerate(schedule.actions):
        print(f"rank {rank} (chunks {', '.join(map(str, schedule.chunks_of(rank)))}; at most {in_flight[rank]} "
              f"micro-batch(es) in flight): {' '.join(map(str, actions))}")
    title = (f"{args.name}: pp {args.pp}, {args.microbatches} micro-batches, {args.virtual_stages} chunk(s) per rank; "
             "unit costs, 1 ms = one forward")
    draw_timeline(timeline, Path(args.out), title)
    print(f"plait schedule: drew {args.out}")
    return 0
