"""Groups that span nodes, as NCCL lays its rings over the network adapters, and ZeRO-3 across nodes.

Published figures: NVIDIA measures 192 GB/s all-reduce bus bandwidth on DGX A100 nodes with
8 × 200 Gb/s InfiniBand (NVIDIA/nccl issue 812) and expects 46–48 GB/s per 400 Gb/s NDR adapter
(NVIDIA/nccl-tests issue 290).
"""

from __future__ import annotations

import pytest

from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.plan.comm import all_gather_seconds, all_reduce_seconds, group_link, strided_link
from plait.plan.costs import zero3_layer_seconds
from plait.plan.hardware import hardware
from plait.plan.simulate import Workload, evaluate

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
