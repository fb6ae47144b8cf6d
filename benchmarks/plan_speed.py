"""How long `plait plan` takes to search every layout of a 1T-parameter model on 3072 GPUs.

    PYTHONPATH=src python benchmarks/plan_speed.py

Equals `plait plan --model megatron-1t --gpu a100-80gb --gpus 3072 --global-batch 3072` without
the printing. Reports wall-clock and CPU time (the machine is shared; CPU time is the steadier).
"""

from __future__ import annotations

import time

from plait.models.spec import model_spec
from plait.hardware import hardware
from plait.plan.search import search
from plait.plan.workload import Workload


def main() -> None:
    workload = Workload(model_spec("megatron-1t"), global_batch=3072)
    wall, cpu = time.perf_counter(), time.process_time()
    result = search(workload, hardware("a100-80gb"), 3072, top=3)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"searched 1T parameters on 3072 × a100-80gb: {result.scored + result.bounded + result.oversized} layouts, "
          f"{result.scored} scored in closed form ({result.fitting} fit), {result.oversized} ruled out by a floor "
          f"on their memory, {result.bounded} by a floor "
          f"on their step time, top {len(result.ranked)} shown")
    print(f"wall {wall:.2f} s, cpu {cpu:.2f} s (target ≤ 2 s)")
    print(f"top: {result.ranked[0].layout.describe()} at {result.ranked[0].step_time_s:.2f} s/step")
    print(f"why: {result.reason}")


if __name__ == "__main__":
    main()
