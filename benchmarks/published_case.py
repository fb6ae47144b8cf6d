"""One published run, and one published ablation, as benchmarks/validate_published.py predicts them."""

from __future__ import annotations

from dataclasses import dataclass

from plait.facts.stack import Kernels
from plait.models.spec import ModelSpec
from plait.hardware import hardware

# Megatron-LM 2022 (Korthikanti et al.): its fused softmax without flash attention, dropout, its
# scatter/gather of pipeline tensors, waited on before the next compute, its distributed optimizer (ZeRO-1),
# no context parallelism, and its gradients reduced once forward_backward_func returns
# (train_step's optimizer.reduce_model_grads; --overlap-grad-reduce came in August 2023, off by default).
EAGER = Kernels(dropout=True, flash_attention=False, pipeline_boundary_split=True, max_zero=1, cp_algorithms=(),
                main_grad_buffer=True, reduce_after_schedule=True,
                blocking_sends=("1f1b", "interleaved-1f1b"), interleaved_two_stages=False)


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
    hardware_overrides: tuple[tuple[str, float], ...] = ()  # a part that differs from the catalog's

    def hardware(self):
        return hardware(self.gpu, **dict(self.hardware_overrides))


@dataclass(frozen=True)
class Ablation:
    """One model run under several layouts in one publication: the layouts in published order, fastest first."""

    name: str
    source: str
    fastest_first: tuple[Case, ...]


def gpt(layers: int, hidden: int, heads: int) -> ModelSpec:
    """Megatron-LM's GPT of ``layers`` blocks: 4h MLP, vocabulary 51,200, 2,048 tokens, tied embeddings."""
    return ModelSpec("gpt2", layers, hidden, heads, heads, 4 * hidden, 51200, 2048, tie_embeddings=True)
