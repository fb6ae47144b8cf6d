"""The learning-rate schedules' shapes, pure: the multiple of the peak rate at each step.

Every schedule warms up linearly over ``warmup_steps``, then follows its shape from 1 down to the
floor ``min_lr_ratio`` over the remaining steps, ``progress`` running from 0 to 1 across them:

    cosine    the half cosine (the default)
    linear    a straight line
    constant  no decay: the peak rate to the end (the floor is not used)
    wsd       warmup-stable-decay: the peak rate, then a straight line to the floor over the last
              ``decay_fraction`` of the steps after warm-up

A closed form of the step, so a resumed run's scheduler needs no state of its own
(``plait.train.optim``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

# name → (progress in [0, 1], decay_fraction) → share of the way from the floor up to the peak
LR_SHAPES: dict[str, Callable[[float, float], float]] = {
    "cosine": lambda progress, _: 0.5 * (1 + math.cos(math.pi * progress)),
    "linear": lambda progress, _: 1 - progress,
    "constant": lambda progress, _: 1.0,
    "wsd": lambda progress, decay_fraction: min(1.0, (1 - progress) / decay_fraction),
}
LR_SCHEDULES = tuple(LR_SHAPES)


def lr_factor(step: int, train) -> float:
    """The multiple of the peak --lr at optimizer step ``step`` (0-based) of a ``TrainSpec``."""
    if step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    progress = min(1.0, (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps))
    shape = LR_SHAPES[train.lr_schedule](progress, train.decay_fraction)
    return train.min_lr_ratio + (1 - train.min_lr_ratio) * shape
