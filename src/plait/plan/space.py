"""The layouts the planner walks: the mesh sizes of N devices, each context-parallel algorithm,
schedule, interleaving depth and ZeRO stage a layout may take, and the tuple a scanned layout is
recorded by."""

from __future__ import annotations

import math
from collections.abc import Iterator

from plait.facts.validity import compression_problems, fit_problems
from plait.layout import Layout
from plait.hardware import Hardware
from plait.plan.workload import Workload
from plait.schedules.registry import SCHEDULES, schedule_spec
from plait.schedules.split import split_problems


# The fields a scanned layout is recorded by, in the order of its tuple; by name, as Layout has
# fields the search leaves at their defaults.
SCANNED = ("dp", "tp", "cp", "pp", "sp", "zero", "schedule", "virtual_stages", "microbatches", "recompute",
           "grad_compression", "cp_algorithm", "dp_replicate", "recompute_layers", "offload_activations")


def scanned_layout(fields: tuple, stage_layers: tuple[int, ...] | None = None) -> Layout:
    """The layout a scanned tuple records (recompute_layers 0 there: every block, so that tuples sort)."""
    values = dict(zip(SCANNED, fields))
    return Layout(**values | {"recompute_layers": values.get("recompute_layers") or None}, stage_layers=stage_layers)


def scanned_fields(layout: Layout, schedule: str, v: int, recompute: str, recompute_layers: int) -> tuple:
    """The tuple ``layout`` is recorded by under ``schedule``, ``v`` and ``recompute`` (of its first
    ``recompute_layers`` blocks per chunk; 0: every block)."""
    return (layout.dp, layout.tp, layout.cp, layout.pp, layout.sp, layout.zero, schedule, v, layout.microbatches,
            recompute, layout.grad_compression, layout.cp_algorithm, layout.dp_replicate, recompute_layers,
            layout.offload_activations)


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending, found in √n steps (GPU counts reach millions)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def options(fixed: dict, name: str, choices) -> tuple:
    """The ``choices`` of field ``name`` that agree with ``fixed``."""
    return tuple(c for c in choices if fixed.get(name, c) == c)


def mesh_sizes(gpus: int, fixed: dict) -> Iterator[tuple[int, int, int, int]]:
    """Every (tp, cp, pp, dp) whose product is ``gpus`` and that keeps the sizes ``fixed`` pins."""
    for tp in options(fixed, "tp", divisors(gpus)):
        for cp in options(fixed, "cp", divisors(gpus // tp)):
            for pp in options(fixed, "pp", divisors(gpus // (tp * cp))):
                dp = gpus // (tp * cp * pp)
                if fixed.get("dp", dp) == dp:
                    yield tp, cp, pp, dp


def meshes(workload: Workload, gpus: int, fixed: dict) -> Iterator[tuple[int, int, int, int, str]]:
    """The sizes the model can be cut into, with each context-parallel algorithm of the stack that
    can cut it (the shared validation's tensor, context and stage checks; the rest is checked per
    layout), whose data parallelism divides the global batch. Without cp the algorithm changes
    nothing: the pinned one, or the default."""
    spec, kernels = workload.spec, workload.kernels
    given = fixed.get("stage_layers")
    for tp, cp, pp, dp in mesh_sizes(gpus, fixed):
        # A given split fixes the chunks a rank holds, and may leave its end chunks empty.
        cut = split_problems(spec, pp) if given is None else (
            len(given) % pp or split_problems(spec, pp, len(given) // pp, given))
        if cut or workload.global_batch % dp:
            continue
        algorithms = options(fixed, "cp_algorithm", kernels.cp_algorithms) if cp > 1 else (
            fixed.get("cp_algorithm", Layout.cp_algorithm),)
        for algorithm in algorithms:
            if not fit_problems(spec, Layout(tp=tp, cp=cp, cp_algorithm=algorithm), kernels):
                yield tp, cp, pp, dp, algorithm


def schedule_choices(pp: int, m: int, layers: int, fixed: dict) -> list[tuple[str, int]]:
    """(schedule, v) pairs to score with pp ranks and m micro-batches: every registered schedule, those
    with one chunk per rank first and then each interleaving depth of those taking more (each
    candidate then passes the shared validation). Without stages the schedule changes nothing: the
    pinned one, or the layout's default."""
    if pp == 1:
        return [(fixed.get("schedule", Layout.schedule), fixed.get("virtual_stages", 1))]
    out = []
    for name in options(fixed, "schedule", sorted(SCHEDULES, key=lambda n: schedule_spec(n).takes_virtual_stages)):
        if schedule_spec(name).takes_virtual_stages:
            out += [(name, v) for v in _virtual_stage_choices(pp, layers, fixed)]
        else:
            out.append((name, 1))
    return [(n, v) for n, v in out if fixed.get("virtual_stages", v) == v]


def _virtual_stage_choices(pp: int, layers: int, fixed: dict) -> tuple[int, ...] | range:
    """Interleaving's chunks per rank to try: as pinned, else as many as a given split has chunks per
    rank (it may leave its end chunks empty, so more than layers / pp), else every v of at least a
    block a chunk."""
    if "virtual_stages" in fixed:
        return (fixed["virtual_stages"],)
    given = fixed.get("stage_layers")
    if given is not None:
        return (len(given) // pp,) if len(given) % pp == 0 and len(given) // pp > 1 else ()
    return range(2, layers // pp + 1)


def zero_choices(fixed: dict, hw: Hardware, base: Layout) -> list[tuple[int, int]]:
    """(ZeRO stage, dp_replicate) pairs to score: every stage sharding over all dp·cp ranks and, when
    the dp ranks span nodes, hybrid sharding inside a node (the largest group of at least two dp
    ranks whose cp·tp blocks fill a node a whole number of times, so no group straddles two; the
    groups replicate across nodes)."""
    dp, block = base.dp, base.cp * base.tp
    inside = max((s for s in divisors(dp) if hw.gpus_per_node % (s * block) == 0), default=1)
    replicates = (fixed["dp_replicate"],) if "dp_replicate" in fixed else (1, dp // inside) if 2 <= inside < dp else (1,)
    return [(zero, replicate) for zero in options(fixed, "zero", (0, 1, 2, 3) if dp * base.cp > 1 else (0,))
            for replicate in (replicates if zero else (1,))]


def refused(layout: Layout) -> bool:
    """Whether train refuses ``layout``'s composition whatever the model (a quick prune before the full check)."""
    return bool(compression_problems(layout))
