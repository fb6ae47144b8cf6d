"""The planner's first pass: every valid layout scored in closed form (plait.plan.search says how the
two passes meet)."""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass, field, replace

from plait.facts.activations import (
    activation_bytes_per_layer, autocast_copies_weights, head_activation_bytes, held_between_passes,
    loss_backward_bytes, recompute_working_bytes, residual_stream_bytes,
)
from plait.facts.collectives import norm_gradient_elements
from plait.facts.model_state import rank_model_states, rank_parameters, rank_tensors, reduction_rounds
from plait.facts.stack import Kernels
from plait.facts.validity import (
    fit_problems, layout_problems, mesh_problems, reads_saved_once_per_backward, recomputes_once_per_backward,
    spec_problems,
)
from plait.facts.weight_passes import WeightPasses, layer_passes
from plait.layout import RECOMPUTE, ZIGZAG_ALGORITHMS, Layout
from plait.models.spec import ModelSpec
from plait.plan.compute import LayerTimes, end_pass_seconds, gradient_seconds, head_times, layer_times_by_recompute
from plait.plan.costs import end_collectives, layer_cost, stage_boundaries
from plait.plan.hardware import Hardware
from plait.plan.memory import other_bytes
from plait.plan.peaks import (
    StageShapes, beside_activations, beyond, fewest_recomputed, partial_candidate, replayed_adds, schedule_peak,
)
from plait.plan.pipeline import estimate_step
from plait.plan.ranking import complexity, full_shard_ranks
from plait.plan.simulate import FlushCosts, Workload, flush_costs, gather_window
from plait.plan.space import divisors, meshes, options, refused, scanned_layout, zero_choices
from plait.schedules.registry import SCHEDULES, Fill, schedule_spec


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

    def bar(self, level: int, keep: int) -> float:
        """The step time a layout at complexity ``level`` must beat to be kept (or to be the fastest)."""
        slowest_kept = -self.best[0][0] if len(self.best) >= keep else math.inf
        return max(slowest_kept, self.simplest.get(level, (math.inf,))[0])

    def note_smallest(self, peak: float, fields: tuple) -> None:
        if peak < self.smallest[0]:
            self.smallest = (peak, fields)

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
    spec, precision, kernels, layers = workload.spec, workload.precision, workload.kernels, workload.spec.layers
    stage_layers = fixed.get("stage_layers")
    # Activation offload is modelled when pinned, never searched: plait's copies wait on the compute
    # stream and lose to recomputation on every catalog model, and no published run shows what
    # Megatron-Core's overlapped copies cost when eight GPUs and their NICs share PCIe and host memory.
    offload = fixed.get("offload_activations", False)
    recomputes = tuple(rc for rc in options(fixed, "recompute", RECOMPUTE)
                       if not layout_problems(spec, Layout(recompute=rc, offload_activations=offload), kernels=kernels))
    # The recomputations a backward split in halves (zb-h1's) cannot run.
    split_refuses = {rc for rc in recomputes
                     if not recomputes_once_per_backward(True, rc) or not reads_saved_once_per_backward(True, offload)}
    # Full recomputation of only the first N blocks of each chunk: as pinned, or, with neither
    # recomputation flag pinned, the fewest N that fit wherever only full recomputation fits.
    pinned_blocks = fixed.get("recompute_layers")
    if pinned_blocks is not None and fixed.get("recompute") != "full":  # as train: it names full recomputation's blocks
        return Scan()
    partial = (pinned_blocks is not None or "recompute" not in fixed) and not offload and kernels.partial_recompute
    costed = recomputes + ("none", "full") if partial else recomputes
    costed = tuple(dict.fromkeys(costed))
    # Gradient compression is modelled when pinned, never searched: PowerSGD changes the training.
    compression = fixed.get("grad_compression", "none")
    # Dominated choices, skipped unless asked for or unless the dominating one is refused: without
    # sp a layout is never faster (but for the gather of learned positions' gradient sp adds, under
    # 0.1% of a step) nor smaller than with it, and ZeRO-1 never beats ZeRO-2 without hybrid
    # sharding (same gathers, a reduce-scatter no longer than ZeRO-1's reduction, less memory) where
    # ZeRO-2 reduces once a step: on a reference stack always, on plait's engine with one micro-batch
    # or on pipeline stages, over more than 2 dp·cp ranks (its fp32 rows are as large as the whole bf16
    # gradients over 2). Tests hold both claims.
    waiting = replace(kernels, blocking_sends=tuple(SCHEDULES))  # each boundary's transfer apart from its gather
    works: dict[tuple, dict] = {}
    acts: dict[tuple, tuple[float, float]] = {}
    times_cache: dict[tuple, dict[str, LayerTimes]] = {}
    flushes: dict[tuple, FlushCosts] = {}
    states: dict[tuple, tuple[float, float]] = {}
    shapes = StageShapes(spec, kernels, fixed)
    schedule_list, rank_kinds = shapes.schedules, shapes.rank_kinds
    costs = _PassCosts(spec, hw, precision, kernels, compression, gpus)
    layer_pass_bytes, end_pass_s, gradient_s, end_times = costs.layer_passes, costs.end_passes, costs.gradients, costs.ends

    found, capacity = Scan(), hw.usable_memory_bytes
    if spec_problems(spec) or not recomputes:  # no layout can run it (the caller says why, from run_problems)
        return found
    for tp, cp, pp, dp, algorithm in meshes(workload, gpus, fixed):
        per_rank = math.ceil(layers / pp)
        params = (rank_parameters(spec, per_rank, True, pp == 1, tp), rank_parameters(spec, per_rank, pp == 1, True, tp))
        tensors = max(rank_tensors(spec, per_rank, True, pp == 1, pp), rank_tensors(spec, per_rank, pp == 1, True, pp))
        per_replica = workload.global_batch // dp
        zeros = zero_choices(fixed, hw, Layout(dp=dp, tp=tp, cp=cp))
        # Smallest micro-batches first, so that a mesh can stop where no larger ones can fit
        # (``beyond`` below).
        for m in reversed(options(fixed, "microbatches", divisors(per_replica))):
            mbs = per_replica // m
            if micro_batch and mbs != micro_batch:
                continue
            schedules = schedule_list(pp, m)
            if not schedules:  # no schedule can run the split (a given one that needs other chunks)
                continue
            examined = larger_may_fit = False
            # (where plait's ZeRO-2 reduces once a step over more than 2 ranks; see above)
            zero2_dominates = (not kernels.plait_engine or dp * cp > 2
                               and reduction_rounds(Layout(dp=dp, cp=cp, pp=pp, microbatches=m, zero=2)) == 1)
            for sp in options(fixed, "sp", (True, False) if tp > 1 else (False,)):
                base = Layout(dp=dp, tp=tp, cp=cp, pp=pp, sp=sp, microbatches=m, grad_compression=compression,
                              cp_algorithm=algorithm, offload_activations=offload)
                if sp and fit_problems(spec, base, kernels):
                    continue
                if tp > 1 and not sp and "sp" not in fixed and not fit_problems(spec, replace(base, sp=True), kernels):
                    continue
                by_stream: dict[int, tuple[float, ...]] = {}  # what the residual stream's dtype decides
                times_of: dict[tuple, dict] = {}  # per weight passes and recomputation, filled when a layout may fit
                verdicts: dict[tuple[int, int], list[str]] = {}  # the shared validation's, by (ZeRO, dp_replicate)
                for zero, replicate in zeros:
                    dominated = zero == 1 and replicate == 1 and "zero" not in fixed and zero2_dominates
                    # With one schedule (pp 1) only Layout.validate checks it: the mesh carries it.
                    schedule, v = schedules[0][:2] if pp == 1 else (Layout.schedule, 1)
                    staged = Layout(dp=dp, tp=tp, cp=cp, pp=pp, sp=sp, microbatches=m, grad_compression=compression,
                                    cp_algorithm=algorithm, zero=zero, dp_replicate=replicate, schedule=schedule,
                                    virtual_stages=v, stage_layers=stage_layers, offload_activations=offload)
                    if compression != "none" and refused(staged):
                        continue
                    # The shared validation in two parts (plait.facts.validity.layout_problems): the
                    # mesh once here, the schedule and stage split once per schedule for all meshes.
                    # A dominated ZeRO-1 is skipped only where its ZeRO-2 passes them (DeepSpeed's
                    # pipeline engine runs ZeRO-1 at most beside stages); ZeRO-2's verdict is kept for
                    # its own turn.
                    if dominated:
                        zero2 = replace(staged, zero=2)
                        verdicts[2, 1] = mesh_problems(spec, zero2, gpus, workload.global_batch, kernels)
                        if not verdicts[2, 1]:  # (mesh_problems includes what ``refused`` asks)
                            continue
                    if (zero, replicate) not in verdicts:
                        verdicts[zero, replicate] = mesh_problems(spec, staged, gpus, workload.global_batch, kernels)
                    if verdicts[zero, replicate]:
                        continue
                    # Read only the mesh sizes, the ZeRO stage and its groups (and, for a measured host's
                    # wrapper overhead, sp); the scan meets each mesh under many micro-batch counts.
                    mesh_key = (tp, cp, pp, dp, zero, replicate, sp)
                    if mesh_key not in states:
                        # The first, a middle and the last rank's model states at ⌈layers / pp⌉ layers,
                        # and what one layer fewer saves.
                        full = [rank_model_states(spec, staged, precision, per_rank, *ends, kernels).total
                                for ends in ((True, pp == 1), (pp == 1, pp == 1), (pp == 1, True))]
                        fewer = rank_model_states(spec, staged, precision, per_rank - 1, pp == 1, pp == 1, kernels).total
                        states[mesh_key] = (*full, full[1] - fewer)
                    other = other_bytes(spec, staged, mbs, precision, hw.reserved_bytes, kernels)
                    first_full, middle_full, last_full, layer_states = states[mesh_key]
                    weights = (autocast_copies_weights(precision, zero, pp), zero == 3 and pp == 1) if kernels.plait_engine else None
                    weight_copies = pp > 1 and weights is not None and weights[0]
                    # Each kind of examined rank (first, last, layers held: what every schedule's ranks
                    # are) holds its model states and the other bytes besides its activations: where
                    # even the least of those exceeds the memory, no schedule fits whatever the
                    # activations (nor, as ``beyond`` says, any larger micro-batch, but where
                    # autocast's weight copies shrink). Unless one could be the smallest seen (the
                    # peak the error names), nothing more is computed.
                    kept_states = {kind: (first_full if kind[0] else last_full if kind[1] else middle_full)
                                   - (per_rank - kind[2]) * layer_states for kind in rank_kinds(pp, m)}
                    least_besides = min(kept_states.values(), default=0.0) + other
                    if bound and schedules and least_besides > capacity and least_besides >= found.smallest[0]:
                        found.oversized += len(schedules)
                        examined = True
                        larger_may_fit = larger_may_fit or weight_copies and middle_full + other <= capacity
                        continue
                    stream = residual_stream_bytes(precision, zero, pp, kernels)
                    if stream not in by_stream:
                        # The slowest boundary's transfer and gather, which the fill and drain wait on, and
                        # where a schedule's sends block, the transfer each of a middle rank's 2v sends a
                        # micro-batch keeps it busy for (the play times each boundary); the ends' work.
                        boundaries = stage_boundaries(spec, hw, staged, mbs, precision, waiting)
                        by_stream[stream] = (max(boundaries.sends) + max(boundaries.flights),
                                             max(boundaries.sends) if kernels.blocking_sends else 0.0,
                                             *end_times(tp, cp, sp, mbs, stream))
                    flight, waited, head_kernels, embedding_kernels, head_act, loss_backward = by_stream[stream]
                    # A stage's activations per micro-batch under each recomputation (what they read of
                    # the ZeRO stage and the stages on plait's engine).
                    held, working = {}, {}
                    for rc in costed:
                        act_key = (tp, sp, cp, rc, mbs, weights, algorithm)
                        if act_key not in acts:
                            acts[act_key] = (held_between_passes(activation_bytes_per_layer(
                                spec, mbs, tp, sp, cp, rc, precision, kernels, zero, pp, algorithm), offload),
                                recompute_working_bytes(spec, mbs, tp, sp, cp, rc, precision, kernels, zero, pp, algorithm))
                        held[rc], working[rc] = acts[act_key]
                    # With the head's loss backward on the last rank, and the least any recomputation
                    # keeps, the schedules' smallest peak: above the memory there is, none of them can fit.
                    besides = {kind: kept + other + (loss_backward if kind[1] else 0.0) for kind, kept in kept_states.items()}
                    least = min(held[rc] for rc in recomputes)
                    lightest = [schedule_peak(beside_activations(holds, kinds, besides), least, head_act, (0.0, 0.0))
                                for _, _, holds, _, kinds in schedules]
                    freed = loss_backward + head_act  # what the last stage frees before any block's backward
                    examined = True
                    larger_may_fit = larger_may_fit or beyond(lightest, middle_full + other, weight_copies) <= capacity
                    if lightest and min(lightest) > capacity:
                        found.oversized += len(schedules)
                        smallest = min(range(len(schedules)), key=lightest.__getitem__)
                        name, v, holds, _, kinds = schedules[smallest]
                        rc = min(recomputes, key=held.__getitem__)
                        replayed = replayed_adds(working[rc], schedule_spec(name).splits_backward, v, freed)
                        found.note_smallest(schedule_peak(beside_activations(holds, kinds, besides), held[rc],
                                                          head_act, replayed),
                                            (dp, tp, cp, pp, sp, zero, name, v, m, rc, compression, algorithm, replicate,
                                             0, offload))
                        continue
                    passes = layer_pass_bytes(tp, pp, zero)
                    # The ends' own passes each micro-batch (with no stages one rank holds both ends), and
                    # the step's passes over the gradients: a layer's, and the ends' on the first and last rank.
                    head_work = head_kernels + end_pass_s(tp, pp, zero, pp == 1, True)
                    embedding_work = embedding_kernels + (end_pass_s(tp, pp, zero, True, False)
                                                          if pp > 1 else 0.0)
                    layer_gradients, first_gradients, last_gradients = gradient_s(tp, pp, zero, m)
                    times = times_of.setdefault(passes, {})
                    if not times:
                        # (a layer's compute reads the algorithm only as zig-zag or not: plait runs the
                        # ring's and the all-gather's attention as one blockwise kernel)
                        time_key = (tp, cp, sp, mbs, algorithm in ZIGZAG_ALGORITHMS if cp > 1 else None, passes)
                        if time_key not in times_cache:
                            times_cache[time_key] = layer_times_by_recompute(spec, hw, precision, mbs, tp, cp, sp,
                                                                             costed, kernels, algorithm, passes)
                        times.update(times_cache[time_key])
                    level = complexity(dp, tp, cp, pp, hw.gpus_per_node, spec.seq_len, full_shard_ranks(staged))
                    bar = found.bar(level, keep) if bound else math.inf
                    # The floor below from the layers' compute alone (their communication, the ends'
                    # extra work and the flush only add to it): when even that cannot enter the kept
                    # layouts, none of these schedules can, and nothing more is costed.
                    # (summed in the floor's own order, each term no larger than its counterpart there)
                    compute_floor = min(
                        m * (per_rank * c if pp > 1 else layers * c + head_work)
                        + min(0.0, (pp - 1) * ((t.forward + t.backward_input + t.recompute - t.backward_weight)
                                               * layers / pp))
                        + per_rank * layer_gradients
                        for t in (times[rc] for rc in costed) for c in (t.forward + t.backward + t.recompute,))
                    if compute_floor >= bar:
                        oversized = sum(light > capacity for light in lightest)
                        found.oversized += oversized
                        found.bounded += len(schedules) - oversized
                        continue
                    # ZeRO-3's per-layer gathers (without stages) depend on its group; a measured host's
                    # wrapper overhead on the stage.
                    key = (tp, cp, sp, mbs, (dp, replicate) if zero == 3 and pp == 1 else 0,
                           (zero, dp * cp > 1) if hw.host_overhead else None, algorithm, passes, stream)
                    if key not in works:
                        works[key] = {rc: _layer_work(replace(staged, recompute=rc), workload, hw, mbs, times) for rc in costed}
                    # (plait's ZeRO-3 without stages reduces its ends' gradients every micro-batch, ZeRO-2 all of them)
                    flush_key = mesh_key + ((m,) if kernels.plait_engine and (zero == 3 and pp == 1
                                                                                or reduction_rounds(staged) > 1) else ())
                    if flush_key not in flushes:
                        flushes[flush_key] = flush_costs(workload, hw, staged, max(params), tensors,
                                                         norm_gradient_elements(spec, per_rank, True, tp, sp))
                    flush = flushes[flush_key]
                    # Per recomputation: a stage's activations per micro-batch, and its work per
                    # micro-batch (less the pipeline engine's, which grows with v) with its flush.
                    per_rc = {}
                    for rc in costed:
                        work, fill_deferred, forward, backward, first_gather = works[key][rc]
                        per_rc[rc] = (held[rc], (layers * work + head_work + embedding_work + first_gather) / pp,
                                      work, embedding_work + first_gather, fill_deferred * layers / pp,
                                      flush.exposed(per_rank * backward, per_rank * forward) + flush.optimizer,
                                      backward, forward)
                    # No schedule beats the slowest rank's work for every micro-batch plus the flush, and
                    # some rank holds ⌈layers / pp⌉ layers or more; when that floor cannot enter the kept
                    # layouts, none of these schedules can.
                    # (an overlapped parameter gather hides more under interleaving: its floor has it all hidden)
                    gathered = flush.first_gather is not None and pp > 1
                    floors = {rc: m * (max(per_rank * r[2], r[1]) if pp > 1 else layers * r[2] + r[3] + head_work)
                              + min(0.0, (pp - 1) * r[4]) + per_rank * layer_gradients
                              + (flush.exposed(per_rank * r[6], math.inf) + flush.optimizer if gathered else r[5])
                              for rc, r in per_rc.items()}
                    # Each schedule takes the fastest recomputation that fits (a split backward one it can
                    # replay twice).
                    order = sorted(recomputes, key=lambda rc: per_rc[rc][2])
                    order_split = [rc for rc in order if rc not in split_refuses] if split_refuses else order
                    if min(floors.values()) >= bar:
                        oversized = sum(light > capacity for light in lightest)
                        found.oversized += oversized
                        found.bounded += len(schedules) - oversized
                        continue
                    # Recomputing some blocks is never faster than recomputing none.
                    some = partial and floors["none"] < bar
                    for (name, v, holds, middle, kinds), light in zip(schedules, lightest):
                        first_layers, last_layers = holds[0].layers, holds[-1].layers
                        pipeline = schedule_spec(name)
                        tried = order_split if pipeline.splits_backward else order
                        if not tried or light > capacity:  # (a split backward's own recomputations keep no less)
                            found.oversized += 1
                            continue
                        ranks = tuple(beside_activations(holds, kinds, besides))
                        for rc in tried:
                            peak = schedule_peak(ranks, per_rc[rc][0], head_act,
                                                 replayed_adds(working[rc], pipeline.splits_backward, v, freed))
                            if peak <= capacity:
                                break
                            found.note_smallest(peak, (dp, tp, cp, pp, sp, zero, name, v, m, rc, compression, algorithm,
                                                       replicate, 0, offload))
                        else:  # none fits with its recomputed block, or a split backward without the one keeping least
                            found.oversized += 1
                            continue
                        candidates = [] if pinned_blocks is not None else [(rc, per_rc[rc], peak, None)]
                        if some and rc in ("op", "full"):
                            # (every chunk keeping a block, only a split backward adds the replayed one:
                            # replayed_block_bytes)
                            replayed = working["full"] if pipeline.splits_backward else 0.0
                            blocks = pinned_blocks or fewest_recomputed(ranks, per_rc["none"][0], per_rc["full"][0],
                                                                        head_act, capacity - replayed)
                            if pinned_blocks or blocks is not None and blocks * v < min(
                                    hold.layers for hold, _ in ranks if hold.layers):
                                candidates.append(partial_candidate(ranks, v, per_rc, blocks, per_rank, head_act,
                                                                    working["full"], pipeline.splits_backward, freed))
                        for rc, (_, mean, work, embedding_extra, fill_deferred, flushed, backward, forward), peak, blocks in candidates:
                            if gathered and v > 1:
                                flushed = flush.exposed(per_rank * backward, gather_window(per_rank * forward, v, pp, m)) + flush.optimizer
                            first_stage = first_layers * work + embedding_extra
                            if pp == 1:
                                slowest = first_stage + head_work
                            else:
                                last_stage = last_layers * work + head_work
                                slowest = first_stage if first_stage > last_stage else last_stage
                                if middle * work > slowest:
                                    slowest = middle * work
                            # (a rank's v chunks each pass forward and backward once a micro-batch, each
                            # pass costing the stack's own time beside the layers and, where its sends block,
                            # the send; the fill's one chunk passes both ways too, its sends in ``flight``)
                            fill = fill_deferred if pipeline.fill is Fill.DEFERRED_WEIGHTS else mean / v
                            fill += 2 * kernels.chunk_pass_s
                            sending = 2 * v * (kernels.chunk_pass_s + (waited if name in kernels.blocking_sends else 0.0))
                            gradients = max(first_layers * layer_gradients + first_gradients,
                                            last_layers * layer_gradients + last_gradients, middle * layer_gradients)
                            step = (estimate_step(name, pp, v, m, mean + sending, slowest + sending, fill, flight) + flushed
                                    + gradients)
                            found.record((dp, tp, cp, pp, sp, zero, name, v, m, rc, compression, algorithm, replicate,
                                          blocks or 0, offload), step, peak, capacity, keep, level)
            if examined and not larger_may_fit:
                break
    return found


class _PassCosts:
    """The scan's costs that read only a few of a layout's sizes, each computed once per scan."""

    def __init__(self, spec: ModelSpec, hw: Hardware, precision: str, kernels: Kernels, compression: str, gpus: int):
        self.spec, self.hw, self.precision, self.kernels = spec, hw, precision, kernels
        self.compression, self.gpus = compression, gpus
        self.layer_passes = functools.cache(self._layer_passes)
        self.end_passes = functools.cache(self._end_passes)
        self.gradients = functools.cache(self._gradients)
        self.ends = functools.cache(self._ends)

    def _layer_passes(self, tp: int, pp: int, zero: int) -> WeightPasses:
        """A layer's passes over its weights in each micro-batch (plait.facts.weight_passes): they read
        the mesh's tp and pp and the ZeRO stage (the compression is the scan's)."""
        return layer_passes(self.spec, Layout(tp=tp, pp=pp, zero=zero, grad_compression=self.compression),
                            self.precision, self.kernels)

    def _end_passes(self, tp: int, pp: int, zero: int, first: bool, last: bool) -> float:
        """The ends' passes in each micro-batch on a rank holding the first and last stage as ``first``
        and ``last`` say (plait.facts.weight_passes)."""
        layout = Layout(tp=tp, pp=pp, zero=zero, grad_compression=self.compression)
        return sum(end_pass_seconds(self.spec, self.hw, layout, self.precision, self.kernels, first, last))

    def _gradients(self, tp: int, pp: int, zero: int, m: int) -> tuple[float, float, float]:
        """A step's gradient accumulation (plait.plan.compute.gradient_seconds): one layer's, and the
        ends' on the first and on the last rank (with no stages, one rank holds both)."""
        layout = Layout(tp=tp, pp=pp, zero=zero, microbatches=m, grad_compression=self.compression)
        spec, hw, precision, kernels = self.spec, self.hw, self.precision, self.kernels
        return (gradient_seconds(spec, hw, layout, precision, kernels, 1, False, False),
                gradient_seconds(spec, hw, layout, precision, kernels, 0, True, pp == 1),
                gradient_seconds(spec, hw, layout, precision, kernels, 0, pp == 1, True))

    def _ends(self, tp: int, cp: int, sp: bool, mbs: int, stream: int) -> tuple[float, float, float, float]:
        """(head's work, embedding's work, head's activation bytes, its loss backward's passing bytes)
        per micro-batch, the residual stream ``stream`` bytes a value: the tp and cp groups' links
        depend only on their sizes (tp innermost, cp next) among the ``gpus`` ranks."""
        spec, hw, precision = self.spec, self.hw, self.precision
        layout = Layout(dp=self.gpus // (tp * cp), tp=tp, cp=cp, sp=sp)
        head, ends = head_times(spec, hw, precision, mbs, tp, cp), end_collectives(spec, hw, layout, mbs, stream)
        return (head.forward + head.backward + ends.head_forward + ends.head_backward,
                ends.embedding_forward + ends.embedding_backward,
                head_activation_bytes(spec, mbs, tp, sp, cp, precision, self.kernels),
                loss_backward_bytes(spec, mbs, tp, cp, self.kernels, precision))


def _layer_work(layout: Layout, workload: Workload, hw: Hardware, mbs: int, times: dict) -> tuple[float, ...]:
    """(forward + backward + recompute + exposed comm, the fill F + I − W where weight passes are
    deferred (zb-h1), forward, backward, ZeRO-3's unhidden first gather) of one layer."""
    lc = layer_cost(workload.spec, hw, layout, mbs, workload.precision, workload.kernels, times[layout.recompute])
    t = lc.times
    work = t.forward + t.backward + t.recompute + lc.comm_forward + lc.comm_backward
    # F + I − W as the play's chunks count them (plan.costs.chunk_costs): F with its
    # collectives, I with the recomputation and the backward's collectives.
    forward, backward_input = t.forward + lc.comm_forward, t.backward_input + t.recompute + lc.comm_backward
    return (work, forward + backward_input - t.backward_weight, forward, t.backward + lc.comm_backward, lc.first_gather)
