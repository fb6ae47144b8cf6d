"""The learning-rate schedule runs on torch.optim.lr_scheduler and gives the warm-up + cosine
rates step for step, from step 0 and from any step a run resumes at."""

from __future__ import annotations

import math

import pytest
import torch

from plait.config import TrainSpec
from plait.train.optim import lr_scheduler


def warmup_then_cosine(step: int, train: TrainSpec) -> float:
    """The schedule written out: linear warm-up to --lr, then cosine to lr·min_lr_ratio."""
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    progress = min(1.0, (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps))
    floor = train.lr * train.min_lr_ratio
    return floor + 0.5 * (train.lr - floor) * (1 + math.cos(math.pi * progress))


def scheduled_rates(train: TrainSpec, first_step: int = 0) -> list[float]:
    """Each step's rate as the training loop reads it: before the step, the scheduler stepped after."""
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([{"params": [weight]}, {"params": [], "weight_decay": 0.0}], lr=123.0)
    schedule = lr_scheduler(optimizer, train, first_step)
    rates = []
    for _ in range(first_step, train.steps):
        rates.append(schedule.get_last_lr()[0])
        assert all(group["lr"] == rates[-1] for group in optimizer.param_groups)
        weight.grad = torch.ones(2)
        optimizer.step()
        schedule.step()
    return rates


@pytest.mark.parametrize("train", [
    TrainSpec(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1),
    TrainSpec(steps=7, lr=3e-3, warmup_steps=0, min_lr_ratio=0.0),
    TrainSpec(steps=5, lr=2e-2, warmup_steps=1, min_lr_ratio=0.5),
    TrainSpec(steps=30, lr=3e-3, warmup_steps=20),
], ids=["warm-up and decay", "no warm-up", "one warm-up step", "defaults"])
def test_scheduler_gives_the_warmup_and_cosine_rates(train):
    rates = scheduled_rates(train)
    assert rates == pytest.approx([warmup_then_cosine(step, train) for step in range(train.steps)], rel=1e-12, abs=0)


def test_a_resumed_schedule_continues_the_uninterrupted_one_exactly():
    train = TrainSpec(steps=40, lr=1e-3, warmup_steps=10)
    straight = scheduled_rates(train)
    for first_step in (3, 10, 27):
        assert scheduled_rates(train, first_step) == straight[first_step:]
