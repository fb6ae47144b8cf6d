"""docs/config.md is what plait.cli.config_reference generates from the dataclasses today: a key or
a flag added, renamed or given another default without regenerating it fails here."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from plait.cli.config_reference import config_reference
from plait.config import INVOCATION_ONLY, TrainSpec
from plait.layout import Layout
from plait.models.spec import ModelSpec

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "config.md"


def test_the_config_reference_is_current():
    assert REFERENCE.read_text() == config_reference(), (
        "docs/config.md is out of date: run python -m plait.cli.config_reference > docs/config.md")


def test_every_key_a_config_file_takes_is_documented():
    text = REFERENCE.read_text()
    keys = [f.name for cls in (ModelSpec, Layout) for f in fields(cls)]
    keys += [f.name for f in fields(TrainSpec) if f.name not in INVOCATION_ONLY]
    assert [key for key in keys if f"| `{key}` |" not in text] == []
