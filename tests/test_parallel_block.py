"""Parallel blocks (GPT-J, PaLM, Falcon: x + attention(norm(x)) + mlp(norm(x))): trained under each
layout as on one process, and what they keep, hand to collectives and compute is what the facts say."""

from __future__ import annotations

import pytest

from plait.errors import ConfigError
from plait.facts.activations import activation_bytes_per_layer
from plait.facts.collectives import collective_bytes_per_layer
from plait.facts.stack import STACKS
from plait.interop.hf_config import hf_config
from plait.models.flops import flops_per_sequence, parameter_count
from plait.models.spec import model_spec
from plait.models.transformer import Transformer
from tests.cases import layout_world_size, run_config, train_losses
from tests.probes import layer_costs, saved_activation_bytes
from tests.test_data_parallel_parity import assert_trains_as_one_process
from tests.test_model import counted_flops

MODELS = ("tiny", "tiny-llama")
PARITY_LAYOUTS = [
    {"tp": 2, "sp": True},  # each sub-block gathers the shared norm's output and reduce-scatters its own
    {"cp": 2},
    {"dp": 2, "zero": 3, "recompute": "op"},
    {"pp": 2, "schedule": "1f1b", "microbatches": 4},
]
COST_LAYOUTS = [{}, {"tp": 2}, {"tp": 2, "sp": True}, {"cp": 2}, {"tp": 2, "recompute": "full"}]


def _name(layout: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in layout.items()) or "single"


@pytest.fixture(scope="module")
def single_process(pool):
    return {model: pool.run(train_losses, 1, run_config(model, parallel_block=True))[0] for model in MODELS}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("layout", PARITY_LAYOUTS, ids=_name)
def test_parallel_block_layout_matches_single_process(pool, single_process, model, layout):
    assert_trains_as_one_process(pool, single_process[model], run_config(model, parallel_block=True, **layout))


@pytest.mark.parametrize("model", MODELS)
def test_a_parallel_block_computes_other_numbers_than_a_sequential_one(pool, single_process, model):
    """The flag reaches the model: the same seed trains to other losses one after the other."""
    assert pool.run(train_losses, 1, run_config(model))[0] != single_process[model]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", COST_LAYOUTS, ids=_name)
def test_parallel_block_keeps_and_sends_what_the_facts_say(pool, model, precision, layout):
    """One norm's activations a block (each sub-block's gathered copy of its output under sp), and the
    tensor- and context-parallel collectives of a sequential block, measured on rank 0."""
    config = run_config(model, precision=precision, parallel_block=True, global_batch=2, **layout)
    world = layout_world_size(layout)
    saved = pool.run(saved_activation_bytes, world, config)[0]
    lay = config.layout
    fact = activation_bytes_per_layer(config.model, lay, 2, precision, STACKS["plait"])
    assert saved == [fact] * config.model.layers
    if precision == "fp32":
        measured = pool.run(layer_costs, world, config)[0]
        assert measured["bytes"] == collective_bytes_per_layer(config.model, lay, 2)


@pytest.mark.parametrize("model", MODELS)
def test_parallel_block_parameters_and_flops_are_the_built_models(model):
    spec = model_spec(model, seq_len=32, parallel_block=True)
    built = Transformer(spec)
    assert parameter_count(spec) == sum(p.numel() for p in built.parameters())
    assert parameter_count(spec) < parameter_count(model_spec(model, seq_len=32))  # one norm a block fewer
    forward, backward = counted_flops(spec, built, batch=2)
    expected = flops_per_sequence(spec)
    assert (forward, backward) == (2 * expected.forward, 2 * expected.backward)


def test_hugging_face_export_refuses_a_parallel_block():
    with pytest.raises(ConfigError, match="side by side"):
        hf_config(model_spec("tiny", parallel_block=True))
