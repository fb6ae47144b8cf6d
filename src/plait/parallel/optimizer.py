"""The optimizer: AdamW decaying matrices only, its state sharded over ZeRO's group (the dp and cp
ranks) under ZeRO stages 1 and 2."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from plait.parallel.data_parallel.data import zero_optimizer_mesh
from plait.parallel.data_parallel.gradient_shards import GradientSharding
from plait.parallel.data_parallel.sharded_adamw import ShardedAdamW
from plait.parallel.data_parallel.zero_rows import RowSplit
from plait.topology import Topology

BETAS = (0.9, 0.95)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on 2-D and larger parameters only. DTensor and plain parameters go to separate
    groups: the fused kernel takes one kind per call, and tensor parallelism leaves some plain."""
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for param in model.parameters():
        if param.requires_grad:
            groups.setdefault((param.dim() >= 2, isinstance(param, DTensor)), []).append(param)
    return [{"params": params, "weight_decay": weight_decay if decays else 0.0} for (decays, _), params in groups.items()]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, topology: Topology | None = None,
                    chunks: Mapping[int, list[nn.Parameter]] | None = None) -> torch.optim.Optimizer:
    """AdamW decaying 2-D and larger parameters only. Under ZeRO stage 1 or 2 of ``topology``, its
    state is sharded over ZeRO's group (the dp and cp ranks), and for stage 2 the gradients too, reduced in
    buckets as each of ``chunks`` (a pipeline stage's chunks: chunk → its parameters in order;
    default the whole model) finishes its backward."""
    groups = parameter_groups(model, weight_decay)
    if topology is not None and (mesh := zero_optimizer_mesh(topology)) is not None:
        sharding = (GradientSharding(chunks or {0: list(model.parameters())}, per_chunk=topology.size("pp") > 1)
                    if topology.layout.zero == 2 else None)
        return ShardedAdamW(groups, RowSplit(mesh, topology.tp_dp_mesh), lr=lr, betas=BETAS, gradient_sharding=sharding)
    # fused=True: PyTorch's single-kernel AdamW (CPU and CUDA; plain and DTensor parameters), several
    # times faster than the per-tensor loop. Each element's update depends on that element alone,
    # so every sharding of the parameters gives the single-process result.
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS, fused=True)
