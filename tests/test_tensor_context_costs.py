"""Measured per-layer costs of tp, sp, cp and recomputation equal the analytic ones: collective bytes and
saved activations."""

from __future__ import annotations

import pytest

from plait.facts.activations import saved_bytes_per_layer
from plait.facts.collectives import collective_bytes_per_layer, outside_layer_collective_bytes
from plait.layout import Layout
from plait.models.spec import model_spec
from tests.cases import run_config
from tests.probes import layer_costs

BATCH, SEQ = 2, 64
LAYOUTS = [
    {},
    {"tp": 2},
    {"tp": 2, "sp": True},
    {"tp": 4},
    {"tp": 4, "sp": True},
    {"cp": 2},
    {"tp": 2, "cp": 2},
    {"recompute": "selective"},
    {"recompute": "full"},
    {"tp": 2, "recompute": "selective"},
    {"tp": 2, "recompute": "full"},
    {"tp": 2, "sp": True, "recompute": "full"},
    {"cp": 2, "recompute": "selective"},
    {"cp": 2, "recompute": "full"},
    # Ring context parallelism: point-to-point K/V sends (and dK/dV in backward), kv-heads only
    {"cp": 2, "cp_algorithm": "ring"},
    {"tp": 2, "cp": 2, "cp_algorithm": "ring"},
    {"cp": 2, "cp_algorithm": "ring", "recompute": "selective"},
    # All-gather context parallelism: one K/V gather forward, one fp32 reduce-scatter backward
    {"cp": 2, "cp_algorithm": "all-gather"},
    {"tp": 2, "cp": 2, "cp_algorithm": "all-gather", "recompute": "selective"},
    {"tp": 2, "sp": True, "cp": 2},
    # Per-operation checkpointing: sp's reduce-scatters and the head exchange kept, not sent again
    {"recompute": "op"},
    {"tp": 2, "recompute": "op"},
    {"tp": 2, "sp": True, "recompute": "op"},
    {"cp": 2, "recompute": "op"},
    {"cp": 2, "cp_algorithm": "ring", "recompute": "op"},
    {"cp": 2, "cp_algorithm": "all-gather", "recompute": "op"},
]


@pytest.fixture(scope="module")
def measured(pool):
    """Per-layer costs on rank 0 of every (model, layout), measured once for the module."""
    costs = {}
    for model in ("tiny", "tiny-llama"):
        for index, layout in enumerate(LAYOUTS):
            world = layout.get("tp", 1) * layout.get("cp", 1)
            costs[model, index] = pool.run(layer_costs, world, run_config(model, global_batch=BATCH, **layout))[0]
    return costs


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("index", range(len(LAYOUTS)), ids=[str(layout) for layout in LAYOUTS])
def test_collective_bytes_per_layer_match_analytic(measured, model, index):
    expected = collective_bytes_per_layer(model_spec(model, seq_len=SEQ), Layout(**LAYOUTS[index]), BATCH)
    assert measured[model, index]["bytes"] == expected


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("index", range(len(LAYOUTS)), ids=[str(layout) for layout in LAYOUTS])
def test_collective_bytes_outside_the_layers_match_analytic(measured, model, index):
    """The embedding's and head's calls and the gradient sums of the weights replicated there."""
    layout = {key: value for key, value in LAYOUTS[index].items() if key in ("tp", "sp", "cp")}
    expected = outside_layer_collective_bytes(model_spec(model, seq_len=SEQ), BATCH, SEQ, **layout)
    assert measured[model, index]["outside"] == expected


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("index", range(len(LAYOUTS)), ids=[str(layout) for layout in LAYOUTS])
def test_saved_activation_bytes_per_layer_match_analytic(measured, model, index):
    expected = saved_bytes_per_layer(model_spec(model, seq_len=SEQ), Layout(**LAYOUTS[index]), BATCH)
    assert measured[model, index]["saved"] == sum(expected.values())


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_divides_the_norm_region_by_tp(measured, model, tp):
    """All that sp changes in saved memory is the norm region, which it divides by tp."""
    plain, sharded = LAYOUTS.index({"tp": tp}), LAYOUTS.index({"tp": tp, "sp": True})
    norms = saved_bytes_per_layer(model_spec(model, seq_len=SEQ), Layout(tp=tp), BATCH)["norms"]
    assert norms > 0
    assert measured[model, plain]["saved"] - measured[model, sharded]["saved"] == norms - norms // tp



@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("layout", [{}, {"tp": 2}, {"cp": 2}], ids=["single", "tp2", "cp2"])
def test_recomputation_keeps_less_and_full_keeps_only_the_block_input(measured, model, layout):
    """Saved bytes fall from none to selective to op to full, and full keeps one residual stream a layer."""
    saved = {mode: measured[model, LAYOUTS.index({**layout, "recompute": mode} if mode != "none" else layout)]["saved"]
             for mode in ("none", "selective", "op", "full")}
    assert saved["none"] > saved["selective"] > saved["op"] > saved["full"]
    assert saved["full"] == BATCH * SEQ // layout.get("cp", 1) * model_spec(model).hidden * 4
