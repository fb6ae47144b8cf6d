"""Megatron-LM's asynchronous tensor-parallel backward: a column-parallel linear's input-gradient
all-reduce (reduce-scatter under sp) runs while its weight gradient is computed, so only what
exceeds those matmuls is exposed; plait's DTensor layers issue it on the critical path."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plait.facts.activations import FP32, residual_stream_bytes
from plait.facts.collectives import layer_collectives
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.plan.comm import all_reduce_seconds, group_link
from plait.plan.costs import column_parallel_share, layer_cost
from plait.hardware import hardware

SPEC = model_spec("gpt3-175b")
LAYOUT = Layout(tp=8)


def _backward_tp_seconds(hw, layout) -> float:
    """The backward's own all-reduces (not a recomputed forward's), as the facts list them."""
    link = group_link(hw, layout, "tp")
    return sum(call.backward * all_reduce_seconds(call.tensor_bytes, call.size, link)
               for call in layer_collectives(SPEC, LAYOUT, 1, element_bytes=2) if call.group == "tp")


@pytest.mark.parametrize("intra_gbps", [600, 5])  # NVLink, and a link so slow the matmuls cannot hide it
def test_the_megatron_backward_hides_its_all_reduces_under_the_weight_gradients(intra_gbps):
    hw = hardware("a100-80gb", intra_node_gbps=intra_gbps)
    overlapped = layer_cost(SPEC, hw, LAYOUT, 1, "bf16", STACKS["megatron"])
    serial = layer_cost(SPEC, hw, LAYOUT, 1, "bf16", replace(STACKS["megatron"], tp_backward_overlap=False))
    comm = _backward_tp_seconds(hw, LAYOUT)
    window = column_parallel_share(SPEC) * overlapped.times.backward_weight
    assert serial.comm_backward == pytest.approx(comm, rel=1e-9)
    assert overlapped.comm_backward == pytest.approx(max(0.0, comm - window), rel=1e-9, abs=1e-15)
    assert overlapped.comm_forward == serial.comm_forward  # the forward's all-reduces stay on the path


def test_plaits_own_layers_keep_the_backward_all_reduce_on_the_critical_path():
    """...in fp32 under autocast over fp32 weights: the input gradients of the linears that read the
    fp32 residual stream come back through autocast's casts in fp32."""
    hw = hardware("a100-80gb")
    plait = layer_cost(SPEC, hw, LAYOUT, 1, "bf16", STACKS["plait"])
    times = plait.times
    stream = residual_stream_bytes("bf16", LAYOUT.zero, LAYOUT.pp, STACKS["plait"])
    calls = layer_collectives(SPEC, LAYOUT, 1, element_bytes=2, stream_bytes=stream)
    assert stream == FP32 and {call.tensor_bytes for call in calls if call.input_gradient} == {SPEC.seq_len * SPEC.hidden * FP32}
    assert plait.comm_backward == pytest.approx(sum(
        call.backward * all_reduce_seconds(call.tensor_bytes, call.size, group_link(hw, LAYOUT, "tp"))
        for call in calls), rel=1e-9)
    assert times.backward_weight > 0


@pytest.mark.parametrize("stack", ["megatron-2021", "megatron-deepspeed"])
def test_megatron_before_its_async_all_reduce_and_blooms_fork_wait_for_the_backward_all_reduces(stack):
    """Megatron-LM of April 2021 (Narayanan et al.'s runs) and BLOOM's Megatron-DeepSpeed fork call
    copy_to_tensor_model_parallel_region and then F.linear: the input gradient's all-reduce runs in
    that region's backward, after the matmuls, with nothing left to hide it. Megatron-LM's later
    releases hide it under the weight gradients."""
    hw = hardware("a100-80gb", intra_node_gbps=50)  # slow enough that some stays exposed even when hidden
    waited = layer_cost(SPEC, hw, LAYOUT, 1, "bf16", STACKS[stack])
    hidden = layer_cost(SPEC, hw, LAYOUT, 1, "bf16", replace(STACKS[stack], tp_backward_overlap=True))
    comm = _backward_tp_seconds(hw, LAYOUT)
    assert waited.comm_backward == pytest.approx(comm, rel=1e-9)
    assert hidden.comm_backward < 0.8 * comm


def test_the_column_parallel_share_is_qkv_and_the_first_mlp_projection():
    """GPT: q, k, v (3h²) and the 4h MLP input (4h²) of its 12h² weights."""
    assert column_parallel_share(model_spec("gpt2")) == pytest.approx(7 / 12)
