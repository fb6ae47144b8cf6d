"""The span tracer: waits it reports follow a known delay, a step's parts add up to its measured time
under every kind of layout, trace.json has a track per rank, and the bytes on its collectives are the
shared analytic volumes."""

from __future__ import annotations

import json
import statistics

import pytest

from plait.facts.collectives import (
    collective_bytes_per_layer, outside_layer_collective_bytes, stage_boundary_bytes,
    tied_embedding_bytes,
)
from plait.facts.model_state import communicated_bytes, rank_parameters
from plait.facts.stack import STACKS
from plait.layout import DATA_GROUPS, Layout
from plait.models.spec import model_spec
from plait.observe.time_split import split_step
from plait.train.launch import print_summary
from tests.cases import layout_world_size, run_config
from tests.trace_cases import ddp_steps_with_delay, profiled_run, traced_run

DELAY_S = 0.1
LAYOUTS = {
    "dp2": {"dp": 2},
    "tp2": {"tp": 2},
    "cp2": {"cp": 2},
    "pp2": {"pp": 2, "microbatches": 2},
    "dp2·tp2·pp2": {"dp": 2, "tp": 2, "pp": 2, "microbatches": 2},
}
PARTS = ("compute_s", "exposed_comm_s", "bubble_s", "data_s", "host_s")


def test_a_delayed_collective_raises_exposed_communication_by_the_delay(pool):
    """Rank 1 issues the gradient all-reduce DELAY_S late on every other step: rank 0's exposed dp
    communication on those steps exceeds the step before's by the delay, within 20% (paired steps of
    one run, so that the machine's drift between runs falls on both alike)."""
    steps = pool.run(ddp_steps_with_delay, 2, DELAY_S, 12)[0]
    exposed = {record["step"]: split_step(record)["exposed_comm_by_group_s"].get("dp", 0.0) for record in steps}
    rises = [exposed[step] - exposed[step - 1] for step in exposed if step % 2 and step - 1 in exposed]
    assert len(rises) >= 5
    assert 0.8 * DELAY_S <= statistics.median(rises) <= 1.2 * DELAY_S, exposed


@pytest.fixture(scope="module")
def runs(pool, tmp_path_factory):
    """Every rank's traced steps, each rank's step times as its loop measured them, and the trace.json
    of a four-step run of each layout."""
    out = {}
    for name, layout in LAYOUTS.items():
        run_dir = tmp_path_factory.mktemp("trace") / "run"
        ranks = pool.run(traced_run, layout_world_size(layout), run_config("tiny", steps=4, **layout), str(run_dir))
        step_times = [times for _, times in ranks]
        out[name] = ranks[0][0], step_times, json.loads((run_dir / "trace.json").read_text()), run_dir
    return out


@pytest.mark.parametrize("name", LAYOUTS)
def test_compute_exposed_bubble_data_and_host_add_up_to_the_step_time(runs, name):
    traces, step_times, _, _ = runs[name]
    assert len(traces) == layout_world_size(LAYOUTS[name])
    for rank in traces:
        assert [record["step"] for record in rank["steps"]] == [1, 2, 3]
        for record in rank["steps"]:
            split = split_step(record)
            assert all(split[part] >= 0 for part in PARTS)
            measured = step_times[rank["rank"]][record["step"]]
            assert sum(split[part] for part in PARTS) == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("name", LAYOUTS)
def test_trace_has_a_track_per_rank_and_collectives_with_group_op_and_bytes(runs, name):
    traces, _, trace, run_dir = runs[name]
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert names == {rank["rank"]: rank["name"] for rank in traces}
    assert len(set(names.values())) == len(names)
    groups = {e["args"]["group"] for e in trace["traceEvents"] if e.get("cat") == "collective" and e["ph"] == "b"}
    layout = Layout(**LAYOUTS[name])
    # the gradients' reduction on its own group, dp·cp's, even where dp is 1 (cp's own ranks)
    assert groups == ({dim for dim in ("dp", "tp", "cp", "pp") if LAYOUTS[name].get(dim, 1) > 1}
                      | ({layout.replica_dim} if layout.dp * layout.cp > 1 else set()))
    assert all(e["args"]["bytes"] >= 0 and e["args"]["op"] for e in trace["traceEvents"]
               if e.get("cat") == "collective" and e["ph"] == "b")
    assert (run_dir / "timeline.png").stat().st_size > 10_000


def calibrated_cpu_profile():
    """A profile as ``plait calibrate`` writes one for a CPU: host overheads per family and per parallel
    wrapper, kernel scales, an optimizer fit, a host that does not run ahead of its kernels."""
    from dataclasses import replace

    from plait.hardware import HostOverhead, KernelScale, hardware

    wrappers = {f"{family}/{style}": HostOverhead(2e-4, 3e-4, 0.0, 0.0, 1e-3)
                for family in ("gpt2", "llama") for style in ("tp", "sp", "cp", "zero0", "zero1", "zero2", "zero3")}
    return replace(hardware("a100-80gb"), name="calibrated-cpu", host_runs_ahead=False, comm_overlap=0.0,
                   host_overhead={"gpt2": HostOverhead(4e-4, 6e-4, 1e-3, 2e-3), **wrappers},
                   layer_kernel_scale={"gpt2": KernelScale(1.2, 1.1)}, optimizer_parameter_s=1e-8,
                   optimizer_tensor_s=5e-5)


@pytest.mark.parametrize("profile", ["catalog GPU, no profile", "calibrated profile"])
@pytest.mark.parametrize("name", LAYOUTS)
def test_explain_sets_every_layouts_measured_time_beside_the_planners(runs, name, profile):
    """plait explain on dp-, tp-, cp-only, pipelined and 3-D runs, predicted on a catalog GPU (no
    calibration) and on a calibrated profile: the measured step and each group's exposed
    communication beside the planner's prediction of the same run, the bottleneck, and the bytes of
    each group's collectives equal on both sides."""
    from plait.observe.bottleneck import bottleneck
    from plait.explain.run import explain

    run_dir = runs[name][3]
    summary = json.loads((run_dir / "summary.json").read_text())
    if profile == "calibrated profile":
        explanation = explain(run_dir, profile=calibrated_cpu_profile())
        assert explanation.prediction.step_time_s > explain(run_dir, gpu="a100-80gb").prediction.step_time_s
    else:
        explanation = explain(run_dir, gpu="a100-80gb")
    rows = {quantity: (predicted, measured) for quantity, predicted, measured, _ in explanation.rows()}
    assert rows["step time"][1] == summary["step_time_s"] and rows["step time"][0] > 0
    exposed = summary["time_split"]["exposed_comm_by_group_s"]
    data = sum(exposed.get(group, 0.0) for group in DATA_GROUPS)
    assert rows["exposed dp communication"][1] == data and rows["exposed tp and cp communication"][1] == \
        exposed.get("tp", 0.0) + exposed.get("cp", 0.0)
    layout = explanation.layout
    for size, quantity in ((layout.dp * layout.cp, "exposed dp communication"), (layout.tp, "exposed tp and cp communication"),
                           (layout.cp, "exposed tp and cp communication")):
        if size > 1:  # the planner predicts a cost for every group the layout has (cp2's replicas: dp·cp's)
            assert rows[quantity][0] > 0, quantity
    assert f"bottleneck: {bottleneck(summary['time_split'])}" in explanation.report()
    volumes = [(predicted, measured) for quantity, predicted, measured, unit in explanation.rows()
               if quantity.endswith("bytes per step (rank 0)")]
    assert volumes and all(predicted == measured for predicted, measured in volumes), volumes


def test_closing_lines_give_compute_exposed_communication_and_bubble(runs, capsys):
    """Each share is the median over the traced steps of the ranks' mean part over their mean step."""
    traces, _, _, run_dir = runs["dp2·tp2·pp2"]
    summary = json.loads((run_dir / "summary.json").read_text())
    print_summary(summary, run_dir)
    shares = []
    for part in ("compute_s", "exposed_comm_s", "bubble_s"):
        per_step = []
        for step in (1, 2, 3):
            splits = [split_step(r) for rank in traces for r in rank["steps"] if r["step"] == step]
            per_step.append(sum(s[part] for s in splits) / sum(s["step_s"] for s in splits))
        shares.append(statistics.median(per_step))
    assert f"compute : exposed communication : bubble = {shares[0]:.0%} : {shares[1]:.0%} : {shares[2]:.0%}" in \
        capsys.readouterr().out
    assert summary["comm_fraction"] == pytest.approx(shares[1], rel=1e-9)


def _issued_in(record: dict, span_names: tuple[str, ...], group: str, op: str) -> int:
    """Bytes handed to ``group``'s ``op`` transfers issued inside the step's spans named ``span_names``."""
    spans = [s for s in record["spans"] if s["name"] in span_names]
    return sum(t["bytes"] for t in record["transfers"] if t["group"] == group and t["op"] == op
               and any(s["start"] <= t["issued"] <= s["end"] for s in spans))


def test_data_parallel_all_reduce_moves_every_gradient_once(runs):
    """The all-reduce's buckets, issued during backward, carry the rank's parameters' fp32 gradients."""
    spec = model_spec("tiny", seq_len=64)
    expected = 4 * rank_parameters(spec, spec.layers, True, True, tp=1)
    for rank in runs["dp2"][0]:
        for record in rank["steps"]:
            assert _issued_in(record, ("backward",), "dp", "all_reduce") == expected


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_collectives_carry_the_model_states_bytes(pool, tmp_path, zero):
    """Per step over dp2: ZeRO-1 all-reduces every gradient, ZeRO-2 reduce-scatters them, both gather the
    updated parameters once (each rank handing its half); ZeRO-3 gathers every parameter in forward and
    again in backward and reduce-scatters every gradient (plait.facts.model_state's parameters and
    communicated bytes); the logged loss is one more 4-byte all-reduce. Every one of them completes within
    the step: the tracer lets go of each, and so of the gradient a reduce-scatter reads."""
    layout = Layout(dp=2, zero=zero)
    traces = pool.run(traced_run, 2, run_config("tiny", steps=2, dp=2, zero=zero), str(tmp_path))[0][0]
    spec = model_spec("tiny", seq_len=64)
    parameters = int(rank_parameters(spec, spec.layers, True, True, tp=1))
    grad_bytes, param_bytes = communicated_bytes(layout, "fp32", STACKS["plait"])
    gradients, shards = parameters * grad_bytes, parameters * param_bytes // layout.dp
    expected = {1: {"all_reduce": gradients + 4, "all_gather": shards},
                2: {"reduce_scatter": gradients, "all_gather": shards, "all_reduce": 4},
                3: {"all_gather": 2 * shards, "reduce_scatter": gradients, "all_reduce": 4}}[zero]
    for rank in traces:
        transfers = rank["steps"][-1]["transfers"]
        measured = {op: sum(t["bytes"] for t in transfers if t["group"] == "dp" and t["op"] == op) for op in expected}
        assert measured == expected
        assert {t["op"] for t in transfers if t["group"] == "dp"} == set(expected)
        # Each found complete within the step (gloo's reduce-scatter once a later dp collective is).
        assert all(t["completed"] is not None for t in transfers if t["group"] == "dp")


@pytest.mark.parametrize("layout, op", [({"cp": 2}, "all_to_all"), ({"cp": 2, "cp_algorithm": "ring"}, "send"),
                                        ({"cp": 2, "cp_algorithm": "all-gather"}, "all_gather"),
                                        ({"cp": 2, "cp_algorithm": "all-gather"}, "reduce_scatter")])
def test_context_collectives_carry_the_analytic_bytes(pool, tmp_path, layout, op):
    """Per step: every layer's collective bytes (plait.facts.collectives); only the layers exchange over cp."""
    traces = pool.run(traced_run, layout_world_size(layout), run_config("tiny", steps=2, **layout), str(tmp_path))[0][0]
    spec = model_spec("tiny", seq_len=64)
    per_layer = collective_bytes_per_layer(spec, Layout(**layout), 8)[op]
    for rank in traces:
        record = rank["steps"][-1]
        measured = sum(t["bytes"] for t in record["transfers"] if t["group"] == "cp" and t["op"] == op)
        assert measured == spec.layers * per_layer


@pytest.mark.parametrize("layout", [{"tp": 2}, {"tp": 2, "sp": True}, {"dp": 2, "tp": 2, "sp": True}],
                         ids=["tp2", "tp2-sp", "dp2·tp2-sp"])
def test_tensor_collectives_of_a_whole_step_carry_the_analytic_bytes(pool, tmp_path, layout):
    """Per step and op, the tp group's traced bytes: every layer's (plait.facts.collectives) and those
    of the model's two ends (embedding, head, the final norm's gradient sum under sp)."""
    traces = pool.run(traced_run, layout_world_size(layout), run_config("tiny", steps=2, **layout), str(tmp_path))[0][0]
    spec, batch = model_spec("tiny", seq_len=64), 8 // layout.get("dp", 1)
    per_layer = collective_bytes_per_layer(spec, Layout(tp=2, sp=layout.get("sp", False)), batch)
    ends = outside_layer_collective_bytes(spec, batch, 64, tp=2, sp=layout.get("sp", False))
    expected = {op: spec.layers * per_layer.get(op, 0) + ends.get(op, 0) for op in {*per_layer, *ends}}
    for rank in traces:
        transfers = rank["steps"][-1]["transfers"]
        measured = {op: sum(t["bytes"] for t in transfers if t["group"] == "tp" and t["op"] == op) for op in expected}
        assert measured == expected


@pytest.mark.parametrize("name", ["pp2", "dp2·tp2·pp2"])
def test_pipeline_transfers_carry_the_stage_boundary_bytes(runs, name):
    """Per step, every pipeline rank sends one boundary tensor per micro-batch (activations forward on
    the first stage, gradients backward on the last) and receives one, then the two end stages swap
    their tied embedding's gradient: plait.facts.collectives's stage_boundary_bytes and
    tied_embedding_bytes, which the planner times."""
    spec, layout = model_spec("tiny", seq_len=64), Layout(**LAYOUTS[name])
    micro_batch = 8 // layout.dp // layout.microbatches
    boundary = stage_boundary_bytes(spec, layout, micro_batch, "fp32", STACKS["plait"])
    expected = [boundary] * layout.microbatches + [tied_embedding_bytes(spec, layout, "fp32", STACKS["plait"])]
    for rank in runs[name][0]:
        for record in rank["steps"]:
            for op in ("send", "recv"):
                moved = [t["bytes"] for t in record["transfers"] if t["group"] == "pp" and t["op"] == op]
                assert moved == expected, (op, moved)


def test_profile_steps_writes_a_torch_profiler_trace_per_rank_and_step(pool, tmp_path):
    """Steps 1 and 2 profiled (step 1 also traced): the run's step time is step 3's, the one plain step."""
    pool.run(profiled_run, 2, run_config("tiny", steps=4, dp=2), str(tmp_path), "1:2")
    files = sorted(path.name for path in (tmp_path / "profile").iterdir())
    assert files == ["rank0_step1.json", "rank0_step2.json", "rank1_step1.json", "rank1_step2.json"]
    events = json.loads((tmp_path / "profile" / "rank1_step2.json").read_text())["traceEvents"]
    assert any(event.get("name") == "c10d::allreduce_" for event in events)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["step_time_s"] == pytest.approx(next(r["step_time_s"] for r in rows if r["step"] == 3))


@pytest.mark.parametrize("shape, global_batch, named", [
    # benchmarks/data_parallel_scaling.py's light model: 14.4M parameters, two sequences of 4 tokens
    ({"layers": 2, "hidden": 768, "heads": 12, "kv_heads": 12, "seq_len": 4}, 2, "exposed dp all_reduce is"),
    # tiny on 32 × 1,024 tokens per rank: 36× its FLOPs per sequence, and four times the batch of the
    # benchmark's heavy run, as a busy guest has read 11% exposed at 8 sequences a rank and 12% at 16
    ({"seq_len": 1024}, 64, "compute is"),
], ids=["light", "heavy"])
def test_explain_names_the_light_runs_all_reduce_and_the_heavy_runs_compute(pool, tmp_path, shape, global_batch,
                                                                             named):
    """The lesson on real dp2 runs: plait explain's bottleneck sentence names the exposed gradient
    all-reduce of a light run ("the model is too light for this link") and calls a heavy run
    compute-bound."""
    from dataclasses import replace

    from plait.explain.run import explain

    # The median of five traced steps: a rank descheduled on a busy machine stalls its peer's
    # all-reduce for a step or two, which must not name a compute-bound run's all-reduce.
    config = run_config("tiny", steps=6, global_batch=global_batch, dp=2)
    config = replace(config, model=model_spec("tiny", **shape))
    pool.run(traced_run, 2, config, str(tmp_path))
    report = explain(tmp_path, gpu="a100-80gb").report()
    sentence = next(line for line in report.splitlines() if line.startswith("bottleneck: "))
    assert sentence.startswith(f"bottleneck: {named}"), sentence
