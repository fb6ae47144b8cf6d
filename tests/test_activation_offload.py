"""Activation offload (--offload-activations): trained under each layout as on one process; what each
block copies to host memory is what it would have kept for backward (the shared fact); and the
planner takes those bytes off the device's peak, puts them in host memory and on the host link."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plait.facts.activations import activation_bytes_per_layer
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.plan.compute import layer_times
from plait.hardware import hardware, stack_hardware
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload
from tests.cases import layout_world_size, run_config, train_losses
from tests.probes import offloaded_activation_bytes
from tests.test_data_parallel_parity import assert_trains_as_one_process

MODELS = ("tiny", "tiny-llama")
# Plain tensors, DTensors (tp, sp), FSDP2's gathered weights (which stay), and both context-parallel algorithms.
BYTES_LAYOUTS = [{}, {"tp": 2, "sp": True}, {"dp": 2, "zero": 3}, {"cp": 2}, {"cp": 2, "cp_algorithm": "ring"}]
PARITY_LAYOUTS = [
    {"dp": 2, "zero": 3},
    {"tp": 2, "sp": True},
    {"cp": 2, "cp_algorithm": "ring"},
    {"pp": 2, "schedule": "1f1b", "microbatches": 4},  # each stage's blocks hold several micro-batches in host memory
]


def _name(layout: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in layout.items()) or "single"


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", BYTES_LAYOUTS, ids=_name)
def test_each_block_copies_to_host_what_it_would_keep(pool, model, precision, layout):
    """Every rank's every block copies exactly the bytes the activation fact says it keeps without
    offload (each storage once, however many tensors view it), and leaves nothing on the device but
    parameters."""
    config = run_config(model, precision=precision, offload_activations=True, **layout)
    lay = config.layout
    micro_batch = config.train.global_batch // (lay.dp * lay.microbatches)
    fact = activation_bytes_per_layer(config.model, lay, micro_batch, precision, STACKS["plait"])
    for rank in pool.run(offloaded_activation_bytes, layout_world_size(layout), config):
        assert rank == {"moved": [fact] * config.model.layers, "left": 0}


@pytest.fixture(scope="module")
def single_process(pool):
    return {model: pool.run(train_losses, 1, run_config(model))[0] for model in MODELS}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("layout", PARITY_LAYOUTS, ids=_name)
def test_offloaded_layout_matches_single_process(pool, single_process, model, layout):
    """10 steps with every block's saved tensors round-tripped through host copies train as one
    process without offload does (fp32 tolerance of tests/test_data_parallel_parity.py), and send
    what the facts say."""
    assert_trains_as_one_process(pool, single_process[model], run_config(model, offload_activations=True, **layout))


def _gpt2_large(stack: str, offload: bool):
    """gpt2-large on one H100 with 4 micro-batches of 4: nothing to communicate, so the step is the
    layers' work, and one micro-batch's activations are in flight at a time."""
    workload = Workload(model_spec("gpt2-large"), 16, "bf16", STACKS[stack])
    layout = Layout(microbatches=4, offload_activations=offload)
    return workload, evaluate(workload, hardware("h100-sxm"), 1, layout)


@pytest.mark.parametrize("stack", ["plait", "megatron-core"])
def test_offload_moves_the_layers_activations_from_the_device_to_the_host(stack):
    """What the blocks keep leaves the device's peak for host memory; the device keeps one block's
    worth for the block running (its forward's copies until it returns, its backward's while it runs)."""
    workload, kept = _gpt2_large(stack, False)
    _, offloaded = _gpt2_large(stack, True)
    spec, layers = workload.spec, workload.spec.layers
    per_layer = activation_bytes_per_layer(spec, Layout(), 4, "bf16", workload.kernels)
    memory, moved = kept.memory_breakdown, offloaded.memory_breakdown
    assert memory["activations"] - moved["activations"] == pytest.approx(layers * per_layer, rel=1e-9)
    assert moved["other"] - memory["other"] == pytest.approx(per_layer, rel=1e-9)
    assert offloaded.host_memory_bytes == pytest.approx(layers * per_layer, rel=1e-9)
    assert kept.host_memory_bytes == 0
    assert offloaded.peak_memory_bytes < kept.peak_memory_bytes - (layers - 2) * per_layer


def test_plaits_offload_adds_the_host_link_both_ways_to_every_layer():
    """plait copies on the compute stream: each layer of each micro-batch waits for its saved bytes
    to cross the host link (PCIe Gen5 on an H100: 50 GB/s) out in forward and back in backward."""
    workload, kept = _gpt2_large("plait", False)
    _, offloaded = _gpt2_large("plait", True)
    per_layer = activation_bytes_per_layer(workload.spec, Layout(), 4, "bf16", workload.kernels)
    copies = 4 * workload.spec.layers * 2 * per_layer / 50e9
    assert offloaded.step_time_s - kept.step_time_s == pytest.approx(copies, rel=1e-6)


def test_megatron_core_hides_offload_copies_under_the_layers_compute():
    """Megatron-Core copies on a side stream: a layer's copy costs only what exceeds the compute beside it."""
    workload, kept = _gpt2_large("megatron-core", False)
    _, offloaded = _gpt2_large("megatron-core", True)
    hw, spec = stack_hardware(hardware("h100-sxm"), workload.kernels), workload.spec
    per_layer = activation_bytes_per_layer(spec, Layout(), 4, "bf16", workload.kernels)
    copy = per_layer / 50e9
    times = layer_times(spec, hw, Layout(), 4, "bf16", workload.kernels)
    exposed = max(0.0, copy - times.forward) + max(0.0, copy - times.backward)
    assert offloaded.step_time_s - kept.step_time_s == pytest.approx(4 * spec.layers * exposed, rel=1e-6, abs=1e-9)
    serial = replace(workload, kernels=replace(workload.kernels, activation_offload="serial"))
    assert offloaded.step_time_s < evaluate(serial, hw, 1, offloaded.layout).step_time_s
