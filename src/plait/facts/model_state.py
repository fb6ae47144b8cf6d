"""Bytes of model state per rank under each ZeRO stage, and the parameters each rank holds.

One home for the engine (summaries, tests) and the planner; pure Python. Ψ is the parameter count and Nd the
data-parallel size. ``zero_paper_bytes`` is the accounting of the ZeRO paper (Rajbhandari et al.
2020) for mixed precision: bf16 parameters and gradients (2 + 2 bytes) and an fp32 master copy
plus Adam's two moments (12 bytes). ``held_model_state_bytes`` is what plait's implementation holds,
split into parameters, gradients and optimizer state, which the training run measures and
``summary.json`` reports; every stage's total is the paper's (docs/data_parallel.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from plait.models.flops import (
    embedding_tensor_count, head_tensor_count, layer_parameter_count, layer_tensor_count, norm_parameter_count,
)
from plait.models.spec import ModelSpec

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


@dataclass(frozen=True)
class ModelStates:
    """Bytes of parameters, gradients and optimizer state on one rank."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def model_state_bytes(parameters: float, precision: str, zero: int, shards: int) -> ModelStates:
    """Model states of ``parameters`` on one rank, with ZeRO ``zero`` over ``shards`` ranks."""
    split = sharded_split(zero, parameters, shards, PAPER_BYTES[precision])
    return ModelStates(params=split["parameters"], grads=split["gradients"], optimizer=split["optimizer"])


def rank_parameters(spec: ModelSpec, layers: int, first: bool, last: bool, tp: int, pp: int) -> float:
    """Parameters one tensor-parallel rank of a pipeline stage holds.

    Weights and biases are split over tp (the embedding and head by vocabulary rows), norms are
    replicated. With tied embeddings and pp > 1 the last stage keeps its own copy of the
    embedding matrix for the head, as Megatron-LM does.
    """
    norms = 2 * norm_parameter_count(spec)
    count = layers * ((layer_parameter_count(spec) - norms) / tp + norms)
    if first:
        count += spec.vocab * spec.hidden / tp + (spec.seq_len * spec.hidden if spec.learned_positions else 0)
    if last:
        count += norm_parameter_count(spec)
        if not spec.tie_embeddings or pp > 1:
            count += spec.vocab * spec.hidden / tp
    return count


def rank_tensors(spec: ModelSpec, layers: int, first: bool, last: bool, pp: int) -> int:
    """Parameter tensors one rank of a pipeline stage holds (sharded or not, each is one tensor)."""
    count = layers * layer_tensor_count(spec)
    if first:
        count += embedding_tensor_count(spec)
    if last:
        count += head_tensor_count(spec) + (1 if spec.tie_embeddings and pp > 1 else 0)
    return count


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of tp, as Megatron pads it (the extra rows are zero and
    their logits are masked out of the loss, so training is unchanged)."""
    return -(-vocab // tp) * tp
