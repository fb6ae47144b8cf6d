"""The planner's parameters per tensor-parallel rank are what the engine's shards hold: kv-heads fewer
than tp stay whole on every rank, as do norms and row-parallel biases, and the tp ranks sum the
gradients of what they hold whole, which the planner times as plait's step moves them. Built in one
process on torch's fake backend, once for each rank."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from plait.facts.activations import residual_stream_bytes
from plait.facts.collectives import layer_collectives, norm_gradient_elements
from plait.facts.model_state import rank_layer_parameters, rank_parameters
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.flops import kv_heads_whole
from plait.models.spec import model_spec
from plait.models.transformer import Transformer
from plait.parallel.tensor import apply_tensor_parallel
from plait.plan.comm import all_reduce_seconds, group_link
from plait.hardware import hardware
from plait.plan.simulate import flush_costs
from plait.plan.workload import Workload
from plait.topology import build_topology


def local_elements(model: torch.nn.Module) -> int:
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())


@pytest.mark.parametrize("name, tp", [("tiny-llama", 2), ("tiny-llama", 4), ("tiny", 2), ("tiny", 4)])
def test_each_tensor_parallel_rank_holds_the_parameters_the_planner_counts(name, tp):
    """tiny-llama has 2 kv-heads: at tp 4 its wk and wv are whole on every rank (a quarter more
    parameters a block than an even split); tiny (GPT-2) keeps its row-parallel biases whole."""
    spec = model_spec(name)
    for rank in range(tp):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=tp)
        try:
            torch.manual_seed(0)
            model = apply_tensor_parallel(Transformer(spec), build_topology(Layout(tp=tp), torch.device("cpu")))
            assert local_elements(model) == rank_parameters(spec, spec.layers, True, True, tp)
            assert local_elements(model.layers["0"]) == rank_layer_parameters(spec, tp)
            # whole wk and wv: each backward sums their whole gradient over tp, as the facts list it
            attention = model.layers["0"].attention
            whole = local_elements(attention.wk) + local_elements(attention.wv)
            summed = [c.handed_bytes for c in layer_collectives(spec, Layout(tp=tp), 1, stream_bytes=4)
                      if (c.op, c.forward, c.backward) == ("all_reduce", 0, 1)]
            assert summed == ([4 * whole] if kv_heads_whole(spec, tp) else [])
        finally:
            dist.destroy_process_group()


def test_the_norms_under_sp_are_summed_once_a_step_and_the_planner_times_it():
    """tiny-llama at tp 4 under sp: every block's two norms and the final one have their gradients summed
    over tp after the backward, in the weights' dtype; the flush charges that all-reduce beside the
    gradient norm's scalar. (Whole wk and wv are summed in each backward, as layer_collectives lists
    them: tests/test_tensor_context_parity.py holds the traced bytes of both to these facts.)"""
    spec, hw, kernels = model_spec("tiny-llama"), hardware("h100-sxm"), STACKS["plait"]
    layout = Layout(tp=4, sp=True, zero=1)
    workload = Workload(spec, 8, "bf16", kernels)
    params = rank_parameters(spec, spec.layers, True, True, 4)
    norms = norm_gradient_elements(spec, spec.layers, True, 4, True)
    assert norms == (2 * spec.layers + 1) * spec.hidden
    stream = residual_stream_bytes("bf16", layout.zero, layout.pp, kernels)
    summed = flush_costs(workload, hw, layout, params, 40, norms).scalars
    alone = flush_costs(workload, hw, layout, params, 40, 0).scalars
    assert summed - alone == pytest.approx(all_reduce_seconds(norms * stream, 4, group_link(hw, layout, "tp")))
    assert norm_gradient_elements(spec, spec.layers, True, 4, False) == 0
