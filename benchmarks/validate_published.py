"""Predict published large training runs and print the table of docs/VALIDATION.md.

Each case fixes what its paper states (model, GPUs, tp/pp/dp, batch, recomputation, sequence
parallelism, schedule where given) and lets the planner fill what the paper leaves out (the
micro-batch size and schedule where unstated), exactly as ``plait simulate`` does. The runs live by
source (megatron_runs, megatron_ci_runs, pytorch_runs, deepspeed_megatron_runs, bigscience_v100_runs,
nemo_recipes, zero_bubble_runs), the predictions and the fits of the stacks' figures in stack_fits.

    PYTHONPATH=src python benchmarks/validate_published.py          # the table
    PYTHONPATH=src python benchmarks/validate_published.py --fit    # refit the stacks' constants
    PYTHONPATH=src python benchmarks/validate_published.py --plan-gains  # what plan claims over each run
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import replace

from benchmarks.bigscience_v100_runs import print_tp_layer_pass_evidence, tr3m_ablations, tr3m_runs
from benchmarks.deepspeed_megatron_runs import bloom, bloom_layout_search, bloom_memory, mt_nlg
from benchmarks.megatron_ci_runs import megatron_ci_ablations, megatron_ci_runs
from benchmarks.megatron_runs import (
    KORTHIKANTI_2022, KORTHIKANTI_TABLE_4, MEGATRON_2020, MEGATRON_2021, MEGATRON_CORE, MEGATRON_JANUARY_2021_STACK,
    NARAYANAN_TABLE_2, TABLE_4_LAYOUTS, deepspeed_zero3, korthikanti_2022, megatron_2020, megatron_2021,
    megatron_core_strong_scaling, megatron_core_weak_scaling, megatron_january_2021, ptdp_table_2, table_4_layer_ms,
    zero3_against_ptdp,
)
from benchmarks.nemo_recipes import DGXC, nemo_dgxc
from benchmarks.published_case import Ablation, Case
from benchmarks.pytorch_runs import (
    ASYNC_TP, LLAMA_3_STACK, TORCHTITAN, async_tensor_parallel, async_tp_runs, llama_3, llm_foundry_runs,
    torchtitan_a100, torchtitan_a100_recomputation, torchtitan_compilation, torchtitan_runs, torchtitan_schedules,
)
from benchmarks.stack_fits import (
    fit_catalog_efficiency, fit_chunk_pass, fit_efficiency, fit_tp_layer_pass, fit_zero3_efficiency, ordered, predict,
    predicted_peak, predicting_chunk_pass, refused_or_predicted,
)
from benchmarks.zero_bubble_runs import (
    CHUNK_PASS_FITTED_ON, ZERO_BUBBLE, ZERO_BUBBLE_CHUNK_PASS_S, ZERO_BUBBLE_MEGATRON, chunk_pass_fitted,
    marginal_microbatch_seconds, unpredicted_per_extra_chunk, zero_bubble_ablations, zero_bubble_memory,
    zero_bubble_runs,
)
from plait.errors import ConfigError
from plait.facts.stack import DEEPSPEED_BF16_OPTIMIZER, STACKS
from plait.layout import Layout
from plait.hardware import hardware
from plait.plan.search import best_layout
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload


def ablations() -> list[Ablation]:
    korthikanti = korthikanti_2022()
    pairs = [Ablation(f"{full.name.split()[0]}: full recomputation against sp + selective", KORTHIKANTI_2022,
                      (selective, full)) for full, selective in zip(korthikanti[0:8:2], korthikanti[1:8:2])]
    return (pairs + [torchtitan_schedules()] + torchtitan_compilation() + async_tensor_parallel() + zero3_against_ptdp()
            + torchtitan_a100_recomputation() + bloom_layout_search() + zero_bubble_ablations() + megatron_ci_ablations()
            + tr3m_ablations())


# How far two published timings of one layout lie apart in BLOOM's prequel, which warns that its
# second-iteration snapshots "can fluctuate a bit": "tweaking TP" lists dp8·tp4·pp12 at micro-batch 2
# at 110.48 and 113.54 s, and its one-node "max possible TFLOPs check" one layout at 130.43 and
# 119.19 s. Pairs closer than the wider of the two may be ordered by chance.
REPEAT_SPREAD = 130.43 / 119.19 - 1


def print_ablations() -> None:
    """Each ablation's layouts by time per sequence (its tables vary the global batch), published and
    predicted, and the pairs the planner orders as published."""
    print("\n| ablation | published order (fastest first) | published step (s) | predicted step (s) | pairs in order "
          "| source |")
    print("| --- | --- | --- | --- | ---: | --- |")
    # megatron-deepspeed's tp_layer_pass_s came from BLOOM's first table (and that it is paid only under
    # tensor parallelism from the 1.3B's tables), deepspeed-zero3's collective efficiency from the 175B
    # ZeRO-3 runs, the zero-bubble fork's cost per chunk pass from one model's runs, pytorch's
    # efficiency from a set holding the compiled 8B run on 8 GPUs
    fitted_runs = {case.name for case in published_runs()[0]}
    fitted_on = ({bloom_layout_search()[0].name} | {a.name for a in tr3m_ablations()}
                 | {a.name for a in zero3_against_ptdp() if a.name.startswith("175B")}
                 | {a.name for a in zero_bubble_ablations() if chunk_pass_fitted(a.name)}
                 | {a.name for a in torchtitan_compilation() if any(c.name in fitted_runs for c in a.fastest_first)})
    right = total = held_right = held_total = apart_right = apart_total = 0
    for ablation in ablations():
        steps = [refused_or_predicted(case) for case in ablation.fastest_first]
        per_sequence = [step / case.batch for step, case in zip(steps, ablation.fastest_first)]
        published_per_sequence = [case.measured_step_s / case.batch for case in ablation.fastest_first]
        pairs = published_pairs(ablation)
        in_order = sum(ordered(per_sequence, i, j) for i, j in pairs)
        right, total = right + in_order, total + len(pairs)
        apart = [(i, j) for i, j in pairs if published_per_sequence[j] > published_per_sequence[i] * (1 + REPEAT_SPREAD)]
        apart_right += sum(ordered(per_sequence, i, j) for i, j in apart)
        apart_total += len(apart)
        if ablation.name not in fitted_on:
            held_right, held_total = held_right + in_order, held_total + len(pairs)
        published = " / ".join(f"{c.measured_step_s:.3g}" for c in ablation.fastest_first)
        print(f"| {ablation.name} | {' < '.join(c.name for c in ablation.fastest_first)} | {published} | "
              f"{' / '.join(f'{step:.3g}' if math.isfinite(step) else 'refused' for step in steps)} | {in_order}/{len(pairs)} | "
              f"{ablation.source} |")
    print(f"\nablations: {right} of {total} pairs in the published order ({right / total:.0%}) over "
          f"{len(ablations())} ablations; held out (all but {', '.join(sorted(fitted_on))}): {held_right} of {held_total} "
          f"({held_right / held_total:.0%})")
    print(f"pairs published more than {REPEAT_SPREAD:.1%} apart (two published timings of one layout differ by that much): "
          f"{apart_right} of {apart_total} in the published order ({apart_right / apart_total:.0%})")


def published_pairs(ablation: Ablation) -> list[tuple[int, int]]:
    """The pairs (i, j) of an ablation's layouts whose order was published, i faster per sequence
    (its tables vary the global batch); a pair published at the same time has no order to get right."""
    per_sequence = [case.measured_step_s / case.batch for case in ablation.fastest_first]
    return [(i, j) for i in range(len(per_sequence)) for j in range(i + 1, len(per_sequence))
            if per_sequence[i] < per_sequence[j]]


def published_runs() -> tuple[list[Case], list[Case]]:
    """(the runs a stack figure was fitted on or a stack fact chosen on, the runs held out from both)."""
    core_fit, core_held = megatron_core_weak_scaling()
    titan_fit, titan_held = torchtitan_runs()
    zero3_fit, zero3_held = deepspeed_zero3()
    nemo_fit, nemo_held = nemo_dgxc()
    zb_fit, zb_held = zero_bubble_runs()
    return (core_fit + titan_fit + zero3_fit + nemo_fit + zb_fit + tr3m_runs(),
            megatron_2021() + megatron_january_2021() + korthikanti_2022() + megatron_2020() + bloom() + llama_3()
            + core_held + megatron_core_strong_scaling() + titan_held + async_tp_runs() + ptdp_table_2() + zero3_held + llm_foundry_runs() + torchtitan_a100() + mt_nlg()
            + nemo_held + zb_held + megatron_ci_runs())


def fit_all() -> None:
    """Refit every stack figure on its runs and print it (the values live in plait.facts.stack)."""
    print(f"fitted the catalog's a100-80gb matmul_efficiency on {KORTHIKANTI_TABLE_4}: {fit_catalog_efficiency():.3f}")
    fits = {"megatron-core, h100-sxm": megatron_core_weak_scaling()[0], "pytorch, h100-96gb": torchtitan_runs()[0],
            "nemo, h100-sxm": nemo_dgxc()[0]}
    for name, cases in fits.items():
        print(f"fitted {name} matmul_efficiency on {cases[0].source}: {fit_efficiency(cases):.3f}")
    print(f"megatron-2021 takes the catalog's: fitted on {MEGATRON_2021} it would be "
          f"{fit_efficiency(megatron_2021()):.3f}")
    contenders = bloom_layout_search()[0]
    print(f"fitted megatron-deepspeed tp_layer_pass_s on {contenders.source}: "
          f"{fit_tp_layer_pass(list(contenders.fastest_first)):.4f}")
    print(f"fitted deepspeed-zero3 zero3_collective_efficiency on {NARAYANAN_TABLE_2}, 175B: "
          f"{fit_zero3_efficiency(deepspeed_zero3()[0]):.3f}")
    print(f"fitted the zero-bubble fork's chunk_pass_s on {ZERO_BUBBLE}, {CHUNK_PASS_FITTED_ON}: "
          f"{1e3 * fit_chunk_pass():.2f} ms")


def print_plan_gains() -> None:
    """What ``plait plan`` claims over each published layout: the same model, GPUs, batch and stack
    with the layout left to the search, against the published layout pinned (both predicted)."""
    print("| run | published layout, predicted (s) | plan's pick | predicted (s) | claimed gain |")
    print("| --- | ---: | --- | ---: | ---: |")
    gains, cases = [], []
    for case in sum(published_runs(), []):
        try:
            pinned = predict(case, case.hardware())[0]
        except ConfigError:  # refused as not fitting: nothing to compare
            continue
        free = best_layout(Workload(case.spec, case.batch, "bf16", case.kernels), case.hardware(), case.gpus, {}, None)
        gains.append(pinned / free.step_time_s - 1)
        cases.append(case)
        print(f"| {case.name} | {pinned:.3g} | {free.layout.describe()}, mbs {free.micro_batch_size} | "
              f"{free.step_time_s:.3g} | {gains[-1]:+.1%} |")
    # (the zero-bubble paper's pure pipelines compare schedules, and the 2020 README's runs weak-scale
    # tensor parallelism on a release without pipelines or gradient accumulation, which plan's picks
    # use: neither set holds layouts chosen to train fast)
    groups = [", the zero-bubble paper's" if case.kernels == ZERO_BUBBLE_MEGATRON else
              ", the 2020 README's" if case.source == MEGATRON_2020 else ", the rest" for case in cases]
    subsets = {label: [g for g, group in zip(gains, groups) if group == label] for label in dict.fromkeys(groups)}
    for label, subset in {"": gains, **subsets}.items():
        print(f"\nplan's claimed gain over the published layouts{label}: median {statistics.median(subset):.1%} over "
              f"{len(subset)} runs, from {min(subset):+.1%} to {max(subset):+.1%}; over 5% on {sum(g > 0.05 for g in subset)}")


def main() -> None:
    if "--fit" in sys.argv:
        fit_all()
        return
    if "--plan-gains" in sys.argv:
        print_plan_gains()
        return
    fitted, held_out = published_runs()
    fitted_on = {"megatron-core": f"five rows of {MEGATRON_CORE}", "pytorch": f"two rows of {TORCHTITAN.split(',')[0]}",
                 "nemo": f"three Llama 3.1 rows of {DGXC}"}
    stacks = "; ".join(f"{name} on {gpu} {value} (fitted on {fitted_on[name]})"
                       for name, kernels in STACKS.items() for gpu, value in kernels.matmul_efficiency)
    print(f"matmul_efficiency: the catalog's {hardware('a100-80gb').matmul_efficiency} (fitted on {KORTHIKANTI_TABLE_4}); "
          f"{stacks}; every other stack and GPU the catalog's\n")
    print_table_4()
    print("| run | GPUs | stack | layout used | published step (s) | predicted (s) | error | source |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | --- |")
    errors: dict[str, list[float]] = {"fitted or chosen on": [], "held out": [], "held out, H100": [],
                                      "held out, the zero-bubble paper": []}
    refused = []
    for group, cases in (("fitted or chosen on", fitted), ("held out", held_out)):
        for case in cases:
            try:
                step, used = predict(case, case.hardware())
            except ConfigError as error:  # a run the planner says does not fit: a memory miss
                refused.append(case.name)
                print(f"| {case.name} | {case.gpus} | {stack_of(case)} | refused: {str(error).split(';')[0]} | "
                      f"{case.measured_step_s:.3g} | — | — | {case.source} |")
                continue
            error = step / case.measured_step_s - 1
            errors[group].append(abs(error))
            if group == "held out" and case.gpu.startswith("h100"):  # the SXM and the 96 GB Grand Teton part
                errors["held out, H100"].append(abs(error))
            if group == "held out" and case.kernels == ZERO_BUBBLE_MEGATRON:
                errors["held out, the zero-bubble paper"].append(abs(error))
            print(f"| {case.name} | {case.gpus} | {stack_of(case)} | {used} | {case.measured_step_s:.3g} | {step:.3g} "
                  f"| {error:+.1%} | {case.source} |")
    every = errors["fitted or chosen on"] + errors["held out"]
    for group, values in errors.items():
        print(f"\n{group}: median |error| {statistics.median(values):.1%} over {len(values)} runs, worst {max(values):.1%}")
    print(f"all: median |error| {statistics.median(every):.1%} over {len(every)} runs, worst {max(every):.1%}")
    print(f"refused as not fitting though they ran: {len(refused)} ({', '.join(refused)})")
    print_ablations()
    print_fsdp_bandwidth_bound()
    print_zero_bubble_memory()
    print_zero_bubble_marginal_costs()
    print_chunk_pass_effect()
    print_bloom_memory()
    print_bloom_head_alignment()
    print_tp_layer_pass_evidence()


# The FSDP runs whose per-layer gathers would show at a fraction of the ring's bandwidth: many
# micro-batches each regathering 70B (MPT on 32 GPUs) or one sequence a GPU (Llama 2 70B on 64);
# and the slow MPT-70B row on 64 GPUs of 40 GB, at which fraction it would fit.
FSDP_BANDWIDTH_WITNESSES = ("MPT 70b FSDP32, 80gb", "Llama 2 70B FSDP64 A100, op-level", "MPT 70b FSDP64, 40gb")


def print_fsdp_bandwidth_bound() -> None:
    """Those runs' errors were FSDP's gathers and reduce-scatters to reach only a fraction of the bus
    bandwidth NCCL's rings give (``Kernels.zero3_collective_efficiency``)."""
    cases = {c.name: c for c in llm_foundry_runs() + torchtitan_a100()}
    witnesses = [cases[name] for name in FSDP_BANDWIDTH_WITNESSES]
    print("\n| fraction of the ring's bandwidth | " + " | ".join(c.name for c in witnesses) + " |")
    print("| ---: |" + " ---: |" * len(witnesses))
    for fraction in (1.0, 0.25, 0.2, 0.18):
        errors = []
        for case in witnesses:
            slowed = replace(case, kernels=replace(case.kernels, zero3_collective_efficiency=fraction))
            errors.append(predict(slowed, slowed.hardware())[0] / case.measured_step_s - 1)
        print(f"| {fraction} | " + " | ".join(f"{e:+.1%}" for e in errors) + " |")


def print_bloom_memory() -> None:
    """The BLOOM prequel's memory column against the planner's peak for the same pinned layout."""
    print("\n| BLOOM prequel table | layout | published memory (GB) | predicted peak (GB) | error |")
    print("| --- | --- | ---: | ---: | ---: |")
    errors = []
    for table, case, published in bloom_memory():
        predicted = predicted_peak(case) / 1e9
        errors.append(predicted / published - 1)
        print(f"| {table} | {case.name} | {published} | {predicted:.1f} | {errors[-1]:+.1%} |")
    print(f"\nBLOOM prequel memory: median |error| {statistics.median(abs(e) for e in errors):.1%} over {len(errors)}, "
          f"from {min(errors):+.1%} to {max(errors):+.1%}")


# Bytes of a 16-bit value, and the alignment in bytes at which cuBLAS's tensor-core kernels load
# operands at full rate (its documentation's "tensorop restrictions").
HALF_BYTES, TENSOR_CORE_ALIGNMENT = 2, 16


def print_bloom_head_alignment() -> None:
    """Each BLOOM prequel table's median step-time error, by whether a head's row of 16-bit values
    fills whole 16-byte words (the alignment cuBLAS's tensor-core kernels load at full rate; the
    q, k and v views of Megatron's fused QKV output start 0, 1 and 2 heads in and step 3 heads at a
    time, so a head's alignment is theirs); then each layout a table times at several micro-batches,
    its step at each against the next smaller, published and predicted."""
    print("\n| BLOOM prequel table | head dim | 16-byte rows | median step error | range |")
    print("| --- | ---: | --- | ---: | ---: |")
    medians, sweeps = {True: [], False: []}, []
    for ablation in bloom_layout_search():
        head_dim = ablation.fastest_first[0].spec.head_dim
        steps = [(case, step) for case in ablation.fastest_first if math.isfinite(step := refused_or_predicted(case))]
        errors = [step / case.measured_step_s - 1 for case, step in steps]
        aligned, median = head_dim * HALF_BYTES % TENSOR_CORE_ALIGNMENT == 0, statistics.median(errors)
        medians[aligned].append(median)
        print(f"| {ablation.name} | {head_dim} | {'yes' if aligned else 'no'} | {median:+.1%} "
              f"| {min(errors):+.1%} to {max(errors):+.1%} |")
        layouts: dict[tuple, list] = {}
        for case, step in sorted(steps, key=lambda pair: pair[0].micro_batch):
            layout = case.name.replace(f" mbs {case.micro_batch}", "")
            layouts.setdefault(layout, []).append((case, step))
        sweeps += [(ablation.name, layout, smaller, larger, larger_step / smaller_step - 1)
                   for layout, runs in layouts.items()
                   for (smaller, smaller_step), (larger, larger_step) in zip(runs, runs[1:])]
    for aligned, values in medians.items():
        if values:
            print(f"\nBLOOM tables with{'' if aligned else 'out'} 16-byte head rows: {len(values)}, their medians "
                  f"{min(values):+.1%} to {max(values):+.1%}")
    print("\n| BLOOM prequel table | layout | micro-batch | step against the next smaller, published | predicted |")
    print("| --- | --- | --- | ---: | ---: |")
    for table, layout, smaller, larger, predicted in sweeps:
        print(f"| {table} | {layout} | {smaller.micro_batch} → {larger.micro_batch} "
              f"| {larger.measured_step_s / smaller.measured_step_s - 1:+.1%} | {predicted:+.1%} |")


def print_zero_bubble_memory() -> None:
    """The zero-bubble tables' peak memory against the planner's for the same pinned layout (fit or not),
    and what the same layout would hold with flash attention."""
    print("\n| zero-bubble run | published peak (GB) | predicted peak (GB) | error | with flash attention |")
    print("| --- | ---: | ---: | ---: | ---: |")
    errors, flash_errors = [], []
    for case, published in zero_bubble_memory():
        predicted, flash = (evaluate(Workload(case.spec, case.batch, "bf16", kernels), case.hardware(), case.gpus,
                                     Layout(**case.fixed)).peak_memory_bytes / 1e9
                            for kernels in (case.kernels, replace(case.kernels, flash_attention=True, dropout=False)))
        errors.append(predicted / published - 1)
        flash_errors.append(flash / published - 1)
        print(f"| {case.name.split(', m ')[0]}, b {case.micro_batch} | {published} | {predicted:.1f} | {errors[-1]:+.1%} "
              f"| {flash_errors[-1]:+.1%} |")
    print(f"\nzero-bubble peaks: median |error| {statistics.median(abs(e) for e in errors):.1%} over {len(errors)}, "
          f"from {min(errors):+.1%} to {max(errors):+.1%}; with flash attention from {min(flash_errors):+.1%} "
          f"to {max(flash_errors):+.1%}")


def print_zero_bubble_marginal_costs() -> None:
    """What one more micro-batch costs under each of table 4's schedules, published against predicted,
    and what interleaving adds over 1F1B per extra chunk a micro-batch passes through that the
    planner does not predict."""
    print("\n| zero-bubble model (chunks a stage) | one more micro-batch (ms, published / predicted): ZB-1p | 1F1B "
          "| interleaved 1F1B | interleaved over 1F1B not predicted, per extra chunk (ms) | the same without a cost per "
          "chunk pass |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    bare = marginal_microbatch_seconds(predicting_chunk_pass(0.0))
    charged = marginal_microbatch_seconds(lambda case: predict(case, case.hardware())[0])
    for (model, chunks, costs), (_, _, without) in zip(charged, bare):
        cells = " | ".join(f"{1e3 * costs[s][0]:.1f} / {1e3 * costs[s][1]:.1f}" for s in ("zb-h1", "1f1b", "interleaved-1f1b"))
        mark = " (fitted on)" if model == CHUNK_PASS_FITTED_ON else ""
        print(f"| {model} ({chunks}){mark} | {cells} | {1e3 * unpredicted_per_extra_chunk(chunks, costs):+.2f} "
              f"| {1e3 * unpredicted_per_extra_chunk(chunks, without):+.2f} |")
    # (against ZB-1p, whose runtime posts its sends and moves on, what interleaving's extra chunks
    # cost beyond the prediction, without the cost and with it)
    def over_zb(costs: dict, chunks: int) -> float:
        (interleaved, interleaved_predicted), (zb, zb_predicted) = costs["interleaved-1f1b"], costs["zb-h1"]
        return 1e3 * ((interleaved - zb) - (interleaved_predicted - zb_predicted)) / (chunks - 1)

    print("\ninterleaved 1F1B over ZB-1p not predicted, per extra chunk (ms), without a cost per chunk pass / with it: "
          + ", ".join(f"{model} {over_zb(without, chunks):+.2f} / {over_zb(costs, chunks):+.2f}"
                      for (model, chunks, without), (_, _, costs) in zip(bare, charged)))


def print_chunk_pass_effect() -> None:
    """The zero-bubble runs held out of the fork's cost per chunk pass, by model, GPUs and micro-batch,
    predicted without that cost and with it, and the paper's pairs ordered either way."""
    without, with_it = predicting_chunk_pass(0.0), predicting_chunk_pass(ZERO_BUBBLE_CHUNK_PASS_S)
    groups: dict[str, list[tuple[float, float]]] = {}
    for case in zero_bubble_runs()[1]:
        group = f"{case.name.split(',')[0].removeprefix('ZB paper ')}, {case.gpus} GPUs, b {case.micro_batch}"
        groups.setdefault(group, []).append((without(case) / case.measured_step_s - 1,
                                             with_it(case) / case.measured_step_s - 1))
    print("\n| held-out zero-bubble runs | runs | without a cost per chunk pass | with it |")
    print("| --- | ---: | ---: | ---: |")
    for group, errors in groups.items():
        print(f"| {group} | {len(errors)} | {min(e for e, _ in errors):+.1%} to {max(e for e, _ in errors):+.1%} "
              f"| {min(e for _, e in errors):+.1%} to {max(e for _, e in errors):+.1%} |")
    every = [pair for errors in groups.values() for pair in errors]
    in_order = {}
    for label, predicted in (("without", without), ("with", with_it)):
        pairs = right = 0
        for ablation in zero_bubble_ablations():
            steps = [predicted(case) / case.batch for case in ablation.fastest_first]
            compared = published_pairs(ablation)
            pairs, right = pairs + len(compared), right + sum(ordered(steps, i, j) for i, j in compared)
        in_order[label] = f"{right} of {pairs}"
    print(f"\nheld-out zero-bubble runs read further off with the cost: {sum(abs(b) > abs(a) for a, b in every)} of "
          f"{len(every)}; median |error| {statistics.median(abs(a) for a, _ in every):.1%} without it, "
          f"{statistics.median(abs(b) for _, b in every):.1%} with it; the paper's pairs in order "
          f"{in_order['without']} without it, {in_order['with']} with it")


def print_table_4() -> None:
    """Table 4's layer timings, published and predicted (the catalog's A100 efficiency is fitted on them)."""
    print("| 22B layer, tp 8, micro-batch 4 | published forward + backward (ms) | predicted (ms) | error |")
    print("| --- | ---: | ---: | ---: |")
    for (name, _, published), predicted in zip(TABLE_4_LAYOUTS, table_4_layer_ms(hardware("a100-80gb"))):
        print(f"| {name} | {published} | {predicted:.1f} | {predicted / published - 1:+.1%} |")
    print()


def stack_of(case: Case) -> str:
    if case.kernels == replace(STACKS["pytorch"], fused=False):
        return "pytorch --unfused"
    if case.kernels == ASYNC_TP:
        return "pytorch --async-tp"
    if case.kernels == ZERO_BUBBLE_MEGATRON:
        return "megatron (zero-bubble fork)"
    if case.kernels == MEGATRON_JANUARY_2021_STACK:
        return "megatron-2021 (1f1b only, boundaries whole)"
    if case.kernels == DEEPSPEED_BF16_OPTIMIZER:
        return "megatron-deepspeed, BF16 optimizer"
    if case.kernels == LLAMA_3_STACK:
        return "Meta's (megatron kernels, all-gather cp)"
    return next((name for name, kernels in STACKS.items() if kernels == case.kernels), "megatron (eager, dropout)")


if __name__ == "__main__":
    main()
