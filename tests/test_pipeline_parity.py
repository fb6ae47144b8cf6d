"""Every pipeline schedule gives the single-process losses, step for step (gloo on CPU).

The acceptance matrix (pp ∈ {2, 4} × every schedule × m ∈ {pp, 2pp, 4pp} × both families) on
models small enough for a 2-core machine: width 32 and one block per chunk where possible (8 blocks
only for interleaved with pp = 4, so that pp × v = 8 chunks fit).
"""

from __future__ import annotations

import pytest

from plait.config import RunConfig, TrainSpec, validate_run
from plait.layout import Layout
from plait.models.spec import model_spec
from tests.cases import assert_traced_volumes_are_the_facts, train_losses, train_outcome
from tests.pipeline_cases import pipeline_losses
from tests.schedule_cases import EVERY_SCHEDULE

RELATIVE_TOLERANCE = 1e-5
FAMILIES = {"tiny": {}, "tiny-llama": {"ffn_hidden": 96}}


def layers_for(pp: int, v: int) -> int:
    return max(4, pp * v)


def small_config(model: str, layers: int, **layout) -> RunConfig:
    spec = model_spec(model, layers=layers, hidden=32, heads=4, seq_len=16, **FAMILIES[model])
    train = TrainSpec(steps=10, global_batch=16, warmup_steps=2, final_checkpoint=False)
    config = RunConfig(spec, Layout(**layout), train, model_name=model)
    validate_run(config)
    return config


@pytest.fixture(scope="module")
def single_process(pool):
    return {(model, layers): pool.run(train_losses, 1, small_config(model, layers))[0]
            for model in FAMILIES for layers in (4, 8)}


@pytest.fixture(scope="module")
def pipelined(pool):
    """Losses of every (schedule, m) per (pp, family), each pp world formed once for all of them."""
    runs = {}
    for pp in (2, 4):
        for model in FAMILIES:
            cases = [(name, v, m) for name, v in EVERY_SCHEDULE for m in (pp, 2 * pp, 4 * pp)]
            configs = [small_config(model, layers_for(pp, v), pp=pp, schedule=n, virtual_stages=v, microbatches=m)
                       for n, v, m in cases]
            per_rank = pool.run(pipeline_losses, pp, configs)
            for index, case in enumerate(cases):
                runs[(pp, model, *case)] = configs[index], [run[index] for run in per_rank]
    return runs


@pytest.mark.parametrize("model", list(FAMILIES))
@pytest.mark.parametrize("name,v", EVERY_SCHEDULE)
@pytest.mark.parametrize("pp", [2, 4])
def test_pipeline_matches_single_process(single_process, pipelined, model, name, v, pp):
    reference = single_process[(model, layers_for(pp, v))]
    assert reference[-1] < reference[0], "the reference run should learn"
    for m in (pp, 2 * pp, 4 * pp):
        config, ranks = pipelined[(pp, model, name, v, m)]
        for rank, (losses, _) in enumerate(ranks):
            assert len(losses) == len(reference)
            for step, (want, got) in enumerate(zip(reference, losses)):
                assert abs(want - got) <= RELATIVE_TOLERANCE * abs(want), f"m={m} rank {rank} step {step}: {want} vs {got}"
        assert_traced_volumes_are_the_facts(config, ranks[0][1])


@pytest.mark.parametrize("model", list(FAMILIES))
def test_pipeline_with_data_parallel_matches_single_process(pool, single_process, model):
    """dp × pp: gradients averaged over replicas after the pipeline step (tied weights summed first)."""
    reference = single_process[(model, 4)]
    config = small_config(model, 4, dp=2, pp=2, schedule="zb-h1", microbatches=4)
    outcomes = pool.run(train_outcome, 4, config)
    for rank, outcome in enumerate(outcomes):
        for step, (want, got) in enumerate(zip(reference, outcome["losses"])):
            assert abs(want - got) <= RELATIVE_TOLERANCE * abs(want), f"rank {rank} step {step}: {want} vs {got}"
    assert_traced_volumes_are_the_facts(config, outcomes[0]["volumes"])


def test_empty_end_chunks_match_single_process(pool, single_process):
    """A split whose first chunk is the embedding alone and whose last is the head alone (the
    zero-bubble paper's one-block interleaved chunks, Megatron-Core's account-for-embedding and -loss
    split) trains as the single process does."""
    reference = single_process[("tiny", 4)]
    configs = [small_config("tiny", 4, pp=2, schedule="interleaved-1f1b", virtual_stages=3, microbatches=4,
                            stage_layers=(0, 1, 1, 1, 1, 0)),
               small_config("tiny", 4, pp=2, schedule="zb-h1", microbatches=4, stage_layers=(0, 4))]
    per_rank = pool.run(pipeline_losses, 2, configs)
    for index, config in enumerate(configs):
        for rank, run in enumerate(per_rank):
            losses = run[index][0]
            for step, (want, got) in enumerate(zip(reference, losses)):
                assert abs(want - got) <= RELATIVE_TOLERANCE * abs(want), f"config {index} rank {rank} step {step}"
        assert_traced_volumes_are_the_facts(config, per_rank[0][index][1])
