"""plait's ZeRO-3 on pipeline stages against FSDP2 under torch.distributed.pipelining, side by side in one run.

Four gloo ranks, dp2 × pp2, 1F1B. Both sides hold the same pruned Llama-family stage (plait's own
model, seeded alike) under FSDP2 over the dp ranks with parameters gathered for the whole step
(``reshard_after_forward=False``), and step AdamW on the shards:

- plait: ``plait.train.loop.train_step`` on ``parallelize``'s layout (ShardedStage, plait's executor,
  the gradient reduce-scatter after the schedule, the global grad norm);
- torch: the stage module under ``fully_shard`` per block and at its root, driven by
  ``PipelineStage`` + ``Schedule1F1B`` (which reduce-scatters after the schedule too,
  ``perform_reduce_grad``), then the same grad norm and ``AdamW.step``.

Steps alternate between the two so machine noise hits both alike; prints the median step times and
their ratio (plait / torch; the target is at most 1.05).

    PYTHONPATH=src python -m benchmarks.zero3_pipeline_vs_torch --microbatches 4
"""

from __future__ import annotations

import argparse
import contextlib
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor

from benchmarks.pipeline_common import alternating_medians, run_on_ranks
from plait.config import RunConfig, TrainSpec
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.parallel.data_parallel.data import fsdp_policy
from plait.parallel.pipeline import prune_to_rank
from plait.schedules.registry import generate
from plait.schedules.split import split_layers
from plait.topology import build_topology
from plait.train.loop import build_model, parallelize_run, train_step


class _Stage(nn.Module):
    """A pruned model as one pipeline stage: its input (token ids or hidden states) at fixed positions."""

    def __init__(self, model: nn.Module, positions: torch.Tensor):
        super().__init__()
        self.model, self.positions = model, positions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x, self.positions)


def _torch_side(config: RunConfig, topology, m: int, micro: int):
    """FSDP2 + torch.distributed.pipelining on the same stage plait would hold."""
    layout, spec = config.layout, config.model
    pp_rank, pp = topology.coordinate("pp"), layout.pp
    schedule = generate("1f1b", pp, m)
    model = prune_to_rank(build_model(config, topology.device), schedule, pp_rank, split_layers(spec, pp, 1, None))
    # FSDP2 per block and at the stage's root, so that PipelineStage sees an FSDPModule and runs its
    # own no-sync accumulation and post-schedule reduce-scatter (plait's policy and prefetch).
    stage_module = _Stage(model, torch.arange(spec.seq_len))
    blocks = list(model.layers.values())
    for block in blocks:
        fully_shard(block, mesh=topology.fsdp_mesh, reshard_after_forward=False, mp_policy=fsdp_policy("fp32"))
    fully_shard(stage_module, mesh=topology.fsdp_mesh, reshard_after_forward=False, mp_policy=fsdp_policy("fp32"))
    for current, following in zip(blocks, blocks[1:]):
        current.set_modules_to_forward_prefetch([following])
        following.set_modules_to_backward_prefetch([current])
    hidden = torch.zeros(micro, spec.seq_len, spec.hidden, requires_grad=True)  # stage 1 sends its gradient
    ids = torch.zeros(micro, spec.seq_len, dtype=torch.long)
    stage = PipelineStage(stage_module, pp_rank, pp, topology.device, group=topology.group("pp"),
                          input_args=(ids if pp_rank == 0 else hidden,),
                          output_args=(hidden if pp_rank < pp - 1 else torch.zeros(micro, spec.seq_len, spec.vocab),))

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()) / m  # as plait scales

    pipeline = Schedule1F1B(stage, m, loss_fn=loss_fn, scale_grads=False)
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay)
    return pipeline, optimizer, stage_module


def _global_norm(params, pp_group) -> torch.Tensor:
    """The grad norm over the stage's shards and every stage, as plait's clipping computes it."""
    total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    local = (total.full_tensor() if isinstance(total, DTensor) else total) ** 2
    dist.all_reduce(local, group=pp_group)
    return local.sqrt()


def compare(m: int, micro: int, steps: int, layers: int, hidden: int, seq_len: int) -> dict:
    spec_overrides = dict(layers=layers, hidden=hidden, heads=max(hidden // 64, 1), kv_heads=max(hidden // 128, 1),
                          ffn_hidden=hidden * 8 // 3 // 64 * 64, seq_len=seq_len)
    layout = Layout(dp=2, pp=2, zero=3, schedule="1f1b", microbatches=m)
    config = RunConfig(model=model_spec("tiny-llama", **spec_overrides), layout=layout,
                       train=TrainSpec(steps=steps, global_batch=2 * m * micro), model_name="tiny-llama")
    topology = build_topology(layout, torch.device("cpu"))
    parallel = parallelize_run(config, topology)
    torch_pipeline, torch_optimizer, torch_stage = _torch_side(config, topology, m, micro)
    pp_rank, pp_group = topology.coordinate("pp"), topology.group("pp")

    generator = torch.Generator().manual_seed(topology.coordinate("dp"))
    tokens = torch.randint(0, config.model.vocab, (m * micro, seq_len + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    micro_batches = list(zip(inputs.chunk(m), targets.chunk(m)))

    def plait_step() -> None:
        train_step(parallel, micro_batches, 0.0, contextlib.nullcontext)

    def torch_step() -> None:
        if pp_rank == 0:
            torch_pipeline.step(inputs)
        else:
            torch_pipeline.step(target=targets, losses=[])
        norm = _global_norm(list(torch_stage.parameters()), pp_group)
        assert math.isfinite(norm.item())
        torch_optimizer.step()
        torch_optimizer.zero_grad(set_to_none=True)

    return alternating_medians(steps, plait_step, torch_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    result = run_on_ranks(compare, 4, args.microbatches, args.micro_batch_size, args.steps, args.layers, args.hidden,
                          args.seq_len)
    print(f"dp2·pp2 ZeRO-3 1f1b m={args.microbatches}×{args.micro_batch_size}, llama {args.layers} layers × "
          f"{args.hidden} hidden, seq {args.seq_len}; median of {args.steps} steps")
    print(f"plait ShardedStage + executor          {result['plait'] * 1e3:8.1f} ms/step")
    print(f"FSDP2 + torch Schedule1F1B             {result['torch'] * 1e3:8.1f} ms/step")
    print(f"ratio plait / torch                    {result['plait'] / result['torch']:8.3f}")


if __name__ == "__main__":
    main()
