"""The device a prediction is for, as plan, simulate and train --dry-run/--auto read it from their flags:
a catalog GPU or a calibrated profile, with the cluster's and the part's figures a user overrides.
One home, so that a train command that plan prints predicts what plan did."""

from __future__ import annotations

import argparse

from plait.hardware import Hardware, apply_overrides

# Flag → the Hardware figure it sets (``--memory-gb`` in 10^9 bytes), in the order plan prints them.
OVERRIDE_FLAGS = {
    "gpus_per_node": "gpus_per_node", "intra_node_gbps": "intra_node_gbps", "inter_node_gbps": "inter_node_gbps",
    "inter_node_ring_gbps": "inter_node_ring_gbps", "memory_gb": "memory_bytes", "memory_bandwidth": "memory_gbps",
    "peak_tflops": None, "memory_headroom": "memory_headroom",
}


def add_device_overrides(group: argparse._ArgumentGroup) -> None:
    """The figures of the device a prediction is for that a user may override (default: the catalog
    GPU's or the profile's)."""
    own = "(default: the GPU's or profile's)"
    group.add_argument("--gpus-per-node", type=int, help=f"devices in a node {own}")
    group.add_argument("--intra-node-gbps", type=float, help=f"per-device bandwidth inside a node, GB/s each way {own}")
    group.add_argument("--inter-node-gbps", type=float,
                       help=f"per-device network bandwidth between nodes, GB/s each way {own}")
    group.add_argument("--inter-node-ring-gbps", type=float,
                       help="the most bus bandwidth one group's rings reach between nodes, GB/s, where NCCL lays them "
                            "over fewer adapters than the group has members in a node (its all_reduce_perf busbw; "
                            "default: the adapters' own)")
    group.add_argument("--peak-tflops", type=float, help=f"dense peak TFLOP/s at --precision {own}")
    group.add_argument("--memory-gb", type=float, help="device memory a process may allocate, in GB (10^9 bytes): "
                       f"what torch.cuda.get_device_properties().total_memory reports (an A100 80GB: 85.1) {own}")
    group.add_argument("--memory-bandwidth", type=float, metavar="GBPS",
                       help=f"device memory bandwidth in GB/s (an HBM2e or power-capped part of a catalog GPU) {own}")
    group.add_argument("--memory-headroom", type=float, metavar="FRACTION",
                       help="share of device memory the plan leaves free (default 0.05)")


def given_overrides(args: argparse.Namespace) -> dict[str, float]:
    """The override flags given, by their argparse names."""
    return {name: getattr(args, name) for name in OVERRIDE_FLAGS if getattr(args, name, None) is not None}


def override_flags(args: argparse.Namespace) -> list[str]:
    """The override flags given, as a command line repeats them."""
    return [part for name, value in given_overrides(args).items() for part in ("--" + name.replace("_", "-"), str(value))]


def device_hardware(args: argparse.Namespace, base: Hardware, precision: str) -> Hardware:
    """``base`` with the figures the flags override; --peak-tflops is the peak at ``precision``."""
    figures = {OVERRIDE_FLAGS[name] or ("bf16_tflops" if precision == "bf16" else "fp32_tflops"): value
               for name, value in given_overrides(args).items()}
    if "memory_bytes" in figures:
        figures["memory_bytes"] *= 1e9
    return apply_overrides(base, **figures)
