"""The learning-rate schedule runs on torch.optim.lr_scheduler and gives the warm-up + cosine
rates step for step, and the linear, constant and warmup-stable-decay rates at chosen steps, from
step 0 and from any step a run resumes at."""

from __future__ import annotations

import math
import re

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


# 110 steps: 10 of warm-up to 1e-3, then 100 (step 10 + k is k% of the way), the floor 1e-4.
SHAPED = dict(steps=110, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)


@pytest.mark.parametrize("schedule, fraction, expected", [
    ("linear", 0.2, {0: 1e-4, 9: 1e-3, 10: 1e-3, 35: 1e-4 + 9e-4 * 0.75, 60: 5.5e-4, 109: 1e-4 + 9e-4 * 0.01}),
    ("constant", 0.2, {4: 5e-4, 10: 1e-3, 60: 1e-3, 109: 1e-3}),
    # stable to step 10 + 80, then linear over the last 20: step 95 is a quarter of the way down
    ("wsd", 0.2, {9: 1e-3, 10: 1e-3, 89: 1e-3, 90: 1e-3, 95: 1e-3 - 9e-4 * 0.25, 100: 5.5e-4, 109: 1e-4 + 9e-4 * 0.05}),
    ("wsd", 0.5, {59: 1e-3, 60: 1e-3, 85: 5.5e-4, 109: 1e-4 + 9e-4 * 0.02}),
], ids=["linear", "constant", "wsd-0.2", "wsd-0.5"])
def test_each_schedule_gives_its_formula_at_chosen_steps(schedule, fraction, expected):
    train = TrainSpec(**SHAPED, lr_schedule=schedule, decay_fraction=fraction)
    rates = scheduled_rates(train)
    assert {step: rates[step] for step in expected} == pytest.approx(expected, rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant", "wsd"])
def test_a_resumed_schedule_continues_the_uninterrupted_one_exactly(schedule):
    train = TrainSpec(steps=40, lr=1e-3, warmup_steps=10, lr_schedule=schedule)
    straight = scheduled_rates(train)
    for first_step in (3, 10, 27, 35):
        assert scheduled_rates(train, first_step) == straight[first_step:]


@pytest.mark.parametrize("values, words", [
    (dict(lr_schedule="step"), "lr-schedule 'step' is unknown; use one of cosine, linear, constant, wsd"),
    (dict(decay_fraction=0.0), "decay-fraction must lie in (0, 1]"),
    (dict(decay_fraction=1.5), "decay-fraction must lie in (0, 1]"),
])
def test_a_bad_schedule_is_refused_in_one_line(values, words):
    from plait.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(words)):
        TrainSpec(**values).validate()


def test_the_schedule_flags_reach_the_run():
    from plait.cli import build_parser
    from plait.config import config_from_args

    args = build_parser().parse_args(["train", "--dp", "1", "--lr-schedule", "wsd", "--decay-fraction", "0.3",
                                      "--min-lr-ratio", "0.05", "--grad-clip", "0"])
    train = config_from_args(args).train
    assert (train.lr_schedule, train.decay_fraction, train.min_lr_ratio, train.grad_clip) == ("wsd", 0.3, 0.05, 0.0)
