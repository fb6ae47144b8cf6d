"""A run saves a checkpoint after its last step by default: the trained weights, bit for bit, once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from plait.config import RunConfig
from plait.topology import build_topology
from plait.train.loop import train
from tests.cases import run_config


def trained_weights_and_checkpoints(config: RunConfig, run_dir: str) -> dict | None:
    """On rank 0: the full weights the run ended with and the checkpoint folders it left."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    topology = build_topology(config.layout, torch.device("cpu"))
    model = train(config, topology, Path(run_dir)).model
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if topology.rank != 0:
        return None
    saved = Path(run_dir) / "checkpoints"
    return {"weights": {name: value.detach().clone() for name, value in weights.items()},
            "checkpoints": sorted(p.name for p in saved.iterdir()) if saved.exists() else []}


def with_checkpoints(config: RunConfig, **train) -> RunConfig:
    return replace(config, train=replace(config.train, **train))


def test_final_checkpoint_holds_the_trained_weights(pool, tmp_path):
    from plait.train.full_model import load_run_model

    config = with_checkpoints(run_config(steps=3, tp=2), final_checkpoint=True)
    outcome = pool.run(trained_weights_and_checkpoints, 2, config, str(tmp_path))[0]
    assert outcome["checkpoints"] == ["step_0000003"]
    saved = load_run_model(tmp_path)[0].state_dict()
    assert saved.keys() == outcome["weights"].keys()
    for name, value in outcome["weights"].items():
        assert torch.equal(saved[name], value), name


@pytest.mark.parametrize("train, expected", [
    ({"final_checkpoint": False}, []),
    ({"final_checkpoint": True, "checkpoint_every": 2}, ["step_0000002", "step_0000003"]),
    ({"final_checkpoint": False, "checkpoint_every": 2}, ["step_0000002"]),
])
def test_final_checkpoint_is_turned_off_or_joins_the_periodic_ones(pool, tmp_path, train, expected):
    config = with_checkpoints(run_config(steps=3), **train)
    assert pool.run(trained_weights_and_checkpoints, 1, config, str(tmp_path))[0]["checkpoints"] == expected
