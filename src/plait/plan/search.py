"""Search every valid layout for a model on N devices, drop what does not fit, rank by throughput.

Two passes. The first (plait.plan.scan) walks every layout of the search space (plait.plan.space:
pp, dp, cp and its algorithm, tp, sp, ZeRO stage, schedule, v, micro-batch size, recomputation) and
scores it with closed forms built from the same per-layer costs as the simulator: the peak memory of
the first, each differently cut middle and the last pipeline rank, from what each holds of every
chunk at its peaks (plait.plan.peaks), and the pipeline's closed-form step time
(plait.plan.pipeline.estimate_step). For each choice of everything else, recomputation is tried from
the least work to the most and only the first that fits is scored: the later ones only add time. A
layout that fits under none is counted, not scored. The second pass plays the real schedule
(plait.plan.simulate.evaluate) for the best few and ranks those by the played step time (with ties
inside the planner's own error broken by plait.plan.ranking), so ``plait simulate`` with no layout
flags is ``plait plan``'s top pick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from plait.errors import ConfigError
from plait.facts.validity import run_problems
from plait.layout import Layout
from plait.hardware import Hardware, stack_hardware
from plait.plan.ranking import CONTEXT_PARALLEL_PRECEDENT_TOKENS, FULL_SHARD_PRECEDENT_RANKS, PLANNER_ERROR, rank
from plait.plan.scan import Scan, scan
from plait.plan.simulate import Prediction, evaluate
from plait.plan.workload import Workload
from plait.plan.space import SCANNED, mesh_sizes, scanned_layout

PLAYED = 8  # layouts whose schedules are played exactly after the closed-form pass
MAX_GPUS = 2**20  # no cluster is larger; it keeps every search (and its error message) to seconds


class NothingFits(ConfigError):
    """Every layout agreeing with the flags needs more memory than a device has."""


@dataclass
class SearchResult:
    ranked: list[Prediction]
    scored: int
    fitting: int  # of the scored
    reason: str
    bounded: int = 0  # layouts searched but not scored: a floor on their step time could not be kept
    oversized: int = 0  # layouts searched but not scored: a floor on their memory is more than a device has


def search(workload: Workload, hw: Hardware, gpus: int, fixed: dict | None = None,
           micro_batch: int | None = None, top: int = PLAYED, tie_break: str = "simplicity") -> SearchResult:
    """Rank the layouts of ``gpus`` devices that fit; raise ConfigError (saying what would fit) if
    none does.

    Every layout ranked passes the one validation ``plait train`` uses (plait.facts.validity).
    """
    fixed = fixed or {}
    hw = stack_hardware(hw, workload.kernels)
    found, ranked = _fitting(workload, hw, gpus, fixed, micro_batch, top, tie_break)
    if not ranked:
        raise NothingFits(_does_not_fit(workload, hw, gpus, found, fixed, micro_batch, tie_break))
    return SearchResult(ranked[:top], found.scored, found.fitting, explain(ranked, found, hw, tie_break), found.bounded,
                        found.oversized)


def _fitting(workload: Workload, hw: Hardware, gpus: int, fixed: dict, micro_batch: int | None, top: int,
             tie_break: str) -> tuple[Scan, list[Prediction]]:
    """The scan of ``gpus`` devices on the stack's hardware ``hw``, and the layouts it keeps that fit
    once played, ranked (none when nothing fits); ConfigError where no layout agrees with the flags."""
    if gpus > MAX_GPUS:
        raise ConfigError(f"{gpus:,} devices is beyond the {MAX_GPUS:,} the planner searches; plan one pod or "
                          "data-parallel replica group and scale it")
    _check_fixed(workload, gpus, fixed)
    found = scan(workload, hw, gpus, fixed, micro_batch, keep=max(top, PLAYED) * 2)
    if not found.scored and not found.oversized:
        raise ConfigError(_nothing_valid(workload, gpus, fixed))
    ranked: list[Prediction] = []
    for layout in found.layouts(fixed.get("stage_layers")):
        prediction = evaluate(workload, hw, gpus, layout)
        if prediction.fits:
            ranked.append(prediction)
        if len(ranked) >= max(top, PLAYED):
            break
    if not ranked:
        return found, ranked
    if tie_break == "simplicity":  # the simpler contenders the fastest few left out
        played = {p.layout for p in ranked}
        for layout in found.simpler_layouts(fixed.get("stage_layers")):
            prediction = evaluate(workload, hw, gpus, layout) if layout not in played else None
            if prediction and prediction.fits:
                ranked.append(prediction)
    return found, rank(ranked, hw.gpus_per_node, workload.spec.seq_len, tie_break)


def _nothing_valid(workload: Workload, gpus: int, fixed: dict) -> str:
    """Why no layout agrees with the flags: the shared validation's reason for the first mesh of
    ``gpus`` that keeps every pinned size (the pinned choices laid over it)."""
    pinned = {k: v for k, v in fixed.items() if k in SCANNED or k == "stage_layers"}
    for tp, cp, pp, dp in mesh_sizes(gpus, fixed):
        layout = Layout(**{**pinned, "dp": dp, "tp": tp, "cp": cp, "pp": pp})
        problems = run_problems(workload.spec, layout, gpus, workload.global_batch, workload.kernels)
        if problems:
            return problems[0]
    return (f"no layout of {gpus} GPUs agrees with the layout flags given, divides global batch "
            f"{workload.global_batch} over data parallelism and passes plait train's validation; "
            "change --gpus, --global-batch or the layout flags")


def _check_fixed(workload: Workload, gpus: int, fixed: dict) -> None:
    """Name the flag at fault when the fixed layout sizes cannot make ``gpus`` GPUs."""
    sizes = {k: fixed[k] for k in ("dp", "tp", "cp", "pp") if k in fixed}
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name} must be a positive integer, got {value!r}")
    product = math.prod(sizes.values())
    if gpus % product:
        flags = " × ".join(f"--{k} {v}" for k, v in sizes.items())
        raise ConfigError(f"{flags} = {product} does not divide --gpus {gpus}; choose sizes whose product divides it")
    if len(sizes) == 4 and product != gpus:
        raise ConfigError(f"dp·tp·cp·pp = {product} but --gpus is {gpus}; make the product equal the GPU count")


# Pins that size the mesh for the GPUs given: what more GPUs would fit is asked without them.
MESH_PINS = ("dp", "tp", "cp", "pp", "dp_replicate", "microbatches", "virtual_stages", "stage_layers")


def _does_not_fit(workload: Workload, hw: Hardware, gpus: int, found: Scan, fixed: dict, micro_batch: int | None,
                  tie_break: str) -> str:
    peak, fields = found.smallest
    head = (f"no layout fits {gpus} × {hw.name} ({hw.memory_bytes / 1e9:.0f} GB each, {hw.memory_headroom:.0%} kept free): the smallest, "
            f"{scanned_layout(fields).describe()}, needs {peak / 1e9:.1f} GB per GPU")
    # The fewest GPUs that fit it, at the same global batch or at as many sequences a GPU, and plan's
    # pick there under the same choices but the mesh's.
    kept = {name: value for name, value in fixed.items() if name not in MESH_PINS}
    for scale in (2, 4, 8, 16, 32, 64):
        for batch in dict.fromkeys((workload.global_batch, workload.global_batch * scale)):
            wider = replace(workload, global_batch=batch)
            if not scan(wider, hw, gpus * scale, kept, micro_batch, keep=1).fitting:
                continue
            try:
                ranked = _fitting(wider, hw, gpus * scale, kept, micro_batch, 1, tie_break)[1]
            except ConfigError:  # beyond the devices the planner searches
                continue
            if not ranked:  # no pick fits once played
                continue
            pick = ranked[0].layout.describe()
            kept = "the same global batch" if batch == workload.global_batch else f"global batch {batch} (as many a GPU)"
            return f"{head}; {gpus * scale} GPUs would fit it at {kept}, plan's pick there {pick}"
    return f"{head}; use a smaller model or GPUs with more memory"


def explain(ranked: list[Prediction], found: Scan, hw: Hardware, tie_break: str = "simplicity") -> str:
    """Why the top layout wins (memory, bubble or exposed communication), its memory margin, and
    whether the runner-up is within the planner's own error of it."""
    best = ranked[0]
    b = best.time_breakdown
    exposed = b["critical_path_comm_s"] + b["exposed_dp_comm_s"]
    free = hw.memory_bytes - best.peak_memory_bytes
    line = (f"{best.layout.describe()} wins at {best.step_time_s:.3g} s/step "
            f"({best.bubble_fraction:.0%} bubble, {exposed / best.step_time_s:.0%} exposed communication); "
            f"it needs {best.peak_memory_bytes / 1e9:.1f} of {hw.memory_bytes / 1e9:.0f} GB, leaving "
            f"{free / 1e9:.1f} GB ({free / hw.memory_bytes:.0%}) free where the plan keeps at least "
            f"{hw.memory_headroom:.0%}")
    fastest = min(ranked, key=lambda p: p.step_time_s)
    if fastest is not best:
        line += (f"; the fastest, {fastest.layout.describe()}, is predicted {best.step_time_s / fastest.step_time_s - 1:.1%} "
                 f"ahead, within the planner's error of {PLANNER_ERROR:.1%}, so the layout with fewer parallel "
                 "dimensions (tensor parallelism across nodes, context parallelism below "
                 f"{CONTEXT_PARALLEL_PRECEDENT_TOKENS:,} tokens and ZeRO-3 without pipeline stages over more "
                 f"than {FULL_SHARD_PRECEDENT_RANKS} ranks each counting as one more) comes first")
    if len(ranked) > 1:
        runner = ranked[1]
        o = runner.time_breakdown
        gap = runner.step_time_s / best.step_time_s - 1
        deltas = {
            "pipeline bubble": o["bubble_s"] - b["bubble_s"],
            "exposed communication": o["critical_path_comm_s"] + o["exposed_dp_comm_s"] - exposed,
            "compute": o["compute_s"] - b["compute_s"],
            "the optimizer step": o["optimizer_s"] - b["optimizer_s"],
        }
        why = max(deltas, key=deltas.get)
        within = ("within the planner's error" if abs(gap) <= PLANNER_ERROR else "beyond the planner's error")
        line += f"; the runner-up {runner.layout.describe()} is predicted {gap:+.1%} ({within} of {PLANNER_ERROR:.1%})"
        if gap < 0:
            line += " but spreads over more parallel dimensions"
        elif deltas[why] > 0:
            line += f", losing {deltas[why]:.3g} s on {why}"
    step, fields, peak = found.fastest
    if peak > hw.usable_memory_bytes and step < fastest.step_time_s:
        line += f"; the faster {scanned_layout(fields).describe()} would need {peak / 1e9:.0f} GB"
    return line


def best_layout(workload: Workload, hw: Hardware, gpus: int, fixed: dict, micro_batch: int | None = None,
                tie_break: str = "simplicity") -> Prediction:
    """The top pick given the layout fields already ``fixed``: what ``plait simulate`` fills in."""
    return search(workload, hw, gpus, fixed, micro_batch, top=1, tie_break=tie_break).ranked[0]
