"""Predict published large training runs and print the table of docs/VALIDATION.md.

Each case fixes what its paper states (model, GPUs, tp/pp/dp, batch, recomputation, sequence
parallelism, schedule where given) and lets the planner fill what the paper leaves out (the
micro-batch size and schedule where unstated), exactly as ``plait simulate`` does.

    PYTHONPATH=src python benchmarks/validate_published.py          # the table
    PYTHONPATH=src python benchmarks/validate_published.py --fit    # refit the A100 constant
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, replace

from plait.facts.stack import Kernels
from plait.models.flops import flops_per_sequence
from plait.models.spec import ModelSpec, model_spec
from plait.plan.hardware import hardware
from plait.plan.search import best_layout
from plait.plan.simulate import Workload, evaluate

MEGATRON_2021 = "Narayanan et al. 2021 (arXiv 2104.04473), table 1"
KORTHIKANTI_2022 = "Korthikanti et al. 2022 (arXiv 2205.05198), tables 3 and 5"
LLAMA_3 = "Llama 3 Herd of Models (arXiv 2407.21783), table 4"
EAGER = Kernels(dropout=True, flash_attention=False)  # Megatron-LM 2021-22: fused softmax, dropout, no flash


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    spec: ModelSpec
    gpus: int
    batch: int
    fixed: dict
    measured_step_s: float
    micro_batch: int | None = None
    gpu: str = "a100-80gb"
    kernels: Kernels = EAGER


def gpt(layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec("gpt2", layers, hidden, heads, heads, 4 * hidden, 51200, 2048, tie_embeddings=True)


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
    cases = []
    for params, heads, hidden, layers, t, p, gpus, batch, tflops in rows:
        spec = gpt(layers, hidden, heads)
        step = megatron_flops(spec, batch) / (tflops * 1e12 * gpus)
        fixed = {"tp": t, "pp": p, "dp": gpus // (t * p), "cp": 1, "zero": 0, "sp": False, "recompute": "full"}
        cases.append(Case(f"GPT {params}B", MEGATRON_2021, spec, gpus, batch, fixed, step))
    return cases


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


def predict(case: Case, hw) -> tuple[float, str]:
    workload = Workload(case.spec, case.batch, "bf16", case.kernels)
    p = best_layout(workload, hw, case.gpus, case.fixed, case.micro_batch)
    return p.step_time_s, f"{p.layout.describe()}, mbs {p.micro_batch_size}"


def fit_efficiency(cases: list[Case]) -> float:
    """The A100 matmul efficiency minimising the median |error| over ``cases``.

    Layouts are chosen once at the catalog's value, then replayed (golden-section search).
    """
    base = hardware("a100-80gb")
    layouts = []
    for case in cases:
        workload = Workload(case.spec, case.batch, "bf16", EAGER)
        layouts.append((workload, best_layout(workload, base, case.gpus, case.fixed, case.micro_batch).layout))

    def cost(e: float) -> float:
        hw = replace(base, matmul_efficiency=e)
        return statistics.median(abs(evaluate(w, hw, c.gpus, l).step_time_s / c.measured_step_s - 1)
                                 for c, (w, l) in zip(cases, layouts))

    ratio = (5**0.5 - 1) / 2
    lo, hi = 0.4, 1.0
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
    print(f"median |error| on the fitted rows at {best:.3f}: {cost(best):.1%}")
    return best


def llama_3() -> list[Case]:
    """405B pre-training on H100: 16M tokens per batch (2048 × 8192); step time from plait's FLOP count."""
    spec = model_spec("llama-405b")
    cases = []
    for gpus, dp, tflops in ((8192, 64, 430), (16384, 128, 400)):
        step = 2048 * flops_per_sequence(spec).model / (tflops * 1e12 * gpus)
        fixed = {"tp": 8, "cp": 1, "pp": 16, "dp": dp}
        cases.append(Case(f"Llama 3 405B, dp {dp}", LLAMA_3, spec, gpus, 2048, fixed, step, gpu="h100-sxm", kernels=Kernels()))
    return cases


def main() -> None:
    fit, held_out = megatron_2021(), korthikanti_2022() + llama_3()
    if "--fit" in sys.argv:
        print(f"fitted a100 matmul_efficiency on {MEGATRON_2021}: {fit_efficiency(fit):.3f}")
        return
    print(f"a100-80gb matmul_efficiency = {hardware('a100-80gb').matmul_efficiency} "
          f"(fitted to the first {len(fit)} rows; h100-sxm uses the same value, not fitted)\n")
    print("| run | GPUs | layout used | published step (s) | predicted (s) | error | source |")
    print("| --- | ---: | --- | ---: | ---: | ---: | --- |")
    errors: dict[str, list[float]] = {"fitted on": [], "held out": []}
    for group, cases in (("fitted on", fit), ("held out", held_out)):
        for case in cases:
            step, used = predict(case, hardware(case.gpu))
            error = step / case.measured_step_s - 1
            errors[group].append(abs(error))
            print(f"| {case.name} | {case.gpus} | {used} | {case.measured_step_s:.3g} | {step:.3g} | {error:+.1%} | {case.source} |")
    every = errors["fitted on"] + errors["held out"]
    for group, values in errors.items():
        print(f"\n{group}: median |error| {statistics.median(values):.1%} over {len(values)} runs, worst {max(values):.1%}")
    print(f"all: median |error| {statistics.median(every):.1%} over {len(every)} runs")


if __name__ == "__main__":
    main()
