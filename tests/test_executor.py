"""The executor runs any generated list as written, on gloo ranks, with exact gradients."""

import pytest
import torch

from plait.schedules import generate, peak_in_flight
from tests.pipeline_cases import run_toy_schedule, toy_gradients
from tests.schedule_cases import EVERY_SCHEDULE


@pytest.mark.parametrize("name,v", EVERY_SCHEDULE)
@pytest.mark.parametrize("pp", [2, 4])
def test_executed_order_is_the_generated_list_and_gradients_are_exact(pool, name, v, pp):
    m = 2 * pp
    results = pool.run(run_toy_schedule, pp, name, m, v)
    schedule = generate(name, pp, m, v)
    reference = toy_gradients(pp, m, v)
    for rank, result in enumerate(results):
        assert result["executed"] == list(schedule.actions[rank])
        for chunk, grads in result["grads"].items():
            for got, want in zip(grads, reference[chunk]):
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_measured_peak_activations_follow_the_schedule(pool):
    """GPipe holds every micro-batch; 1F1B at most pp on any rank, whatever m is."""
    for m in (2, 4, 8):
        gpipe = [r["peak"] for r in pool.run(run_toy_schedule, 2, "gpipe", m, 1)]
        one_f_one_b = [r["peak"] for r in pool.run(run_toy_schedule, 2, "1f1b", m, 1)]
        assert gpipe == [m, m]
        assert one_f_one_b == [2, 1] == list(peak_in_flight(generate("1f1b", 2, m)))
