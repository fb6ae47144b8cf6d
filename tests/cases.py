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


def held_model_state_bytes(config: RunConfig, run_dir: str) -> dict[str, int]:
    """The bytes of parameters, gradients and optimizer state this rank held at most over the run."""
    topology = build_topology(config.layout, torch.device("cpu"))
    return train(config, topology, Path(run_dir)).model_state_bytes


def block_classes(config: RunConfig) -> list[str]:
    """The class names of the blocks this rank trained (a pipeline rank holds only its own)."""
    topology = build_topology(config.layout, torch.device("cpu"))
    return [type(block).__name__ for block in train(config, topology).model.layers.values()]


def train_outcome(config: RunConfig) -> dict:
    """Per-step losses, this rank's measured model-state bytes, on the first dp, cp and tp rank of
    each pipeline stage the stage's full final weights (rank 0's are the whole model's without pp),
    and on rank 0 every rank's traced volumes of the last step (``traced_volumes``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    config = tracing_the_last_step(config)
    topology = build_topology(config.layout, torch.device("cpu"))
    result = train(config, topology)
    weights = get_model_state_dict(result.model, options=StateDictOptions(full_state_dict=True))
    return {
        "losses": result.losses,
        "model_state_bytes": dict(result.model_state_bytes),
        "weights": {name: value.detach().clone() for name, value in weights.items()}
        if not any(topology.coordinate(dim) for dim in ("dp", "cp", "tp")) else None,
        "volumes": traced_volumes(result.traces),
    }


def tracing_the_last_step(config: RunConfig) -> RunConfig:
    """``config`` tracing its last step too: the tracer takes the first step after warm-up, then every
    ``trace_every``-th."""
    from dataclasses import replace

    return replace(config, train=replace(config.train, trace_every=max(1, config.train.steps - 2)))


def traced_volumes(traces: list[dict] | None) -> dict[int, dict[str, dict[str, int]]] | None:
    """{rank: {group: {op: bytes}}} of the last traced step, summed over its transfers (rank 0 holds
    every rank's traces; None elsewhere)."""
    if traces is None:
        return None
    volumes = {}
    for rank in traces:
        summed: dict[str, dict[str, int]] = {}
        for transfer in rank["steps"][-1]["transfers"]:
            ops = summed.setdefault(transfer["group"], {})
            ops[transfer["op"]] = ops.get(transfer["op"], 0) + transfer["bytes"]
        volumes[rank["rank"]] = summed
    return volumes


def assert_traced_volumes_are_the_facts(config: RunConfig, volumes: dict[int, dict[str, dict[str, int]]]) -> None:
    """Every rank's traced bytes per group and op equal plait.facts.step_volumes, the volumes the
    planner times (ranks ordered on the mesh as pp, dp, cp, tp)."""
    from plait.facts.step_volumes import step_volumes

    layout = config.layout
    assert sorted(volumes) == list(range(layout.world_size))
    for rank, measured in volumes.items():
        pp_rank, dp_rank = rank // (layout.dp * layout.cp * layout.tp), rank // (layout.cp * layout.tp) % layout.dp
        expected = step_volumes(config.model, layout, config.train.global_batch, config.train.precision, pp_rank,
                                dp_rank, rank // layout.tp % layout.cp)
        assert measured == {group: dict(ops) for group, ops in expected.items()}, f"rank {rank}"


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


def layout_world_size(layout: dict) -> int:
    """Ranks a layout given as Layout fields needs (unset sizes are 1)."""
    return layout.get("dp", 1) * layout.get("tp", 1) * layout.get("cp", 1) * layout.get("pp", 1)


def run_config(
    model: str = "tiny", steps: int = 10, global_batch: int = 8, seq_len: int = 64, precision: str = "fp32",
    parallel_block: bool = False, **layout,
) -> RunConfig:
    """A small validated config: ``layout`` holds Layout fields (dp=2, microbatches=2, ...);
    ``parallel_block`` runs the preset's attention and MLP side by side."""
    from plait.config import TrainSpec, validate_run
    from plait.layout import Layout
    from plait.models.spec import model_spec

    config = RunConfig(
        model=model_spec(model, seq_len=seq_len, parallel_block=parallel_block),
        layout=Layout(**layout),
        train=TrainSpec(steps=steps, global_batch=global_batch, warmup_steps=2, precision=precision,
                        final_checkpoint=False),  # tests that resume ask for their checkpoints
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


def zero2_gradient_rows(config: RunConfig, bucket_bytes: int) -> dict:
    """One ZeRO-2 backward in buckets of ``bucket_bytes``: how far this rank's averaged gradient rows
    are from the single-process gradient, and whether a reduce-scatter went out before the
    backward pass accumulated most of its gradients."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from plait.facts.model_state import owned_slice
    from plait.parallel.data_parallel.gradient_shards import GradientSharding
    from plait.parallel.optimizer import BETAS, parameter_groups
    from plait.parallel.data_parallel.sharded_adamw import ShardedAdamW
    from plait.parallel.data_parallel.zero_rows import RowSplit
    from plait.train.data import BatchSource, training_tokens
    from plait.train.loop import build_model

    topology = build_topology(config.layout, torch.device("cpu"))
    model, reference = build_model(config, torch.device("cpu")), build_model(config, torch.device("cpu"))
    optimizer = ShardedAdamW(parameter_groups(model, 0.0), RowSplit(topology.mesh["dp"]), lr=1e-3, betas=BETAS,
                             gradient_sharding=GradientSharding({0: list(model.parameters())}, bucket_bytes))
    source = BatchSource(training_tokens(config.train.data, config.model.vocab, config.model.seq_len),
                         config.model.seq_len, config.train.global_batch, config.train.seed)

    def backward(module: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        F.cross_entropy(module(inputs).flatten(0, 1), targets.flatten()).backward()

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        backward(model, *source.local_batch(0, topology.coordinate("dp"), topology.size("dp")))
    backward(reference, *source.local_batch(0, 0, 1))
    events = profiler.events()
    first_scatter = min(e.time_range.start for e in events if e.name.startswith("c10d::") and "reduce_scatter" in e.name)
    accumulated = [e.time_range.start for e in events if e.name.endswith("AccumulateGrad")]
    shards = optimizer.gradient_shards.shards
    rank, ranks = topology.coordinate("dp"), topology.size("dp")
    # Relative to the largest gradient anywhere: the attention key bias's true gradient is 0 (softmax
    # ignores it), so its own largest element is rounding noise no two summation orders share.
    scale = max(param.grad.abs().max().item() for param in reference.parameters())
    error = max((shards[mine].to_local() - theirs.grad[owned_slice(theirs.shape[0], rank, ranks)]).abs().max().item()
                for mine, theirs in zip(model.parameters(), reference.parameters()))
    return {"buckets": len(optimizer.gradient_shards.buckets), "relative_error": error / scale,
            "gradients_after_first_scatter": sum(start > first_scatter for start in accumulated) / len(accumulated)}


def resumed_weights(config: RunConfig, run_dir: str) -> dict | None:
    """On rank 0, the full weights ``config``'s layout holds right after loading ``run_dir``'s last checkpoint."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from plait.train.checkpoint import latest_checkpoint, load_checkpoint
    from plait.train.loop import parallelize_run

    topology = build_topology(config.layout, torch.device("cpu"))
    parallel = parallelize_run(config, topology)
    model, optimizer = parallel.model, parallel.optimizer
    load_checkpoint(latest_checkpoint(Path(run_dir)), model, optimizer)
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {name: value.detach().float().clone() for name, value in weights.items()} if topology.rank == 0 else None


def averages_after_a_backward_that_reaches_no_parameter(config: RunConfig) -> float:
    """Accumulate one micro-batch without synchronising plait's all-reduce buckets (ZeRO 0/1 where
    DDP cannot run), then run a synchronised backward that reaches no parameter: how far this rank's
    gradients are from the average of the ranks' accumulated gradients (they must still be reduced)."""
    import torch.distributed as dist

    from plait.parallel.data_parallel.gradient_buckets import GradientAllReduce
    from plait.parallel.gradients import gradient_sync

    topology = build_topology(config.layout, torch.device("cpu"))
    rank, ranks = topology.coordinate("dp"), topology.size("dp")
    model = torch.nn.Linear(8, 6)
    torch.nn.init.constant_(model.weight, 0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    buckets = GradientAllReduce({0: list(model.parameters())}, topology.group("dp"), 64)
    with gradient_sync(model, optimizer, False, buckets):
        model(torch.full((4, 8), float(rank + 1))).square().sum().backward()
    expected = [param.grad.clone() for param in model.parameters()]
    for grad in expected:
        dist.all_reduce(grad, group=topology.group("dp"))
        grad /= ranks
    with gradient_sync(model, optimizer, True, buckets):
        (torch.ones(3, requires_grad=True) * 2).sum().backward()
    return max((param.grad - grad).abs().max().item() for param, grad in zip(model.parameters(), expected))


def zero2_rows_over_micro_batches(config: RunConfig) -> dict:
    """Two micro-batches' backward over bf16 weights under ZeRO-2, neither told to synchronise: each
    must reduce-scatter its own gradients (the rank holds no whole gradient after it) and the rows
    must hold their averages (summed over the ranks in bf16, on the wire) summed in fp32, checked
    against that sum in float64."""
    import torch.distributed as dist

    from plait.parallel.gradients import gradient_sync
    from plait.parallel.data_parallel.gradient_shards import GradientSharding
    from plait.parallel.data_parallel.sharded_adamw import ShardedAdamW
    from plait.parallel.data_parallel.zero_rows import RowSplit
    from plait.facts.model_state import owned_slice

    topology = build_topology(config.layout, torch.device("cpu"))
    rank, ranks = topology.coordinate("dp"), topology.size("dp")
    model = torch.nn.Linear(64, 48).to(torch.bfloat16)
    optimizer = ShardedAdamW(model.parameters(), RowSplit(topology.mesh["dp"]), lr=1e-3, betas=(0.9, 0.95),
                             gradient_sharding=GradientSharding({0: list(model.parameters())}))
    expected = [torch.zeros(param.shape, dtype=torch.float64) for param in model.parameters()]
    whole_after = []
    generator = torch.Generator().manual_seed(rank)
    for _ in range(2):
        inputs = torch.randn(16, 64, generator=generator).to(torch.bfloat16)
        grads = torch.autograd.grad(model(inputs).float().square().sum(), list(model.parameters()))
        with gradient_sync(model, optimizer, False):
            model(inputs).float().square().sum().backward()
        whole_after.append(any(param.grad is not None for param in model.parameters()))
        for total, grad in zip(expected, grads):
            reduced = grad.clone()  # summed over the ranks in bf16, as on the wire
            dist.all_reduce(reduced, group=topology.group("dp"))
            total += reduced.to(torch.float64) / ranks
    shards = optimizer.gradient_shards.shards
    rows = [shards[param].to_local() for param in model.parameters()]
    return {"whole_after": whole_after, "dtypes": sorted({str(row.dtype) for row in rows}),
            "error": max((row.double() - total[owned_slice(param.shape[0], rank, ranks)]).abs().max().item()
                         / total.abs().max().item() for row, total, param in zip(rows, expected, model.parameters()))}
