"""ZeRO stages 1–3 compose with tensor, context and pipeline parallelism and with hybrid sharding: the single-process
losses step for step (fp32, 1e-5 relative), the final weights within the suite's tolerance, and
per-rank model-state bytes equal to the shared formula (plait.facts.model_state)."""

from __future__ import annotations

import pytest

from plait.facts.model_state import pipeline_share, plait_model_states
from tests.cases import assert_traced_volumes_are_the_facts, layout_world_size, run_config, train_outcome
from tests.test_data_parallel_parity import assert_same_losses, assert_same_weights

LAYOUTS = [
    {"dp": 2, "tp": 2, "zero": 1},
    {"dp": 2, "tp": 2, "zero": 2},
    {"dp": 2, "tp": 2, "sp": True, "zero": 2, "microbatches": 2},
    {"dp": 2, "cp": 2, "zero": 1},
    {"dp": 2, "cp": 2, "zero": 2},
    # ZeRO shards over the cp ranks too (dp·cp), as Megatron-LM's distributed optimizer and torchtitan's FSDP2
    {"cp": 2, "zero": 3},
    {"cp": 2, "zero": 2, "microbatches": 2},
    {"dp": 2, "cp": 2, "zero": 3},
    {"cp": 2, "tp": 2, "zero": 1},
    {"cp": 2, "pp": 2, "zero": 3, "schedule": "1f1b", "microbatches": 2},
    # FSDP2 2-D over ZeRO's dp·cp group and tp: one root mesh
    {"dp": 2, "cp": 2, "tp": 2, "zero": 3},
    {"dp": 2, "pp": 2, "zero": 2, "schedule": "1f1b", "microbatches": 4},
    {"dp": 2, "pp": 2, "zero": 2, "schedule": "interleaved-1f1b", "virtual_stages": 2, "microbatches": 2},
    {"dp": 2, "pp": 2, "zero": 2, "schedule": "zb-h1", "microbatches": 4},
    {"dp": 2, "tp": 2, "pp": 2, "zero": 2, "schedule": "1f1b", "microbatches": 2},
    {"dp": 2, "pp": 2, "zero": 3, "schedule": "1f1b", "microbatches": 4},
    {"dp": 2, "pp": 2, "zero": 3, "schedule": "interleaved-1f1b", "virtual_stages": 2, "microbatches": 2},
    {"dp": 2, "pp": 2, "zero": 3, "schedule": "zb-h1", "microbatches": 4},
    {"dp": 2, "tp": 2, "pp": 2, "zero": 3, "schedule": "1f1b", "microbatches": 2},
    # Hybrid sharding (HSDP): 2 replica groups of 2 sharding ranks
    {"dp": 4, "dp_replicate": 2, "zero": 3},
    {"dp": 4, "dp_replicate": 2, "zero": 2, "microbatches": 2},
    {"dp": 4, "dp_replicate": 2, "zero": 1},
    {"dp": 4, "dp_replicate": 2, "tp": 2, "zero": 2},
    {"dp": 4, "dp_replicate": 2, "pp": 2, "zero": 3, "schedule": "1f1b", "microbatches": 2},
    {"dp": 4, "dp_replicate": 2, "tp": 2, "zero": 3},
    {"dp": 4, "dp_replicate": 2, "cp": 2, "zero": 2},
    # FSDP2's HSDP mesh unflattened from dp·cp's group: (dp_replicate, dp_shard·cp)
    {"dp": 4, "dp_replicate": 2, "cp": 2, "zero": 3},
    # one-rank shards beside cp: ZeRO shards over dp_shard_cp, cp's ranks in a group of its own
    {"dp": 2, "dp_replicate": 2, "cp": 2, "zero": 3},
]


@pytest.fixture(scope="module")
def single_process(pool):
    """Each model family's single-process outcome, computed once for this module."""
    return {model: pool.run(train_outcome, 1, run_config(model))[0] for model in ("tiny", "tiny-llama")}


def expected_model_states(config, rank: int) -> dict[str, int]:
    """The shared formula's bytes for global ``rank`` (mesh order pp, dp, cp, tp)."""
    layout = config.layout
    pp_rank, dp_rank = rank // (layout.dp * layout.cp * layout.tp), rank // (layout.cp * layout.tp) % layout.dp
    share = pipeline_share(config.model, layout, pp_rank)
    states = plait_model_states(config.model, layout, config.train.precision, share, dp_rank, rank // layout.tp % layout.cp)
    return {"parameters": states.params, "gradients": states.grads, "optimizer": states.optimizer}


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "-".join(f"{k}{v}" for k, v in layout.items()))
def test_zero_composes_and_matches_single_process(pool, single_process, model, layout):
    reference = single_process[model]
    config = run_config(model, **layout)
    outcomes = pool.run(train_outcome, layout_world_size(layout), config)
    for outcome in outcomes:
        assert_same_losses(reference["losses"], outcome["losses"])
    stages = [outcome["weights"] for outcome in outcomes if outcome["weights"] is not None]
    assert_same_weights(reference["weights"], {name: value for stage in stages for name, value in stage.items()})
    for rank, outcome in enumerate(outcomes):
        assert outcome["model_state_bytes"] == expected_model_states(config, rank), \
            f"rank {rank}: {outcome['model_state_bytes']} vs {expected_model_states(config, rank)}"
    assert_traced_volumes_are_the_facts(config, outcomes[0]["volumes"])


BF16_TOLERANCE = 0.02  # tests/test_training.py: bf16 stays within 2% of fp32
BF16_LAYOUTS = [
    # ZeRO 0, autocast over fp32 weights: tensor-parallel calls on the matmuls' outputs in bf16, on
    # the residual stream the linears read (and the ends') in fp32
    ("tiny", {"dp": 2, "tp": 2}),
    ("tiny", {"dp": 2, "tp": 2, "sp": True}),
    ("tiny-llama", {"dp": 2, "cp": 2, "cp_algorithm": "ring"}),
    # bf16 weights (ZeRO 1-2, FSDP2's gathered ones): every call in bf16, learned positions' gradient too
    ("tiny", {"dp": 2, "tp": 2, "sp": True, "zero": 1}),
    ("tiny-llama", {"dp": 2, "tp": 2, "zero": 1}),
    ("tiny-llama", {"dp": 2, "tp": 2, "sp": True, "zero": 3}),
    ("tiny-llama", {"dp": 2, "cp": 2, "zero": 2}),
    ("tiny-llama", {"dp": 2, "pp": 2, "zero": 2, "schedule": "1f1b", "microbatches": 2}),
    # the tied table's gradient rows swapped in fp32 after ZeRO-2's reduce-scatter
    ("tiny", {"dp": 2, "pp": 2, "zero": 2, "schedule": "1f1b", "microbatches": 2}),
    # bf16 weights on pipeline stages: hidden states cross in bf16, the tied table's gradient too
    ("tiny", {"dp": 2, "pp": 2, "zero": 1, "schedule": "interleaved-1f1b", "virtual_stages": 2, "microbatches": 2}),
    ("tiny-llama", {"dp": 2, "pp": 2, "zero": 1, "schedule": "zb-h1", "microbatches": 2}),
    ("tiny-llama", {"dp": 2, "pp": 2, "zero": 3, "schedule": "zb-h1", "microbatches": 2}),
    ("tiny-llama", {"dp": 2, "pp": 2, "zero": 3, "schedule": "1f1b", "microbatches": 2, "grad_compression": "bf16"}),
    # bf16 on the dp·cp wire: the cp ranks reduce with the dp ranks, in bf16 too
    ("tiny-llama", {"dp": 2, "cp": 2, "grad_compression": "bf16"}),
    ("tiny-llama", {"dp": 2, "cp": 2, "zero": 3, "grad_compression": "bf16"}),
]


@pytest.mark.parametrize("model,layout", BF16_LAYOUTS,
                         ids=lambda case: case if isinstance(case, str) else "-".join(f"{k}{v}" for k, v in case.items()))
def test_bf16_composition_stays_near_fp32_and_holds_the_formula(pool, single_process, model, layout):
    reference = single_process[model]["losses"]
    config = run_config(model, precision="bf16", **layout)
    outcomes = pool.run(train_outcome, layout_world_size(layout), config)
    for outcome in outcomes:
        for step, (fp32, bf16) in enumerate(zip(reference, outcome["losses"])):
            assert abs(fp32 - bf16) < BF16_TOLERANCE * fp32, f"step {step}: {fp32} vs {bf16}"
    for rank, outcome in enumerate(outcomes):
        assert outcome["model_state_bytes"] == expected_model_states(config, rank), \
            f"rank {rank}: {outcome['model_state_bytes']} vs {expected_model_states(config, rank)}"
    assert_traced_volumes_are_the_facts(config, outcomes[0]["volumes"])
