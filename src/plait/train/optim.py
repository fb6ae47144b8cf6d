"""The learning-rate schedule: linear warm-up, then cosine to lr·min_lr_ratio, as a
``torch.optim.lr_scheduler.LambdaLR`` over the optimizer (``plait.parallel.optimizer``'s).

The multiplier is a closed form of the step, so a resumed run's scheduler starts at its first step
(``last_epoch``) with no state of its own in the checkpoint, and gives the uninterrupted run's rates.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR

from plait.config import TrainSpec


def lr_factor(step: int, train: TrainSpec) -> float:
    """The multiple of the peak --lr at optimizer step ``step`` (0-based)."""
    if step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    decay_steps = max(1, train.steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / decay_steps)
    return train.min_lr_ratio + 0.5 * (1 - train.min_lr_ratio) * (1 + math.cos(math.pi * progress))


def learning_rate(step: int, train: TrainSpec) -> float:
    """LR of optimizer step ``step``: what ``lr_scheduler`` sets for it."""
    return train.lr * lr_factor(step, train)


def lr_scheduler(optimizer: torch.optim.Optimizer, train: TrainSpec, first_step: int = 0) -> LambdaLR:
    """The schedule over ``optimizer``, its rate set for step ``first_step``; step it after each optimizer step."""
    for group in optimizer.param_groups:
        group["initial_lr"] = train.lr  # what LambdaLR multiplies; needed to start past step 0
    return LambdaLR(optimizer, partial(lr_factor, train=train), last_epoch=first_step - 1)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
