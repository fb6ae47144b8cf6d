"""A rank holds only its own part of the model from its first byte: the seeded values of any region
are that region of the whole weight; building a rank of any layout holds its parameters and, beside
them, no more than ``BUILD_WORKSPACE_BYTES`` at any moment (the whole model never exists on one
rank); saving and loading a checkpoint hold no more than ``checkpoint_workspace_bytes`` beside the
state, or (loading ZeRO-1/2's masters) than a step holds beyond it."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from plait.facts.model_state import (
    BUILD_WORKSPACE_BYTES, checkpoint_workspace_bytes, pipeline_share, rank_model_states,
)
from plait.models import init
from plait.models.spec import model_spec
from tests.cases import layout_world_size, run_config

SHAPES = {"tok_embeddings.weight": (300, 64), "layers.1.mlp.w2.weight": (64, 176), "layers.0.attention_norm.weight": (64,),
          "layers.0.attention.wq.bias": (64,)}


@pytest.mark.parametrize("name", list(SHAPES))
def test_any_region_of_a_seeded_weight_is_that_region_of_the_whole(monkeypatch, name):
    monkeypatch.setattr(init, "FILL_BLOCK_ELEMENTS", 7 * 64)  # many blocks a weight, cut across regions
    shape = SHAPES[name]
    source = init.seeded_source(model_spec("tiny"), seed=5)
    whole = source(name, shape, init.whole(shape))
    draw = random.Random(name)
    for _ in range(20):
        region = tuple(sorted((draw.randint(0, size), draw.randint(0, size))) for size in shape)
        assert torch.equal(source(name, shape, region), whole[tuple(slice(*bounds) for bounds in region)])


def test_the_values_do_not_depend_on_the_seed_alone_or_the_name_alone():
    source, shape = init.seeded_source(model_spec("tiny"), seed=5), (64, 176)
    values = source("layers.1.mlp.w2.weight", shape, init.whole(shape))
    assert not torch.equal(values, source("layers.2.mlp.w2.weight", shape, init.whole(shape)))
    assert not torch.equal(values, init.seeded_source(model_spec("tiny"), seed=6)("layers.1.mlp.w2.weight", shape,
                                                                                 init.whole(shape)))


# A model whose fp32 weights (47 MB) are several times the workspace, so that building it whole on
# any rank would show.
WIDE = {"hidden": 512, "heads": 8, "kv_heads": 4, "ffn_hidden": 1408}
LAYOUTS = {
    "zero3": {"dp": 4, "zero": 3},
    "tp2·pp2·dp2 zero1": {"tp": 2, "pp": 2, "dp": 2, "zero": 1, "microbatches": 2},
    "hsdp": {"dp": 4, "dp_replicate": 2, "zero": 3},
    "interleaved": {"pp": 2, "virtual_stages": 2, "schedule": "interleaved-1f1b", "microbatches": 2},
    "tp4 bf16 zero2": {"tp": 4, "dp": 2, "zero": 2, "precision": "bf16"},
}


def lifetime_holdings(config, run_dir: str) -> dict:
    """This rank's most bytes alive at once while it builds its part (``parallelize_run``) and what
    it holds when done; the most it holds beyond what it held before while it takes a step, saves a
    checkpoint and loads it; its parameters' bytes and coordinates."""
    from pathlib import Path

    from tests.measure_live import PeakLiveBytes

    from plait.observe.model_state import storage_bytes
    from plait.topology import build_topology
    from plait.train.checkpoint import latest_checkpoint, load_checkpoint
    from plait.train.loop import autocast, parallelize_run, train_step

    topology = build_topology(config.layout, torch.device("cpu"))
    with PeakLiveBytes() as live:
        parallel = parallelize_run(config, topology)
        held, build_peak = live.now, live.peak
        tokens = torch.randint(0, config.model.vocab, (config.train.global_batch // config.layout.dp, config.model.seq_len),
                               generator=torch.Generator().manual_seed(0))
        micro = list(zip(tokens.chunk(config.layout.microbatches), tokens.roll(-1, 1).chunk(config.layout.microbatches)))
        extra = {}
        for phase, act in (("step", lambda: train_step(parallel, micro, 1.0, lambda: autocast(config, topology.device))),
                           ("save", lambda: _save(parallel, run_dir)),
                           ("load", lambda: load_checkpoint(latest_checkpoint(Path(run_dir)), parallel.model,
                                                            parallel.optimizer))):
            live.reset_peak()
            before = live.now
            act()
            extra[phase] = live.peak - before
    return {"peak": build_peak, "held": held, "params": storage_bytes(parallel.model.parameters()), **extra,
            "pp": topology.coordinate("pp"), "dp": topology.coordinate("dp")}


def _save(parallel, run_dir: str) -> None:
    from pathlib import Path

    from plait.train.checkpoint_writer import CheckpointWriter

    writer = CheckpointWriter(Path(run_dir), {"run": "lifetime"}, 1, False)
    writer.save(1, parallel.model, parallel.optimizer)
    writer.finish()


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_rank_holds_its_own_part_and_little_more_through_build_save_and_load(pool, tmp_path, name):
    layout = dict(LAYOUTS[name])
    precision = layout.pop("precision", "fp32")
    config = run_config("tiny-llama", precision=precision, **layout)
    config = replace(config, model=replace(config.model, **WIDE))
    whole_bytes = 4 * sum(torch.Size(shape).numel() for shape in _shapes(config.model))
    (tmp_path / "checkpoints").mkdir()
    for rank in pool.run(lifetime_holdings, layout_world_size(layout), config, str(tmp_path)):
        share = pipeline_share(config.model, config.layout, rank["pp"])
        fact = rank_model_states(config.model, config.layout, precision, share, dp_rank=rank["dp"])
        assert rank["params"] == fact.params
        assert rank["held"] <= rank["peak"] <= rank["held"] + BUILD_WORKSPACE_BYTES
        assert rank["peak"] < whole_bytes
        # Saving holds at most DCP's workspace beside the state; loading too, or what the step's own
        # optimizer holds (ZeRO 1 and 2 share the rows of masters they load as a step shares its update).
        workspace = checkpoint_workspace_bytes(config.model, config.layout, *share)
        assert rank["save"] <= workspace and rank["load"] <= max(workspace, rank["step"]), (rank, workspace)


def _shapes(spec) -> list[tuple[int, ...]]:
    from plait.models.transformer import Transformer

    with torch.device("meta"):
        return [tuple(p.shape) for p in Transformer(spec).parameters()]
