"""Megatron-LM's own functional tests that time one 7B model under two layouts on one node of eight
H100s and of eight A100s, predicted by benchmarks/validate_published.py (all held out)."""

from __future__ import annotations

import statistics

from benchmarks.published_case import Ablation, Case
from plait.facts.stack import STACKS
from plait.models.spec import ModelSpec

# tests/functional_tests/test_cases/gpt/gpt3_7b_{tp1_pp4,tp4_pp1}_memory_speed at commit d98e8a64 (August
# 2026): model_config.yaml and the golden values NVIDIA's CI checks each merge against on DGX H100 and
# DGX A100 (one node, tests/test_utils/recipes/h100/gpt.yaml). 32 layers, hidden 4,096, 32 heads in 8
# query groups, Megatron's default MLP (4h, GeLU) and learned positions, untied embeddings, vocabulary
# 131,073, 8,192 tokens, global batch 8, bf16 with Transformer Engine, the distributed optimizer with
# its gradient reduce-scatter and parameter gather overlapped, no recomputation. tp1·pp4 runs one
# block per virtual stage (--num-layers-per-virtual-pipeline-stage 1: interleaved 1F1B, v = 8) at
# micro-batch 1; tp4 (no sequence parallelism) at micro-batch 2. Its deterministic mode (ring-only
# NCCL, deterministic attention, no fused weight-gradient accumulation) slows both layouts alike.
# The A100s are 80 GB parts: the tests' peak allocations (58.2 and 60.5 GB) exceed 40. Step time: the
# median of the golden steady-state iterations (H100: every second step from 4 to 24; A100: the
# steps 10 and 20 its file holds).
MEGATRON_CI = ("Megatron-LM tests/functional_tests/test_cases/gpt/gpt3_7b_*_memory_speed "
               "(github.com/NVIDIA/Megatron-LM, commit d98e8a64)")
GOLDEN_ITERATION_S = {
    ("tp1_pp4", "h100-sxm"): (1.16377, 1.14861, 1.14912, 1.15017, 1.14909, 1.14967, 1.15077, 1.15255, 1.1501,
                              1.15138, 1.15105),
    ("tp4_pp1", "h100-sxm"): (1.12221, 1.11139, 1.11368, 1.11791, 1.11551, 1.11592, 1.11576, 1.11374, 1.11451,
                              1.1149, 1.11493),
    ("tp1_pp4", "a100-80gb"): (2.9368, 2.94791),
    ("tp4_pp1", "a100-80gb"): (2.57769, 2.596),
}
LAYOUTS = {  # test: (layout, micro-batch)
    "tp1_pp4": ({"tp": 1, "pp": 4, "dp": 2, "schedule": "interleaved-1f1b", "virtual_stages": 8}, 1),
    "tp4_pp1": ({"tp": 4, "pp": 1, "dp": 2}, 2),
}


def megatron_ci_runs() -> list[Case]:
    spec = ModelSpec("gpt2", 32, 4096, 32, 8, 16384, 131073, 8192, tie_embeddings=False)
    cases = []
    for (test, gpu), steps in GOLDEN_ITERATION_S.items():
        layout, micro_batch = LAYOUTS[test]
        fixed = {"cp": 1, "zero": 1, "dp_replicate": 1, "sp": False, "recompute": "none", **layout}
        cases.append(Case(f"GPT 7B {test.replace('_', '·')}, 8 {gpu.split('-')[0].upper()}", MEGATRON_CI, spec, 8, 8,
                          fixed, statistics.median(steps), micro_batch, gpu=gpu, kernels=STACKS["megatron-core"]))
    return cases


def megatron_ci_ablations() -> list[Ablation]:
    """Each GPU's two layouts, fastest first."""
    by_gpu: dict[str, list[Case]] = {}
    for case in megatron_ci_runs():
        by_gpu.setdefault(case.gpu, []).append(case)
    return [Ablation(f"GPT 7B on 8 {gpu.split('-')[0].upper()}s: tp4 against interleaved pp4", MEGATRON_CI,
                     tuple(sorted(cases, key=lambda case: case.measured_step_s))) for gpu, cases in by_gpu.items()]
