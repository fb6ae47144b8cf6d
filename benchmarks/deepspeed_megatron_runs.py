"""Runs of Megatron-DeepSpeed, DeepSpeed's pipeline engine over Megatron-LM's layers: BLOOM 176B, the
layout search of its prequel (one ablation per table) and MT-NLG 530B, predicted on the
megatron-deepspeed stack by benchmarks/validate_published.py."""

from __future__ import annotations

from benchmarks.published_case import Ablation, Case, gpt
from plait.facts.stack import DEEPSPEED_BF16_OPTIMIZER, STACKS
from plait.models.spec import ModelSpec
from plait.plan.comm import NETWORK_EFFICIENCY

BLOOM = "bigscience-workshop/bigscience train/tr11-176B-ml/README.md"
BLOOM_PREQUEL = "bigscience-workshop/bigscience train/tr11-176B-ml/chronicles-prequel.md"


def bloom() -> list[Case]:
    """BLOOM 176B on Megatron-DeepSpeed: 384 A100 80GB, TP4 PP12 DP8, micro-batch 2, 2,048 sequences of
    2,048 tokens; 104.70 s per iteration at iteration 85,376 (train/tr11-176B-ml/README.md)."""
    spec = ModelSpec("gpt2", 70, 14336, 112, 112, 4 * 14336, BLOOM_VOCAB, 2048, tie_embeddings=True)
    return [bloom_case("BLOOM 176B", BLOOM, spec, 8, 4, 12, 2, 2048, 104.70, rebalanced=True)]


# Megatron-Turing NLG 530B (Smith et al. 2022, §2.3-2.4) on Megatron-DeepSpeed: 105 blocks of hidden
# 20,480 with 128 heads, 2,048 tokens, 1,920 sequences a step; tensor slicing 8 inside a DGX A100 80GB,
# 35 pipeline stages (DeepSpeed's engine, 'type:transformer': three blocks a stage), data parallel over
# the rest of 280, 350 and 420 nodes; 60.1, 50.2 and 44.4 s per iteration. The micro-batch and ZeRO
# stage are not stated, so the planner picks them.
MT_NLG = "Smith et al. 2022 (arXiv 2201.11990), §2.4"


def mt_nlg() -> list[Case]:
    """MT-NLG's three timed scales, all held out (megatron-deepspeed's figure is BLOOM's)."""
    spec = gpt(105, 20480, 128)
    stages = {"schedule": "1f1b", "stage_layers": deepspeed_stage_layers(spec.layers, 35)}
    return [Case(f"MT-NLG 530B, {nodes} nodes", MT_NLG, spec, 8 * nodes, 1920,
                 {"tp": 8, "pp": 35, "dp": nodes // 35, "cp": 1, "sp": False, "recompute": "full", **stages}, seconds,
                 kernels=STACKS["megatron-deepspeed"])
            for nodes, seconds in ((280, 60.1), (350, 50.2), (420, 44.4))]


# BLOOM's Megatron-DeepSpeed: dropout 0.1, fused softmax without flash attention (EAGER), full recomputation,
# DeepSpeed's pipeline engine (its own 1F1B): in the prequel's prototype tables fp16 with DeepSpeed's ZeRO-1
# optimizer, from "Rebalancing layers" on (and the final run) bf16 with its BF16_Optimizer's own ZeRO stage 1
# over all dp ranks; the vocabulary padded to 250,880.
BLOOM_VOCAB = 250880
# Jean Zay's A100 80GB nodes (train/tr11-176B-ml/README.md, "Hardware"): 8 GPUs on NVLink, "4 OmniPath
# links" of 100 Gb/s to the other nodes, 12.5 GB/s an adapter, two GPUs to each. NCCL used little of
# them: the team's all-reduce benchmark on 4 of these nodes (experiments/bandwidth/
# all_reduce_bench-a100-n4.txt: 4 GB of fp32 over 32 ranks) logs two channels, both entering a node
# through one adapter and leaving through another (NET/IB/1 in, NET/IB/3 out), without GPUDirect
# RDMA, and a median bus bandwidth of 40.5 Gb/s, 5.07 GB/s, over its 160 rank-trials: 41% of an
# adapter. So one communicator's rings reach 5.07 GB/s across nodes, and a GPU whose adapter also
# carries its neighbour's rings half of that: BLOOM's data-parallel groups, one member a node under
# tp 8 (eight rings on four adapters) and two under tp 4, leave a node at 2.5 and 5.1 GB/s, and so do
# its pipeline sends, one from each GPU.
JEAN_ZAY_NCCL_BUS_GBPS = 5.07
JEAN_ZAY_A100 = (("inter_node_gbps", JEAN_ZAY_NCCL_BUS_GBPS / 2 / NETWORK_EFFICIENCY),
                 ("inter_node_ring_gbps", JEAN_ZAY_NCCL_BUS_GBPS))


def deepspeed_stage_layers(layers: int, pp: int, embeddings_counted: bool = False) -> tuple[int, ...]:
    """Blocks per stage as Megatron-DeepSpeed's PipelineModule cut them: its partition method
    'type:transformer' weighs each block 1 and everything else 0 ('type:transformer|embedding' also
    the input embedding, on the first stage, and the tied output embedding, on the last), and
    DeepSpeed's partition_balanced fills the stages from the first with as many units as the heaviest
    must hold, the last stage taking what is left: 78 blocks on 12 stages ran as 7 on eleven and 1 on
    the last, as the prequel notes."""
    units = layers + 2 * embeddings_counted
    most = -(-units // pp)
    sizes = [min(most, units - most * stage) for stage in range(pp)]
    sizes[0] -= embeddings_counted
    sizes[-1] -= embeddings_counted
    assert min(sizes) >= 1, f"DeepSpeed cannot cut {layers} blocks into {pp} stages"
    return tuple(sizes)


def bloom_case(name: str, source: str, spec: ModelSpec, dp: int, tp: int, pp: int, mbs: int, batch: int,
               step_s: float, rebalanced: bool = False) -> Case:
    """A Megatron-DeepSpeed run on Jean Zay, its stages cut as DeepSpeed cut them; ``rebalanced``: from
    the prequel's "Rebalancing layers" on, the embeddings count as pipeline units and DeepSpeed's
    BF16 optimizer accumulates the gradients in fp32 and all-reduces them; before, in fp16, its ZeRO
    optimizer reduces each rank's partition."""
    stages = {"schedule": "1f1b", "stage_layers": deepspeed_stage_layers(spec.layers, pp, rebalanced)}
    fixed = {"tp": tp, "pp": pp, "dp": dp, "cp": 1, "zero": 1 if dp > 1 else 0, "dp_replicate": 1, "sp": False,
             "recompute": "full", **(stages if pp > 1 else {})}
    kernels = DEEPSPEED_BF16_OPTIMIZER if rebalanced else STACKS["megatron-deepspeed"]
    return Case(name, source, spec, dp * tp * pp, batch, fixed, step_s, micro_batch=mbs, kernels=kernels,
                hardware_overrides=JEAN_ZAY_A100)


# The prequel's tables that time two or more layouts of one model, each with its section, the model
# (size as printed, hidden, layers, heads), whether it ran rebalanced (``bloom_case``), and its
# rows of DP, TP, PP, MBS, GBS, seconds per iteration (iteration 2) and the memory column ("Mem", GB,
# None where the table leaves it blank): the most a GPU of the nodes holding the word embeddings
# used, as nvidia-smi showed it (the prequel's "memory snapshot with ... nvidia-smi"), so with the
# CUDA context (1,271 MiB by its own reading), NCCL's buffers and all the caching allocator holds. A
# table timing several head counts gives one ablation per count. Left out: the first table of
# "Choosing the fastest 3D Topology", whose model changes with the layout; rows without a timing
# (out of memory); tables of one layout and micro-batch (head counts, the batch warm-up); and the
# ZeRO-stage table, whose columns are swapped and which its author marks for a retest. Before
# "Rebalancing layers" the prequel ran fp16, whose gradients accumulate in fp16.
BLOOM_PREQUEL_TABLES = [
    ("48 node contenders", "181B", 14336, 72, 64, False, [
        (4, 8, 12, 1, 2048, 143.31, 29), (4, 8, 12, 2, 2048, 134.02, 37), (4, 8, 12, 4, 2048, 123.69, 49),
        (4, 8, 12, 8, 2048, 129.26, 69), (8, 8, 6, 1, 2048, 139.82, 38), (8, 8, 6, 2, 2048, 131.02, 44),
        (8, 8, 6, 4, 2048, 121.48, 56)]),
    ("GBS variations", "181B", 14336, 72, 64, False, [
        (8, 8, 6, 4, 1568, 113.01, 56), (8, 8, 6, 4, 2048, 114.11, 55), (8, 8, 6, 6, 2016, 123.57, 66),
        (4, 8, 12, 4, 1568, 92.75, None), (4, 8, 12, 4, 2048, 117.07, 49), (4, 8, 12, 2, 1568, 99.93, None),
        (4, 8, 12, 2, 2048, 128.82, None)]),
    ("some more configs with lower PP", "181B", 14336, 72, 64, False, [
        (6, 8, 8, 4, 2016, 113.16, 52), (12, 8, 4, 2, 2016, 125.52, 53), (12, 8, 4, 4, 2016, 114.81, 59),
        (24, 8, 2, 1, 2016, 145.45, 65), (24, 8, 2, 2, 2016, 136.13, 76)]),
    ("tweaking TP", "181B", 14336, 72, 64, False, [
        (8, 4, 12, 4, 2048, 111.89, 60), (8, 4, 12, 2, 2048, 110.48, 44), (16, 4, 6, 4, 2048, 117.11, 75),
        (16, 4, 6, 2, 2048, 111.71, 57), (16, 2, 12, 2, 2048, 112.50, 63), (8, 2, 24, 1, 2048, 119.53, 44),
        (8, 2, 24, 2, 2048, 122.75, 53), (4, 4, 24, 1, 2048, 130.60, None)]),
    ("48 node contenders", "196B", 13824, 84, 64, False, [
        (4, 8, 12, 2, 2048, 143.89, 39), (4, 8, 12, 4, 2048, 133.12, 52), (8, 8, 6, 2, 2048, 141.41, 65),
        (8, 8, 6, 4, 2048, 130.31, 56)]),
    ("final round comparison", "177B", 12288, 96, 64, False, [(8, 8, 6, 2, 2048, 136.73, None),
                                                             (8, 8, 6, 4, 2048, 122.96, None)]),
    ("final round comparison", "182B", 13312, 84, 64, False, [
        (4, 8, 12, 4, 2048, 125.52, None), (8, 8, 6, 2, 2048, 135.55, None), (8, 8, 6, 4, 2048, 122.93, None)]),
    ("final round comparison", "181B", 14336, 72, 64, False, [(4, 8, 12, 4, 2048, 123.79, None),
                                                             (8, 8, 6, 4, 2048, 120.85, None)]),
    ("another round of NHEADS", "182B", 13824, 78, 64, False, [
        (8, 4, 12, 1, 2048, 148.24, None), (8, 4, 12, 2, 2048, 103.51, 48), (8, 4, 12, 4, 2048, 106.72, None)]),
    ("another round of NHEADS", "182B", 13824, 78, 96, False, [
        (8, 4, 12, 2, 2048, 107.12, 48), (8, 4, 12, 4, 2048, 110.31, None), (8, 8, 6, 4, 2048, 118.12, None)]),
    ("another round of NHEADS", "182B", 13824, 78, 128, False, [
        (8, 4, 12, 2, 2048, 147.41, None), (8, 4, 12, 4, 2048, 153.90, None), (8, 8, 6, 4, 2048, 156.84, None)]),
    ("another round of NHEADS", "181B", 14336, 72, 64, False, [(8, 4, 12, 2, 2048, 110.42, None),
                                                              (8, 8, 6, 4, 2048, 113.95, None)]),
    ("another round of NHEADS", "181B", 14336, 72, 128, False, [
        (8, 4, 12, 2, 2048, 114.02, None), (8, 4, 12, 4, 2048, 137.53, None), (8, 8, 6, 4, 2048, 116.06, None)]),
    ("another round of NHEADS", "182B", 13312, 84, 64, False, [
        (8, 4, 12, 2, 2048, 103.82, None), (8, 4, 12, 4, 2048, 113.21, None), (8, 8, 6, 2, 2048, 129.61, None)]),
    ("re-do", "182B", 13824, 78, 96, False, [
        (8, 8, 6, 2, 2048, 133.57, None), (8, 8, 6, 4, 2048, 118.24, 59), (16, 4, 6, 4, 2048, 115.55, 75)]),
    ("rebalancing layers", "195B", 12288, 106, 96, True, [(8, 4, 12, 2, 2048, 118.79, 65),
                                                         (8, 4, 12, 4, 2048, 120.34, 79)]),
    ("rebalancing layers", "184B", 12288, 100, 64, True, [(8, 8, 6, 2, 2048, 139.72, 61),
                                                         (8, 8, 6, 4, 2048, 120.96, 72)]),
    ("rebalancing layers", "178B", 13312, 82, 64, True, [
        (4, 8, 12, 4, 2048, 111.79, 52), (8, 4, 12, 2, 2048, 104.45, 63), (8, 4, 12, 4, 2048, 104.82, 74)]),
    ("rebalancing layers", "176B", 14336, 70, 64, True, [
        (4, 8, 12, 2, 2048, 121.63, 40), (8, 4, 12, 2, 2048, 102.03, 59), (8, 4, 12, 4, 2048, 102.27, 73)]),
    # The micro-batch tables of 'Choosing the fastest 3D Topology' (02-20, before the nodes' PCIe/NUMA
    # fix): hidden 14,400, and 'tile and wave quantization' 13,824. Their layer counts are what the
    # tables' TFLOPs column gives back under that day's estimate (8 × block parameters × tokens a
    # step, to within 0.1%: 78, 80, 77, 72 and 80); their heads are assumed, the 64 that 'Final round
    # comparison' says held "above too" (the 200B model's run of 02-17 names 96). The 200B model's
    # MBS 8 row ran "too close to OOM".
    ("choosing the fastest 3D topology", "194B", 14400, 78, 64, False, [
        (8, 8, 6, 1, 2048, 183.64, 39), (8, 8, 6, 2, 2048, 172.36, 45), (8, 8, 6, 4, 2048, 173.92, 56),
        (8, 8, 6, 8, 2048, 192.42, 75)]),
    ("choosing the fastest 3D topology", "200B", 14400, 80, 64, False, [
        (4, 8, 10, 1, 2048, 221.21, 35), (4, 8, 10, 2, 2048, 207.92, 43), (4, 8, 10, 4, 2048, 208.18, 55),
        (4, 8, 10, 8, 2048, 229.69, 76)]),
    ("choosing the fastest 3D topology", "195B", 14400, 77, 64, False, [
        (4, 8, 11, 1, 2048, 197.15, 32), (4, 8, 11, 2, 2048, 186.65, 41), (4, 8, 11, 4, 2048, 185.79, 53),
        (4, 8, 11, 8, 2048, 206.62, 75)]),
    ("choosing the fastest 3D topology", "183B", 14400, 72, 64, False, [
        (4, 8, 12, 1, 2048, 172.40, 30), (4, 8, 12, 2, 2048, 161.96, 39), (4, 8, 12, 4, 2048, 163.32, 50)]),
    ("tile and wave quantization", "187B", 13824, 80, 64, False, [
        (4, 8, 10, 1, 2048, 160.29, 33), (4, 8, 10, 2, 2048, 151.07, 39), (4, 8, 10, 4, 2048, 147.43, 53),
        (4, 8, 10, 8, 2048, 152.51, 73)]),
]


def bloom_layout_search() -> list[Ablation]:
    """The BLOOM prequel's search for a 3D layout on 48 nodes of 8 A100 80GB (chronicles-prequel.md),
    one ablation per table of ``BLOOM_PREQUEL_TABLES``; the first, '48 node contenders' of the 181B
    model (hidden 14,336, 72 layers, 64 heads), is what megatron-deepspeed's host time was fitted on.
    "tweaking TP" lists dp8·tp4·pp12 at micro-batch 2 twice (110.48 s at 44 GB and 113.54 s at 38 GB,
    the difference unstated); the first is kept."""
    return [Ablation(name, cases[0][0].source, tuple(sorted((case for case, _ in cases),
                                                            key=lambda case: case.measured_step_s / case.batch)))
            for name, cases in prequel_tables()]


def bloom_memory() -> list[tuple[str, Case, int]]:
    """Every prequel row whose table gives the memory it used: its table's name, the run and the GB."""
    return [(name, case, memory) for name, cases in prequel_tables() for case, memory in cases if memory is not None]


def prequel_tables() -> list[tuple[str, list[tuple[Case, int | None]]]]:
    """Each table of ``BLOOM_PREQUEL_TABLES``, named, with its runs and their memory column."""
    out = []
    for section, size, hidden, layers, heads, rebalanced, rows in BLOOM_PREQUEL_TABLES:
        spec = ModelSpec("gpt2", layers, hidden, heads, heads, 4 * hidden, BLOOM_VOCAB, 2048, tie_embeddings=True)
        model = "" if (hidden, layers, heads) == (14336, 72, 64) else f" ({layers} × {hidden}, {heads} heads)"
        source = f"{BLOOM_PREQUEL}, '{section}'"
        out.append((f"BLOOM {size} prototype{model}: {section}",
                    [(bloom_case(f"dp{dp}·tp{tp}·pp{pp} mbs {mbs} gbs {gbs}", source, spec, dp, tp, pp, mbs, gbs,
                                 seconds, rebalanced), memory)
                     for dp, tp, pp, mbs, gbs, seconds, memory in rows]))
    return out
