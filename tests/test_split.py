"""Stage split: balanced by exact FLOPs, or as given; bad splits fail before start."""

from dataclasses import replace

import pytest

from plait.errors import ConfigError
from plait.models.spec import PRESETS
from plait.schedules import chunk_costs, split_layers


def test_equal_blocks_split_evenly_when_the_head_is_cheap():
    assert [len(r) for r in split_layers(PRESETS["tiny"], 2)] == [2, 2]
    assert [len(r) for r in split_layers(PRESETS["tiny"], 2, 2)] == [1, 1, 1, 1]


def test_a_heavy_head_takes_blocks_off_the_last_stage():
    spec = PRESETS["gpt2"]
    counts = [len(r) for r in split_layers(spec, 4)]
    assert counts[-1] < min(counts[:-1])
    assert sum(counts) == spec.layers
    even = chunk_costs(spec, [3, 3, 3, 3])
    assert max(chunk_costs(spec, counts)) < max(even)


def test_chunks_are_consecutive_and_cover_every_layer():
    chunks = split_layers(PRESETS["llama-8b"], 4, 2)
    assert [i for r in chunks for i in r] == list(range(32))


def test_user_split_is_used_and_checked():
    assert split_layers(PRESETS["tiny"], 2, layers_per_chunk=[3, 1]) == (range(0, 3), range(3, 4))
    with pytest.raises(ConfigError, match="summing to the model.s 4 layers"):
        split_layers(PRESETS["tiny"], 2, layers_per_chunk=[3, 2])


def test_only_the_end_chunks_of_a_given_split_may_be_empty():
    """The embedding alone first and the head alone last are valid chunks; an empty chunk between
    would be a stage with nothing to run."""
    assert split_layers(PRESETS["tiny"], 2, 3, layers_per_chunk=[0, 1, 1, 1, 1, 0])[0] == range(0, 0)
    assert chunk_costs(PRESETS["tiny"], [0, 2, 2, 0])[0] == 0
    assert chunk_costs(PRESETS["tiny"], [0, 2, 2, 0])[-1] > 0  # the head
    with pytest.raises(ConfigError, match="the first and last may be 0"):
        split_layers(PRESETS["tiny"], 2, 2, layers_per_chunk=[1, 0, 2, 1])


def test_pp_larger_than_layers_is_rejected():
    with pytest.raises(ConfigError, match="--pp 8 is larger than the model's 4 layers"):
        split_layers(PRESETS["tiny"], 8)


def test_layers_not_divisible_into_chunks_is_rejected():
    with pytest.raises(ConfigError, match="cannot be divided into pp × virtual-stages = 6 chunks"):
        split_layers(replace(PRESETS["tiny"], layers=5), 2, 3)


def _compositions(total: int, parts: int):
    if parts == 1:
        yield (total,)
        return
    for first in range(1, total - parts + 2):
        for rest in _compositions(total - first, parts - 1):
            yield (first, *rest)


@pytest.mark.parametrize("model,layers", [("gpt2", 9), ("gpt2", 11), ("tiny", 7), ("llama-1b", 10)])
def test_the_split_is_the_best_of_every_possible_split(model, layers):
    """Against brute force over every composition: least costly worst chunk, then least spread."""
    spec = replace(PRESETS[model], layers=layers)
    for chunks in range(1, 6):
        costs = {counts: chunk_costs(spec, counts) for counts in _compositions(layers, chunks)}
        best = min(costs, key=lambda c: (max(costs[c]), sum(x * x for x in costs[c]), c))
        assert tuple(len(r) for r in split_layers(spec, chunks)) == best


def test_layers_that_do_not_divide_into_the_chunks_leave_the_ends_short():
    """Llama 3.1 405B's 126 layers over pp 8 × v 2 (torchtitan's interleaved run): 16 chunks of at
    least 7, the first and last ones no larger than any between, as Megatron and torchtitan place
    the remainder; the shared validation accepts the layout."""
    from plait.facts.validity import layout_problems
    from plait.layout import Layout

    spec = PRESETS["llama-405b"]
    counts = [len(r) for r in split_layers(spec, 8, 2)]
    assert len(counts) == 16 and sum(counts) == 126
    middle = counts[1:-1]
    assert max(middle) - min(middle) <= 1
    assert counts[0] <= min(middle) and counts[-1] <= min(middle)
    layout = Layout(dp=8, tp=8, pp=8, sp=True, zero=3, schedule="interleaved-1f1b", virtual_stages=2,
                    microbatches=32, recompute="full")
    assert layout_problems(spec, layout, 512, 256) == []
