"""Measure the bytes autograd keeps for backward while one module runs forward.

Every tensor saved for backward is seen through ``saved_tensors_hooks``; each distinct storage is
counted once, at its size when the module's forward ends (a view keeps its whole storage alive; a
storage freed by then, such as FSDP2's gathered weights resharded after the block, counts 0), and
parameters are left out (they are weights, not activations). A DTensor counts as its local shard.
Under ``--recompute op`` the outputs torch's selective checkpoint caches for backward are kept
outside autograd's saved tensors: the forward's cache of each block is read as well.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves

from plait.parallel import recompute


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding ``tensor``'s data on this rank (a collective's result once waited)."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.trigger_wait() if isinstance(local, AsyncCollectiveTensor) else local


class SavedBytes:
    """Bytes of the distinct storages saved for backward inside each of ``modules``' forwards
    (``totals``, in order; ``total`` the first's). One saved-tensor hook serves them all: hooks
    nest, and only the innermost one packs."""

    def __init__(self, model: nn.Module, *modules: nn.Module):
        self.weights = {_local(p).untyped_storage().data_ptr() for p in model.parameters()}
        self.modules = modules
        self.seen: list[dict[int, torch.UntypedStorage]] = [{} for _ in modules]
        self.totals = [0] * len(modules)
        self.inside: int | None = None
        self.caches: list[list[dict]] = [[] for _ in modules]

    @property
    def total(self) -> int:
        return self.totals[0]

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.inside is not None:
            self._keep(self.inside, tensor)
        return tensor

    def _keep(self, index: int, tensor: torch.Tensor) -> None:
        storage = _local(tensor).untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self.weights:
            self.seen[index].setdefault(pointer, storage)

    def _selective_contexts(self, original):
        """The engine's selective-checkpoint contexts, their forward cache noted for the block running."""
        caching, replaying = original()
        if self.inside is not None:
            self.caches[self.inside].append(caching.storage)
        return caching, replaying

    def _enter(self, index: int) -> None:
        self.inside = index

    def _leave(self, index: int) -> None:
        self.inside = None
        for cache in self.caches[index]:
            for entries in cache.values():
                for entry in entries.values():  # an output's cached tensors, or a marker to recompute it
                    for leaf in tree_leaves(entry):
                        if isinstance(value := getattr(leaf, "val", None), torch.Tensor):
                            self._keep(index, value)
        self.totals[index] = sum(storage.nbytes() for storage in self.seen[index].values())

    @contextlib.contextmanager
    def recording(self) -> Iterator[SavedBytes]:
        handles = []
        for index, module in enumerate(self.modules):
            handles.append(module.register_forward_pre_hook(lambda *args, i=index: self._enter(i)))
            handles.append(module.register_forward_hook(lambda *args, i=index: self._leave(i)))
        original = recompute.selective_contexts
        try:
            with (torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor),
                  mock.patch.object(recompute, "selective_contexts", lambda: self._selective_contexts(original))):
                yield self
        finally:
            for handle in handles:
                handle.remove()
