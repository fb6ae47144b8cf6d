"""A run starved by its data loader is named as such: the time a rank waits for its batch is its own
part of the step (``data``), in the summary, in explain's table and in the bottleneck sentence."""

from __future__ import annotations

import json

from plait.explain.run import explain
from tests.cases import run_config
from tests.trace_cases import run_with_a_slow_loader

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
