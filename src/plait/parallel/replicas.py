"""Average gradients over ranks that hold the same weights but saw different tokens, where DDP does not.

Context-parallel ranks always need it: each computed its gradients from its own slice of the
sequences. Data-parallel ranks need it only under tensor parallelism, because PyTorch DDP cannot
hold DTensor weights (``apply_data_parallel`` leaves such a model unwrapped): then the average is
taken here, after backward, without DDP's bucketing and overlap.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.tensor import DTensor

from plait.topology import Topology


def replica_dims(topology: Topology) -> list[str]:
    """The mesh dimensions over which this module averages gradients."""
    dims = ["dp"] if topology.size("tp") > 1 and topology.size("dp") > 1 else []
    return dims + (["cp"] if topology.size("cp") > 1 else [])


@torch.no_grad()
def average_replica_gradients(model: nn.Module, topology: Topology) -> None:
    """After the step's backward (and after DDP's own reduction, which would overwrite a gradient
    changed while in flight): average every gradient over ``replica_dims``."""
    for dim in replica_dims(topology):
        group, size = topology.group(dim), topology.size(dim)
        for param in model.parameters():
            if param.grad is not None:
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                grad.copy_(funcol.all_reduce(grad, "sum", group).wait() / size)
