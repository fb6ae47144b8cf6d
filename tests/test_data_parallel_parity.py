"""Data parallelism under every ZeRO stage gives the single-process run: losses, weights, memory.

Each distributed run is made once per module (``outcomes``) and checked twice: for parity with
the single-process reference, and for the bytes of model state each rank measured.
"""

from __future__ import annotations

import pytest
import torch

from plait.models.flops import parameter_count
from plait.models.spec import model_spec
from tests.cases import assert_traced_volumes_are_the_facts, run_config, train_outcome
from tests.zero_accounting import held_model_state_bytes, zero_paper_bytes

RELATIVE_TOLERANCE = 1e-5
ADAM_STEP_FRACTION = 1e-2  # of one learning-rate step: the weights' floor near zero
MEMORY_TOLERANCE = 0.01
MODELS = ("tiny", "tiny-llama")
SHARDINGS = [(dp, stage) for dp in (2, 4) for stage in (0, 1, 2, 3)]
# Every sharding with one micro-batch, and gradient accumulation with DDP, ZeRO-2 and FSDP2.
LAYOUTS = [(model, dp, stage, 1) for model in MODELS for dp, stage in SHARDINGS]
LAYOUTS += [("tiny", 2, 0, 2), ("tiny", 4, 2, 2), ("tiny-llama", 2, 3, 2)]


def assert_same_losses(expected: list[float], actual: list[float]) -> None:
    assert len(expected) == len(actual)
    for step, (a, b) in enumerate(zip(expected, actual)):
        assert abs(a - b) <= RELATIVE_TOLERANCE * abs(a), f"step {step}: {a} vs {b}"


def assert_trains_as_one_process(pool, reference: list[float], config) -> None:
    """``config`` trains every rank to the single process's ``reference`` losses (which must learn),
    and its traced collectives are the facts' volumes."""
    assert reference[-1] < reference[0], "the reference run should learn"
    outcomes = pool.run(train_outcome, config.layout.world_size, config)
    for outcome in outcomes:
        assert_same_losses(reference, outcome["losses"])
    assert_traced_volumes_are_the_facts(config, outcomes[0]["volumes"])


def assert_same_weights(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    """Every element within 1e-5 of its value, or within a small absolute floor when near zero.

    The floor is the larger of 1e-5 of the model's largest weight and 1% of one learning-rate step.
    Adam turns the rounding noise of gradients near zero (the attention key bias, which softmax
    ignores, gets nothing but that noise) into updates that no two summation orders share: on an AVX2-only
    CPU one embedding element of tiny-llama ended 1.2e-5 from the single process after 10 steps,
    every loss equal within 1.4e-7 relative. An element that missed or repeated one update would be
    a whole step, lr × O(1), away: some hundred times the floor.
    """
    assert expected.keys() == actual.keys()
    scale = max(value.abs().max().item() for value in expected.values())
    floor = max(RELATIVE_TOLERANCE * scale, ADAM_STEP_FRACTION * run_config().train.lr)
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=RELATIVE_TOLERANCE, atol=floor, msg=lambda m: f"{name}: {m}")


@pytest.fixture(scope="module")
def outcomes(pool):
    """``outcomes(model, dp, stage, microbatches)``: the run's per-rank results, made once."""
    made: dict[tuple, list[dict]] = {}

    def get(model: str, dp: int = 1, stage: int = 0, microbatches: int = 1) -> list[dict]:
        key = (model, dp, stage, microbatches)
        if key not in made:
            config = run_config(model, dp=dp, zero=stage, microbatches=microbatches)
            made[key] = pool.run(train_outcome, dp, config)
        return made[key]

    return get


@pytest.mark.parametrize("model, dp, stage, microbatches", LAYOUTS)
def test_matches_single_process(outcomes, model, dp, stage, microbatches):
    reference = outcomes(model)[0]
    assert reference["losses"][-1] < reference["losses"][0], "the reference run should learn"
    ranks = outcomes(model, dp, stage, microbatches)
    for rank in ranks:
        assert_same_losses(reference["losses"], rank["losses"])
    assert_same_weights(reference["weights"], ranks[0]["weights"])
    config = run_config(model, dp=dp, zero=stage, microbatches=microbatches)
    assert_traced_volumes_are_the_facts(config, ranks[0]["volumes"])


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dp, stage", SHARDINGS)
def test_each_rank_holds_what_the_stage_promises(outcomes, model, dp, stage):
    parameters = parameter_count(model_spec(model, seq_len=64))
    expected = held_model_state_bytes(stage, parameters, dp, "fp32")
    for rank, outcome in enumerate(outcomes(model, dp, stage)):
        held = outcome["model_state_bytes"]
        for kind, measured in held.items():
            assert measured == pytest.approx(expected[kind], rel=MEMORY_TOLERANCE), f"rank {rank} {kind}"
        paper = zero_paper_bytes(stage, parameters, dp, "fp32")  # 16Ψ, 8Ψ + 8Ψ/Nd, 4Ψ + 12Ψ/Nd, 16Ψ/Nd
        assert sum(held.values()) == pytest.approx(paper, rel=MEMORY_TOLERANCE), f"rank {rank}"
