"""The costs the planner's scan (plait.plan.scan) shares between layouts, each computed once per scan."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import NamedTuple

from plait.facts.activations import (
    activation_bytes_per_layer, head_activation_bytes, held_between_passes, loss_backward_bytes,
    recompute_working_bytes,
)
from plait.facts.collectives import norm_gradient_elements
from plait.facts.model_state import PipelineShare, rank_model_states, reduction_rounds
from plait.facts.weight_passes import WeightPasses, layer_passes
from plait.layout import ZIGZAG_ALGORITHMS, Layout
from plait.plan.compute import LayerTimes, end_pass_seconds, gradient_seconds, head_times, layer_times_by_recompute
from plait.plan.costs import end_collectives, layer_cost, stage_boundaries
from plait.hardware import Hardware
from plait.plan.simulate import FlushCosts, flush_costs
from plait.plan.workload import Workload
from plait.schedules.registry import SCHEDULES


class RankStates(NamedTuple):
    """Model-state bytes of the first, a middle and the last pipeline rank holding ⌈layers / pp⌉
    layers, and what one layer fewer saves."""

    first: float
    middle: float
    last: float
    per_layer: float


class StreamCosts(NamedTuple):
    """What the residual stream's dtype decides: the slowest boundary's transfer and gather
    (``flight``), which the fill and drain wait on; where a schedule's sends block, the transfer each
    of a middle rank's 2v sends a micro-batch keeps it busy for (``waited``; the play times each
    boundary); and per micro-batch the head's and the embedding's kernels, the head's activation
    bytes and its loss backward's passing bytes."""

    flight: float
    waited: float
    head_kernels: float
    embedding_kernels: float
    head_activations: float
    loss_backward: float


class LayerWork(NamedTuple):
    """One layer's seconds per micro-batch under one recomputation."""

    work: float  # forward + backward + recompute + exposed communication
    fill_deferred: float  # the fill F + I − W where weight passes are deferred (zb-h1)
    forward: float
    backward: float
    first_gather: float  # ZeRO-3's unhidden first gather


class PassCosts:
    """The scan's costs that read only a few of a layout's sizes, each a functools cache of those sizes
    (kept apart from LayoutCosts: these caches hold their object in a reference cycle, which only the
    garbage collector frees)."""

    def __init__(self, workload: Workload, hw: Hardware, compression: str, gpus: int):
        self.workload, self.spec, self.hw = workload, workload.spec, hw
        self.precision, self.kernels = workload.precision, workload.kernels
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
        workload, hw = self.workload, self.hw
        return (gradient_seconds(workload, hw, layout, PipelineShare(1, False, False)),
                gradient_seconds(workload, hw, layout, PipelineShare(0, True, pp == 1)),
                gradient_seconds(workload, hw, layout, PipelineShare(0, pp == 1, True)))

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



class LayoutCosts:
    """The scan's costs that take a whole layout (as the facts do) but read only part of it, each kept
    in a dict by what it reads: computed for the first layout that asks and reused by every later
    one, where a cache keyed by the whole layout would recompute them for every micro-batch count and
    ZeRO stage."""

    def __init__(self, workload: Workload, hw: Hardware, costed: tuple[str, ...], pass_costs: PassCosts):
        self.workload, self.spec, self.hw = workload, workload.spec, hw
        self.precision, self.kernels = workload.precision, workload.kernels
        self.costed, self.pass_costs = costed, pass_costs
        # each boundary's transfer apart from its gather
        self.waiting = replace(self.kernels, blocking_sends=tuple(SCHEDULES))
        self._rank_states: dict[tuple, RankStates] = {}
        self._stream_costs: dict[tuple, StreamCosts] = {}
        self._activations: dict[tuple, tuple[float, float]] = {}
        self._layer_times: dict[tuple, dict[str, LayerTimes]] = {}
        self._layer_work: dict[tuple, dict[str, LayerWork]] = {}
        self._flushes: dict[tuple, FlushCosts] = {}

    def rank_states(self, layout: Layout, per_rank: int) -> RankStates:
        """The model states of ``layout``'s ranks at ``per_rank`` layers: they read only the mesh sizes,
        the ZeRO stage and its groups (and, for a measured host's wrapper overhead, sp)."""
        key = (layout.tp, layout.cp, layout.pp, layout.dp, layout.zero, layout.dp_replicate, layout.sp)
        states = self._rank_states.get(key)
        if states is None:
            spec, precision, kernels, pp = self.spec, self.precision, self.kernels, layout.pp
            full = [rank_model_states(spec, layout, precision, PipelineShare(per_rank, *ends), kernels).total
                    for ends in ((True, pp == 1), (pp == 1, pp == 1), (pp == 1, True))]
            fewer = rank_model_states(spec, layout, precision, PipelineShare(per_rank - 1, pp == 1, pp == 1), kernels).total
            states = self._rank_states[key] = RankStates(*full, full[1] - fewer)
        return states

    def stream_costs(self, layout: Layout, mbs: int, stream: int) -> StreamCosts:
        """What ``layout``'s boundaries and ends cost with ``stream`` bytes a residual-stream value: of
        the layout, they read the ZeRO stage only through ``stream``."""
        key = (layout.tp, layout.cp, layout.pp, layout.dp, layout.cp_algorithm, layout.microbatches, layout.sp, stream)
        costs = self._stream_costs.get(key)
        if costs is None:
            boundaries = stage_boundaries(self.spec, self.hw, layout, mbs, self.precision, self.waiting)
            costs = self._stream_costs[key] = StreamCosts(
                max(boundaries.sends) + max(boundaries.flights),
                max(boundaries.sends) if self.kernels.blocking_sends else 0.0,
                *self.pass_costs.ends(layout.tp, layout.cp, layout.sp, mbs, stream))
        return costs

    def activations(self, layout: Layout, mbs: int, weights: tuple | None) -> tuple[dict[str, float], dict[str, float]]:
        """Under each costed recomputation, what a layer holds between its passes and what recomputing
        its block holds while it runs: of the ZeRO stage and the stages they read only ``weights``,
        how plait's engine keeps the weights (None on a reference stack)."""
        spec, precision, kernels, cached = self.spec, self.precision, self.kernels, self._activations
        tp, sp, cp, algorithm = layout.tp, layout.sp, layout.cp, layout.cp_algorithm
        held, working = {}, {}
        for rc in self.costed:
            key = (tp, sp, cp, rc, mbs, weights, algorithm)
            if key not in cached:
                recomputing = layout.with_recompute(rc)
                cached[key] = (
                    held_between_passes(activation_bytes_per_layer(spec, recomputing, mbs, precision, kernels),
                                        layout.offload_activations),
                    recompute_working_bytes(spec, recomputing, mbs, precision, kernels))
            held[rc], working[rc] = cached[key]
        return held, working

    def layer_times(self, layout: Layout, mbs: int, passes: WeightPasses) -> dict[str, LayerTimes]:
        """A layer's compute under each costed recomputation: it reads the algorithm only as zig-zag or
        not (plait runs the ring's and the all-gather's attention as one blockwise kernel)."""
        tp, cp, sp, algorithm = layout.tp, layout.cp, layout.sp, layout.cp_algorithm
        key = (tp, cp, sp, mbs, algorithm in ZIGZAG_ALGORITHMS if cp > 1 else None, passes)
        times = self._layer_times.get(key)
        if times is None:
            under = layer_times_by_recompute(self.spec, self.hw, layout, mbs, self.precision, self.kernels, passes)
            times = self._layer_times[key] = {rc: under(rc) for rc in self.costed}
        return times

    def layer_work(self, layout: Layout, mbs: int, passes: WeightPasses, stream: int,
                   times: dict[str, LayerTimes]) -> dict[str, LayerWork]:
        """A layer's work under each costed recomputation, its compute ``times`` given: it reads ZeRO-3's
        per-layer gathers (without stages) by their group, a measured host's wrapper overhead by the
        stage, and the rest of ZeRO and the stages through ``passes`` and ``stream``."""
        tp, cp, pp, dp, zero = layout.tp, layout.cp, layout.pp, layout.dp, layout.zero
        key = (tp, cp, layout.sp, mbs, (dp, layout.dp_replicate) if zero == 3 and pp == 1 else 0,
               (zero, dp * cp > 1) if self.hw.host_overhead else None, layout.cp_algorithm, passes, stream)
        work = self._layer_work.get(key)
        if work is None:
            work = self._layer_work[key] = {rc: _layer_work(layout.with_recompute(rc), self.workload, self.hw,
                                                            mbs, times) for rc in self.costed}
        return work

    def flush(self, layout: Layout, params: float, tensors: int, per_rank: int) -> FlushCosts:
        """What follows ``layout``'s pipeline flush: it reads what the model states read (``rank_states``)
        and, where plait's ZeRO-3 without stages reduces its ends' gradients every micro-batch (ZeRO-2
        all of them), the micro-batch count."""
        per_microbatch = self.kernels.plait_engine and (layout.zero == 3 and layout.pp == 1
                                                        or reduction_rounds(layout) > 1)
        key = (layout.tp, layout.cp, layout.pp, layout.dp, layout.zero, layout.dp_replicate, layout.sp,
               layout.microbatches if per_microbatch else None)
        flush = self._flushes.get(key)
        if flush is None:
            flush = self._flushes[key] = flush_costs(
                self.workload, self.hw, layout, params, tensors,
                norm_gradient_elements(self.spec, per_rank, True, layout.tp, layout.sp))
        return flush


def _layer_work(layout: Layout, workload: Workload, hw: Hardware, mbs: int, times: dict) -> LayerWork:
    """One layer's work under ``layout.recompute``, its compute ``times`` given."""
    lc = layer_cost(workload.spec, hw, layout, mbs, workload.precision, workload.kernels, times[layout.recompute])
    t = lc.times
    work = t.forward + t.backward + t.recompute + lc.comm_forward + lc.comm_backward
    # F + I − W as the play's chunks count them (plan.costs.chunk_costs): F with its
    # collectives, I with the recomputation and the backward's collectives.
    forward, backward_input = t.forward + lc.comm_forward, t.backward_input + t.recompute + lc.comm_backward
    return LayerWork(work, forward + backward_input - t.backward_weight, forward, t.backward + lc.comm_backward,
                     lc.first_gather)
