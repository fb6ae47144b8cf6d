"""What each rank really holds of the model state: bytes of parameters, gradients, optimizer state.

Counted from the live tensors, local shards only (a DTensor counts its local tensor), each storage
once (DDP's gradients are views of its buckets; ZeRO-2's and FSDP2's gradient shards are views
of their reduce-scatter outputs): parameters at the end of a forward pass, gradients after the
backward passes and just before the optimizer step (what the step is given: mid-backward, ZeRO-2
also holds the gradients not yet packed and its buckets in flight, as DDP and FSDP2 hold theirs),
optimizer state (with any fp32 master copy) just after it; each the largest seen.

The engine says what its optimizer steps with (``gradients``, ``masters``) and what holds the
gradients before they are reduced (``unreduced``) rather than this module
asking what kind of optimizer it is: measurement depends on no part of the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor


@torch.no_grad()  # to_local() records no autograd node, which keeps each count near a millisecond
def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a freed storage counts 0)."""
    sizes: dict[int, int] = {}
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values())


class ModelStateMeter:
    """Hooks on the model and optimizer that keep the largest bytes held of each kind of state.

    ``gradients()`` gives the gradients the optimizer steps with (ZeRO-2 keeps them in the
    optimizer, not on the parameters); ``masters``, its fp32 master copies, if any; ``unreduced``,
    what holds the gradients between the backward passes and their reduction (``before_reduction``)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 gradients: Callable[[], Iterable[torch.Tensor]], masters: Collection[torch.Tensor] = (),
                 unreduced: Callable[[], Iterable[torch.Tensor]] = lambda: ()):
        self.model, self.optimizer = model, optimizer
        self.gradients, self.masters, self.unreduced = gradients, masters, unreduced
        self.held = {"parameters": 0, "gradients": 0, "optimizer": 0}
        model.register_forward_hook(self._after_forward)
        optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(self._after_step)

    def _optimized(self) -> list[torch.Tensor]:
        return [param for group in self.optimizer.param_groups for param in group["params"]]

    def _keep(self, kind: str, value: int) -> None:
        self.held[kind] = max(self.held[kind], value)

    def _after_forward(self, module, args, output) -> None:
        # The module's parameters are the gathered ones while gathered; the optimizer's are the shards.
        self._keep("parameters", storage_bytes([*self.model.parameters(), *self._optimized()]))

    def _before_step(self, optimizer, args, kwargs) -> None:
        self._keep("gradients", storage_bytes(self.gradients()))

    def before_reduction(self) -> None:
        """Called after the step's backward, its gradients laid out as their parameters, before what
        is left of their reduction: a pipeline stage under ZeRO-2 or 3 holds its whole gradients
        until the reduce-scatter after the schedule."""
        self._keep("gradients", storage_bytes(self.unreduced()))

    def _after_step(self, optimizer, args, kwargs) -> None:
        state = [value for values in self.optimizer.state.values() for value in values.values()]
        state.extend(self.masters)  # the fp32 masters are optimizer state, as in the ZeRO paper
        self._keep("optimizer", storage_bytes(value for value in state if isinstance(value, torch.Tensor)))
