"""What `plait calibrate` fits on a GPU, and the attention model those fits feed: first-principles
cases and synthetic timings the fits must recover (CI has no GPU; the same code runs on the CPU)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace

import pytest
import torch

from plait.calibrate.gpu import KernelShapes, fit_attention, fit_matmul_efficiency, measure_device
from plait.calibrate.host import (
    PROBE_LAYERS, ProbeSizes, fit_host_overhead, host_probe_kernels, interleaved_medians, probe_spec,
)
from plait.calibrate.machine import probe_attention_seconds
from plait.facts.activations import ACTIVATION_BYTES
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.spec import PRESETS
from plait.plan.compute import Gemm, attention_matmul_seconds, gemm_seconds, layer_times, matmul_rate
from plait.hardware import causal_exponentials, hardware, load_profile, save_profile

H100 = hardware("h100-sxm")


def test_a_flash_kernel_is_bound_by_its_flops_not_by_a_score_matrix_it_never_writes():
    """Causal attention of Llama 3.2 1B's shape (32 heads of 64, 8k tokens) on an H100: written out, its
    8k × 8k scores are 4.3 GB a matmul, 1.3 ms at 3.35 TB/s, and that bound hides the head dimension.
    A flash kernel keeps them on chip: its time is its FLOPs at the matmul rate, twice as long at a head
    dimension of 128, and under the time of the scores' bytes (cuDNN took 0.63 ms on an H100 here)."""
    scores = Gemm(8192, 8192, 64, 32)
    score_bytes = ACTIVATION_BYTES["bf16"] * 32 * 8192 * 8192
    flash = attention_matmul_seconds(H100, "bf16", scores, flash=True)
    assert flash - H100.kernel_overhead_s == pytest.approx(2 * scores.flops / matmul_rate(H100, "bf16", 8192, 8192))
    assert flash < score_bytes / (H100.memory_gbps * 1e9)
    wider = attention_matmul_seconds(H100, "bf16", Gemm(8192, 8192, 128, 32), flash=True)
    assert wider - H100.kernel_overhead_s == pytest.approx(2 * (flash - H100.kernel_overhead_s))
    written = attention_matmul_seconds(H100, "bf16", scores, flash=False)
    assert written >= 2 * score_bytes / (H100.memory_gbps * 1e9)


def test_the_catalog_charges_a_flash_kernels_exponentials_at_its_special_function_rate():
    """One exponential per score of the causal half, at the H100 SXM's 3.9 TFLOP/s of special functions
    (FlashAttention-3 paper): the layer's attention is its matmuls plus that, and the backward runs
    2.5× the matmuls and the exponentials once more."""
    spec = PRESETS["llama-1b"]
    exponentials = 32 * 8192 * 8192 * causal_exponentials(3.9)
    assert exponentials == pytest.approx(32 * 8192 * 8192 / 2 / 3.9e12)
    times = layer_times(spec, H100, Layout(), 1, "bf16", STACKS["megatron"])
    matmuls = attention_matmul_seconds(H100, "bf16", Gemm(8192, 8192, 64, 32), flash=True)
    assert times.attention == pytest.approx(matmuls + exponentials)
    assert times.attention_backward == pytest.approx(2.5 * matmuls + exponentials)


def test_the_matmul_fit_recovers_an_efficiency_and_a_launch_cost():
    shapes = [(8192, 3072, 2048), (8192, 2048, 8192), (1000, 1000, 1000), (300, 5000, 4096), (16384, 28672, 4096)]
    truth = replace(H100, matmul_efficiency=0.72, kernel_overhead_s=9e-6)
    timed = [(s, gemm_seconds(truth, "bf16", Gemm(*s))) for s in shapes]
    # (every shape compute-bound, as the fit assumes: the roofline's other side is the elementwise fit's)
    assert all(t == pytest.approx(2 * m * n * k / matmul_rate(truth, "bf16", m, n) + 9e-6) for (m, n, k), t in timed)
    efficiency, launch = fit_matmul_efficiency(H100, "bf16", timed)
    assert (efficiency, launch) == pytest.approx((0.72, 9e-6))


def test_the_attention_fit_recovers_forward_and_backward_apart_from_a_per_call_cost():
    """Timings made from known figures plus a per-call cost (launches, the last wave) that the layer
    model does not charge: the fit returns the figures, and the model's forward and backward from
    them are the timings less that cost."""
    shapes = [(32, 1024, 128), (32, 2048, 64), (32, 4096, 128), (32, 8192, 64), (32, 8192, 128), (64, 4096, 128)]
    matmuls = {s: probe_attention_seconds(H100, "bf16", s) for s in shapes}
    scores = {s: s[0] * s[1] * s[1] for s in shapes}
    timed = [(s, matmuls[s] / 2.4 + scores[s] * 0.15e-12 + 2e-5, matmuls[s] / 0.5 + scores[s] * 0.04e-12 + 2e-4)
             for s in shapes]
    figures, points = fit_attention(timed, H100, "bf16")
    assert figures["attention_efficiency"] == pytest.approx(2.4)
    assert figures["attention_score_s"] == pytest.approx(0.15e-12)
    assert figures["attention_backward_efficiency"] == pytest.approx(0.5)
    assert figures["attention_backward_score_s"] == pytest.approx(0.04e-12)
    for point, (_, forward, backward) in zip(points, timed):
        assert point["predicted_s"] == pytest.approx(forward - 2e-5)
        assert point["predicted_backward_s"] == pytest.approx(backward - 2e-4)
    spec = PRESETS["llama-1b"]
    profile = replace(H100, **figures)
    times = layer_times(spec, profile, Layout(), 1, "bf16", STACKS["plait"])
    matmul = attention_matmul_seconds(profile, "bf16", Gemm(8192, 8192, 64, 32), flash=True)
    assert times.attention_backward == pytest.approx(matmul / 0.5 + 32 * 8192 * 8192 * 0.04e-12)


def test_a_gpus_host_time_is_taken_whole_and_predicted_where_it_exceeds_the_kernels():
    """At the probe's size a GPU's kernels take microseconds and its host milliseconds a layer: the
    measured per-layer time is the host's, all of it (the kernels ran under it), and the planner's
    layer, the longer of kernels and host, gives it back."""
    host_forward, host_backward = 1.5e-3, 2.0e-3
    t = {}
    for n in PROBE_LAYERS:
        t[f"forward{n}"] = n * host_forward + 4e-4
        t[f"both{n}"] = n * (host_forward + host_backward) + 1.2e-3
    host = fit_host_overhead(t, *host_probe_kernels(H100, "llama", "bf16"))
    assert (host.layer_forward, host.layer_backward) == pytest.approx((host_forward, host_backward))
    profile = replace(H100, host_overhead={"llama": host})
    times = layer_times(probe_spec("llama", 1), profile, Layout(), 1, "bf16", STACKS["plait"])
    assert (times.forward, times.backward_input) == pytest.approx((host_forward, host_backward))


def test_timing_waits_for_a_device_that_runs_behind_its_host():
    """A device that does the queued work only when synchronised (as a GPU's host queues kernels): each
    call's time is the device's, and the host never queues more than the device has done."""
    queued, longest = [], [0]

    def synchronize() -> None:
        longest[0] = max(longest[0], len(queued))
        time.sleep(0.001 * len(queued))
        queued.clear()

    medians = interleaved_medians({"kernel": lambda: queued.append(1)}, rounds=3, min_time=0.02, synchronize=synchronize)
    assert medians["kernel"] >= 0.001
    assert longest[0] <= 16


def test_a_device_calibration_writes_a_profile_the_planner_reads_back(tmp_path):
    """The whole single-device path on this CPU at small sizes: every figure is measured, the fits'
    points are the measurements, and the profile round-trips through its file."""
    sizes = ProbeSizes(working_shape={"hidden": 64, "heads": 2, "vocab": 32, "seq_len": 32}, working_micro_batch=1,
                       optimizer_sets={"small": [(32, 32)] * 4, "large": [(128, 128)] * 2, "mixed": [(64, 64)] * 3},
                       block_shapes=((2, 128, 128, 16, False), (2, 128, 128, 16, True), (2, 256, 128, 32, False)))
    shapes = KernelShapes([(128, 128, 128), (256, 128, 64), (64, 64, 64)], [(2, 64, 16), (2, 128, 16), (4, 64, 32)],
                          2**12, 64)
    profile, fits = measure_device(H100, "probe", "fp32", sizes, shapes)
    assert profile.name == "probe" and profile.matmul_efficiency > 0 and profile.attention_backward_efficiency > 0
    assert set(profile.layer_kernel_scale) == set(profile.host_overhead) == {"gpt2", "llama"}
    assert len(fits["matmul"]) == 3 and len(fits["attention"]) == 3 and len(fits["working_layers"]) == 8
    # plait's blockwise attention: each scale is the median of its points' measured over modelled
    blocks = fits["blockwise_attention"]
    assert len(blocks) == 3 and all(p["forward_s"] > 0 and p["backward_s"] > 0 for p in blocks)
    assert profile.block_attention_scale == statistics.median(p["forward_s"] / p["modelled_forward_s"] for p in blocks)
    assert profile.block_attention_backward_scale == statistics.median(p["backward_s"] / p["modelled_backward_s"]
                                                                       for p in blocks)
    # and block size by block size: the causal and the full 2 × 128 × 128 block share one point
    small, large = profile.block_attention_points
    assert small[0] == 2 * 128 * 128 and large[0] == 2 * 256 * 128
    assert small[1] == statistics.median(p["forward_s"] / p["modelled_forward_s"] for p in blocks[:2])
    assert large[2] == blocks[2]["backward_s"] / blocks[2]["modelled_backward_s"]
    path = tmp_path / "profile.json"
    save_profile(profile, path)
    assert load_profile(path) == profile
    assert json.loads(path.read_text())["attention_backward_efficiency"] == profile.attention_backward_efficiency


def test_calibrating_a_gpu_where_torch_sees_none_says_so(tmp_path, monkeypatch):
    from plait.calibrate.gpu import calibrate_gpu
    from plait.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs a GPU, and torch sees none"):
        calibrate_gpu(tmp_path / "p.json", "x", "bf16")
    assert not (tmp_path / "p.json").exists()


def test_a_matmul_fit_swamped_by_its_launch_keeps_a_positive_efficiency():
    """Tiny matmuls timed on a busy host can take longer for less work, which a slope plus a launch
    would fit as a negative efficiency: the fit then takes the matmuls alone, with no launch."""
    shapes = [(64, 64, 64), (128, 128, 128), (256, 128, 64)]
    efficiency, launch = fit_matmul_efficiency(H100, "fp32", list(zip(shapes, [3e-5, 2e-5, 2.5e-5])))
    assert efficiency > 0 and launch == 0.0
    at_peak = replace(H100, matmul_efficiency=1.0)
    growing = [((m, n, k), 2.0 * m * n * k / matmul_rate(at_peak, "fp32", m, n) / 0.5 + 1e-5) for m, n, k in shapes]
    efficiency, launch = fit_matmul_efficiency(H100, "fp32", growing)  # a clean slope: half the fp32 peak, 10 µs
    assert efficiency == pytest.approx(0.5, rel=1e-6) and launch == pytest.approx(1e-5, rel=1e-6)
