"""Runs on PyTorch's own distributed stacks: Meta's Llama 3 405B pre-training, torchtitan's
benchmarks (FSDP2, tensor, pipeline and async tensor parallelism, torch.compile against eager) and
MosaicML's llm-foundry tables, predicted by benchmarks/validate_published.py."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.published_case import Ablation, Case
from plait.facts.stack import STACKS, Kernels
from plait.models.flops import flops_per_sequence
from plait.models.spec import ModelSpec, model_spec
from plait.hardware import device_memory

LLAMA_3 = "Llama 3 Herd of Models (arXiv 2407.21783), table 4"  # also on Balaji's SC'24 slide
TORCHTITAN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md, table 5"


# Meta's stack as the Llama 3 paper describes it: Megatron-LM's kernels, its own context parallelism.
LLAMA_3_STACK = replace(STACKS["megatron"], cp_algorithms=("all-gather",))


def llama_3() -> list[Case]:
    """405B pre-training on H100: 16M tokens per batch (2048 × 8192, or 128 × 131,072 under cp16); step
    time from plait's FLOP count. Its context parallelism all-gathers K and V and then attends the local
    queries (the paper's §3.3.2: not a ring, the gather not overlapped), plait's ``all-gather``."""
    spec = model_spec("llama-405b")
    cases = []
    for gpus, dp, cp, tflops in ((8192, 64, 1, 430), (16384, 128, 1, 400), (16384, 8, 16, 380)):
        run = spec if cp == 1 else replace(spec, seq_len=131072)
        batch = 2**24 // run.seq_len
        step = batch * flops_per_sequence(run).model / (tflops * 1e12 * gpus)
        fixed = {"tp": 8, "cp": cp, "pp": 16, "dp": dp}
        cases.append(Case(f"Llama 3 405B, dp {dp}" + (f", cp {cp} at 128k" if cp > 1 else ""), LLAMA_3, run, gpus, batch,
                          fixed, step, gpu="h100-sxm", kernels=LLAMA_3_STACK))
    return cases


def torchtitan_runs() -> tuple[list[Case], list[Case]]:
    """torchtitan's bf16 runs under torch.compile on Grand Teton H100s (96 GB HBM2e, 500 W), 8,192 tokens:
    Llama 3.1 8B on FSDP (benchmarks/llama3_h100_202412_torchtitan.md, tables 1 and 3, selective
    checkpointing) and 70B and 8B on FSDP + TP (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md,
    bf16 rows with vanilla TP; the 8B with per-op SAC). Its selective checkpointing is per operation (it
    keeps every other matmul's output): plait's ``op``. Fitted on the first two, the other two held out."""
    rows = [  # model, GPUs, dp, tp, local batch, recompute, tokens/s/GPU, source
        ("llama-8b", 8, 8, 1, 2, "op", 6667, "llama3_h100_202412_torchtitan.md, table 1"),
        ("llama-70b", 256, 32, 8, 16, "full", 597.3, "asyncTP_llama3_h100_2025-06_torchtitan.md"),
        ("llama-8b", 128, 128, 1, 2, "op", 6514, "llama3_h100_202412_torchtitan.md, table 3"),
        ("llama-8b", 64, 8, 8, 12, "op", 4378, "asyncTP_llama3_h100_2025-06_torchtitan.md"),
    ]
    cases = [torchtitan_case(model, gpus, dp, tp, local, recompute, tokens_per_s, source, STACKS["pytorch"])
             for model, gpus, dp, tp, local, recompute, tokens_per_s, source in rows]
    # The same tables' runs without torch.compile: one eager kernel per elementwise op (--unfused).
    eager = replace(STACKS["pytorch"], fused=False)
    cases += [torchtitan_case("llama-8b", gpus, gpus, 1, 2, "op", tokens_per_s, f"llama3_h100_202412_torchtitan.md, "
                              f"table {table}", eager, " eager") for gpus, tokens_per_s, table in ((8, 5762, 1), (128, 5605, 3))]
    return cases[:2], cases[2:]


# MosaicML's llm-foundry benchmark tables: MPT models under PyTorch FSDP (FULL_SHARD, bf16) on A100
# nodes with 1,600 Gb/s between them (8 × 200 Gb/s). Every row of a model of 1B parameters or more that
# ran Composer's PURE mixed precision (bf16 gathers and reduce-scatters): the A100 40 GB table whole,
# one node or more, and the A100 80 GB table's rows on two nodes or more (its one-node rows ran DEFAULT,
# whose gather and reduction dtypes changed between Composer releases, and the table does not say which
# release); the H100 table states no network between nodes and is left out. MPT's shapes are the
# llm-foundry yamls' (layers, hidden, heads; MLP 4×, vocabulary 50,368, tied, learned positions as long
# as the sequence, which the tables' parameter counts show); MPT has no biases, which the gpt2 family
# counts (under 0.2% of the parameters). Rows on two nodes or more: model, GPUs, GPU, micro-batch,
# global batch, tokens per second per GPU, activation checkpointing (whole blocks), all at 2,048 tokens;
# rows on one node of 40 GB A100s: model, tokens, micro-batch, global batch, tokens per second per GPU,
# checkpointing.
LLM_FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"
MPT_SHAPES = {"70b": (80, 8192, 64), "30b": (48, 7168, 56), "13b": (40, 5120, 40), "7b": (32, 4096, 32),
              "3b": (32, 2560, 20), "1b": (24, 2048, 16)}
LLM_FOUNDRY_ROWS = [
    ("70b", 64, "a100-80gb", 8, 2048, 410, True), ("70b", 32, "a100-80gb", 2, 1024, 373, True),
    ("70b", 128, "a100-40gb", 4, 512, 376, True), ("70b", 64, "a100-40gb", 2, 128, 276, True),
    ("30b", 128, "a100-40gb", 6, 768, 865, True), ("30b", 32, "a100-40gb", 4, 128, 857, True),
    ("13b", 128, "a100-40gb", 16, 2048, 1972, True), ("13b", 64, "a100-40gb", 16, 1024, 1976, True),
    ("13b", 32, "a100-40gb", 14, 448, 1998, True), ("13b", 16, "a100-40gb", 10, 160, 1993, True),
    ("7b", 128, "a100-40gb", 18, 2304, 3623, True), ("7b", 64, "a100-40gb", 18, 1152, 3665, True),
    ("7b", 32, "a100-40gb", 18, 576, 3725, True), ("7b", 16, "a100-40gb", 16, 256, 3645, True),
    ("3b", 128, "a100-40gb", 6, 768, 9538, False), ("3b", 64, "a100-40gb", 6, 384, 9736, False),
    ("3b", 32, "a100-40gb", 6, 192, 9914, False), ("3b", 16, "a100-40gb", 5, 80, 9750, False),
    ("1b", 128, "a100-40gb", 10, 1280, 18647, False), ("1b", 64, "a100-40gb", 10, 640, 19001, False),
    ("1b", 32, "a100-40gb", 10, 320, 15555, False), ("1b", 16, "a100-40gb", 8, 128, 19085, False),
]
LLM_FOUNDRY_ONE_NODE_ROWS = [
    ("13b", 8192, 1, 128, 1407, True), ("13b", 4096, 2, 256, 1603, True), ("13b", 2048, 4, 512, 1668, True),
    ("13b", 1024, 8, 1024, 1727, True), ("13b", 512, 16, 2048, 1763, True),
    ("7b", 16384, 1, 32, 2249, True), ("7b", 8192, 3, 96, 2887, True), ("7b", 4096, 6, 192, 3366, True),
    ("7b", 2048, 12, 384, 3679, True), ("7b", 1024, 24, 768, 3854, True), ("7b", 512, 48, 1536, 3895, True),
    ("3b", 32768, 1, 32, 2955, True), ("3b", 16384, 2, 128, 4465, True), ("3b", 8192, 1, 64, 7149, False),
    ("3b", 4096, 2, 128, 8777, False), ("3b", 2048, 5, 320, 10065, False), ("3b", 1024, 10, 640, 10731, False),
    ("3b", 512, 20, 1280, 11324, False),
    ("1b", 32768, 1, 32, 5095, True), ("1b", 16384, 1, 64, 9715, False), ("1b", 8192, 2, 128, 13474, False),
    ("1b", 4096, 4, 256, 16856, False), ("1b", 2048, 8, 512, 19271, False), ("1b", 1024, 16, 1024, 20959, False),
    ("1b", 512, 32, 2048, 21782, False),
]


def llm_foundry_runs() -> list[Case]:
    """The llm-foundry rows above, every one held out (the llm-foundry stack has no figure of its own)."""
    rows = [(model, 2048, gpus, gpu, "", *rest) for model, gpus, gpu, *rest in LLM_FOUNDRY_ROWS]
    rows += [(model, tokens, 8, "a100-40gb", f", {tokens} tokens", *rest)
             for model, tokens, *rest in LLM_FOUNDRY_ONE_NODE_ROWS]
    cases = []
    for model, tokens, gpus, gpu, suffix, mbs, batch, tokens_per_s, checkpointing in rows:
        layers, hidden, heads = MPT_SHAPES[model]
        spec = ModelSpec("gpt2", layers, hidden, heads, heads, 4 * hidden, 50368, tokens, tie_embeddings=True)
        fixed = {"tp": 1, "pp": 1, "dp": gpus, "cp": 1, "zero": 3, "dp_replicate": 1, "sp": False,
                 "recompute": "full" if checkpointing else "none"}
        name = f"MPT {model} FSDP{gpus}, {gpu.removeprefix('a100-')}{suffix}"
        cases.append(Case(name, LLM_FOUNDRY, spec, gpus, batch, fixed, batch * tokens / (tokens_per_s * gpus), mbs,
                          gpu=gpu, kernels=STACKS["llm-foundry"]))
    return cases


# torchtitan's first published numbers (docs/performance.md): FSDP2 on 64 A100 80GB, Llama 3 8B and
# 70B and Llama 2 13B and 70B at one to two sequences a GPU, under its activation checkpointing modes: "selective layer" checkpoints every
# second block (its configs' selective_ac_option "2": plait's full recomputation of half the blocks),
# "selective op" is plait's op, "full" every block. torch.compile was off in that release's
# configs, so the stack is pytorch with eager elementwise kernels. Llama 2's shapes are Meta's
# (4,096 tokens, vocabulary 32,000, 70B with 8 K/V heads). Rows: model, sequences a GPU, recomputation,
# tokens per second per GPU.
TORCHTITAN_A100 = "torchtitan docs/performance.md"
LLAMA_2 = {"13B": ModelSpec("llama", 40, 5120, 40, 40, 13824, 32000, 4096, tie_embeddings=False),
           "70B": ModelSpec("llama", 80, 8192, 64, 8, 28672, 32000, 4096, tie_embeddings=False)}
TORCHTITAN_A100_ROWS = [("Llama 3 8B", 1, "half", 2904), ("Llama 3 8B", 1, "op", 2973), ("Llama 3 70B", 1, "full", 331),
                        ("Llama 2 13B", 2, "none", 2162), ("Llama 2 13B", 2, "half", 1914), ("Llama 2 13B", 2, "op", 1904),
                        ("Llama 2 70B", 1, "op", 355), ("Llama 2 70B", 2, "full", 353)]


def torchtitan_a100() -> list[Case]:
    """torchtitan's FSDP2 rows on 64 A100s, all held out."""
    cases = []
    for model, local, recompute, tokens_per_s in TORCHTITAN_A100_ROWS:
        spec = model_spec(f"llama-{model.split()[-1].lower()}") if model.startswith("Llama 3") else LLAMA_2[model.split()[-1]]
        modes = {"half": {"recompute": "full", "recompute_layers": spec.layers // 2}, "none": {"recompute": "none"},
                 "op": {"recompute": "op"}, "full": {"recompute": "full"}}
        fixed = {"dp": 64, "tp": 1, "pp": 1, "cp": 1, "zero": 3, "dp_replicate": 1, "sp": False, **modes[recompute]}
        label = {"half": "every second block", "none": "no recomputation", "op": "op-level", "full": "every block"}
        cases.append(Case(f"{model} FSDP64 A100, {label[recompute]}", TORCHTITAN_A100, spec, 64, 64 * local, fixed,
                          64 * local * spec.seq_len / (tokens_per_s * 64), local, gpu="a100-80gb",
                          kernels=replace(STACKS["pytorch"], fused=False)))
    return cases


def torchtitan_a100_recomputation() -> list[Ablation]:
    """The rows above, each model's recomputation modes against each other (per sequence)."""
    by_model: dict[str, list[Case]] = {}
    for case in torchtitan_a100():
        by_model.setdefault(case.name.split(" FSDP")[0], []).append(case)
    return [Ablation(f"{model} on 64 A100s: activation checkpointing", TORCHTITAN_A100,
                     tuple(sorted(cases, key=lambda c: c.measured_step_s / c.batch)))
            for model, cases in by_model.items() if len(cases) > 1]


def torchtitan_case(model: str, gpus: int, dp: int, tp: int, local: int, recompute: str, tokens_per_s: float,
                    source: str, kernels: Kernels, label: str = "") -> Case:
    spec, batch = model_spec(model), dp * local
    fixed = {"dp": dp, "tp": tp, "pp": 1, "cp": 1, "zero": 3, "sp": tp > 1, "recompute": recompute}
    name = f"{model} FSDP{dp}" + (f"·TP{tp}" if tp > 1 else "") + label
    return Case(name, f"torchtitan benchmarks/{source}", spec, gpus, batch, fixed,
                batch * spec.seq_len / (tokens_per_s * gpus), gpu="h100-96gb", kernels=kernels)


# torchtitan's async TP rows (bf16) beside its vanilla TP ones: model, GPUs, FSDP degree, local batch,
# recomputation, tokens/s/GPU vanilla and async (asyncTP_llama3_h100_2025-06_torchtitan.md).
ASYNC_TP_SOURCE = "asyncTP_llama3_h100_2025-06_torchtitan.md"
ASYNC_TP_ROWS = (("llama-70b", 256, 32, 16, "full", 597.3, 652.4), ("llama-8b", 64, 8, 12, "op", 4378, 4809.4))
ASYNC_TP = replace(STACKS["pytorch"], tp_comm_overlap="micro-pipeline")


def async_tp_runs() -> list[Case]:
    """The async TP runs, held out: torch's micro-pipeline pass over the vanilla rows' layouts."""
    return [torchtitan_case(model, gpus, dp, 8, local, recompute, asynchronous, ASYNC_TP_SOURCE, ASYNC_TP, " async TP")
            for model, gpus, dp, local, recompute, _, asynchronous in ASYNC_TP_ROWS]


def async_tensor_parallel() -> list[Ablation]:
    """torchtitan's async TP against its vanilla TP (bf16 rows): the same layouts, the tensor-parallel
    collectives fused into the matmuls where torch's pass can (``Kernels.tp_comm_overlap``)."""
    return [Ablation(f"{model}: async TP against vanilla TP", f"torchtitan benchmarks/{ASYNC_TP_SOURCE}",
                     (fused, torchtitan_case(model, gpus, dp, 8, local, recompute, vanilla, ASYNC_TP_SOURCE,
                                             STACKS["pytorch"])))
            for (model, gpus, dp, local, recompute, vanilla, _), fused in zip(ASYNC_TP_ROWS, async_tp_runs())]


def torchtitan_compilation() -> list[Ablation]:
    """torchtitan's tables 1 and 3 (llama3_h100_202412_torchtitan.md): Llama 3.1 8B under FSDP on 8 and
    on 128 H100s, with torch.compile (fused elementwise kernels) and without (plait's --unfused)."""
    runs = {case.name: case for case in sum(torchtitan_runs(), [])}
    pairs = [(runs[f"llama-8b FSDP{gpus}"], runs[f"llama-8b FSDP{gpus} eager"]) for gpus in (8, 128)]
    return [Ablation(f"Llama 3.1 8B on {compiled.gpus} H100s: torch.compile against eager", compiled.source,
                     (compiled, eager)) for compiled, eager in pairs]


def torchtitan_schedules() -> Ablation:
    """torchtitan's table 5 (benchmarks/llama3_h100_202412_torchtitan.md): Llama 3.1 405B on 512 H100
    (FSDP 8, TP 8, PP 8), local batch 32, global batch 256, full recomputation; 1F1B 100 tokens/s/GPU,
    interleaved 1F1B 128. Its matmuls ran in float8, so only the order is compared. The H100s were
    96 GB HBM2e parts at 2.4 TB/s."""
    spec = model_spec("llama-405b")
    base = {"tp": 8, "pp": 8, "dp": 8, "cp": 1, "zero": 3, "recompute": "full"}
    cases = []
    for schedule, tokens_per_s in (("interleaved-1f1b", 128), ("1f1b", 100)):
        step = 256 * spec.seq_len / (tokens_per_s * 512)
        cases.append(Case(f"405B {schedule}", TORCHTITAN, spec, 512, 256, {**base, "schedule": schedule}, step,
                          gpu="h100-sxm", kernels=STACKS["megatron-core"],
                          hardware_overrides=(("memory_bytes", device_memory(96)), ("memory_gbps", 2400))))
    return Ablation("Llama 3.1 405B: interleaved 1F1B against 1F1B", TORCHTITAN, tuple(cases))
