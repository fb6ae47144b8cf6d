"""The memory facts the engine and the planner share equal what plait's engine really holds.

For every layout of the parity matrix (tests/test_data_parallel_parity.py, test_tensor_context_parity.py,
test_pipeline_parity.py, test_zero.py), both families, fp32 and bf16: every rank's measured
parameters, gradients and optimizer state equal ``facts.model_state.rank_model_states``, the bytes
every block keeps for backward equal ``facts.activations.activation_bytes_per_layer`` for plait's
stack, and the planner's per-rank memory (``plan.simulate``) is built from those same figures.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from plait.facts.activations import activation_bytes_per_layer, autocast_copies_weights, saved_bytes_per_layer
from plait.facts.model_state import pipeline_share, rank_model_states
from plait.facts.recompute import block_recompute, chunk_recompute
from plait.facts.stack import STACKS
from plait.hardware import hardware
from plait.plan.simulate import chunk_activation_bytes, stage_memory
from plait.plan.workload import Workload
from plait.schedules.split import split_layers
from plait.train.loop import build_model
from tests.cases import layout_world_size, run_config
from tests.probes import autocast_during_backward, held_model_state, saved_activation_bytes
from tests.schedule_cases import EVERY_SCHEDULE
from tests.test_pipeline_parity import layers_for, small_config
from tests.test_tensor_context_parity import LAYOUTS as TENSOR_CONTEXT_LAYOUTS

MODELS = ("tiny", "tiny-llama")
PRECISIONS = ("fp32", "bf16")
# test_data_parallel_parity.py and test_zero.py: dp 2 and 4 under every ZeRO stage, with accumulation.
DATA_PARALLEL = [{"dp": dp, "zero": stage} for dp in (2, 4) for stage in (0, 1, 2, 3)]
DATA_PARALLEL += [{"dp": 2, "microbatches": 2}, {"dp": 4, "zero": 2, "microbatches": 2}, {"cp": 2, "zero": 2}]
# tests/test_ring_attention.py: ring context parallelism keeps k, v with their kv-heads; and
# tests/test_gathered_attention.py: all-gather keeps every rank's.
RING = [{"cp": 2, "cp_algorithm": "ring"}, {"cp": 4, "tp": 2, "cp_algorithm": "ring"},
        {"cp": 4, "tp": 2, "cp_algorithm": "all-gather"}, {"cp": 2, "cp_algorithm": "all-gather", "recompute": "op"}]
# Per-operation checkpointing under each precision's weights: autocast over fp32 (ZeRO 0), bf16 weights
# (ZeRO 1) and FSDP2's bf16 gathers (ZeRO-3); with sp's reduce-scatters and the head exchange kept.
OP_RECOMPUTE = [{"recompute": "op"}, {"dp": 2, "zero": 1, "recompute": "op"}, {"dp": 2, "zero": 3, "recompute": "op"},
                {"tp": 2, "sp": True, "recompute": "op"}, {"cp": 2, "recompute": "op"}]
MATRIX = [{}, *DATA_PARALLEL, *TENSOR_CONTEXT_LAYOUTS, *RING, *OP_RECOMPUTE]
# test_pipeline_parity.py: pp 2 and 4, one chunk or two a rank, on its narrow models.
PIPELINES = sorted({(pp, v) for pp in (2, 4) for _, v in EVERY_SCHEDULE})
MODEL_STATE_FIELDS = ("dp", "tp", "cp", "pp", "virtual_stages", "stage_layers", "zero")
ACTIVATION_FIELDS = ("dp", "tp", "sp", "cp", "recompute", "zero", "cp_algorithm")


def _distinct(layouts: list[dict], fields: tuple[str, ...]) -> list[dict]:
    """One layout per distinct value of ``fields`` (what the fact depends on), the first seen kept."""
    kept: dict[tuple, dict] = {}
    for layout in layouts:
        kept.setdefault(tuple(layout.get(name) for name in fields), layout)
    return list(kept.values())


def _name(layout: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in layout.items()) or "single"


def _config(model: str, precision: str, layout: dict, pipeline_case: bool = False):
    if pipeline_case:
        pp, v = layout["pp"], layout["virtual_stages"]
        config = small_config(model, layers_for(pp, v), pp=pp, virtual_stages=v, microbatches=pp,
                              schedule="interleaved-1f1b" if v > 1 else "1f1b")
        return replace(config, train=replace(config.train, steps=1, precision=precision))
    return run_config(model, steps=1, precision=precision, **layout)


MODEL_STATE_CASES = [(model, precision, layout, False) for model in MODELS for precision in PRECISIONS
                     for layout in _distinct(MATRIX, MODEL_STATE_FIELDS)]
MODEL_STATE_CASES += [(model, precision, {"pp": pp, "virtual_stages": v}, True) for model in MODELS
                      for precision in PRECISIONS for pp, v in PIPELINES]


@pytest.fixture(scope="module")
def held(pool):
    """Every rank's measured model state (with its pp and dp coordinates), one run per case."""
    return {index: pool.run(held_model_state, layout_world_size(case[2]), _config(*case))
            for index, case in enumerate(MODEL_STATE_CASES)}


@pytest.mark.parametrize("index", range(len(MODEL_STATE_CASES)),
                         ids=[f"{m}-{p}-{_name(layout)}" for m, p, layout, _ in MODEL_STATE_CASES])
def test_every_rank_holds_the_shared_model_state_fact(held, index):
    config = _config(*MODEL_STATE_CASES[index])
    for outcome in held[index]:
        share = pipeline_share(config.model, config.layout, outcome["pp"])
        fact = rank_model_states(config.model, config.layout, config.train.precision, share, STACKS["plait"],
                                 outcome["dp"], outcome["cp"])
        assert outcome["held"] == {"parameters": fact.params, "gradients": fact.grads, "optimizer": fact.optimizer}


ACTIVATION_CASES = [(model, precision, layout) for model in MODELS for precision in PRECISIONS
                    for layout in _distinct([{k: v for k, v in layout.items() if k in ACTIVATION_FIELDS}
                                             | ({"dp": 1, "zero": 0} if layout.get("pp", 1) > 1 else {})
                                             for layout in MATRIX], ACTIVATION_FIELDS)]


@pytest.fixture(scope="module")
def saved(pool):
    """Bytes each block keeps on every rank, one run per case."""
    return {index: pool.run(saved_activation_bytes, layout_world_size(layout), run_config(model, precision=precision, **layout))
            for index, (model, precision, layout) in enumerate(ACTIVATION_CASES)}


@pytest.mark.parametrize("index", range(len(ACTIVATION_CASES)),
                         ids=[f"{m}-{p}-{_name(layout)}" for m, p, layout in ACTIVATION_CASES])
def test_every_rank_keeps_the_shared_activation_fact(saved, index):
    model, precision, layout = ACTIVATION_CASES[index]
    config = run_config(model, precision=precision, **layout)
    lay = config.layout
    micro_batch = config.train.global_batch // (lay.dp * lay.microbatches)
    fact = activation_bytes_per_layer(config.model, lay, micro_batch, precision, STACKS["plait"])
    assert saved[index] == [[fact] * len(blocks) for blocks in saved[index]]


@pytest.mark.parametrize("model", MODELS)
def test_a_pipeline_stage_under_zero_1_keeps_bf16_activations_and_no_weight_copies(pool, model):
    """bf16 on stages under ZeRO-1: the stage's weights are bf16 (plait.parallel.data_parallel.data.hold_weights), so
    its blocks keep what the whole layer in bf16 keeps and no bf16 copy of any weight, measured block
    by block; at ZeRO 0 the same stage keeps more (autocast's copies over fp32 weights)."""
    layout = {"dp": 2, "pp": 2, "zero": 1, "schedule": "1f1b", "microbatches": 2}
    config = run_config(model, precision="bf16", **layout)
    lay = config.layout
    batch = config.train.global_batch // lay.dp  # the probe runs a data-parallel rank's whole batch at once

    def fact(zero: int) -> float:
        return activation_bytes_per_layer(config.model, replace(lay, zero=zero), batch, "bf16", STACKS["plait"])

    saved = pool.run(saved_activation_bytes, layout_world_size(layout), config)
    assert saved == [[fact(1)] * len(blocks) for blocks in saved] and fact(1) < fact(0)


@pytest.mark.parametrize("model", MODELS)
def test_under_recompute_layers_the_first_blocks_of_a_chunk_keep_only_their_inputs(pool, model):
    """--recompute full --recompute-layers 2 on a 4-block model: the first two blocks keep what full
    recomputation keeps, the last two what no recomputation keeps, measured block by block."""
    config = run_config(model, precision="fp32", recompute="full", recompute_layers=2)
    lay = config.layout
    modes = block_recompute(config.model, lay)
    assert modes == ("full", "full", "none", "none")
    micro_batch = config.train.global_batch // (lay.dp * lay.microbatches)
    facts = [activation_bytes_per_layer(config.model, replace(lay, recompute=mode), micro_batch, "fp32", STACKS["plait"])
             for mode in modes]
    assert pool.run(saved_activation_bytes, 1, config)[0] == facts


@pytest.mark.parametrize("recompute", ["full", "op"])
def test_the_backward_runs_outside_autocast_so_its_weight_casts_are_freed(pool, recompute):
    """Autocast caches the bf16 cast of every weight until its context ends: around the backward too,
    recomputed blocks would hold all of them through it, which the planner's facts (a recomputed
    block keeps its input alone) do not count. Every gradient arrives with autocast off."""
    config = run_config("tiny-llama", precision="bf16", recompute=recompute)
    states = pool.run(autocast_during_backward, 1, config)[0]
    assert len(states) == len(list(build_model(config, torch.device("cpu")).parameters())) and not any(states)


def test_bf16_autocast_keeps_bf16_copies_of_the_weights_only_over_fp32_weights():
    """ZeRO 1 and 2 hold bf16 weights (on pipeline stages too) and ZeRO-3 frees its gathered ones;
    stage 0 and ZeRO-3 on a pipeline stage (fp32 weights, gathered in fp32) keep one bf16 copy a
    linear, a micro-batch."""
    assert [autocast_copies_weights("bf16", zero) for zero in (0, 1, 2, 3)] == [True, False, False, False]
    assert [autocast_copies_weights("bf16", zero, pp=2) for zero in (0, 1, 2, 3)] == [True, False, False, True]
    assert not autocast_copies_weights("fp32", 0)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", _distinct(MATRIX, MODEL_STATE_FIELDS + ACTIVATION_FIELDS), ids=_name)
def test_the_planner_predicts_plaits_own_figures(model, precision, layout):
    """For plait's stack the planner's model state and activations per rank are the engine's facts."""
    config = run_config(model, precision=precision, **layout)
    lay, spec = config.layout, config.model
    workload = Workload(spec, config.train.global_batch, precision, STACKS["plait"])
    micro_batch = config.train.global_batch // (lay.dp * lay.microbatches)
    counts = tuple(len(r) for r in split_layers(spec, lay.pp, lay.virtual_stages, lay.stage_layers))

    def per_layer(mode: str) -> int:
        return sum(saved_bytes_per_layer(spec, replace(lay, recompute=mode), micro_batch, precision).values())

    layers = [sum(n * per_layer(mode) for mode, n in chunk_recompute(lay, blocks)) for blocks in counts]
    chunks = chunk_activation_bytes(workload, lay, micro_batch, counts)
    assert chunks[:-1] == layers[:-1]
    assert chunks[-1] >= layers[-1]
    for rank in range(lay.pp):
        share = pipeline_share(spec, lay, rank)
        memory = stage_memory(workload, hardware("a100-80gb"), lay, micro_batch, share, 0.0, False)
        fact = rank_model_states(spec, lay, precision, share)
        assert (memory.params, memory.grads, memory.optimizer) == (fact.params, fact.grads, fact.optimizer)
