"""All-gather context parallelism (``--cp-algorithm all-gather``, Llama 3's): attention over gathered K/V
blocks equals one attention kernel, training under it gives the single-process losses step for step,
and the planner prices and searches it as the engine runs it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from plait.facts.collectives import layer_collectives
from plait.facts.stack import STACKS
from plait.facts.validity import fit_problems
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.models.transformer import expand_kv_heads
from plait.parallel.gathered_attention import gathered_backward, gathered_forward
from plait.parallel.ring_attention import block_attention, block_gradients, zigzag_positions
from plait.plan.comm import all_gather_seconds, group_link, reduce_scatter_seconds
from plait.plan.compute import CAUSAL_MASK_BYTES, block_score_bytes, blockwise_attention_seconds, layer_times
from plait.plan.costs import RING_STEP_KERNELS, layer_cost
from plait.hardware import hardware
from tests.cases import layout_world_size, run_config, train_losses
from tests.test_data_parallel_parity import assert_same_losses
from tests.test_ring_attention import _algorithms, assert_bf16_cp2_within_rounding

GATHER = {"cp_algorithm": "all-gather"}
LAYOUTS = [
    {"cp": 2},
    {"cp": 4, "tp": 2},  # cp 4 over 2 heads a tensor-parallel rank: beyond what the all-to-all can split
    {"cp": 2, "tp": 2, "sp": True},
    {"cp": 2, "recompute": "selective"},  # the recomputed core gathers K/V again
    {"cp": 2, "recompute": "full"},
]


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_attention_over_gathered_blocks_equals_one_causal_kernel(cp, heads, kv_heads):
    """Each rank's output and dq, and the sum over ranks of each block's dK/dV (what the reduce-scatter
    hands its holder), equal scaled_dot_product_attention over the whole sequence (fp64 reference)."""
    generator = torch.Generator().manual_seed(10 + cp)
    batch, seq, dim = 2, 24, 8
    q = torch.randn(batch, heads, seq, dim, generator=generator, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(batch, kv_heads, seq, dim, generator=generator, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    grad_out = torch.randn(batch, heads, seq, dim, generator=generator, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, *expand_kv_heads(q, k, v), is_causal=True)
    expected.backward(grad_out)

    shards = [zigzag_positions(seq, rank, cp) for rank in range(cp)]
    blocks = torch.stack([torch.stack((k.detach()[:, :, mine], v.detach()[:, :, mine])) for mine in shards])
    got = {name: torch.zeros_like(t) for name, t in (("out", q), ("q", q), ("k", k), ("v", v))}
    summed = torch.zeros(blocks.shape, dtype=torch.float32)
    for rank, mine in enumerate(shards):
        out, lse = gathered_forward(q.detach()[:, :, mine], blocks, rank)
        grad_q, grad_blocks = gathered_backward(grad_out[:, :, mine], q.detach()[:, :, mine], blocks, out, lse, rank)
        got["out"][:, :, mine], got["q"][:, :, mine] = out, grad_q
        summed += grad_blocks
    for rank, mine in enumerate(shards):
        got["k"][:, :, mine], got["v"][:, :, mine] = summed[rank, 0].double(), summed[rank, 1].double()
    torch.testing.assert_close(got["out"], expected.detach(), rtol=1e-5, atol=1e-5)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        torch.testing.assert_close(got[name], tensor.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"d{name}: {m}")


@pytest.fixture(scope="module")
def single_process(pool):
    return {model: pool.run(train_losses, 1, run_config(model))[0] for model in ("tiny", "tiny-llama")}


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "-".join(f"{k}{v}" for k, v in layout.items()))
def test_all_gather_layout_matches_single_process(pool, single_process, model, layout):
    reference = single_process[model]
    for losses in pool.run(train_losses, layout_world_size(layout), run_config(model, **layout, **GATHER)):
        assert_same_losses(reference, losses)


def test_bf16_all_gather_stays_within_bf16_rounding_of_the_single_process(pool):
    assert_bf16_cp2_within_rounding(pool, "all-gather")


def test_the_layout_names_it_and_the_fit_rule_is_the_rings():
    assert Layout(cp=2, cp_algorithm="all-gather").describe() == "cp2 (all-gather)"
    spec = model_spec("tiny-llama", seq_len=64)  # 4 heads, 2 kv-heads
    assert fit_problems(spec, Layout(tp=2, cp=4, cp_algorithm="all-gather")) == []
    assert ("all-gather context parallelism cuts the sequence into 2·cp chunks"
            in fit_problems(spec, Layout(cp=3, cp_algorithm="all-gather"))[0])
    refused = fit_problems(spec, Layout(cp=2, cp_algorithm="all-gather"), STACKS["megatron"])
    assert refused == ["this software stack runs context parallelism only as ring, not all-gather; "
                       "pass --cp-algorithm ring"]


def test_a_pin_keeps_the_all_gather():
    assert _algorithms({"cp": 4, "cp_algorithm": "all-gather"}) == {"all-gather"}


def test_the_gather_precedes_the_attention_so_nothing_hides_it():
    """First principles: the ring's hops go under the attention, the gather and the reduce-scatter
    do not; plait's gathered attention launches the ring's block kernels but no exchange per block.
    At 128k tokens the attention hides every hop, so the ring costs less."""
    spec = model_spec("llama-8b", seq_len=131072)
    hw = hardware("h100-sxm")

    def comm(layout: Layout) -> float:
        cost = layer_cost(spec, hw, layout, 1, "bf16", STACKS["plait"])
        return cost.comm_forward + cost.comm_backward
    for cp in (2, 8):
        gathered = Layout(cp=cp, cp_algorithm="all-gather")
        calls = {call.op: call for call in layer_collectives(spec, gathered, 1, 2)}
        # exposed: exactly the gather forward and the fp32 reduce-scatter backward, at the cp group's link
        link = group_link(hw, gathered, "cp")
        blocks = 3 * cp * (RING_STEP_KERNELS - 1) * hw.kernel_overhead_s  # forward, and twice in backward
        assert comm(gathered) == pytest.approx(all_gather_seconds(calls["all_gather"].tensor_bytes, cp, link)
                                               + reduce_scatter_seconds(calls["reduce_scatter"].tensor_bytes, cp, link)
                                               + blocks)
        assert comm(Layout(cp=cp, cp_algorithm="ring")) < comm(gathered)  # 128k tokens: the ring hides its hops


class ElementwiseBytes(TorchDispatchMode):
    """Bytes read and written by every op that is neither a matmul nor a view (``_unsafe_view``, how
    matmul reshapes its result, is one without the flag)."""

    SKIPPED = {torch.ops.aten.bmm.default, torch.ops.aten.mm.default, torch.ops.aten._unsafe_view.default}

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func not in self.SKIPPED and not func.is_view:
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_the_planner_counts_the_bytes_the_blockwise_kernel_moves_a_score(precision, dtype):
    """plait.plan.compute prices the ring's and the all-gather's blockwise attention by the bytes its
    elementwise ops move a score; counted here from the ops the kernel dispatches (a long block and a
    narrow head, so what scales with the output rather than the scores stays under half a byte)."""
    rows, keys, dim = 1024, 1024, 8
    q = torch.randn(1, 1, 4, rows, dim, dtype=dtype)
    k, v = (torch.randn(1, 1, 1, keys, dim, dtype=dtype) for _ in range(2))
    scores = 4 * rows * keys
    for causal in (False, True):
        with ElementwiseBytes() as forward:
            out, lse = block_attention(q, k, v, causal, dim ** -0.5)
        with ElementwiseBytes() as backward:
            block_gradients(q, k, v, torch.randn_like(q), lse, torch.randn(lse.shape), causal, dim ** -0.5)
        mask = CAUSAL_MASK_BYTES if causal else 0
        assert forward.bytes / scores == pytest.approx(block_score_bytes("forward", precision) + mask, abs=0.5)
        assert backward.bytes / scores == pytest.approx(block_score_bytes("backward", precision) + mask, abs=0.5)


def test_plaits_zigzag_attention_is_priced_as_its_blockwise_kernel_and_a_fused_stacks_is_not():
    """On plait's engine the ring and the all-gather run the blockwise kernel, whose scores go through
    memory: slower than the fused kernel the all-to-all calls. Megatron's ring runs a flash kernel."""
    spec, hw = model_spec("llama-1b", seq_len=8192), hardware("h100-sxm")
    blockwise = blockwise_attention_seconds(spec, hw, "bf16", 1, 1, 4)
    for algorithm in ("ring", "all-gather"):
        times = layer_times(spec, hw, Layout(cp=4, cp_algorithm=algorithm), 1, "bf16", STACKS["plait"])
        assert (times.attention, times.attention_backward) == pytest.approx(blockwise)
    fused = layer_times(spec, hw, Layout(cp=4), 1, "bf16", STACKS["plait"])
    assert fused.attention < blockwise[0] and fused.attention_backward < blockwise[1]
    megatron = layer_times(spec, hw, Layout(cp=4, cp_algorithm="ring"), 1, "bf16", STACKS["megatron"])
    assert megatron.attention == pytest.approx(fused.attention)


def test_the_blockwise_scale_is_read_at_the_size_of_a_ring_steps_own_block():
    """Between calibrated block sizes the scale moves on a log scale of the scores, held at the ends;
    the price reads it at heads × (s/cp)² scores."""
    spec, hw = model_spec("llama-1b", seq_len=8192), hardware("h100-sxm")
    sized = replace(hw, block_attention_points=((1e6, 1.2, 0.8), (1e8, 1.8, 1.4)))
    assert sized.block_scales(1e5) == (1.2, 0.8) and sized.block_scales(1e9) == (1.8, 1.4)
    assert sized.block_scales(1e7) == pytest.approx((1.5, 1.1))
    scores = spec.heads * (8192 // 4) ** 2  # one micro-batch, cp 4: 32 heads of 2,048 × 2,048
    forward, backward = blockwise_attention_seconds(spec, hw, "bf16", 1, 1, 4)
    scale = sized.block_scales(scores)
    assert blockwise_attention_seconds(spec, sized, "bf16", 1, 1, 4) == pytest.approx((scale[0] * forward,
                                                                                       scale[1] * backward))


def test_calibrate_s_measured_scales_reach_the_blockwise_price():
    """calibrate times plait's blockwise kernel against this model (plait.calibrate.machine.
    measure_block_attention); the planner multiplies its forward and backward by what it measured."""
    spec, hw = model_spec("llama-1b", seq_len=8192), hardware("h100-sxm")
    forward, backward = blockwise_attention_seconds(spec, hw, "bf16", 1, 1, 4)
    measured = replace(hw, block_attention_scale=1.7, block_attention_backward_scale=0.8)
    assert blockwise_attention_seconds(spec, measured, "bf16", 1, 1, 4) == pytest.approx((1.7 * forward, 0.8 * backward))
