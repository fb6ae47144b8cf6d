"""plait's 1f1b executor against torch.distributed.pipelining's Schedule1F1B, side by side in one run.

Both drive the same stage modules on the same micro-batches over gloo; steps alternate between the
two so machine noise hits both alike. Prints the median step times and their ratio (plait / torch).

    PYTHONPATH=src python benchmarks/pipeline_vs_torch.py --pp 2 --microbatches 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_common import alternating_medians, batch, equal_chunks, run_on_ranks  # noqa: E402

from plait.parallel.pipeline_executor import BoundaryTransfers, Executor  # noqa: E402
from plait.schedules import generate  # noqa: E402


def compare(m: int, steps: int, width: int, depth: int, rows: int) -> dict:
    rank, pp = dist.get_rank(), dist.get_world_size()
    schedule = generate("1f1b", pp, m)
    ours = equal_chunks(pp, width, depth)[rank]
    theirs = equal_chunks(pp, width, depth)[rank]
    inputs, targets = batch(m, rows, width)
    micro_inputs, micro_targets = list(inputs.chunk(m)), list(targets.chunk(m))

    def loss_fn(output: torch.Tensor, mb: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(output, micro_targets[mb]) / m

    executor = Executor(schedule, rank, {rank: ours}, loss_fn,
                        BoundaryTransfers(None, torch.device("cpu"), lambda mb: (rows, width)))
    stage = PipelineStage(theirs, rank, pp, torch.device("cpu"), input_args=micro_inputs[0])
    torch_schedule = Schedule1F1B(stage, m, loss_fn=torch.nn.functional.mse_loss)

    def plait_step() -> None:
        executor.run(micro_inputs)

    def torch_step() -> None:
        if rank == 0:
            torch_schedule.step(inputs)
        elif rank == pp - 1:
            torch_schedule.step(target=targets, losses=[])
        else:
            torch_schedule.step()

    return alternating_medians(steps, plait_step, torch_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args()
    result = run_on_ranks(compare, args.pp, args.microbatches, args.steps, args.width, args.depth, args.rows)
    print(f"pp={args.pp} m={args.microbatches} stage={args.depth}×Linear({args.width}) rows={args.rows}, "
          f"median of {args.steps} steps")
    print(f"plait 1f1b           {result['plait'] * 1e3:8.2f} ms/step")
    print(f"torch Schedule1F1B   {result['torch'] * 1e3:8.2f} ms/step")
    print(f"ratio plait / torch  {result['plait'] / result['torch']:8.3f}")


if __name__ == "__main__":
    main()
