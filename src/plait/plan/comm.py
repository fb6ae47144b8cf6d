"""Collective times with latency and bandwidth terms, on links chosen by the mesh order.

Ring algorithms (Patarasuk & Yuan 2009; NCCL's default for large messages): over n ranks an
all-reduce of S bytes sends 2(n−1)/n·S per rank in 2(n−1) steps, a reduce-scatter or all-gather
(n−1)/n·S in n−1 steps. Where reduce-scatter and all-gather are not rings (gloo), the hardware's
calibrated ``CollectiveScale`` multiplies their two terms.

Topology: the mesh is (pp, dp, cp, tp) with tp innermost, ranks numbered row-major and nodes
holding consecutive ranks. A group whose members all sit in one node uses the intra-node link.
A group that spans nodes is laid out as NCCL lays its rings: each ring runs through a node's
members over NVLink and leaves it through one network adapter, so a group with k members per
node runs k rings side by side, one per adapter, and gets min(intra, k × adapter) bus bandwidth
(the node's other adapters carry the other groups of its stride). k is the fewest members it has
in any node it reaches: a group that straddles a node boundary (tp 12 on nodes of 8: 8 GPUs of
one node, 4 of the next) leaves through its members' adapters only (4), and one that fits in a
node's size without dividing it (tp 6, tp 3) has groups that straddle two nodes.

Latency follows NCCL's own tuning model (src/graph/tuning.cc): a ring is a pipeline, so the
latency a piece of data pays is the sum of the hops it crosses — of a pass's n−1 steps, the
N−1 that cross between the N nodes the group spans pay the network hop, the rest the NVLink hop
(an all-reduce's two passes pay both twice).

Overlap rules, used by plait.plan.simulate (where a rule says a collective overlaps compute, the
hardware's ``comm_overlap`` fraction of it can hide: all of it on a GPU, what calibrate measures
on a CPU, whose cores run both):
- tensor-parallel and sequence-parallel collectives sit on the critical path of every layer;
- context-parallel K/V exchange round a ring overlaps the attention it feeds (only the excess is
  exposed); the all-to-all head exchange (Ulysses, plait's own) sits on the critical path;
- a pipeline send crosses one stage boundary: NVLink inside a node, the sender's adapter between
  nodes. Where the stack's sends block (``Kernels.blocking_sends``) the sender is busy for the
  transfer; elsewhere it moves on and the receiver waits for the arrival;
- data-parallel gradient reduction overlaps the backward pass of the last micro-batch, bucket
  by bucket; the last bucket and whatever exceeds that backward are exposed;
- ZeRO-3 all-gathers of the next layer's parameters are prefetched under the current layer's
  compute, forward and backward; only the excess is exposed;
- the ZeRO-1/2 all-gather of updated parameters after the optimizer step is exposed, and so are
  the step's scalar all-reduces (the logged loss, a tensor-parallel gradient norm).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass

from plait.layout import MESH_DIMS, Layout
from plait.hardware import CollectiveScale, Hardware

# Fraction of the nominal link bandwidth a large collective achieves. Inside a node NCCL's ring
# bus bandwidth on NVLink is ~80% of nominal in nccl-tests reports. Across nodes each adapter
# reaches more of its line rate: NVIDIA measures 192 GB/s all-reduce bus bandwidth on DGX A100
# with 8 × 200 Gb/s InfiniBand (24 of 25 GB/s per adapter; NVIDIA/nccl issue 812), and expects
# 46–48 of 50 GB/s per 400 Gb/s NDR adapter (NVIDIA/nccl-tests issue 290).
LINK_EFFICIENCY = 0.8
NETWORK_EFFICIENCY = 0.96


@dataclass(frozen=True)
class Link:
    """What one rank of a group sees: bus bandwidth (bytes/s), the latency of a ring step inside a
    node (s), and for a group spanning ``nodes`` nodes the latency of a step between them."""

    bandwidth: float
    latency: float
    crosses_nodes: bool
    reduce_scatter_scale: CollectiveScale = CollectiveScale()  # the Hardware's
    all_gather_scale: CollectiveScale = CollectiveScale()
    nodes: int = 1
    network_latency: float = 0.0

    def ring_latency(self, steps: int, passes: int = 1) -> float:
        """Latency of ``passes`` ring passes of ``steps`` steps each, ``nodes − 1`` of each between nodes."""
        between = min(steps, self.nodes - 1)
        return passes * ((steps - between) * self.latency + between * self.network_latency)

    @property
    def hop_latency(self) -> float:
        """Latency of one point-to-point transfer on this link."""
        return self.network_latency if self.crosses_nodes else self.latency


def group_link(hw: Hardware, layout: Layout, dim: str) -> Link:
    """The link a communication group along mesh dimension ``dim`` runs on."""
    return merged_link(hw, layout, (dim,))


def merged_link(hw: Hardware, layout: Layout, dims: tuple[str, ...]) -> Link:
    """The link of a group spanning several adjacent mesh dimensions (e.g. dp × cp)."""
    inner = MESH_DIMS.index(dims[-1])
    stride = 1
    for name in MESH_DIMS[inner + 1:]:
        stride *= getattr(layout, name)
    size = 1
    for name in dims:
        size *= getattr(layout, name)
    return strided_link(hw, size, stride, layout.world_size)


def network_bandwidth(hw: Hardware, adapters: int) -> float:
    """Bytes per second a transfer leaving a node through ``adapters`` of its GPUs' adapters gets:
    their shares at the network's efficiency, but no more than one communicator's rings reach
    across nodes (``Hardware.inter_node_ring_gbps``)."""
    bandwidth = hw.inter_node_gbps * 1e9 * NETWORK_EFFICIENCY * adapters
    return bandwidth if hw.inter_node_ring_gbps is None else min(bandwidth, hw.inter_node_ring_gbps * 1e9)


def strided_link(hw: Hardware, size: int, stride: int, world: int | None = None) -> Link:
    """The link of a group of ``size`` ranks ``stride`` global ranks apart among ``world`` ranks
    (nodes fill rank by rank; None: as many as the layout of groups over nodes takes to repeat)."""
    intra = hw.intra_node_gbps * 1e9 * LINK_EFFICIENCY
    scales = {"reduce_scatter_scale": hw.reduce_scatter_scale, "all_gather_scale": hw.all_gather_scale}
    fewest, nodes = group_spread(size, stride, hw.gpus_per_node, world)
    if nodes == 1:
        return Link(intra, hw.intra_node_latency_s, False, **scales)
    return Link(min(intra, network_bandwidth(hw, fewest)), hw.intra_node_latency_s, True, **scales, nodes=nodes,
                network_latency=hw.inter_node_latency_s)


@functools.lru_cache(maxsize=4096)
def group_spread(size: int, stride: int, node: int, world: int | None = None) -> tuple[int, int]:
    """(the fewest members any group of ``size`` ranks ``stride`` apart has in a node it reaches, the
    most nodes one such group reaches), over every group of a mesh of ``world`` ranks (nodes of
    ``node`` ranks, filled rank by rank; None: every group of the repeating layout). A group's
    rings leave a node through its own members' adapters, one each (the node's others carry the
    groups those GPUs belong to), so the node where it has the fewest members bounds its
    bandwidth: a group that fills its nodes evenly has ``node // stride`` in each, while one that
    straddles a node boundary (6 ranks of a node of 8, or 12 ranks) has only its share of the
    node it leaves into. (Remembered: a search asks for the same few shapes thousands of times.)"""
    span = size * stride
    if span <= node and node % span == 0 or world is not None and world <= node:  # every group inside a node
        return size, 1
    if node % stride == 0 and span % node == 0:  # groups filling whole nodes alike
        return node // stride, span // node
    if stride % node == 0:  # one member a node
        return 1, size
    period = span * node // math.gcd(span, node)  # the layout repeats after this many ranks
    fewest, most = size, 1
    for start in range(0, period if world is None else min(period, world), span):
        for offset in range(start, start + stride):
            members = Counter((offset + k * stride) // node for k in range(size))
            fewest, most = min(fewest, min(members.values())), max(most, len(members))
    return fewest, most


def pipeline_link(hw: Hardware, layout: Layout, boundary: int) -> Link:
    """The link one send between pp ranks ``boundary`` and ``boundary + 1`` (mod pp) runs on: NVLink
    inside a node, else the sender's own network adapter (a point-to-point transfer is one GPU's,
    not a ring's over every adapter of the node)."""
    return boundary_link(hw, boundaries_leaving(hw, layout)[boundary])


def boundaries_leaving(hw: Hardware, layout: Layout) -> tuple[bool, ...]:
    """For each stage boundary r (between pp ranks r and r + 1 mod pp), whether its sends leave a node."""
    stride = 1
    for name in MESH_DIMS[MESH_DIMS.index("pp") + 1:]:
        stride *= getattr(layout, name)
    return boundaries_leaving_node(layout.pp, stride, hw.gpus_per_node)


@functools.lru_cache(maxsize=1024)
def boundaries_leaving_node(pp: int, stride: int, node: int) -> tuple[bool, ...]:
    """For each stage boundary, whether its sends leave a node: the stages' ``stride`` rank pairs
    send side by side, and the boundary is as slow as any pair that leaves its node. (Remembered: a
    search asks for the same few meshes thousands of times.)"""
    def leaves(boundary: int) -> bool:
        first, second = boundary * stride, (boundary + 1) % pp * stride
        # (the pattern repeats by node)
        return not all((first + k) // node == (second + k) // node for k in range(min(stride, node)))

    return tuple(leaves(boundary) for boundary in range(pp))


def boundary_link(hw: Hardware, leaves_node: bool) -> Link:
    """A stage boundary's link: the sender's network adapter, or NVLink inside its node."""
    if leaves_node:
        return Link(network_bandwidth(hw, 1), hw.intra_node_latency_s, True, nodes=2,
                    network_latency=hw.inter_node_latency_s)
    return Link(hw.intra_node_gbps * 1e9 * LINK_EFFICIENCY, hw.intra_node_latency_s, False)


def all_reduce_seconds(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks."""
    if n == 1:
        return 0.0
    return link.ring_latency(n - 1, passes=2) + 2 * (n - 1) / n * nbytes / link.bandwidth


def ring_pass_seconds(nbytes: float, n: int, link: Link, scale: CollectiveScale = CollectiveScale()) -> float:
    """One pass round a ring of ``n`` ranks, each step moving 1/n of a ``nbytes`` buffer."""
    if n == 1:
        return 0.0
    return scale.latency * link.ring_latency(n - 1) + scale.bandwidth * (n - 1) / n * nbytes / link.bandwidth


def reduce_scatter_seconds(nbytes: float, n: int, link: Link) -> float:
    """Reduce-scatter of a ``nbytes`` buffer (each rank keeps 1/n) over ``n`` ranks: one ring pass."""
    return ring_pass_seconds(nbytes, n, link, link.reduce_scatter_scale)


def all_gather_seconds(nbytes: float, n: int, link: Link) -> float:
    """All-gather that assembles a ``nbytes`` buffer from ``n`` equal shards: one ring pass."""
    return ring_pass_seconds(nbytes, n, link, link.all_gather_scale)


def all_to_all_seconds(nbytes: float, n: int, link: Link) -> float:
    """All-to-all of a ``nbytes`` buffer per rank over ``n`` ranks: a 1/n piece to each peer, n−1 steps."""
    return ring_pass_seconds(nbytes, n, link)


def send_seconds(nbytes: float, link: Link) -> float:
    """One point-to-point transfer."""
    return link.hop_latency + nbytes / link.bandwidth


def exposed_under(comm_s: float, compute_s: float, overlap: float) -> float:
    """What is left of ``comm_s`` seconds of communication run beside ``compute_s`` of compute
    when ``overlap`` of it can hide (plait.hardware.Hardware.comm_overlap)."""
    return comm_s - overlap * min(comm_s, compute_s)
