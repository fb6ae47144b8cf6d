"""Bad pipeline settings end in one clear line before any worker starts."""

from __future__ import annotations

import pytest

from tests.cases import assert_refused_in_one_line

BAD_PIPELINES = {
    "interleaved micro-batches not a multiple of pp": (
        ["--pp", "2", "--schedule", "interleaved-1f1b", "--virtual-stages", "2", "--microbatches", "3",
         "--global-batch", "6"], "multiples of pp=2"),
    "zero-bubble with fewer micro-batches than stages": (
        ["--pp", "4", "--schedule", "zb-h1", "--microbatches", "2"], "at least pp=4 micro-batches"),
    "layers not divisible into pp × v chunks": (
        ["--pp", "2", "--schedule", "interleaved-1f1b", "--virtual-stages", "3", "--microbatches", "2"],
        "cannot be divided into pp × virtual-stages = 6 chunks"),
    "virtual stages without interleaving": (
        ["--pp", "2", "--schedule", "1f1b", "--virtual-stages", "2"], "only applies to the interleaved"),
    "interleaving without virtual stages": (
        ["--pp", "2", "--schedule", "interleaved-1f1b", "--microbatches", "2"], "--virtual-stages 2 or more"),
    "stage split not summing to the layers": (["--pp", "2", "--stage-layers", "3,2"], "summing to the model's 4 layers"),
    "stage split of the wrong length": (["--pp", "2", "--stage-layers", "1,1,2"], "must give 2 chunk sizes"),
    "stage split of interleaved chunks without virtual stages": (
        ["--pp", "2", "--stage-layers", "0,1,1,1,1,0"], "pass --virtual-stages 3 --schedule interleaved-1f1b"),
    "stage split not numbers": (["--pp", "2", "--stage-layers", "two,two"], "comma-separated block counts"),
    "pp larger than the number of layers": (["--pp", "8", "--schedule", "gpipe"], "--pp 8 is larger than the model's 4 layers"),
}


@pytest.mark.parametrize("case", list(BAD_PIPELINES))
def test_bad_pipeline_is_one_clear_line(case, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    flags, expected = BAD_PIPELINES[case]
    assert_refused_in_one_line(["train", "--steps", "2", *flags], expected, capsys, tmp_path)
