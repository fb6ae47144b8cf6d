"""The zero-bubble paper's schedule comparison (Qi et al. 2024): four GPT-3-like models, each on a
pure pipeline of 8 to 32 A100 80GB GPUs (4 nodes at most, RoCE between them), timed under 1F1B,
interleaved 1F1B and ZB-1p at three micro-batch counts; predicted by benchmarks/validate_published.py.

Its Megatron-LM fork (sail-sg/zero-bubble-pipeline-parallelism) runs 1F1B and interleaved 1F1B by
Megatron-LM's schedules, which wait on each batched send and receive before the next compute, and
ZB-1p by its own runtime, which posts them (isend/irecv) and waits only before the data is used.
ZB-1p is the automatic schedule held to 1F1B's activation memory; its table 5 gives it the bubble
of the handcrafted ZB-H1 in every setting, so plait's zb-h1 stands for it. ZB-2p (twice the
memory) has no plait schedule and is left out.
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks.published_case import Ablation, Case
from plait.facts.stack import STACKS
from plait.models.spec import ModelSpec

ZERO_BUBBLE = "Qi et al. 2024 (arXiv 2401.10241), tables 3 and 4"
ZERO_BUBBLE_MEGATRON = replace(STACKS["megatron"], schedules=("1f1b", "interleaved-1f1b", "zb-h1"),
                               blocking_sends=("1f1b", "interleaved-1f1b"))

# Table 3: layers, hidden, heads, GPUs (= pipeline stages), micro-batch size and the three
# micro-batch counts; 1,024 tokens. The vocabulary is not stated: GPT-2's BPE as Megatron-LM pads
# it (50,304). Table 4: samples per GPU per second under each schedule at those counts.
MODELS = {"1.5B": (22, 2304, 24, 8, 6, (24, 32, 64)), "6.2B": (30, 4096, 32, 8, 3, (24, 32, 64)),
          "14.6B": (46, 5120, 40, 16, 1, (48, 64, 128)), "28.3B": (62, 6144, 48, 32, 1, (96, 128, 256))}
SAMPLES_PER_GPU_S = {
    "1.5B": {"zb-h1": (12.9, 13.4, 14.2), "1f1b": (11.8, 12.5, 13.6), "interleaved-1f1b": (13.1, 13.4, 13.9)},
    "6.2B": {"zb-h1": (3.88, 4.00, 4.20), "1f1b": (3.50, 3.70, 4.03), "interleaved-1f1b": (4.01, 4.08, 4.19)},
    "14.6B": {"zb-h1": (1.61, 1.67, 1.76), "1f1b": (1.40, 1.49, 1.64), "interleaved-1f1b": (1.54, 1.59, 1.66)},
    "28.3B": {"zb-h1": (0.87, 0.90, 0.96), "1f1b": (0.76, 0.80, 0.88), "interleaved-1f1b": (0.82, 0.85, 0.90)},
}
NAMES = {"zb-h1": "ZB-1p", "1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B"}


def stages(layers: int, pp: int, schedule: str) -> dict:
    """The paper's split: the first and last stage one block short for the embedding and the loss
    (layers = k·pp − 2); interleaved 1F1B with one block a chunk, so the first chunk is the
    embedding alone and the last the head alone."""
    k = (layers + 2) // pp
    if schedule == "interleaved-1f1b":
        return {"virtual_stages": k, "stage_layers": (0,) + (1,) * layers + (0,)}
    return {"virtual_stages": 1, "stage_layers": (k - 1,) + (k,) * (pp - 2) + (k - 1,)}


def zero_bubble_settings() -> list[tuple[Case, ...]]:
    """Each model and micro-batch count's three schedules (every run held out: no figure is fitted on them)."""
    settings = []
    for model, (layers, hidden, heads, gpus, micro_batch, counts) in MODELS.items():
        spec = ModelSpec("gpt2", layers, hidden, heads, heads, 4 * hidden, 50304, 1024, tie_embeddings=True)
        for i, m in enumerate(counts):
            cases = []
            for schedule, samples in SAMPLES_PER_GPU_S[model].items():
                fixed = {"tp": 1, "pp": gpus, "dp": 1, "cp": 1, "zero": 0, "recompute": "none", "microbatches": m,
                         "schedule": schedule, **stages(layers, gpus, schedule)}
                cases.append(Case(f"ZB paper {model}, {NAMES[schedule]}, m {m}", ZERO_BUBBLE, spec, gpus,
                                  m * micro_batch, fixed, m * micro_batch / (samples[i] * gpus), micro_batch,
                                  kernels=ZERO_BUBBLE_MEGATRON))
            settings.append(tuple(cases))
    return settings


def zero_bubble_runs() -> list[Case]:
    return [case for setting in zero_bubble_settings() for case in setting]


def zero_bubble_ablations() -> list[Ablation]:
    """One ablation per model and micro-batch count: its three schedules, fastest first."""
    return [Ablation(f"{setting[0].name.split(',')[0]}, m {setting[0].fixed['microbatches']}: pipeline schedules",
                     ZERO_BUBBLE, tuple(sorted(setting, key=lambda case: case.measured_step_s)))
            for setting in zero_bubble_settings()]
