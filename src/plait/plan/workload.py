"""What the planner costs: the model, the global batch, the precision and the kernels it runs on."""

from __future__ import annotations

from dataclasses import dataclass

from plait.facts.stack import DEFAULT_STACK, STACKS, Kernels
from plait.models.spec import ModelSpec


@dataclass(frozen=True)
class Workload:
    """What is trained: the model, the global batch in sequences, the precision, the kernels."""

    spec: ModelSpec
    global_batch: int
    precision: str = "bf16"
    kernels: Kernels = STACKS[DEFAULT_STACK]
