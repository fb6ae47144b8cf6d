"""Hybrid sharding (HSDP) in the planner and the flags: ZeRO inside a node, replicas across nodes."""

from __future__ import annotations

import pytest

from plait.errors import ConfigError
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.hardware import hardware
from plait.plan.scan import scan
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload
from plait.plan.space import scanned_layout


def test_sharding_inside_the_node_trades_memory_for_the_inter_node_traffic():
    """ZeRO-3 over 16 GPUs on two nodes gathers every layer across the network; sharding inside
    each node gathers over NVLink and only all-reduces gradient shards across nodes: less exposed
    communication in the layers, for twice the parameter shard per rank (and twice the optimizer's
    work, so on llama-8b at 8k tokens, where compute hides most gathers, the step is no faster)."""
    workload, hw = Workload(model_spec("llama-8b"), 64, "bf16"), hardware("h100-sxm")
    flat = evaluate(workload, hw, 16, Layout(dp=16, zero=3, microbatches=2, recompute="full"))
    hybrid = evaluate(workload, hw, 16, Layout(dp=16, dp_replicate=2, zero=3, microbatches=2, recompute="full"))
    exposed = "critical_path_comm_s"
    assert hybrid.time_breakdown[exposed] < flat.time_breakdown[exposed]
    assert hybrid.time_breakdown["optimizer_s"] > flat.time_breakdown["optimizer_s"]
    assert hybrid.memory_breakdown["params"] == pytest.approx(2 * flat.memory_breakdown["params"], rel=0.01)


def test_the_search_scores_hybrid_sharding_across_nodes_only():
    workload, hw = Workload(model_spec("llama-8b"), 64, "bf16"), hardware("h100-sxm")
    across = scan(workload, hw, 16, {"zero": 3, "tp": 1, "cp": 1, "pp": 1}, None, keep=1000)
    assert {scanned_layout(fields).dp_replicate for _, fields in across.best} == {1, 2}
    inside = scan(workload, hw, 8, {"zero": 3, "tp": 1, "cp": 1, "pp": 1}, None, keep=1000)
    assert {scanned_layout(fields).dp_replicate for _, fields in inside.best} == {1}


def test_hybrid_layouts_are_described_and_validated():
    assert Layout(dp=8, dp_replicate=2, zero=3).describe().startswith("dp2×4 ")
    with pytest.raises(ConfigError, match="must divide --dp"):
        Layout(dp=6, dp_replicate=4, zero=3).validate()
    with pytest.raises(ConfigError, match="ZeRO stage 0"):
        Layout(dp=4, dp_replicate=2).validate()
