"""The learning-rate schedule: linear warm-up, then --lr-schedule's shape (``plait.facts.lr_schedule``)
down to lr·min_lr_ratio, as a ``torch.optim.lr_scheduler.LambdaLR`` over the optimizer
(``plait.parallel.optimizer``'s). LambdaLR rather than a ``SequentialLR`` of torch's warm-up and
decay schedulers: those compute each rate from the last one, so a resumed run would have to carry
their state or replay every step, and WSD has no torch scheduler of its own.

The multiplier is a closed form of the step, so a resumed run's scheduler starts at its first step
(``last_epoch``) with no state of its own in the checkpoint, and gives the uninterrupted run's rates.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR

from plait.config import TrainSpec
from plait.facts.lr_schedule import lr_factor


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
