"""Training-loop pieces: the learning-rate schedule and mixed precision."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from plait.config import TrainSpec
from plait.train.optim import learning_rate
from tests.cases import run_config, train_losses


def test_learning_rate_warms_up_then_decays_to_its_floor():
    spec = TrainSpec(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    rates = [learning_rate(step, spec) for step in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(a < b for a, b in zip(rates[:10], rates[1:10]))
    assert all(a >= b for a, b in zip(rates[10:], rates[11:]))
    halfway = learning_rate(10 + 45, spec)
    assert halfway == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + math.cos(math.pi / 2)))
    assert learning_rate(100, spec) == pytest.approx(1e-4)


def test_bf16_trains_close_to_fp32_but_not_identically(pool):
    fp32 = run_config("tiny-llama")
    bf16 = replace(fp32, train=replace(fp32.train, precision="bf16"))
    [full], [mixed] = pool.run(train_losses, 1, fp32), pool.run(train_losses, 1, bf16)
    assert mixed[-1] < mixed[0]
    assert mixed != full, "bf16 autocast should change the arithmetic"
    for a, b in zip(full, mixed):
        assert abs(a - b) < 0.02 * a
