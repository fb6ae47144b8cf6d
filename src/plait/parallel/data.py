"""Data parallelism: replicas whose gradients are averaged over the mesh's ``dp`` dimension."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from plait.topology import Topology


def apply_data_parallel(model: nn.Module, topology: Topology) -> nn.Module:
    """Wrap ``model`` in PyTorch DDP over the dp group (bucketed all-reduce overlapping backward)."""
    if topology.size("dp") == 1:
        return model
    return DistributedDataParallel(model, process_group=topology.group("dp"))


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce unless ``enabled`` (every micro-batch but the last)."""
    if enabled or not isinstance(model, DistributedDataParallel):
        yield
    else:
        with model.no_sync():
            yield
