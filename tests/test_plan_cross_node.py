"""Groups that span nodes, as NCCL lays its rings over the network adapters, and ZeRO-3 across nodes,
gathered block by block (FSDP2) or linear by linear (DeepSpeed).

Published figures: NVIDIA measures 192 GB/s all-reduce bus bandwidth on DGX A100 nodes with
8 × 200 Gb/s InfiniBand (NVIDIA/nccl issue 812) and expects 46–48 GB/s per 400 Gb/s NDR adapter
(NVIDIA/nccl-tests issue 290).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest

from plait.facts.stack import STACKS, Kernels
from plait.layout import Layout
from plait.models.flops import layer_parameter_count
from plait.models.spec import ModelSpec, model_spec
from plait.plan.comm import (
    LINK_EFFICIENCY, NETWORK_EFFICIENCY, all_gather_seconds, all_reduce_seconds, boundary_link, group_link,
    strided_link,
)
from plait.plan.compute import LayerTimes
from plait.hardware import hardware
from plait.plan.memory import other_bytes
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload
from plait.plan.zero3 import zero3_exposed, zero3_layer_seconds

GB = 1e9


def test_a_whole_node_group_across_nodes_gets_the_bus_bandwidth_nccl_tests_measure_on_dgx_a100():
    link = strided_link(hardware("a100-80gb"), 32, 1)  # four DGX A100 nodes, every GPU in the ring
    assert link.crosses_nodes and link.nodes == 4
    assert link.bandwidth / GB == pytest.approx(192, rel=0.01)


def test_each_ndr_adapter_carries_what_nvidia_expects_of_it():
    per_adapter = strided_link(hardware("h100-sxm"), 4, 8).bandwidth / GB  # one member per node
    assert 46 <= per_adapter <= 48
    # A whole-node ring also runs over NVLink, whose ring bus bandwidth (360 GB/s) is then the bound.
    nvlink = strided_link(hardware("h100-sxm"), 8, 1).bandwidth / GB
    assert strided_link(hardware("h100-sxm"), 32, 1).bandwidth / GB == pytest.approx(min(nvlink, 8 * per_adapter))


def test_groups_of_a_stride_share_the_node_adapters():
    hw = hardware("a100-80gb")
    whole, half, one = (strided_link(hw, 64 // stride, stride).bandwidth for stride in (1, 4, 8))
    assert whole == pytest.approx(4 * half) and half == pytest.approx(2 * one)
    assert not group_link(hw, Layout(dp=4, tp=8), "tp").crosses_nodes
    assert group_link(hw, Layout(dp=4, tp=8), "dp").bandwidth == pytest.approx(one)


def test_jean_zays_rings_get_what_bloom_measured_nccl_reach_over_its_adapters():
    """BLOOM's all-reduce benchmark on four Jean Zay A100 nodes (32 ranks) read 5.07 GB/s of bus
    bandwidth with NCCL's two channels on one OmniPath adapter a node: a whole-node group gets just
    that, as does one with two members a node (BLOOM's data parallelism under tp 4, four rings on
    four adapters); one member a node (tp 8: eight rings, two GPUs to an adapter) gets half, and so
    does a stage's send from each GPU."""
    from benchmarks.deepspeed_megatron_runs import JEAN_ZAY_A100, JEAN_ZAY_NCCL_BUS_GBPS

    hw = hardware("a100-80gb", **dict(JEAN_ZAY_A100))
    whole, two, one = (strided_link(hw, 32 // stride, stride).bandwidth / GB for stride in (1, 4, 8))
    assert whole == pytest.approx(JEAN_ZAY_NCCL_BUS_GBPS) and two == pytest.approx(JEAN_ZAY_NCCL_BUS_GBPS)
    assert one == pytest.approx(JEAN_ZAY_NCCL_BUS_GBPS / 2)
    assert group_link(hw, Layout(dp=4, tp=8), "dp").bandwidth / GB == pytest.approx(one)
    assert boundary_link(hw, True).bandwidth / GB == pytest.approx(one)
    # The cap binds a send too: a GPU's own adapter cannot carry more than NCCL's rings reach.
    capped = hardware("a100-80gb", inter_node_ring_gbps=1.0)
    assert boundary_link(capped, True).bandwidth / GB == pytest.approx(1.0)


def test_a_group_straddling_a_node_boundary_gets_only_its_members_adapters_there():
    """tp 12 on nodes of 8: every group holds 8 GPUs of one node and 4 of the next, whose other 4
    belong to the next group, so its rings leave through 4 adapters, not 8; tp 6 fits in a node,
    but every fourth group straddles two, with 2 members on one side."""
    hw = hardware("h100-sxm")
    per_adapter = strided_link(hw, 4, 8).bandwidth
    tp12, tp6 = strided_link(hw, 12, 1), strided_link(hw, 6, 1)
    assert tp12.crosses_nodes and tp12.nodes == 2 and tp12.bandwidth == pytest.approx(4 * per_adapter)
    assert tp6.crosses_nodes and tp6.nodes == 2 and tp6.bandwidth == pytest.approx(2 * per_adapter)
    assert not strided_link(hw, 4, 1).crosses_nodes and strided_link(hw, 16, 1).bandwidth > tp12.bandwidth


@pytest.mark.parametrize("sizes", [(1, 4, 1, 12), (2, 4, 1, 6), (1, 8, 3, 2), (3, 2, 1, 4), (2, 5, 2, 3), (1, 3, 2, 8),
                                   (1, 2, 1, 3), (1, 4, 1, 3)])
def test_the_spread_of_every_group_is_what_the_mesh_lays_out(sizes):
    """For each mesh dimension, the fewest members a group has in a node it reaches and the most
    nodes a group reaches, counted over the groups the mesh (pp, dp, cp, tp, rank-major) really forms
    (6 ranks, all in one node; 12, whose last node holds 4)."""
    hw = hardware("a100-80gb")
    node = hw.gpus_per_node
    layout = Layout(**dict(zip(("pp", "dp", "cp", "tp"), sizes)))
    ranks = list(range(math.prod(sizes)))
    for axis, dim in enumerate(("pp", "dp", "cp", "tp")):
        if sizes[axis] == 1:
            continue
        stride = math.prod(sizes[axis + 1:])
        groups = {}
        for rank in ranks:
            coordinate = rank // stride % sizes[axis]
            groups.setdefault(rank - coordinate * stride, []).append(rank)
        spreads = [Counter(rank // node for rank in group) for group in groups.values()]
        fewest, most = min(min(c.values()) for c in spreads), max(len(c) for c in spreads)
        link = group_link(hw, layout, dim)
        assert link.crosses_nodes == (most > 1)
        if most > 1:
            assert link.nodes == most
            assert link.bandwidth == pytest.approx(min(hw.intra_node_gbps * 1e9 * LINK_EFFICIENCY,
                                                       fewest * hw.inter_node_gbps * 1e9 * NETWORK_EFFICIENCY))


def test_only_the_hops_between_nodes_pay_the_network_latency():
    """NCCL's ring latency (src/graph/tuning.cc): n − 1 steps a pass, N − 1 of them between N nodes."""
    hw = hardware("a100-80gb")
    link = strided_link(hw, 16, 1)
    tiny = 8.0  # bytes: the bandwidth term vanishes
    expected_pass = 14 * hw.intra_node_latency_s + 1 * hw.inter_node_latency_s
    assert all_gather_seconds(tiny, 16, link) == pytest.approx(expected_pass, rel=1e-6)
    assert all_reduce_seconds(tiny, 16, link) == pytest.approx(2 * expected_pass, rel=1e-6)
    wide = strided_link(hw, 512, 1)  # 64 nodes: latency grows with the ranks
    assert all_gather_seconds(tiny, 512, wide) > 30 * all_gather_seconds(tiny, 16, link)


def _zero3(seq_len: int, gpus: int):
    spec = model_spec("llama-8b", seq_len=seq_len)
    workload = Workload(spec, 512, kernels=STACKS["megatron"])
    layout = Layout(dp=gpus, zero=3, recompute="selective")
    hw = hardware("a100-80gb")
    gather, scatter = zero3_layer_seconds(spec, hw, layout, "bf16", workload.kernels)
    return evaluate(workload, hw, gpus, layout), spec.layers * (2 * gather + scatter)


@pytest.mark.parametrize("seq_len", [4096, 1024, 512])
def test_a_zero3_step_never_beats_the_time_its_links_need(seq_len):
    """Every layer is gathered in forward and again in backward and its gradients reduce-scattered,
    all on the same links: no overlap can make the step shorter than that traffic."""
    prediction, link_seconds = _zero3(seq_len, 512)
    assert prediction.step_time_s >= link_seconds


def test_zero3_step_time_follows_the_per_layer_gather_once_compute_shrinks():
    """At a fixed global batch, doubling the GPUs halves each one's compute but not the parameters it
    gathers: compute-bound, the step halves; communication-bound, it stops falling."""
    heavy_256, _ = _zero3(4096, 256)
    heavy_512, _ = _zero3(4096, 512)
    assert heavy_512.step_time_s == pytest.approx(heavy_256.step_time_s / 2, rel=0.1)
    light_256, link_256 = _zero3(512, 256)
    light_512, link_512 = _zero3(512, 512)
    assert light_512.step_time_s >= 0.9 * light_256.step_time_s
    assert light_512.step_time_s >= link_512 > link_256
    assert light_512.time_breakdown["critical_path_comm_s"] > light_512.time_breakdown["compute_s"]


def _one_layer_costs(unit: str, recompute: str) -> tuple[float, float]:
    """A GPT block (q/k/v 3h², output h², MLP 4h² and 4h²) whose transfers take as long as its
    matmuls: 1 s of forward, 2 s of backward, a 1 s gather and a 1 s reduce-scatter."""
    times = LayerTimes(forward=1.0, backward_input=1.0, backward_weight=1.0, recompute=0.0)
    return zero3_exposed(model_spec("gpt3-175b"), times, 1.0, 1.0, recompute, Kernels(zero3_gather_unit=unit), 1.0)


def test_a_block_wide_gather_hides_under_the_block_before_it():
    assert _one_layer_costs("layer", "none") == (0.0, 0.0)


def test_a_backward_gather_issued_after_the_gradients_hides_under_nothing():
    """FSDP1's BACKWARD_POST issues the next block's gather once the current block's gradients are
    done, ahead of its reduce-scatter: the next block's backward waits for the whole 1 s gather,
    and the 1.5 s reduce-scatter hides under its 2 s. Issued before (FSDP2), the gather and the
    reduce-scatter run beside those 2 s together, 0.5 s exposed. Forward is the same."""
    times = LayerTimes(forward=1.0, backward_input=1.0, backward_weight=1.0, recompute=0.0)
    spec = model_spec("gpt3-175b")
    assert zero3_exposed(spec, times, 1.0, 1.5, "none", Kernels(zero3_backward_prefetch="post"), 1.0) == (0.0, 1.0)
    assert zero3_exposed(spec, times, 1.0, 1.5, "none", Kernels(zero3_backward_prefetch="pre"), 1.0) == (0.0, 0.5)


def test_gathering_linear_by_linear_leaves_the_mlp_weight_behind_the_small_projection_exposed():
    """DeepSpeed fetches each linear and prefetches the next only. Forward, the first MLP weight
    (4/12 of the block) is in flight while the output projection (1/12) runs: 3/12 exposed. Backward
    (2 s, by linear 2/3, 2/3, 1/6, 1/2 from the last), the output projection's 1/6 s runs beside the
    q/k/v gather (3/12) and the first MLP weight's reduce-scatter (4/12): 5/12 exposed."""
    forward, backward = _one_layer_costs("linear", "none")
    assert forward == pytest.approx(3 / 12)
    assert backward == pytest.approx(5 / 12)


def test_deepspeed_regathers_each_linear_for_the_recomputed_forward_and_all_but_the_last_for_backward():
    """The same block under full recomputation (1 s of it): forward as before, 3/12 exposed. The
    recomputed forward regathers every linear: its q/k/v (3/12 s) runs beside the output projection's
    gather (1/12) and the previous block's q/k/v reduce-scatter (3/12), 1/12 exposed; the output
    projection (1/12 s) beside the first MLP weight's gather (4/12), 3/12. The last MLP weight's
    backward follows its recomputation and needs no gather; backward regathers the other three, and
    the output projection's 1/6 s runs beside the q/k/v gather (3/12) and the first MLP weight's
    reduce-scatter (4/12), 5/12 exposed. In all 1/12 + 3/12 + 5/12 = 9/12."""
    times = LayerTimes(forward=1.0, backward_input=1.0, backward_weight=1.0, recompute=1.0)
    kernels = Kernels(zero3_gather_unit="linear", zero3_regathers_for_recompute=True)
    forward, backward = zero3_exposed(model_spec("gpt3-175b"), times, 1.0, 1.0, "full", kernels, 1.0)
    assert forward == pytest.approx(3 / 12)
    assert backward == pytest.approx(9 / 12)


def test_deepspeed_zero3_holds_two_neighbouring_linears_where_fsdp_holds_two_blocks():
    """Gathered: the two MLP weights (8/12 of a block) against two blocks; unsharded gradients: the
    same two linears' (one reduce-scattering while the next is computed) against a block's. Two bytes
    each way: (2 − 8/12) + (1 − 8/12) = 5/3 × 2 bytes a block parameter fewer."""
    spec = model_spec("gpt3-175b")
    layout = Layout(dp=384, zero=3, recompute="full")
    linear = STACKS["deepspeed-zero3"]
    block = replace(linear, zero3_gather_unit="layer")
    saved = other_bytes(spec, layout, 4, "bf16", 0.0, block) - other_bytes(spec, layout, 4, "bf16", 0.0, linear)
    assert saved == pytest.approx(10 / 3 * layer_parameter_count(spec))


def test_narayanans_530b_zero3_runs_stay_flat_as_the_gpus_double():
    """Narayanan et al. 2021, table 2 (held out of the stack's fit): ZeRO-3 on 530B at one global batch
    took 179.9 s on 1,120 A100s and 183.7 s on 2,240. Compute halves; every GPU still moves the whole
    model each step, so the step does not."""
    spec = ModelSpec("gpt2", 105, 20480, 128, 128, 4 * 20480, 51200, 2048, tie_embeddings=True)
    workload = Workload(spec, 2240, "bf16", STACKS["deepspeed-zero3"])
    hw = hardware("a100-80gb")
    steps = [evaluate(workload, hw, gpus, Layout(dp=gpus, zero=3, recompute="full")) for gpus in (1120, 2240)]
    assert steps[0].time_breakdown["compute_s"] == pytest.approx(2 * steps[1].time_breakdown["compute_s"], rel=0.05)
    assert steps[1].step_time_s == pytest.approx(steps[0].step_time_s, rel=0.1)
    assert 179.9 * 0.85 <= steps[0].step_time_s <= 179.9 * 1.15


def test_a_stage_send_runs_on_nvlink_inside_a_node_and_on_one_adapter_between_nodes():
    """A pipeline send is one GPU's transfer: NVLink to a neighbour in the node, the sender's own
    200 Gb/s adapter to the next node (24 of 25 GB/s, as an adapter carries in a ring), never the
    node's eight adapters side by side; pp 16 over two nodes crosses at boundaries 7 and 15 only."""
    from plait.plan.comm import pipeline_link

    hw = hardware("a100-80gb")
    layout = Layout(pp=16, microbatches=16)
    crossing = [r for r in range(16) if pipeline_link(hw, layout, r).crosses_nodes]
    assert crossing == [7, 15]
    assert pipeline_link(hw, layout, 7).bandwidth / GB == pytest.approx(24, rel=0.01)
    assert pipeline_link(hw, layout, 3).bandwidth == pytest.approx(strided_link(hw, 8, 1).bandwidth)
    # with eight ranks of tp and dp inside each stage every boundary leaves the node
    assert all(pipeline_link(hw, Layout(pp=4, tp=8, microbatches=4), r).crosses_nodes for r in range(4))


def test_a_boundary_is_as_slow_as_any_rank_pair_of_it_that_leaves_the_node():
    """dp3·tp2 stages of 6 ranks on nodes of 8: ranks 0–5 send to 6–11, and 2–5 → 8–11 leave node 0."""
    from plait.plan.comm import pipeline_link

    hw = hardware("a100-80gb")
    assert pipeline_link(hw, Layout(dp=3, tp=2, pp=2, microbatches=2), 0).crosses_nodes
    assert not pipeline_link(hw, Layout(dp=2, tp=2, pp=2, microbatches=2), 0).crosses_nodes
