"""Run configuration: TOML file plus flags → (ModelSpec, Layout, TrainSpec), validated up front.

A config file has up to three tables, each optional:

    [model]   name = "tiny-llama", and any ModelSpec field (layers, hidden, heads, ...)
    [layout]  dp, tp, cp, pp, sp, zero, schedule, virtual_stages, microbatches, recompute,
              recompute_layers, offload_activations, cp_algorithm and grad_compression
    [train]   steps, global_batch, seed, precision, lr, ... (the TrainSpec fields)

Flags override the file; the file overrides the defaults.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from plait.errors import ConfigError
from plait.facts.lr_schedule import LR_SCHEDULES
from plait.facts.validity import check_run
from plait.interop.hf_config import init_from_model
from plait.layout import PRECISIONS, Layout, default_precision
from plait.models.spec import SPEC_FIELDS, ModelSpec, model_spec
from plait.paths import require_input_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# The parsed command line (plait.cli builds it with argparse): read here by attribute, flag by flag.
Flags = Any

DEFAULT_MODEL = "tiny"
DEFAULT_LAYOUT = Layout(dp=2, tp=2, pp=2, microbatches=2)  # 3-D: every rank in three groups


def step_range(text: str) -> range:
    """The steps "A:B" names, both included; none for ""."""
    if not text:
        return range(0)
    first, _, last = text.partition(":")
    if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
        raise ConfigError(f"profile-steps must be two step numbers A:B with A <= B (e.g. 5:7), got {text!r}")
    return range(int(first), int(last) + 1)


@dataclass(frozen=True)
class TrainSpec:
    """Everything about a training run that is neither the model nor the layout."""

    steps: int = 200
    global_batch: int = 32
    seed: int = 0
    precision: str = "fp32"
    lr: float = 3e-3
    lr_schedule: str = "cosine"
    decay_fraction: float = 0.2  # wsd: the share of the steps after warm-up that decay to the floor
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    skip_spikes: float = 0.0  # skip an update whose gradient norm is K times the running median; 0: off
    z_loss: float = 0.0  # PaLM's z-loss coefficient on the logits' squared log-sum-exp; 0: off
    deterministic: bool = False
    data: str | None = None
    tokenizer: str | None = None  # the tokenizer.json --data was made with; the run keeps a copy for plait sample
    init_from: str | None = None  # a Hugging Face folder: its config.json is the model, its weights the start
    run_dir: str | None = None
    checkpoint_every: int = 0
    final_checkpoint: bool = True  # a checkpoint after the last step, unless --checkpoint-every wrote it already
    resume: bool = False
    resume_changed: bool = False
    restart_from_scratch: bool = False  # with --resume: every checkpoint damaged, set aside and start at step 0
    async_checkpoint: bool = False  # checkpoints written by a background thread while training goes on
    keep_checkpoints: int = 0  # the newest K complete checkpoints are kept; 0 keeps every one
    max_restarts: int = 0  # torchrun's elastic agent restarts the group this often after a rank is lost
    log_every: int = 10
    eval_every: int = 0
    eval_data: str | None = None  # a token file --eval-every scores instead of the data's held-out tail
    tensorboard: bool = False
    wandb: str | None = None  # a Weights & Biases project the scalars also go to (offline unless WANDB_MODE says)
    trace_every: int = 20  # a traced step costs 10-30% more on 2 cores (benchmarks/tracing_overhead.py)
    profile_steps: str = ""  # "A:B": torch.profiler traces of steps A to B on every rank
    stall_timeout: float = 120.0  # seconds without progress before the watchdog names the stalled rank; 0: off

    @property
    def profiled_steps(self) -> range:
        return step_range(self.profile_steps)

    def validate(self) -> None:
        for name in ("steps", "global_batch", "log_every", "trace_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "checkpoint_every", "eval_every", "seed", "max_restarts", "keep_checkpoints"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name.replace('_', '-')} must be a non-negative integer, got {value!r}")
        if self.run_dir is not None and not self.run_dir.strip():
            raise ConfigError("--run-dir is empty; name the folder the run writes to, or leave --run-dir out for a "
                              "new one under runs/")
        for name in ("resume_changed", "restart_from_scratch"):
            if getattr(self, name) and not self.resume:
                raise ConfigError(f"--{name.replace('_', '-')} only changes how --resume continues a run; add "
                                  "--resume, or drop it")
        profiled = step_range(self.profile_steps)
        if profiled and profiled[-1] >= self.steps:  # steps count from 0
            raise ConfigError(f"profile-steps {self.profile_steps} reaches past the run's last step, {self.steps - 1}; "
                              f"choose steps from 0 to {self.steps - 1}, or raise --steps")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} is unknown; use one of {', '.join(PRECISIONS)}")
        for name in ("lr", "decay_fraction", "min_lr_ratio", "grad_clip", "weight_decay", "skip_spikes",
                     "z_loss"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name.replace('_', '-')} must be a finite number, got {value!r}")
        value = self.stall_timeout
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value == 0 or 1 <= value < math.inf):
            raise ConfigError(f"stall-timeout must be 0 (no watchdog) or a number of seconds of at least 1, got {value!r}")
        if self.lr <= 0:
            raise ConfigError(f"learning rate must be a positive number, got {self.lr!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min-lr-ratio must lie in [0, 1], got {self.min_lr_ratio!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"lr-schedule {self.lr_schedule!r} is unknown; use one of {', '.join(LR_SCHEDULES)}")
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"decay-fraction must lie in (0, 1], got {self.decay_fraction!r}")
        if self.grad_clip < 0 or self.weight_decay < 0 or self.z_loss < 0:
            raise ConfigError("grad-clip, weight-decay and z-loss must not be negative; use 0 to turn them off")
        if self.skip_spikes != 0 and self.skip_spikes <= 1:
            raise ConfigError(f"skip-spikes is how many times the running median a skipped update's gradient norm "
                              f"is, so it must be above 1 (5 is usual), or 0 for off; got {self.skip_spikes!r}")
        if self.eval_data and not self.eval_every:
            raise ConfigError("--eval-data is scored every --eval-every K steps; pass --eval-every K, or drop --eval-data")
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("--tensorboard writes through the tensorboard package, which is not installed; "
                              "pip install tensorboard, or drop --tensorboard")
        if self.wandb is not None and importlib.util.find_spec("wandb") is None:
            raise ConfigError("--wandb logs through the wandb package, which is not installed; pip install wandb, "
                              "or drop --wandb")


@dataclass(frozen=True)
class RunConfig:
    model: ModelSpec
    layout: Layout
    train: TrainSpec = field(default_factory=TrainSpec)
    model_name: str | None = None


def validate_run(config: RunConfig) -> None:
    """Every check that needs no worker: the training settings, then the one validation of the run."""
    config.train.validate()
    check_run(config.model, config.layout, global_batch=config.train.global_batch)


def _section(values: dict, key: str, allowed: tuple[str, ...], path: str) -> dict:
    table = values.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{key}] must be a table")
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} in [{key}]; known keys: {', '.join(allowed)}")
    return dict(table)


def read_config_file(path: str) -> dict[str, dict]:
    """Parse a TOML config into its three tables, rejecting anything unknown."""
    file = Path(path)
    require_input_file("config file", path, "pass --config with a TOML file")
    try:
        values = tomllib.loads(file.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    unknown = sorted(set(values) - {"model", "layout", "train"})
    if unknown:
        raise ConfigError(f"{path}: unknown table [{unknown[0]}]; use [model], [layout] and [train]")
    return {
        "model": _section(values, "model", ("name",) + SPEC_FIELDS, path),
        "layout": _section(values, "layout", tuple(f.name for f in fields(Layout)), path),
        "train": _section(values, "train", tuple(f.name for f in fields(TrainSpec)), path),
    }


def _set_flags(args: Flags, names: tuple[str, ...]) -> dict:
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


# The type of each field whose default is None (the others take their default's type).
OPTIONAL_TYPES = {"data": str, "eval_data": str, "tokenizer": str, "init_from": str, "run_dir": str,
                  "wandb": str, "stage_layers": tuple, "recompute_layers": int}


def _typed(cls, values: dict):
    """Build ``cls`` from ``values``, each of the type of the field's default (ints pass as floats)."""
    if isinstance(values.get("stage_layers"), list):  # TOML has arrays, not tuples
        values = {**values, "stage_layers": tuple(values["stage_layers"])}
    for item in fields(cls):
        if item.name not in values or (item.default is None and values[item.name] is None):
            continue
        value = values[item.name]
        expected = OPTIONAL_TYPES[item.name] if item.default is None else type(item.default)
        accepted = (int, float) if expected is float else expected
        if not isinstance(value, accepted) or (isinstance(value, bool) and expected is not bool):
            raise ConfigError(
                f"{item.name.replace('_', '-')} must be of type {expected.__name__}, got {value!r}"
            )
    return cls(**values)


def layout_values(args: Flags, tables: dict[str, dict]) -> dict:
    """The layout settings the file and the flags give (flags win); what ``--auto`` leaves pinned.
    ``--dp-shard S`` stands for ``--dp R·S`` with the run's ``--dp-replicate R``."""
    values = {**tables["layout"], **_set_flags(args, tuple(f.name for f in fields(Layout)))}
    shard = getattr(args, "dp_shard", None)
    if shard is not None:
        replicate = values.get("dp_replicate", 1)
        if not isinstance(shard, int) or shard < 1 or not isinstance(replicate, int) or replicate < 1:
            raise ConfigError(f"--dp-shard and --dp-replicate must be positive integers, got {shard!r} and {replicate!r}")
        if "dp" in values and values["dp"] != replicate * shard:
            raise ConfigError(f"--dp {values['dp']} disagrees with --dp-replicate {replicate} × --dp-shard {shard}; "
                              "pass either --dp or --dp-shard")
        values["dp"] = replicate * shard
    return values


def config_tables(args: Flags) -> dict[str, dict]:
    return read_config_file(args.config) if args.config else {"model": {}, "layout": {}, "train": {}}


def _stated_model(name: str | None, values: dict) -> dict:
    """The model fields a run asks for: a preset's every field with the file's and the flags' changes, or
    those alone."""
    return asdict(model_spec(name, **values)) if name is not None else values


def model_and_train(args: Flags, tables: dict[str, dict]) -> tuple[ModelSpec, str | None, TrainSpec]:
    """The model (preset name and spec) and the training settings: defaults ← file ← flags, each
    validated in itself; with --init-from the model is the folder's, which the file and flags may
    shorten the sequence of but not contradict. Without --precision anywhere, the precision is left
    for ``on_device``."""
    train = _typed(TrainSpec, {**tables["train"], **_set_flags(args, tuple(f.name for f in fields(TrainSpec)))})
    model_values = {**tables["model"], **_set_flags(args, ("model", "family") + SPEC_FIELDS)}
    name = model_values.pop("name", None)
    name = model_values.pop("model", name)
    if train.init_from:
        spec = init_from_model(Path(train.init_from), _stated_model(name, model_values))
    else:
        if name is None and not {"layers", "hidden", "heads"} <= set(model_values):
            name = DEFAULT_MODEL
        spec = model_spec(name, **model_values)
    spec.validate()
    train.validate()
    return spec, name, train


def on_device(train: TrainSpec, args: Flags, tables: dict[str, dict],
              on_gpu: bool | None = None) -> TrainSpec:
    """``train`` with the precision the run's device takes (``default_precision``) unless one was given:
    a GPU's if ``on_gpu`` (a dry run checking a command for the device it names), else this host's.

    Called once everything else is valid: finding the host's device imports torch, which takes seconds.
    """
    if "precision" in tables["train"] or getattr(args, "precision", None) is not None:
        return train
    if on_gpu is None:
        import torch  # only `plait train` resolves its device; the planner never reaches here

        on_gpu = torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    return replace(train, precision=default_precision(on_gpu=on_gpu))


def config_from_args(args: Flags, layout: Layout | None = None, on_gpu: bool | None = None) -> RunConfig:
    """Defaults ← TOML file ← flags, validated; ``layout`` (from ``--auto``) replaces the layout settings;
    ``on_gpu`` as ``on_device`` takes it."""
    tables = config_tables(args)
    spec, name, train = model_and_train(args, tables)
    if layout is None:
        values = layout_values(args, tables)
        # Any layout setting replaces the default layout as a whole; unset sizes are then 1.
        layout = _typed(Layout, values) if values else DEFAULT_LAYOUT
    config = RunConfig(spec, layout, train, model_name=name)
    try:
        validate_run(config)
    except ConfigError as error:
        if layout is not DEFAULT_LAYOUT:
            raise
        raise ConfigError(f"{error} (with the default layout {layout.describe()}; "
                          "pass --dp, --tp, --pp or --microbatches to choose another)") from error
    return replace(config, train=on_device(train, args, tables, on_gpu))


# Settings of one invocation rather than of the run: left out of the config.toml a run writes.
INVOCATION_ONLY = ("run_dir", "resume", "resume_changed", "restart_from_scratch")


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string takes JSON's escapes
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def resolved_tables(config: RunConfig) -> dict[str, dict]:
    """The fully resolved run as the config file's three tables, its paths absolute."""
    paths = {name: str(Path(value).resolve()) if (value := getattr(config.train, name)) else None
             for name in ("data", "eval_data", "tokenizer", "init_from")}
    train = {**asdict(config.train), **paths}
    return {
        "model": {"name": config.model_name, **asdict(config.model)},
        "layout": config.layout.to_dict(),
        "train": {k: v for k, v in train.items() if k not in INVOCATION_ONLY},
    }


def config_toml(config: RunConfig) -> str:
    """The fully resolved run as a config file: ``plait train --config FILE`` repeats it step for step."""
    lines = ["# Written by plait train: the resolved configuration of this run (plait train --config FILE repeats it)."]
    for table, values in resolved_tables(config).items():
        lines.append(f"\n[{table}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items() if value is not None]
    return "\n".join(lines) + "\n"
