"""The accelerators the planner knows, each figure with its source, and measured profiles.

Units: TFLOP/s (10¹² FLOP/s), bytes, GB/s (10⁹ bytes per second, one direction), seconds.
``intra_node_gbps`` is what one device can send to its peers inside a node;
``inter_node_gbps`` is the network bandwidth one device has to other nodes (its share of the
node's NICs). Peaks are dense (no structured sparsity).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from plait.errors import ConfigError
from plait.facts.stack import Kernels
from plait.layout import no_bf16
from plait.paths import require_input_file

GB = 10**9
GIB = 2**30
# A GPU's memory is what the runtime lets a process allocate (torch.cuda.get_device_properties()
# .total_memory). NVIDIA's marketed size is, within about 1%, the GiB nvidia-smi shows (an A100 80GB:
# 81,920 MiB), of which CUDA leaves a process about 99%: PyTorch's out-of-memory reports read 79.25
# GiB on an A100 80GB and 79.1 on an H100 80GB. Every part takes the A100's share; ROCm leaves
# nearly all of an MI300X's 192 GiB, so it reads about 1% low.
ALLOCATABLE_SHARE = 79.25 / 80


def device_memory(marketed_size: float) -> float:
    """Bytes a process can allocate on a GPU sold with ``marketed_size`` GB (read as GiB)."""
    return marketed_size * GIB * ALLOCATABLE_SHARE


@dataclass(frozen=True)
class HostOverhead:
    """Host seconds that no kernel accounts for (Python, dispatcher, autograd): per transformer
    layer and micro-batch, once per model pass (embedding, head, loss), forward and backward; and
    once per step (a parallel wrapper's bookkeeping around the optimizer and gradients)."""

    layer_forward: float = 0.0
    layer_backward: float = 0.0
    model_forward: float = 0.0
    model_backward: float = 0.0
    step: float = 0.0


@dataclass(frozen=True)
class KernelScale:
    """How much longer a real layer's kernels take than the kernel model's microbenchmarks say,
    forward and backward: cache and memory traffic between a layer's kernels, and a neighbour
    rank's, that kernels timed one at a time on hot data do not meet."""

    forward: float = 1.0
    backward: float = 1.0


@dataclass(frozen=True)
class CollectiveScale:
    """A collective's time against one pass of the ring model (plait.plan.comm), as factors on the
    pass's latency term and on its bandwidth term."""

    latency: float = 1.0
    bandwidth: float = 1.0


@dataclass(frozen=True)
class Hardware:
    """One accelerator and the links around it."""

    name: str
    bf16_tflops: float
    fp32_tflops: float
    memory_bytes: float
    memory_gbps: float
    intra_node_gbps: float
    inter_node_gbps: float
    gpus_per_node: int = 8
    intra_node_latency_s: float = 5e-6
    inter_node_latency_s: float = 15e-6
    # The most bus bandwidth, GB/s, one communicator's rings reach across nodes, where NCCL was seen
    # to lay them over fewer adapters than the group has members in a node; None: each member's own
    # adapter carries its share (plait.plan.comm.network_bandwidth).
    inter_node_ring_gbps: float | None = None
    # Fraction of the peak a large, well-shaped matmul reaches: one constant, fitted to the forward
    # and backward of one 22B layer on A100s that Korthikanti et al. 2022 time under five settings
    # (table 4; benchmarks/validate_published.py --fit gives 0.656), and used for every catalog entry
    # and stack without its own (plait.facts.stack.Kernels.matmul_efficiency).
    matmul_efficiency: float = 0.656
    # Bytes per second of activation functions (GELU, SiLU); None: as memory_gbps (on GPUs they
    # are bandwidth-bound; on a CPU their transcendentals make them slower, so calibrate measures).
    activation_gbps: float | None = None
    # A flash attention kernel's two matmuls over the full score square against a plain matmul's
    # rate (1.0 in the catalog: FlashAttention-2 runs its causal half at about half a matmul's rate;
    # Hopper-native kernels, plait.facts.stack.HOPPER_CAUSAL_ATTENTION, and calibrate measure their own).
    attention_efficiency: float = 1.0
    # Seconds per attention score (of the full square) beyond the matmuls: the softmax's
    # exponentials, which a flash kernel runs on special-function units far slower than its tensor
    # cores (the catalog's from each GPU's throughput: causal_exponentials; a kernel that writes the
    # scores out is bound by those bytes instead). The backward runs its matmuls at this multiple of
    # the forward's time and its exponentials once more: 2.5 in the catalog, as its FLOPs are 2.5×
    # the forward's. A CPU's vector units pay for every exponential, so calibrate measures both.
    attention_score_s: float = 0.0
    attention_backward_ratio: float = 2.5
    # The backward's own fit, where calibrate measured one on a GPU: the forward's two full-square
    # matmuls' time over this factor (not the backward's own FLOPs, 2.5× those) plus this many
    # seconds per score. Measured so, its time against the forward's grows with the head dimension
    # (on an H100: 2.6× at 64, 3.4× at 128, 8k tokens), which one ratio cannot say. None: the
    # forward's matmuls times ``attention_backward_ratio``, plus the exponentials once more.
    attention_backward_efficiency: float | None = None
    attention_backward_score_s: float = 0.0
    # Bytes per second one device copies to or from host memory, each way, into pinned buffers (what
    # activation offload moves over). None: a CPU, whose host memory is its own: a copy reads and
    # writes it (``host_link_bytes_per_s``).
    host_link_gbps: float | None = None
    # Fixed cost of one kernel launch or collective call on the host side.
    kernel_overhead_s: float = 4e-6
    # Matmuls run in output tiles of this many rows and columns; ragged edges waste the rest.
    matmul_tile: int = 128
    # Memory a process holds before any tensor: runtime context, NCCL workspaces, allocator slack.
    reserved_bytes: float = 2 * GB
    # Share of device memory the planner leaves free beyond everything it counts. PyTorch's caching
    # allocator rounds every block up (to 512 bytes, and large ones into 2 MiB-aligned segments it
    # splits and caches), so on a long run the memory it reserves exceeds what tensors hold by a
    # few percent to over ten ("Memory management" in the torch.cuda documentation; the
    # `expandable_segments` option exists to cut this fragmentation). A plan at 85.0 of an A100
    # 80GB's 85.1 GB fails there, so at least 5% stays free; `--memory-headroom` changes it.
    memory_headroom: float = 0.05
    # Host overhead by model family ("gpt2"), and what each parallel wrapper adds to it
    # ("gpt2/tp"; styles in plait.plan.costs.parallel_styles). Empty in the catalog: a GPU's host
    # queues kernels ahead of the device (``host_runs_ahead``), which hides it. A CPU's host is its
    # device, so calibrate measures it with plait's own model and it adds to the kernels' time.
    host_overhead: dict[str, HostOverhead] = field(default_factory=dict, hash=False)
    host_runs_ahead: bool = True
    # Whether the part computes in bf16 natively. A V100's mixed precision is fp16, which plait does
    # not train in; the catalog's half-precision rate then models other stacks' fp16 runs.
    has_bf16: bool = True
    # plait's blockwise attention (its ring's and all-gather's) against the planner's model of it
    # (plait.plan.compute.block_kernel_seconds), forward and backward: 1 in the catalog; calibrate
    # times the kernel itself, whose score blocks may outgrow what the bandwidth probes measured.
    block_attention_scale: float = 1.0
    block_attention_backward_scale: float = 1.0
    # The same block by block where calibrate timed several: (scores in one block, forward scale,
    # backward scale), fewest scores first (``block_scales``). On this project's 2-core CPU a block of
    # 4M fp32 scores ran 1.91x the model forward where one of 1M ran 1.09x; the medians above hide
    # that, and apply only where this is empty.
    block_attention_points: tuple[tuple[float, float, float], ...] = ()
    # By model family: a whole layer's kernels against the sum of their microbenchmarks. Empty
    # (1) in the catalog, whose matmul efficiency is fitted to whole published runs; calibrate
    # times plait's own layers at a working size.
    layer_kernel_scale: dict[str, KernelScale] = field(default_factory=dict, hash=False)
    # Fraction of a collective that can run under compute: 1 where the device has engines of its
    # own for it (NCCL on a GPU); on a CPU gloo's threads take the cores compute needs, so
    # calibrate measures it.
    comm_overlap: float = 1.0
    # Reduce-scatter and all-gather against the ring model's one pass (half an all-reduce): 1 for
    # NCCL's rings. Gloo's are not rings (its reduce-scatter costs more than a whole all-reduce),
    # so calibrate measures both.
    reduce_scatter_scale: CollectiveScale = CollectiveScale()
    all_gather_scale: CollectiveScale = CollectiveScale()
    # Optimizer step (with gradient clipping) per local parameter and per parameter tensor;
    # None: Adam's bytes at memory bandwidth (plait.plan.compute), with no per-tensor cost as
    # multi-tensor kernels launch once for all tensors. Calibrate measures plait's optimizer.
    optimizer_parameter_s: float | None = None
    optimizer_tensor_s: float = 0.0

    @property
    def trains_bf16(self) -> bool:
        """Whether plait train takes bf16 here by default: a GPU that computes in it."""
        return self.host_runs_ahead and self.has_bf16

    def precision_problem(self, precision: str) -> str | None:
        """Why plait cannot train in ``precision`` here, if it cannot."""
        return no_bf16(self.name) if precision == "bf16" and not self.has_bf16 else None

    @property
    def usable_memory_bytes(self) -> float:
        """Device memory a plan may fill: all of it but the headroom."""
        return self.memory_bytes * (1 - self.memory_headroom)

    @property
    def host_link_bytes_per_s(self) -> float:
        return (self.host_link_gbps or self.memory_gbps / 2) * 1e9

    def peak_tflops(self, precision: str) -> float:
        return self.bf16_tflops if precision == "bf16" else self.fp32_tflops

    def block_scales(self, scores: float) -> tuple[float, float]:
        """(forward, backward) scale of plait's blockwise attention at blocks of ``scores`` scores: read
        between ``block_attention_points`` on a log scale of the scores, held at the ends; the
        medians without points."""
        points = self.block_attention_points
        if not points:
            return self.block_attention_scale, self.block_attention_backward_scale
        if scores <= points[0][0]:
            return points[0][1], points[0][2]
        for (low, *low_scales), (high, *high_scales) in zip(points, points[1:]):
            if scores <= high:
                weight = math.log(scores / low) / math.log(high / low)
                forward, backward = (a + weight * (b - a) for a, b in zip(low_scales, high_scales))
                return forward, backward
        return points[-1][1], points[-1][2]

    def to_dict(self) -> dict:
        return asdict(self)


def causal_exponentials(special_function_tflops: float) -> float:
    """``attention_score_s`` of a flash kernel's causal softmax: one exponential for each score of
    the square's lower half, on special-function units of this throughput (TFLOP/s)."""
    return 0.5 / (special_function_tflops * 1e12)


# A flash kernel's exponentials run on the special-function units, 16 per SM a clock on Volta,
# Ampere and Hopper (CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table), so
# SMs × 16 × clock: V100 80 SMs at 1.53 GHz → 1.96 TFLOP/s; A100 108 at 1.41 → 2.44; H100 SXM5 132
# (the 3.9 the FlashAttention-3 paper gives against its 989 of bf16 matmul, Shah et al. 2024, §1),
# the same die in the H800, H200 and Grand Teton's part; H100 PCIe 114 at 1.755 → 3.2; H100 NVL 132
# at 1.785 → 3.77. An H100 measured here fits 0.15e-12 s a score beside cuDNN's matmuls, against
# 0.128e-12 from 3.9 (docs/VALIDATION.md, "plait's own runs on one H100"). No figure is published
# for B200 and MI300X, whose scores cost nothing beyond their matmuls here.
# All NVIDIA server parts assume an 8-GPU HGX/DGX node with one network adapter per GPU.
# Each GPU reaches host memory over its own PCIe x16 link: 15.75 GB/s a direction raw on Gen3,
# 31.5 on Gen4, 63 on Gen5, of which pinned copies reach about 80% (CUDA's bandwidthTest on such
# servers reads 12, 25 and 50 GB/s): PCIE_GEN3, _GEN4, _GEN5.
PCIE_GEN3, PCIE_GEN4, PCIE_GEN5 = 12.0, 25.0, 50.0
CATALOG: dict[str, Hardware] = {
    # NVIDIA Tesla V100 datasheet (SXM2/SXM3): 125 TFLOPS on fp16 tensor cores (V100 has no bf16: its
    # mixed precision runs fp16, at the same rate), FP32 15.7 TFLOPS, 32 GB HBM2 at 900 GB/s; NVLink 2
    # 300 GB/s bidirectional = 150 per direction. Nodes as DGX-2H (Shoeybi et al. 2019, Megatron-LM):
    # 16 GPUs on NVSwitch, 8 × 100 Gb/s InfiniBand per node = 6.25 GB/s per GPU.
    "v100": Hardware("v100", 125, 15.7, device_memory(32), 900, 150, 6.25, gpus_per_node=16, host_link_gbps=PCIE_GEN3,
            attention_score_s=causal_exponentials(1.96), has_bf16=False),
    # NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense, FP32 19.5 TFLOPS,
    # 40 GB HBM2 at 1,555 GB/s; NVLink 3 600 GB/s bidirectional = 300 GB/s per direction.
    # DGX A100 user guide: 8× ConnectX-6 200 Gb/s HDR InfiniBand → 25 GB/s per GPU.
    "a100-40gb": Hardware("a100-40gb", 312, 19.5, device_memory(40), 1555, 300, 25, host_link_gbps=PCIE_GEN4,
            attention_score_s=causal_exponentials(2.44)),
    # Same datasheet, 80 GB HBM2e at 2,039 GB/s.
    "a100-80gb": Hardware("a100-80gb", 312, 19.5, device_memory(80), 2039, 300, 25, host_link_gbps=PCIE_GEN4,
            attention_score_s=causal_exponentials(2.44)),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 989 TFLOPS dense, FP32 67 TFLOPS,
    # 80 GB HBM3 at 3.35 TB/s; NVLink 4 900 GB/s bidirectional.
    # DGX H100: 8× ConnectX-7 400 Gb/s NDR → 50 GB/s per GPU.
    "h100-sxm": Hardware("h100-sxm", 989, 67, device_memory(80), 3350, 450, 50, host_link_gbps=PCIE_GEN5,
            attention_score_s=causal_exponentials(3.9)),
    # H100 datasheet (PCIe): BF16 756 TFLOPS dense, FP32 51 TFLOPS, 80 GB HBM2e at 2.0 TB/s;
    # no NVSwitch: peers talk over PCIe Gen5 x16, 64 GB/s per direction; one 400 Gb/s NIC per GPU.
    "h100-pcie": Hardware("h100-pcie", 756, 51, device_memory(80), 2000, 64, 50, host_link_gbps=PCIE_GEN5,
            attention_score_s=causal_exponentials(3.2)),
    # The H100 of Meta's Grand Teton hosts (torchtitan's benchmarks/llama3_h100_202412_torchtitan.md):
    # 96 GB HBM2e at 2.4 TB/s, 500 W; 8 per host on NVLink, 400 Gb/s RDMA per GPU. Its sustained peak
    # lies between the NVL's and the SXM's (the same note); the SXM's nominal figures stand here, as
    # torchtitan's MFU takes them, and a stack's efficiency fitted on this part absorbs the cap.
    "h100-96gb": Hardware("h100-96gb", 989, 67, device_memory(96), 2400, 450, 50, host_link_gbps=PCIE_GEN5,
            attention_score_s=causal_exponentials(3.9)),
    # NVIDIA H100 NVL (H100 datasheet, NVL column): BF16 1,671 TFLOPS with sparsity (835.5 dense),
    # FP32 60 TFLOPS, 94 GB HBM3 at 3.9 TB/s; NVLink bridges join pairs of GPUs only (600 GB/s
    # bidirectional), so groups of more than two talk over PCIe Gen5 x16, 64 GB/s per direction (for a
    # tp2 group on a bridged pair pass --intra-node-gbps 300); one 400 Gb/s NIC per GPU.
    "h100-nvl": Hardware("h100-nvl", 835.5, 60, device_memory(94), 3900, 64, 50, host_link_gbps=PCIE_GEN5,
            attention_score_s=causal_exponentials(3.77)),
    # NVIDIA H800 SXM5 (the export part of H100 SXM5): the same tensor cores and HBM3 (BF16 989 TFLOPS
    # dense, FP32 67, 80 GB at 3.35 TB/s), NVLink cut to 400 GB/s bidirectional = 200 per direction;
    # 8 × 400 Gb/s NDR per node as in DGX H100.
    "h800": Hardware("h800", 989, 67, device_memory(80), 3350, 200, 50, host_link_gbps=PCIE_GEN5,
            attention_score_s=causal_exponentials(3.9)),
    # NVIDIA H200 datasheet (SXM): BF16 989 TFLOPS dense, FP32 67 TFLOPS, 141 GB HBM3e at
    # 4.8 TB/s, NVLink 900 GB/s bidirectional; HGX H200 with 400 Gb/s per GPU.
    "h200": Hardware("h200", 989, 67, device_memory(141), 4800, 450, 50, host_link_gbps=PCIE_GEN5,
            attention_score_s=causal_exponentials(3.9)),
    # NVIDIA HGX B200 datasheet: per GPU BF16 2.25 PFLOPS dense, FP32 75 TFLOPS (600 per 8 GPUs),
    # 180 GB HBM3e (1,440 GB per 8) at 7.7 TB/s; NVLink 5 1.8 TB/s bidirectional;
    # DGX B200: 8× ConnectX-7 400 Gb/s.
    "b200": Hardware("b200", 2250, 75, device_memory(180), 7700, 900, 50, host_link_gbps=PCIE_GEN5),
    # AMD Instinct MI300X datasheet: BF16 1,307.4 TFLOPS dense, FP32 (matrix) 163.4 TFLOPS,
    # 192 GB HBM3 at 5.3 TB/s; 7 Infinity Fabric links of 64 GB/s per direction to the other
    # 7 GPUs of an 8-GPU platform → 448 GB/s; 400 Gb/s NIC per GPU.
    "mi300x": Hardware("mi300x", 1307.4, 163.4, device_memory(192), 5300, 448, 50, host_link_gbps=PCIE_GEN5),
}

MEASURED_ONLY = ("name", "host_overhead", "layer_kernel_scale", "reduce_scatter_scale", "all_gather_scale",
                 "block_attention_points")
OVERRIDABLE = tuple(f.name for f in fields(Hardware) if f.name not in MEASURED_ONLY)


# What the driver calls each catalog part (torch.cuda.get_device_name), most specific first:
# "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-40GB", "AMD Instinct MI300X".
DEVICE_NAMES: tuple[tuple[str, str], ...] = (
    ("H100 NVL", "h100-nvl"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"), ("H800", "h800"), ("H200", "h200"),
    ("B200", "b200"), ("V100", "v100"),
    ("A100-SXM4-40GB", "a100-40gb"), ("A100-PCIE-40GB", "a100-40gb"), ("A100", "a100-80gb"), ("MI300X", "mi300x"),
)


def catalog_name_of(device_name: str) -> str | None:
    """The catalog entry for a device as its driver names it, or None for a part not in the catalog."""
    return next((entry for marker, entry in DEVICE_NAMES if marker.lower() in device_name.lower()), None)


def hardware(name: str, **overrides: float | None) -> Hardware:
    """The catalog entry ``name`` with any figure replaced by ``overrides`` (``None`` keeps it)."""
    if name not in CATALOG:
        raise ConfigError(f"unknown GPU {name!r}; known GPUs: {', '.join(CATALOG)} (or pass --hardware-profile FILE)")
    return apply_overrides(CATALOG[name], **overrides)


def stack_hardware(hw: Hardware, kernels: Kernels) -> Hardware:
    """``hw`` with the matmul efficiency the software stack was fitted to on it, and its attention
    kernels' efficiency, where the stack has them for that GPU. A stack's attention figure is its
    kernel's whole rate, exponentials included (measured kernels overlap them with the matmuls), so
    none is charged beside it."""
    attention = dict(kernels.attention_efficiency).get(hw.name)
    figures = {"matmul_efficiency": dict(kernels.matmul_efficiency).get(hw.name), "attention_efficiency": attention,
               "attention_score_s": None if attention is None else 0.0}
    return replace(hw, **{name: value for name, value in figures.items() if value is not None})


def apply_overrides(base: Hardware, **overrides: float | None) -> Hardware:
    """``base`` with the given figures replaced; unknown names and non-positive values are errors."""
    chosen = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(chosen) - set(OVERRIDABLE))
    if unknown:
        raise ConfigError(f"unknown hardware figure(s) {', '.join(unknown)}; known: {', '.join(OVERRIDABLE)}")
    for key, value in chosen.items():
        check_figure(key, value)
    return replace(base, **chosen)


# Figures that may be None (measured by calibrate only, or no cap), and those that may be zero (no
# launch cost, nothing reserved, no overlap, no per-tensor cost, no headroom).
MAY_BE_NONE = ("activation_gbps", "optimizer_parameter_s", "host_link_gbps", "attention_backward_efficiency",
               "inter_node_ring_gbps")
MAY_BE_ZERO = ("kernel_overhead_s", "reserved_bytes", "comm_overlap", "optimizer_tensor_s", "memory_headroom",
               "attention_score_s", "attention_backward_score_s")


def check_measured_figures(profile: Hardware) -> None:
    """ConfigError unless every figure calibrate measures inside its tables (host overheads, layer and
    collective scales) is a finite number, none negative."""
    tables = {f"host_overhead.{family}": overhead for family, overhead in profile.host_overhead.items()}
    tables |= {f"layer_kernel_scale.{family}": scale for family, scale in profile.layer_kernel_scale.items()}
    tables |= {"reduce_scatter_scale": profile.reduce_scatter_scale, "all_gather_scale": profile.all_gather_scale}
    for name, table in tables.items():
        for figure in fields(table):
            value = getattr(table, figure.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"hardware figure {name}.{figure.name} must be a finite number, 0 or more, "
                                  f"got {value!r}")


def check_block_points(points: tuple) -> None:
    """ConfigError unless ``points`` are (scores, forward scale, backward scale) of positive finite
    numbers, fewest scores first, no size twice."""
    for point in points:
        if len(point) != 3 or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in point):
            raise ConfigError(f"block_attention_points holds {list(point)}, not three positive numbers "
                              "(scores, forward scale, backward scale)")
    if any(low[0] >= high[0] for low, high in zip(points, points[1:])):
        raise ConfigError("block_attention_points must list each block size once, fewest scores first")


def check_figure(key: str, value) -> None:
    """ConfigError unless hardware figure ``key`` is a finite number of the right sign (or None where allowed)."""
    if key in ("host_runs_ahead", "has_bf16"):
        if not isinstance(value, bool):
            raise ConfigError(f"hardware figure {key} must be true or false, got {value!r}")
        return
    if value is None and key in MAY_BE_NONE:
        return
    if key == "memory_headroom" and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                         and 0 <= value < 1):
        raise ConfigError(f"hardware figure memory_headroom is a fraction of device memory in [0, 1), got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"hardware figure {key} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and key not in MAY_BE_ZERO):
        raise ConfigError(f"hardware figure {key} must be {'non-negative' if key in MAY_BE_ZERO else 'positive'}, "
                          f"got {value!r}")


# The meaning of a profile's figures, raised when one changes. 2: a cp layout's wrapper overhead
# ("gpt2/cp") is measured over DDP on the cp ranks, whose own overhead ("gpt2/zero0") the planner
# adds beside it; format 1 measured cp with its gradients averaged after backward.
PROFILE_FORMAT = 2


def check_profile_format(data, path: Path) -> None:
    """ConfigError unless the profile is a JSON object whose figures mean what this plait reads:
    written in another format, or unmarked (format 1) with a cp wrapper overhead the planner would
    now count twice."""
    rerun = f"rerun `plait calibrate --out {path}`"
    if not isinstance(data, dict):
        raise ConfigError(f"hardware profile {path} is not a JSON object of hardware figures; run "
                          "`plait calibrate --out FILE` to write one")
    written = data.get("profile_format", 1)
    if written == PROFILE_FORMAT:
        return
    overheads = data.get("host_overhead")
    if written == 1 and not any(key.endswith("/cp") for key in (overheads if isinstance(overheads, dict) else {})):
        return  # format 1 differs from 2 only in the cp wrapper's overhead, which this profile lacks
    reason = (": its cp wrapper overhead was measured without the gradients' reduction over cp, which the "
              "planner now counts apart" if written == 1 else "")
    raise ConfigError(f"hardware profile {path} follows profile format {written!r}, and this plait reads format "
                      f"{PROFILE_FORMAT}{reason}; {rerun}")


def load_profile(path: str | Path) -> Hardware:
    """A hardware profile written by ``plait calibrate`` (a JSON object of Hardware's fields)."""
    path = Path(path)
    require_input_file("hardware profile", path, "run `plait calibrate --out FILE` to write one")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as error:
        raise ConfigError(f"cannot read hardware profile {path}: {error}; run `plait calibrate --out FILE` to write "
                          "one") from error
    check_profile_format(data, path)
    names = {f.name for f in fields(Hardware)}
    try:
        values = {k: v for k, v in data.items() if k in names}
        values["host_overhead"] = {family: HostOverhead(**seconds) for family, seconds in values.get("host_overhead", {}).items()}
        values["layer_kernel_scale"] = {family: KernelScale(**scale)
                                        for family, scale in values.get("layer_kernel_scale", {}).items()}
        for name in ("reduce_scatter_scale", "all_gather_scale"):
            values[name] = CollectiveScale(**values.get(name, {}))
        values["block_attention_points"] = tuple(tuple(point) for point in values.get("block_attention_points", ()))
        profile = Hardware(**values)
    except (TypeError, AttributeError) as error:
        raise ConfigError(f"hardware profile {path} is incomplete ({error}); rerun `plait calibrate`") from error
    try:
        for key in OVERRIDABLE:
            check_figure(key, getattr(profile, key))
        check_block_points(profile.block_attention_points)
        check_measured_figures(profile)
    except ConfigError as error:
        raise ConfigError(f"hardware profile {path}: {error}; rerun `plait calibrate`") from None
    return profile


def profile_json(profile: Hardware, calibration: dict | None = None) -> str:
    """``profile`` as the JSON a profile file holds, marked with the format it follows, beside
    calibrate's fits if given."""
    record = {**profile.to_dict(), "profile_format": PROFILE_FORMAT}
    return json.dumps(record | ({"calibration": calibration} if calibration else {}), indent=2) + "\n"


def save_profile(profile: Hardware, path: str | Path, calibration: dict | None = None) -> None:
    Path(path).write_text(profile_json(profile, calibration))
