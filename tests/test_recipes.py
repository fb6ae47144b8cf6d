"""docs/architecture.md's recipes, true by construction: a GPU added to the catalog (one entry and
its driver name, in hardware.py alone) is planned for, dry-run and recognised by its driver's name;
a model family added as a row of block features with a preset of it (in models/spec.py alone) is
built, counted, trained and planned."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch.distributed as dist

import plait.hardware as catalog
import plait.models.spec as models
from plait.cli import main
from plait.errors import ConfigError
from plait.facts.model_state import rank_parameters, rank_tensors
from plait.interop.hf_config import hf_config
from plait.models.flops import flops_per_sequence, parameter_count
from plait.models.transformer import Transformer
from tests.cases import run_config, train_losses
from tests.test_model import counted_flops

NEW_GPU = "test-gpu"
NEW_FAMILY, NEW_MODEL = "test-family", "test-tiny"
# Features no family has together: LayerNorm, rotary positions, a SwiGLU MLP and biases on every linear.
NEW_ROW = models.BlockFeatures(norm="layernorm", positions="rotary", mlp="swiglu", biases=True,
                               hf_model_type="test-model")


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


@pytest.fixture()
def a_new_family(monkeypatch):
    """The recipe's edits: a row of ``FAMILY_FEATURES`` (``FAMILIES`` follows it as the import would
    make it) and a preset of the family."""
    monkeypatch.setitem(models.FAMILY_FEATURES, NEW_FAMILY, NEW_ROW)
    monkeypatch.setattr(models, "FAMILIES", tuple(models.FAMILY_FEATURES))
    monkeypatch.setitem(models.PRESETS, NEW_MODEL, models.ModelSpec(
        NEW_FAMILY, layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, vocab=256, seq_len=32,
        tie_embeddings=False))


@pytest.fixture()
def one_process():
    """A world of one rank in this process, as ``plait train`` on one CPU forms it."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_family_added_as_a_row_of_features_is_built_counted_trained_and_planned(a_new_family, one_process,
                                                                                   capsys):
    spec = models.model_spec(NEW_MODEL)
    model = Transformer(spec)
    # the row reaches the model: LayerNorm's biases, no position table, the gate, biases on the linears
    names = {name for name, _ in model.named_parameters()}
    assert {"norm.bias", "layers.0.mlp.w3.weight", "layers.0.mlp.w1.bias"} <= names
    assert not any("position" in name for name in names)
    parameters = list(model.parameters())
    assert parameter_count(spec) == sum(p.numel() for p in parameters)
    # the planner's per-rank facts count the same (one rank holding the whole model)
    assert rank_parameters(spec, spec.layers, True, True, 1) == sum(p.numel() for p in parameters)
    assert rank_tensors(spec, spec.layers, True, True, 1) == len(parameters)
    assert parameter_count(spec) not in {parameter_count(replace(spec, family=family)) for family in ("gpt2", "llama")}
    forward, backward = counted_flops(spec, model, batch=2)
    assert (forward, backward) == (2 * flops_per_sequence(spec).forward, 2 * flops_per_sequence(spec).backward)

    losses = train_losses(run_config(NEW_MODEL, steps=3, global_batch=2, seq_len=spec.seq_len))
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    capsys.readouterr()  # the steps' log lines

    assert main(["plan", "--model", NEW_MODEL, "--gpus", "8", "--global-batch", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)
    assert main(["train", "--model", NEW_MODEL, "--gpu", "h100-sxm", "--dp", "2", "--tp", "2", "--pp", "2",
                 "--microbatches", "2", "--global-batch", "8", "--dry-run"]) == 0
    with pytest.raises(ConfigError, match="test-model"):  # no Hugging Face layout plait knows holds it
        hf_config(spec)
