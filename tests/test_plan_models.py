"""Compute and communication models against independent counts and textbook formulas."""

from dataclasses import replace

import pytest

from plait.facts.stack import STACKS, Kernels
from plait.layout import Layout
from plait.models.flops import layer_flops
from plait.models.spec import model_spec
from plait.plan.comm import Link, all_reduce_seconds, group_link, reduce_scatter_seconds
from plait.plan.compute import Gemm, gemm_seconds, layer_shape
from plait.plan.costs import layer_cost
from plait.hardware import CATALOG, catalog_name_of, hardware, stack_hardware
from plait.plan.scan import scan
from plait.plan.search import best_layout, search
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload
from plait.plan.space import SCANNED, scanned_layout


@pytest.mark.parametrize("name", ["gpt2", "llama-8b"])
@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (4, 1), (1, 4), (4, 2)])
def test_layer_matmuls_are_the_flop_counters_forward_split_over_tp_and_cp(name, tp, cp):
    spec = model_spec(name)
    shape = layer_shape(spec, 2, tp, cp, False, "bf16", Kernels())
    flops = sum(g.flops for g in shape.weights + shape.attention)
    assert flops * tp * cp == 2 * layer_flops(spec, spec.seq_len).forward


def test_thin_shards_run_further_from_peak():
    hw = hardware("h100-sxm")
    def rate(g):
        return g.flops / gemm_seconds(hw, "bf16", g)
    assert rate(Gemm(8192, 8192, 8192)) > rate(Gemm(8192, 8192 // 16, 8192)) > rate(Gemm(8192, 8192 // 64, 8192))
    assert rate(Gemm(8192, 8192, 8192)) <= hw.bf16_tflops * 1e12 * hw.matmul_efficiency


def test_ring_collectives_match_the_textbook_costs():
    """Patarasuk & Yuan: all-reduce 2(n−1)α + 2(n−1)/n·S/β; reduce-scatter half of it."""
    link = Link(bandwidth=100e9, latency=5e-6, crosses_nodes=False)
    size, n = 1e9, 8
    assert all_reduce_seconds(size, n, link) == pytest.approx(2 * 7 * 5e-6 + 2 * 7 / 8 * size / 100e9)
    assert reduce_scatter_seconds(size, n, link) == pytest.approx(all_reduce_seconds(size, n, link) / 2)
    assert all_reduce_seconds(size, 1, link) == 0


def test_mesh_order_keeps_tp_inside_a_node_and_sends_dp_across():
    hw = hardware("a100-80gb")
    layout = Layout(dp=4, tp=8)
    assert not group_link(hw, layout, "tp").crosses_nodes
    dp = group_link(hw, layout, "dp")
    assert dp.crosses_nodes and dp.bandwidth < group_link(hw, layout, "tp").bandwidth
    assert not group_link(hw, Layout(dp=8), "dp").crosses_nodes
    assert group_link(hw, Layout(dp=16), "dp").crosses_nodes


def _scores(fixed, model="gpt2-large"):
    workload = Workload(model_spec(model), 64)
    found = scan(workload, hardware("a100-40gb"), 16, fixed, None, keep=10_000)
    return {fields: -step for step, fields in found.best}


def test_the_dominance_rules_the_search_relies_on():
    """Without sp a layout is never faster than with it, but for the gather of learned positions'
    gradient that sp adds (under 0.1% of the step); ZeRO-1 never beats ZeRO-2 without hybrid
    sharding (with it, ZeRO-2 averages its rows across the replica groups after backward) where
    ZeRO-2 reduces once a step (one micro-batch, or on pipeline stages) over more than 2 ranks."""
    for model, slack in (("gpt2-large", 1e-3), ("llama-3b", 1e-12)):
        for tp in (2, 4):
            with_sp = _scores({"tp": tp, "sp": True, "recompute": "none"}, model)
            without = _scores({"tp": tp, "sp": False, "recompute": "none"}, model)
            for fields, step in without.items():
                twin = fields[:4] + (True,) + fields[5:]
                assert with_sp[twin] <= step * (1 + slack)
    one, two = _scores({"zero": 1, "recompute": "none"}), _scores({"zero": 2, "recompute": "none"})
    compared = 0
    for fields, step in one.items():
        layout = scanned_layout(fields)
        if layout.dp_replicate > 1 or layout.dp <= 2 or layout.microbatches > 1 and layout.pp == 1:
            continue
        twin = fields[:5] + (2,) + fields[6:]
        assert two[twin] <= step + 1e-12
        compared += 1
    assert compared >= 3


def test_zero2_pays_each_microbatchs_reduce_scatter_and_zero1_overtakes_it_over_a_slow_network():
    """plait's ZeRO-2 without stages reduce-scatters every micro-batch's gradients, each waited for at
    the end of its backward, where ZeRO-1 all-reduces once a step: on 200 Gb/s shared by a node's
    8 GPUs, at 8 micro-batches ZeRO-1 is faster and the search ranks it first; at one micro-batch
    ZeRO-2 wins and ZeRO-1 is not scored."""
    hw = hardware("a100-80gb", inter_node_gbps=3.125)
    spec = model_spec("gpt2-xl")
    exposed = {}
    for m in (1, 8):
        for zero in (1, 2):
            p = evaluate(Workload(spec, 16 * m), hw, 16, Layout(dp=16, zero=zero, microbatches=m))
            exposed[m, zero] = p.time_breakdown["exposed_dp_comm_s"]
    assert exposed[1, 2] < exposed[1, 1] < exposed[8, 2]
    assert exposed[8, 1] == pytest.approx(exposed[1, 1])  # one all-reduce a step, whatever m
    fixed = {"dp": 16, "dp_replicate": 1, "recompute": "none"}
    ranked = search(Workload(spec, 128), hw, 16, {**fixed, "microbatches": 8}, tie_break="time").ranked
    order = [p.layout.zero for p in ranked]
    assert order[0] == 1 and order.index(2) > 0
    ranked = search(Workload(spec, 16), hw, 16, {**fixed, "microbatches": 1}, tie_break="time").ranked
    assert ranked[0].layout.zero == 2 and 1 not in [p.layout.zero for p in ranked]


@pytest.mark.parametrize("model,gpu,gpus,batch", [("gpt3-175b", "a100-80gb", 256, 512),
                                                   ("llama-70b", "h100-sxm", 128, 256), ("llama-8b", "h100-sxm", 64, 64)])
def test_the_floor_on_step_time_keeps_what_scoring_every_layout_keeps(model, gpu, gpus, batch):
    """The search skips a mesh's schedules when their floor cannot be kept, or when its ranks' model
    states alone exceed the memory; it must keep the same fastest layouts, the same fastest of each
    complexity and the same fastest overall."""
    workload = Workload(model_spec(model), batch)
    hw = stack_hardware(hardware(gpu), workload.kernels)
    every = scan(workload, hw, gpus, {}, None, keep=16, bound=False)
    bounded = scan(workload, hw, gpus, {}, None, keep=16)
    assert bounded.bounded > every.scored / 10
    assert bounded.scored + bounded.bounded <= every.scored  # a schedule skipped stands for one layout or two
    assert sorted(bounded.best) == sorted(every.best)
    assert bounded.simplest == every.simplest
    assert bounded.fastest == every.fastest


@pytest.mark.parametrize("model,gpu,gpus,batch", [("llama-70b", "a100-40gb", 8, 64), ("gpt3-175b", "a100-80gb", 16, 64),
                                                   ("llama-405b", "h100-sxm", 32, 128)])
def test_the_floor_on_model_states_counts_what_weighing_every_schedule_counts(model, gpu, gpus, batch):
    """The search stops weighing a mesh's schedules where its ranks' model states and other bytes alone
    exceed the memory; where nothing fits (no floor on step time then) it must count as many layouts
    too large and name the same smallest one, the peak the planner's error reports. (Where layouts
    fit, the test above holds the kept ones equal.)"""
    workload = Workload(model_spec(model), batch)
    hw = stack_hardware(hardware(gpu), workload.kernels)
    every = scan(workload, hw, gpus, {}, None, keep=16, bound=False)
    bounded = scan(workload, hw, gpus, {}, None, keep=16)
    assert every.fitting == 0 and every.oversized > 100
    assert (bounded.oversized, bounded.scored, bounded.bounded) == (every.oversized, every.scored, 0)
    assert bounded.smallest == every.smallest


@pytest.mark.parametrize("model,batch,gpu,stack,layout", [
    ("llama-405b", 2048, "h100-sxm", "megatron", Layout(dp=128, tp=8, pp=16, sp=True, zero=3, schedule="interleaved-1f1b",
                                                       virtual_stages=2, microbatches=16)),
    ("llama-405b", 2048, "h100-sxm", "megatron", Layout(dp=64, tp=8, pp=16, sp=True, zero=1, microbatches=32)),
    ("llama-405b", 2048, "h100-sxm", "plait", Layout(dp=64, tp=8, pp=16, sp=True, zero=1, schedule="zb-h1", microbatches=32)),
    ("gpt3-175b", 1536, "a100-80gb", "megatron", Layout(dp=16, tp=8, pp=8, sp=True, zero=1, schedule="interleaved-1f1b",
                                                       virtual_stages=3, microbatches=96, recompute="selective")),
    ("llama-70b", 512, "h100-sxm", "plait", Layout(dp=8, tp=4, pp=4, sp=True, zero=2, schedule="interleaved-1f1b",
                                                   virtual_stages=5, microbatches=16)),
    ("llama-8b", 64, "h100-sxm", "plait", Layout(dp=8, zero=3, microbatches=8, recompute="selective")),
    ("llama-70b", 64, "h100-sxm", "megatron", Layout(dp=64, zero=3, recompute="full", recompute_layers=63)),
    ("llama-405b", 2048, "h100-sxm", "megatron", Layout(dp=64, tp=8, pp=16, sp=True, zero=1, microbatches=32,
                                                       recompute="full", recompute_layers=3)),
    ("llama-8b", 256, "h100-96gb", "pytorch", Layout(dp=128, zero=3, recompute="op")),
    ("llama-70b", 512, "h100-sxm", "plait", Layout(dp=8, tp=4, pp=4, sp=True, zero=2, microbatches=16, recompute="op")),
])
def test_the_search_scores_a_layout_as_the_play_predicts_it(model, batch, gpu, stack, layout):
    """The closed form the search ranks by cuts the stages as the play does (with interleaving the
    end ranks of Llama 3 405B hold 7 layers, not ⌈126 / 16⌉ = 8, and a middle rank holds the most):
    same peak memory, and the step within 3%. (On a part with memory enough for every layout here:
    the search scores only what fits.)"""
    workload = Workload(model_spec(model), batch, "bf16", STACKS[stack])
    hw = stack_hardware(hardware(gpu, memory_bytes=10**15), workload.kernels)
    found = scan(workload, hw, layout.world_size, {f: getattr(layout, f) for f in SCANNED}, None, keep=1)
    step, _, peak = found.fastest
    played = evaluate(workload, hw, layout.world_size, layout)
    assert found.scored == 1
    assert peak == pytest.approx(played.peak_memory_bytes, rel=1e-3)
    assert step == pytest.approx(played.step_time_s, rel=0.03)


@pytest.mark.parametrize("model,batch,gpu,layout", [
    # The last rank's last chunk carries the head, whose forward interleaving runs after the warm-up:
    # at most one copy held, where 29 chunks in flight over 8 chunks a rank would count three.
    ("llama-8b", 64, "h100-sxm", Layout(tp=2, cp=2, pp=4, sp=True, schedule="interleaved-1f1b", virtual_stages=8,
                                     microbatches=8, recompute="full")),
    ("llama-70b", 128, "h100-sxm", Layout(dp=2, tp=2, pp=16, sp=True, zero=3, schedule="interleaved-1f1b",
                                      virtual_stages=3, microbatches=64, recompute="full")),
    # Chunks of 2 and 3 blocks (80 over 32): the warm-up holds the first chunk more than the second.
    ("llama-70b", 128, "h100-sxm", Layout(tp=4, pp=16, sp=True, schedule="interleaved-1f1b", virtual_stages=2,
                                      microbatches=32, recompute="full")),
    # 96 blocks over 64 stages: the ranks of two blocks are the later ones, with fewer micro-batches in flight.
    ("gpt3-175b", 512, "a100-80gb", Layout(dp=2, cp=2, pp=64, zero=2, microbatches=256, recompute="op")),
    ("llama-8b", 64, "h100-sxm", Layout(dp=2, pp=8, zero=2, schedule="interleaved-1f1b", virtual_stages=2,
                                     microbatches=32, recompute="full", recompute_layers=1)),
    ("llama-70b", 128, "h100-sxm", Layout(dp=2, tp=4, pp=8, sp=True, zero=3, microbatches=64, recompute="full",
                                      recompute_layers=6)),
    # A last stage of the head alone holds no block and, under zb-h1 and gpipe, the most logits.
    ("llama-8b", 48, "h100-sxm", Layout(pp=4, schedule="zb-h1", microbatches=16, recompute="full",
                                        stage_layers=(11, 11, 10, 0))),
    ("llama-8b", 48, "h100-sxm", Layout(pp=4, schedule="gpipe", microbatches=16, recompute="full",
                                        stage_layers=(11, 11, 10, 0))),
    ("llama-8b", 48, "h100-sxm", Layout(pp=4, microbatches=16, stage_layers=(0, 11, 11, 10))),
])
def test_the_search_holds_on_each_rank_what_the_play_holds(model, batch, gpu, layout):
    """The search's peak is the play's on layouts whose ranks hold uneven chunk mixes at their peaks
    (plait.facts.in_flight.held_chunk_counts): the head's copies, uneven chunks, uneven stages, a
    stage without blocks and partial recomputation. (The closed-form step of uneven interleaved chunks is looser than 3%.)"""
    workload = Workload(model_spec(model), batch)
    hw = stack_hardware(hardware(gpu, memory_bytes=10**15), workload.kernels)
    fixed = {f: getattr(layout, f) for f in SCANNED} | {"stage_layers": layout.stage_layers}
    found = scan(workload, hw, layout.world_size, fixed, None, keep=1)
    assert found.scored == 1
    assert found.fastest[2] == pytest.approx(evaluate(workload, hw, layout.world_size, layout).peak_memory_bytes, rel=1e-6)


def test_the_search_recomputes_the_fewest_blocks_that_fit():
    """llama-70b on 64 H100 as plain FSDP at 8k tokens: keeping every block's activations needs far
    more than the 85 GB an H100 holds, recomputing every block fits with room to spare. The search recomputes the
    first N blocks, where N − 1 would not fit, and that is faster than recomputing all 80."""
    workload = Workload(model_spec("llama-70b"), 64, "bf16", STACKS["megatron"])
    hw = hardware("h100-sxm")
    sizes = {"dp": 64, "tp": 1, "cp": 1, "pp": 1}
    picked = best_layout(workload, hw, 64, sizes)
    layout = picked.layout
    assert layout.recompute == "full" and 1 < layout.recompute_layers < 80
    assert picked.fits and not evaluate(workload, hw, 64, replace(layout, recompute_layers=layout.recompute_layers - 1)).fits
    every = evaluate(workload, hw, 64, replace(layout, recompute_layers=None))
    assert every.fits and picked.step_time_s < every.step_time_s
    assert picked.peak_memory_bytes > every.peak_memory_bytes


def test_the_search_keeps_every_fixed_choice_of_the_layout():
    """What the flags fix comes back in the picked layout, recomputation included."""
    fixed = {"dp": 4, "tp": 2, "pp": 2, "cp": 1, "zero": 0, "sp": True, "recompute": "full", "schedule": "1f1b"}
    picked = best_layout(Workload(model_spec("gpt2-large"), 64), hardware("a100-40gb"), 16, fixed).layout
    assert {name: getattr(picked, name) for name in fixed} == fixed


@pytest.mark.parametrize("device_name, entry", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H800", "h800"), ("Tesla V100-SXM2-32GB", "v100"),
    ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100-PCIE-40GB", "a100-40gb"), ("AMD Instinct MI300X", "mi300x"),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_a_device_is_found_in_the_catalog_by_the_name_its_driver_gives(device_name, entry):
    assert catalog_name_of(device_name) == entry
    assert entry is None or entry in CATALOG


def test_the_planner_times_the_collectives_the_engine_issues():
    """Full recomputation under tp: plait's checkpoint reruns the forward's all-reduces but the MLP's
    closing one (2 forward, 3 backward, as measured in tests/test_tensor_context_costs.py);
    Megatron-LM reruns both (2 and 4). The planner times exactly those calls per stack (Megatron's
    asynchronous backward, which hides some of them, left out here: tests/test_plan_tp_overlap.py).
    In fp32, where every call moves one dtype (under bf16 autocast plait's backward reduces its
    input gradients in fp32: tests/test_zero_composition.py traces them)."""
    spec, hw = model_spec("gpt2-large"), hardware("a100-80gb")
    layout = Layout(tp=4, recompute="full")  # (its 20 heads split evenly: no whole wk and wv to sum)
    stacks = {"plait": STACKS["plait"], "megatron": replace(STACKS["megatron"], tp_backward_overlap=False)}
    ratios = {name: (lambda c: c.comm_backward / c.comm_forward)(layer_cost(spec, hw, layout, 2, "fp32", kernels))
              for name, kernels in stacks.items()}
    assert ratios["plait"] == pytest.approx(3 / 2) and ratios["megatron"] == pytest.approx(4 / 2)
