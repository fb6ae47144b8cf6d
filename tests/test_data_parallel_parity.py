"""Plain data parallelism (DDP) gives the single-process losses, step for step."""

from __future__ import annotations

import pytest

from tests.cases import run_config, train_losses

RELATIVE_TOLERANCE = 1e-5


def assert_same_losses(expected: list[float], actual: list[float]) -> None:
    assert len(expected) == len(actual)
    for step, (a, b) in enumerate(zip(expected, actual)):
        assert abs(a - b) <= RELATIVE_TOLERANCE * abs(a), f"step {step}: {a} vs {b}"


@pytest.fixture(scope="module")
def single_process(pool):
    """The reference losses of each model family, computed once per module."""
    return {model: pool.run(train_losses, 1, run_config(model))[0] for model in ("tiny", "tiny-llama")}


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("dp, microbatches", [(2, 1), (2, 2), (4, 1)])
def test_dp_matches_single_process(pool, single_process, model, dp, microbatches):
    reference = single_process[model]
    results = pool.run(train_losses, dp, run_config(model, dp=dp, microbatches=microbatches))
    assert reference[-1] < reference[0], "the reference run should learn"
    for losses in results:
        assert_same_losses(reference, losses)
