"""Measure one GPU into a hardware profile: plait's own kernels on it, the catalog's links.

``plait calibrate --device cuda`` times, on the first GPU, what the planner's compute model
(plait.plan.compute) is made of, at the sizes training runs them:

* a transformer layer's matmuls (as ``F.linear`` runs them), fitted to
  t = 2mnk/(peak·efficiency·tile fill) + launch, with the catalog's peak and tile: the efficiency
  the matmul library reaches here;
* the bandwidth of elementwise kernels and of activation functions;
* causal scaled-dot-product attention against its two matmuls plus a cost per score (the
  exponentials, which run on special-function units far slower than the tensor cores), and its
  backward against its forward;
* plait's clipping and AdamW step; the host's time per layer where kernels take microseconds (a
  GPU's host runs ahead, so it shows only where it exceeds the kernels'); and plait's whole model
  at a working size against the sum of its kernels (the layer kernel scale: autocast's casts,
  fp32 gradient accumulation, and the kernels the microbenchmarks leave out).

One GPU cannot measure its links, so NVLink, the network, their latencies and the memory size
come from the catalog entry the driver's device name gives (plait.hardware.catalog_name_of).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from plait.calibrate.host import (
    ProbeSizes, layer_kernel_scales, measure_host_overhead, measure_optimizer, working_layer_probes,
)
from plait.calibrate.machine import (
    block_attention_fields,
    measure_block_attention,
    measure_elementwise_gbps,
    probe_attention_seconds,
    time_attention,
)
from plait.errors import ConfigError
from plait.plan.compute import Gemm, gemm_seconds, matmul_rate
from plait.hardware import Hardware, catalog_name_of, hardware, save_profile
from plait.plan.least_squares import relative_least_squares

# (tokens, output features, input features): the layers of 1B-70B models at micro-batch × sequence
# tokens of 4k-16k, their MLP and attention projections, a vocabulary head, and square sizes.
GPU_MATMULS = [(8192, 3072, 2048), (8192, 2048, 2048), (8192, 16384, 2048), (8192, 2048, 8192),
               (16384, 6144, 4096), (16384, 4096, 4096), (16384, 28672, 4096), (16384, 4096, 14336),
               (8192, 32000, 4096), (4096, 4096, 4096), (2048, 2048, 2048), (1024, 1024, 1024)]
# (batch·heads, sequence, head dim): head dims of 64 and 128 from 1k to 8k tokens.
GPU_ATTENTION = [(32, 1024, 128), (32, 2048, 64), (32, 2048, 128), (32, 4096, 64), (32, 4096, 128),
                 (32, 8192, 64), (32, 8192, 128), (64, 4096, 128)]
# The working layers must keep the device busier than the host, whose Python and dispatch take
# 1.4–1.6 ms a forward of plait's Llama layer on an H100's host: layers of 2,048 × 2,048 tokens at
# micro-batch 2 (4k tokens) took that long, so their fitted scale was the host's time, not the
# kernels'. At 4,096 wide over 4k tokens a layer's forward kernels take about 3 ms.
GPU_SIZES = ProbeSizes(
    device=torch.device("cuda"),
    working_shape={"hidden": 4096, "heads": 32, "vocab": 2048, "seq_len": 4096},
    working_micro_batch=1,
    # score blocks of a ring step at 8k-32k tokens: milliseconds each on an H100
    block_shapes=((16, 2048, 2048, 64, False), (16, 2048, 2048, 64, True), (16, 4096, 4096, 128, False)),
    optimizer_sets={
        "many small": [(256, 256)] * 96 + [(256,)] * 96,
        "few large": [(4096, 4096)] * 4 + [(4096,)] * 4,
        "mixed": [(2048, 2048)] * 16 + [(2048,)] * 16,
    },
)


@dataclass(frozen=True)
class KernelShapes:
    """The sizes at which ``measure_device`` times the device's own kernels: its ``matmuls``
    (tokens, output features, input features), its fused ``attention`` (batch·heads, sequence, head
    dim), and the ``elementwise_elements`` and a norm's ``norm_width`` of its elementwise passes."""

    matmuls: list[tuple[int, int, int]]
    attention: list[tuple[int, int, int]]
    elementwise_elements: int
    norm_width: int


GPU_KERNEL_SHAPES = KernelShapes(GPU_MATMULS, GPU_ATTENTION, 2**26, 2048)


def fit_matmul_efficiency(base: Hardware, precision: str, matmuls: list[tuple[tuple[int, int, int], float]]) -> tuple[float, float]:
    """(efficiency, launch seconds) from matmul times t = 2mnk/(peak·efficiency·tile fill) + launch,
    the catalog's peak and tile kept (least relative squares)."""
    at_peak = replace(base, matmul_efficiency=1.0)
    at_peak_s = [2.0 * m * n * k / matmul_rate(at_peak, precision, m, n) for (m, n, k), _ in matmuls]
    times = [t for _, t in matmuls]
    inverse, launch = relative_least_squares([(s, 1.0) for s in at_peak_s], times)
    if inverse <= 0:  # the launch swamped the slope (small matmuls on a busy host): the matmuls alone
        (inverse,), launch = relative_least_squares([(s,) for s in at_peak_s], times), 0.0
    return 1 / inverse, max(launch, 0.0)


def fit_attention(timed: list[tuple[tuple[int, int, int], float, float]], profile: Hardware,
                  precision: str) -> tuple[dict[str, float], list[dict]]:
    """Hardware's attention figures from timed (shape, forward s, backward s): the forward and the
    backward each fitted to t = (the two matmuls at ``profile``'s rate)/efficiency + scores·seconds
    per score + a per-call constant. The constant (what a short kernel loses to its first and last
    waves, beyond the launch the matmul time holds) is fitted only so that it does not bend the
    other two, and is not charged: a layer's kernels are long."""
    matmuls = [probe_attention_seconds(profile, precision, shape) for shape, _, _ in timed]
    scores = [float(batch_heads * seq * seq) for (batch_heads, seq, _), _, _ in timed]
    fitted = []
    for times in ([forward for _, forward, _ in timed], [backward for _, _, backward in timed]):
        inverse, per_score, _ = relative_least_squares([(m, n, 1.0) for m, n in zip(matmuls, scores)], times)
        if per_score < 0 or inverse <= 0:  # no cost per score shows: the matmuls alone
            (inverse, _), per_score = relative_least_squares([(m, 1.0) for m in matmuls], times), 0.0
        if inverse <= 0:  # nor a slope over the per-call constant (tiny probes on a busy host)
            (inverse,) = relative_least_squares([(m,) for m in matmuls], times)
        fitted.append((1 / inverse, per_score))
    (efficiency, per_score), (backward_efficiency, backward_per_score) = fitted
    # (the ratio, which the backward's own fit supersedes, as a CPU calibration reads it)
    ratio = statistics.median((backward - n * per_score) * efficiency / m
                              for (_, _, backward), m, n in zip(timed, matmuls, scores))
    figures = {"attention_efficiency": efficiency, "attention_score_s": per_score,
               "attention_backward_efficiency": backward_efficiency, "attention_backward_score_s": backward_per_score,
               "attention_backward_ratio": ratio}
    points = [{"shape": shape, "forward_s": forward, "predicted_s": m / efficiency + n * per_score,
               "backward_s": backward, "predicted_backward_s": m / backward_efficiency + n * backward_per_score}
              for (shape, forward, backward), m, n in zip(timed, matmuls, scores)]
    return figures, points


def measure_device(base: Hardware, name: str, precision: str, sizes: ProbeSizes,
                   shapes: KernelShapes) -> tuple[Hardware, dict]:
    """``base`` with every compute figure measured on ``sizes.device`` (its kernels at ``shapes``),
    and each fit's points."""
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    probes = {}
    for m, n, k in shapes.matmuls:
        x, w = (torch.randn(rows, k, dtype=dtype, device=sizes.device) for rows in (m, n))
        probes[m, n, k] = lambda x=x, w=w: F.linear(x, w)
    layers = working_layer_probes(precision, sizes)
    times = sizes.medians({**probes, **layers}, rounds=7, min_time=0.05)  # one pass: the same minute for both
    working = {key: times[key] for key in layers}
    del probes, layers  # (their tensors and four models: 15 GB at a GPU's sizes)
    if sizes.device.type == "cuda":
        torch.cuda.empty_cache()
    matmuls = [(shape, times[shape]) for shape in shapes.matmuls]
    efficiency, launch = fit_matmul_efficiency(base, precision, matmuls)
    memory_gbps, activation_gbps = measure_elementwise_gbps(dtype, sizes, shapes.elementwise_elements, shapes.norm_width)
    profile = replace(base, name=name, matmul_efficiency=efficiency, kernel_overhead_s=launch, memory_gbps=memory_gbps,
                      activation_gbps=activation_gbps, host_overhead={}, layer_kernel_scale={})
    attention, attention_points = fit_attention(time_attention(dtype, sizes, shapes.attention), profile, precision)
    block_points = measure_block_attention(dtype, sizes, profile, precision)
    per_parameter, per_tensor, optimizer_points = measure_optimizer(sizes)
    profile = replace(profile, **attention, **block_attention_fields(block_points), optimizer_parameter_s=per_parameter,
                      optimizer_tensor_s=per_tensor)
    profile = replace(profile, host_overhead=measure_host_overhead(profile, precision, sizes))
    profile = replace(profile, layer_kernel_scale=layer_kernel_scales(working, profile, precision, sizes))
    fits = {
        "device": str(sizes.device),
        "working_layers": working,
        "matmul": [{"shape": s, "measured_s": t, "predicted_s": gemm_seconds(profile, precision, Gemm(*s))} for s, t in matmuls],
        "attention": attention_points,
        "blockwise_attention": block_points,
        "optimizer": optimizer_points,
    }
    return profile, fits


def calibrate_gpu(out: str | Path, name: str, precision: str) -> Hardware:
    """Measure the first GPU, write the profile (with each fit's points) to ``out`` and return it."""
    if not torch.cuda.is_available():
        raise ConfigError("--device cuda needs a GPU, and torch sees none here; calibrate the CPU with --device cpu")
    device_name = torch.cuda.get_device_name(0)
    entry = catalog_name_of(device_name)
    if entry is None:
        raise ConfigError(f"the catalog holds no entry for {device_name!r}, whose links and peak a GPU calibration "
                          "starts from; name a catalog GPU with `plait plan --gpu` instead")
    profile, fits = measure_device(hardware(entry), name, precision, GPU_SIZES, GPU_KERNEL_SHAPES)
    fits = {**fits, "device_name": device_name, "catalog_entry": entry}
    save_profile(profile, out, fits)
    return profile
