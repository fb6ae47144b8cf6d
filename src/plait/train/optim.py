"""The learning-rate schedule: linear warm-up, then cosine (the optimizer is ``plait.parallel.optimizer``'s)."""

from __future__ import annotations

import math

import torch

from plait.config import TrainSpec


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
