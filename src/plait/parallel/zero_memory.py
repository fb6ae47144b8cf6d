"""Bytes of model state per rank under each ZeRO stage: the textbook figures and plait's own.

Pure Python (no torch), so the planner can import it. Ψ is the parameter count and Nd the
data-parallel size. ``zero_paper_bytes`` is the accounting of the ZeRO paper (Rajbhandari et al.
2020) for mixed precision: bf16 parameters and gradients (2 + 2 bytes) and an fp32 master copy
plus Adam's two moments (12 bytes). ``held_model_state_bytes`` is what plait's implementation holds,
split into parameters, gradients and optimizer state, which the training run measures and
``summary.json`` reports; every stage's total is the paper's (docs/data_parallel.md).
"""

from __future__ import annotations

ADAM_MOMENTS = 2
FP32 = 4
BF16 = 2
# Bytes per parameter of (parameters, gradients, optimizer state): mixed precision keeps bf16
# parameters and gradients and an fp32 master beside Adam's fp32 moments; fp32 needs no master.
PAPER_BYTES = {"bf16": (BF16, BF16, FP32 + ADAM_MOMENTS * FP32), "fp32": (FP32, FP32, ADAM_MOMENTS * FP32)}


def sharded_split(stage: int, parameters: int, dp: int, per_parameter: tuple[int, int, int]) -> dict[str, float]:
    """Bytes per rank of each kind of model state: stage ≥ 1 shards the optimizer state, ≥ 2 the
    gradients, 3 the parameters, each over the ``dp`` ranks."""
    return {
        kind: nbytes * parameters / (dp if stage >= sharded_from else 1)
        for kind, nbytes, sharded_from in zip(("parameters", "gradients", "optimizer"), per_parameter, (3, 2, 1))
    }


def zero_paper_bytes(stage: int, parameters: int, dp: int, precision: str = "bf16") -> float:
    """Model-state bytes per rank of the ZeRO paper's accounting: for bf16, 2 + 2 + 12 bytes per
    parameter (stage 1: 4Ψ + 12Ψ/Nd, stage 2: 2Ψ + 14Ψ/Nd); for fp32, 4 + 4 + 8."""
    return sum(sharded_split(stage, parameters, dp, PAPER_BYTES[precision]).values())


def held_model_state_bytes(stage: int, parameters: int, dp: int, precision: str) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer state as plait holds them at their largest.

    fp32, and bf16 stages 1 and 2, are the paper's split. bf16 stage 0 runs autocast over fp32
    parameters, which are their own master, and stage 3 FSDP2's mixed precision over fp32 shards,
    likewise: 4 + 4 + 8 bytes where the paper counts 2 + 2 + 12, the same total.
    """
    paper_split = precision == "fp32" or stage in (1, 2)
    return sharded_split(stage, parameters, dp, PAPER_BYTES[precision if paper_split else "fp32"])
