"""The data-parallel reduction overlaps backward in every layout plait reduces itself: under tensor
parallelism (ZeRO 0/1, where DDP cannot run) and on pipeline stages (ZeRO 0/1/2, each chunk's
gradients reduced from its last backward action on). Parity with the single process (fp32, 10
steps, 1e-5 relative), and proof that the buckets go out while backward or the schedule goes on.
"""

from __future__ import annotations

import pytest

from plait.facts.buckets import BUCKET_CAP_BYTES, BUCKET_FLOOR_BYTES, bucket_bytes
from tests.cases import layout_world_size, run_config, train_outcome
from tests.overlap_cases import first_reduction, reducers_left_after_training
from tests.test_data_parallel_parity import assert_same_losses, assert_same_weights

MODELS = ("tiny", "tiny-llama")
PIPELINE_SCHEDULES = [
    {"schedule": "1f1b", "microbatches": 4},
    {"schedule": "interleaved-1f1b", "virtual_stages": 2, "microbatches": 2},
    {"schedule": "zb-h1", "microbatches": 4},
]
LAYOUTS = [{"dp": 2, "tp": 2, "zero": zero, "microbatches": 2} for zero in (0, 1)]
LAYOUTS += [{"dp": 2, "pp": 2, "zero": zero, **schedule} for zero in (0, 1, 2) for schedule in PIPELINE_SCHEDULES]
LAYOUTS += [{"dp": 2, "tp": 2, "pp": 2, "zero": 1, "schedule": "1f1b", "microbatches": 2}]


def layout_id(layout: dict) -> str:
    return "-".join(f"{key}{value}" for key, value in layout.items())


@pytest.fixture(scope="module")
def single_process(pool):
    return {model: pool.run(train_outcome, 1, run_config(model))[0] for model in MODELS}


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
@pytest.mark.parametrize("model", MODELS)
def test_overlapped_reduction_trains_as_the_single_process(pool, single_process, model, layout):
    outcomes = pool.run(train_outcome, layout_world_size(layout), run_config(model, **layout))
    expected = single_process[model]
    for outcome in outcomes:
        assert_same_losses(expected["losses"], outcome["losses"])
    stages = [outcome["weights"] for outcome in outcomes if outcome["weights"] is not None]
    merged = {name: value for weights in stages for name, value in weights.items()}
    assert_same_weights({name: expected["weights"][name] for name in merged}, merged)
    assert merged.keys() == expected["weights"].keys()


def test_the_bucket_rule():
    assert bucket_bytes(3_337_216) == 3_337_216 // 4  # tiny: four buckets, three of them under backward
    assert bucket_bytes(100_000) == BUCKET_FLOOR_BYTES
    assert bucket_bytes(10 * 2**30) == BUCKET_CAP_BYTES  # a large model keeps DDP's 25 MiB


def test_under_tensor_parallelism_a_bucket_goes_out_before_backward_has_most_gradients(pool):
    config = run_config(dp=2, tp=2, zero=1, steps=1)
    for outcome in pool.run(first_reduction, 4, config):
        assert outcome["buckets"] >= 3
        assert outcome["accumulated_at_first_send"] < 0.5, outcome
    # The same measurement with every bucket held back to the end of backward sees it after all.
    for outcome in pool.run(first_reduction, 4, config, False):
        assert outcome["accumulated_at_first_send"] == 1.0, outcome


@pytest.mark.parametrize("zero", [0, 2])
def test_on_a_pipeline_stage_a_chunk_reduction_goes_out_before_the_schedules_last_backward(pool, zero):
    interleaved = run_config(dp=2, pp=2, zero=zero, steps=1, schedule="interleaved-1f1b", virtual_stages=2,
                             microbatches=2)
    for outcome in pool.run(first_reduction, 4, interleaved):
        assert outcome["before_last_arm"], outcome  # the earlier chunk's, under the later chunk's backward
    # One chunk a rank: its buckets go out while its last backward runs.
    for outcome in pool.run(first_reduction, 4, run_config(dp=2, pp=2, zero=zero, steps=1, microbatches=4)):
        assert outcome["buckets"] >= 2 and outcome["before_last_close"], outcome
    for outcome in pool.run(first_reduction, 4, interleaved, False):
        assert not outcome["before_last_close"], outcome


@pytest.mark.parametrize("zero", [1, 2])
def test_nothing_of_a_finished_run_stays_alive(pool, zero):
    """The buckets' hooks live on the parameters: once train() returns, its optimizer and reducer go."""
    layout = {"dp": 2, "tp": 2, "zero": zero}
    assert pool.run(reducers_left_after_training, 4, run_config("tiny", steps=2, **layout)) == [0] * 4
