"""The one validation of a run: model × layout × world size × global batch × kernels.

``plait train`` (and its ``--dry-run`` and ``--auto``), ``plait simulate``, ``plait plan``'s search
and ``plait explain`` all ask ``run_problems`` or ``check_run``; nothing else decides what is
valid. Every parallelism composes with every other; what is refused has no meaning (a
compression with nothing to compress), does not fit the model, is a composition the engine does
not run (per-operation recomputation or activation offload under a backward split in halves, as
zb-h1's, PowerSGD under tp or pp), or is what a reference stack lacks, each with its reason.
"""

from __future__ import annotations

from collections.abc import Callable

from plait.errors import ConfigError
from plait.facts.stack import STACKS, Kernels
from plait.layout import ZIGZAG_ALGORITHMS, Layout
from plait.models.spec import ModelSpec
from plait.schedules.registry import SCHEDULES, schedule_spec
from plait.schedules.registry import validate as validate_schedule
from plait.schedules.split import split_problems

def _raised(check: Callable[[], object]) -> list[str]:
    """The message ``check`` raises as a ConfigError, as a list (empty if it passes)."""
    try:
        check()
    except ConfigError as error:
        return [str(error)]
    return []


def fit_problems(spec: ModelSpec, layout: Layout, kernels: Kernels = STACKS["plait"]) -> list[str]:
    """Ways ``spec`` cannot be split as ``layout`` asks over tensor, sequence and context parallelism."""
    tp, cp = layout.tp, layout.cp
    problems = []
    if tp > 1 and not kernels.tensor_parallel:
        problems.append("this software stack has no tensor parallelism; pass --tp 1")
    if spec.heads % tp:
        problems.append(f"{spec.heads} attention heads cannot be split over --tp {tp}; choose a tp that divides the heads")
    if spec.kv_heads % tp and tp % spec.kv_heads:
        problems.append(
            f"{spec.kv_heads} kv-heads cannot be split or replicated over --tp {tp}; "
            "choose a tp that divides the kv-heads or that they divide"
        )
    if spec.ffn_hidden % tp:
        problems.append(f"FFN hidden size {spec.ffn_hidden} is not divisible by --tp {tp}; choose a tp that divides it")
    if layout.sp and not kernels.sequence_parallel:
        problems.append("this software stack has no sequence parallelism (Megatron-LM added it in 2022); drop --sp")
    if cp > 1 and not kernels.cp_algorithms:
        problems.append("this software stack has no context parallelism (Megatron-Core, torchtitan and plait have it); "
                        "pass --cp 1")
    elif cp > 1 and layout.cp_algorithm not in kernels.cp_algorithms:
        problems.append(f"this software stack runs context parallelism only as {' or '.join(kernels.cp_algorithms)}, "
                        f"not {layout.cp_algorithm}; pass --cp-algorithm {kernels.cp_algorithms[0]}")
    if layout.cp_algorithm in ZIGZAG_ALGORITHMS:
        if cp > 1 and spec.seq_len % (2 * cp):
            problems.append(f"{layout.cp_algorithm} context parallelism cuts the sequence into 2·cp chunks: sequence "
                            f"length {spec.seq_len} is not divisible by 2 × --cp {cp}; choose a seq-len that is")
    else:
        if spec.seq_len % cp:
            problems.append(f"sequence length {spec.seq_len} is not divisible by --cp {cp}; "
                            "choose a seq-len that is a multiple of cp")
        if not spec.heads % tp and (spec.heads // tp) % cp:
            problems.append(
                f"context parallel exchanges heads: the {spec.heads // tp} heads per tensor-parallel rank "
                f"are not divisible by --cp {cp}; choose cp dividing heads/tp, or --cp-algorithm ring or all-gather"
            )
    if layout.sp and not spec.seq_len % cp and (spec.seq_len // cp) % tp:
        problems.append(
            f"sequence parallel splits each rank's {spec.seq_len // cp} positions over --tp {tp}; "
            "choose a seq-len that is a multiple of cp·tp"
        )
    return problems


# What --recompute asks for, by mode a stack may lack (every stack runs without recomputation).
RECOMPUTE_NAMES = {"op": "per-operation checkpointing", "selective": "selective recomputation of the attention core",
                   "full": "full recomputation"}


def recompute_problems(layout: Layout, kernels: Kernels) -> list[str]:
    """A recomputation or activation offload the stack does not have (``Kernels.recompute_modes``,
    ``partial_recompute``, ``activation_offload``)."""
    if layout.recompute not in kernels.recompute_modes:
        others = [mode for mode in kernels.recompute_modes if mode != "none"]
        return [f"this software stack has no {RECOMPUTE_NAMES[layout.recompute]}; pass --recompute "
                f"{' or '.join(others)}"]
    if layout.recompute_layers is not None and not kernels.partial_recompute:
        return ["this software stack recomputes every block or none (Megatron-LM added recomputing some blocks "
                "in 2022); drop --recompute-layers"]
    if layout.offload_activations and not kernels.activation_offload:
        return ["this software stack cannot offload activations to host memory (plait and Megatron-Core can); "
                "drop --offload-activations or pass --recompute to save activation memory"]
    return []


def recomputes_once_per_backward(splits_backward: bool, recompute: str) -> bool:
    """Whether a schedule's backward can run under ``recompute``: torch's per-operation checkpoint
    replays a block once, and a schedule that splits each backward in two (``ScheduleSpec.splits_backward``:
    input gradients, then weights) replays the block's forward for each."""
    return not (recompute == "op" and splits_backward)


def reads_saved_once_per_backward(splits_backward: bool, offload: bool) -> bool:
    """Whether a schedule's backward reads each offloaded tensor once, as the offload's one copy back
    (plait.parallel.offload) and the planner's count of it assume: a split backward reads a block's
    saved tensors in each of its halves."""
    return not (offload and splits_backward)


def pipeline_problems(spec: ModelSpec, layout: Layout, kernels: Kernels = STACKS["plait"]) -> list[str]:
    """The schedule (one the stack runs), the stage split and the schedule's backward under the
    recomputation, when the layout has pipeline stages; without, the split of the one rank's chunks,
    which --recompute-layers counts by (plait.facts.recompute)."""
    if layout.pp == 1:
        return split_problems(spec, 1, layout.virtual_stages, layout.stage_layers)
    if not kernels.schedules_run:
        return ["this software stack has no pipeline parallelism; pass --pp 1"]
    problems = (split_problems(spec, layout.pp, layout.virtual_stages, layout.stage_layers)
                + _raised(lambda: validate_schedule(layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages)))
    if layout.schedule not in SCHEDULES:  # (validate_schedule said so)
        return problems
    schedule = schedule_spec(layout.schedule)
    if layout.schedule not in kernels.schedules_run:
        problems.append(f"this software stack has no {layout.schedule} schedule; pass --schedule "
                        f"{' or '.join(kernels.schedules_run)}")
    elif schedule.takes_virtual_stages and layout.pp == 2 and not kernels.interleaved_two_stages:
        problems.append("this software stack interleaves only three stages or more, as Megatron-LM before "
                        "Megatron-Core did; pass --pp 3 or more, or --schedule 1f1b")
    if not recomputes_once_per_backward(schedule.splits_backward, layout.recompute):
        problems.append(f"--recompute op replays each block's forward once, and {layout.schedule}'s split backward "
                        "replays it twice (input gradients, then weight gradients); pass --recompute full or "
                        "selective, or another --schedule")
    if not reads_saved_once_per_backward(schedule.splits_backward, layout.offload_activations):
        problems.append("--offload-activations brings each block's saved tensors back once for its backward, and "
                        f"{layout.schedule}'s split backward reads them in each half (input gradients, then weight "
                        "gradients); pass another --schedule or drop --offload-activations")
    return problems


# Sequences per step: 500 times the largest published runs' (about 2,000), yet small enough that
# drawing a step's batch never exhausts a rank's memory.
MAX_GLOBAL_BATCH = 2**20


def batch_problems(layout: Layout, global_batch: int) -> list[str]:
    per_rank = layout.dp * layout.microbatches
    if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
        return [f"global batch must be a positive number of sequences, got {global_batch!r}"]
    if global_batch > MAX_GLOBAL_BATCH:
        return [f"global batch {global_batch:,} sequences is more than plait draws per step ({MAX_GLOBAL_BATCH:,}); "
                "choose a smaller --global-batch"]
    if global_batch % per_rank:
        return [f"global batch {global_batch} is not divisible by dp × microbatches = {per_rank}; "
                f"choose a global batch that is a multiple of {per_rank}"]
    return []


def compression_problems(layout: Layout) -> list[str]:
    """Where ``--grad-compression`` has no meaning: nothing to compress without data parallelism, and
    PowerSGD only as DDP's communication hook (ZeRO 0–1 without tp or pp: every rank all-reduces
    whole gradients, of which it keeps an error-feedback copy)."""
    compression = layout.grad_compression
    if compression == "none":
        return []
    if layout.dp * layout.cp == 1:
        return [f"--grad-compression {compression} compresses the data-parallel gradient reduction and has no "
                "effect with --dp 1 and --cp 1; pass --dp 2 or more (or --cp 2 or more), or drop --grad-compression"]
    if compression != "powersgd":
        return []
    if layout.zero >= 2:
        return [f"--grad-compression powersgd all-reduces low-rank factors of whole gradients and keeps a "
                f"whole-gradient error buffer on every rank, which ZeRO stage {layout.zero}'s reduce-scatter of "
                "gradient shards cannot use; pass --zero 0 or 1, or --grad-compression bf16"]
    if layout.tp > 1 or layout.pp > 1:
        return ["--grad-compression powersgd runs as DDP's communication hook, and under --tp or --pp the "
                "data-parallel gradients are averaged outside DDP; drop --tp and --pp, or use "
                "--grad-compression bf16"]
    return []


def run_problems(spec: ModelSpec, layout: Layout, world_size: int | None = None, global_batch: int | None = None,
                 kernels: Kernels = STACKS["plait"]) -> list[str]:
    """Every reason this run is invalid, each one actionable sentence; [] if it runs.

    ``world_size`` and ``global_batch`` are checked when given.
    """
    return spec_problems(spec) or layout_problems(spec, layout, world_size, global_batch, kernels)


def spec_problems(spec: ModelSpec) -> list[str]:
    """What is wrong with the model itself, whatever the layout."""
    return _raised(spec.validate)


def layout_problems(spec: ModelSpec, layout: Layout, world_size: int | None = None, global_batch: int | None = None,
                    kernels: Kernels = STACKS["plait"]) -> list[str]:
    """``run_problems`` for a ``spec`` already known to be valid (a plan search asks it per candidate).

    A layout is valid exactly when ``mesh_problems`` and ``pipeline_problems`` both find nothing: a
    search checks the first once per mesh and the second once per schedule."""
    problems = _raised(layout.validate)
    if problems:  # the checks below read the fields as positive integers
        return problems
    return (compression_problems(layout) + recompute_problems(layout, kernels) + fit_problems(spec, layout, kernels)
            + stack_problems(layout, kernels) + pipeline_problems(spec, layout, kernels)
            + size_problems(layout, world_size, global_batch))


def mesh_problems(spec: ModelSpec, layout: Layout, world_size: int | None = None, global_batch: int | None = None,
                  kernels: Kernels = STACKS["plait"]) -> list[str]:
    """``layout_problems`` without the pipeline schedule and the stage split (``pipeline_problems``)."""
    problems = _raised(layout.validate)
    if problems:
        return problems
    return (compression_problems(layout) + recompute_problems(layout, kernels) + fit_problems(spec, layout, kernels)
            + stack_problems(layout, kernels) + size_problems(layout, world_size, global_batch))


def stack_problems(layout: Layout, kernels: Kernels) -> list[str]:
    """Hybrid sharding or a ZeRO stage the stack does not have (``Kernels.hybrid_sharding``,
    ``max_zero``), or a ZeRO stage it does not run beside pipeline stages (``pipeline_max_zero``); and
    tensor parallelism without sp where the stack fuses sp's collectives into the matmuls (torch's
    async TP)."""
    if layout.tp > 1 and not layout.sp and kernels.tp_comm_overlap == "micro-pipeline":
        return ["torch's async tensor parallelism fuses sequence-parallel all-gathers and reduce-scatters into "
                "the matmuls; add --sp"]
    if layout.dp_replicate > 1 and not kernels.hybrid_sharding:
        return ["this software stack shards over all data-parallel ranks, with no hybrid sharding; "
                "pass --dp-replicate 1"]
    if layout.zero > kernels.max_zero:
        return [f"this software stack has no ZeRO stage {layout.zero} (it shards up to stage {kernels.max_zero}); "
                f"pass --zero {kernels.max_zero}"]
    if layout.pp > 1 and layout.zero > kernels.pipeline_max_zero:
        return [f"this software stack's pipeline engine runs ZeRO stage {kernels.pipeline_max_zero} at most beside "
                f"pipeline stages; pass --zero {kernels.pipeline_max_zero} or --pp 1"]
    return []


def size_problems(layout: Layout, world_size: int | None, global_batch: int | None) -> list[str]:
    """The layout against the ranks there are and the global batch, each when given."""
    problems = []
    if world_size is not None and layout.world_size != world_size:
        problems.append(f"layout {layout.describe()} uses dp·cp·tp·pp = {layout.world_size} ranks but there are "
                        f"{world_size}; make the product of the layout sizes equal the number of ranks")
    if global_batch is not None:
        problems += batch_problems(layout, global_batch)
    return problems


def check_run(spec: ModelSpec, layout: Layout, world_size: int | None = None, global_batch: int | None = None,
              kernels: Kernels = STACKS["plait"]) -> None:
    """Raise ConfigError with the first of ``run_problems`` (one sentence), if there is any."""
    problems = run_problems(spec, layout, world_size, global_batch, kernels)
    if problems:
        raise ConfigError(problems[0])
