"""Predict published large training runs and print the table of docs/VALIDATION.md.

Each case fixes what its paper states (model, GPUs, tp/pp/dp, batch, recomputation, sequence
parallelism, schedule where given) and lets the planner fill what the paper leaves out (the
micro-batch size and schedule where unstated), exactly as ``plait simulate`` does.

    PYTHONPATH=src python benchmarks/validate_published.py          # the table
    PYTHONPATH=src python benchmarks/validate_published.py --fit    # refit the stacks' constants
    PYTHONPATH=src python benchmarks/validate_published.py --plan-gains  # what plan claims over each run
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import replace

from benchmarks.deepspeed_megatron_runs import bloom, bloom_layout_search, bloom_memory, mt_nlg
from benchmarks.nemo_recipes import DGXC, nemo_dgxc
from benchmarks.published_case import EAGER, Ablation, Case, gpt
from benchmarks.zero_bubble_runs import (CHUNK_PASS_FITTED_ON, ZERO_BUBBLE, ZERO_BUBBLE_CHUNK_PASS_S, ZERO_BUBBLE_MEGATRON,
                                         chunk_pass_fitted, marginal_microbatch_seconds, unpredicted_per_extra_chunk,
                                         zero_bubble_ablations, zero_bubble_memory, zero_bubble_runs)
from plait.errors import ConfigError
from plait.facts.stack import DEEPSPEED_BF16_OPTIMIZER, STACKS, Kernels
from plait.layout import Layout
from plait.models.flops import flops_per_sequence
from plait.models.spec import ModelSpec, model_spec
from plait.plan.costs import layer_cost
from plait.plan.hardware import Hardware, device_memory, hardware
from plait.plan.search import best_layout
from plait.plan.simulate import Workload, evaluate

MEGATRON_2021 = "Narayanan et al. 2021 (arXiv 2104.04473), table 1"
KORTHIKANTI_2022 = "Korthikanti et al. 2022 (arXiv 2205.05198), tables 3 and 5"
KORTHIKANTI_TABLE_4 = "Korthikanti et al. 2022 (arXiv 2205.05198), table 4"
LLAMA_3 = "Llama 3 Herd of Models (arXiv 2407.21783), table 4"  # also on Balaji's SC'24 slide
TORCHTITAN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md, table 5"
MEGATRON_CORE = "Megatron-LM README (github.com/NVIDIA/Megatron-LM, images/model_table.png, July 2024)"


def megatron_flops(spec: ModelSpec, batch: int) -> float:
    """Narayanan et al. 2021, equation 3: FLOPs per iteration with full recomputation."""
    b, s, l, h, v = batch, spec.seq_len, spec.layers, spec.hidden, spec.vocab
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def megatron_2021() -> list[Case]:
    rows = [  # params (B), heads, hidden, layers, t, p, GPUs, batch, TFLOP/s per GPU
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
    ]
    return [equation_3_case(f"GPT {params}B", MEGATRON_2021, heads, hidden, layers, t, p, gpus, batch, tflops,
                            STACKS["megatron-2021"])
            for params, heads, hidden, layers, t, p, gpus, batch, tflops in rows]


def equation_3_case(name: str, source: str, heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int,
                    batch: int, tflops: float, kernels: Kernels) -> Case:
    """A Megatron-LM GPT run on A100s published as TFLOP/s per GPU by Narayanan's equation 3 (every
    block recomputed), the rest of the GPUs data parallel without ZeRO."""
    spec = gpt(layers, hidden, heads)
    fixed = {"tp": tp, "pp": pp, "dp": gpus // (tp * pp), "cp": 1, "zero": 0, "sp": False, "recompute": "full"}
    return Case(name, source, spec, gpus, batch, fixed, megatron_flops(spec, batch) / (tflops * 1e12 * gpus),
                kernels=kernels)


# The Megatron-LM README of January 2021 (commit 152aab3, images/cases_jan2021.png): Narayanan's
# models and layouts (model-parallel size tp·pp, tp 8 from 8 on) on a release three months older
# than theirs of April 2021, whose pipeline ran 1F1B only (no --virtual-pipeline-model-parallel-size)
# and sent each stage's boundary whole from every tensor-parallel rank (no
# --scatter-gather-tensors-in-pipeline). Its 1.7B row (137 TFLOP/s on the same layout) repeats
# April's and is counted there. Rows: params (B), heads, hidden, layers, model-parallel size, GPUs,
# batch, TFLOP/s per GPU (equation 3).
MEGATRON_JANUARY_2021 = "Megatron-LM README (github.com/NVIDIA/Megatron-LM, images/cases_jan2021.png, January 2021)"
MEGATRON_JANUARY_2021_ROWS = [
    (3.6, 32, 3072, 30, 2, 64, 512, 131), (7.5, 32, 4096, 36, 4, 128, 512, 128),
    (18.4, 48, 6144, 40, 8, 256, 1024, 127), (39.1, 64, 8192, 48, 16, 512, 1536, 128),
    (76.1, 80, 10240, 60, 32, 1024, 1792, 133), (145.6, 96, 12288, 80, 64, 1536, 2304, 136),
    (290.8, 128, 16384, 90, 144, 2160, 2430, 142), (529.6, 128, 20480, 105, 280, 2520, 2520, 152),
    (1008.0, 160, 25600, 128, 512, 3072, 3072, 154),
]
MEGATRON_JANUARY_2021_STACK = replace(STACKS["megatron-2021"], schedules=("1f1b",), pipeline_boundary_split=False)


def megatron_january_2021() -> list[Case]:
    """The README's runs of January 2021, every one held out."""
    return [equation_3_case(f"GPT {params}B, January 2021", MEGATRON_JANUARY_2021, heads, hidden, layers,
                            min(model_parallel, 8), model_parallel // min(model_parallel, 8), gpus, batch, tflops,
                            MEGATRON_JANUARY_2021_STACK)
            for params, heads, hidden, layers, model_parallel, gpus, batch, tflops in MEGATRON_JANUARY_2021_ROWS]


# The Megatron-LM README of September 2020 (commit 5281919, images/tables.tex, from which its
# cases.png, scaling-mp.png and scaling-dp.png are made): four GPT-2 models (vocabulary 51,200,
# 1,024 tokens) weak-scaled by tensor parallelism over one node, 8 sequences a step on a DGX-2 (V100)
# and 16 on a DGX A100 (40 GB, as Selene's nodes were then), and the A100 runs again under 128-way
# data parallelism (2,048 sequences). Iteration times in ms; the TFLOP/s beside them are equation
# 3's, so every block was recomputed (--checkpoint-activations). That release has no pipeline and no
# gradient accumulation (one micro-batch a step) and trains in fp16 with its local DDP, which
# all-reduces after backward.
MEGATRON_2020 = "Megatron-LM README (github.com/NVIDIA/Megatron-LM, images/tables.tex, September 2020)"
MEGATRON_2020_MODELS = {"1B": (15, 1920, 24, 1), "2B": (18, 2304, 30, 2), "4B": (24, 3072, 36, 4), "8B": (32, 4096, 42, 8)}
MEGATRON_2020_ROWS = (("v100", 1, 8, {"1B": 1121, "2B": 1093, "4B": 1238, "8B": 1407}),  # GPU, dp, batch, ms
                      ("a100-40gb", 1, 16, {"1B": 1076, "2B": 1026, "4B": 1162, "8B": 1343}),
                      ("a100-40gb", 128, 2048, {"1B": 1153, "2B": 1101, "4B": 1242, "8B": 1380}))


def megatron_2020() -> list[Case]:
    """The README's twelve runs, every one held out."""
    cases = []
    for gpu, dp, batch, step_ms in MEGATRON_2020_ROWS:
        for model, (heads, hidden, layers, tp) in MEGATRON_2020_MODELS.items():
            spec = replace(gpt(layers, hidden, heads), seq_len=1024)
            fixed = {"tp": tp, "pp": 1, "dp": dp, "cp": 1, "zero": 0, "sp": False, "recompute": "full"}
            part = "V100" if gpu == "v100" else "A100 40GB"
            cases.append(Case(f"GPT-2 {model}, {tp * dp} × {part}", MEGATRON_2020, spec, tp * dp,
                              batch, fixed, step_ms[model] / 1e3, batch // dp, gpu=gpu, kernels=STACKS["megatron-2021"]))
    return cases


# Narayanan et al. 2021, table 2 (§5.2): ZeRO-3 without model parallelism (DeepSpeed) against PTD-P
# (tensor, pipeline and data parallel) at one global batch, TFLOP/s per GPU by the paper's equation 3.
# Model (heads, hidden, layers), GPUs, batch, micro-batch, ZeRO-3's TFLOP/s; then PTD-P's model-parallel
# layout (tp, pp), GPUs and TFLOP/s (micro-batch 1). ZeRO-3's 530B run on 640 GPUs took a larger batch
# to fit, so no PTD-P row matches it, nor ZeRO-3 one PTD-P's 560 GPUs.
NARAYANAN_TABLE_2 = "Narayanan et al. 2021 (arXiv 2104.04473), table 2"
TABLE_2_MODELS = {"175B": (96, 12288, 96), "530B": (128, 20480, 105)}
TABLE_2_ZERO3 = [("175B", 384, 1536, 4, 144), ("175B", 768, 1536, 2, 88), ("175B", 1536, 1536, 1, 44),
                 ("530B", 640, 2560, 4, 138), ("530B", 1120, 2240, 2, 98), ("530B", 2240, 2240, 1, 48)]
TABLE_2_PTDP = [("175B", (8, 12), 384, 1536, 153), ("175B", (8, 12), 768, 1536, 149), ("175B", (8, 12), 1536, 1536, 141),
                ("530B", (8, 35), 560, 2240, 171), ("530B", (8, 35), 1120, 2240, 167), ("530B", (8, 35), 2240, 2240, 159)]


def deepspeed_zero3() -> tuple[list[Case], list[Case]]:
    """Table 2's ZeRO-3 runs, full recomputation assumed (as in every run of the paper): the 175B rows,
    which the deepspeed-zero3 stack's collective efficiency is fitted on, and the 530B rows, held out."""
    cases = []
    for model, gpus, batch, mbs, tflops in TABLE_2_ZERO3:
        spec = gpt(*reversed(TABLE_2_MODELS[model]))
        fixed = {"tp": 1, "pp": 1, "dp": gpus, "cp": 1, "zero": 3, "dp_replicate": 1, "sp": False, "recompute": "full"}
        step = megatron_flops(spec, batch) / (tflops * 1e12 * gpus)
        cases.append(Case(f"{model} ZeRO-3, {gpus} GPUs", NARAYANAN_TABLE_2, spec, gpus, batch, fixed, step, mbs,
                          kernels=STACKS["deepspeed-zero3"]))
    return [c for c in cases if c.name.startswith("175B")], [c for c in cases if c.name.startswith("530B")]


def ptdp_table_2() -> list[Case]:
    """Table 2's PTD-P runs on the megatron-2021 stack, held out (it takes the catalog's efficiency)."""
    cases = []
    for model, (tp, pp), gpus, batch, tflops in TABLE_2_PTDP:
        spec = gpt(*reversed(TABLE_2_MODELS[model]))
        fixed = {"tp": tp, "pp": pp, "dp": gpus // (tp * pp), "cp": 1, "zero": 0, "sp": False, "recompute": "full"}
        step = megatron_flops(spec, batch) / (tflops * 1e12 * gpus)
        cases.append(Case(f"{model} PTD-P, {gpus} GPUs", NARAYANAN_TABLE_2, spec, gpus, batch, fixed, step, 1,
                          kernels=STACKS["megatron-2021"]))
    return cases


def zero3_against_ptdp() -> list[Ablation]:
    """Table 2's pairs that ran one model and batch on one GPU count, PTD-P faster in each."""
    zero3 = {(c.name.split()[0], c.gpus): c for c in sum(deepspeed_zero3(), [])}
    return [Ablation(f"{ptdp.name.split()[0]} on {ptdp.gpus} GPUs: ZeRO-3 against PTD-P", NARAYANAN_TABLE_2,
                     (ptdp, zero3[ptdp.name.split()[0], ptdp.gpus]))
            for ptdp in ptdp_table_2() if (ptdp.name.split()[0], ptdp.gpus) in zero3]


def korthikanti_2022() -> list[Case]:
    configs = [  # name, heads, hidden, layers, p, GPUs, batch, micro-batch, v, full-recompute s, present-work s
        ("22B", 64, 6144, 48, 1, 8, 4, 4, 1, 1.42, 1.10), ("175B", 96, 12288, 96, 8, 64, 64, 1, 3, 18.13, 13.75),
        ("530B", 128, 20480, 105, 35, 280, 280, 1, 3, 49.05, 37.83), ("1T", 160, 25600, 128, 64, 512, 512, 1, 1, 94.42, 71.49),
    ]
    cases = []
    for name, heads, hidden, layers, p, gpus, batch, mbs, v, full_s, present_s in configs:
        spec = gpt(layers, hidden, heads)
        schedule = {"schedule": "interleaved-1f1b", "virtual_stages": v} if v > 1 else ({"schedule": "1f1b"} if p > 1 else {})
        base = {"tp": 8, "pp": p, "dp": 1, "cp": 1, "zero": 0, **schedule}
        cases.append(Case(f"{name} full recompute", KORTHIKANTI_2022, spec, gpus, batch, {**base, "sp": False, "recompute": "full"}, full_s, mbs))
        cases.append(Case(f"{name} sp + selective", KORTHIKANTI_2022, spec, gpus, batch, {**base, "sp": True, "recompute": "selective"}, present_s, mbs))
    spec = gpt(105, 20480, 128)
    cases.append(Case("530B sp + selective, dp 8", KORTHIKANTI_2022 + " (§6.3 text)", spec, 2240, 2240,
                      {"tp": 8, "pp": 35, "dp": 8, "cp": 1, "zero": 0, "sp": True, "recompute": "selective",
                       "schedule": "interleaved-1f1b", "virtual_stages": 3}, 39.15, 1))
    return cases


def refused_or_predicted(case: Case) -> float:
    """The predicted step, or infinity for a layout the planner refuses as not fitting: a pair holding
    one is out of order (the planner would not rank it), whichever side it is on."""
    try:
        return predict(case, case.hardware())[0]
    except ConfigError:
        return math.inf


def ordered(predicted: list[float], i: int, j: int) -> bool:
    """Whether the planner puts layout i ahead of layout j: never when it refuses either."""
    return math.isfinite(predicted[i] + predicted[j]) and predicted[i] < predicted[j]


def predict(case: Case, hw) -> tuple[float, str]:
    workload = Workload(case.spec, case.batch, "bf16", case.kernels)
    p = best_layout(workload, hw, case.gpus, case.fixed, case.micro_batch)
    return p.step_time_s, f"{p.layout.describe()}, mbs {p.micro_batch_size}"


# One transformer layer of Korthikanti's 22B model (hidden 6,144, 64 heads, 2,048 tokens, micro-batch 4,
# tp 8 on one DGX A100) forward and backward, in ms, as their table 4 times it, under five settings.
TABLE_4_LAYOUTS = (("no recomputation", Layout(tp=8), 19.6), ("sequence parallelism", Layout(tp=8, sp=True), 19.0),
                   ("full recomputation", Layout(tp=8, recompute="full"), 27.2),
                   ("selective recomputation", Layout(tp=8, recompute="selective"), 20.9),
                   ("selective + sequence parallelism", Layout(tp=8, sp=True, recompute="selective"), 20.3))


def table_4_layer_ms(hw: Hardware) -> list[float]:
    """The planner's forward + backward (+ recomputation) of table 4's layer, with its exposed
    tensor-parallel communication, in ms, each setting of ``TABLE_4_LAYOUTS``."""
    spec = gpt(48, 6144, 64)
    out = []
    for _, layout, _ in TABLE_4_LAYOUTS:
        cost = layer_cost(spec, hw, layout, 4, "bf16", EAGER)
        t = cost.times
        out.append(1e3 * (t.forward + t.backward + t.recompute + cost.comm_forward + cost.comm_backward))
    return out


def fit_catalog_efficiency() -> float:
    """The catalog's A100 matmul efficiency minimising the median |error| over table 4's five layer timings."""
    published = [ms for _, _, ms in TABLE_4_LAYOUTS]

    def cost(value: float) -> float:
        hw = replace(hardware("a100-80gb"), matmul_efficiency=value)
        return statistics.median(abs(ms / p - 1) for ms, p in zip(table_4_layer_ms(hw), published))

    return golden_section(cost, 0.4, 1.0)


def fit_efficiency(cases: list[Case]) -> float:
    """The matmul efficiency of the cases' GPU under their stack minimising the median |error| over them."""
    gpu = cases[0].gpu
    return fit_stack_figure(cases, lambda kernels, e: replace(kernels, matmul_efficiency=((gpu, e),)), 0.4, 1.0)


def fit_layer_host(cases: list[Case]) -> float:
    """The host seconds per layer forward and backward of the cases' stack minimising the median |error| over them."""
    return fit_stack_figure(cases, lambda kernels, s: replace(kernels, layer_host_s=s), 0.0, 0.05)


def fit_zero3_efficiency(cases: list[Case]) -> float:
    """The fraction of the ring's bus bandwidth the cases' ZeRO-3 collectives reach, minimising the median |error|."""
    return fit_stack_figure(cases, lambda kernels, e: replace(kernels, zero3_collective_efficiency=e), 0.02, 1.0)


def fit_chunk_pass() -> float:
    """The zero-bubble fork's cost of a pass through a chunk (Kernels.chunk_pass_s) at which what one
    more micro-batch costs the fitted model's interleaved 1F1B over its 1F1B is predicted as published."""
    def unpredicted(seconds: float) -> float:
        (_, chunks, costs), = marginal_microbatch_seconds(predicting_chunk_pass(seconds), (CHUNK_PASS_FITTED_ON,))
        return abs(unpredicted_per_extra_chunk(chunks, costs))

    return golden_section(unpredicted, 0.0, 0.005, "unpredicted per extra chunk at {value:.4g} s a pass: {cost:.2e} s")


def predicting_chunk_pass(seconds: float) -> Callable[[Case], float]:
    """The predicted step of a run with its stack's cost per chunk pass set to ``seconds``."""
    def predicted(case: Case) -> float:
        case = replace(case, kernels=replace(case.kernels, chunk_pass_s=seconds))
        return predict(case, case.hardware())[0]
    return predicted


def fit_stack_figure(cases: list[Case], setting, lo: float, hi: float) -> float:
    """The value of one stack figure (``setting(kernels, value)``) in [lo, hi] minimising the median
    |error| over ``cases``: layouts chosen once at the current value, then replayed (golden-section search)."""
    layouts = []
    for case in cases:
        workload = Workload(case.spec, case.batch, "bf16", case.kernels)
        layouts.append((workload, best_layout(workload, case.hardware(), case.gpus, case.fixed, case.micro_batch).layout))

    def cost(value: float) -> float:
        fitted = [(replace(w, kernels=setting(w.kernels, value)), layout) for w, layout in layouts]
        return statistics.median(abs(evaluate(w, c.hardware(), c.gpus, l).step_time_s / c.measured_step_s - 1)
                                 for c, (w, l) in zip(cases, fitted))

    return golden_section(cost, lo, hi)


def golden_section(cost, lo: float, hi: float,
                   report: str = "median |error| on the fitted rows at {value:.4g}: {cost:.1%}") -> float:
    """The value in [lo, hi] minimising ``cost`` (golden-section search), its cost printed by ``report``."""
    ratio = (5**0.5 - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    cost_a, cost_b = cost(a), cost(b)
    for _ in range(14):
        if cost_a < cost_b:
            hi, b, cost_b = b, a, cost_a
            a = hi - ratio * (hi - lo)
            cost_a = cost(a)
        else:
            lo, a, cost_a = a, b, cost_b
            b = lo + ratio * (hi - lo)
            cost_b = cost(b)
    best = (lo + hi) / 2
    print(report.format(value=best, cost=cost(best)))
    return best


# Meta's stack as the Llama 3 paper describes it: Megatron-LM's kernels, its own context parallelism.
LLAMA_3_STACK = replace(STACKS["megatron"], cp_algorithms=("all-gather",))


def llama_3() -> list[Case]:
    """405B pre-training on H100: 16M tokens per batch (2048 × 8192, or 128 × 131,072 under cp16); step
    time from plait's FLOP count. Its context parallelism all-gathers K and V and then attends the local
    queries (the paper's §3.3.2: not a ring, the gather not overlapped), plait's ``all-gather``."""
    spec = model_spec("llama-405b")
    cases = []
    for gpus, dp, cp, tflops in ((8192, 64, 1, 430), (16384, 128, 1, 400), (16384, 8, 16, 380)):
        run = spec if cp == 1 else replace(spec, seq_len=131072)
        batch = 2**24 // run.seq_len
        step = batch * flops_per_sequence(run).model / (tflops * 1e12 * gpus)
        fixed = {"tp": 8, "cp": cp, "pp": 16, "dp": dp}
        cases.append(Case(f"Llama 3 405B, dp {dp}" + (f", cp {cp} at 128k" if cp > 1 else ""), LLAMA_3, run, gpus, batch,
                          fixed, step, gpu="h100-sxm", kernels=LLAMA_3_STACK))
    return cases


def megatron_core_weak_scaling() -> tuple[list[Case], list[Case]]:
    """The README's weak-scaling table (Megatron-Core r0.8.0 on H100, vocabulary 131,072, 4,096 tokens):
    every other row fitted on, the rest held out. Step time from the table's per-GPU TFLOP/s with the
    FLOP count of that release (``megatron_core_flops``). The README states neither the precision (the
    MFU column is the TFLOP/s over the bf16 dense peak: 408.8 / 989 = 41%), the micro-batch size, the
    recomputation nor the virtual stages: the planner fills them; sequence parallelism and the
    distributed optimizer (ZeRO-1) as its listed --tp-comm-overlap and --overlap-param-gather need."""
    rows = [  # name, heads, hidden, layers, tp, pp, dp, GPUs, batch, TFLOP/s per GPU
        ("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8), ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9),
        ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1), ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6),
        ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7), ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5),
        ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8), ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4),
        ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9),
    ]
    cases = [megatron_core_case(f"GPT {name} (weak scaling)", heads, hidden, layers, tp, pp, dp, batch, tflops)
             for name, heads, hidden, layers, tp, pp, dp, _, batch, tflops in rows]
    return cases[0::2], cases[1::2]


def megatron_core_strong_scaling() -> list[Case]:
    """The README's strong scaling of its 177B model (tp8, pp6) at 1,152 sequences: MFU 47% on 96 GPUs and
    42% on 4,608 (MFU over the bf16 dense peak, as its table; rounded to a point, so ±1% in the step)."""
    return [megatron_core_case(f"GPT 177B (strong scaling), {8 * 6 * dp} GPUs", 96, 12288, 96, 8, 6, dp, 1152,
                               mfu * hardware("h100-sxm").bf16_tflops, note=" (strong scaling text)")
            for dp, mfu in ((2, 0.47), (96, 0.42))]


def megatron_core_case(name: str, heads: int, hidden: int, layers: int, tp: int, pp: int, dp: int, batch: int,
                       tflops: float, note: str = "") -> Case:
    # Untied embeddings: 12·l·h² plus two 131,072 × h matrices gives the table's sizes (1.7B, 7.1B, 16B, ...).
    spec = ModelSpec("gpt2", layers, hidden, heads, heads, 4 * hidden, 131072, 4096, tie_embeddings=False)
    step = megatron_core_flops(spec, batch) / (tflops * 1e12 * tp * pp * dp)
    fixed = {"tp": tp, "pp": pp, "dp": dp, "cp": 1, "zero": 1 if dp > 1 else 0, "dp_replicate": 1, "sp": tp > 1}
    return Case(name, MEGATRON_CORE + note, spec, tp * pp * dp, batch, fixed, step, gpu="h100-sxm",
                kernels=STACKS["megatron-core"])


def megatron_core_flops(spec: ModelSpec, batch: int) -> float:
    """num_floating_point_operations of Megatron-Core r0.8.0 (megatron/training/training.py) for a GPT
    without grouped queries or gated MLP: 12·B·s·l·h²·((2 + s/h) + f/h + V/(2lh)), attention whole."""
    b, s, l, h, f, v = batch, spec.seq_len, spec.layers, spec.hidden, spec.ffn_hidden, spec.vocab
    return 12 * b * s * l * h * h * ((2 + s / h) + f / h + v / (2 * l * h))


def torchtitan_runs() -> tuple[list[Case], list[Case]]:
    """torchtitan's bf16 runs under torch.compile on Grand Teton H100s (96 GB HBM2e, 500 W), 8,192 tokens:
    Llama 3.1 8B on FSDP (benchmarks/llama3_h100_202412_torchtitan.md, tables 1 and 3, selective
    checkpointing) and 70B and 8B on FSDP + TP (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md,
    bf16 rows with vanilla TP; the 8B with per-op SAC). Its selective checkpointing is per operation (it
    keeps every other matmul's output): plait's ``op``. Fitted on the first two, the other two held out."""
    rows = [  # model, GPUs, dp, tp, local batch, recompute, tokens/s/GPU, source
        ("llama-8b", 8, 8, 1, 2, "op", 6667, "llama3_h100_202412_torchtitan.md, table 1"),
        ("llama-70b", 256, 32, 8, 16, "full", 597.3, "asyncTP_llama3_h100_2025-06_torchtitan.md"),
        ("llama-8b", 128, 128, 1, 2, "op", 6514, "llama3_h100_202412_torchtitan.md, table 3"),
        ("llama-8b", 64, 8, 8, 12, "op", 4378, "asyncTP_llama3_h100_2025-06_torchtitan.md"),
    ]
    cases = [torchtitan_case(model, gpus, dp, tp, local, recompute, tokens_per_s, source, STACKS["pytorch"])
             for model, gpus, dp, tp, local, recompute, tokens_per_s, source in rows]
    # The same tables' runs without torch.compile: one eager kernel per elementwise op (--unfused).
    eager = replace(STACKS["pytorch"], fused=False)
    cases += [torchtitan_case("llama-8b", gpus, gpus, 1, 2, "op", tokens_per_s, f"llama3_h100_202412_torchtitan.md, "
                              f"table {table}", eager, " eager") for gpus, tokens_per_s, table in ((8, 5762, 1), (128, 5605, 3))]
    return cases[:2], cases[2:]


# MosaicML's llm-foundry benchmark tables: MPT models under PyTorch FSDP (FULL_SHARD, bf16) on A100
# nodes with 1,600 Gb/s between them (8 × 200 Gb/s). Every row of a model of 1B parameters or more
# that ran Composer's PURE mixed precision (bf16 gathers and reduce-scatters): the A100 40 GB table
# whole, one node or more, and the A100 80 GB table's rows on two nodes or more (its one-node rows
# ran DEFAULT, whose gather and reduction dtypes changed between Composer releases, and the table
# does not say which release); the H100 table states no network between nodes and is left out. MPT's shapes are the llm-foundry yamls' (layers, hidden, heads;
# MLP 4×, vocabulary 50,368, tied, learned positions as long as the sequence, which the tables'
# parameter counts show); MPT has no biases, which the gpt2 family counts (under 0.2% of the
# parameters). Rows on two nodes or more: model, GPUs, GPU, micro-batch, global batch, tokens per
# second per GPU, activation checkpointing (whole blocks), all at 2,048 tokens; rows on one node of
# 40 GB A100s: model, tokens, micro-batch, global batch, tokens per second per GPU, checkpointing.
LLM_FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"
MPT_SHAPES = {"70b": (80, 8192, 64), "30b": (48, 7168, 56), "13b": (40, 5120, 40), "7b": (32, 4096, 32),
              "3b": (32, 2560, 20), "1b": (24, 2048, 16)}
LLM_FOUNDRY_ROWS = [
    ("70b", 64, "a100-80gb", 8, 2048, 410, True), ("70b", 32, "a100-80gb", 2, 1024, 373, True),
    ("70b", 128, "a100-40gb", 4, 512, 376, True), ("70b", 64, "a100-40gb", 2, 128, 276, True),
    ("30b", 128, "a100-40gb", 6, 768, 865, True), ("30b", 32, "a100-40gb", 4, 128, 857, True),
    ("13b", 128, "a100-40gb", 16, 2048, 1972, True), ("13b", 64, "a100-40gb", 16, 1024, 1976, True),
    ("13b", 32, "a100-40gb", 14, 448, 1998, True), ("13b", 16, "a100-40gb", 10, 160, 1993, True),
    ("7b", 128, "a100-40gb", 18, 2304, 3623, True), ("7b", 64, "a100-40gb", 18, 1152, 3665, True),
    ("7b", 32, "a100-40gb", 18, 576, 3725, True), ("7b", 16, "a100-40gb", 16, 256, 3645, True),
    ("3b", 128, "a100-40gb", 6, 768, 9538, False), ("3b", 64, "a100-40gb", 6, 384, 9736, False),
    ("3b", 32, "a100-40gb", 6, 192, 9914, False), ("3b", 16, "a100-40gb", 5, 80, 9750, False),
    ("1b", 128, "a100-40gb", 10, 1280, 18647, False), ("1b", 64, "a100-40gb", 10, 640, 19001, False),
    ("1b", 32, "a100-40gb", 10, 320, 15555, False), ("1b", 16, "a100-40gb", 8, 128, 19085, False),
]
LLM_FOUNDRY_ONE_NODE_ROWS = [
    ("13b", 8192, 1, 128, 1407, True), ("13b", 4096, 2, 256, 1603, True), ("13b", 2048, 4, 512, 1668, True),
    ("13b", 1024, 8, 1024, 1727, True), ("13b", 512, 16, 2048, 1763, True),
    ("7b", 16384, 1, 32, 2249, True), ("7b", 8192, 3, 96, 2887, True), ("7b", 4096, 6, 192, 3366, True),
    ("7b", 2048, 12, 384, 3679, True), ("7b", 1024, 24, 768, 3854, True), ("7b", 512, 48, 1536, 3895, True),
    ("3b", 32768, 1, 32, 2955, True), ("3b", 16384, 2, 128, 4465, True), ("3b", 8192, 1, 64, 7149, False),
    ("3b", 4096, 2, 128, 8777, False), ("3b", 2048, 5, 320, 10065, False), ("3b", 1024, 10, 640, 10731, False),
    ("3b", 512, 20, 1280, 11324, False),
    ("1b", 32768, 1, 32, 5095, True), ("1b", 16384, 1, 64, 9715, False), ("1b", 8192, 2, 128, 13474, False),
    ("1b", 4096, 4, 256, 16856, False), ("1b", 2048, 8, 512, 19271, False), ("1b", 1024, 16, 1024, 20959, False),
    ("1b", 512, 32, 2048, 21782, False),
]


def llm_foundry_runs() -> list[Case]:
    """The llm-foundry rows above, every one held out (the llm-foundry stack has no figure of its own)."""
    rows = [(model, 2048, gpus, gpu, "", *rest) for model, gpus, gpu, *rest in LLM_FOUNDRY_ROWS]
    rows += [(model, tokens, 8, "a100-40gb", f", {tokens} tokens", *rest)
             for model, tokens, *rest in LLM_FOUNDRY_ONE_NODE_ROWS]
    cases = []
    for model, tokens, gpus, gpu, suffix, mbs, batch, tokens_per_s, checkpointing in rows:
        layers, hidden, heads = MPT_SHAPES[model]
        spec = ModelSpec("gpt2", layers, hidden, heads, heads, 4 * hidden, 50368, tokens, tie_embeddings=True)
        fixed = {"tp": 1, "pp": 1, "dp": gpus, "cp": 1, "zero": 3, "dp_replicate": 1, "sp": False,
                 "recompute": "full" if checkpointing else "none"}
        name = f"MPT {model} FSDP{gpus}, {gpu.removeprefix('a100-')}{suffix}"
        cases.append(Case(name, LLM_FOUNDRY, spec, gpus, batch, fixed, batch * tokens / (tokens_per_s * gpus), mbs,
                          gpu=gpu, kernels=STACKS["llm-foundry"]))
    return cases


# torchtitan's first published numbers (docs/performance.md): FSDP2 on 64 A100 80GB, Llama 3 8B and
# 70B and Llama 2 13B and 70B at one to two sequences a GPU, under its activation checkpointing modes: "selective layer" checkpoints every
# second block (its configs' selective_ac_option "2": plait's full recomputation of half the blocks),
# "selective op" is plait's op, "full" every block. torch.compile was off in that release's
# configs, so the stack is pytorch with eager elementwise kernels. Llama 2's shapes are Meta's
# (4,096 tokens, vocabulary 32,000, 70B with 8 K/V heads). Rows: model, sequences a GPU, recomputation,
# tokens per second per GPU.
TORCHTITAN_A100 = "torchtitan docs/performance.md"
LLAMA_2 = {"13B": ModelSpec("llama", 40, 5120, 40, 40, 13824, 32000, 4096, tie_embeddings=False),
           "70B": ModelSpec("llama", 80, 8192, 64, 8, 28672, 32000, 4096, tie_embeddings=False)}
TORCHTITAN_A100_ROWS = [("Llama 3 8B", 1, "half", 2904), ("Llama 3 8B", 1, "op", 2973), ("Llama 3 70B", 1, "full", 331),
                        ("Llama 2 13B", 2, "none", 2162), ("Llama 2 13B", 2, "half", 1914), ("Llama 2 13B", 2, "op", 1904),
                        ("Llama 2 70B", 1, "op", 355), ("Llama 2 70B", 2, "full", 353)]


def torchtitan_a100() -> list[Case]:
    """torchtitan's FSDP2 rows on 64 A100s, all held out."""
    cases = []
    for model, local, recompute, tokens_per_s in TORCHTITAN_A100_ROWS:
        spec = model_spec(f"llama-{model.split()[-1].lower()}") if model.startswith("Llama 3") else LLAMA_2[model.split()[-1]]
        modes = {"half": {"recompute": "full", "recompute_layers": spec.layers // 2}, "none": {"recompute": "none"},
                 "op": {"recompute": "op"}, "full": {"recompute": "full"}}
        fixed = {"dp": 64, "tp": 1, "pp": 1, "cp": 1, "zero": 3, "dp_replicate": 1, "sp": False, **modes[recompute]}
        label = {"half": "every second block", "none": "no recomputation", "op": "op-level", "full": "every block"}
        cases.append(Case(f"{model} FSDP64 A100, {label[recompute]}", TORCHTITAN_A100, spec, 64, 64 * local, fixed,
                          64 * local * spec.seq_len / (tokens_per_s * 64), local, gpu="a100-80gb",
                          kernels=replace(STACKS["pytorch"], fused=False)))
    return cases


def torchtitan_a100_recomputation() -> list[Ablation]:
    """The rows above, each model's recomputation modes against each other (per sequence)."""
    by_model: dict[str, list[Case]] = {}
    for case in torchtitan_a100():
        by_model.setdefault(case.name.split(" FSDP")[0], []).append(case)
    return [Ablation(f"{model} on 64 A100s: activation checkpointing", TORCHTITAN_A100,
                     tuple(sorted(cases, key=lambda c: c.measured_step_s / c.batch)))
            for model, cases in by_model.items() if len(cases) > 1]


def torchtitan_case(model: str, gpus: int, dp: int, tp: int, local: int, recompute: str, tokens_per_s: float,
                    source: str, kernels: Kernels, label: str = "") -> Case:
    spec, batch = model_spec(model), dp * local
    fixed = {"dp": dp, "tp": tp, "pp": 1, "cp": 1, "zero": 3, "sp": tp > 1, "recompute": recompute}
    name = f"{model} FSDP{dp}" + (f"·TP{tp}" if tp > 1 else "") + label
    return Case(name, f"torchtitan benchmarks/{source}", spec, gpus, batch, fixed,
                batch * spec.seq_len / (tokens_per_s * gpus), gpu="h100-96gb", kernels=kernels)


# torchtitan's async TP rows (bf16) beside its vanilla TP ones: model, GPUs, FSDP degree, local batch,
# recomputation, tokens/s/GPU vanilla and async (asyncTP_llama3_h100_2025-06_torchtitan.md).
ASYNC_TP_SOURCE = "asyncTP_llama3_h100_2025-06_torchtitan.md"
ASYNC_TP_ROWS = (("llama-70b", 256, 32, 16, "full", 597.3, 652.4), ("llama-8b", 64, 8, 12, "op", 4378, 4809.4))
ASYNC_TP = replace(STACKS["pytorch"], tp_comm_overlap="micro-pipeline")


def async_tp_runs() -> list[Case]:
    """The async TP runs, held out: torch's micro-pipeline pass over the vanilla rows' layouts."""
    return [torchtitan_case(model, gpus, dp, 8, local, recompute, asynchronous, ASYNC_TP_SOURCE, ASYNC_TP, " async TP")
            for model, gpus, dp, local, recompute, _, asynchronous in ASYNC_TP_ROWS]


def async_tensor_parallel() -> list[Ablation]:
    """torchtitan's async TP against its vanilla TP (bf16 rows): the same layouts, the tensor-parallel
    collectives fused into the matmuls where torch's pass can (``Kernels.tp_comm_overlap``)."""
    return [Ablation(f"{model}: async TP against vanilla TP", f"torchtitan benchmarks/{ASYNC_TP_SOURCE}",
                     (fused, torchtitan_case(model, gpus, dp, 8, local, recompute, vanilla, ASYNC_TP_SOURCE,
                                             STACKS["pytorch"])))
            for (model, gpus, dp, local, recompute, vanilla, _), fused in zip(ASYNC_TP_ROWS, async_tp_runs())]


def torchtitan_compilation() -> list[Ablation]:
    """torchtitan's tables 1 and 3 (llama3_h100_202412_torchtitan.md): Llama 3.1 8B under FSDP on 8 and
    on 128 H100s, with torch.compile (fused elementwise kernels) and without (plait's --unfused)."""
    runs = {case.name: case for case in sum(torchtitan_runs(), [])}
    pairs = [(runs[f"llama-8b FSDP{gpus}"], runs[f"llama-8b FSDP{gpus} eager"]) for gpus in (8, 128)]
    return [Ablation(f"Llama 3.1 8B on {compiled.gpus} H100s: torch.compile against eager", compiled.source,
                     (compiled, eager)) for compiled, eager in pairs]


def ablations() -> list[Ablation]:
    korthikanti = korthikanti_2022()
    pairs = [Ablation(f"{full.name.split()[0]}: full recomputation against sp + selective", KORTHIKANTI_2022,
                      (selective, full)) for full, selective in zip(korthikanti[0:8:2], korthikanti[1:8:2])]
    return (pairs + [torchtitan_schedules()] + torchtitan_compilation() + async_tensor_parallel() + zero3_against_ptdp()
            + torchtitan_a100_recomputation() + bloom_layout_search() + zero_bubble_ablations())


def torchtitan_schedules() -> Ablation:
    """torchtitan's table 5 (benchmarks/llama3_h100_202412_torchtitan.md): Llama 3.1 405B on 512 H100
    (FSDP 8, TP 8, PP 8), local batch 32, global batch 256, full recomputation; 1F1B 100 tokens/s/GPU,
    interleaved 1F1B 128. Its matmuls ran in float8, so only the order is compared. The H100s were
    96 GB HBM2e parts at 2.4 TB/s."""
    spec = model_spec("llama-405b")
    base = {"tp": 8, "pp": 8, "dp": 8, "cp": 1, "zero": 3, "recompute": "full"}
    cases = []
    for schedule, tokens_per_s in (("interleaved-1f1b", 128), ("1f1b", 100)):
        step = 256 * spec.seq_len / (tokens_per_s * 512)
        cases.append(Case(f"405B {schedule}", TORCHTITAN, spec, 512, 256, {**base, "schedule": schedule}, step,
                          gpu="h100-sxm", kernels=STACKS["megatron-core"],
                          hardware_overrides=(("memory_bytes", device_memory(96)), ("memory_gbps", 2400))))
    return Ablation("Llama 3.1 405B: interleaved 1F1B against 1F1B", TORCHTITAN, tuple(cases))


# How far two published timings of one layout lie apart in BLOOM's prequel, which warns that its
# second-iteration snapshots "can fluctuate a bit": "tweaking TP" lists dp8·tp4·pp12 at micro-batch 2
# at 110.48 and 113.54 s, and its one-node "max possible TFLOPs check" one layout at 130.43 and
# 119.19 s. Pairs closer than the wider of the two may be ordered by chance.
REPEAT_SPREAD = 130.43 / 119.19 - 1


def print_ablations() -> None:
    """Each ablation's layouts by time per sequence (its tables vary the global batch), published and
    predicted, and the pairs the planner orders as published."""
    print("\n| ablation | published order (fastest first) | published step (s) | predicted step (s) | pairs in order "
          "| source |")
    print("| --- | --- | --- | --- | ---: | --- |")
    # megatron-deepspeed's layer_host_s came from BLOOM's first table, deepspeed-zero3's collective
    # efficiency from the 175B ZeRO-3 runs, the zero-bubble fork's cost per chunk pass from one model's
    # runs, pytorch's efficiency from a set holding the compiled 8B run on 8 GPUs
    fitted_runs = {case.name for case in published_runs()[0]}
    fitted_on = ({bloom_layout_search()[0].name} | {a.name for a in zero3_against_ptdp() if a.name.startswith("175B")}
                 | {a.name for a in zero_bubble_ablations() if chunk_pass_fitted(a.name)}
                 | {a.name for a in torchtitan_compilation() if any(c.name in fitted_runs for c in a.fastest_first)})
    right = total = held_right = held_total = apart_right = apart_total = 0
    for ablation in ablations():
        steps = [refused_or_predicted(case) for case in ablation.fastest_first]
        per_sequence = [step / case.batch for step, case in zip(steps, ablation.fastest_first)]
        published_per_sequence = [case.measured_step_s / case.batch for case in ablation.fastest_first]
        pairs = published_pairs(ablation)
        in_order = sum(ordered(per_sequence, i, j) for i, j in pairs)
        right, total = right + in_order, total + len(pairs)
        apart = [(i, j) for i, j in pairs if published_per_sequence[j] > published_per_sequence[i] * (1 + REPEAT_SPREAD)]
        apart_right += sum(ordered(per_sequence, i, j) for i, j in apart)
        apart_total += len(apart)
        if ablation.name not in fitted_on:
            held_right, held_total = held_right + in_order, held_total + len(pairs)
        published = " / ".join(f"{c.measured_step_s:.3g}" for c in ablation.fastest_first)
        print(f"| {ablation.name} | {' < '.join(c.name for c in ablation.fastest_first)} | {published} | "
              f"{' / '.join(f'{step:.3g}' if math.isfinite(step) else 'refused' for step in steps)} | {in_order}/{len(pairs)} | "
              f"{ablation.source} |")
    print(f"\nablations: {right} of {total} pairs in the published order ({right / total:.0%}) over "
          f"{len(ablations())} ablations; held out (all but {', '.join(sorted(fitted_on))}): {held_right} of {held_total} "
          f"({held_right / held_total:.0%})")
    print(f"pairs published more than {REPEAT_SPREAD:.1%} apart (two published timings of one layout differ by that much): "
          f"{apart_right} of {apart_total} in the published order ({apart_right / apart_total:.0%})")


def published_pairs(ablation: Ablation) -> list[tuple[int, int]]:
    """The pairs (i, j) of an ablation's layouts whose order was published, i faster per sequence
    (its tables vary the global batch); a pair published at the same time has no order to get right."""
    per_sequence = [case.measured_step_s / case.batch for case in ablation.fastest_first]
    return [(i, j) for i in range(len(per_sequence)) for j in range(i + 1, len(per_sequence))
            if per_sequence[i] < per_sequence[j]]


def published_runs() -> tuple[list[Case], list[Case]]:
    """(the runs a stack figure was fitted on, the runs held out from every fit)."""
    core_fit, core_held = megatron_core_weak_scaling()
    titan_fit, titan_held = torchtitan_runs()
    zero3_fit, zero3_held = deepspeed_zero3()
    nemo_fit, nemo_held = nemo_dgxc()
    zb_fit, zb_held = zero_bubble_runs()
    return (core_fit + titan_fit + zero3_fit + nemo_fit + zb_fit,
            megatron_2021() + megatron_january_2021() + korthikanti_2022() + megatron_2020() + bloom() + llama_3()
            + core_held + megatron_core_strong_scaling() + titan_held + async_tp_runs() + ptdp_table_2() + zero3_held + llm_foundry_runs() + torchtitan_a100() + mt_nlg()
            + nemo_held + zb_held)


def fit_all() -> None:
    """Refit every stack figure on its runs and print it (the values live in plait.facts.stack)."""
    print(f"fitted the catalog's a100-80gb matmul_efficiency on {KORTHIKANTI_TABLE_4}: {fit_catalog_efficiency():.3f}")
    fits = {"megatron-core, h100-sxm": megatron_core_weak_scaling()[0], "pytorch, h100-96gb": torchtitan_runs()[0],
            "nemo, h100-sxm": nemo_dgxc()[0]}
    for name, cases in fits.items():
        print(f"fitted {name} matmul_efficiency on {cases[0].source}: {fit_efficiency(cases):.3f}")
    print(f"megatron-2021 takes the catalog's: fitted on {MEGATRON_2021} it would be "
          f"{fit_efficiency(megatron_2021()):.3f}")
    contenders = bloom_layout_search()[0]
    print(f"fitted megatron-deepspeed layer_host_s on {contenders.source}: "
          f"{fit_layer_host(list(contenders.fastest_first)):.4f}")
    print(f"fitted deepspeed-zero3 zero3_collective_efficiency on {NARAYANAN_TABLE_2}, 175B: "
          f"{fit_zero3_efficiency(deepspeed_zero3()[0]):.3f}")
    print(f"fitted the zero-bubble fork's chunk_pass_s on {ZERO_BUBBLE}, {CHUNK_PASS_FITTED_ON}: "
          f"{1e3 * fit_chunk_pass():.2f} ms")


def print_plan_gains() -> None:
    """What ``plait plan`` claims over each published layout: the same model, GPUs, batch and stack
    with the layout left to the search, against the published layout pinned (both predicted)."""
    print("| run | published layout, predicted (s) | plan's pick | predicted (s) | claimed gain |")
    print("| --- | ---: | --- | ---: | ---: |")
    gains, cases = [], []
    for case in sum(published_runs(), []):
        try:
            pinned = predict(case, case.hardware())[0]
        except ConfigError:  # refused as not fitting: nothing to compare
            continue
        free = best_layout(Workload(case.spec, case.batch, "bf16", case.kernels), case.hardware(), case.gpus, {}, None)
        gains.append(pinned / free.step_time_s - 1)
        cases.append(case)
        print(f"| {case.name} | {pinned:.3g} | {free.layout.describe()}, mbs {free.micro_batch_size} | "
              f"{free.step_time_s:.3g} | {gains[-1]:+.1%} |")
    # (the zero-bubble paper's pure pipelines compare schedules, and the 2020 README's runs weak-scale
    # tensor parallelism on a release without pipelines or gradient accumulation, which plan's picks
    # use: neither set holds layouts chosen to train fast)
    groups = [", the zero-bubble paper's" if case.kernels == ZERO_BUBBLE_MEGATRON else
              ", the 2020 README's" if case.source == MEGATRON_2020 else ", the rest" for case in cases]
    subsets = {label: [g for g, group in zip(gains, groups) if group == label] for label in dict.fromkeys(groups)}
    for label, subset in {"": gains, **subsets}.items():
        print(f"\nplan's claimed gain over the published layouts{label}: median {statistics.median(subset):.1%} over "
              f"{len(subset)} runs, from {min(subset):+.1%} to {max(subset):+.1%}; over 5% on {sum(g > 0.05 for g in subset)}")


def main() -> None:
    if "--fit" in sys.argv:
        fit_all()
        return
    if "--plan-gains" in sys.argv:
        print_plan_gains()
        return
    fitted, held_out = published_runs()
    fitted_on = {"megatron-core": f"five rows of {MEGATRON_CORE}", "pytorch": f"two rows of {TORCHTITAN.split(',')[0]}",
                 "nemo": f"three Llama 3.1 rows of {DGXC}"}
    stacks = "; ".join(f"{name} on {gpu} {value} (fitted on {fitted_on[name]})"
                       for name, kernels in STACKS.items() for gpu, value in kernels.matmul_efficiency)
    print(f"matmul_efficiency: the catalog's {hardware('a100-80gb').matmul_efficiency} (fitted on {KORTHIKANTI_TABLE_4}); "
          f"{stacks}; every other stack and GPU the catalog's\n")
    print_table_4()
    print("| run | GPUs | stack | layout used | published step (s) | predicted (s) | error | source |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | --- |")
    errors: dict[str, list[float]] = {"fitted on": [], "held out": [], "held out, H100": [],
                                      "held out, the zero-bubble paper": []}
    refused = []
    for group, cases in (("fitted on", fitted), ("held out", held_out)):
        for case in cases:
            try:
                step, used = predict(case, case.hardware())
            except ConfigError as error:  # a run the planner says does not fit: a memory miss
                refused.append(case.name)
                print(f"| {case.name} | {case.gpus} | {stack_of(case)} | refused: {str(error).split(';')[0]} | "
                      f"{case.measured_step_s:.3g} | — | — | {case.source} |")
                continue
            error = step / case.measured_step_s - 1
            errors[group].append(abs(error))
            if group == "held out" and case.gpu.startswith("h100"):  # the SXM and the 96 GB Grand Teton part
                errors["held out, H100"].append(abs(error))
            if group == "held out" and case.kernels == ZERO_BUBBLE_MEGATRON:
                errors["held out, the zero-bubble paper"].append(abs(error))
            print(f"| {case.name} | {case.gpus} | {stack_of(case)} | {used} | {case.measured_step_s:.3g} | {step:.3g} "
                  f"| {error:+.1%} | {case.source} |")
    every = errors["fitted on"] + errors["held out"]
    for group, values in errors.items():
        print(f"\n{group}: median |error| {statistics.median(values):.1%} over {len(values)} runs, worst {max(values):.1%}")
    print(f"all: median |error| {statistics.median(every):.1%} over {len(every)} runs, worst {max(every):.1%}")
    print(f"refused as not fitting though they ran: {len(refused)} ({', '.join(refused)})")
    print_ablations()
    print_fsdp_bandwidth_bound()
    print_zero_bubble_memory()
    print_zero_bubble_marginal_costs()
    print_chunk_pass_effect()
    print_bloom_memory()
    print_bloom_head_alignment()


# The FSDP runs whose per-layer gathers would show at a fraction of the ring's bandwidth: many
# micro-batches each regathering 70B (MPT on 32 GPUs) or one sequence a GPU (Llama 2 70B on 64);
# and the slow MPT-70B row on 64 GPUs of 40 GB, at which fraction it would fit.
FSDP_BANDWIDTH_WITNESSES = ("MPT 70b FSDP32, 80gb", "Llama 2 70B FSDP64 A100, op-level", "MPT 70b FSDP64, 40gb")


def print_fsdp_bandwidth_bound() -> None:
    """Those runs' errors were FSDP's gathers and reduce-scatters to reach only a fraction of the bus
    bandwidth NCCL's rings give (``Kernels.zero3_collective_efficiency``)."""
    cases = {c.name: c for c in llm_foundry_runs() + torchtitan_a100()}
    witnesses = [cases[name] for name in FSDP_BANDWIDTH_WITNESSES]
    print("\n| fraction of the ring's bandwidth | " + " | ".join(c.name for c in witnesses) + " |")
    print("| ---: |" + " ---: |" * len(witnesses))
    for fraction in (1.0, 0.25, 0.2, 0.18):
        errors = []
        for case in witnesses:
            slowed = replace(case, kernels=replace(case.kernels, zero3_collective_efficiency=fraction))
            errors.append(predict(slowed, slowed.hardware())[0] / case.measured_step_s - 1)
        print(f"| {fraction} | " + " | ".join(f"{e:+.1%}" for e in errors) + " |")


def print_bloom_memory() -> None:
    """The BLOOM prequel's memory column against the planner's peak for the same pinned layout."""
    print("\n| BLOOM prequel table | layout | published memory (GB) | predicted peak (GB) | error |")
    print("| --- | --- | ---: | ---: | ---: |")
    errors = []
    for table, case, published in bloom_memory():
        predicted = predicted_peak(case) / 1e9
        errors.append(predicted / published - 1)
        print(f"| {table} | {case.name} | {published} | {predicted:.1f} | {errors[-1]:+.1%} |")
    print(f"\nBLOOM prequel memory: median |error| {statistics.median(abs(e) for e in errors):.1%} over {len(errors)}, "
          f"from {min(errors):+.1%} to {max(errors):+.1%}")


# Bytes of a 16-bit value, and the alignment in bytes at which cuBLAS's tensor-core kernels load
# operands at full rate (its documentation's "tensorop restrictions").
HALF_BYTES, TENSOR_CORE_ALIGNMENT = 2, 16


def print_bloom_head_alignment() -> None:
    """Each BLOOM prequel table's median step-time error, by whether a head's row of 16-bit values
    fills whole 16-byte words (the alignment cuBLAS's tensor-core kernels load at full rate; the
    q, k and v views of Megatron's fused QKV output start 0, 1 and 2 heads in and step 3 heads at a
    time, so a head's alignment is theirs); then each layout a table times at several micro-batches,
    its step at each against the next smaller, published and predicted."""
    print("\n| BLOOM prequel table | head dim | 16-byte rows | median step error | range |")
    print("| --- | ---: | --- | ---: | ---: |")
    medians, sweeps = {True: [], False: []}, []
    for ablation in bloom_layout_search():
        head_dim = ablation.fastest_first[0].spec.head_dim
        steps = [(case, step) for case in ablation.fastest_first if math.isfinite(step := refused_or_predicted(case))]
        errors = [step / case.measured_step_s - 1 for case, step in steps]
        aligned, median = head_dim * HALF_BYTES % TENSOR_CORE_ALIGNMENT == 0, statistics.median(errors)
        medians[aligned].append(median)
        print(f"| {ablation.name} | {head_dim} | {'yes' if aligned else 'no'} | {median:+.1%} "
              f"| {min(errors):+.1%} to {max(errors):+.1%} |")
        layouts: dict[tuple, list] = {}
        for case, step in sorted(steps, key=lambda pair: pair[0].micro_batch):
            layout = case.name.replace(f" mbs {case.micro_batch}", "")
            layouts.setdefault(layout, []).append((case, step))
        sweeps += [(ablation.name, layout, smaller, larger, larger_step / smaller_step - 1)
                   for layout, runs in layouts.items()
                   for (smaller, smaller_step), (larger, larger_step) in zip(runs, runs[1:])]
    for aligned, values in medians.items():
        if values:
            print(f"\nBLOOM tables with{'' if aligned else 'out'} 16-byte head rows: {len(values)}, their medians "
                  f"{min(values):+.1%} to {max(values):+.1%}")
    print("\n| BLOOM prequel table | layout | micro-batch | step against the next smaller, published | predicted |")
    print("| --- | --- | --- | ---: | ---: |")
    for table, layout, smaller, larger, predicted in sweeps:
        print(f"| {table} | {layout} | {smaller.micro_batch} → {larger.micro_batch} "
              f"| {larger.measured_step_s / smaller.measured_step_s - 1:+.1%} | {predicted:+.1%} |")


def predicted_peak(case: Case) -> float:
    """The planner's peak bytes for the case's pinned layout at its micro-batch, fitting or not."""
    layout = Layout(**case.fixed, microbatches=case.batch // (case.fixed["dp"] * case.micro_batch))
    workload = Workload(case.spec, case.batch, "bf16", case.kernels)
    return evaluate(workload, case.hardware(), case.gpus, layout).peak_memory_bytes


def print_zero_bubble_memory() -> None:
    """The zero-bubble tables' peak memory against the planner's for the same pinned layout (fit or not),
    and what the same layout would hold with flash attention."""
    print("\n| zero-bubble run | published peak (GB) | predicted peak (GB) | error | with flash attention |")
    print("| --- | ---: | ---: | ---: | ---: |")
    errors, flash_errors = [], []
    for case, published in zero_bubble_memory():
        predicted, flash = (evaluate(Workload(case.spec, case.batch, "bf16", kernels), case.hardware(), case.gpus,
                                     Layout(**case.fixed)).peak_memory_bytes / 1e9
                            for kernels in (case.kernels, replace(case.kernels, flash_attention=True, dropout=False)))
        errors.append(predicted / published - 1)
        flash_errors.append(flash / published - 1)
        print(f"| {case.name.split(', m ')[0]}, b {case.micro_batch} | {published} | {predicted:.1f} | {errors[-1]:+.1%} "
              f"| {flash_errors[-1]:+.1%} |")
    print(f"\nzero-bubble peaks: median |error| {statistics.median(abs(e) for e in errors):.1%} over {len(errors)}, "
          f"from {min(errors):+.1%} to {max(errors):+.1%}; with flash attention from {min(flash_errors):+.1%} "
          f"to {max(flash_errors):+.1%}")


def print_zero_bubble_marginal_costs() -> None:
    """What one more micro-batch costs under each of table 4's schedules, published against predicted,
    and what interleaving adds over 1F1B per extra chunk a micro-batch passes through that the
    planner does not predict."""
    print("\n| zero-bubble model (chunks a stage) | one more micro-batch (ms, published / predicted): ZB-1p | 1F1B "
          "| interleaved 1F1B | interleaved over 1F1B not predicted, per extra chunk (ms) | the same without a cost per "
          "chunk pass |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    bare = marginal_microbatch_seconds(predicting_chunk_pass(0.0))
    charged = marginal_microbatch_seconds(lambda case: predict(case, case.hardware())[0])
    for (model, chunks, costs), (_, _, without) in zip(charged, bare):
        cells = " | ".join(f"{1e3 * costs[s][0]:.1f} / {1e3 * costs[s][1]:.1f}" for s in ("zb-h1", "1f1b", "interleaved-1f1b"))
        mark = " (fitted on)" if model == CHUNK_PASS_FITTED_ON else ""
        print(f"| {model} ({chunks}){mark} | {cells} | {1e3 * unpredicted_per_extra_chunk(chunks, costs):+.2f} "
              f"| {1e3 * unpredicted_per_extra_chunk(chunks, without):+.2f} |")
    # (against ZB-1p, whose runtime posts its sends and moves on, what interleaving's extra chunks
    # cost beyond the prediction, without the cost and with it)
    def over_zb(costs: dict, chunks: int) -> float:
        (interleaved, interleaved_predicted), (zb, zb_predicted) = costs["interleaved-1f1b"], costs["zb-h1"]
        return 1e3 * ((interleaved - zb) - (interleaved_predicted - zb_predicted)) / (chunks - 1)

    print("\ninterleaved 1F1B over ZB-1p not predicted, per extra chunk (ms), without a cost per chunk pass / with it: "
          + ", ".join(f"{model} {over_zb(without, chunks):+.2f} / {over_zb(costs, chunks):+.2f}"
                      for (model, chunks, without), (_, _, costs) in zip(bare, charged)))


def print_chunk_pass_effect() -> None:
    """The zero-bubble runs held out of the fork's cost per chunk pass, by model, GPUs and micro-batch,
    predicted without that cost and with it, and the paper's pairs ordered either way."""
    without, with_it = predicting_chunk_pass(0.0), predicting_chunk_pass(ZERO_BUBBLE_CHUNK_PASS_S)
    groups: dict[str, list[tuple[float, float]]] = {}
    for case in zero_bubble_runs()[1]:
        group = f"{case.name.split(',')[0].removeprefix('ZB paper ')}, {case.gpus} GPUs, b {case.micro_batch}"
        groups.setdefault(group, []).append((without(case) / case.measured_step_s - 1,
                                             with_it(case) / case.measured_step_s - 1))
    print("\n| held-out zero-bubble runs | runs | without a cost per chunk pass | with it |")
    print("| --- | ---: | ---: | ---: |")
    for group, errors in groups.items():
        print(f"| {group} | {len(errors)} | {min(e for e, _ in errors):+.1%} to {max(e for e, _ in errors):+.1%} "
              f"| {min(e for _, e in errors):+.1%} to {max(e for _, e in errors):+.1%} |")
    every = [pair for errors in groups.values() for pair in errors]
    in_order = {}
    for label, predicted in (("without", without), ("with", with_it)):
        pairs = right = 0
        for ablation in zero_bubble_ablations():
            steps = [predicted(case) / case.batch for case in ablation.fastest_first]
            compared = published_pairs(ablation)
            pairs, right = pairs + len(compared), right + sum(ordered(steps, i, j) for i, j in compared)
        in_order[label] = f"{right} of {pairs}"
    print(f"\nheld-out zero-bubble runs read further off with the cost: {sum(abs(b) > abs(a) for a, b in every)} of "
          f"{len(every)}; median |error| {statistics.median(abs(a) for a, _ in every):.1%} without it, "
          f"{statistics.median(abs(b) for _, b in every):.1%} with it; the paper's pairs in order "
          f"{in_order['without']} without it, {in_order['with']} with it")


def print_table_4() -> None:
    """Table 4's layer timings, published and predicted (the catalog's A100 efficiency is fitted on them)."""
    print("| 22B layer, tp 8, micro-batch 4 | published forward + backward (ms) | predicted (ms) | error |")
    print("| --- | ---: | ---: | ---: |")
    for (name, _, published), predicted in zip(TABLE_4_LAYOUTS, table_4_layer_ms(hardware("a100-80gb"))):
        print(f"| {name} | {published} | {predicted:.1f} | {predicted / published - 1:+.1%} |")
    print()


def stack_of(case: Case) -> str:
    if case.kernels == replace(STACKS["pytorch"], fused=False):
        return "pytorch --unfused"
    if case.kernels == ASYNC_TP:
        return "pytorch --async-tp"
    if case.kernels == ZERO_BUBBLE_MEGATRON:
        return "megatron (zero-bubble fork)"
    if case.kernels == MEGATRON_JANUARY_2021_STACK:
        return "megatron-2021 (1f1b only, boundaries whole)"
    if case.kernels == DEEPSPEED_BF16_OPTIMIZER:
        return "megatron-deepspeed, BF16 optimizer"
    if case.kernels == LLAMA_3_STACK:
        return "Meta's (megatron kernels, all-gather cp)"
    return next((name for name, kernels in STACKS.items() if kernels == case.kernels), "megatron (eager, dropout)")


if __name__ == "__main__":
    main()
