"""The planner's first pass: every valid layout scored in closed form (plait.plan.search says how the
two passes meet).

``scan`` walks each mesh (plait.plan.space.meshes) and each micro-batch count of it, smallest
micro-batches first, through four stages, each deciding one thing about the layouts it is handed:

1. ``candidate_layouts``: the sp and (ZeRO, dp_replicate) choices that train's validation accepts
   and no other choice dominates (the mesh's sp choices are its own: ``sp_choices``);
2. ``memory_floor``: what each examined rank holds besides its activations, and the least each
   schedule can hold; a layout none of whose schedules fits is counted, not scored;
3. ``time_floors``: a floor on the step from the layers' compute alone, then one with their
   communication, the ends and the flush; a layout whose floor cannot be kept is counted, not scored;
4. ``score_schedules``: each schedule takes the fastest recomputation that fits, and its step,
   estimated in closed form, is recorded in ``Scan``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from plait.facts.activations import autocast_copies_weights, residual_stream_bytes
from plait.facts.model_state import rank_parameters, rank_tensors, reduction_rounds
from plait.facts.validity import (
    fit_problems, layout_problems, mesh_problems, reads_saved_once_per_backward, recomputes_once_per_backward,
    spec_problems,
)
from plait.layout import RECOMPUTE, Layout
from plait.plan.compute import LayerTimes
from plait.hardware import Hardware
from plait.plan.memory import other_bytes
from plait.plan.peaks import (
    RankHold, ScheduleChoice, StageShapes, beside_activations, fewest_recomputed, least_memory_at_larger_microbatches,
    partial_candidate, replayed_block_extra_bytes, schedule_peak,
)
from plait.plan.pipeline import StageWork, estimate_step
from plait.plan.ranking import complexity, full_shard_ranks
from plait.plan.scan_costs import LayerWork, LayoutCosts, PassCosts, StreamCosts
from plait.plan.simulate import FlushCosts, gather_window
from plait.plan.workload import Workload
from plait.plan.space import divisors, meshes, options, refused, scanned_fields, scanned_layout, zero_choices
from plait.schedules.registry import Fill, schedule_spec


@dataclass
class Scan:
    """What a walk over the layouts found: counts, the best fitting, the smallest, the fastest overall."""

    scored: int = 0
    fitting: int = 0
    bounded: int = 0  # layouts left unscored: a floor on their step time could not be kept
    oversized: int = 0  # layouts left unscored: a floor on their memory is more than a device has
    best: list = field(default_factory=list)  # heap of (-step, fields) for the fastest fitting layouts
    # The fastest fitting layout at each complexity (plait.plan.ranking.complexity),
    # so that a simpler layout within the planner's error of the fastest is always played and ranked.
    simplest: dict = field(default_factory=dict)  # complexity -> (step, fields)
    smallest: tuple = (math.inf, None)  # (peak bytes, fields)
    fastest: tuple = (math.inf, None, 0.0)  # (step, fields, peak bytes) over all layouts

    def time_to_beat(self, level: int, keep: int) -> float:
        """The step time a layout at complexity ``level`` must beat to be kept (or to be the fastest)."""
        slowest_kept = -self.best[0][0] if len(self.best) >= keep else math.inf
        return max(slowest_kept, self.simplest.get(level, (math.inf,))[0])

    def note_smallest(self, peak: float, fields: tuple) -> None:
        if peak < self.smallest[0]:
            self.smallest = (peak, fields)

    def count_bounded(self, least_peaks: list[float], capacity: float) -> None:
        """Count a layout's schedules, whose floor on step time cannot be kept: those whose least peak
        exceeds ``capacity`` as too large, the others as bounded."""
        oversized = sum(least_peak > capacity for least_peak in least_peaks)
        self.oversized += oversized
        self.bounded += len(least_peaks) - oversized

    def record(self, fields: tuple, step: float, peak: float, capacity: float, keep: int, level: int) -> None:
        """Count one scored layout and keep it if it is among the ``keep`` fastest that fit, or is the
        fastest that fits at its complexity ``level``."""
        self.scored += 1
        self.note_smallest(peak, fields)
        if step < self.fastest[0]:
            self.fastest = (step, fields, peak)
        if peak <= capacity:
            self.fitting += 1
            if step < self.simplest.get(level, (math.inf,))[0]:
                self.simplest[level] = (step, fields)
            if len(self.best) < keep:
                heapq.heappush(self.best, (-step, fields))
            elif -self.best[0][0] > step:
                heapq.heapreplace(self.best, (-step, fields))

    def layouts(self, stage_layers: tuple[int, ...] | None = None) -> list[Layout]:
        """The fastest fitting layouts, fastest first."""
        return [scanned_layout(fields, stage_layers) for _, fields in sorted(self.best, reverse=True)]

    def simpler_layouts(self, stage_layers: tuple[int, ...] | None = None) -> list[Layout]:
        """The fastest fitting layout of each complexity below the fastest one's, simplest first."""
        if not self.simplest:
            return []
        fastest = min(self.simplest, key=lambda c: self.simplest[c][0])
        return [scanned_layout(fields, stage_layers) for c, (_, fields) in sorted(self.simplest.items()) if c < fastest]


@dataclass(frozen=True)
class Recomputations:
    """The recomputations a scan tries, as the flags pin them."""

    accepted: tuple[str, ...]  # those train accepts for the model
    costed: tuple[str, ...]  # those, with none and full where partial recomputation is tried
    split_refuses: frozenset[str]  # those a backward split in halves (zb-h1's) cannot run
    pinned_blocks: int | None  # full recomputation of only the first N blocks of each chunk, as pinned
    partial: bool  # whether partial recomputation is tried


@dataclass(frozen=True)
class ScanSetup:
    """What one scan holds fixed, and the caches its stages share."""

    workload: Workload
    hw: Hardware
    gpus: int
    fixed: dict
    keep: int  # how many of the fastest fitting layouts are kept
    bound: bool  # whether floors on step time and memory may leave layouts unscored
    capacity: float  # the memory a rank may fill
    recomputations: Recomputations
    compression: str
    offload: bool
    shapes: StageShapes
    pass_costs: PassCosts
    layout_costs: LayoutCosts


@dataclass(frozen=True)
class Mesh:
    """One cut of the devices, and what its ranks hold whatever the other choices."""

    tp: int
    cp: int
    pp: int
    dp: int
    algorithm: str  # context parallelism's
    per_rank: int  # ⌈layers / pp⌉: some rank holds that many layers or more
    params: float  # the parameters of such a rank with the first stage's ends or the last's, whichever more
    tensors: int  # the parameter tensors of such a rank, the most of either
    sp_choices: tuple[bool, ...]  # the sequence-parallel choices to score
    zeros: list[tuple[int, int]]  # the (ZeRO stage, dp_replicate) pairs to score


class Candidate(NamedTuple):
    """A layout the scan weighs, its mesh, its micro-batch size and the schedules it may run
    (plait.plan.peaks.StageShapes.schedules)."""

    layout: Layout
    mesh: Mesh
    mbs: int
    schedules: list[tuple[str, int, tuple[RankHold, ...], int, tuple[tuple, ...]]]


class RankMemory(NamedTuple):
    """What the memory floor weighed of a layout, which its schedules' peaks read."""

    besides: dict[tuple, float]  # each kind of examined rank's bytes besides its activations
    held: dict[str, float]  # a layer's activation bytes held between its passes, by recomputation
    working: dict[str, float]  # what recomputing a layer's block holds while it runs, by recomputation
    least_peaks: list[float]  # each schedule's smallest peak, under the recomputation keeping least
    freed: float  # what the last stage frees before any block's backward
    ends: StreamCosts
    stream: int  # bytes of a residual-stream value


class EndsAndGradients(NamedTuple):
    """Seconds a layout's schedules spend beside the layers' own work: the head's and the embedding's
    each micro-batch (their kernels and their passes over their weights; with no stages one rank
    holds both), and the step's passes over the gradients: a layer's, and the ends' on the first and
    on the last rank."""

    head: float
    embedding: float
    layer_gradients: float
    first_gradients: float
    last_gradients: float


class RecomputeCosts(NamedTuple):
    """Seconds per micro-batch of a layer and of a stage under one recomputation, and its bytes."""

    held: float  # a layer's activation bytes held between its passes
    mean: float  # a stage's mean work: the layers', the ends' and ZeRO-3's first gather, over pp
    work: float  # a layer's work (plait.plan.scan_costs.LayerWork)
    embedding_extra: float  # the embedding's work and ZeRO-3's first gather, on the first rank
    fill_deferred: float  # a stage's share of F + I − W where weight passes are deferred (zb-h1)
    flushed: float  # the flush's exposed part and the optimizer, a step
    backward: float  # a layer's backward
    forward: float  # a layer's forward


class StepTerms(NamedTuple):
    """What a layout's schedules share of their step, as its time floors found it."""

    beside_layers: EndsAndGradients
    by_recompute: dict[str, RecomputeCosts]
    flush: FlushCosts
    gathered: bool  # whether stages gather their parameters after the flush under the next step's forward
    level: int  # the layout's complexity (plait.plan.ranking.complexity)
    fastest_first: list[str]  # the accepted recomputations, least work first
    split_fastest_first: list[str]  # of those, what a split backward can run
    try_partial: bool  # whether recomputing some blocks could be kept (never faster than none)


def scan(workload: Workload, hw: Hardware, gpus: int, fixed: dict, micro_batch: int | None, keep: int,
         bound: bool = True) -> Scan:
    """Score every valid layout in closed form; keep the ``keep`` fastest that fit.

    A layout whose smallest peak (under the recomputation that keeps the least) exceeds the memory
    is counted, not scored, and a mesh stops at the first micro-batch size where none of its layouts
    fits (larger ones need no less; they are not counted). With ``bound``, a mesh and micro-batch
    count whose floor (its slowest stage's work for every micro-batch, plus the flush) cannot be
    kept has its schedules counted, not scored, and one whose ranks' model states and other bytes
    alone exceed the memory has its schedules counted as too large without weighing their
    activations: the same layouts are kept, and as many counted too large, either way (tests), in
    half the time on large searches."""
    found = Scan()
    setup = scan_setup(workload, hw, gpus, fixed, keep, bound)
    if setup is None:  # no layout can run it (the caller says why, from run_problems)
        return found
    for tp, cp, pp, dp, algorithm in meshes(workload, gpus, fixed):
        mesh = mesh_of(setup, tp, cp, pp, dp, algorithm)
        for m, mbs, schedules in microbatch_splits(setup, mesh, micro_batch):
            if not weigh_microbatch_count(setup, found, mesh, m, mbs, schedules):
                break
    return found


def scan_setup(workload: Workload, hw: Hardware, gpus: int, fixed: dict, keep: int, bound: bool) -> ScanSetup | None:
    """What a scan holds fixed; None where no layout can run."""
    recomputes = recomputations(workload, fixed)
    if recomputes is None or spec_problems(workload.spec) or not recomputes.accepted:
        return None
    # Gradient compression is modelled when pinned, never searched: PowerSGD changes the training.
    compression = fixed.get("grad_compression", "none")
    pass_costs = PassCosts(workload, hw, compression, gpus)
    return ScanSetup(workload=workload, hw=hw, gpus=gpus, fixed=fixed, keep=keep, bound=bound,
                     capacity=hw.usable_memory_bytes, recomputations=recomputes, compression=compression,
                     offload=fixed.get("offload_activations", False),
                     shapes=StageShapes(workload.spec, workload.kernels, fixed), pass_costs=pass_costs,
                     layout_costs=LayoutCosts(workload, hw, recomputes.costed, pass_costs))


def recomputations(workload: Workload, fixed: dict) -> Recomputations | None:
    """The recomputations to try; None where recompute_layers is pinned without full recomputation
    (as train: it names full recomputation's blocks)."""
    spec, kernels = workload.spec, workload.kernels
    # Activation offload is modelled when pinned, never searched: plait's copies wait on the compute
    # stream and lose to recomputation on every catalog model, and no published run shows what
    # Megatron-Core's overlapped copies cost when eight GPUs and their NICs share PCIe and host memory.
    offload = fixed.get("offload_activations", False)
    accepted = tuple(rc for rc in options(fixed, "recompute", RECOMPUTE)
                     if not layout_problems(spec, Layout(recompute=rc, offload_activations=offload), kernels=kernels))
    split_refuses = frozenset(rc for rc in accepted if not recomputes_once_per_backward(True, rc)
                              or not reads_saved_once_per_backward(True, offload))
    # Full recomputation of only the first N blocks of each chunk: as pinned, or, with neither
    # recomputation flag pinned, the fewest N that fit wherever only full recomputation fits.
    pinned_blocks = fixed.get("recompute_layers")
    if pinned_blocks is not None and fixed.get("recompute") != "full":
        return None
    partial = (pinned_blocks is not None or "recompute" not in fixed) and not offload and kernels.partial_recompute
    costed = tuple(dict.fromkeys(accepted + ("none", "full") if partial else accepted))
    return Recomputations(accepted, costed, split_refuses, pinned_blocks, partial)


def mesh_of(setup: ScanSetup, tp: int, cp: int, pp: int, dp: int, algorithm: str) -> Mesh:
    """The mesh of these sizes, with what a rank of ⌈layers / pp⌉ layers holds and its sp and ZeRO
    choices."""
    spec = setup.workload.spec
    per_rank = math.ceil(spec.layers / pp)
    params = max(rank_parameters(spec, per_rank, True, pp == 1, tp), rank_parameters(spec, per_rank, pp == 1, True, tp))
    tensors = max(rank_tensors(spec, per_rank, True, pp == 1, pp), rank_tensors(spec, per_rank, pp == 1, True, pp))
    return Mesh(tp, cp, pp, dp, algorithm, per_rank, params, tensors, sp_choices(setup, tp, cp, algorithm),
                zero_choices(setup.fixed, setup.hw, Layout(dp=dp, tp=tp, cp=cp)))


def sp_choices(setup: ScanSetup, tp: int, cp: int, algorithm: str) -> tuple[bool, ...]:
    """sp where the split over tp, cp and sp allows it (plait.facts.validity.fit_problems, which reads
    only those), and no sp only where asked for or where sp is refused: without sp a layout is never
    faster (but for the gather of learned positions' gradient sp adds, under 0.1% of a step) nor
    smaller than with it (a test holds it)."""
    fixed = setup.fixed
    splits_with_sp = not fit_problems(setup.workload.spec, Layout(tp=tp, cp=cp, sp=True, cp_algorithm=algorithm),
                                      setup.workload.kernels)
    return tuple(sp for sp in options(fixed, "sp", (True, False) if tp > 1 else (False,))
                 if (splits_with_sp if sp else tp == 1 or "sp" in fixed or not splits_with_sp))


def microbatch_splits(setup: ScanSetup, mesh: Mesh, micro_batch: int | None) -> Iterator[tuple[int, int, list]]:
    """(micro-batches, sequences each, the schedules that can run them) of a data-parallel rank's share
    of the batch, the smallest micro-batches first, so that a mesh can stop where no larger ones can
    fit (plait.plan.peaks.least_memory_at_larger_microbatches); as ``micro_batch`` pins the size."""
    per_replica = setup.workload.global_batch // mesh.dp
    for m in reversed(options(setup.fixed, "microbatches", divisors(per_replica))):
        mbs = per_replica // m
        if micro_batch and mbs != micro_batch:
            continue
        schedules = setup.shapes.schedules(mesh.pp, m)
        if schedules:  # (none can run the split where a given one needs other chunks)
            yield m, mbs, schedules


def weigh_microbatch_count(setup: ScanSetup, found: Scan, mesh: Mesh, m: int, mbs: int, schedules: list) -> bool:
    """Weigh ``mesh``'s layouts at ``m`` micro-batches of ``mbs`` sequences, and score those that may
    fit and be kept; whether larger micro-batches may still fit (not where layouts were weighed and
    none may)."""
    examined = larger_may_fit = False
    for layout in candidate_layouts(setup, mesh, m, schedules):
        examined = True
        candidate = Candidate(layout, mesh, mbs, schedules)
        memory, fits_larger = memory_floor(setup, found, candidate)
        larger_may_fit = larger_may_fit or fits_larger
        if memory is None:
            continue
        terms = time_floors(setup, found, candidate, memory)
        if terms is not None:
            score_schedules(setup, found, candidate, memory, terms)
    return larger_may_fit or not examined


def candidate_layouts(setup: ScanSetup, mesh: Mesh, m: int, schedules: list) -> Iterator[Layout]:
    """``mesh``'s layouts at ``m`` micro-batches, one for each of its sp choices and each (ZeRO,
    dp_replicate) pair that train's validation accepts, each with the first of ``schedules`` where
    there are no stages (with one schedule only Layout.validate checks it: the mesh carries it).

    ZeRO-1 never beats ZeRO-2 without hybrid sharding (same gathers, a reduce-scatter no longer than
    ZeRO-1's reduction, less memory) where ZeRO-2 reduces once a step: on a reference stack always,
    on plait's engine with one micro-batch or on pipeline stages, over more than 2 dp·cp ranks (its
    fp32 rows are as large as the whole bf16 gradients over 2; a test holds it). Such a ZeRO-1 is
    skipped unless asked for or unless its ZeRO-2 is refused."""
    spec, kernels, gpus, batch = setup.workload.spec, setup.workload.kernels, setup.gpus, setup.workload.global_batch
    zero2_dominates = (not kernels.plait_engine or mesh.dp * mesh.cp > 2 and reduction_rounds(
        Layout(dp=mesh.dp, cp=mesh.cp, pp=mesh.pp, microbatches=m, zero=2)) == 1)
    schedule, v = schedules[0][:2] if mesh.pp == 1 else (Layout.schedule, 1)
    for sp in mesh.sp_choices:
        verdicts: dict[tuple[int, int], list[str]] = {}  # the shared validation's, by (ZeRO, dp_replicate)
        for zero, replicate in mesh.zeros:
            dominated = zero == 1 and replicate == 1 and "zero" not in setup.fixed and zero2_dominates
            layout = Layout(dp=mesh.dp, tp=mesh.tp, cp=mesh.cp, pp=mesh.pp, sp=sp, microbatches=m,
                            grad_compression=setup.compression, cp_algorithm=mesh.algorithm, zero=zero,
                            dp_replicate=replicate, schedule=schedule, virtual_stages=v,
                            stage_layers=setup.shapes.stage_layers, offload_activations=setup.offload)
            if setup.compression != "none" and refused(layout):
                continue
            # The shared validation in two parts (plait.facts.validity.layout_problems): the mesh once
            # here, the schedule and stage split once per schedule for all meshes. A dominated ZeRO-1
            # is skipped only where its ZeRO-2 passes them (DeepSpeed's pipeline engine runs ZeRO-1 at
            # most beside stages); ZeRO-2's verdict is kept for its own turn.
            if dominated:
                verdicts[2, 1] = mesh_problems(spec, replace(layout, zero=2), gpus, batch, kernels)
                if not verdicts[2, 1]:  # (mesh_problems includes what ``refused`` asks)
                    continue
            if (zero, replicate) not in verdicts:
                verdicts[zero, replicate] = mesh_problems(spec, layout, gpus, batch, kernels)
            if not verdicts[zero, replicate]:
                yield layout


def memory_floor(setup: ScanSetup, found: Scan, candidate: Candidate) -> tuple[RankMemory | None, bool]:
    """What ``candidate``'s examined ranks hold, or None where none of its schedules can fit (counted
    too large); and whether a larger micro-batch of the same choices may fit.

    Each kind of examined rank (first, last, layers held: what every schedule's ranks are) holds its
    model states and the other bytes besides its activations: where even the least of those exceeds
    the memory, no schedule fits whatever the activations (nor any larger micro-batch, but where
    autocast's weight copies shrink: plait.plan.peaks.least_memory_at_larger_microbatches). Unless
    one could be the smallest seen (the peak the error names), nothing more is computed."""
    layout, mesh, mbs, schedules = candidate
    spec, precision, kernels = setup.workload.spec, setup.workload.precision, setup.workload.kernels
    pp, zero, capacity = layout.pp, layout.zero, setup.capacity
    states = setup.layout_costs.rank_states(layout, mesh.per_rank)
    other = other_bytes(spec, layout, mbs, precision, setup.hw.reserved_bytes, kernels)
    weights = (autocast_copies_weights(precision, zero, pp), zero == 3 and pp == 1) if kernels.plait_engine else None
    weight_copies = pp > 1 and weights is not None and weights[0]
    kept_states = {kind: (states.first if kind[0] else states.last if kind[1] else states.middle)
                   - (mesh.per_rank - kind[2]) * states.per_layer
                   for kind in setup.shapes.rank_kinds(pp, layout.microbatches)}
    least_besides = min(kept_states.values(), default=0.0) + other
    if setup.bound and least_besides > capacity and least_besides >= found.smallest[0]:
        found.oversized += len(schedules)
        return None, bool(weight_copies and states.middle + other <= capacity)
    memory = rank_memory(setup, candidate, kept_states, other, weights)
    larger_may_fit = least_memory_at_larger_microbatches(memory.least_peaks, states.middle + other,
                                                         weight_copies) <= capacity
    if min(memory.least_peaks) > capacity:
        found.oversized += len(schedules)
        note_smallest_too_large(setup, found, candidate, memory)
        return None, larger_may_fit
    return memory, larger_may_fit


def rank_memory(setup: ScanSetup, candidate: Candidate, kept_states: dict[tuple, float], other: float,
                weights: tuple | None) -> RankMemory:
    """``candidate``'s activations per layer under each recomputation (what they read of the ZeRO
    stage and the stages on plait's engine: ``weights``), each kind of examined rank's bytes besides
    them (``kept_states`` and ``other``, with the head's loss backward on the last rank), and each
    schedule's smallest peak, under the recomputation keeping least: above the memory there is, that
    schedule cannot fit."""
    layout, _, mbs, schedules = candidate
    stream = residual_stream_bytes(setup.workload.precision, layout.zero, layout.pp, setup.workload.kernels)
    ends = setup.layout_costs.stream_costs(layout, mbs, stream)
    held, working = setup.layout_costs.activations(layout, mbs, weights)
    besides = {kind: kept + other + (ends.loss_backward if kind[1] else 0.0) for kind, kept in kept_states.items()}
    least = min(held[rc] for rc in setup.recomputations.accepted)
    least_peaks = [schedule_peak(beside_activations(holds, kinds, besides), least, ends.head_activations, (0.0, 0.0))
                   for _, _, holds, _, kinds in schedules]
    return RankMemory(besides, held, working, least_peaks, ends.loss_backward + ends.head_activations, ends, stream)


def note_smallest_too_large(setup: ScanSetup, found: Scan, candidate: Candidate, memory: RankMemory) -> None:
    """Note the smallest peak of a layout none of whose schedules fits: its schedule of the smallest
    floor under the recomputation keeping least, with the block that recomputation replays."""
    schedules = candidate.schedules
    name, v, holds, _, kinds = schedules[min(range(len(schedules)), key=memory.least_peaks.__getitem__)]
    rc = min(setup.recomputations.accepted, key=memory.held.__getitem__)
    replayed = replayed_block_extra_bytes(memory.working[rc], schedule_spec(name).splits_backward, v, memory.freed)
    peak = schedule_peak(beside_activations(holds, kinds, memory.besides), memory.held[rc],
                         memory.ends.head_activations, replayed)
    found.note_smallest(peak, scanned_fields(candidate.layout, name, v, rc, 0))


def time_floors(setup: ScanSetup, found: Scan, candidate: Candidate, memory: RankMemory) -> StepTerms | None:
    """What ``candidate``'s schedules share of their step, or None where a floor on it cannot enter the
    kept layouts (its schedules counted, not scored).

    The first floor is the layers' compute alone (their communication, the ends' extra work and the
    flush only add to it), which spares costing the rest; the second is the slowest rank's work for
    every micro-batch plus the flush, which no schedule beats (some rank holds ⌈layers / pp⌉ layers
    or more)."""
    layout, mesh, mbs, _ = candidate
    pass_costs, layout_costs, tp, pp, zero = setup.pass_costs, setup.layout_costs, layout.tp, layout.pp, layout.zero
    passes = pass_costs.layer_passes(tp, pp, zero)
    beside_layers = EndsAndGradients(
        memory.ends.head_kernels + pass_costs.end_passes(tp, pp, zero, pp == 1, True),
        memory.ends.embedding_kernels + (pass_costs.end_passes(tp, pp, zero, True, False) if pp > 1 else 0.0),
        *pass_costs.gradients(tp, pp, zero, layout.microbatches))
    times = layout_costs.layer_times(layout, mbs, passes)
    level = complexity(layout.dp, tp, layout.cp, pp, setup.hw.gpus_per_node, setup.workload.spec.seq_len,
                       full_shard_ranks(layout))
    time_to_beat = found.time_to_beat(level, setup.keep) if setup.bound else math.inf
    if compute_floor(setup, candidate, times, beside_layers) >= time_to_beat:
        found.count_bounded(memory.least_peaks, setup.capacity)
        return None
    work = layout_costs.layer_work(layout, mbs, passes, memory.stream, times)
    flush = layout_costs.flush(layout, mesh.params, mesh.tensors, mesh.per_rank)
    by_recompute = recompute_costs(setup, candidate, memory, work, flush, beside_layers)
    # (an overlapped parameter gather hides more under interleaving: its floor has it all hidden)
    gathered = flush.first_gather is not None and pp > 1
    floors = step_floors(setup, candidate, by_recompute, flush, gathered, beside_layers)
    if min(floors.values()) >= time_to_beat:
        found.count_bounded(memory.least_peaks, setup.capacity)
        return None
    fastest_first = sorted(setup.recomputations.accepted, key=lambda rc: by_recompute[rc].work)
    split_refuses = setup.recomputations.split_refuses
    return StepTerms(beside_layers, by_recompute, flush, gathered, level, fastest_first,
                     [rc for rc in fastest_first if rc not in split_refuses],
                     setup.recomputations.partial and floors["none"] < time_to_beat)


def compute_floor(setup: ScanSetup, candidate: Candidate, times: dict[str, LayerTimes],
                  beside_layers: EndsAndGradients) -> float:
    """The floor from the layers' compute ``times`` alone, the least under any costed recomputation
    (summed in ``step_floors``' order, each term no larger than its counterpart there)."""
    layers, per_rank = setup.workload.spec.layers, candidate.mesh.per_rank
    m, pp = candidate.layout.microbatches, candidate.layout.pp
    head_work, layer_gradients = beside_layers.head, beside_layers.layer_gradients
    return min(
        m * (per_rank * c if pp > 1 else layers * c + head_work)
        + min(0.0, (pp - 1) * ((t.forward + t.backward_input + t.recompute - t.backward_weight) * layers / pp))
        + per_rank * layer_gradients
        for t in (times[rc] for rc in setup.recomputations.costed) for c in (t.forward + t.backward + t.recompute,))


def recompute_costs(setup: ScanSetup, candidate: Candidate, memory: RankMemory, work: dict[str, LayerWork],
                    flush: FlushCosts, beside_layers: EndsAndGradients) -> dict[str, RecomputeCosts]:
    """Per costed recomputation: a stage's activations per micro-batch, and its work per micro-batch
    (less the pipeline engine's, which grows with v) with its flush."""
    layers, pp, per_rank = setup.workload.spec.layers, candidate.layout.pp, candidate.mesh.per_rank
    head_work, embedding_work = beside_layers.head, beside_layers.embedding
    by_recompute = {}
    for rc in setup.recomputations.costed:
        layer = work[rc]
        by_recompute[rc] = RecomputeCosts(
            memory.held[rc], (layers * layer.work + head_work + embedding_work + layer.first_gather) / pp,
            layer.work, embedding_work + layer.first_gather, layer.fill_deferred * layers / pp,
            flush.exposed(per_rank * layer.backward, per_rank * layer.forward) + flush.optimizer,
            layer.backward, layer.forward)
    return by_recompute


def step_floors(setup: ScanSetup, candidate: Candidate, by_recompute: dict[str, RecomputeCosts], flush: FlushCosts,
                gathered: bool, beside_layers: EndsAndGradients) -> dict[str, float]:
    """Per costed recomputation, the slowest rank's work for every micro-batch plus the flush (all of
    an overlapped parameter gather hidden where ``gathered``): no schedule's step is shorter."""
    layers, per_rank = setup.workload.spec.layers, candidate.mesh.per_rank
    m, pp = candidate.layout.microbatches, candidate.layout.pp
    head_work, layer_gradients = beside_layers.head, beside_layers.layer_gradients
    return {rc: m * (max(per_rank * r.work, r.mean) if pp > 1 else layers * r.work + r.embedding_extra + head_work)
            + min(0.0, (pp - 1) * r.fill_deferred) + per_rank * layer_gradients
            + (flush.exposed(per_rank * r.backward, math.inf) + flush.optimizer if gathered else r.flushed)
            for rc, r in by_recompute.items()}


def score_schedules(setup: ScanSetup, found: Scan, candidate: Candidate, memory: RankMemory, terms: StepTerms) -> None:
    """Score each of ``candidate``'s schedules under the fastest recomputation that fits (a split
    backward one it can replay twice) and, where that recomputes whole blocks, under full
    recomputation of the fewest blocks of each chunk that fit (or as many as pinned); count a
    schedule that fits under none too large."""
    layout, capacity, pinned_blocks = candidate.layout, setup.capacity, setup.recomputations.pinned_blocks
    for (name, v, holds, middle, kinds), least_peak in zip(candidate.schedules, memory.least_peaks):
        pipeline = schedule_spec(name)
        tried = terms.split_fastest_first if pipeline.splits_backward else terms.fastest_first
        if not tried or least_peak > capacity:  # (a split backward's own recomputations keep no less)
            found.oversized += 1
            continue
        choice = ScheduleChoice(name, v, pipeline, tuple(beside_activations(holds, kinds, memory.besides)),
                                holds[0].layers, holds[-1].layers, middle)
        fitting = fitting_recomputation(setup, found, layout, memory, choice, tried)
        if fitting is None:  # none fits with its recomputed block, or a split backward without the one keeping least
            found.oversized += 1
            continue
        rc, peak = fitting
        scored = [] if pinned_blocks is not None else [(rc, terms.by_recompute[rc], peak, None)]
        if terms.try_partial and rc in ("op", "full"):
            partial = partial_recomputation(setup, candidate, memory, terms, choice)
            if partial is not None:
                scored.append(partial)
        for rc, costs, peak, blocks in scored:
            step = schedule_step(setup, candidate, memory, terms, choice, costs)
            found.record(scanned_fields(layout, name, v, rc, blocks or 0), step, peak, capacity, setup.keep,
                         terms.level)


def fitting_recomputation(setup: ScanSetup, found: Scan, layout: Layout, memory: RankMemory, choice: ScheduleChoice,
                          tried: list[str]) -> tuple[str, float] | None:
    """The first of ``tried`` under which the schedule's peak fits, with that peak, each replaying its
    recomputed block; the peak of each before it noted as a smallest candidate."""
    for rc in tried:
        replayed = replayed_block_extra_bytes(memory.working[rc], choice.pipeline.splits_backward, choice.v,
                                              memory.freed)
        peak = schedule_peak(choice.ranks, memory.held[rc], memory.ends.head_activations, replayed)
        if peak <= setup.capacity:
            return rc, peak
        if peak < found.smallest[0]:  # (its fields are recorded only where it is the smallest yet)
            found.note_smallest(peak, scanned_fields(layout, choice.name, choice.v, rc, 0))
    return None


def partial_recomputation(setup: ScanSetup, candidate: Candidate, memory: RankMemory, terms: StepTerms,
                          choice: ScheduleChoice) -> tuple[str, RecomputeCosts, float, int] | None:
    """Full recomputation of only the first blocks of each chunk, as pinned, or the fewest that fit
    where that is fewer than every block a rank holds: (``full``, its costs, its peak, the blocks).
    (Every chunk keeping a block, only a split backward adds the replayed one: replayed_block_bytes.)"""
    pinned_blocks, by_recompute = setup.recomputations.pinned_blocks, terms.by_recompute
    head, full_working = memory.ends.head_activations, memory.working["full"]
    replayed = full_working if choice.pipeline.splits_backward else 0.0
    blocks = pinned_blocks or fewest_recomputed(choice.ranks, by_recompute["none"].held, by_recompute["full"].held,
                                                head, setup.capacity - replayed)
    if pinned_blocks or blocks is not None and blocks * choice.v < min(
            hold.layers for hold, _ in choice.ranks if hold.layers):
        return partial_candidate(choice, by_recompute, blocks, candidate.mesh.per_rank, head, full_working, memory.freed)
    return None


def schedule_step(setup: ScanSetup, candidate: Candidate, memory: RankMemory, terms: StepTerms,
                  choice: ScheduleChoice, costs: RecomputeCosts) -> float:
    """One schedule's step under one recomputation's ``costs``, in closed form
    (plait.plan.pipeline.estimate_step), with the flush and the gradient passes after it.

    A rank's v chunks each pass forward and backward once a micro-batch, each pass costing the
    stack's own time beside the layers and, where its sends block, the send; the fill's one chunk
    passes both ways too, its sends in the boundary's flight."""
    kernels, per_rank = setup.workload.kernels, candidate.mesh.per_rank
    m, pp, name, v = candidate.layout.microbatches, candidate.layout.pp, choice.name, choice.v
    flush, beside = terms.flush, terms.beside_layers
    flushed = costs.flushed
    if terms.gathered and v > 1:
        window = gather_window(per_rank * costs.forward, v, pp, m)
        flushed = flush.exposed(per_rank * costs.backward, window) + flush.optimizer
    first_stage = choice.first_layers * costs.work + costs.embedding_extra
    if pp == 1:
        slowest = first_stage + beside.head
    else:
        last_stage = choice.last_layers * costs.work + beside.head
        slowest = first_stage if first_stage > last_stage else last_stage
        if choice.middle_layers * costs.work > slowest:
            slowest = choice.middle_layers * costs.work
    fill = costs.fill_deferred if choice.pipeline.fill is Fill.DEFERRED_WEIGHTS else costs.mean / v
    fill += 2 * kernels.chunk_pass_s
    sending = 2 * v * (kernels.chunk_pass_s + (memory.ends.waited if name in kernels.blocking_sends else 0.0))
    gradients = max(choice.first_layers * beside.layer_gradients + beside.first_gradients,
                    choice.last_layers * beside.layer_gradients + beside.last_gradients,
                    choice.middle_layers * beside.layer_gradients)
    work = StageWork(costs.mean + sending, slowest + sending, fill, memory.ends.flight)
    return estimate_step(name, pp, v, m, work) + flushed + gradients
