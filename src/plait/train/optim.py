"""AdamW with weight decay on matrices only, and a linear warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from plait.config import TrainSpec
from plait.parallel.data import zero_optimizer_mesh
from plait.parallel.sharded_adamw import ShardedAdamW
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


def build_optimizer(model: nn.Module, train: TrainSpec, topology: Topology | None = None) -> torch.optim.Optimizer:
    """AdamW decaying 2-D and larger parameters only. Under ZeRO stage 1 or 2 of ``topology``, its
    state is sharded over the data-parallel ranks, and for stage 2 the gradients too."""
    groups = parameter_groups(model, train.weight_decay)
    if topology is not None and (mesh := zero_optimizer_mesh(topology)) is not None:
        order = list(model.parameters()) if topology.layout.zero == 2 else None
        return ShardedAdamW(groups, mesh, lr=train.lr, betas=BETAS, gradient_order=order)
    # fused=True: PyTorch's single-kernel AdamW (CPU and CUDA; plain and DTensor parameters), several
    # times faster than the per-tensor loop. Each element's update depends on that element alone,
    # so every sharding of the parameters gives the single-process result.
    return torch.optim.AdamW(groups, lr=train.lr, betas=BETAS, fused=True)


def learning_rate(step: int, train: TrainSpec) -> float:
    """LR of optimizer step ``step`` (0-based): linear warm-up, then cosine to lr·min_lr_ratio."""
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    decay_steps = max(1, train.steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / decay_steps)
    floor = train.lr * train.min_lr_ratio
    return floor + 0.5 * (train.lr - floor) * (1 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
