"""Measure this machine into a hardware profile that ``plan`` and ``simulate`` accept.

Imports torch (outside the planner's torch-free path; only ``plait calibrate`` loads it). On a CPU
one "device" is one training rank: ``threads`` cores (plait train gives each of N local ranks
cores/N threads). Everything is measured on two local ranks at once, each timing its own probes
while the other works, as two training ranks share caches, memory bandwidth and the host:

* matmul throughput by shape, fitted to t = 2mnk/peak + overhead by least relative squares (so
  matmul_efficiency is 1 and tiles are 1);
* the bandwidth a layer's non-matmul kernels reach (add, multiply, layer norm; and apart, GELU and
  SiLU, whose transcendentals make them slower on a CPU);
* causal attention against the two matmuls of its shapes, plus a cost per score (a CPU pays for
  every exponential), and its backward's time as a multiple of its forward's; and plait's own
  blockwise attention (its ring's and all-gather's) against the planner's model of it;
* all-reduce time over the two ranks, fitted to t = 2α + S/β (the two-rank ring of
  plait.plan.comm); reduce-scatter and all-gather time as multiples of that ring's one pass
  (gloo's are not rings); and the share of an all-reduce that hides under compute;
* the host's overhead beyond the kernels, plait's optimizer step, what a whole layer's kernels
  take beyond the sum of their microbenchmarks, and what each parallel wrapper adds
  (plait.calibrate.host).

Each fit's points, measured and predicted, are written beside the profile.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from plait.calibrate.host import (
    CPU_SIZES, ProbeSizes, interleaved_medians, layer_kernel_scales, measure_host_overhead, measure_optimizer,
    measure_wrapper_overhead, working_layer_probes,
)
from plait.parallel.data_parallel.gradient_shards import all_gather_single, reduce_scatter_single
from plait.parallel.ring_attention import block_attention, block_gradients
from plait.plan.comm import LINK_EFFICIENCY, Link, all_gather_seconds, all_reduce_seconds, reduce_scatter_seconds
from plait.plan.compute import Gemm, attention_matmul_seconds, block_kernel_seconds, gemm_seconds
from plait.hardware import CollectiveScale, Hardware, save_profile
from plait.plan.least_squares import relative_least_squares

SHAPES = [(64, 64, 64), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 512, 512),
          (1024, 128, 1024), (1024, 1024, 128), (4096, 128, 128), (512, 2048, 512), (8, 8, 8)]
SIZES = [2**k for k in range(10, 26, 3)]  # bytes per all-reduce: 1 KiB … 32 MiB
OVERLAP_BYTES = 4 * 2**20  # a few gradient buckets' worth of a small model


def _typical_time(fn, sizes: ProbeSizes = CPU_SIZES) -> float:
    """Median seconds per call over 7 timed batches of at least 50 ms: on a shared machine the
    typical time, not the luckiest, is what a training step will see."""
    return sizes.medians({"probe": fn}, rounds=7, min_time=0.05)["probe"]


def measure_matmuls_and_layers(dtype: torch.dtype, precision: str) -> tuple[list[tuple[tuple[int, int, int], float]], dict[str, float]]:
    """Seconds of each matmul of SHAPES, and of plait's layers at a working size
    (plait.calibrate.host.working_layer_probes), timed in one interleaved pass."""
    probes: dict = {}
    for m, n, k in SHAPES:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        probes[m, n, k] = lambda a=a, b=b: torch.matmul(a, b)
    layers = working_layer_probes(precision)
    times = interleaved_medians({**probes, **layers}, rounds=7, min_time=0.05)
    return [(shape, times[shape]) for shape in SHAPES], {key: times[key] for key in layers}


def measure_elementwise_gbps(dtype: torch.dtype, sizes: ProbeSizes = CPU_SIZES, n: int = 2**20,
                             width: int = 256) -> tuple[float, float]:
    """Bytes per second of a layer's non-matmul kernels, as (median over an add, a multiply and
    a layer norm; median over GELU forward and backward and SiLU), counting reads and writes, on
    tensors of ``n`` elements (rows of ``width`` for the norm)."""
    a, b = (torch.randn(n, dtype=dtype, device=sizes.device) for _ in range(2))
    rows = a.view(-1, width)
    weight, bias = torch.ones(width, dtype=dtype, device=sizes.device), torch.zeros(width, dtype=dtype, device=sizes.device)
    size = a.numel() * a.element_size()
    simple = [  # (tensor passes read + written, kernel)
        (3, lambda: torch.add(a, b)),
        (3, lambda: torch.mul(a, b)),
        (2, lambda: torch.nn.functional.layer_norm(rows, (width,), weight, bias)),
    ]
    activations = [
        (2, lambda: torch.nn.functional.gelu(a, approximate="tanh")),
        (3, lambda: torch.ops.aten.gelu_backward(a, b, approximate="tanh")),
        (2, lambda: torch.nn.functional.silu(a)),
    ]
    return tuple(statistics.median(passes * size / _typical_time(fn, sizes) / 1e9 for passes, fn in kernels)
                 for kernels in (simple, activations))


ATTENTION_SHAPES = [(16, 64, 32), (16, 128, 32), (64, 128, 32), (16, 128, 64), (8, 256, 64), (4, 512, 64),
                    (2, 1024, 64), (8, 256, 128)]  # (batch·heads, sequence, head dim)


def time_attention(dtype: torch.dtype, sizes: ProbeSizes, shapes: list[tuple[int, int, int]]) -> list[tuple[tuple[int, int, int], float, float]]:
    """(shape, forward seconds, backward seconds) of causal scaled-dot-product attention over
    ``shapes`` (batch·heads, sequence, head dim); the backward as training runs it, from a given
    output gradient into fresh input gradients."""
    probes = {}
    for shape in shapes:
        batch_heads, seq, dim = shape
        q, k, v = (torch.randn(1, batch_heads, seq, dim, dtype=dtype, device=sizes.device, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(1, batch_heads, seq, dim, dtype=dtype, device=sizes.device)

        def forward(q=q, k=k, v=v) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        probes[shape, "forward"] = forward
        probes[shape, "both"] = lambda forward=forward, q=q, k=k, v=v, grad=grad: torch.autograd.grad(forward(), (q, k, v), grad)
    times = sizes.medians(probes, rounds=5)
    return [(shape, times[shape, "forward"], times[shape, "both"] - times[shape, "forward"]) for shape in shapes]


def probe_attention_seconds(profile: Hardware, precision: str, shape: tuple[int, int, int]) -> float:
    """Attention's two matmuls over the full square of a probe's shape, at ``profile``'s rate, as
    plait's layers (a flash kernel) are modelled."""
    batch_heads, seq, dim = shape
    return attention_matmul_seconds(profile, precision, Gemm(seq, seq, dim, batch_heads), flash=True)


def measure_attention(dtype: torch.dtype, profile: Hardware, precision: str) -> tuple[float, float, float, list[dict]]:
    """Causal scaled-dot-product attention, forward and backward, over ``ATTENTION_SHAPES``, fitted
    to t = (its two matmuls at ``profile``'s rate)/efficiency + scores·seconds per score. Returns
    (efficiency, seconds per score, the backward's matmuls against the forward's, the points)."""
    timed = time_attention(dtype, CPU_SIZES, ATTENTION_SHAPES)
    matmuls = [probe_attention_seconds(profile, precision, shape) for shape, _, _ in timed]
    scores = [float(batch_heads * seq * seq) for (batch_heads, seq, _), _, _ in timed]
    forward_s = [forward for _, forward, _ in timed]
    inverse, per_score = relative_least_squares(list(zip(matmuls, scores)), forward_s)
    if per_score < 0 or inverse <= 0:  # the softmax costs nothing measurable: efficiency alone
        inverse, per_score = statistics.median(t / m for t, m in zip(forward_s, matmuls)), 0.0
    # (the backward's matmuls against the forward's; its exponentials cost what the forward's do)
    ratio = statistics.median((backward - n * per_score) / (m * inverse)
                              for (_, _, backward), m, n in zip(timed, matmuls, scores))
    points = [{"shape": shape, "forward_s": forward, "predicted_s": m * inverse + n * per_score, "backward_s": backward}
              for (shape, forward, backward), m, n in zip(timed, matmuls, scores)]
    return 1 / inverse, per_score, ratio, points


def measure_block_attention(dtype: torch.dtype, sizes: ProbeSizes, profile: Hardware, precision: str) -> list[dict]:
    """plait's blockwise attention (plait.parallel.ring_attention's kernels), forward and backward,
    over ``sizes.block_shapes``: each shape's times beside the planner's model of it at ``profile``'s
    rates."""
    probes = {}
    for shape in sizes.block_shapes:
        heads, rows, keys, dim, causal = shape
        q = torch.randn(1, 1, heads, rows, dim, dtype=dtype, device=sizes.device)
        k, v = (torch.randn(1, 1, 1, keys, dim, dtype=dtype, device=sizes.device) for _ in range(2))
        grad, delta = torch.randn_like(q), torch.randn(1, 1, heads, rows, device=sizes.device)
        lse = block_attention(q, k, v, causal, dim ** -0.5)[1]
        probes[shape, "forward"] = lambda q=q, k=k, v=v, causal=causal: block_attention(q, k, v, causal, q.shape[-1] ** -0.5)
        probes[shape, "backward"] = lambda q=q, k=k, v=v, grad=grad, lse=lse, delta=delta, causal=causal: \
            block_gradients(q, k, v, grad, lse, delta, causal, q.shape[-1] ** -0.5)
    times = sizes.medians(probes, rounds=5)
    points = []
    for shape in sizes.block_shapes:
        heads, rows, keys, dim, causal = shape
        forward, backward = block_kernel_seconds(profile, precision, heads, rows, keys, dim, heads * rows * keys * causal)
        points.append({"shape": shape, "forward_s": times[shape, "forward"], "modelled_forward_s": forward,
                       "backward_s": times[shape, "backward"], "modelled_backward_s": backward})
    return points


def _scales(points: list[dict]) -> tuple[float, float]:
    """Median measured over modelled, forward and backward."""
    return (statistics.median(p["forward_s"] / p["modelled_forward_s"] for p in points),
            statistics.median(p["backward_s"] / p["modelled_backward_s"] for p in points))


def block_attention_fields(points: list[dict]) -> dict:
    """The profile's blockwise-attention figures from ``measure_block_attention``'s points: the median
    scales over every shape (``Hardware.block_attention_scale``, ``..._backward_scale``) and, per size
    timed, (scores in the block, forward scale, backward scale), fewest scores first, the blocks of one
    size (a causal one and a full one) giving their median (``Hardware.block_attention_points``)."""
    by_size: dict[int, list[dict]] = {}
    for point in points:
        heads, rows, keys, _, _ = point["shape"]
        by_size.setdefault(heads * rows * keys, []).append(point)
    forward, backward = _scales(points)
    return {"block_attention_scale": forward, "block_attention_backward_scale": backward,
            "block_attention_points": tuple((float(scores), *_scales(group)) for scores, group in sorted(by_size.items()))}


def _two_rank_worker(rank: int, port: int, threads: int, results, job, *args) -> None:
    """Run ``job(*args)`` on this rank of a two-rank gloo group; rank 0 keeps what it returns."""
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        outcome = job(*args)
        if rank == 0:
            results["outcome"] = outcome
    finally:
        dist.destroy_process_group()


def measure_collectives() -> tuple[dict[str, dict[int, float]], float]:
    """Two-rank seconds by buffer size of an all-reduce, a reduce-scatter of the buffer and an
    all-gather into it, and the share of an all-reduce that hides under compute."""
    times: dict[str, dict[int, float]] = {"all_reduce": {}, "reduce_scatter": {}, "all_gather": {}}
    for size in SIZES:
        whole, half = torch.ones(size // 4), torch.ones(size // 8)
        calls = {
            "all_reduce": lambda: dist.all_reduce(whole),
            "reduce_scatter": lambda: reduce_scatter_single(half, whole),
            "all_gather": lambda: all_gather_single(whole, half),
        }
        count = max(5, min(200, 2**24 // size))  # the same on both ranks: collectives must match
        for kind, call in calls.items():
            runs = []
            for _ in range(4):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(count):
                    call()
                runs.append((time.perf_counter() - start) / count)
            times[kind][size] = statistics.median(runs[1:])
    return times, _measure_overlap()


def _measure_overlap(rounds: int = 5) -> float:
    """Share of a bucket-sized all-reduce that hides under matmuls run while it is in flight, as
    DDP runs gradient buckets under the backward pass (run by both ranks alike)."""
    tensor, a = torch.ones(OVERLAP_BYTES // 4), torch.randn(384, 384)

    def compute() -> None:
        for _ in range(8):
            torch.matmul(a, a)

    def both() -> None:
        work = dist.all_reduce(tensor, async_op=True)
        compute()
        work.wait()

    def timed(fn) -> float:
        dist.barrier()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    shares = []
    for _ in range(rounds):
        alone, comm, together = timed(compute), timed(lambda: dist.all_reduce(tensor)), timed(both)
        shares.append((alone + comm - together) / min(alone, comm))
    return min(1.0, max(0.0, statistics.median(shares)))


def _on_two_ranks(threads: int, job, *args):
    """What ``job(*args)`` returns on rank 0 of two local processes of ``threads`` threads each."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_two_rank_worker, args=(port, threads, results, job, *args), nprocs=2, join=True)
        return results["outcome"]


def fit_link(times: dict[int, float]) -> tuple[float, float]:
    """(latency α, bandwidth β) from two-rank all-reduce times t = 2α + S/β."""
    latency, inverse = relative_least_squares([(2.0, float(s)) for s in times], list(times.values()))
    return max(latency, 1e-7), 1 / inverse


def fit_ring_scale(times: dict[int, float], link: Link) -> CollectiveScale:
    """Factors on one two-rank ring pass's latency and bandwidth terms that fit a reduce-scatter's
    or all-gather's measured seconds by buffer size (least relative squares)."""
    latency, bandwidth = relative_least_squares([(link.latency, s / 2 / link.bandwidth) for s in times], list(times.values()))
    return CollectiveScale(max(latency, 0.0), max(bandwidth, 0.0))


def fit_matmul(matmuls: list[tuple[tuple[int, int, int], float]]) -> tuple[float, float]:
    """(peak FLOP/s, launch overhead s) from matmul times t = 2mnk/peak + overhead."""
    inverse, overhead = relative_least_squares([(2.0 * m * n * k, 1.0) for (m, n, k), _ in matmuls], [t for _, t in matmuls])
    return 1 / inverse, max(overhead, 0.0)


def _calibration_job(name: str, precision: str, threads: int) -> tuple[Hardware, dict]:
    """Every measurement, on both ranks of a two-rank group at once: rank 0's readings are a
    device's while its neighbour works, as in training (alone, a core here read matmuls up to 10%
    faster and up to 1.8× the memory bandwidth)."""
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    matmuls, working_layers = measure_matmuls_and_layers(dtype, precision)
    peak, overhead = fit_matmul(matmuls)
    dist.barrier()  # each phase starts together, so the ranks' probes overlap like for like
    memory_gbps, activation_gbps = measure_elementwise_gbps(dtype)
    dist.barrier()
    collectives, overlap = measure_collectives()
    latency, bandwidth = fit_link(collectives["all_reduce"])
    link = Link(bandwidth, latency, False)
    total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    profile = Hardware(
        name=name, bf16_tflops=peak / 1e12, fp32_tflops=peak / 1e12, memory_bytes=total_memory / 2,
        memory_gbps=memory_gbps, activation_gbps=activation_gbps,
        intra_node_gbps=bandwidth / 1e9 / LINK_EFFICIENCY, inter_node_gbps=bandwidth / 1e9 / LINK_EFFICIENCY,
        gpus_per_node=2, intra_node_latency_s=latency, inter_node_latency_s=latency,
        matmul_efficiency=1.0, kernel_overhead_s=overhead, matmul_tile=1, reserved_bytes=0.3e9,
        comm_overlap=overlap, host_runs_ahead=False,
        reduce_scatter_scale=fit_ring_scale(collectives["reduce_scatter"], link),
        all_gather_scale=fit_ring_scale(collectives["all_gather"], link),
    )
    efficiency, per_score, backward_ratio, attention_points = measure_attention(dtype, profile, precision)
    profile = replace(profile, attention_efficiency=efficiency, attention_score_s=per_score,
                      attention_backward_ratio=backward_ratio)
    block_points = measure_block_attention(dtype, CPU_SIZES, profile, precision)
    profile = replace(profile, **block_attention_fields(block_points))
    dist.barrier()
    per_parameter, per_tensor, optimizer_points = measure_optimizer()
    profile = replace(profile, optimizer_parameter_s=per_parameter, optimizer_tensor_s=per_tensor)
    dist.barrier()
    profile = replace(profile, host_overhead=measure_host_overhead(profile, precision))
    dist.barrier()
    profile = replace(profile, layer_kernel_scale=layer_kernel_scales(working_layers, profile, precision))
    profile = replace(profile, host_overhead={**profile.host_overhead, **measure_wrapper_overhead(profile, precision)})
    link = replace(link, reduce_scatter_scale=profile.reduce_scatter_scale, all_gather_scale=profile.all_gather_scale)
    predictors = {"all_reduce": all_reduce_seconds, "reduce_scatter": reduce_scatter_seconds, "all_gather": all_gather_seconds}
    fits = {
        "threads_per_device": threads,
        "optimizer": optimizer_points,
        "attention": attention_points,
        "blockwise_attention": block_points,
        "matmul": [{"shape": s, "measured_s": t, "predicted_s": gemm_seconds(profile, precision, Gemm(*s))} for s, t in matmuls],
        **{kind: [{"bytes": s, "measured_s": t, "predicted_s": predictors[kind](s, 2, link)} for s, t in times.items()]
           for kind, times in collectives.items()},
    }
    return profile, fits


def calibrate(out: str | Path, name: str = "this-machine", precision: str = "fp32", threads: int | None = None) -> Hardware:
    """Measure, fit, write the profile (with each fit's errors) to ``out`` and return it."""
    threads = threads or max(1, (os.cpu_count() or 2) // 2)
    profile, fits = _on_two_ranks(threads, _calibration_job, name, precision, threads)
    save_profile(profile, out, fits)
    return profile
