"""``--wandb PROJECT``: each step's scalars and the summary go to a Weights & Biases run, offline unless
WANDB_MODE says otherwise; without the wandb package the run is refused in one line.

wandb is an optional package the test environment does not install, so the logger is tested at its
call boundary: a small stand-in module, put in ``sys.modules["wandb"]`` for the call only, records
what plait hands to ``wandb.init``, ``run.log`` and ``run.finish`` (the three calls plait makes).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import types

import pytest

from plait.observe.tensorboard import STEP_TAGS, SUMMARY_TAGS
from tests.cases import assert_refused_in_one_line, run_config, train_losses


def stand_in_wandb(calls: list) -> types.ModuleType:
    """A module with wandb's ``init`` whose run records each ``log`` and ``finish`` in ``calls``."""

    class Run:
        def log(self, data: dict, step: int) -> None:
            calls.append(("log", data, step))

        def finish(self) -> None:
            calls.append(("finish",))

    def init(**settings) -> Run:
        calls.append(("init", settings))
        return Run()

    module = types.ModuleType("wandb")
    module.init = init
    return module


def calls_of_a_run(config, run_dir: str) -> list:
    """On a pool rank: train ``config`` with the stand-in wandb and no WANDB_MODE; what it was handed."""
    calls, mode = [], os.environ.pop("WANDB_MODE", None)
    sys.modules["wandb"] = stand_in_wandb(calls)
    try:
        train_losses(config, run_dir)
    finally:
        del sys.modules["wandb"]
        if mode is not None:
            os.environ["WANDB_MODE"] = mode
    return calls


def test_every_step_and_the_summary_reach_an_offline_wandb_run(pool, tmp_path):
    config = run_config("tiny", steps=3, dp=1)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, eval_every=2, wandb="plait-test"))
    run_dir = tmp_path / "run"
    calls = pool.run(calls_of_a_run, 1, config, str(run_dir))[0]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())

    (kind, settings), *logs, finish = calls
    assert kind == "init" and finish == ("finish",)
    assert settings["project"] == "plait-test" and settings["mode"] == "offline" and settings["dir"] == str(run_dir)
    assert settings["config"]["train"]["wandb"] == "plait-test" and settings["config"]["layout"]["dp"] == 1
    expected = [("log", {tag: row[key] for key, tag in STEP_TAGS.items() if key in row}, row["step"]) for row in rows]
    figures = {tag: summary[key] for key, tag in SUMMARY_TAGS.items() if summary[key] is not None}
    assert logs == [*expected, ("log", figures, 2)]
    assert [step for _, data, step in logs if "loss/eval" in data] == [1, 2]


def test_wandb_mode_is_left_to_the_environment_when_set(monkeypatch, tmp_path):
    from plait.observe.wandb_log import WandbLog

    calls = []
    monkeypatch.setitem(sys.modules, "wandb", stand_in_wandb(calls))
    monkeypatch.setenv("WANDB_MODE", "online")
    WandbLog(tmp_path, "project", {}).close(None, 0)
    assert calls[0][1]["mode"] == "online" and calls[1:] == [("finish",)]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_without_the_wandb_package_the_run_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_refused_in_one_line(["train", "--dp", "1", "--wandb", "project", "--dry-run"], "pip install wandb", capsys,
                               tmp_path)
