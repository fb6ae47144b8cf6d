"""Measure the most bytes of tensor storage a rank holds at once while some code runs, on any device.

A dispatch mode sees every tensor an op returns (a DTensor as its local shard) and counts each
distinct storage from the first tensor on it until the last tensor on it is gone. Storages made
before the mode started are not counted, nor are those made inside another tensor subclass's
dispatch (DTensor's own ops on its local shards), which the mode does not see: measure code that
creates what it holds.
"""

from __future__ import annotations

import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakLiveBytes(TorchDispatchMode):
    """``peak``: the most bytes of the storages created inside the mode that were alive at once."""

    def __init__(self):
        super().__init__()
        self.tensors: dict[int, int] = {}  # storage pointer → tensors alive on it
        self.sizes: dict[int, int] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._hold(tensor.to_local() if isinstance(tensor, DTensor) else tensor)
        return out

    def _hold(self, tensor: torch.Tensor) -> None:
        if tensor.is_meta:
            return
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if not pointer:
            return
        if pointer not in self.tensors:
            self.tensors[pointer], self.sizes[pointer] = 0, storage.nbytes()
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
        self.tensors[pointer] += 1
        weakref.finalize(tensor, self._release, pointer)

    def _release(self, pointer: int) -> None:
        self.tensors[pointer] -= 1
        if not self.tensors[pointer]:
            del self.tensors[pointer]
            self.now -= self.sizes.pop(pointer)
