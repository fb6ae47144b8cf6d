"""Count the bytes each collective is handed while a region runs (forward and backward alike).

A dispatch mode sees every functional collective: those DTensor issues for tensor and sequence
parallelism and those plait's own communication modules issue, and the point-to-point sends of ring
attention. Bytes are the size of the tensor a rank hands the collective (all-gather: its shard;
reduce-scatter and all-reduce: the whole; a send: what it sends, receives not counted).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_functional = torch.ops._c10d_functional
COLLECTIVES = {
    _functional.all_reduce: "all_reduce",
    _functional.all_gather_into_tensor: "all_gather",
    _functional.reduce_scatter_tensor: "reduce_scatter",
    _functional.all_to_all_single: "all_to_all",
    torch.ops.c10d.send: "send",
}


class CollectiveBytes(TorchDispatchMode):
    """``with CollectiveBytes() as counted: ...`` then ``counted.bytes['all_reduce']``, ``counted.calls``."""

    def __init__(self):
        super().__init__()
        self.bytes: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = COLLECTIVES.get(func._overloadpacket)
        if name is not None:
            tensors = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]  # c10d.send takes a list
            self.bytes[name] += sum(tensor.numel() * tensor.element_size() for tensor in tensors)
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))
