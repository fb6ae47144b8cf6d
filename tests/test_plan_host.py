"""The planner's host-overhead terms: what calibrate fits is what the prediction then adds back."""

from __future__ import annotations

import json
from dataclasses import asdict, astuple, replace

import pytest
import torch

from plait.calibrate.host import (
    CPU_SIZES, PARALLEL_STYLES, PROBE_LAYERS, fit_host_overhead, fit_layer_kernel_scale,
    fit_wrapper_overhead, probe_spec, working_spec,
)
from plait.calibrate.machine import SIZES, fit_ring_scale
from plait.errors import ConfigError
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.flops import embedding_tensor_count, head_tensor_count, layer_tensor_count
from plait.models.spec import PRESETS, model_spec
from plait.models.transformer import Transformer
from plait.plan.comm import Link, reduce_scatter_seconds, ring_pass_seconds
from plait.plan.compute import head_times, layer_times
from plait.plan.costs import layer_cost, parallel_styles
from plait.hardware import CollectiveScale, HostOverhead, KernelScale, hardware, load_profile, save_profile
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload

CPU_LIKE = replace(hardware("a100-80gb"), host_runs_ahead=False, comm_overlap=0.0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_tensor_counts_are_the_models_parameter_tensors(name):
    spec = model_spec(name)
    with torch.device("meta"):
        model = Transformer(spec)
    counted = spec.layers * layer_tensor_count(spec) + embedding_tensor_count(spec) + head_tensor_count(spec)
    assert counted == len(list(model.parameters()))


def test_a_host_that_runs_ahead_hides_under_the_kernels_and_one_that_does_not_adds():
    spec = model_spec("tiny")
    host = {"gpt2": HostOverhead(layer_forward=1.0, layer_backward=2.0)}
    kernels = layer_times(spec, CPU_LIKE, Layout(), 2, "fp32")
    adds = layer_times(spec, replace(CPU_LIKE, host_overhead=host), Layout(), 2, "fp32", STACKS["megatron"])
    hides = layer_times(spec, replace(CPU_LIKE, host_overhead=host, host_runs_ahead=True), Layout(), 2, "fp32",
                        STACKS["megatron"])
    assert adds.forward == pytest.approx(kernels.forward + 1.0) and adds.backward_input == pytest.approx(kernels.backward_input + 2.0)
    assert hides.forward == pytest.approx(max(kernels.forward, 1.0))


def test_the_fitted_host_overhead_reproduces_the_probe_passes():
    spec = probe_spec("llama", PROBE_LAYERS[0])
    layer, head = layer_times(spec, CPU_LIKE, Layout(), 1, "fp32", STACKS["plait"]), head_times(spec, CPU_LIKE, "fp32", 1, 1, 1)
    extra = HostOverhead(3e-4, 5e-4, 2e-4, 7e-4)  # what the "measurement" hides beyond the kernels
    t = {}
    for n in PROBE_LAYERS:
        forward = n * (layer.forward + extra.layer_forward) + head.forward + extra.model_forward
        backward = n * (layer.backward + extra.layer_backward) + head.backward + extra.model_backward
        t[f"forward{n}"], t[f"both{n}"] = forward, forward + backward
    assert astuple(fit_host_overhead(t, layer, head)) == pytest.approx(astuple(extra))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_fitted_kernel_scale_reproduces_the_working_layers(family):
    """Layers whose kernels take 1.4× (forward) and 1.2× (backward) the kernel model's time, on a
    host with its own overhead: the fit recovers both factors, and the planner's layer time with
    them (and the host overhead) equals the "measured" per-layer seconds."""
    host = {family: HostOverhead(layer_forward=4e-4, layer_backward=6e-4)}
    spec = working_spec(family, 1)
    kernels = layer_times(spec, CPU_LIKE, Layout(), CPU_SIZES.working_micro_batch, "fp32", STACKS["plait"])
    forward, backward = 1.4 * kernels.forward + 4e-4, 1.2 * kernels.backward + 6e-4
    t = {}
    for n in PROBE_LAYERS:
        t[f"forward{n}"] = n * forward + 0.01  # plus a head and embedding that the fit must ignore
        t[f"both{n}"] = n * (forward + backward) + 0.03
    scale = fit_layer_kernel_scale(t, kernels, host[family])
    assert (scale.forward, scale.backward) == pytest.approx((1.4, 1.2))
    fitted = layer_times(spec, replace(CPU_LIKE, host_overhead=host, layer_kernel_scale={family: scale}), Layout(),
                         CPU_SIZES.working_micro_batch, "fp32", STACKS["plait"])
    assert (fitted.forward, fitted.backward) == pytest.approx((forward, backward))


@pytest.mark.parametrize("style", sorted(PARALLEL_STYLES))
def test_the_fitted_wrapper_overhead_reproduces_the_probe_steps(style):
    """Fitted from steps that exceed the prediction (with the styles fitted before it, which the
    probe's layout runs too: a cp probe's DDP over its cp ranks is zero0's) by 2 ms per layer and
    5 ms per step, the overhead lands where the planner adds it for that style's layouts: both steps
    come out exact."""
    layout = PARALLEL_STYLES[style]
    earlier = list(PARALLEL_STYLES)[:list(PARALLEL_STYLES).index(style)]
    assert style in parallel_styles(layout) and set(parallel_styles(layout)) <= {style, *earlier}
    base = {family: HostOverhead(layer_forward=1e-3, layer_backward=3e-3) for family in ("gpt2", "llama")}
    base |= {f"gpt2/{other}": HostOverhead(layer_forward=4e-3, step=7e-3) for other in earlier}
    hw = replace(CPU_LIKE, host_overhead=base)

    def steps(profile):
        return {n: evaluate(Workload(probe_spec("gpt2", n), layout.dp, "fp32", STACKS["plait"]), profile, 2, layout).step_time_s
                for n in PROBE_LAYERS}

    predicted = steps(hw)
    measured = {n: t + n * 2e-3 + 5e-3 for n, t in predicted.items()}
    fitted = fit_wrapper_overhead(measured, predicted, base["gpt2"])
    assert fitted.layer_forward == pytest.approx(0.5e-3) and fitted.layer_backward == pytest.approx(1.5e-3)
    assert steps(replace(hw, host_overhead={**base, f"gpt2/{style}": fitted})) == pytest.approx(measured)


def test_each_wrapper_counts_once_per_layout():
    assert parallel_styles(Layout(dp=2, tp=2)) == ["tp"]  # replicas average outside DDP under tp
    assert parallel_styles(Layout(dp=2, cp=2, zero=3)) == ["cp", "zero3"]
    assert parallel_styles(Layout(cp=2)) == ["cp", "zero0"]  # the cp ranks reduce their gradients as dp's
    assert parallel_styles(Layout(pp=2)) == []
    hw = replace(CPU_LIKE, host_overhead={"gpt2/tp": HostOverhead(layer_forward=1.0), "gpt2/cp": HostOverhead(layer_forward=10.0)})
    spec = model_spec("tiny")
    alone = layer_cost(spec, CPU_LIKE, Layout(tp=2, cp=2), 2, "fp32", STACKS["plait"]).times.forward
    assert layer_cost(spec, hw, Layout(tp=2, cp=2), 2, "fp32", STACKS["plait"]).times.forward == pytest.approx(alone + 11.0)


def test_a_calibrated_profile_round_trips_through_its_file(tmp_path):
    profile = replace(CPU_LIKE, host_overhead={"gpt2": HostOverhead(1e-3, 2e-3, 3e-3, 4e-3, 5e-3)},
                      layer_kernel_scale={"llama": KernelScale(1.3, 1.1)}, optimizer_parameter_s=1e-8, optimizer_tensor_s=5e-5,
                      reduce_scatter_scale=CollectiveScale(2.1, 3.4), all_gather_scale=CollectiveScale(0.5, 3.6))
    save_profile(profile, tmp_path / "profile.json")
    assert load_profile(tmp_path / "profile.json") == profile


def test_a_profile_whose_cp_overhead_meant_another_measurement_is_refused_and_kept(tmp_path):
    """Unmarked profiles (format 1) measured cp's wrapper without the gradients' reduction over cp,
    which the planner now adds as zero0's: such a profile is refused, whole and unchanged; one
    without a cp figure means the same in both formats and still loads."""
    cp_measured = replace(CPU_LIKE, host_overhead={"gpt2": HostOverhead(1e-3), "gpt2/cp": HostOverhead(2e-3)})
    save_profile(cp_measured, tmp_path / "profile.json")
    assert load_profile(tmp_path / "profile.json") == cp_measured
    for name, profile in (("old.json", cp_measured), ("old-without-cp.json", replace(cp_measured, host_overhead={}))):
        record = json.loads((tmp_path / "profile.json").read_text()) | {"host_overhead": {
            family: asdict(seconds) for family, seconds in profile.host_overhead.items()}}
        del record["profile_format"]
        (tmp_path / name).write_text(json.dumps(record))
    before = (tmp_path / "old.json").read_text()
    with pytest.raises(ConfigError, match="profile format 1.*without the gradients' reduction over cp.*plait calibrate"):
        load_profile(tmp_path / "old.json")
    assert (tmp_path / "old.json").read_text() == before
    assert load_profile(tmp_path / "old-without-cp.json") == replace(cp_measured, host_overhead={})
    newer = json.loads(before) | {"profile_format": 99}
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    with pytest.raises(ConfigError, match="profile format 99, and this plait reads format"):
        load_profile(tmp_path / "newer.json")


def test_communication_hides_under_compute_only_as_far_as_the_hardware_overlaps():
    layout, workload = Layout(dp=8), Workload(model_spec("gpt2"), 64, "bf16")
    gpu = evaluate(workload, hardware("a100-80gb", inter_node_gbps=1.0), 8, layout)
    serial = evaluate(workload, replace(hardware("a100-80gb", inter_node_gbps=1.0), comm_overlap=0.0), 8, layout)
    assert serial.time_breakdown["exposed_dp_comm_s"] > gpu.time_breakdown["exposed_dp_comm_s"]
    assert serial.step_time_s == pytest.approx(gpu.step_time_s + serial.time_breakdown["exposed_dp_comm_s"]
                                               - gpu.time_breakdown["exposed_dp_comm_s"])


def test_the_fitted_ring_scale_reproduces_the_measured_collectives():
    """A collective whose latency is 2.1 passes' and whose bandwidth term is 3.4 passes' (gloo's
    reduce-scatter reads about so): the fit recovers both, and reduce_scatter_seconds the times."""
    link = Link(2e9, 3e-5, False)
    scale = CollectiveScale(2.1, 3.4)
    measured = {size: ring_pass_seconds(size, 2, link, scale) for size in SIZES}
    fitted = fit_ring_scale(measured, link)
    assert astuple(fitted) == pytest.approx(astuple(scale))
    for size, seconds in measured.items():
        assert reduce_scatter_seconds(size, 2, replace(link, reduce_scatter_scale=fitted)) == pytest.approx(seconds)


def test_sequence_parallel_pays_the_measured_reduce_scatter_and_all_gather():
    """On ring collectives (NCCL, scales 1) sp's all-gather + reduce-scatter pairs cost what tp's
    all-reduces do; where a reduce-scatter costs a whole all-reduce (gloo), sp pays that."""
    spec = model_spec("gpt2")

    def tp_comm(hw, sp: bool) -> float:
        return layer_cost(spec, hw, Layout(tp=2, sp=sp), 2, "fp32", STACKS["plait"]).comm_forward

    assert tp_comm(CPU_LIKE, True) == pytest.approx(tp_comm(CPU_LIKE, False))
    gloo_like = replace(CPU_LIKE, reduce_scatter_scale=CollectiveScale(2.0, 2.0))
    assert tp_comm(gloo_like, False) == pytest.approx(tp_comm(CPU_LIKE, False))
    assert tp_comm(gloo_like, True) == pytest.approx(1.5 * tp_comm(CPU_LIKE, False))
