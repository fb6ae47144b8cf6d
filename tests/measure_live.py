"""Measure the most bytes of tensor storage a rank holds at once while some code runs, on any device.

A dispatch mode sees every tensor an op returns (a DTensor as its local shard) and counts each
distinct storage from the first time it is seen until the storage itself is freed (a finalizer on
the storage, which outlives the tensor that made it when a parameter or a view takes it over).
Storages made before the mode started are not counted, nor are those made inside another tensor
subclass's dispatch (DTensor's own ops on its local shards), which the mode does not see; a storage
counts at its size when first seen, so one that FSDP2 later resizes is not followed: measure code
that creates what it holds, outside FSDP2's forward and backward.
"""

from __future__ import annotations

import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakLiveBytes(TorchDispatchMode):
    """``now`` and ``peak``: the bytes of the storages created inside the mode alive now, and the
    most alive at once (``reset_peak`` starts a new peak from now)."""

    def __init__(self):
        super().__init__()
        self.sizes: dict[int, int] = {}  # storage pointer → bytes
        self.now = self.peak = 0

    def reset_peak(self) -> None:
        self.peak = self.now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and not tensor.is_meta:
                self._hold(tensor.to_local() if isinstance(tensor, DTensor) else tensor)
        return out

    def _hold(self, tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
            pointer = storage.data_ptr()
        except RuntimeError:  # a wrapper with no storage of its own (a functional collective's result)
            return
        if pointer in self.sizes or not storage.nbytes():
            return
        self.sizes[pointer] = storage.nbytes()
        self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._release, pointer)

    def _release(self, pointer: int) -> None:
        self.now -= self.sizes.pop(pointer)
