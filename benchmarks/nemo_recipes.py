"""NVIDIA's DGX Cloud benchmark recipes (NVIDIA/dgxc-benchmarking, release 25.04.01, commit 85380ffe):
NeMo on DGX H100 in bf16, seconds per step as published (llama3.1/README.md, nemotron/README.md and
nemotron/launch.sh, nemo_megatron/README_175b.md), predicted on the nemo stack.

Transformer Engine's tensor-parallel overlap with sequence parallelism, the distributed optimizer, no
recomputation (NeMo's performance recipes set none for these bf16 runs). Each model's smallest and
largest full-size scale (the 405B table's smaller columns are cut-down proxies). The Llama 3.1 and
Nemotron-4 rows ran NeMo 2 (containers 25.03 and 25.02.01); the GPT-3 175B rows NeMo 24.12 through
its Hydra launcher, whose config also sets dropout 0.1 (not modelled: about 0.1% of the step).
Nemotron-4 (NeMo's nemotron.py: squared-ReLU MLP without gate, no biases, rotary, 8 K/V heads,
untied, 256,000 words) is described with the gpt2 family, whose biases and learned positions it
lacks (under 0.2% of the parameters).
"""

from __future__ import annotations

from benchmarks.published_case import Case
from plait.facts.stack import STACKS
from plait.models.spec import ModelSpec, model_spec

DGXC = "NVIDIA/dgxc-benchmarking 25.04.01 (commit 85380ffe)"
DGXC_MODELS = {"llama 3.1 8B": model_spec("llama-8b"), "llama 3.1 70B": model_spec("llama-70b"),
               "llama 3.1 405B": model_spec("llama-405b"),
               "Nemotron-4 15B": ModelSpec("gpt2", 32, 6144, 48, 8, 24576, 256000, 4096, tie_embeddings=False),
               "Nemotron-4 340B": ModelSpec("gpt2", 96, 18432, 96, 8, 73728, 256000, 4096, tie_embeddings=False),
               "GPT-3 175B": ModelSpec("gpt2", 96, 12288, 96, 96, 49152, 50688, 2048, tie_embeddings=True)}
# Rows: model, GPUs, tp, pp, cp, virtual stages, micro-batch, global batch, seconds, whether the nemo
# stack's efficiency is fitted on it (the Llama runs at their smallest scale) or it is held out.
DGXC_ROWS = [
    ("llama 3.1 8B", 8, 1, 1, 2, 1, 1, 128, 12.27, True),
    ("llama 3.1 8B", 128, 1, 1, 2, 1, 1, 2048, 12.33, False),
    ("llama 3.1 70B", 64, 4, 4, 2, 5, 1, 128, 14.66, True),
    ("llama 3.1 70B", 2048, 4, 4, 2, 5, 1, 4096, 14.66, False),
    ("llama 3.1 405B", 512, 8, 8, 2, 8, 1, 256, 19.78, True),
    ("llama 3.1 405B", 2048, 8, 8, 2, 8, 1, 1024, 19.87, False),
    ("Nemotron-4 15B", 16, 2, 1, 1, 1, 2, 64, 2.66, False),
    ("Nemotron-4 15B", 2048, 2, 1, 1, 1, 2, 8192, 2.78, False),
    ("Nemotron-4 340B", 256, 8, 8, 1, 12, 1, 64, 4.36, False),
    ("Nemotron-4 340B", 2048, 8, 8, 1, 12, 1, 512, 4.43, False),
    ("GPT-3 175B", 128, 4, 8, 1, 6, 1, 256, 8.309, False),
    ("GPT-3 175B", 2048, 4, 8, 1, 6, 1, 4096, 8.49, False),
]


def nemo_dgxc() -> tuple[list[Case], list[Case]]:
    """The recipes' runs: (those the nemo stack's efficiency is fitted on, those held out)."""
    fitted, held_out = [], []
    for model, gpus, tp, pp, cp, vp, mbs, batch, seconds, fit in DGXC_ROWS:
        schedule = {"schedule": "interleaved-1f1b", "virtual_stages": vp} if vp > 1 else {}
        fixed = {"tp": tp, "pp": pp, "cp": cp, "dp": gpus // (tp * pp * cp), "zero": 1, "dp_replicate": 1,
                 "sp": tp > 1, "recompute": "none", **schedule}
        case = Case(f"NeMo {model}, {gpus} GPUs", DGXC, DGXC_MODELS[model], gpus, batch, fixed, seconds, mbs,
                    gpu="h100-sxm", kernels=STACKS["nemo"])
        (fitted if fit else held_out).append(case)
    return fitted, held_out
