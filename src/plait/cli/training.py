"""``plait train``: validate, then predict and stop (``--dry-run``), let the planner pick the layout
(``--auto``), or launch one process per rank.

Both ``--dry-run`` and ``--auto`` predict with the planner's ``evaluate`` on plait's own stack, on
the chosen device: ``--gpu`` or ``--hardware-profile``, else the catalog GPU the driver names (a
CPU has no catalog entry: it needs the profile ``plait calibrate`` writes).
"""

from __future__ import annotations

import argparse
import os

from plait.cli.device import OVERRIDE_FLAGS, add_device_overrides, device_hardware, given_overrides, override_flags
from plait.cli.flags import model_flags
from plait.config import RunConfig, config_from_args, config_tables, layout_values, model_and_train, on_device
from plait.errors import ConfigError
from plait.facts.model_state import fullest_rank_model_states
from plait.facts.stack import DEFAULT_STACK, STACKS
from plait.layout import Layout
from plait.hardware import CATALOG, Hardware, catalog_name_of, hardware, load_profile
from plait.plan.search import search
from plait.plan.simulate import Prediction, evaluate
from plait.plan.workload import Workload

# The flags --auto removes from the workers' command line, with how many values each takes: its own,
# and the device's figures, which only a prediction reads.
AUTO_FLAGS = {"--auto": 0, "--ranks": 1, **{"--" + name.replace("_", "-"): 1 for name in OVERRIDE_FLAGS}}


def add_prediction_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("prediction (plan's model of this run)")
    group.add_argument("--dry-run", action="store_true",
                       help="validate everything, print the resolved layout with its predicted per-rank memory "
                            "and step time, and exit without starting workers")
    group.add_argument("--auto", action="store_true",
                       help="train the layout the planner predicts fastest for --ranks ranks (layout flags given "
                            "stay pinned)")
    group.add_argument("--ranks", type=int, help="ranks for --auto (default: this node's GPUs)")
    choice = group.add_mutually_exclusive_group()
    choice.add_argument("--gpu", choices=tuple(CATALOG), help="predict for this catalog GPU (default: the driver's)")
    choice.add_argument("--hardware-profile", metavar="FILE", help="predict with a profile from `plait calibrate`")
    add_device_overrides(group)


def named_hardware(args: argparse.Namespace) -> Hardware | None:
    """The device --hardware-profile or --gpu names, if either does."""
    if args.hardware_profile:
        return load_profile(args.hardware_profile)
    return hardware(args.gpu) if args.gpu else None


def detected_hardware() -> Hardware | None:
    """The catalog GPU the driver names, or None on a CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    entry = catalog_name_of(name)
    if entry is None:
        raise ConfigError(f"this GPU ({name}) is not in the hardware catalog; pass --gpu NAME for the nearest "
                          "catalog part or --hardware-profile FILE from `plait calibrate`")
    return hardware(entry)


def _workload(config: RunConfig) -> Workload:
    return Workload(config.model, config.train.global_batch, config.train.precision, STACKS[DEFAULT_STACK])


def describe_prediction(config: RunConfig, prediction: Prediction | None, hw: Hardware | None) -> str:
    """The resolved run and, given a device, the planner's per-rank memory and step time for it."""
    layout, spec, train = config.layout, config.model, config.train
    lines = [
        f"model   {config.model_name or 'custom'} ({spec.family}, {spec.layers} layers, hidden {spec.hidden}, "
        f"seq-len {spec.seq_len})",
        f"layout  {layout.describe()} on {layout.world_size} rank(s): " + " ".join(
            f"{k}={v}" for k, v in layout.to_dict().items()),
        f"batch   {train.global_batch} sequences per step, micro-batch size "
        f"{train.global_batch // (layout.dp * layout.microbatches)}, {train.precision}",
    ]
    if prediction is None:
        lines.append("predict pass --hardware-profile FILE (from `plait calibrate`) or --gpu NAME for the "
                     "per-rank memory and step time")
        return "\n".join(lines)
    memory = "  ".join(f"{k} {v / 2**20:,.1f}" for k, v in prediction.memory_breakdown.items())
    lines += [
        f"memory  {prediction.peak_memory_bytes / 2**20:,.1f} MiB ({prediction.peak_memory_bytes / 1e9:.1f} GB, as plan "
        f"gives it) on the fullest rank of {hw.memory_bytes / 2**20:,.0f} MiB, {hw.memory_headroom:.0%} kept free"
        f"{'' if prediction.fits else ': DOES NOT FIT'} (MiB: {memory})",
        f"time    {prediction.step_time_s:.4g} s per step predicted on {hw.name}, bubble "
        f"{prediction.bubble_fraction:.1%}, {train.global_batch * spec.seq_len / prediction.step_time_s:,.0f} tokens/s",
    ]
    if prediction.host_memory_bytes:
        lines.append(f"host    {prediction.host_memory_bytes / 2**20:,.1f} MiB of offloaded activations on the fullest rank")
    return "\n".join(lines)


def auto_config(args: argparse.Namespace, device: Hardware | None, on_gpu: bool | None) -> RunConfig:
    """Ask the planner for the fastest layout of --ranks ranks on ``device`` (with the figures the
    flags override); print the choice and why (``on_gpu`` as ``plait.config.on_device`` takes it)."""
    if device is None:
        raise ConfigError("--auto on a CPU needs this machine's profile: run `plait calibrate --out FILE` once, "
                          "then pass --hardware-profile FILE")
    ranks = args.ranks
    if ranks is None:
        import torch

        ranks = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not ranks:
            raise ConfigError("--auto on a CPU needs --ranks N, the number of local processes to train on")
    if ranks < 1:
        raise ConfigError(f"--ranks must be a positive integer, got {ranks}")
    tables = config_tables(args)
    spec, name, train = model_and_train(args, tables)
    train = on_device(train, args, tables, on_gpu)
    pinned = layout_values(args, tables)
    hw = device_hardware(args, device, train.precision)
    workload = Workload(spec, train.global_batch, train.precision, STACKS[DEFAULT_STACK])
    result = search(workload, hw, ranks, pinned, top=1)
    layout = result.ranked[0].layout
    print(f"plait: --auto picked {layout.describe()} for {ranks} rank(s) on {hw.name}: {result.reason}", flush=True)
    return config_from_args(args, layout, on_gpu)


def train_command(args: argparse.Namespace, layout: Layout, global_batch: int, precision: str) -> list[str]:
    """The plait train command line that runs ``layout`` of the model and device plan's flags give, and
    whose --dry-run predicts what plan did."""
    device = ["--hardware-profile", args.hardware_profile] if args.hardware_profile else ["--gpu", args.gpu]
    return ["plait", "train", *model_flags(args), "--global-batch", str(global_batch), "--precision", precision,
            *layout.flags(), *device, *override_flags(args)]


def worker_argv(argv: list[str], layout: Layout) -> list[str]:
    """``argv`` without --auto and --ranks, with the chosen layout pinned (later flags win)."""
    kept, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        flag = arg.split("=", 1)[0]
        if flag in AUTO_FLAGS:
            skip = AUTO_FLAGS[flag] if "=" not in arg else 0
            continue
        kept.append(arg)
    return kept + layout.flags()


def check_rank_memory(config: RunConfig) -> None:
    """Refuse, before any rank allocates, a model whose weights, gradients and optimizer state on its
    fullest rank (``fullest_rank_model_states``, the planner's own fact) exceed what a rank has here: a
    GPU's memory, or its share of this machine's RAM, which the ranks started on it divide."""
    import torch

    if torch.cuda.is_available():
        have, where = torch.cuda.get_device_properties(0).total_memory, f"a {torch.cuda.get_device_name()}"
    else:
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", config.layout.world_size))
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // ranks
        where = f"each of {ranks} ranks sharing this machine's RAM" if ranks > 1 else "this machine's RAM"
    _refuse_beyond(config, have, where)


def check_any_device_holds(config: RunConfig) -> None:
    """A dry run that names no device checks the run, not this machine (its ranks may start on a cluster
    plan picked them for): refuse only a model whose fullest rank no device of the catalog could hold."""
    largest = max(CATALOG.values(), key=lambda gpu: gpu.memory_bytes)
    _refuse_beyond(config, largest.memory_bytes, f"the largest GPU of the catalog ({largest.name})")


def _refuse_beyond(config: RunConfig, have: float, where: str) -> None:
    need = fullest_rank_model_states(config.model, config.layout, config.train.precision)
    if need > have:
        raise ConfigError(f"the model's weights, gradients and optimizer state need {need / 2**30:,.1f} GiB on its "
                          f"fullest rank under {config.layout.describe()}, and {where} has {have / 2**30:,.1f} GiB; "
                          "shard them over more ranks (--zero 3, --tp, --pp) or choose a smaller model")


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    if args.ranks is not None and not args.auto:
        raise ConfigError("--ranks sets how many ranks --auto plans for; add --auto, or give the layout "
                          "(--dp, --tp, --cp, --pp) whose product is the rank count")
    if given_overrides(args) and not (args.dry_run or args.auto):
        flags = override_flags(args)[::2]
        raise ConfigError(f"{' and '.join(flags)} only change{'s' if len(flags) == 1 else ''} the device a prediction "
                          f"is for; add --dry-run or --auto, or drop {'it' if len(flags) == 1 else 'them'}")
    named = named_hardware(args) if (args.dry_run or args.auto) else None  # (a plain run predicts nothing)
    # A dry run checks a command for the device it names, and so takes that device's precision.
    on_gpu = named.trains_bf16 if args.dry_run and named is not None else None
    config = None if args.auto else config_from_args(args, on_gpu=on_gpu)  # checked before torch is imported
    device = (named or detected_hardware()) if (args.dry_run or args.auto) else None
    config = auto_config(args, device, on_gpu) if args.auto else config
    hw = None if device is None else device_hardware(args, device, config.train.precision)
    if hw is not None and hw.precision_problem(config.train.precision):
        raise ConfigError(hw.precision_problem(config.train.precision))
    if args.dry_run:
        from plait.interop.hf import check_init_from
        from plait.train.data import check_data

        check_data(config)
        check_init_from(config)
        if named is None:  # (one for a named device predicts its memory)
            check_any_device_holds(config)
        if config.train.run_dir is not None or config.train.resume:  # (else a new directory of its own)
            from plait.train.run_dir import prepare_run_dir

            prepare_run_dir(config, create=False)
        prediction = None if hw is None else evaluate(_workload(config), hw, config.layout.world_size, config.layout)
        print("plait train --dry-run: the run is valid; nothing was started")
        print(describe_prediction(config, prediction, hw))
        return 0 if prediction is None or prediction.fits else 1
    check_rank_memory(config)
    from plait.train.start import announce

    config = announce(config)  # the start-up line, before the launcher's imports
    from plait.train.launch import launch

    return launch(config, worker_argv(argv, config.layout) if args.auto else argv)
