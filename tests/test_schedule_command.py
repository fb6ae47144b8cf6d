"""``plait schedule`` prints the generator's action lists, rank by rank, and draws them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from plait.cli import main
from plait.schedules import generate
from tests.cases import assert_refused_in_one_line

CASES = [("gpipe", 2, 3, 1), ("1f1b", 4, 6, 1), ("interleaved-1f1b", 2, 4, 2), ("zb-h1", 3, 3, 1), ("naive", 2, 1, 1)]


def printed_lists(out: str) -> list[list[str]]:
    """The action short forms after each ``rank R (...):`` line, in rank order."""
    rows = [line for line in out.splitlines() if line.startswith("rank ")]
    assert [int(row.split()[1]) for row in rows] == list(range(len(rows)))
    return [row.split("): ", 1)[1].split() for row in rows]


@pytest.mark.parametrize("name, pp, microbatches, virtual", CASES)
def test_printed_lists_are_the_generators(name, pp, microbatches, virtual, tmp_path, capsys):
    picture = tmp_path / "schedule.png"
    argv = ["schedule", name, "--pp", str(pp), "--microbatches", str(microbatches), "--virtual-stages", str(virtual),
            "--out", str(picture)]
    assert main(argv) == 0
    expected = generate(name, pp, microbatches, virtual).actions
    assert printed_lists(capsys.readouterr().out) == [[str(action) for action in rank] for rank in expected]
    assert picture.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("argv, expected", [
    (["interleaved-1f1b", "--pp", "2", "--microbatches", "4"], "needs --virtual-stages 2 or more"),
    (["zb-h1", "--pp", "4", "--microbatches", "2"], "pass --microbatches 4 or more"),
    (["1f1b", "--pp", "0", "--microbatches", "2"], "--pp must be a positive integer"),
    (["2f2b", "--pp", "2", "--microbatches", "2"], "invalid choice"),
])
def test_bad_schedule_is_refused_in_one_line(argv, expected, capsys, tmp_path):
    assert_refused_in_one_line(["schedule", *argv, "--out", str(tmp_path / "s.png")], expected, capsys, tmp_path)
    assert not (tmp_path / "s.png").exists()


def test_a_deep_pipeline_is_drawn_in_seconds_not_minutes(tmp_path):
    """64 ranks of 128 micro-batches each: the bars are drawn a rank and kind at a time (drawn a span
    at a time they took over two minutes). The bound is generous, for a loaded machine."""
    picture = tmp_path / "schedule.png"
    subprocess.run([sys.executable, "-m", "plait", "schedule", "1f1b", "--pp", "64", "--microbatches", "128", "--out",
                    str(picture)], cwd=tmp_path, capture_output=True, check=True, timeout=90)
    assert picture.read_bytes().startswith(b"\x89PNG")
