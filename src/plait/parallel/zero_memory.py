"""Bytes of model state per rank under each ZeRO stage: the textbook figures and plait's own.

Pure Python (no torch), so the planner can import it. Ψ is the parameter count and Nd the
data-parallel size. ``zero_paper_bytes`` is the accounting of the ZeRO paper (Rajbhandari et al.
2020) for mixed precision: bf16 parameters and gradients (2 + 2 bytes) and an fp32 master copy
plus Adam's two moments (12 bytes). ``model_state_bytes`` is what plait's implementation holds,
split into parameters, gradients and optimizer state, which the training run measures and
``summary.json`` reports; docs/data_parallel.md explains each difference from the paper.
"""

from __future__ import annotations

ADAM_MOMENTS = 2
FP32 = 4
BF16 = 2


def zero_paper_bytes(stage: int, parameters: int, dp: int) -> float:
    """Model-state bytes per rank of the ZeRO paper's mixed-precision accounting (2 + 2 + 12)."""
    psi = parameters
    return {
        0: 16 * psi,
        1: 4 * psi + 12 * psi / dp,
        2: 2 * psi + 14 * psi / dp,
        3: 16 * psi / dp,
    }[stage]


def model_state_bytes(stage: int, parameters: int, dp: int, precision: str) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer state as plait holds them at their largest.

    fp32 keeps 4-byte parameters and gradients and 8 bytes of Adam moments per parameter. bf16
    runs stages 0 and 1 under autocast, so the fp32 parameters are themselves the master copy;
    stages 2 and 3 use FSDP2's mixed precision, which gathers bf16 compute copies from fp32 shards.
    Stage 2 holds the gathered copy *and* its own shard (the shard is what the optimizer updates).
    """
    psi, shard = parameters, parameters / dp
    optimizer = ADAM_MOMENTS * FP32 * (psi if stage == 0 else shard)
    if stage <= 1:
        return {"parameters": FP32 * psi, "gradients": FP32 * psi, "optimizer": optimizer}
    gathered = 0.0
    if stage == 2:
        gathered = (BF16 if precision == "bf16" else FP32) * psi
    return {"parameters": gathered + FP32 * shard, "gradients": FP32 * shard, "optimizer": optimizer}
