"""The ZeRO paper's model-state accounting per stage, which the tests hold plait's measured bytes to."""

from __future__ import annotations

from plait.facts.model_state import PAPER_BYTES, sharded_split


def zero_paper_bytes(stage: int, parameters: int, dp: int, precision: str = "bf16") -> float:
    """Model-state bytes per rank of the ZeRO paper's accounting: for bf16, 2 + 2 + 12 bytes per
    parameter (stage 1: 4Ψ + 12Ψ/Nd, stage 2: 2Ψ + 14Ψ/Nd); for fp32, 4 + 4 + 8."""
    return sum(sharded_split(stage, parameters, dp, PAPER_BYTES[precision]).values())


def held_model_state_bytes(stage: int, parameters: int, dp: int, precision: str) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer state as plait holds them at their largest.

    fp32, and bf16 stages 1 and 2, are the paper's split, but that bf16 stage 2 sums its gradient
    rows in fp32 (4 bytes where the paper counts 2, 2Ψ/Nd more in all). bf16 stage 0 runs autocast
    over fp32 parameters, which are their own master, and stage 3 FSDP2's mixed precision over fp32
    shards, likewise: 4 + 4 + 8 bytes where the paper counts 2 + 2 + 12, the same total.
    """
    paper_split = precision == "fp32" or stage in (1, 2)
    held = sharded_split(stage, parameters, dp, PAPER_BYTES[precision if paper_split else "fp32"])
    if precision == "bf16" and stage == 2:
        held["gradients"] *= 2
    return held
