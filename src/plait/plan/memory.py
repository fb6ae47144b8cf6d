"""Bytes held by one rank at its peak: the shared facts (plait.facts) plus the runtime's own.

"""

from __future__ import annotations

from dataclasses import dataclass

from plait.facts.activations import activation_bytes_per_layer
from plait.facts.collectives import stage_boundary_bytes
from plait.facts.model_state import communicated_bytes, rank_layer_parameters, rank_parameters
from plait.facts.stack import Kernels
from plait.layout import Layout
from plait.models.flops import neighbour_share
from plait.models.spec import ModelSpec


@dataclass(frozen=True)
class RankMemory:
    """Everything one rank holds at its peak, in bytes."""

    params: float
    grads: float
    optimizer: float
    activations: float
    other: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    def breakdown(self) -> dict[str, int]:
        return {k: int(round(getattr(self, k))) for k in ("params", "grads", "optimizer", "activations", "other")}


def other_bytes(
    spec: ModelSpec, layout: Layout, micro_batch: int, precision: str, reserved: float, kernels: Kernels
) -> float:
    """Stated assumptions beyond model states and activations.

    ``reserved`` for the runtime (context, communication workspaces, allocator slack); with pp > 1
    one send and one receive buffer of a micro-batch's boundary activation (a tensor-parallel rank's
    piece of it where the stack splits it: the gathered whole is the next stage's saved input); with ZeRO-3 the
    gathered weights of two layers (the current one and the prefetched next) and the unsharded
    gradients of one, or where the stack gathers linear by linear (plait.plan.zero3) the weights and
    the gradients of the two largest neighbouring linears; with PowerSGD its error-feedback buffer,
    one gradient's worth per rank (its low-rank factors, some tens of times smaller, are left out);
    under activation offload the saved bytes of the one block running.
    """
    extra = reserved
    if layout.offload_activations:  # the block running has its saved bytes on the device
        extra += activation_bytes_per_layer(spec, layout, micro_batch, precision, kernels)
    if layout.pp > 1:  # one send and one receive buffer
        extra += 2 * stage_boundary_bytes(spec, layout, micro_batch, precision, kernels)
    if layout.zero == 3:
        grads, params = communicated_bytes(layout, precision, kernels)
        # Two of the units the stack gathers by are live at once, and the gradients of two (one
        # reduce-scattering while the next is computed).
        held, unsharded = (neighbour_share(spec),) * 2 if kernels.zero3_gather_unit == "linear" else (2.0, 1.0)
        extra += rank_layer_parameters(spec, layout.tp) * (held * params + unsharded * grads)
    if layout.grad_compression == "powersgd":  # no tp, no pp: the rank holds the whole model
        extra += rank_parameters(spec, spec.layers, True, True, 1) * communicated_bytes(layout, precision, kernels)[0]
    return extra
