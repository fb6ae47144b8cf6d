"""plait explain: a finished run's measurements beside the planner's prediction of the same run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from plait.cli import main
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.observe.bottleneck import bottleneck
from plait.explain.run import explain
from plait.observe.trace import timeline_from_trace
from plait.hardware import hardware
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload
from plait.schedules import generate
from tests.cases import run_config, train_losses

LAYOUT = {"pp": 2, "schedule": "1f1b", "microbatches": 2}


@pytest.fixture(scope="module")
def run_dir(pool, tmp_path_factory):
    """A finished two-stage run's directory."""
    path = tmp_path_factory.mktemp("explain") / "run"
    pool.run(train_losses, 2, run_config("tiny", steps=3, **LAYOUT), str(path))
    return path


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    path.write_text(json.dumps(replace(hardware("a100-80gb"), name="test-profile").to_dict()))
    return path


def test_prediction_is_the_planner_on_the_runs_own_model_batch_and_layout(run_dir, profile):
    from plait.hardware import load_profile

    hw = load_profile(profile)
    explanation = explain(run_dir, profile=hw)
    expected = evaluate(Workload(model_spec("tiny", seq_len=64), 8, "fp32", STACKS["plait"]), hw, 2, Layout(**LAYOUT))
    assert explanation.prediction == expected
    summary = json.loads((run_dir / "summary.json").read_text())
    measured = {quantity: value for quantity, _, value, _ in explanation.rows()}
    assert measured["step time"] == summary["step_time_s"]
    assert measured["pipeline bubble"] == summary["bubble_fraction"]
    assert measured["optimizer per rank (most)"] == max(r["optimizer"] for r in summary["model_state_bytes_per_rank"])


def test_trace_holds_the_measured_step_in_the_schedules_order(run_dir):
    timeline = timeline_from_trace(json.loads((run_dir / "trace.json").read_text()))
    schedule = generate("1f1b", 2, 2)
    assert [[span.action for span in spans] for spans in timeline.spans] == [list(a) for a in schedule.actions]
    assert all(span.end >= span.start >= 0 for spans in timeline.spans for span in spans)
    assert 0 < timeline.bubble_fraction < 1


def test_cli_reports_both_sides_and_draws_them(run_dir, profile, capsys):
    assert main(["explain", str(run_dir), "--hardware-profile", str(profile), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hardware"] == "test-profile"
    assert report["layout"]["pp"] == 2
    step = next(row for row in report["rows"] if row["quantity"] == "step time")
    expected = evaluate(Workload(model_spec("tiny", seq_len=64), 8, "fp32", STACKS["plait"]),
                        replace(hardware("a100-80gb"), name="test-profile"), 2, Layout(**LAYOUT))
    assert step["predicted"] == pytest.approx(expected.step_time_s, rel=1e-12)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert step["measured"] == summary["step_time_s"]
    assert (run_dir / "explain.png").stat().st_size > 10_000


def test_summary_table_and_picture_give_the_same_bubble(run_dir):
    """One bubble for a run: the summary's (the median step's), the table's and explain.png's title."""
    summary = json.loads((run_dir / "summary.json").read_text())
    explanation = explain(run_dir, gpu="a100-80gb")
    measured = {quantity: value for quantity, _, value, _ in explanation.rows()}
    (_, measured_title), (simulated, simulated_title) = explanation.pictured()
    assert measured["pipeline bubble"] == summary["bubble_fraction"]
    assert f"the run's bubble {summary['bubble_fraction']:.1%}" in measured_title
    assert f"bubble {simulated.bubble_fraction:.1%}" in simulated_title


@pytest.mark.parametrize("case, expected", [
    ("no summary", "holds no summary.json"),
    ("cpu without a profile", "--hardware-profile FILE"),
])
def test_explain_refuses_what_it_cannot_predict_in_one_line(run_dir, tmp_path, capsys, case, expected):
    target = tmp_path if case == "no summary" else run_dir
    assert main(["explain", str(target)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("plait: error:") and expected in lines[0], lines


@pytest.mark.parametrize("damage, expected", [
    (("trace.json", lambda text: text[:500]), "trace.json is not a readable trace"),
    (("trace.json", lambda text: "[]"), "trace.json is not a readable trace"),
    (("summary.json", lambda text: json.dumps({**json.loads(text), "layout": "garbage"})), "summary.json is damaged"),
    (("summary.json", lambda text: json.dumps({**json.loads(text), "model_spec": {"layers": 2}})),
     "summary.json is damaged"),
    (("summary.json", lambda text: json.dumps({**json.loads(text), "tokens_per_s": "fast"})), "summary.json is damaged"),
    (("summary.json", lambda text: json.dumps({**json.loads(text), "precision": "fp8"})), "summary.json is damaged"),
], ids=["truncated trace", "trace of no events", "summary layout of another type", "summary model cut short",
        "summary figure of another type", "summary precision unknown"])
def test_a_damaged_run_file_is_refused_in_one_line_before_any_report(run_dir, profile, tmp_path, capsys, damage,
                                                                        expected):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    name, change = damage
    (copy / name).write_text(change((copy / name).read_text()))
    assert main(["explain", str(copy), "--hardware-profile", str(profile)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert captured.out == ""


@pytest.fixture(scope="module")
def dp_run_dir(pool, tmp_path_factory):
    """A finished data-parallel run's directory (no pipeline)."""
    path = tmp_path_factory.mktemp("explain_dp") / "run"
    pool.run(train_losses, 2, run_config("tiny", steps=3, dp=2), str(path))
    return path


def test_a_data_parallel_run_is_explained_with_where_its_time_went(dp_run_dir, profile):
    from plait.hardware import load_profile

    explanation = explain(dp_run_dir, profile=load_profile(profile))
    summary = json.loads((dp_run_dir / "summary.json").read_text())
    split = summary["time_split"]
    measured = {quantity: value for quantity, _, value, _ in explanation.rows()}
    # Step 1 is traced, step 2 plain: the traced parts are scaled to the plain step.
    plain = [row["step_time_s"] for row in map(json.loads, (dp_run_dir / "metrics.jsonl").read_text().splitlines())
             if row.get("step") == 2]
    assert summary["step_time_s"] == pytest.approx(plain[0])
    assert summary["trace_slowdown"] == pytest.approx(split["step_s"]["median"] / plain[0])
    assert measured["compute"] == pytest.approx(split["compute_s"]["median"] / summary["trace_slowdown"])
    assert split["exposed_comm_by_group_s"]["dp"] > 0
    assert measured["exposed dp communication"] == pytest.approx(
        split["exposed_comm_by_group_s"]["dp"] / summary["trace_slowdown"])
    report = explanation.report()
    assert f"traced steps ran {summary['trace_slowdown']:.2f}× a plain step" in report
    assert f"bottleneck: {bottleneck(split)}" in report
    assert "the planner" in report
    assert explanation.draw() is None  # the measured-beside-simulated picture is of pipeline schedules


def _split(compute: float, exposed: dict[str, float], bubble: float = 0.0, host: float = 0.0) -> dict:
    """A time split as plait.observe.time_split writes it, of one traced step."""
    step = compute + sum(exposed.values()) + bubble + host
    median = lambda value: {"median": value, "min": value, "max": value}  # noqa: E731
    return {"step_s": median(step), "compute_s": median(compute), "bubble_s": median(bubble),
            "host_s": median(host), "exposed_comm_by_op_s": exposed}


@pytest.mark.parametrize(("split", "named"), [
    (_split(0.030, {"dp all_reduce": 0.060}), "exposed dp all_reduce is 67% of the step: the model is too light"),
    (_split(1.000, {"dp all_reduce": 0.050}, host=0.02), "compute is 93% of the step: the run is compute-bound"),
    (_split(1.000, {"tp all_reduce": 0.1, "dp all_reduce": 0.3}), "exposed dp all_reduce is 21% of the step"),
    (_split(1.000, {"pp send": 0.05}, bubble=0.5), "the pipeline bubble is 32% of the step: more micro-batches"),
])
def test_the_bottleneck_is_what_holds_the_step_above_its_compute(split, named):
    """The largest exposed part if it is a tenth of the step or more, else compute: a light model's
    exposed all-reduce is named even though compute is larger, a heavy model is compute-bound."""
    assert bottleneck(split).startswith(named), bottleneck(split)


def test_the_step_time_is_the_median_plain_step_and_the_slowdown_the_traced_one_over_it():
    """Warm-up, traced and profiled steps are left out of the step time while a plain step remains."""
    from plait.observe.summary import steady_step_time, trace_slowdown

    times, observed = [9.0, 4.0, 1.0, 5.0, 2.0], [False, True, False, True, False]
    assert steady_step_time(times, observed) == 1.5
    assert steady_step_time(times, [False, True, True, True, True]) == 3.0  # no plain step: every step after the first
    assert steady_step_time([3.0], [True]) == 3.0
    traced = {"step_s": {"median": 4.5}}
    assert trace_slowdown(traced, times, observed) == 3.0
    assert trace_slowdown(traced, times, [False, True, True, True, True]) is None
    assert trace_slowdown(None, times, observed) is None


def test_a_two_stage_run_of_a_light_model_is_told_what_to_change_and_the_command_runs_it(run_dir, capsys):
    """On an A100 the planner puts tiny's two ranks in data parallel, well beyond its own error: explain
    says so with the gain, and its train command is accepted (a dry run) and pins that layout."""
    from plait.plan.ranking import PLANNER_ERROR

    explanation = explain(run_dir, gpu="a100-80gb")
    suggestion = explanation.suggestion()
    assert suggestion is not None and suggestion["name"] != explanation.layout.describe()
    assert suggestion["gain"] == pytest.approx(
        explanation.prediction.step_time_s / suggestion["predicted_step_time_s"] - 1) and suggestion["gain"] > PLANNER_ERROR
    assert f"what to change: {suggestion['name']} is predicted" in explanation.report()
    command = suggestion["train_command"]
    assert command[:4] == ["plait", "train", "--config", str(run_dir / "config.toml")]
    assert main([*command[1:], "--dry-run", "--gpu", "a100-80gb"]) == 0
    dry_run = capsys.readouterr().out
    assert Layout(**suggestion["layout"]).describe() in dry_run


def test_no_change_is_suggested_within_the_planners_error(run_dir):
    explanation = explain(run_dir, gpu="a100-80gb")
    best = explanation.fastest
    within = replace(explanation, prediction=replace(explanation.prediction, step_time_s=best.step_time_s * 1.01))
    assert within.suggestion() is None
    assert "no change suggested" in within.planner_choice()
