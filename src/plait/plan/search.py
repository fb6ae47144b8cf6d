"""Search every valid layout for a model on N devices, drop what does not fit, rank by throughput.

Two passes. The first walks every layout (pp, dp, cp and its algorithm, tp, sp, ZeRO stage, schedule, v,
micro-batch size, recomputation) and scores it with closed forms built from the same per-layer
costs as the simulator: the peak memory of the first, each differently cut middle and the last
pipeline rank, from what each holds of every chunk at its peaks (plait.facts.in_flight), and the
pipeline's closed-form step time
(plait.plan.pipeline.estimate_step). For each choice of everything else, recomputation is tried
from the least work to the most and only the first that fits is scored: the later ones only add
time. A layout that fits under none is counted, not scored. The second pass plays the real schedule (plait.plan.simulate.evaluate) for the best few and
ranks those by the played step time, so ``plait simulate`` with no layout flags is ``plait plan``'s
top pick.
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator, NamedTuple

from plait.errors import ConfigError
from plait.facts.activations import (
    activation_bytes_per_layer, autocast_copies_weights, head_activation_bytes, held_between_passes, loss_backward_bytes,
    recompute_working_bytes, replayed_block_bytes, residual_stream_bytes,
)
from plait.facts.in_flight import held_chunk_counts, peak_microbatches
from plait.facts.model_state import rank_model_states, rank_parameters, rank_tensors, reduction_rounds, zero_group
from plait.facts.stack import Kernels
from plait.facts.validity import (
    compression_problems, fit_problems, layout_problems, mesh_problems, pipeline_problems, reads_saved_once_per_backward,
    recomputes_once_per_backward, run_problems, spec_problems,
)
from plait.facts.weight_passes import WeightPasses, layer_passes
from plait.layout import RECOMPUTE, SCHEDULES, ZIGZAG_ALGORITHMS, Layout
from plait.plan.comm import group_spread
from plait.plan.compute import LayerTimes, end_pass_seconds, gradient_seconds, head_times, layer_times
from plait.plan.costs import end_collectives, layer_cost, stage_boundaries
from plait.plan.hardware import Hardware, stack_hardware
from plait.plan.memory import other_bytes
from plait.plan.pipeline import estimate_step
from plait.plan.simulate import FlushCosts, Prediction, Workload, evaluate, flush_costs, gather_window
from plait.schedules.split import split_layers, split_problems

PLAYED = 8  # layouts whose schedules are played exactly after the closed-form pass
# The planner's own step-time error: its median |error| on the published runs held out of every
# fit (docs/VALIDATION.md). Layouts predicted closer than this cannot be told apart by it.
PLANNER_ERROR = 0.032
MAX_GPUS = 2**20  # no cluster is larger; it keeps every search (and its error message) to seconds


class NothingFits(ConfigError):
    """Every layout agreeing with the flags needs more memory than a device has."""


# The fields a scanned layout is recorded by, in the order of its tuple; by name, as Layout has
# fields the search leaves at their defaults.
SCANNED = ("dp", "tp", "cp", "pp", "sp", "zero", "schedule", "virtual_stages", "microbatches", "recompute",
           "grad_compression", "cp_algorithm", "dp_replicate", "recompute_layers", "offload_activations")


def scanned_layout(fields: tuple, stage_layers: tuple[int, ...] | None = None) -> Layout:
    """The layout a scanned tuple records (recompute_layers 0 there: every block, so that tuples sort)."""
    values = dict(zip(SCANNED, fields))
    return Layout(**values | {"recompute_layers": values.get("recompute_layers") or None}, stage_layers=stage_layers)


@dataclass
class Scan:
    """What a walk over the layouts found: counts, the best fitting, the smallest, the fastest overall."""

    scored: int = 0
    fitting: int = 0
    bounded: int = 0  # layouts left unscored: a floor on their step time could not be kept
    oversized: int = 0  # layouts left unscored: a floor on their memory is more than a device has
    best: list = field(default_factory=list)  # heap of (-step, fields) for the fastest fitting layouts
    # The fastest fitting layout at each complexity (plait.plan.search.complexity),
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


@dataclass
class SearchResult:
    ranked: list[Prediction]
    scored: int
    fitting: int  # of the scored
    reason: str
    bounded: int = 0  # layouts searched but not scored: a floor on their step time could not be kept
    oversized: int = 0  # layouts searched but not scored: a floor on their memory is more than a device has


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending, found in √n steps (GPU counts reach millions)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _options(fixed: dict, name: str, choices) -> tuple:
    return tuple(c for c in choices if fixed.get(name, c) == c)


def _sizes(gpus: int, fixed: dict) -> Iterator[tuple[int, int, int, int]]:
    """Every (tp, cp, pp, dp) whose product is ``gpus`` and that keeps the sizes ``fixed`` pins."""
    for tp in _options(fixed, "tp", divisors(gpus)):
        for cp in _options(fixed, "cp", divisors(gpus // tp)):
            for pp in _options(fixed, "pp", divisors(gpus // (tp * cp))):
                dp = gpus // (tp * cp * pp)
                if fixed.get("dp", dp) == dp:
                    yield tp, cp, pp, dp


def _meshes(workload: Workload, gpus: int, fixed: dict) -> Iterator[tuple[int, int, int, int, str]]:
    """The sizes the model can be cut into, with each context-parallel algorithm of the stack that
    can cut it (the shared validation's tensor, context and stage checks; the rest is checked per
    layout), whose data parallelism divides the global batch. Without cp the algorithm changes
    nothing: the pinned one, or the default."""
    spec, kernels = workload.spec, workload.kernels
    for tp, cp, pp, dp in _sizes(gpus, fixed):
        if split_problems(spec, pp) or workload.global_batch % dp:
            continue
        algorithms = _options(fixed, "cp_algorithm", kernels.cp_algorithms) if cp > 1 else (
            fixed.get("cp_algorithm", Layout.cp_algorithm),)
        for algorithm in algorithms:
            if not fit_problems(spec, Layout(tp=tp, cp=cp, cp_algorithm=algorithm), kernels):
                yield tp, cp, pp, dp, algorithm


def _schedules(pp: int, m: int, layers: int, fixed: dict) -> list[tuple[str, int]]:
    """(schedule, v) pairs to score with pp ranks and m micro-batches (each candidate then passes the
    shared validation). Without stages the schedule changes nothing: the pinned one, or 1f1b."""
    if pp == 1:
        return [(fixed.get("schedule", "1f1b"), fixed.get("virtual_stages", 1))]
    out = []
    for name in _options(fixed, "schedule", ("naive", "gpipe", "1f1b", "zb-h1", "interleaved-1f1b")):
        if name == "interleaved-1f1b":
            out += [(name, v) for v in _virtual_stages(pp, layers, fixed)]
        else:
            out.append((name, 1))
    return [(n, v) for n, v in out if fixed.get("virtual_stages", v) == v]


def _virtual_stages(pp: int, layers: int, fixed: dict) -> tuple[int, ...] | range:
    """Interleaving's chunks per rank to try: as pinned, else as many as a given split has chunks per
    rank (it may leave its end chunks empty, so more than layers / pp), else every v of at least a
    block a chunk."""
    if "virtual_stages" in fixed:
        return (fixed["virtual_stages"],)
    given = fixed.get("stage_layers")
    if given is not None:
        return (len(given) // pp,) if len(given) % pp == 0 and len(given) // pp > 1 else ()
    return range(2, layers // pp + 1)


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
    recomputes = tuple(rc for rc in _options(fixed, "recompute", RECOMPUTE)
                       if not layout_problems(spec, Layout(recompute=rc, offload_activations=offload), kernels=kernels))
    # Full recomputation of only the first N blocks of each chunk: as pinned, or, with neither
    # recomputation flag pinned, the fewest N that fit wherever only full recomputation fits.
    zb_refuses = {rc for rc in recomputes
                  if not recomputes_once_per_backward("zb-h1", rc) or not reads_saved_once_per_backward("zb-h1", offload)}
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
    # or on pipeline stages, over more than 2 ranks (its fp32 rows are as large as the whole bf16
    # gradients over 2). Tests hold both claims.
    waiting = replace(kernels, blocking_sends=SCHEDULES)  # each boundary's transfer apart from its gather
    works: dict[tuple, dict] = {}
    acts: dict[tuple, tuple[float, float]] = {}
    times_cache: dict[tuple, LayerTimes] = {}
    flushes: dict[tuple, FlushCosts] = {}
    states: dict[tuple, tuple[float, float]] = {}

    @functools.cache
    def schedule_fits(pp: int, m: int, name: str, v: int) -> bool:
        return not pipeline_problems(spec, Layout(pp=pp, microbatches=m, schedule=name, virtual_stages=v,
                                                  stage_layers=stage_layers), kernels)

    @functools.cache
    def schedule_list(pp: int, m: int) -> list[tuple[str, int, tuple[RankHold, ...], int, tuple[tuple, ...]]]:
        """(schedule, v, what the examined ranks hold at their peaks, the most layers a middle rank
        holds, and each examined rank's (first, last, layers): what its bytes besides the
        activations read) of those that can run."""
        listed = [(n, v, held_at_peaks(n, pp, v, peak_microbatches(pp, v, m)))
                  for n, v in _schedules(pp, m, layers, fixed) if pp == 1 or schedule_fits(pp, m, n, v)]
        return [(n, v, holds, middle_layers(pp, v), tuple((hold.first, hold.last, hold.layers) for hold in holds))
                for n, v, holds in listed]

    @functools.cache
    def rank_kinds(pp: int, m: int) -> tuple[tuple, ...]:
        """Every (first, last, layers) an examined rank of the schedules of ``schedule_list`` has."""
        return tuple({kind: None for *_, kinds in schedule_list(pp, m) for kind in kinds})

    @functools.cache
    def held_at_peaks(name: str, pp: int, v: int, m: int) -> tuple[RankHold, ...]:
        return tuple(RankHold.of(held_chunk_counts(name, pp, v, m, r), chunks, r == 0, r == pp - 1)
                     for r, chunks in examined_ranks(pp, v))

    @functools.cache
    def layer_pass_bytes(tp: int, pp: int, zero: int) -> WeightPasses:
        """A layer's passes over its weights in each micro-batch (plait.facts.weight_passes): they read
        the mesh's tp and pp and the ZeRO stage (the compression is the scan's)."""
        return layer_passes(spec, Layout(tp=tp, pp=pp, zero=zero, grad_compression=compression), precision, kernels)

    @functools.cache
    def end_pass_s(tp: int, pp: int, zero: int, first: bool, last: bool) -> float:
        """The ends' passes in each micro-batch on a rank holding the first and last stage as ``first``
        and ``last`` say (plait.facts.weight_passes)."""
        layout = Layout(tp=tp, pp=pp, zero=zero, grad_compression=compression)
        return sum(end_pass_seconds(spec, hw, layout, precision, kernels, first, last))

    @functools.cache
    def gradient_s(tp: int, pp: int, zero: int, m: int) -> tuple[float, float, float]:
        """A step's gradient accumulation (plait.plan.compute.gradient_seconds): one layer's, and the
        ends' on the first and on the last rank (with no stages, one rank holds both)."""
        layout = Layout(tp=tp, pp=pp, zero=zero, microbatches=m, grad_compression=compression)
        return (gradient_seconds(spec, hw, layout, precision, kernels, 1, False, False),
                gradient_seconds(spec, hw, layout, precision, kernels, 0, True, pp == 1),
                gradient_seconds(spec, hw, layout, precision, kernels, 0, pp == 1, True))

    @functools.cache
    def middle_layers(pp: int, v: int) -> int:
        return max((sum(chunks) for r, chunks in examined_ranks(pp, v) if 0 < r < pp - 1), default=0)

    @functools.cache
    def examined_ranks(pp: int, v: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """(rank, layers in each of its chunks) of the first rank, of the first middle rank with each
        cut of its chunks, and of the last, as the stage split the play uses cuts them (with
        interleaving the ends often hold fewer than ⌈layers / pp⌉). Every peak of a rank is covered
        by a peak of each earlier rank (as many of each chunk or more: tests/test_plan_memory.py),
        so a middle rank whose chunks are cut as an earlier one's holds no more than it."""
        counts = [len(r) for r in split_layers(spec, pp, v, stage_layers)]
        cuts = {}
        for rank in range(1, pp - 1):
            cuts.setdefault(tuple(counts[rank::pp]), rank)
        return ((0, tuple(counts[0::pp])), *((rank, cut) for cut, rank in cuts.items()),
                *(((pp - 1, tuple(counts[pp - 1::pp])),) if pp > 1 else ()))

    @functools.cache
    def end_times(tp: int, cp: int, sp: bool, mbs: int, stream: int) -> tuple[float, float, float, float]:
        """(head's work, embedding's work, head's activation bytes, its loss backward's passing bytes)
        per micro-batch, the residual stream ``stream`` bytes a value: the tp and cp groups' links
        depend only on their sizes (tp innermost, cp next) among the ``gpus`` ranks."""
        layout = Layout(dp=gpus // (tp * cp), tp=tp, cp=cp, sp=sp)
        head, ends = head_times(spec, hw, precision, mbs, tp, cp), end_collectives(spec, hw, layout, mbs, stream)
        return (head.forward + head.backward + ends.head_forward + ends.head_backward,
                ends.embedding_forward + ends.embedding_backward, head_activation_bytes(spec, mbs, tp, sp, cp, precision),
                loss_backward_bytes(spec, mbs, tp, cp, kernels))

    found, capacity = Scan(), hw.usable_memory_bytes
    if spec_problems(spec) or not recomputes:  # no layout can run it (the caller says why, from run_problems)
        return found
    for tp, cp, pp, dp, algorithm in _meshes(workload, gpus, fixed):
        per_rank = math.ceil(layers / pp)
        params = (rank_parameters(spec, per_rank, True, pp == 1, tp, pp), rank_parameters(spec, per_rank, pp == 1, True, tp, pp))
        tensors = max(rank_tensors(spec, per_rank, True, pp == 1, pp), rank_tensors(spec, per_rank, pp == 1, True, pp))
        per_replica = workload.global_batch // dp
        # Smallest micro-batches first, so that a mesh can stop where no larger ones can fit
        # (``beyond`` below).
        for m in reversed(_options(fixed, "microbatches", divisors(per_replica))):
            mbs = per_replica // m
            if micro_batch and mbs != micro_batch:
                continue
            schedules = schedule_list(pp, m)
            examined = larger_may_fit = False
            for sp in _options(fixed, "sp", (True, False) if tp > 1 else (False,)):
                base = Layout(dp=dp, tp=tp, cp=cp, pp=pp, sp=sp, microbatches=m, grad_compression=compression,
                              cp_algorithm=algorithm, offload_activations=offload)
                if sp and fit_problems(spec, base, kernels):
                    continue
                if tp > 1 and not sp and "sp" not in fixed and not fit_problems(spec, replace(base, sp=True), kernels):
                    continue
                by_stream: dict[int, tuple[float, ...]] = {}  # what the residual stream's dtype decides
                times_of: dict[tuple, dict] = {}  # per weight passes and recomputation, filled when a layout may fit
                # (where plait's ZeRO-2 reduces once a step over more than 2 ranks; see above)
                zero2_dominates = not kernels.plait_engine or reduction_rounds(replace(base, zero=2)) == 1 and dp > 2
                verdicts: dict[tuple[int, int], list[str]] = {}  # the shared validation's, by (ZeRO, dp_replicate)
                for zero, replicate in _zero_options(fixed, hw, base):
                    dominated = zero == 1 and replicate == 1 and "zero" not in fixed and zero2_dominates
                    # With one schedule (pp 1) only Layout.validate checks it: the mesh carries it.
                    schedule, v = schedules[0][:2] if pp == 1 else ("1f1b", 1)
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
                    lightest = [_peak(_beside(holds, kinds, besides), least, head_act, (0.0, 0.0))
                                for _, _, holds, _, kinds in schedules]
                    freed = loss_backward + head_act  # what the last stage frees before any block's backward
                    examined = True
                    larger_may_fit = larger_may_fit or beyond(lightest, middle_full + other, weight_copies) <= capacity
                    if lightest and min(lightest) > capacity:
                        found.oversized += len(schedules)
                        smallest = min(range(len(schedules)), key=lightest.__getitem__)
                        name, v, holds, _, kinds = schedules[smallest]
                        rc = min(recomputes, key=held.__getitem__)
                        found.note_smallest(_peak(_beside(holds, kinds, besides), held[rc], head_act,
                                                  _replayed(working[rc], name, v, freed)),
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
                        for rc in costed:
                            # (a layer's compute reads the algorithm only as zig-zag or not: plait runs the
                            # ring's and the all-gather's attention as one blockwise kernel)
                            time_key = (tp, cp, sp, mbs, rc, algorithm in ZIGZAG_ALGORITHMS if cp > 1 else None, passes)
                            if time_key not in times_cache:
                                times_cache[time_key] = layer_times(spec, hw, precision, mbs, tp, cp, sp, rc, kernels,
                                                                    algorithm, passes)
                            times[rc] = times_cache[time_key]
                    # ZeRO-3's per-layer gathers (without stages) depend on its group; a measured host's
                    # wrapper overhead on the stage.
                    key = (tp, cp, sp, mbs, (dp, replicate) if zero == 3 and pp == 1 else 0,
                           (zero, dp > 1) if hw.host_overhead else None, algorithm, passes, stream)
                    if key not in works:
                        works[key] = {rc: _layer_work(replace(staged, recompute=rc), workload, hw, mbs, times) for rc in costed}
                    # (plait's ZeRO-3 without stages reduces its ends' gradients every micro-batch, ZeRO-2 all of them)
                    flush_key = mesh_key + ((m,) if kernels.plait_engine and (zero == 3 and pp == 1
                                                                                or reduction_rounds(staged) > 1) else ())
                    if flush_key not in flushes:
                        flushes[flush_key] = flush_costs(workload, hw, staged, max(params), tensors)
                    flush = flushes[flush_key]
                    # Per recomputation: a stage's activations per micro-batch, and its work per
                    # micro-batch (less the pipeline engine's, which grows with v) with its flush.
                    per_rc = {}
                    for rc in costed:
                        work, fill_zb, forward, backward, first_gather = works[key][rc]
                        per_rc[rc] = (held[rc], (layers * work + head_work + embedding_work + first_gather) / pp,
                                      work, embedding_work + first_gather, fill_zb * layers / pp,
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
                    # Each schedule takes the fastest recomputation that fits (zb-h1 one it can replay twice).
                    order = sorted(recomputes, key=lambda rc: per_rc[rc][2])
                    order_zb = [rc for rc in order if rc not in zb_refuses] if zb_refuses else order
                    level = complexity(dp, tp, cp, pp, hw.gpus_per_node, spec.seq_len, full_shard_ranks(staged, kernels))
                    bar = found.bar(level, keep) if bound else math.inf
                    if min(floors.values()) >= bar:
                        oversized = sum(light > capacity for light in lightest)
                        found.oversized += oversized
                        found.bounded += len(schedules) - oversized
                        continue
                    # Recomputing some blocks is never faster than recomputing none.
                    some = partial and floors["none"] < bar
                    for (name, v, holds, middle, kinds), light in zip(schedules, lightest):
                        first_layers, last_layers = holds[0].layers, holds[-1].layers
                        tried = order_zb if name == "zb-h1" else order
                        if not tried or light > capacity:  # (zb-h1's own recomputations keep no less)
                            found.oversized += 1
                            continue
                        ranks = tuple(_beside(holds, kinds, besides))
                        for rc in tried:
                            peak = _peak(ranks, per_rc[rc][0], head_act, _replayed(working[rc], name, v, freed))
                            if peak <= capacity:
                                break
                            found.note_smallest(peak, (dp, tp, cp, pp, sp, zero, name, v, m, rc, compression, algorithm,
                                                       replicate, 0, offload))
                        else:  # none fits with its recomputed block, or zb-h1 without the one that keeps the least
                            found.oversized += 1
                            continue
                        candidates = [] if pinned_blocks is not None else [(rc, per_rc[rc], peak, None)]
                        if some and rc in ("op", "full"):
                            # (every chunk keeping a block, only zb-h1 adds the replayed one: replayed_block_bytes)
                            replayed = working["full"] if name == "zb-h1" else 0.0
                            blocks = pinned_blocks or _fewest_recomputed(ranks, per_rc["none"][0], per_rc["full"][0],
                                                                         head_act, capacity - replayed)
                            if pinned_blocks or blocks is not None and blocks * v < min(
                                    hold.layers for hold, _ in ranks if hold.layers):
                                candidates.append(_partial(ranks, v, per_rc, blocks, per_rank, head_act, working["full"],
                                                           name, freed))
                        for rc, (_, mean, work, embedding_extra, fill_zb, flushed, backward, forward), peak, blocks in candidates:
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
                            fill = (fill_zb if name == "zb-h1" else mean / v) + 2 * kernels.chunk_pass_s
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


def beyond(lightest: list[float], states: float, weight_copies: bool) -> float:
    """The least memory one (mesh, sp, ZeRO) choice needs at any larger micro-batch: with fewer,
    larger micro-batches each rank holds no fewer micro-batch-sized activations, buffers and logits
    (tests/test_plan_memory.py), so no less than its ``lightest`` schedule now. But where autocast
    keeps a bf16 copy of a stage's weights per micro-batch (``weight_copies``), fewer micro-batches
    in flight can hold fewer copies, and only the ``states`` of a rank holding ⌈layers / pp⌉ layers
    (some rank does) and what else it holds now is certain."""
    return states if weight_copies else min(lightest, default=0.0)


class RankHold(NamedTuple):
    """What one examined pipeline rank holds at its peaks (plait.facts.in_flight.held_chunk_counts):
    each peak's count of every chunk's activations, the layers in each chunk, whether it is the
    first rank and whether the last (whose last chunk carries the head), and per peak (layers held,
    head copies held) where no other peak holds more of both; ``layers`` in all its chunks;
    ``partial_peaks``, filled as ``partial_bytes`` asks, the same under partial recomputation."""

    counts: tuple[tuple[int, ...], ...]
    chunk_layers: tuple[int, ...]
    first: bool
    last: bool
    peaks: tuple[tuple[int, int], ...]
    layers: int
    partial_peaks: dict[int, tuple[tuple[int, int, int], ...]]

    @classmethod
    def of(cls, counts: tuple[tuple[int, ...], ...], chunk_layers: tuple[int, ...], first: bool, last: bool) -> "RankHold":
        pairs = {(sum(n * size for n, size in zip(count, chunk_layers)), count[-1] if last else 0) for count in counts}
        return cls(counts, chunk_layers, first, last, _undominated(pairs), sum(chunk_layers), {})

    def partial_bytes(self, recomputed_layers: int, kept: float, recomputed: float, head: float) -> float:
        """The most activation bytes held where the first ``recomputed_layers`` layers of each chunk
        recompute fully (``recomputed`` bytes a layer), the others keep ``kept`` and each copy of
        the head holds ``head``."""
        peaks = self.partial_peaks.get(recomputed_layers)
        if peaks is None:  # per peak (layers recomputed, layers kept, head copies) held
            peaks = self.partial_peaks[recomputed_layers] = _undominated({
                (sum(c * min(n, recomputed_layers) for c, n in zip(count, self.chunk_layers)),
                 sum(c * max(0, n - recomputed_layers) for c, n in zip(count, self.chunk_layers)),
                 count[-1] if self.last else 0) for count in self.counts})
        return max(held * recomputed + whole * kept + copies * head for held, whole, copies in peaks)


def _beside(holds: tuple[RankHold, ...], kinds: tuple[tuple, ...], besides: dict[tuple, float]
            ) -> Iterator[tuple[RankHold, float]]:
    """Each examined rank's hold with its bytes besides the activations, looked up by its kind."""
    return zip(holds, map(besides.__getitem__, kinds))


def _undominated(points: set[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The points no other point equals or exceeds in every coordinate."""
    return tuple(p for p in points if not any(o != p and all(x >= y for x, y in zip(o, p)) for o in points))


def _peak(ranks: Iterable[tuple[RankHold, float]], act: float, head: float, replayed: tuple[float, float]) -> float:
    """The fullest of a schedule's examined ranks (what it holds, bytes besides the activations),
    each layer holding ``act`` bytes and each copy of the head ``head``, and what the block its
    backward replays adds (``replayed``: on a rank other than the last, on the last) where it has one."""
    peak = 0.0
    for hold, besides in ranks:  # (a hot path of the search: one peak on every rank but the last)
        peaks = hold.peaks
        if len(peaks) == 1:
            held = peaks[0][0] * act + peaks[0][1] * head
        else:
            held = max(held_layers * act + copies * head for held_layers, copies in peaks)
        held += besides + (replayed[hold.last] if hold.layers else 0.0)
        if held > peak:
            peak = held
    return peak


def _replayed(working: float, schedule: str, v: int, freed: float, kept_in_every_chunk: bool = False
              ) -> tuple[float, float]:
    """What the replayed block adds on a rank other than the last and on the last
    (plait.facts.activations.replayed_block_bytes), which holds the last chunk alone when v is 1."""
    return (replayed_block_bytes(working, schedule, kept_in_every_chunk, False, freed),
            replayed_block_bytes(working, schedule, kept_in_every_chunk, v == 1, freed))


def _fewest_recomputed(ranks: tuple, kept: float, recomputed: float, head: float, capacity: float) -> int | None:
    """The fewest layers per chunk whose full recomputation brings every rank within ``capacity``
    (``kept``, ``recomputed``: one layer's bytes without and with it); the most a chunk holds where
    none does. None if recomputing saves nothing."""
    if kept <= recomputed:
        return None
    low, high = 1, max(max(hold.chunk_layers) for hold, _ in ranks)
    while low < high:  # (fewer layers recomputed never hold less)
        middle = (low + high) // 2
        if all(besides + hold.partial_bytes(middle, kept, recomputed, head) <= capacity for hold, besides in ranks):
            high = middle
        else:
            low = middle + 1
    return low


def _partial(ranks: tuple, v: int, per_rc: dict, blocks: int, per_rank: int, head: float, working: float,
             schedule: str, freed: float) -> tuple:
    """(``full``, the per-layer figures of a chunk recomputing its first ``blocks`` layers, its peak
    with the replayed block's ``working`` bytes where they add, ``blocks``): time a blend of none and
    full by the share of a rank's layers recomputed."""
    kept, recomputed = per_rc["none"], per_rc["full"]
    share = min(1.0, blocks * v / per_rank)
    blend = tuple(share * r + (1 - share) * k for k, r in zip(kept, recomputed))
    peak = max(besides + hold.partial_bytes(blocks, kept[0], recomputed[0], head)
               + (_replayed(working, schedule, v, freed, min(n for n in hold.chunk_layers if n) > blocks)[hold.last]
                  if hold.layers else 0.0)
               for hold, besides in ranks)
    return "full", blend, peak, blocks


def _zero_options(fixed: dict, hw: Hardware, base: Layout) -> list[tuple[int, int]]:
    """(ZeRO stage, dp_replicate) pairs to score: every stage sharding over all dp ranks and, when
    the dp ranks span nodes, hybrid sharding inside a node (the largest group of at least two dp
    ranks whose cp·tp blocks fill a node a whole number of times, so no group straddles two; the
    groups replicate across nodes)."""
    dp, block = base.dp, base.cp * base.tp
    inside = max((s for s in divisors(dp) if hw.gpus_per_node % (s * block) == 0), default=1)
    replicates = (fixed["dp_replicate"],) if "dp_replicate" in fixed else (1, dp // inside) if 2 <= inside < dp else (1,)
    return [(zero, replicate) for zero in _options(fixed, "zero", (0, 1, 2, 3) if dp > 1 else (0,))
            for replicate in (replicates if zero else (1,))]


def refused(layout: Layout) -> bool:
    """Whether train refuses ``layout``'s composition whatever the model (a quick prune before the full check)."""
    return bool(compression_problems(layout))


def _layer_work(layout: Layout, workload: Workload, hw: Hardware, mbs: int, times: dict) -> tuple[float, ...]:
    """(forward + backward + recompute + exposed comm, zb-h1's F + I − W, forward, backward, ZeRO-3's
    unhidden first gather) of one layer."""
    lc = layer_cost(workload.spec, hw, layout, mbs, workload.precision, workload.kernels, times[layout.recompute])
    t = lc.times
    work = t.forward + t.backward + t.recompute + lc.comm_forward + lc.comm_backward
    # zb-h1's F + I − W as the play's chunks count them (plan.costs.chunk_costs): F with its
    # collectives, I with the recomputation and the backward's collectives.
    forward, backward_input = t.forward + lc.comm_forward, t.backward_input + t.recompute + lc.comm_backward
    return (work, forward + backward_input - t.backward_weight, forward, t.backward + lc.comm_backward, lc.first_gather)


def search(workload: Workload, hw: Hardware, gpus: int, fixed: dict | None = None,
           micro_batch: int | None = None, top: int = PLAYED, tie_break: str = "simplicity") -> SearchResult:
    """Rank the layouts of ``gpus`` devices that fit; raise ConfigError (saying what would fit) if none does.

    Every layout ranked passes the one validation ``plait train`` uses (plait.facts.validity).
    """
    fixed = fixed or {}
    hw = stack_hardware(hw, workload.kernels)
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
        raise NothingFits(_does_not_fit(workload, hw, gpus, found))
    if tie_break == "simplicity":  # the simpler contenders the fastest few left out
        played = {p.layout for p in ranked}
        for layout in found.simpler_layouts(fixed.get("stage_layers")):
            prediction = evaluate(workload, hw, gpus, layout) if layout not in played else None
            if prediction and prediction.fits:
                ranked.append(prediction)
    ranked = rank(ranked, hw.gpus_per_node, workload.spec.seq_len, workload.kernels, tie_break)
    return SearchResult(ranked[:top], found.scored, found.fitting, explain(ranked, found, hw, tie_break), found.bounded,
                        found.oversized)


# The shortest sequence a published run splits by context parallelism: NeMo's long-context recipes
# (Llama 3 8B and 70B, Mixtral 8×7B, Nemotron: 16k to 128k tokens on cp 2 to 8) and Llama 3 405B's
# 128k stage (cp 16). Below it the planner's costs for the ring have nothing published to be
# checked against, so there context parallelism counts as one more dimension.
CONTEXT_PARALLEL_PRECEDENT_TOKENS = 16384
# The widest ZeRO-3 group without pipeline stages (a gather per layer and micro-batch) among the
# published FSDP runs: llm-foundry's and torchtitan's on 128 GPUs (docs/VALIDATION.md). The only
# wider ones, DeepSpeed's of 2021 on 384-2,240 GPUs, moved their parameters at a ninth of NCCL's
# ring bandwidth; where FSDP's own gathers would show, it kept at least a fifth of it.
FULL_SHARD_PRECEDENT_RANKS = 128


def complexity(dp: int, tp: int, cp: int, pp: int, gpus_per_node: int, seq_len: int, zero3_shards: int = 0) -> int:
    """How many of dp, tp, cp and pp a layout spreads over, one more when tensor parallelism leaves
    the node's NVLink (a group wider than a node, or one straddling two: plait.plan.comm.group_spread),
    one more for context parallelism on a sequence shorter than any published run split, and one
    more for a ZeRO-3 group without pipeline stages (``zero3_shards`` ranks) wider than any
    published FSDP run: each is harder to run and debug, and each is a cost the planner can get
    wrong."""
    return ((dp > 1) + (tp > 1) + (cp > 1) + (pp > 1) + (group_spread(tp, 1, gpus_per_node, dp * tp * cp * pp)[1] > 1)
            + (cp > 1 and seq_len < CONTEXT_PARALLEL_PRECEDENT_TOKENS) + (zero3_shards > FULL_SHARD_PRECEDENT_RANKS))


def full_shard_ranks(layout: Layout, kernels: Kernels) -> int:
    """The ranks a ZeRO-3 group gathers each layer over, micro-batch by micro-batch (0 when it does not)."""
    return zero_group(layout, kernels)[0] if layout.zero == 3 and layout.pp == 1 else 0


def layout_complexity(layout: Layout, gpus_per_node: int, seq_len: int, kernels: Kernels) -> int:
    return complexity(layout.dp, layout.tp, layout.cp, layout.pp, gpus_per_node, seq_len,
                      full_shard_ranks(layout, kernels))


def rank(predictions: list[Prediction], gpus_per_node: int, seq_len: int, kernels: Kernels,
         tie_break: str = "simplicity") -> list[Prediction]:
    """Fastest first; with ``simplicity``, the layouts predicted within the planner's own error of the
    fastest count as tied and come first by complexity (``complexity``), then by time: a layout
    spread over more dimensions must win by more than the planner's error to be recommended."""
    by_time = sorted(predictions, key=lambda p: p.step_time_s)
    if tie_break != "simplicity":
        return by_time
    limit = by_time[0].step_time_s * (1 + PLANNER_ERROR)
    tied = [p for p in by_time if p.step_time_s <= limit]
    return sorted(tied, key=lambda p: (layout_complexity(p.layout, gpus_per_node, seq_len, kernels), p.step_time_s)) + by_time[len(tied):]


def _nothing_valid(workload: Workload, gpus: int, fixed: dict) -> str:
    """Why no layout agrees with the flags: the shared validation's reason for the first mesh of
    ``gpus`` that keeps every pinned size (the pinned choices laid over it)."""
    pinned = {k: v for k, v in fixed.items() if k in SCANNED or k == "stage_layers"}
    for tp, cp, pp, dp in _sizes(gpus, fixed):
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


def _does_not_fit(workload: Workload, hw: Hardware, gpus: int, found: Scan) -> str:
    peak, fields = found.smallest
    head = (f"no layout fits {gpus} × {hw.name} ({hw.memory_bytes / 1e9:.0f} GB each, {hw.memory_headroom:.0%} kept free): the smallest, "
            f"{scanned_layout(fields).describe()}, needs {peak / 1e9:.1f} GB per GPU")
    for scale in (2, 4, 8, 16, 32, 64):
        wider = replace(workload, global_batch=workload.global_batch * scale)
        more = scan(wider, hw, gpus * scale, {}, None, keep=1)
        if more.fitting:
            return f"{head}; {gpus * scale} GPUs would fit it, fastest as {more.layouts()[0].describe()}"
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
