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
