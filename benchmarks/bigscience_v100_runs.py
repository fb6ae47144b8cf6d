"""BigScience's layout search for its 1.3B model on two nodes of Jean Zay's V100s (experiments/tr3m-1B3.md),
predicted by benchmarks/validate_published.py. megatron-deepspeed's cost per layer pass is BLOOM's, but
that it is paid only under tensor parallelism was chosen on these tables, so they count with the
fitted runs."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.deepspeed_megatron_runs import deepspeed_stage_layers
from benchmarks.published_case import Ablation, Case
from benchmarks.stack_fits import predict
from plait.facts.stack import STACKS
from plait.models.spec import ModelSpec
from plait.hardware import device_memory

# bigscience-workshop/bigscience experiments/tr3m-1B3.md (December 2021), run with the first version
# of train/tr3-1B3-baseline/tr3m-1B3-emb-norm-pile.slurm: 24 layers, hidden 2,048, 16 heads, MLP
# 8,192, 2,048 tokens, GPT-2's vocabulary (50,257), learned positions, tied embeddings, fp16 with
# DeepSpeed's ZeRO-1 and pipeline engine (Megatron-DeepSpeed of that month, as the prequel's fp16
# tables ran it), global batch 512 without its warm-up. Two nodes of four V100 SXM2 each, a table
# per node kind ("32GB node", with and then without --checkpoint-activations; "16GB node", with
# it); seconds per iteration as printed, whole seconds. Rows that ran out of memory are left out.
TR3M = "bigscience-workshop/bigscience experiments/tr3m-1B3.md"
# Jean Zay's V100 nodes: four GPUs, each beside its own Omni-Path adapter of 100 Gb/s (12.5 GB/s),
# as NCCL lists them (hfi1_0 to hfi1_3) in the team's all-reduce benchmark on four of the 32 GB
# nodes (experiments/bandwidth/all_reduce_bench-32gb-n4.txt: 4 GB of fp32 over 16 ranks, four
# channels), whose 80 rank-trials give a median bus bandwidth of 84.59 Gb/s, 10.57 GB/s: what one
# communicator's rings reach across these nodes.
JEAN_ZAY_V100_RING_GBPS = 84.59 / 8
JEAN_ZAY_V100 = (("gpus_per_node", 4), ("inter_node_gbps", 12.5), ("inter_node_ring_gbps", JEAN_ZAY_V100_RING_GBPS))
TABLES = {  # section: (GPU memory in GB, rows of TP, PP, DP, MBS, whole-block recomputation, seconds)
    "32GB node": (32, [(1, 1, 8, 1, True, 29), (1, 1, 8, 2, True, 29), (1, 1, 8, 4, True, 28), (1, 1, 8, 8, True, 28),
                       (1, 2, 4, 1, True, 30), (1, 2, 4, 2, True, 29), (1, 2, 4, 8, True, 29), (1, 4, 2, 1, True, 32),
                       (1, 4, 2, 8, True, 32), (2, 1, 4, 1, True, 53),
                       (1, 1, 8, 1, False, 23), (1, 2, 4, 1, False, 23), (1, 4, 2, 1, False, 25),
                       (1, 4, 2, 2, False, 24), (2, 1, 4, 1, False, 39)]),
    "16GB node": (16, [(1, 1, 8, 1, True, 29), (1, 2, 4, 1, True, 30), (1, 2, 4, 2, True, 29), (1, 2, 4, 4, True, 28),
                       (1, 4, 2, 1, True, 32), (1, 4, 2, 4, True, 30), (1, 8, 1, 1, True, 37), (1, 8, 1, 4, True, 35)]),
}


def tr3m_tables() -> dict[str, list[Case]]:
    """Each section's runs, in the order it prints them."""
    spec = ModelSpec("gpt2", 24, 2048, 16, 16, 8192, 50257, 2048, tie_embeddings=True)
    tables = {}
    for section, (memory_gb, rows) in TABLES.items():
        cases = []
        for tp, pp, dp, mbs, recomputed, seconds in rows:
            stages = {"schedule": "1f1b", "stage_layers": deepspeed_stage_layers(spec.layers, pp)} if pp > 1 else {}
            fixed = {"tp": tp, "pp": pp, "dp": dp, "cp": 1, "zero": 1 if dp > 1 else 0, "dp_replicate": 1, "sp": False,
                     "recompute": "full" if recomputed else "none", **stages}
            name = (f"1.3B V100 {memory_gb}GB tp{tp}·pp{pp}·dp{dp} mbs {mbs}"
                    + ("" if recomputed else ", no recomputation"))
            cases.append(Case(name, f"{TR3M}, '{section}'", spec, 8, 512, fixed, seconds, mbs, gpu="v100",
                              kernels=STACKS["megatron-deepspeed"],
                              hardware_overrides=JEAN_ZAY_V100 + (("memory_bytes", device_memory(memory_gb)),)))
        tables[section] = cases
    return tables


def tr3m_runs() -> list[Case]:
    return [case for cases in tr3m_tables().values() for case in cases]


def tr3m_ablations() -> list[Ablation]:
    """Each section as one ablation (one allocation of two nodes each), fastest first."""
    return [Ablation(f"BigScience 1.3B (tr3m) on 8 V100 {section.split()[0]}: layouts, micro-batches, recomputation",
                     cases[0].source, tuple(sorted(cases, key=lambda case: case.measured_step_s)))
            for section, cases in tr3m_tables().items()]


def print_tp_layer_pass_evidence() -> None:
    """What tp 2 cost the 1.3B beyond tp 1 (each at micro-batch 1 on the 32 GB nodes, with and without
    recomputation), per layer pass of the tp-2 run's step, published and as the planner reads it
    without megatron-deepspeed's cost per layer pass under tp (``Kernels.tp_layer_pass_s``)."""
    runs = {(case.fixed["tp"], case.fixed["pp"], case.micro_batch, case.fixed["recompute"]): case
            for case in tr3m_tables()["32GB node"]}
    print("\n| 1.3B, 32 GB nodes | layer passes a step at tp 2 | tp 2 beyond tp 1, published (s) | per pass (ms) "
          "| predicted without the cost (s) | per pass (ms) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for recompute in ("full", "none"):
        tp2, tp1 = runs[2, 1, 1, recompute], runs[1, 1, 1, recompute]
        passes = tp2.batch // tp2.fixed["dp"] * tp2.spec.layers * (3 if recompute == "full" else 2)
        free = [replace(case, kernels=replace(case.kernels, tp_layer_pass_s=0.0)) for case in (tp2, tp1)]
        published = tp2.measured_step_s - tp1.measured_step_s
        predicted = predict(free[0], free[0].hardware())[0] - predict(free[1], free[1].hardware())[0]
        print(f"| recomputation {recompute} | {passes} | {published:.0f} | {1e3 * published / passes:.2f} | "
              f"{predicted:.1f} | {1e3 * predicted / passes:.2f} |")
