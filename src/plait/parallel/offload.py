"""Activation offload (``--offload-activations``), applied from outside the model.

Each block's forward runs under saved-tensor hooks that copy what autograd keeps for backward
into host memory as it is saved, and copy it back when backward reads it, so between a block's
forward and its backward (a whole pipeline's worth of micro-batches under 1F1B) the device holds
none of it. Not ``torch.autograd.graph.save_on_cpu``, which copies each saved tensor on its own:
the norm output that three projections save would cross three times, every weight (and its
transpose) every micro-batch, and a DTensor cannot be copied as a plain tensor. Here each distinct
storage crosses once each way, parameters stay where they are, and a DTensor travels as its
local shard.

The copies run on the compute stream (into pinned memory on a GPU), so every byte costs the host
link's time on the step's critical path (plait.plan.costs counts it); Megatron-Core's offload
overlaps them on a side stream. On a CPU the host is the device: the copies still run, through the
same path, and save nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor

from plait.models.transformer import Transformer


class _HostStorage:
    """One storage copied to host, and its copy back on the device while backward still reads it."""

    __slots__ = ("host", "device", "on_device", "unread")

    def __init__(self, storage: torch.UntypedStorage):
        self.host = to_host(storage)
        self.device = storage.device
        self.on_device: torch.UntypedStorage | None = None
        self.unread = 0  # saved tensors on it that backward has not read yet


@dataclass(frozen=True)
class _Saved:
    """A saved tensor as a view of an offloaded storage (with its DTensor spec, if it was one)."""

    stored: _HostStorage
    offset: int
    size: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype
    spec: object = None


def to_host(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A host copy of ``storage`` (pinned when it comes from a GPU, so that the copy need not wait)."""
    pinned = storage.device.type == "cuda"
    host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=pinned).untyped_storage()
    host.copy_(storage, non_blocking=pinned)
    return host


def to_device(host: torch.UntypedStorage, device: torch.device) -> torch.UntypedStorage:
    on_device = torch.empty(host.nbytes(), dtype=torch.uint8, device=device).untyped_storage()
    on_device.copy_(host, non_blocking=device.type == "cuda")
    return on_device


def is_parameter(tensor: torch.Tensor) -> bool:
    """A parameter or a view of one (a linear saves its weight's transpose): it stays on the device."""
    return isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter)


def local_data(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding ``tensor``'s data on this rank: a DTensor's shard, a collective's
    result once waited for."""
    local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
    return local.trigger_wait() if isinstance(local, AsyncCollectiveTensor) else local


class BlockOffload:
    """The saved-tensor hooks of one forward of one block. A storage saved twice is copied once;
    the forward keeps each device storage it copied alive until it returns, so that an address
    cannot be reused for another tensor while the forward still maps it to a host copy."""

    def __init__(self):
        self.copied: dict[int, tuple[_HostStorage, torch.UntypedStorage]] = {}

    def pack(self, tensor: torch.Tensor):
        if is_parameter(tensor):
            return tensor
        local = local_data(tensor)
        storage = local.untyped_storage()
        if storage.nbytes() == 0:
            return tensor
        key = storage.data_ptr()
        if key not in self.copied:
            self.copied[key] = (_HostStorage(storage), storage)
        stored = self.copied[key][0]
        stored.unread += 1
        spec = tensor._spec if isinstance(tensor, DTensor) else None
        return _Saved(stored, local.storage_offset(), local.size(), local.stride(), local.dtype, spec)

    @staticmethod
    def unpack(saved):
        if not isinstance(saved, _Saved):
            return saved
        stored = saved.stored
        if stored.on_device is None:
            stored.on_device = to_device(stored.host, stored.device)
        on_device = stored.on_device
        stored.unread -= 1
        if stored.unread <= 0:  # the last reader: the device copy lives on only in what it returns
            stored.on_device = None
        local = torch.empty(0, dtype=saved.dtype, device=stored.device).set_(on_device, saved.offset, saved.size,
                                                                             saved.stride)
        if saved.spec is None:
            return local
        return DTensor(local, saved.spec, requires_grad=False)

    def moved_bytes(self) -> int:
        """Bytes this forward copied to host."""
        return sum(stored.host.nbytes() for stored, _ in self.copied.values())

    def finish(self) -> None:
        """The forward has returned: its device storages may go."""
        self.copied = {key: (stored, None) for key, (stored, _) in self.copied.items()}


class ActivationsOffloaded:
    """Mixin placed before a block's class: what its forward saves for backward waits in host memory."""

    def forward(self, *args, **kwargs):
        hooks = new_block_offload()
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
            out = super().forward(*args, **kwargs)
        hooks.finish()
        return out


def new_block_offload() -> BlockOffload:
    """The hooks one block forward runs under (a function, so that a test can watch what they move)."""
    return BlockOffload()


def apply_activation_offload(model: Transformer, offload: bool) -> Transformer:
    """Offload every block's saved activations to host memory when ``offload``."""
    if offload:
        for block in model.layers.values():
            if not isinstance(block, ActivationsOffloaded):
                block.__class__ = offloaded_class(type(block))
    return model


@functools.cache
def offloaded_class(cls: type) -> type:
    """One offloaded subclass per block class, as FSDP2 keeps one per class it wraps."""
    return type(f"Offloaded{cls.__name__}", (ActivationsOffloaded, cls), {})
