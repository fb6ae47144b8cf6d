"""docs/architecture.md's recipes, true by construction: a GPU added to the catalog (one entry and
its driver name, in hardware.py alone) is planned for, dry-run and recognised by its driver's name."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import plait.hardware as catalog
from plait.cli import main

NEW_GPU = "test-gpu"


@pytest.fixture()
def a_new_gpu(monkeypatch):
    """The recipe's two edits: a catalog entry (an H100 of twice the bf16 rate) and its driver name."""
    entry = replace(catalog.CATALOG["h100-sxm"], name=NEW_GPU, bf16_tflops=2 * 989)
    monkeypatch.setitem(catalog.CATALOG, NEW_GPU, entry)
    monkeypatch.setattr(catalog, "DEVICE_NAMES", (("Test GPU", NEW_GPU), *catalog.DEVICE_NAMES))
    return entry


def test_a_gpu_added_to_the_catalog_is_planned_dry_run_and_recognised(a_new_gpu, capsys):
    assert main(["plan", "--model", "llama-8b", "--gpu", NEW_GPU, "--gpus", "16", "--global-batch", "64",
                 "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned and all(["--gpu", NEW_GPU] == row["train_command"][i:i + 2]
                           for row in planned for i in [row["train_command"].index("--gpu")])
    assert main(["train", "--model", "llama-8b", "--gpu", NEW_GPU, "--dp", "8", "--tp", "1", "--pp", "1",
                 "--zero", "3", "--microbatches", "8", "--recompute", "full", "--global-batch", "64", "--dry-run"]) == 0
    assert NEW_GPU in capsys.readouterr().out
    assert catalog.catalog_name_of("NVIDIA Test GPU 80GB") == NEW_GPU
    # the new rate is what the planner times: the same run on the H100 it copies is slower
    assert main(["simulate", "--model", "llama-8b", "--gpu", NEW_GPU, "--gpus", "16", "--dp", "16", "--zero", "3",
                 "--global-batch", "64", "--json"]) == 0
    faster = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(["simulate", "--model", "llama-8b", "--gpu", "h100-sxm", "--gpus", "16", "--dp", "16", "--zero", "3",
                 "--global-batch", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] > faster
