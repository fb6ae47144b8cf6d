"""Average gradients over ranks that hold the same weights but saw different tokens, where DDP does not.

Context-parallel ranks always need it: each computed its gradients from its own slice of the
sequences. Data-parallel ranks need it only under tensor parallelism below ZeRO-3, because PyTorch
DDP cannot hold DTensor weights (``apply_data_parallel`` leaves such a model unwrapped): then the
average is taken here, after backward, without DDP's bucketing and overlap. (FSDP2, ZeRO-3, does
hold them and reduces over dp itself.) Pipeline stages average over dp and cp here too
(``average_gradients``): DDP's per-backward hooks cannot follow their schedules.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.tensor import DTensor

from plait.topology import Topology


def replica_dims(topology: Topology) -> list[str]:
    """The mesh dimensions over which this module averages gradients."""
    dims = ["dp"] if topology.size("tp") > 1 and topology.size("dp") > 1 and topology.layout.zero < 3 else []
    return dims + (["cp"] if topology.size("cp") > 1 else [])


def average_replica_gradients(model: nn.Module, topology: Topology) -> None:
    """After the step's backward (and after DDP's own reduction, which would overwrite a gradient
    changed while in flight): average every gradient over ``replica_dims``."""
    average_gradients(model, topology, replica_dims(topology))


@torch.no_grad()
def average_gradients(model: nn.Module, topology: Topology, dims: list[str]) -> None:
    """Average every gradient of ``model`` over the mesh dimensions ``dims``, in one flat all-reduce
    per dimension and dtype, so the collective's latency is paid once rather than per tensor."""
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters() if p.grad is not None]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for dim in dims:
        group, size = topology.group(dim), topology.size(dim)
        for same in by_dtype.values():
            flat = funcol.all_reduce(torch.cat([g.reshape(-1) for g in same]), "sum", group).wait() / size
            for grad, part in zip(same, flat.split([g.numel() for g in same])):
                grad.copy_(part.view_as(grad))
