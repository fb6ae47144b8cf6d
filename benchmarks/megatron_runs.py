"""Megatron-LM's published runs: the README's tables of September 2020, January 2021 and July 2024
(Megatron-Core), Narayanan et al. 2021 (tables 1 and 2, with DeepSpeed's ZeRO-3 against PTD-P) and
Korthikanti et al. 2022 (tables 3 to 5), predicted by benchmarks/validate_published.py."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.published_case import EAGER, Ablation, Case, gpt
from plait.facts.stack import STACKS, Kernels
from plait.layout import Layout
from plait.models.spec import ModelSpec
from plait.plan.costs import layer_cost
from plait.hardware import Hardware, hardware

MEGATRON_2021 = "Narayanan et al. 2021 (arXiv 2104.04473), table 1"
KORTHIKANTI_2022 = "Korthikanti et al. 2022 (arXiv 2205.05198), tables 3 and 5"
KORTHIKANTI_TABLE_4 = "Korthikanti et al. 2022 (arXiv 2205.05198), table 4"
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
