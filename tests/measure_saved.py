"""Measure the bytes autograd keeps for backward while one module runs forward.

Every tensor saved for backward is seen through ``saved_tensors_hooks``; each distinct storage is
counted once, at its size when the module's forward ends (a view keeps its whole storage alive; a
storage freed by then, such as FSDP2's gathered weights resharded after the block, counts 0), and
parameters are left out (they are weights, not activations). A DTensor counts as its local shard.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding ``tensor``'s data on this rank (a collective's result once waited)."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.trigger_wait() if isinstance(local, AsyncCollectiveTensor) else local


class SavedBytes:
    """Bytes of the distinct storages saved for backward inside ``module``'s forward."""

    def __init__(self, model: nn.Module, module: nn.Module):
        self.weights = {_local(p).untyped_storage().data_ptr() for p in model.parameters()}
        self.module = module
        self.seen: dict[int, torch.UntypedStorage] = {}
        self.total = 0
        self.inside = False

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = _local(tensor).untyped_storage()
        pointer = storage.data_ptr()
        if self.inside and pointer not in self.weights and pointer not in self.seen:
            self.seen[pointer] = storage
        return tensor

    def _enter(self, *args) -> None:
        self.inside = True

    def _leave(self, *args) -> None:
        self.inside = False
        self.total = sum(storage.nbytes() for storage in self.seen.values())

    @contextlib.contextmanager
    def recording(self) -> Iterator[SavedBytes]:
        handles = [self.module.register_forward_pre_hook(self._enter), self.module.register_forward_hook(self._leave)]
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor):
                yield self
        finally:
            for handle in handles:
                handle.remove()
