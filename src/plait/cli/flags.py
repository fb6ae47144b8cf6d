"""The ``plait`` command's flags for a model, a layout and a training run: argparse's side of
``plait.config``, which merges them over a config file and the defaults."""

from __future__ import annotations

import argparse

from plait.config import TrainSpec
from plait.facts.lr_schedule import LR_SCHEDULES
from plait.layout import CP_ALGORITHMS, GRAD_COMPRESSIONS, PRECISIONS, RECOMPUTE, SCHEDULES
from plait.models.spec import FAMILIES

# The model's flags beyond --model and --family: its sizes, then its switches.
MODEL_SIZE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len")
MODEL_SWITCH_FLAGS = ("parallel_block", "tie_embeddings")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", help="preset name, e.g. tiny, tiny-llama, gpt2, llama-8b")
    group.add_argument("--family", choices=FAMILIES)
    for name in MODEL_SIZE_FLAGS:
        group.add_argument("--" + name.replace("_", "-"), type=int)
    group.add_argument("--parallel-block", action=argparse.BooleanOptionalAction, default=None,
                       help="attention and MLP side by side on one norm's output (GPT-J, PaLM, Falcon)")
    group.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction, default=None,
                       help="the output projection reuses the token embedding")


def model_flags(args: argparse.Namespace) -> list[str]:
    """The model flags given (``add_model_arguments``), as a command line repeats them."""
    flags = ["--model", args.model] if args.model else []
    for name in ("family", *MODEL_SIZE_FLAGS):
        if getattr(args, name) is not None:
            flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    for name in MODEL_SWITCH_FLAGS:
        if getattr(args, name) is not None:
            flags.append(("--" if getattr(args, name) else "--no-") + name.replace("_", "-"))
    return flags


def _layer_counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated block counts such as 3,3,2, got {text!r}") from None


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("layout (world size = dp·cp·tp·pp)")
    for name in ("dp", "tp", "cp", "pp"):
        group.add_argument(f"--{name}", type=int)
    group.add_argument("--dp-replicate", type=int, metavar="R",
                       help="hybrid sharding (HSDP): ZeRO shards inside R groups of dp/R neighbouring ranks (inside a "
                            "node) and the groups are replicas; needs --zero 1-3 (default 1: shard over all dp ranks)")
    group.add_argument("--dp-shard", type=int, metavar="S",
                       help="with --dp-replicate R: the ranks of each group, so dp = R·S (the long form of --dp)")
    group.add_argument("--zero", type=int)
    group.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                       help="sequence parallel over the tp ranks (needs --tp > 1); --no-sp pins it off")
    group.add_argument("--schedule", choices=SCHEDULES)
    group.add_argument("--virtual-stages", type=int)
    group.add_argument("--stage-layers", type=_layer_counts, metavar="N,N,...",
                       help="transformer blocks per pipeline chunk, first to last, 0 allowed for the first and last chunk "
                            "(default: balanced by FLOPs)")
    group.add_argument("--microbatches", type=int, help="micro-batches per data-parallel rank and step")
    group.add_argument("--recompute", choices=RECOMPUTE)
    group.add_argument("--recompute-layers", type=int, metavar="N",
                       help="with --recompute full: only the first N blocks of each pipeline chunk recompute, the "
                            "rest keep their activations (default: every block)")
    group.add_argument("--offload-activations", action=argparse.BooleanOptionalAction, default=None,
                       help="keep what each block saves for backward in host memory until its backward (with "
                            "--recompute none; the copies cross the host link on the critical path)")
    group.add_argument("--grad-compression", choices=GRAD_COMPRESSIONS,
                       help="data-parallel gradient reduction: none (default), bf16 on the wire, or powersgd "
                            "(rank-8 factors with error feedback, lossy; ZeRO 0-1 without tp or pp)")
    group.add_argument("--cp-algorithm", choices=CP_ALGORITHMS,
                       help="context parallelism: all-to-all exchanges heads (cp must divide heads/tp; the default "
                            "in train), ring passes K/V blocks round the cp ranks (seq-len a multiple of 2·cp)")


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """``plait train``'s settings of the run (``TrainSpec``), in one group: what it learns from, where
    its files go, and what it observes."""
    parser.add_argument("--config", help="TOML file with [model], [layout] and [train] tables")
    group = parser.add_argument_group("training")
    defaults = TrainSpec()
    _add_learning_arguments(group, defaults)
    _add_run_dir_arguments(group)
    _add_observing_arguments(group, defaults)


def _add_learning_arguments(group, defaults: TrainSpec) -> None:
    """The steps, batch, optimizer and schedule, and where the data and the weights come from."""
    group.add_argument("--steps", type=int, help=f"optimizer steps (default {defaults.steps})")
    group.add_argument("--global-batch", type=int,
                       help=f"sequences per optimizer step, over all ranks (default {defaults.global_batch})")
    group.add_argument("--seed", type=int, help=f"seeds the weights and the data order (default {defaults.seed})")
    group.add_argument("--precision", choices=PRECISIONS, help="default: bf16 on GPUs that compute in it, fp32 on CPUs and V100s")
    group.add_argument("--lr", type=float, help=f"peak AdamW learning rate (default {defaults.lr})")
    group.add_argument("--warmup-steps", type=int,
                       help=f"linear warm-up before the --lr-schedule decay (default {defaults.warmup_steps})")
    group.add_argument("--lr-schedule", choices=LR_SCHEDULES,
                       help="after warm-up, from --lr down to lr·min-lr-ratio: cosine, linear, constant (no decay) "
                            "or wsd (warmup-stable-decay: --lr, then linear over the last --decay-fraction of the "
                            f"steps) (default {defaults.lr_schedule})")
    group.add_argument("--decay-fraction", type=float, metavar="F",
                       help="with --lr-schedule wsd: the share of the steps after warm-up that decay, in (0, 1] "
                            f"(default {defaults.decay_fraction})")
    group.add_argument("--min-lr-ratio", type=float, metavar="R",
                       help=f"the schedule ends at this share of --lr, in [0, 1] (default {defaults.min_lr_ratio})")
    group.add_argument("--grad-clip", type=float, metavar="NORM",
                       help=f"clip the global gradient norm to this (default {defaults.grad_clip}; 0: no clipping)")
    group.add_argument("--data", help="text file, or token file (.u16/.bin, .u32, .npy); default: the Python "
                                      "standard library's source as bytes")
    group.add_argument("--tokenizer", metavar="FILE",
                       help="the tokenizer.json the --data tokens were made with (plait prepare-data); the run keeps a "
                            "copy so plait sample decodes with it (default: none, bytes)")
    group.add_argument("--init-from", metavar="DIR",
                       help="start from the weights of a Hugging Face GPT-2 or Llama folder (config.json and "
                            "model.safetensors, or its shards with model.safetensors.index.json; e.g. from `plait "
                            "export`), under any layout; its config.json gives the model, which other model settings "
                            "may not contradict (a shorter --seq-len is allowed) (default: none, the seeded weights)")


def _add_run_dir_arguments(group) -> None:
    """Where the run's files go, its checkpoints, resuming and restarting."""
    group.add_argument("--run-dir", help="where metrics, summary, pictures and checkpoints go (default runs/<time>)")
    group.add_argument("--checkpoint-every", type=int, help="save a checkpoint every K steps (default 0: never)")
    group.add_argument("--final-checkpoint", action=argparse.BooleanOptionalAction, default=None,
                       help="save a checkpoint after the last step, for export, sample and --resume; "
                            "--no-final-checkpoint saves none (default on)")
    group.add_argument("--async-checkpoint", action="store_const", const=True,
                       help="write checkpoints in the background while training goes on; each becomes complete once "
                            "every rank's files are written (default off: the step waits for the write)")
    group.add_argument("--keep-checkpoints", type=int, metavar="K",
                       help="once a checkpoint is complete, delete all but the newest K (default 0: keep every one)")
    group.add_argument("--resume", action="store_const", const=True, help="continue from the run dir's last checkpoint")
    group.add_argument("--resume-changed", action="store_const", const=True,
                       help="with --resume: continue on purpose under another model, seed, data or global batch")
    group.add_argument("--restart-from-scratch", action="store_const", const=True,
                       help="with --resume: when no checkpoint is intact, set the damaged ones aside and train again "
                            "from step 0")
    group.add_argument("--max-restarts", type=int, metavar="N",
                       help="after a rank dies, restart every rank up to N times, each resuming by itself from the "
                            "newest complete checkpoint (losing the steps since it; default 0: the run ends)")


def _add_observing_arguments(group, defaults: TrainSpec) -> None:
    """Evaluation, loggers, guards, tracing, profiling and the stall watchdog."""
    group.add_argument("--eval-every", type=int, metavar="K",
                       help="every K steps and after the last, the loss on --eval-data, or without it on the held-out "
                            "last tenth of the data, which training then never reads (default 0: no evaluation, "
                            "training reads all of it)")
    group.add_argument("--eval-data", metavar="PATH",
                       help="with --eval-every: the validation file to score, of --data's formats and checked as it "
                            "is; training then reads all of --data (default: none, the data's last tenth)")
    group.add_argument("--tensorboard", action="store_const", const=True,
                       help="also write TensorBoard event files to RUN/tensorboard/: losses, learning rate, gradient "
                            "norm, step time, tokens/s, and at the end MFU, peak memory and bubble (default off)")
    group.add_argument("--skip-spikes", type=float, metavar="K",
                       help="skip the update of a step whose gradient norm is more than K times the median of the last "
                            "100 updates' (after 8 of them; every rank alike; the row says \"skipped\") "
                            "(default 0: off)")
    group.add_argument("--z-loss", type=float, metavar="Z",
                       help="add Z times the mean squared log-sum-exp of the logits to the loss (PaLM's z-loss; 1e-4 "
                            "is usual), which keeps the logits from drifting; the logged loss includes it, the "
                            "evaluation loss does not (default 0: off)")
    group.add_argument("--wandb", metavar="PROJECT",
                       help="also log the TensorBoard scalars and the resolved config to a Weights & Biases run of "
                            "PROJECT in RUN/wandb/ (needs pip install wandb); offline unless WANDB_MODE says "
                            "otherwise, so no network is needed (wandb sync uploads it) (default: none)")
    group.add_argument("--deterministic", action="store_const", const=True, help="deterministic kernels only")
    group.add_argument("--log-every", type=int,
                       help=f"when output is not a terminal, one progress line every K steps (default {defaults.log_every})")
    group.add_argument("--trace-every", type=int,
                       help="trace the step after the first and every K-th after it: compute spans, every collective "
                            f"and the waits, into trace.json and summary.json (default {defaults.trace_every})")
    group.add_argument("--stall-timeout", type=float, metavar="SECONDS",
                       help="when a rank makes no progress for this long, every rank names it and the operation "
                            "it and its peers are in, and the run ends (default "
                            f"{defaults.stall_timeout:g}; 0: off)")
    group.add_argument("--profile-steps", metavar="A:B",
                       help="write torch.profiler traces of steps A to B on every rank into RUN/profile/ (default: none)")


