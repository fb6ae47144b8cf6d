"""Per-action costs of a layout: what each forward, backward and transfer of a chunk takes.

Compute comes from plait.plan.compute, communication from plait.plan.comm, combined under the
overlap rules stated there. These are the costs the schedule simulator plays.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from plait.facts.activations import ACTIVATION_BYTES, activation_bytes_per_layer, residual_stream_bytes
from plait.facts.collectives import (Collective, boundary_split_over_tp, embedding_collectives, head_collectives,
                                     layer_collectives, stage_boundary_bytes)
from plait.facts.recompute import chunk_recompute
from plait.facts.stack import Kernels
from plait.facts.weight_passes import layer_passes
from plait.layout import Layout
from plait.models.spec import ModelSpec
from plait.plan.comm import (
    all_gather_seconds, all_reduce_seconds, all_to_all_seconds, boundaries_leaving, boundary_link, exposed_under,
    group_link, reduce_scatter_seconds, send_seconds,
)
from plait.plan.compute import (NO_OVERHEAD, UNSCALED, Gemm, LayerTimes, end_pass_seconds, gemm_seconds, head_times,
                                layer_shape, layer_times)
from plait.hardware import Hardware, HostOverhead
from plait.plan.zero3 import first_gather, zero3_exposed, zero3_layer_seconds

# torch.sum over the 2–8 stacked partial outputs of a fused matmul + reduce-scatter is bound by its
# instructions, not its bytes: 23–43% of HBM peak on async TP's shapes (pytorch/pytorch PR 191803,
# which measured it before replacing it); the middle of that range.
PARTIAL_SUM_BANDWIDTH_SHARE = 0.33
COLLECTIVE_SECONDS = {
    "all_reduce": all_reduce_seconds, "all_gather": all_gather_seconds,
    "reduce_scatter": reduce_scatter_seconds, "all_to_all": all_to_all_seconds,
}


# Kernels one ring step of context-parallel attention launches forward besides its attention block:
# the send/receive of the next K/V block and the online-softmax merge of the block's output and
# log-sum-exp into the running ones (rescale, add, the new log-sum-exp). Backward launches twice as
# many (the dK/dV hop and the accumulation of dQ and dK/dV).
RING_STEP_KERNELS = 5


@dataclass(frozen=True)
class ChunkCost:
    """Seconds of one chunk for one micro-batch; ``comm`` is the exposed communication inside."""

    forward: float
    backward_input: float
    backward_weight: float
    comm: float

    @property
    def backward(self) -> float:
        return self.backward_input + self.backward_weight


def parallel_styles(layout: Layout) -> list[str]:
    """The parallel wrappers plait puts round a layer of ``layout``, as calibrate names them."""
    styles = []
    if layout.tp > 1:
        styles.append("sp" if layout.sp else "tp")
    if layout.cp > 1:
        styles.append("cp")
    if layout.dp * layout.cp > 1 and layout.tp == 1:  # under tp the replicas average outside DDP and FSDP
        styles.append(f"zero{layout.zero}")
    return styles


def wrapper_overhead(hw: Hardware, spec: ModelSpec, layout: Layout) -> HostOverhead:
    """Host seconds the layout's parallel wrappers add beyond the single-device model's."""
    if not hw.host_overhead:  # the catalog's GPUs: hidden under the kernels
        return NO_OVERHEAD
    parts = [hw.host_overhead[key] for style in parallel_styles(layout) if (key := f"{spec.family}/{style}") in hw.host_overhead]
    return HostOverhead(*(sum(getattr(part, f.name) for part in parts) for f in fields(HostOverhead)))


@dataclass(frozen=True)
class LayerCost:
    """One layer's compute and the communication it exposes, forward and backward."""

    times: LayerTimes
    comm_forward: float
    comm_backward: float
    first_gather: float = 0.0  # ZeRO-3: the first layer's gather has nothing to hide under


def layer_cost(spec: ModelSpec, hw: Hardware, layout: Layout, micro_batch: int, precision: str, kernels: Kernels,
               times: LayerTimes | None = None) -> LayerCost:
    """Compute plus the tensor-, context- and ZeRO-3 communication of one layer on one rank.

    ``times`` may pass in this layout's plait.plan.compute.layer_times when already known.
    """
    if times is None:
        times = layer_times(spec, hw, layout, micro_batch, precision, kernels, layer_passes(spec, layout, precision, kernels))
    wrappers = wrapper_overhead(hw, spec, layout)
    if wrappers.layer_forward or wrappers.layer_backward:
        times = replace(times, forward=times.forward + wrappers.layer_forward,
                        backward_input=times.backward_input + wrappers.layer_backward)
    if layout.offload_activations:
        times = with_offload_copies(times, activation_bytes_per_layer(spec, layout, micro_batch, precision, kernels)
                                    / hw.host_link_bytes_per_s, kernels)
    e = ACTIVATION_BYTES[precision]
    # The calls plait.facts lists: tensor-parallel collectives, the all-to-all head exchange and the
    # all-gather of K/V with its gradients' reduce-scatter, each on the critical path of the layer; a
    # ring's K/V (and backward's dK/dV) hops, which go round under the attention they feed (and under
    # its recomputation, which sends them again).
    on_path = {"forward": 0.0, "backward": 0.0}
    ring = {"forward": 0.0, "backward": 0.0}
    tp_backward = 0.0  # the backward's own tensor-parallel collectives (not the recomputed forward's)
    windows = None  # the matmuls a fused collective runs inside (fused_windows), when any is fused
    stream = residual_stream_bytes(precision, layout.zero, layout.pp, kernels)
    links = {}  # a group's link, found once for its several calls
    for call in layer_collectives(spec, layout, micro_batch, e, stream, kernels.recompute_whole_forward):
        if call.group not in links:
            links[call.group] = group_link(hw, layout, call.group)
        link = links[call.group]
        if call.op == "send":
            seconds, into = send_seconds(call.tensor_bytes, link), ring
        else:
            seconds, into = COLLECTIVE_SECONDS[call.op](call.tensor_bytes, call.size, link), on_path
        if inside_matmul(call, kernels, layout.sp, link.crosses_nodes):
            windows = windows or fused_windows(spec, hw, layout, micro_batch, precision, kernels)
            pair = windows[(call.op, call.forward > 0, call.input_gradient)]
            # the attention's call and the MLP's alternate; only what exceeds its own matmul is exposed
            for side, count in (("forward", call.forward), ("backward", call.backward)):
                on_path[side] += sum(exposed_under(seconds, pair[i % 2], hw.comm_overlap) for i in range(count))
                if kernels.tp_comm_overlap == "micro-pipeline":  # the fused operator's own passes, not overlapped
                    on_path[side] += count * fused_passes_seconds(call, hw)
            continue
        into["forward"] += call.forward * seconds
        into["backward"] += call.backward * seconds
        # The column-parallel linears' input gradients, all-reduced (or under sp reduce-scattered),
        # can go under their weight gradients; the row-parallel linears' output gradients,
        # all-gathered under sp, are needed before their input-gradient matmul starts.
        if into is on_path and call.input_gradient and kernels.tp_backward_overlap:
            tp_backward += call.backward * seconds
    if tp_backward:  # under the column-parallel linears' weight-gradient matmuls, only the excess is exposed
        window = column_parallel_share(spec) * times.backward_weight
        on_path["backward"] -= tp_backward - exposed_under(tp_backward, window, hw.comm_overlap)
    recomputed = 0.0 if layout.recompute == "none" else 1.0
    cp_forward = cp_backward = 0.0
    if ring["forward"] or ring["backward"]:
        # The attention runs as cp block kernels, one per ring step; the K/V for step i+1 travels
        # under step i's block, so the last block has nothing to hide and only (cp−1)/cp of the
        # attention covers the hops. Each step also launches its exchange and the merge of its
        # output into the running one, whatever the block's size.
        covered = (layout.cp - 1) / layout.cp
        steps = layout.cp * RING_STEP_KERNELS * hw.kernel_overhead_s
        cp_forward = exposed_under(ring["forward"], covered * times.attention, hw.comm_overlap) + steps
        cp_backward = exposed_under(ring["backward"], covered * (times.attention_backward + recomputed * times.attention),
                                    hw.comm_overlap) + (2 + recomputed) * steps
    elif layout.cp > 1 and layout.cp_algorithm == "all-gather" and kernels.plait_engine:
        # plait's gathered attention runs the ring's block kernels and merges over the cp blocks at
        # hand: each block's launches but its exchange.
        steps = layout.cp * (RING_STEP_KERNELS - 1) * hw.kernel_overhead_s
        cp_forward, cp_backward = steps, (2 + recomputed) * steps
    zero_forward = zero_backward = gather = 0.0
    if layout.zero == 3 and layout.pp == 1:  # a pipeline stage gathers once per step (plan.simulate.flush_costs)
        gather, scatter = zero3_layer_seconds(spec, hw, layout, precision, kernels)
        zero_forward, zero_backward = zero3_exposed(spec, times, gather, scatter, layout.recompute, kernels,
                                                    hw.comm_overlap)
        gather = first_gather(spec, gather, kernels)
    return LayerCost(times, on_path["forward"] + cp_forward + zero_forward,
                     on_path["backward"] + cp_backward + zero_backward, gather)


def inside_matmul(call: Collective, kernels: Kernels, sp: bool, crosses_nodes: bool) -> bool:
    """Whether a layer's collective runs in pieces inside the matmul it feeds or drains
    (``Kernels.tp_comm_overlap``): tensor-parallel ones under sequence parallelism over one node's
    NVLink (both userbuffers and torch's symmetric memory map the peers' buffers into each GPU),
    all of them with userbuffers, and with torch's micro-pipeline pass all but the reduce-scatter of
    the column-parallel linears' summed input gradients."""
    if call.group != "tp" or not sp or crosses_nodes or not kernels.tp_comm_overlap:
        return False
    return kernels.tp_comm_overlap == "userbuffers" or not call.input_gradient


def fused_windows(spec: ModelSpec, hw: Hardware, layout: Layout, micro_batch: int, precision: str,
                  kernels: Kernels) -> dict[tuple[str, bool, bool], tuple[float, float]]:
    """Seconds of the matmul each fused tensor-parallel collective runs inside, the attention's and
    the MLP's, keyed by (op, issued in the forward, input gradient) as plait.facts.collectives lists
    them: the column-parallel linears' forward for their input's all-gather (and its rerun in a
    recomputed forward), the row-parallel linears' forward for their output's reduce-scatter, the
    row-parallel linears' input gradients for their output gradient's all-gather, and the
    column-parallel linears' input gradients for those gradients' reduce-scatter."""
    shape = layer_shape(spec, micro_batch, layout.tp, layout.cp, layout.sp, precision, kernels)
    scale = hw.layer_kernel_scale.get(spec.family, UNSCALED)  # as plait.plan.compute.layer_times charges them
    qkv, wo, up, down = (scale.forward * gemm_seconds(hw, precision, g) for g in shape.weights)
    qkv_dx, wo_dx, up_dx, down_dx = (scale.backward * gemm_seconds(hw, precision, Gemm(g.m, g.k, g.n, g.batch))
                                     for g in shape.weights)
    return {("all_gather", True, False): (qkv, up), ("reduce_scatter", True, False): (wo, down),
            ("all_gather", False, False): (wo_dx, down_dx), ("reduce_scatter", False, True): (qkv_dx, up_dx)}


def fused_passes_seconds(call: Collective, hw: Hardware) -> float:
    """Seconds one of torch's symmetric-memory operators spends outside its overlap
    (torch/distributed/_symmetric_memory): an all-gather's matmul first copies the local shard into
    the symmetric buffer (read and written) and waits on a barrier; a matmul's reduce-scatter, once
    its last piece arrives, sums the tp partial outputs with torch.sum, reading them all and writing
    the rank's rows, at ``PARTIAL_SUM_BANDWIDTH_SHARE`` of the device's memory bandwidth."""
    rate = hw.memory_gbps * 1e9
    if call.op == "all_gather":
        return 2 * call.tensor_bytes / call.size / rate
    return call.tensor_bytes * (1 + 1 / call.size) / (PARTIAL_SUM_BANDWIDTH_SHARE * rate)


def with_offload_copies(times: LayerTimes, copy: float, kernels: Kernels) -> LayerTimes:
    """A layer whose saved tensors cross the host link, ``copy`` seconds each way: out in its forward,
    back in its backward. On the compute stream (``Kernels.activation_offload`` "serial") they add
    to both; on a side stream ("overlapped") only what exceeds the compute beside them does."""
    if kernels.activation_offload == "overlapped":
        return replace(times, forward=times.forward + exposed_under(copy, times.forward, 1.0),
                       backward_input=times.backward_input + exposed_under(copy, times.backward, 1.0))
    return replace(times, forward=times.forward + copy, backward_input=times.backward_input + copy)


@dataclass(frozen=True)
class EndCollectives:
    """Seconds of the embedding's and the head's tensor-parallel collectives per micro-batch, each on
    the critical path of the first and last chunk (plait.facts.collectives lists them)."""

    embedding_forward: float = 0.0
    embedding_backward: float = 0.0
    head_forward: float = 0.0
    head_backward: float = 0.0


def end_collectives(spec: ModelSpec, hw: Hardware, layout: Layout, micro_batch: int, stream_bytes: int) -> EndCollectives:
    """The ends' calls all move the residual stream (``stream_bytes`` a value,
    plait.facts.activations.residual_stream_bytes): the embedding's output and the head's input."""
    if layout.tp == 1:
        return EndCollectives()
    link, e = group_link(hw, layout, "tp"), stream_bytes
    sides = []
    for calls in (embedding_collectives(spec, micro_batch, spec.seq_len, layout.tp, layout.sp, layout.cp, e),
                  head_collectives(spec, micro_batch, spec.seq_len, layout.tp, layout.sp, layout.cp, e)):
        seconds = [(call.forward, call.backward, COLLECTIVE_SECONDS[call.op](call.tensor_bytes, call.size, link))
                   for call in calls]
        sides += [sum(f * t for f, _, t in seconds), sum(b * t for _, b, t in seconds)]
    return EndCollectives(*sides)


def column_parallel_share(spec: ModelSpec) -> float:
    """The column-parallel linears' (q, k, v and the MLP's input projections) share of a layer's
    weight-gradient matmuls, by parameters: their gradient matmuls are what Megatron-LM's asynchronous
    tensor-parallel backward runs beside."""
    column = spec.hidden * (spec.hidden + 2 * spec.kv_dim) + spec.hidden * spec.ffn_hidden * (2 if spec.gated_mlp else 1)
    row = spec.hidden * spec.hidden + spec.ffn_hidden * spec.hidden
    return column / (column + row)


def chunk_costs(
    spec: ModelSpec,
    hw: Hardware,
    layout: Layout,
    micro_batch: int,
    precision: str,
    kernels: Kernels,
    counts: tuple[int, ...],
) -> tuple[ChunkCost, ...]:
    """Costs of every stage chunk holding ``counts[c]`` layers; chunk 0 embeds, the last one has the head.
    Each chunk's blocks are costed by their own recomputation (plait.facts.recompute)."""
    layers = {mode: layer_cost(spec, hw, replace(layout, recompute=mode, recompute_layers=None), micro_batch,
                               precision, kernels) for mode in {m for n in counts for m, _ in chunk_recompute(layout, n)}}
    first_gather = next(iter(layers.values())).first_gather
    ends = end_collectives(spec, hw, layout, micro_batch, residual_stream_bytes(precision, layout.zero, layout.pp, kernels))
    head = head_times(spec, hw, precision, micro_batch, layout.tp, layout.cp)
    out = []
    for c, blocks in enumerate(counts):
        # (the embedding's and head's own passes, on the chunks that hold them)
        forward, backward_weight = end_pass_seconds(spec, hw, layout, precision, kernels, c == 0, c == len(counts) - 1)
        # (and the stack's own cost of each pass through a chunk, counted as the rank's compute: a
        # collective in flight runs on beside it, as beside the layers)
        forward += kernels.chunk_pass_s
        backward_input, comm = kernels.chunk_pass_s, 0.0
        for mode, n in chunk_recompute(layout, blocks):
            layer = layers[mode]
            t = layer.times
            forward += n * (t.forward + layer.comm_forward)
            backward_input += n * (t.backward_input + t.recompute + layer.comm_backward)
            backward_weight += n * t.backward_weight
            comm += n * (layer.comm_forward + layer.comm_backward)
        if c == 0:
            forward += ends.embedding_forward + first_gather
            backward_input += ends.embedding_backward
            comm += ends.embedding_forward + ends.embedding_backward + first_gather
        if c == len(counts) - 1:
            forward += head.forward + ends.head_forward
            backward_input += head.backward_input + ends.head_backward
            backward_weight += head.backward_weight
            comm += ends.head_forward + ends.head_backward
        out.append(ChunkCost(forward, backward_input, backward_weight, comm))
    return tuple(out)


@dataclass(frozen=True)
class Boundaries:
    """The stage boundaries' messages, boundary r lying between pp ranks r and r + 1 (mod pp):
    ``flights[r]`` from a send's end to its arrival, either way, and ``sends[r]`` what the sender
    spends on it (the transfer where the stack's sends block, else nothing)."""

    flights: tuple[float, ...]
    sends: tuple[float, ...]

    @classmethod
    def uniform(cls, pp: int, flight: float) -> Boundaries:
        """Every boundary the same flight, no send blocking."""
        return cls((flight,) * pp, (0.0,) * pp)


def stage_boundaries(spec: ModelSpec, hw: Hardware, layout: Layout, micro_batch: int, precision: str,
                     kernels: Kernels) -> Boundaries:
    """One activation (or its gradient) across each stage boundary: the send on that boundary's link
    (plait.plan.comm.boundary_link), and where the stack splits the boundary over tp the receiver's
    all-gather of the pieces. A blocking send keeps its sender busy for the transfer."""
    if layout.pp == 1:
        return Boundaries.uniform(1, 0.0)
    nbytes = stage_boundary_bytes(spec, layout, micro_batch, precision, kernels)
    gather = (all_gather_seconds(nbytes * layout.tp, layout.tp, group_link(hw, layout, "tp"))
              if boundary_split_over_tp(layout, kernels) else 0.0)
    seconds = {leaves: send_seconds(nbytes, boundary_link(hw, leaves)) for leaves in (False, True)}
    transfers = tuple(seconds[leaves] for leaves in boundaries_leaving(hw, layout))
    if layout.schedule in kernels.blocking_sends:
        return Boundaries((gather,) * layout.pp, transfers)
    return Boundaries(tuple(t + gather for t in transfers), (0.0,) * layout.pp)
