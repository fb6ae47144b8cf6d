"""The zero-bubble paper's schedule comparisons (Qi et al. 2024): four GPT-3-like models, each on a
pure pipeline of 8 to 32 A100 80GB GPUs (4 nodes at most, RoCE between them), timed under 1F1B,
interleaved 1F1B and ZB-1p at three micro-batch counts (table 4), then on deeper pipelines under
1F1B and ZB-1p (table 6) and at half the micro-batch size (table 7); predicted by
benchmarks/validate_published.py.

Its Megatron-LM fork (sail-sg/zero-bubble-pipeline-parallelism) of 2023 ran Megatron-LM's defaults
of that year: its fused softmax without flash attention (flash attention was an option, and the
paper names none) and dropout 0.1, as EAGER has them. The tables' memory column says so: it lies
within −2% to +10% of what the planner predicts for those kernels, and 25–45% above what flash
attention would hold. It runs 1F1B by Megatron-LM's schedule, which waits on each batched send and
receive before the next compute, and interleaved 1F1B with Megatron-LM's overlapped sends, which
post them and wait only before the data is used: the fork's paper branch (commit f68d3879,
megatron/arguments.py) makes --overlap-p2p-communication the default and turns it off without
interleaving, and its examples/pretrain_zero_bubble.sh leaves it on. ZB-1p runs on its own
runtime, which posts its sends too.
ZB-1p is the automatic schedule held to 1F1B's activation memory; its table 5 gives it the bubble
of the handcrafted ZB-H1 in every setting, so plait's zb-h1 stands for it. ZB-2p (twice the
memory) has no plait schedule and is left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from benchmarks.published_case import EAGER, Ablation, Case
from plait.models.spec import ModelSpec

ZERO_BUBBLE = "Qi et al. 2024 (arXiv 2401.10241), tables 3 and 4"
ZERO_BUBBLE_DEEPER = "Qi et al. 2024 (arXiv 2401.10241), tables 6 and 7"
# What each forward and each backward pass through a pipeline chunk costs the fork beside its layers
# (Kernels.chunk_pass_s). Table 4 times every model at three micro-batch counts, so what one more
# micro-batch costs under each schedule stands apart from the warm-up and drain: against 1F1B, one
# more micro-batch cost interleaved 1F1B 1.0-1.14 ms more than predicted per chunk beyond the first,
# in all four models (2 to 4 chunks a stage, one node to four), against ZB-1p 0.9-1.2 ms per extra
# chunk in three of them and 2.2 ms in the fourth (print_zero_bubble_marginal_costs). Fitted
# (benchmarks/validate_published.py --fit) on the 6.2B model, whose four chunks a stage give the
# most passes per micro-batch; the other three held out. What it is is not established: the fork's
# interleaved sends are posted and waited on without a host synchronisation, and it is about the
# same between nodes as inside one.
ZERO_BUBBLE_CHUNK_PASS_S = 0.00055
CHUNK_PASS_FITTED_ON = "6.2B"
ZERO_BUBBLE_MEGATRON = replace(EAGER, schedules=("1f1b", "interleaved-1f1b", "zb-h1"), blocking_sends=("1f1b",),
                               chunk_pass_s=ZERO_BUBBLE_CHUNK_PASS_S)

# Table 3: layers, hidden, heads, GPUs (= pipeline stages), micro-batch size and the three
# micro-batch counts; 1,024 tokens. The vocabulary is not stated: GPT-2's BPE as Megatron-LM pads
# it (50,304). Table 4: samples per GPU per second under each schedule at those counts.
MODELS = {"1.5B": (22, 2304, 24, 8, 6, (24, 32, 64)), "6.2B": (30, 4096, 32, 8, 3, (24, 32, 64)),
          "14.6B": (46, 5120, 40, 16, 1, (48, 64, 128)), "28.3B": (62, 6144, 48, 32, 1, (96, 128, 256))}
SAMPLES_PER_GPU_S = {
    "1.5B": {"zb-h1": (12.9, 13.4, 14.2), "1f1b": (11.8, 12.5, 13.6), "interleaved-1f1b": (13.1, 13.4, 13.9)},
    "6.2B": {"zb-h1": (3.88, 4.00, 4.20), "1f1b": (3.50, 3.70, 4.03), "interleaved-1f1b": (4.01, 4.08, 4.19)},
    "14.6B": {"zb-h1": (1.61, 1.67, 1.76), "1f1b": (1.40, 1.49, 1.64), "interleaved-1f1b": (1.54, 1.59, 1.66)},
    "28.3B": {"zb-h1": (0.87, 0.90, 0.96), "1f1b": (0.76, 0.80, 0.88), "interleaved-1f1b": (0.82, 0.85, 0.90)},
}
NAMES = {"zb-h1": "ZB-1p", "1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B"}
# Tables 6 and 7 (the arXiv version's ZB-V section): pipelines of 16, 24 and 32 GPUs (the layers now
# split k = 2 to a stage), a micro-batch b at three counts (table 6), and b / 2 at the middle count
# (table 7), under ZB-1p and 1F1B. Rows: GPUs, b, counts, samples per GPU per second at b, at b / 2.
DEEPER = {"6.2B": (16, 6, (48, 64, 128), {"zb-h1": ((3.87, 4.00, 4.29), 3.91), "1f1b": ((3.38, 3.57, 3.91), 3.48)}),
          "14.6B": (24, 2, (72, 96, 192), {"zb-h1": ((1.72, 1.78, 1.89), 1.65), "1f1b": ((1.52, 1.61, 1.76), 1.47)}),
          "28.3B": (32, 2, (96, 128, 256), {"zb-h1": ((0.94, 0.97, 1.03), 0.90), "1f1b": ((0.82, 0.87, 0.95), 0.80)})}


# The tables' memory column (GB, as printed; the paper does not say what it reads): the peak of each
# model and schedule, the same at every micro-batch count. Table 4's at its micro-batch, table 6's at b.
MEMORY_GB = {
    ("1.5B", 8): {"zb-h1": 32, "1f1b": 30, "interleaved-1f1b": 40},
    ("6.2B", 8): {"zb-h1": 42, "1f1b": 39, "interleaved-1f1b": 48},
    ("14.6B", 16): {"zb-h1": 33, "1f1b": 32, "interleaved-1f1b": 39},
    ("28.3B", 32): {"zb-h1": 44, "1f1b": 43, "interleaved-1f1b": 58},
    ("6.2B", 16): {"zb-h1": 62, "1f1b": 61},
    ("14.6B", 24): {"zb-h1": 46, "1f1b": 44},
    ("28.3B", 32, 2): {"zb-h1": 73, "1f1b": 69},
}


def stages(layers: int, pp: int, schedule: str) -> dict:
    """The paper's split: the first and last stage one block short for the embedding and the loss
    (layers = k·pp − 2); interleaved 1F1B with one block a chunk, so the first chunk is the
    embedding alone and the last the head alone."""
    k = (layers + 2) // pp
    if schedule == "interleaved-1f1b":
        return {"virtual_stages": k, "stage_layers": (0,) + (1,) * layers + (0,)}
    return {"virtual_stages": 1, "stage_layers": (k - 1,) + (k,) * (pp - 2) + (k - 1,)}


def model_spec_of(model: str) -> ModelSpec:
    layers, hidden, heads = MODELS[model][:3]
    return ModelSpec("gpt2", layers, hidden, heads, heads, 4 * hidden, 50304, 1024, tie_embeddings=True)


def pipeline_case(model: str, gpus: int, schedule: str, m: int, micro_batch: int, samples: float, source: str) -> Case:
    """One timed run: ``samples`` per GPU per second on a pure pipeline of ``gpus`` stages."""
    layers = MODELS[model][0]
    fixed = {"tp": 1, "pp": gpus, "dp": 1, "cp": 1, "zero": 0, "recompute": "none", "microbatches": m,
             "schedule": schedule, **stages(layers, gpus, schedule)}
    return Case(f"ZB paper {model}, {gpus} GPUs, {NAMES[schedule]}, m {m}, b {micro_batch}", source,
                model_spec_of(model), gpus, m * micro_batch, fixed, m * micro_batch / (samples * gpus), micro_batch,
                kernels=ZERO_BUBBLE_MEGATRON)


def table_4() -> list[tuple[Case, ...]]:
    """Each model and micro-batch count's three schedules."""
    return [tuple(pipeline_case(model, gpus, schedule, m, micro_batch, samples[i], ZERO_BUBBLE)
                  for schedule, samples in SAMPLES_PER_GPU_S[model].items())
            for model, (_, _, _, gpus, micro_batch, counts) in MODELS.items() for i, m in enumerate(counts)]


def table_6() -> list[tuple[Case, ...]]:
    """Each model and micro-batch count's ZB-1p and 1F1B at b."""
    return [tuple(pipeline_case(model, gpus, schedule, m, b, at_b[i], ZERO_BUBBLE_DEEPER)
                  for schedule, (at_b, _) in rows.items())
            for model, (gpus, b, counts, rows) in DEEPER.items() for i, m in enumerate(counts)]


def table_7() -> list[tuple[Case, Case]]:
    """Each model and schedule at the middle count: (at b / 2, at b). 28.3B's at b / 2 = 1 on 32 GPUs
    are table 4's own runs (the same figures)."""
    return [(pipeline_case(model, gpus, schedule, counts[1], b // 2, at_half, ZERO_BUBBLE_DEEPER),
             pipeline_case(model, gpus, schedule, counts[1], b, at_b[1], ZERO_BUBBLE_DEEPER))
            for model, (gpus, b, counts, rows) in DEEPER.items() for schedule, (at_b, at_half) in rows.items()]


def zero_bubble_runs() -> tuple[list[Case], list[Case]]:
    """Every run of tables 4, 6 and 7 once: (table 4's runs of the model the fork's cost per chunk
    pass is fitted on, the rest, held out). The fit reads four of that model's nine (1F1B and
    interleaved 1F1B at its fewest and most micro-batches); all nine count as fitted."""
    runs: dict[str, Case] = {}
    for setting in table_4() + table_6() + table_7():
        for case in setting:
            runs.setdefault(case.name, case)
    fitted = {name for name, case in runs.items() if case.source == ZERO_BUBBLE and chunk_pass_fitted(name)}
    return ([case for name, case in runs.items() if name in fitted],
            [case for name, case in runs.items() if name not in fitted])


def chunk_pass_fitted(name: str) -> bool:
    """Whether a table-4 run or comparison is of the model ``ZERO_BUBBLE_CHUNK_PASS_S`` is fitted on."""
    return name.startswith(f"ZB paper {CHUNK_PASS_FITTED_ON}, {MODELS[CHUNK_PASS_FITTED_ON][3]} GPUs,")


def zero_bubble_ablations() -> list[Ablation]:
    """The comparisons the tables print: table 4's three schedules and table 6's two at each model and
    micro-batch count, and table 7's two micro-batch sizes of each model and schedule; fastest per
    sequence first."""
    def named(setting: tuple[Case, ...], what: str) -> Ablation:
        first = setting[0]
        return Ablation(f"{first.name.split(', ')[0]}, {first.gpus} GPUs, {what}", first.source,
                        tuple(sorted(setting, key=lambda case: case.measured_step_s / case.batch)))

    return ([named(s, f"m {s[0].fixed['microbatches']}: schedules") for s in table_4() + table_6()]
            + [named(s, f"{NAMES[s[0].fixed['schedule']]}: micro-batch {s[0].micro_batch} against {s[1].micro_batch}")
               for s in table_7()])


def zero_bubble_memory() -> list[tuple[Case, int]]:
    """Each model, pipeline, micro-batch size and schedule's first timed run, with its published peak."""
    found: dict[tuple, tuple[Case, int]] = {}
    for setting in table_4() + table_6():
        for case in setting:
            model, schedule = case.name.split(", ")[0].split()[-1], case.fixed["schedule"]
            table = MEMORY_GB.get((model, case.gpus, case.micro_batch)) or MEMORY_GB.get((model, case.gpus), {})
            if schedule in table:
                found.setdefault((model, case.gpus, case.micro_batch, schedule), (case, table[schedule]))
    return list(found.values())


def marginal_microbatch_seconds(predict: Callable[[Case], float], models: tuple[str, ...] = tuple(MODELS)
                                ) -> list[tuple[str, int, dict[str, tuple[float, float]]]]:
    """Table 4's cost of one more micro-batch under each schedule, from each model's fewest micro-batches
    to its most: what grows with the micro-batches, apart from the warm-up and drain that do not.
    Rows: model, interleaving's chunks a stage, {schedule: (published s, predicted s)}."""
    out = []
    for model in models:
        layers, _, _, gpus, _, counts = MODELS[model]
        settings = [s for s in table_4() if s[0].name.startswith(f"ZB paper {model},")]
        fewest, most = settings[0], settings[-1]
        costs = {a.fixed["schedule"]: ((b.measured_step_s - a.measured_step_s) / (counts[-1] - counts[0]),
                                       (predict(b) - predict(a)) / (counts[-1] - counts[0]))
                 for a, b in zip(fewest, most)}
        out.append((model, stages(layers, gpus, "interleaved-1f1b")["virtual_stages"], costs))
    return out


def unpredicted_per_extra_chunk(chunks: int, costs: dict[str, tuple[float, float]]) -> float:
    """What one more micro-batch costs interleaved 1F1B over 1F1B, published less predicted, per chunk
    beyond the first (a ``marginal_microbatch_seconds`` row)."""
    (interleaved, interleaved_predicted), (plain, plain_predicted) = costs["interleaved-1f1b"], costs["1f1b"]
    return ((interleaved - plain) - (interleaved_predicted - plain_predicted)) / (chunks - 1)
