"""``plait verify``: tp2·pp2 passes against the single process, and a layout with a fault on one
rank fails, in losses and weights, with exit status 1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cases import assert_refused_in_one_line

ROOT = Path(__file__).resolve().parents[1]
# A small model, so that both runs take seconds: 2 blocks (one per pipeline stage), 3 steps.
SMALL = ["--model", "tiny", "--layers", "2", "--seq-len", "32", "--global-batch", "8", "--steps", "3"]


def verify(flags: list[str], run_root: Path, capsys, monkeypatch, faults: bool = False) -> tuple[int, str]:
    """``plait verify`` here (the single-process run in this process, the layout under torchrun): its
    exit status and output. With ``faults``, every rank torchrun starts loads tests/faults/sitecustomize.py."""
    from plait.cli import main

    paths = ([str(ROOT / "tests" / "faults")] if faults else []) + [str(ROOT / "src"), str(ROOT)]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):  # the single-process launch sets them:
        monkeypatch.setenv(name, "")  # recorded, so that they are restored (or removed) after the test
        monkeypatch.delenv(name)
    code = main(["verify", *SMALL, *flags, "--run-dir", str(run_root / "runs")])
    return code, capsys.readouterr().out


def verdicts(stdout: str) -> dict[str, str]:
    """The last word of each of verify's loss and weight lines."""
    lines = [line.split() for line in stdout.splitlines() if line.startswith(("  loss ", "  weights "))]
    return {words[0]: words[-1] for words in lines}


def test_tensor_and_pipeline_layout_passes(tmp_path, capsys, monkeypatch):
    code, out = verify(["--tp", "2", "--pp", "2", "--microbatches", "2"], tmp_path, capsys, monkeypatch)
    assert verdicts(out) == {"loss": "ok", "weights": "ok"}
    assert code == 0 and out.rstrip().endswith("plait verify: PASSED")


def test_a_fault_on_one_rank_fails(tmp_path, capsys, monkeypatch):
    code, out = verify(["--tp", "2"], tmp_path, capsys, monkeypatch, faults=True)
    assert verdicts(out) == {"loss": "FAILED", "weights": "FAILED"}
    assert code == 1 and out.rstrip().endswith("plait verify: FAILED")


@pytest.mark.parametrize("flags, expected", [
    (["--dp", "1"], "a single process already"),
    (["--tp", "2", "--steps", "0"], "steps must be a positive integer"),
    (["--dp", "2", "--run-dir", "{tmp}"], "is not empty"),
])
def test_bad_input_is_refused_in_one_line(flags, expected, capsys, tmp_path):
    (tmp_path / "held").write_text("")
    assert_refused_in_one_line(["verify", *[flag.format(tmp=tmp_path) for flag in flags]], expected, capsys, tmp_path)
