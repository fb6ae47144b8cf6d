"""Data parallelism inside one node against across two: where the all-reduce stops hiding.

Weak scaling of a mid-size model (GPT-2 XL, 1.56B parameters) at a fixed 8 sequences per GPU on
A100-80GB nodes of 8, once with DGX networking (8 × 200 Gb/s per node) and once with one 100 Gb/s
Ethernet port per node (1.56 GB/s per GPU), each printed as the `plait simulate` it equals.

    PYTHONPATH=src python benchmarks/dp_scaling.py
"""

from __future__ import annotations

from plait.layout import Layout
from plait.models.spec import model_spec
from plait.plan.comm import all_reduce_seconds, group_link
from plait.hardware import hardware
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload

PER_GPU = 8


def main() -> None:
    spec = model_spec("gpt2-xl")
    for label, inter in (("DGX A100, 8×200 Gb/s per node", None), ("100 Gb/s Ethernet per node", 100 / 8 / 8)):
        hw = hardware("a100-80gb", inter_node_gbps=inter)
        base = None
        print(f"\n{label} (inter-node {hw.inter_node_gbps:.3g} GB/s per GPU)")
        print("| GPUs | nodes | step (s) | tokens/s | speed-up vs 1 GPU | all-reduce (s) | exposed (s) | MFU |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for gpus in (1, 8, 16):
            layout = Layout(dp=gpus, microbatches=2)
            p = evaluate(Workload(spec, PER_GPU * gpus), hw, gpus, layout)
            tokens = PER_GPU * gpus * spec.seq_len / p.step_time_s
            base = base or tokens
            grads = p.memory_breakdown["grads"]  # bf16 gradients, all-reduced once per step
            reduce = all_reduce_seconds(grads, gpus, group_link(hw, layout, "dp"))
            print(f"| {gpus} | {max(1, gpus // 8)} | {p.step_time_s:.3f} | {tokens:,.0f} | {tokens / base:.2f}× | "
                  f"{reduce:.3f} | {p.time_breakdown['exposed_dp_comm_s']:.3f} | {p.mfu:.1%} |")
        print(f"command: plait simulate --model gpt2-xl --gpu a100-80gb --gpus 16 --dp 16 --tp 1 --cp 1 --pp 1 "
              f"--zero 0 --microbatches 2 --global-batch {PER_GPU * 16}"
              + (f" --inter-node-gbps {inter:.4g}" if inter else ""))


if __name__ == "__main__":
    main()
