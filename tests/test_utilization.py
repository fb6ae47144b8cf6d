"""A run starved by its data loader, or by its host's own work, is named as such: the time a rank
waits for its batch (``data``) and the host's work between operations (``host``) are their own parts
of the step, in the summary, in explain's table, in each rank's row and in the bottleneck sentence."""

from __future__ import annotations

import json

import pytest

from plait.explain.run import explain
from tests.cases import run_config
from tests.test_step_trace import calibrated_cpu_profile
from tests.trace_cases import run_with_a_slow_host, run_with_a_slow_loader

# Several times a tiny dp2 step even on a busy machine, so that no other part can outweigh it.
DELAY_S = 1.5


def test_a_run_whose_loader_is_slowed_is_named_data_bound(pool, tmp_path):
    pool.run(run_with_a_slow_loader, 2, run_config("tiny", steps=4, dp=2), str(tmp_path), DELAY_S)
    summary = json.loads((tmp_path / "summary.json").read_text())
    split = summary["time_split"]
    assert split["data_s"]["median"] >= DELAY_S
    assert split["shares"]["data"]["median"] > 0.5
    explanation = explain(tmp_path, gpu="a100-80gb")
    rows = {quantity: measured for quantity, _, measured, _ in explanation.rows()}
    assert summary["trace_slowdown"] is None  # every step traced: the table's parts are the traced ones
    assert rows["waiting for data"] == split["data_s"]["median"]
    bottleneck = next(line for line in explanation.report().splitlines() if line.startswith("bottleneck: "))
    assert bottleneck.startswith("bottleneck: waiting for data is "), bottleneck
    assert "loader that reads ahead" in bottleneck


def test_a_run_whose_host_is_slowed_is_named_host_bound_on_every_rank(pool, tmp_path):
    pool.run(run_with_a_slow_host, 2, run_config("tiny", steps=4, dp=2), str(tmp_path), DELAY_S)
    summary = json.loads((tmp_path / "summary.json").read_text())
    split = summary["time_split"]
    assert split["host_s"]["median"] >= DELAY_S and split["shares"]["host"]["median"] > 0.5
    explanation = explain(tmp_path, profile=calibrated_cpu_profile())
    ranks = explanation.to_dict()["ranks"]
    assert [rank["rank"] for rank in ranks] == [0, 1]
    for rank in ranks:
        assert rank["host overhead"] > 0.5 and rank["waiting for data"] < 0.1
        assert sum(rank[part] for part in ("compute", "exposed communication", "bubble", "waiting for data",
                                           "host overhead")) == pytest.approx(1.0, abs=0.05)
    report = explanation.report()
    bottleneck = next(line for line in report.splitlines() if line.startswith("bottleneck: "))
    assert bottleneck.startswith("bottleneck: host overhead is ") and "MFU " in bottleneck, bottleneck
    mfu = {quantity: (p, m) for quantity, p, m, _ in explanation.rows()}["MFU"]
    assert mfu[1] == pytest.approx(summary["model_tflops_per_rank"] / explanation.hardware.peak_tflops("fp32"))
    assert 0 < mfu[1] < mfu[0]  # a host-bound run reaches less of the peak than the planner's run would
