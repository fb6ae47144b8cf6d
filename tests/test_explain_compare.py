"""plait explain RUN_A RUN_B: two runs of this machine side by side, their steps split into the same
parts on both sides, adding up to each run's step time, and the part that changed most named."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from plait.cli import main
from plait.explain.compare import PARTS, compare
from plait.layout import DATA_GROUPS
from tests.cases import layout_world_size, run_config, train_losses

LAYOUTS = {
    "dp2": {"dp": 2},
    "dp4": {"dp": 4},
    "tp2": {"tp": 2},
    "1f1b": {"pp": 2, "schedule": "1f1b", "microbatches": 4},
    "interleaved": {"pp": 2, "schedule": "interleaved-1f1b", "virtual_stages": 2, "microbatches": 4},
}
PAIRS = [("dp2", "dp4"), ("1f1b", "interleaved"), ("tp2", "dp2")]


@pytest.fixture(scope="module")
def runs(pool, tmp_path_factory):
    """A finished run of each layout with three traced steps (1, 3, 5) between plain ones."""
    root = tmp_path_factory.mktemp("compare")
    for name, layout in LAYOUTS.items():
        config = run_config("tiny", steps=6, global_batch=8, **layout)
        config = replace(config, train=replace(config.train, trace_every=2))
        pool.run(train_losses, layout_world_size(layout), config, str(root / name))
    return root


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_two_runs_split_into_parts_that_add_up_and_the_largest_change_is_named(runs, first, second):
    comparison = compare(runs / first, runs / second, gpu="a100-80gb")
    for explanation, measured, predicted in zip((comparison.first, comparison.second), comparison.measured,
                                                comparison.predicted):
        assert set(measured) == set(predicted) == set(PARTS)
        assert all(seconds >= 0 for seconds in (*measured.values(), *predicted.values()))
        assert sum(measured.values()) == pytest.approx(explanation.summary["step_time_s"], rel=0.05)
        assert sum(predicted.values()) == pytest.approx(explanation.prediction.step_time_s, rel=0.05)
        # the parts are the median traced step's, the data groups' waits in the dp part
        step = explanation.summary["time_split"]["median_step"]
        scale = explanation.summary["step_time_s"] / step["step_s"]
        assert measured["compute"] == pytest.approx(step["compute_s"] * scale)
        data = sum(step["exposed_comm_by_group_s"].get(group, 0.0) for group in DATA_GROUPS)
        assert measured["exposed dp communication"] == pytest.approx(data * scale)
    changes = {part: abs(comparison.measured[1][part] - comparison.measured[0][part]) for part in PARTS}
    named = comparison.changed_most()
    assert changes[named] == max(changes.values())
    assert comparison.sentence().startswith(f"{named} changed most")
    world = [comparison.first.summary["world_size"], comparison.second.summary["world_size"]]
    tokens = [comparison.first.summary["tokens_per_s"], comparison.second.summary["tokens_per_s"]]
    assert comparison.scaling_efficiency() == pytest.approx(tokens[1] / tokens[0] * world[0] / world[1])


def test_tensor_parallel_run_shows_its_tp_waits_and_a_pipelined_one_its_bubble(runs):
    """Each layout's own overhead lands in its own part: tp2's waits in tp's, the pipeline's in the bubble."""
    comparison = compare(runs / "tp2", runs / "1f1b", gpu="a100-80gb")
    tensor, pipeline = comparison.measured
    assert tensor["exposed tp and cp communication"] > 0 and tensor["bubble"] == 0
    assert pipeline["bubble"] > 0 and pipeline["exposed tp and cp communication"] == 0
    assert pipeline["exposed dp communication"] == 0  # its pp waits (loss, norm, barrier) are bubble, not dp


def test_cli_compares_two_runs_in_text_and_json(runs, capsys):
    assert main(["explain", str(runs / "dp2"), str(runs / "dp4"), "--gpu", "a100-80gb"]) == 0
    text = capsys.readouterr().out
    assert "scaling efficiency of B against A" in text and "what changed: " in text
    assert all(f"| {part} (s) |" in text for part in PARTS)
    assert main(["explain", str(runs / "dp2"), str(runs / "dp4"), "--gpu", "a100-80gb", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [run["world_size"] for run in data["runs"]] == [2, 4]
    assert [part["part"] for part in data["parts"]] == list(PARTS)
    assert data["changed_most"] in PARTS and data["sentence"].startswith(data["changed_most"])


def test_three_runs_or_a_run_without_a_traced_step_are_refused_in_one_line(runs, tmp_path, capsys):
    assert main(["explain", str(runs / "dp2"), str(runs / "dp4"), str(runs / "tp2")]) == 2
    assert capsys.readouterr().err.strip().endswith("explain takes one run directory, or two to compare, not 3")
    untraced = tmp_path / "untraced"
    untraced.mkdir()
    summary = json.loads((runs / "dp2" / "summary.json").read_text())
    (untraced / "summary.json").write_text(json.dumps({**summary, "time_split": None}))
    assert main(["explain", str(runs / "dp2"), str(untraced), "--gpu", "a100-80gb"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "has no traced step to split" in lines[0], lines


def test_a_run_spanning_more_nodes_is_said_to_and_its_predicted_all_reduce_crosses_the_slow_link(runs):
    """The seed's scaling question on this machine: dp2 against dp4 predicted on a profile of nodes of
    two ranks joined by a slow network, so dp4 spans two nodes and its gradient all-reduce crosses it."""
    from tests.test_step_trace import calibrated_cpu_profile

    one_node = replace(calibrated_cpu_profile(), gpus_per_node=4)
    two_nodes = replace(one_node, gpus_per_node=2, inter_node_gbps=0.05)
    same = compare(runs / "dp2", runs / "dp4", profile=one_node)
    split = compare(runs / "dp2", runs / "dp4", profile=two_nodes)
    assert same.nodes_clause() == "" and split.measured == same.measured
    assert split.sentence().startswith("dp4 spans 2 node(s) of 2 on ") and ", against dp2 spans 1 node(s)" in \
        split.sentence()
    dp = "exposed dp communication"
    assert split.predicted[0][dp] == pytest.approx(same.predicted[0][dp])  # dp2 stays inside its node
    assert split.predicted[1][dp] > 2 * same.predicted[1][dp] + 0.01
