"""docs/config.md, generated: every key of a ``plait train --config FILE`` TOML file, table by table,
from the dataclasses that hold them (``ModelSpec``, ``Layout``, ``TrainSpec``) and the help of the
flag that sets each. ``python -m plait.cli.config_reference > docs/config.md`` rewrites it; a test
holds the file equal to what this prints.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from plait.config import INVOCATION_ONLY, TrainSpec
from plait.layout import Layout
from plait.models.spec import ModelSpec

HEADER = """# Configuration reference

Generated from plait's dataclasses by `python -m plait.cli.config_reference`; do not edit by hand.

`plait train --config FILE` reads a TOML file of three tables, `[model]`, `[layout]` and `[train]`;
a flag given beside it overrides the file's value, and every run writes its own resolved
`config.toml`, which repeats it. A key left out takes the default below (the model's, the named
preset's).
"""

# Keys no flag sets: what each means.
FILE_ONLY = {
    "tie_embeddings": "the output head shares the token embedding's weight (GPT-2 presets: true; Llama 8B and up: false)",
    "rope_theta": "the rotary embedding's base (Llama family)",
    "norm_eps": "the layer or RMS norm's epsilon",
    "weight_decay": "AdamW's weight decay on matrices (vectors have none)",
}


def _train_actions() -> dict[str, argparse.Action]:
    """The train command's flags by destination (the dataclass field each sets)."""
    from plait.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return {action.dest: action for action in commands.choices["train"]._actions if action.option_strings}  # noqa: SLF001


def _default(field) -> str:
    if field.default is not MISSING:
        return "none" if field.default is None else f"`{field.default!r}`".replace("'", '"')
    return "the preset's"


def _table(name: str, keys: list[tuple[str, str, str]], actions: dict[str, argparse.Action]) -> list[str]:
    lines = [f"\n## `[{name}]`\n", "| key | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for key, dest, default in keys:
        action = actions.get(dest)
        flag = f"`{action.option_strings[0]}`" if action else "(file only)"
        meaning = (action.help or "") if action else FILE_ONLY[key]
        meaning = meaning.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{key}` | {flag} | {default} | {meaning} |")
    return lines


def config_reference() -> str:
    """The reference as Markdown."""
    actions = _train_actions()
    model = [("name", "model", "`\"tiny\"`")] + [(f.name, f.name, _default(f)) for f in fields(ModelSpec)]
    layout = [(f.name, f.name, _default(f)) for f in fields(Layout)]
    train = [(f.name, f.name, _default(f)) for f in fields(TrainSpec) if f.name not in INVOCATION_ONLY]
    lines = [HEADER.rstrip("\n")]
    for name, keys in (("model", model), ("layout", layout), ("train", train)):
        lines += _table(name, keys, actions)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(config_reference(), end="")
