"""Functions the worker pool runs on every rank (module level, so they pickle by name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from plait.config import RunConfig
from plait.topology import build_topology
from plait.train.loop import train


def train_losses(config: RunConfig, run_dir: str | None = None) -> list[float]:
    """Per-step global losses of ``config`` on this rank's share of the world."""
    topology = build_topology(config.layout, torch.device("cpu"))
    return train(config, topology, Path(run_dir) if run_dir else None).losses


def train_outcome(config: RunConfig) -> dict:
    """Per-step losses, this rank's measured model-state bytes and, on rank 0, the full final weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    topology = build_topology(config.layout, torch.device("cpu"))
    result = train(config, topology)
    weights = get_model_state_dict(result.model, options=StateDictOptions(full_state_dict=True))
    return {
        "losses": result.losses,
        "model_state_bytes": dict(result.model_state_bytes),
        "weights": {name: value.detach().clone() for name, value in weights.items()} if topology.rank == 0 else None,
    }


def collectives_per_microbatch(config: RunConfig) -> list[dict[str, int]]:
    """Train under the profiler; count the c10d collectives issued inside each micro-batch of step 0."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    topology = build_topology(config.layout, torch.device("cpu"))
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        train(config, topology)
    events = profiler.events()
    spans = [e.time_range for e in events if e.name.startswith("plait.microbatch.")][:config.layout.microbatches]
    collectives = [e for e in events if e.name.startswith("c10d::")]
    return [
        dict(Counter(e.name for e in collectives if span.start <= e.time_range.start <= span.end))
        for span in sorted(spans, key=lambda span: span.start)
    ]


def run_config(
    model: str = "tiny", steps: int = 10, global_batch: int = 8, seq_len: int = 64, precision: str = "fp32", **layout,
) -> RunConfig:
    """A small validated config: ``layout`` holds Layout fields (dp=2, microbatches=2, ...)."""
    from plait.config import TrainSpec, validate_run
    from plait.layout import Layout
    from plait.models.spec import model_spec

    config = RunConfig(
        model=model_spec(model, seq_len=seq_len),
        layout=Layout(**layout),
        train=TrainSpec(steps=steps, global_batch=global_batch, warmup_steps=2, precision=precision),
        model_name=model,
    )
    validate_run(config)
    return config


def assert_refused_in_one_line(argv: list[str], expected: str, capsys, run_root: Path) -> None:
    """``plait argv`` exits with status 2 and one line containing ``expected``; no run dir appears."""
    from plait.cli import main

    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("plait") and expected in lines[0], lines[0]
    assert not (run_root / "runs").exists()
