"""AdamW with weight decay on matrices only, and a linear warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from plait.config import TrainSpec
from plait.parallel.sharded_adamw import ShardedAdamW

BETAS = (0.9, 0.95)


def build_optimizer(model: nn.Module, train: TrainSpec, shard_over: DeviceMesh | None = None) -> torch.optim.Optimizer:
    """AdamW decaying 2-D and larger parameters only; its state sharded over ``shard_over`` if given (ZeRO-1)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    keep = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": keep, "weight_decay": 0.0}]
    if shard_over is not None:
        return ShardedAdamW(groups, shard_over, lr=train.lr, betas=BETAS)
    # foreach=False keeps the update order identical for any sharding of the parameters.
    return torch.optim.AdamW(groups, lr=train.lr, betas=BETAS, foreach=False)


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
