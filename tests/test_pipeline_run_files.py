"""A pipeline run writes its measured bubble into summary.json and draws timeline.png."""

from __future__ import annotations

import json

import pytest

from plait.schedules import generate, theoretical_bubble
from tests.cases import train_losses
from tests.test_pipeline_parity import small_config


def test_summary_has_bubble_and_timeline_is_drawn(pool, tmp_path):
    config = small_config("tiny", 4, pp=2, schedule="zb-h1", microbatches=4)
    pool.run(train_losses, 2, config, str(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert 0.0 < summary["bubble_fraction"] < 1.0
    assert summary["bubble_fraction_theory"] == pytest.approx(theoretical_bubble(generate("zb-h1", 2, 4)))
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


def test_pipeline_checkpoint_resumes_under_other_layouts(pool, tmp_path):
    """Stages keep single-device parameter names, so a pp checkpoint loads without pipelining and back."""
    from dataclasses import replace

    def config(steps: int, **layout):
        base = small_config("tiny", 4, **layout)
        return replace(base, train=replace(base.train, steps=steps, checkpoint_every=3))

    straight = pool.run(train_losses, 1, config(6))[0]
    saved = str(tmp_path / "saved")
    pool.run(train_losses, 2, config(3, pp=2, schedule="zb-h1", microbatches=2), saved)
    for layout in ({"pp": 2, "schedule": "gpipe", "microbatches": 4}, {}):
        resumed_config = config(6, **layout)
        resumed_config = replace(resumed_config, train=replace(resumed_config.train, resume=True, checkpoint_every=0))
        resumed = pool.run(train_losses, layout.get("pp", 1), resumed_config, saved)[0]
        for a, b in zip(straight[3:], resumed, strict=True):
            assert abs(a - b) <= 1e-5 * abs(a), (layout, straight[3:], resumed)
