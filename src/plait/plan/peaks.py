"""Peak memory of the pipeline ranks the scan examines: what each holds of every chunk at its peaks
(plait.facts.in_flight), under whole, partial or no recomputation, and the bound on larger
micro-batches that lets a mesh stop early."""

from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple

from plait.facts.activations import replayed_block_bytes


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


def replayed_adds(working: float, schedule: str, v: int, freed: float, kept_in_every_chunk: bool = False
                  ) -> tuple[float, float]:
    """What the replayed block adds on a rank other than the last and on the last
    (plait.facts.activations.replayed_block_bytes), which holds the last chunk alone when v is 1."""
    return (replayed_block_bytes(working, schedule, kept_in_every_chunk, False, freed),
            replayed_block_bytes(working, schedule, kept_in_every_chunk, v == 1, freed))


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


def partial_candidate(ranks: tuple, v: int, per_rc: dict, blocks: int, per_rank: int, head: float, working: float,
                      schedule: str, freed: float) -> tuple:
    """(``full``, the per-layer figures of a chunk recomputing its first ``blocks`` layers, its peak
    with the replayed block's ``working`` bytes where they add, ``blocks``): time a blend of none and
    full by the share of a rank's layers recomputed."""
    kept, recomputed = per_rc["none"], per_rc["full"]
    share = min(1.0, blocks * v / per_rank)
    blend = tuple(share * r + (1 - share) * k for k, r in zip(kept, recomputed))
    peak = max(besides + hold.partial_bytes(blocks, kept[0], recomputed[0], head)
               + (replayed_adds(working, schedule, v, freed, min(n for n in hold.chunk_layers if n) > blocks)[hold.last]
                  if hold.layers else 0.0)
               for hold, besides in ranks)
    return "full", blend, peak, blocks
