"""The ``plait plan``, ``plait simulate`` and ``plait calibrate`` subcommands.

Pure Python up to ``calibrate``, whose handler imports torch only when it runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
from dataclasses import replace
from pathlib import Path

from plait.cli.device import add_device_overrides, device_hardware
from plait.cli.outputs import check_output_file
from plait.cli.training import train_command
from plait.cli.flags import add_layout_arguments, add_model_arguments
from plait.config import layout_values
from plait.errors import ConfigError
from plait.facts.stack import DEFAULT_STACK, STACKS, Kernels
from plait.layout import PRECISIONS, Layout, default_precision
from plait.models.spec import SPEC_FIELDS, model_spec
from plait.observe.run_files import SUMMARY_FILE
from plait.observe.timeline import draw_timeline
from plait.observe.trace import simulated_trace
from plait.hardware import CATALOG, Hardware, hardware, load_profile, profile_json
from plait.plan.search import NothingFits, best_layout, search
from plait.plan.simulate import Prediction, evaluate
from plait.plan.simulated_step import flush_spans, simulated_timeline
from plait.plan.workload import Workload

DEFAULT_TOKENS = 2**20  # default global batch: about a million tokens


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster and batch")
    group.add_argument("--gpu", default="h100-sxm", help=f"one of {', '.join(CATALOG)} (default h100-sxm)")
    group.add_argument("--hardware-profile", metavar="FILE", help="a profile written by `plait calibrate`, instead of --gpu")
    group.add_argument("--gpus", type=int, default=8, help="devices in all (default 8)")
    add_device_overrides(group)
    group.add_argument("--global-batch", type=int, help="sequences per step (default: ~1M tokens, a multiple of --gpus)")
    group.add_argument("--microbatch-size", type=int, help="sequences per micro-batch (default: searched)")
    group.add_argument("--precision", choices=PRECISIONS,
                       help="default: what plait train uses on the device (bf16 on GPUs, fp32 on a CPU profile)")
    stack = parser.add_argument_group("software stack (default: plait train's own run)")
    stack.add_argument("--stack", choices=tuple(STACKS), default=DEFAULT_STACK,
                       help="plait: plait's own kernels (eager elementwise, all-to-all, ring or all-gather context parallelism); "
                            "megatron: fused kernels and ring context parallelism only, as Megatron-LM and torchtitan run; "
                            "megatron-core: as megatron with Transformer Engine's tensor-parallel communication inside "
                            "the matmuls and its own H100 efficiency; nemo: as megatron-core with Hopper-native causal attention "
                            "and the H100 efficiency of NVIDIA's 2025 NeMo recipes; megatron-deepspeed: DeepSpeed's pipeline engine "
                            "and its cost per layer pass under tensor parallelism; deepspeed-zero3: DeepSpeed's ZeRO-3 of 2021, gathering linear by "
                            "linear; pytorch: torchtitan under torch.compile; llm-foundry: MosaicML's FSDP without "
                            "torch.compile, with flash-attn's cross entropy (docs/VALIDATION.md)")
    stack.add_argument("--attention", choices=("flash", "eager"),
                       help="override the stack: flash keeps no s×s scores; eager (as Megatron-LM 2021) does")
    stack.add_argument("--dropout", action="store_true", help="the model trains with dropout (1-byte masks)")
    stack.add_argument("--unfused", action="store_true",
                       help="override the stack: elementwise ops run one eager PyTorch kernel each")
    stack.add_argument("--async-tp", action="store_true",
                       help="with --stack pytorch: torch's async tensor parallelism (torchtitan's "
                            "--parallelism.enable_async_tensor_parallel) fuses, under --sp, each all-gather and "
                            "reduce-scatter it can into its matmul")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def add_plan_commands(subparsers) -> None:
    """Register ``plan``, ``simulate`` and ``calibrate`` on an argparse subparsers object."""
    plan = subparsers.add_parser("plan", help="rank every layout of a model on N GPUs",
                                 description="Search every valid layout, drop what does not fit, rank by speed.")
    simulate = subparsers.add_parser("simulate", help="predict memory and step time of one layout",
                                     description="Predict one layout; layout flags left out take plan's best choice.")
    for parser in (plan, simulate):
        add_model_arguments(parser)
        add_layout_arguments(parser)
        add_cluster_arguments(parser)
    plan.add_argument("--top", type=int, default=3, help="layouts to list (default 3)")
    for parser in (plan, simulate):
        parser.add_argument("--tie-break", choices=("simplicity", "time"), default="simplicity",
                            help="layouts predicted within the planner's error of the fastest: fewer parallel "
                                 "dimensions first (default), or strictly by predicted time")
    simulate.add_argument("--trace", metavar="FILE", help="write the simulated step as a Chrome/Perfetto trace")
    simulate.add_argument("--timeline", metavar="FILE.png", help="draw the simulated step as runs draw theirs")
    plan.set_defaults(handler=run_plan)
    simulate.set_defaults(handler=run_simulate)
    calibrate = subparsers.add_parser("calibrate", help="measure this machine into a hardware profile",
                                      description="Time plait's kernels by shape (and, on a CPU, gloo collectives); "
                                                  "write a JSON profile.")
    calibrate.add_argument("--out", default="hardware-profile.json", help="where to write the profile")
    calibrate.add_argument("--name", default="this-machine")
    calibrate.add_argument("--device", choices=("cpu", "cuda"),
                           help="what to measure: the first GPU, its links taken from the catalog (cuda), or two "
                                "ranks of this CPU (cpu); default: cuda where torch sees a GPU and --threads is not given")
    calibrate.add_argument("--precision", choices=PRECISIONS, help="default: bf16 on a GPU, fp32 on a CPU")
    calibrate.add_argument("--threads", type=int, help="cores per CPU device (default: half the cores, as two local ranks get)")
    calibrate.set_defaults(handler=run_calibrate)
    explain = subparsers.add_parser("explain", help="set a finished run's measurements beside their prediction",
                                    description="Predict a finished run's layout and compare each figure with "
                                                "what the run measured; pipeline runs also get explain.png. Given "
                                                "two runs, set them side by side and name what made the difference.")
    explain.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                         help="the --run-dir of a finished plait train run; a second one compares the two")
    hardware_choice = explain.add_mutually_exclusive_group()
    hardware_choice.add_argument("--gpu", help="predict for this catalog GPU (default: the run's own GPU)")
    hardware_choice.add_argument("--hardware-profile", metavar="FILE",
                                 help="a profile written by `plait calibrate` (needed for runs on CPU)")
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    explain.set_defaults(handler=run_explain)


def stack_kernels(args: argparse.Namespace) -> Kernels:
    """The chosen stack's kernels with any of --attention, --dropout, --unfused, --async-tp over them."""
    kernels = STACKS[args.stack]
    if kernels.plait_engine and (args.dropout or args.attention == "eager"):
        raise ConfigError("plait's own model trains without dropout and with fused attention; --dropout and "
                          "--attention eager describe another stack: add --stack megatron")
    if args.async_tp and args.stack != "pytorch":
        raise ConfigError(f"--async-tp is torch's async tensor parallelism, which torchtitan runs under torch.compile; "
                          f"--stack {args.stack} has none: add --stack pytorch")
    if args.async_tp and args.unfused:
        raise ConfigError("torch's async tensor parallelism is a torch.compile pass, and --unfused describes a run "
                          "without torch.compile: leave out one of them")
    overrides = {
        "flash_attention": None if args.attention is None else args.attention == "flash",
        "dropout": True if args.dropout else None,
        "fused": False if args.unfused else None,
        "tp_comm_overlap": "micro-pipeline" if args.async_tp else None,
    }
    return replace(kernels, **{k: v for k, v in overrides.items() if v is not None})


def trains_it(kernels: Kernels) -> bool:
    """Whether a prediction on ``kernels`` is of a run plait train makes: its own stack, as it is."""
    return kernels == STACKS[DEFAULT_STACK]


def planning_inputs(args: argparse.Namespace) -> tuple[Workload, Hardware, dict]:
    """The workload, hardware and pinned layout fields that plan and simulate read from their flags."""
    model = {name: getattr(args, name, None) for name in SPEC_FIELDS + ("family",)}
    spec = model_spec(args.model, **model)
    for flag in ("top", "microbatch_size"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")
    base = load_profile(args.hardware_profile) if args.hardware_profile else hardware(args.gpu)
    # plait's own runs take what plait train takes there; other stacks' half precision is the part's
    # (fp16 on a V100, at the same rate)
    kernels = stack_kernels(args)
    plait_runs = trains_it(kernels)
    precision = args.precision or default_precision(on_gpu=base.trains_bf16 if plait_runs else base.host_runs_ahead)
    if plait_runs and base.precision_problem(precision):  # what plait train would refuse
        raise ConfigError(base.precision_problem(precision))
    hw = device_hardware(args, base, precision)
    if not isinstance(args.gpus, int) or args.gpus < 1:
        raise ConfigError(f"--gpus must be a positive integer, got {args.gpus!r}")
    if args.gpus > hw.gpus_per_node and args.gpus % hw.gpus_per_node:
        raise ConfigError(f"--gpus {args.gpus} is not a whole number of nodes of {hw.gpus_per_node} GPUs "
                          f"(--gpus-per-node); pass a multiple of {hw.gpus_per_node}, or at most one node's")

    batch = args.global_batch
    if batch is None:
        batch = args.gpus * max(1, math.ceil(DEFAULT_TOKENS / spec.seq_len / args.gpus))
    if batch < 1:
        raise ConfigError(f"--global-batch must be a positive number of sequences, got {batch}")
    fixed = layout_values(args, {"layout": {}})
    if args.async_tp and (fixed.get("tp") == 1 or fixed.get("sp") is False):
        raise ConfigError("--async-tp fuses tensor-parallel collectives under sequence parallelism, which --tp 1 or "
                          "--no-sp leaves out: drop that flag or --async-tp")
    return Workload(spec, batch, precision, kernels), hw, fixed


def stack_name(args: argparse.Namespace) -> str:
    """The stack the prediction models, as the output names it (with any override said)."""
    changed = [flag for flag in ("attention", "dropout", "unfused", "async_tp") if getattr(args, flag)]
    return args.stack + (f" with --{', --'.join(f.replace('_', '-') for f in changed)}" if changed else "")


def run_plan(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    workload, hw, fixed = planning_inputs(args)
    result = search(workload, hw, args.gpus, fixed, args.microbatch_size, top=args.top, tie_break=args.tie_break)
    runs = trains_it(workload.kernels)
    commands = [train_command(args, p.layout, workload.global_batch, workload.precision) if runs else None
                for p in result.ranked]
    if args.json:
        ranked = [{**p.to_dict(), "stack": stack_name(args), "precision": workload.precision, "train_command": command}
                  for p, command in zip(result.ranked, commands)]
        ranked[0]["reason"] = result.reason
        print(json.dumps(ranked, indent=2))
        return 0
    print(f"{workload.spec.family} model on {args.gpus} × {hw.name}, global batch {workload.global_batch}, "
          f"{workload.precision}, stack {stack_name(args)}: {result.scored + result.bounded + result.oversized} layouts "
          f"searched, {result.oversized} ruled out by a floor on their memory and {result.bounded} by one on their step "
          f"time, {result.fitting} of the rest fit in "
          f"{hw.usable_memory_bytes / 1e9:.0f} of {hw.memory_bytes / 1e9:.0f} GB ({hw.memory_headroom:.0%} kept free)")
    for i, p in enumerate(result.ranked, 1):
        print(f"{i}. {p.layout.describe():60s} mbs={p.micro_batch_size:<3d} {p.step_time_s:9.4g} s/step  "
              f"MFU {p.mfu:6.1%}  bubble {p.bubble_fraction:5.1%}  {p.peak_memory_bytes / 1e9:6.1f} GB")
    print(f"why: {result.reason}")
    if runs:
        print(f"train it: {shlex.join(commands[0])}")
    return 0


def run_simulate(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Predict one layout; exit 1 when it does not fit (after printing its per-rank memory)."""
    check_output_file("--trace", args.trace, "trace")
    check_output_file("--timeline", args.timeline, "png")
    workload, hw, fixed = planning_inputs(args)
    try:
        prediction = best_layout(workload, hw, args.gpus, fixed, args.microbatch_size, args.tie_break)
    except NothingFits:
        # Nothing agreeing with the flags fits: a fully sized layout is still predicted (and shown
        # not to fit); otherwise the search's error says what would.
        sized = all(k in fixed for k in ("dp", "tp", "cp", "pp"))
        if not sized or not ("microbatches" in fixed or args.microbatch_size):
            raise
        if "microbatches" not in fixed:
            fixed["microbatches"] = max(1, workload.global_batch // (fixed["dp"] * args.microbatch_size))
        prediction = evaluate(workload, hw, args.gpus, Layout(**fixed))
    if args.trace:
        trace = simulated_trace(simulated_timeline(workload, hw, args.gpus, prediction.layout),
                                flush_spans(workload, hw, args.gpus, prediction.layout), prediction.layout)
        Path(args.trace).write_text(json.dumps(trace))
    if args.timeline:
        timeline = simulated_timeline(workload, hw, args.gpus, prediction.layout)
        draw_timeline(timeline, Path(args.timeline), f"simulated: {prediction.layout.describe()} on {args.gpus} × {hw.name}")
    if args.json:
        print(json.dumps({**prediction.to_dict(), "stack": stack_name(args), "precision": workload.precision}, indent=2))
    else:
        print(f"{workload.precision}, stack {stack_name(args)}")
        print(format_prediction(prediction, hw))
    return 0 if prediction.fits else 1


def format_prediction(p: Prediction, hw: Hardware) -> str:
    """A short human report of one prediction, echoing the full layout."""
    mem = p.memory_breakdown
    lines = [
        f"layout: {p.layout.describe()}  micro-batch size {p.micro_batch_size}",
        "  " + " ".join(f"{k}={v}" for k, v in p.layout.to_dict().items()),
        f"step time {p.step_time_s:.4g} s   model {p.model_tflops_per_gpu:.1f} TFLOP/s/GPU   "
        f"hardware {p.hardware_tflops_per_gpu:.1f}   MFU {p.mfu:.1%}   bubble {p.bubble_fraction:.1%}",
        "time: " + "  ".join(f"{k[:-2]} {v:.4g} s" for k, v in p.time_breakdown.items()),
        f"peak memory per rank {p.peak_memory_bytes / 1e9:.2f} GB of {hw.memory_bytes / 1e9:.0f} GB "
        f"({hw.memory_headroom:.0%} kept free)"
        f"{'' if p.fits else '  — DOES NOT FIT'}: " + "  ".join(f"{k} {v / 1e9:.2f}" for k, v in mem.items()),
    ]
    if p.host_memory_bytes:
        lines.append(f"host memory per rank for offloaded activations {p.host_memory_bytes / 1e9:.2f} GB")
    return "\n".join(lines)


def run_explain(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    if len(args.run_dirs) > 2:
        raise ConfigError(f"explain takes one run directory, or two to compare, not {len(args.run_dirs)}")
    profile = load_profile(args.hardware_profile) if args.hardware_profile else None
    if len(args.run_dirs) == 2:
        from plait.explain.compare import compare

        comparison = compare(*map(Path, args.run_dirs), args.gpu, profile)
        print(json.dumps(comparison.to_dict(), indent=2) if args.json else comparison.report())
        return 0
    from plait.explain.divergence import postmortem
    from plait.explain.run import explain

    run_dir = Path(args.run_dirs[0])
    if not (run_dir / SUMMARY_FILE).exists() and (findings := postmortem(run_dir)):  # it stopped early: why
        print(json.dumps({"run_dir": str(run_dir), "divergence": findings}, indent=2) if args.json else "\n".join(
            [f"{run_dir}: the run did not finish (no {SUMMARY_FILE})", *(f"divergence: {f}" for f in findings)]))
        return 0
    explanation = explain(run_dir, args.gpu, profile)
    picture = explanation.draw()
    if args.json:
        print(json.dumps({**explanation.to_dict(), "picture": str(picture) if picture else None}, indent=2))
    else:
        print(explanation.report())
        if picture is not None:
            print(f"measured and simulated steps drawn in {picture}")
    return 0


def run_calibrate(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    check_output_file("--out", args.out, "profile")
    cores = os.cpu_count() or 1
    if args.threads is not None and not 1 <= args.threads <= cores:
        raise ConfigError(f"--threads must be a positive number of cores, at most this machine's {cores}, got "
                          f"{args.threads}")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() and args.threads is None else "cpu")
    if device == "cuda":
        if args.threads is not None:
            raise ConfigError("--threads sets the cores of a CPU calibration; drop it, or add --device cpu")
        from plait.calibrate.gpu import calibrate_gpu

        profile = calibrate_gpu(args.out, args.name, args.precision or "bf16")
    else:
        from plait.calibrate.machine import calibrate

        profile = calibrate(args.out, args.name, args.precision or "fp32", args.threads)
    print(profile_json(profile), end="")
    return 0
