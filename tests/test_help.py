"""The CLI explains itself: every ``plait train`` flag states its default, closed sets list their
choices, and ``plait --version`` answers."""

from __future__ import annotations

import argparse

import pytest

from plait.cli import build_parser, main
from plait.version import plait_version


def command(name: str) -> argparse.ArgumentParser:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


def test_every_train_flag_states_its_default():
    flags = [a for a in command("train")._actions if a.option_strings and a.dest != "help"]
    undocumented = [a.option_strings[0] for a in flags if "default" not in (a.help or "")]
    assert len(flags) > 40 and undocumented == []


@pytest.mark.parametrize("name", ["export", "sample"])
def test_export_and_sample_show_their_defaults(name):
    flags = [a for a in command(name)._actions if a.option_strings and a.dest != "help" and not a.required]
    shown = " ".join(command(name).format_help().split())
    assert all(f"(default: {a.default})" in shown for a in flags)
    assert "None" not in shown  # a required flag shows no default


def test_closed_choices_are_listed_and_version_answers(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = capsys.readouterr().out
    for listed in ("--zero {0,1,2,3}", "--schedule {naive,gpipe,1f1b,interleaved-1f1b,zb-h1}",
                   "--recompute {none,selective,op,full}", "--precision {fp32,bf16}"):
        assert listed in shown
    assert "dp2·tp2·pp2" in shown  # the default 3-D layout is named
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"plait {plait_version()}\n"
