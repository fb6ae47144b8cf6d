"""Peak memory of the pipeline ranks the scan examines: which ranks it examines for each schedule
and what each holds of every chunk at its peaks (plait.facts.in_flight), under whole, partial or no
recomputation, and the bound on larger micro-batches that lets a mesh stop early."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from plait.facts.activations import replayed_block_bytes
from plait.facts.in_flight import held_chunk_counts, peak_microbatches
from plait.facts.stack import Kernels
from plait.facts.validity import pipeline_problems
from plait.layout import Layout
from plait.models.spec import ModelSpec
from plait.plan.space import schedule_choices
from plait.schedules.registry import ScheduleSpec
from plait.schedules.split import split_layers


def least_memory_at_larger_microbatches(least_peaks: list[float], states: float, weight_copies: bool) -> float:
    """The least memory one (mesh, sp, ZeRO) choice needs at any larger micro-batch: with fewer,
    larger micro-batches each rank holds no fewer micro-batch-sized activations, buffers and logits
    (tests/test_plan_memory.py), so no less than the least of its schedules' ``least_peaks`` now.
    But where autocast keeps a bf16 copy of a stage's weights per micro-batch (``weight_copies``),
    fewer micro-batches in flight can hold fewer copies, and only the ``states`` of a rank holding
    ⌈layers / pp⌉ layers (some rank does) and what else it holds now is certain."""
    return states if weight_copies else min(least_peaks, default=0.0)


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
    def of(cls, counts: tuple[tuple[int, ...], ...], chunk_layers: tuple[int, ...], first: bool, last: bool) -> RankHold:
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


class StageShapes:
    """What the examined pipeline ranks of each schedule hold, per stage count and micro-batch
    count, as the stage split the play uses cuts them; each computed once per scan."""

    def __init__(self, spec: ModelSpec, kernels: Kernels, fixed: dict):
        self.spec, self.kernels, self.fixed = spec, kernels, fixed
        self.stage_layers = fixed.get("stage_layers")
        self.schedule_fits = functools.cache(self._schedule_fits)
        self.schedules = functools.cache(self._schedules)
        self.rank_kinds = functools.cache(self._rank_kinds)
        self.held_at_peaks = functools.cache(self._held_at_peaks)
        self.middle_layers = functools.cache(self._middle_layers)
        self.examined_ranks = functools.cache(self._examined_ranks)

    def _schedule_fits(self, pp: int, m: int, name: str, v: int) -> bool:
        return not pipeline_problems(self.spec, Layout(pp=pp, microbatches=m, schedule=name, virtual_stages=v,
                                                       stage_layers=self.stage_layers), self.kernels)

    def _schedules(self, pp: int, m: int) -> list[tuple[str, int, tuple[RankHold, ...], int, tuple[tuple, ...]]]:
        """(schedule, v, what the examined ranks hold at their peaks, the most layers a middle rank
        holds, and each examined rank's (first, last, layers): what its bytes besides the
        activations read) of those that can run."""
        listed = [(n, v, self.held_at_peaks(n, pp, v, peak_microbatches(pp, v, m)))
                  for n, v in schedule_choices(pp, m, self.spec.layers, self.fixed)
                  if self.schedule_fits(pp, m, n, v)]
        return [(n, v, holds, self.middle_layers(pp, v), tuple((hold.first, hold.last, hold.layers) for hold in holds))
                for n, v, holds in listed]

    def _rank_kinds(self, pp: int, m: int) -> tuple[tuple, ...]:
        """Every (first, last, layers) an examined rank of the schedules of ``schedules`` has."""
        return tuple({kind: None for *_, kinds in self.schedules(pp, m) for kind in kinds})

    def _held_at_peaks(self, name: str, pp: int, v: int, m: int) -> tuple[RankHold, ...]:
        return tuple(RankHold.of(held_chunk_counts(name, pp, v, m, r), chunks, r == 0, r == pp - 1)
                     for r, chunks in self.examined_ranks(pp, v))

    def _middle_layers(self, pp: int, v: int) -> int:
        return max((sum(chunks) for r, chunks in self.examined_ranks(pp, v) if 0 < r < pp - 1), default=0)

    def _examined_ranks(self, pp: int, v: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """(rank, layers in each of its chunks) of the first rank, of the first middle rank with each
        cut of its chunks, and of the last, as the stage split the play uses cuts them (with
        interleaving the ends often hold fewer than ⌈layers / pp⌉). Every peak of a rank is covered
        by a peak of each earlier rank (as many of each chunk or more: tests/test_plan_memory.py),
        so a middle rank whose chunks are cut as an earlier one's holds no more than it."""
        counts = [len(r) for r in split_layers(self.spec, pp, v, self.stage_layers)]
        cuts = {}
        for rank in range(1, pp - 1):
            cuts.setdefault(tuple(counts[rank::pp]), rank)
        return ((0, tuple(counts[0::pp])), *((rank, cut) for cut, rank in cuts.items()),
                *(((pp - 1, tuple(counts[pp - 1::pp])),) if pp > 1 else ()))


def beside_activations(holds: tuple[RankHold, ...], kinds: tuple[tuple, ...], besides: dict[tuple, float]
                       ) -> Iterator[tuple[RankHold, float]]:
    """Each examined rank's hold with its bytes besides the activations, looked up by its kind."""
    return zip(holds, map(besides.__getitem__, kinds))


def _undominated(points: set[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The points no other point equals or exceeds in every coordinate."""
    return tuple(p for p in points if not any(o != p and all(x >= y for x, y in zip(o, p)) for o in points))


def schedule_peak(ranks: Iterable[tuple[RankHold, float]], act: float, head: float, replayed: tuple[float, float]) -> float:
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


def replayed_block_extra_bytes(working: float, splits_backward: bool, v: int, freed: float,
                               kept_in_every_chunk: bool = False) -> tuple[float, float]:
    """What the replayed block adds on a rank other than the last and on the last
    (plait.facts.activations.replayed_block_bytes), which holds the last chunk alone when v is 1."""
    return (replayed_block_bytes(working, splits_backward, kept_in_every_chunk, False, freed),
            replayed_block_bytes(working, splits_backward, kept_in_every_chunk, v == 1, freed))


def fewest_recomputed(ranks: tuple, kept: float, recomputed: float, head: float, capacity: float) -> int | None:
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


class ScheduleChoice(NamedTuple):
    """One schedule of a layout as its step and peaks read it."""

    name: str
    v: int
    pipeline: ScheduleSpec
    ranks: tuple[tuple[RankHold, float], ...]  # each examined rank's hold and bytes besides its activations
    first_layers: int
    last_layers: int
    middle_layers: int  # the most a middle rank holds


def partial_candidate(choice: ScheduleChoice, per_rc: dict, blocks: int, per_rank: int, head: float, working: float,
                      freed: float) -> tuple:
    """(``full``, the per-layer figures of a chunk recomputing its first ``blocks`` layers, its peak
    with the replayed block's ``working`` bytes where they add, ``blocks``) under ``choice``'s
    schedule: time a blend of none and full by the share of a rank's layers recomputed (``per_rc``'s
    figures are named tuples, each held bytes first)."""
    ranks, v, splits_backward = choice.ranks, choice.v, choice.pipeline.splits_backward
    kept, recomputed = per_rc["none"], per_rc["full"]
    share = min(1.0, blocks * v / per_rank)
    blend = kept._make(share * r + (1 - share) * k for k, r in zip(kept, recomputed))
    peak = max(besides + hold.partial_bytes(blocks, kept[0], recomputed[0], head)
               + (replayed_block_extra_bytes(working, splits_backward, v, freed,
                                             min(n for n in hold.chunk_layers if n) > blocks)[hold.last]
                  if hold.layers else 0.0)
               for hold, besides in ranks)
    return "full", blend, peak, blocks
