"""``plait train --help`` shows every default and every closed choice.

The model and layout flags are shared with ``plan`` and ``simulate``, where a flag left out is
searched rather than defaulted, so train's own defaults are written into train's copies of them
here, from the dataclasses that hold them (``Layout``, ``TrainSpec``, the presets).
"""

from __future__ import annotations

import argparse

from plait.config import DEFAULT_LAYOUT, DEFAULT_MODEL
from plait.layout import ZERO_STAGES, Layout
from plait.models.spec import PRESETS
from plait.schedules.registry import interleaving_schedules

PRESET = "(default: the preset's)"


def _shown(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _layout_default(name: str) -> str:
    """A layout field's default: the default layout's when no layout flag is given, else Layout's."""
    default, ours = (_shown(getattr(layout, name)) for layout in (Layout(), DEFAULT_LAYOUT))
    if ours == default:
        return f"(default {default})"
    return (f"(default {ours} in the default layout {DEFAULT_LAYOUT.describe()}, used when no layout flag is given; "
            f"{default} otherwise)")


def train_help() -> dict[str, str]:
    """The help of each train flag that does not already state its default, by option string."""
    return {
        "--config": "TOML file with [model], [layout] and [train] tables; flags override it (default: none)",
        "--model": f"preset: {', '.join(PRESETS)} (default {DEFAULT_MODEL}, unless --layers --hidden --heads give a shape)",
        "--family": "the block's ingredients when no preset is named (default gpt2)",
        "--layers": f"transformer blocks {PRESET}", "--hidden": f"hidden size {PRESET}",
        "--heads": f"attention heads {PRESET}",
        "--kv-heads": "key/value heads, fewer for grouped-query attention (default: the preset's; without one, heads)",
        "--ffn-hidden": "MLP hidden size (default: the preset's; without one 4·hidden for gpt2, 8/3·hidden rounded up "
                        "to 256 for llama)",
        "--vocab": f"vocabulary size {PRESET}", "--seq-len": f"tokens per sequence {PRESET}",
        "--parallel-block": "attention and MLP side by side on one norm's output, x + attention(norm(x)) + "
                            "mlp(norm(x)), as GPT-J, PaLM and Falcon (default: the preset's; without one, off)",
        "--tie-embeddings": "the output projection reuses the token embedding (default: the preset's; without one, "
                            "on for gpt2, off for llama)",
        "--dp": f"data-parallel ranks {_layout_default('dp')}",
        "--tp": f"tensor-parallel ranks {_layout_default('tp')}",
        "--cp": f"context-parallel ranks {_layout_default('cp')}",
        "--pp": f"pipeline stages {_layout_default('pp')}",
        "--dp-shard": "with --dp-replicate R: the ranks of each group, so dp = R·S (default dp/R)",
        "--zero": "ZeRO stage over the dp and cp ranks: 0 replicated, 1 sharded optimizer state, 2 and gradients, 3 and "
                  f"parameters (FSDP2) {_layout_default('zero')}",
        "--sp": f"sequence parallel over the tp ranks (needs --tp > 1) {_layout_default('sp')}",
        "--schedule": f"pipeline schedule {_layout_default('schedule')}",
        "--virtual-stages": f"pipeline chunks per rank, for {interleaving_schedules()} "
                            f"{_layout_default('virtual_stages')}",
        "--microbatches": f"micro-batches per data-parallel rank and step {_layout_default('microbatches')}",
        "--recompute": "recompute in backward: the attention core, each operation but every second matmul (op) "
                       f"or each whole block {_layout_default('recompute')}",
        "--offload-activations": "keep what each block saves for backward in host memory until its backward, with "
                                 f"--recompute none {_layout_default('offload_activations')}",
        "--cp-algorithm": "context parallelism: all-to-all exchanges heads (cp must divide heads/tp), ring passes K/V "
                          "blocks round the cp ranks, all-gather gathers every rank's K/V at once (both: seq-len a "
                          f"multiple of 2·cp) {_layout_default('cp_algorithm')}",
        "--precision": "bf16 autocast over fp32 master weights, or fp32 (default: bf16 on GPUs that compute in it, fp32 on CPUs and V100s)",
        "--resume": "continue from the run dir's last checkpoint (default off)",
        "--resume-changed": "with --resume: continue on purpose under another model, seed, data or global batch "
                            "(default off)",
        "--restart-from-scratch": "with --resume: when no checkpoint is intact, set the damaged ones aside and train "
                                  "again from step 0 (default off)",
        "--deterministic": "deterministic kernels only (default off)",
        "--dry-run": "validate everything, print the resolved layout with its predicted per-rank memory and step "
                     "time, and exit without starting workers (default off)",
        "--auto": "train the layout the planner predicts fastest for --ranks ranks (layout flags given stay pinned) "
                  "(default off)",
        "--hardware-profile": "predict with a profile from `plait calibrate` (default: none, the --gpu catalog entry)",
    }


def document_train_defaults(parser: argparse.ArgumentParser) -> None:
    """Write train's defaults and closed choices into the help of ``parser``'s own flags."""
    helps = train_help()
    for action in parser._actions:  # argparse keeps no public list of a parser's flags
        for option in action.option_strings:
            if option in helps:
                action.help = helps[option]
            if option == "--zero":
                action.metavar = "{" + ",".join(map(str, ZERO_STAGES)) + "}"
