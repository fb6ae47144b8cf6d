"""Checkpoints are data: a crafted .metadata runs nothing, a damaged checkpoint is set aside for the
one before it, and another run's checkpoint is refused; all before any worker starts."""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys

import pytest

from plait.train.checkpoint import RUN_FILE, crc32_of


class Payload:
    """What an attacker puts in .metadata: unpickling it would create ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _train(run_dir, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plait", "train", "--dp", "1", "--steps", "2", "--global-batch", "4",
                           "--checkpoint-every", "1", "--run-dir", str(run_dir), *extra],
                          capture_output=True, text=True, timeout=300)


def _craft(checkpoint, marker) -> None:
    """Replace .metadata with a payload and make the record agree, as a careful attacker would."""
    (checkpoint / ".metadata").write_bytes(pickle.dumps(Payload(str(marker))))
    record = json.loads((checkpoint / RUN_FILE).read_text())
    record["files"] = {name: crc32_of(checkpoint / name) for name in record["files"]}
    (checkpoint / RUN_FILE).write_text(json.dumps(record))


@pytest.fixture
def trained(tmp_path):
    run_dir = tmp_path / "run"
    assert _train(run_dir).returncode == 0
    return run_dir, sorted((run_dir / "checkpoints").glob("step_*"))


def test_a_pickle_payload_in_metadata_runs_nothing(trained, tmp_path):
    run_dir, (_, newest) = trained
    marker = tmp_path / "pwned"
    _craft(newest, marker)
    refused = _train(run_dir, "--resume", "--steps", "3")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "is not checkpoint metadata" in refused.stderr, refused.stderr
    assert not marker.exists()
    assert newest.is_dir()  # refused, not set aside: whole files that are not metadata are no accident
    advised = f"rename it to {newest.name}.damaged to resume from the one before"
    assert advised in refused.stderr
    newest.rename(newest.with_name(f"{newest.name}.damaged"))  # the way out the message offers works
    resumed = _train(run_dir, "--resume", "--steps", "3")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "steps 1–2" in resumed.stdout and not marker.exists()


def test_a_torchrun_plait_did_not_start_checks_the_checkpoint_too(tmp_path):
    """The multi-node route: workers started by torchrun itself refuse another run's checkpoint."""
    run_dir = tmp_path / "run"
    assert _train(run_dir).returncode == 0
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "plait",
         "train", "--dp", "2", "--steps", "3", "--global-batch", "4", "--seed", "7", "--resume",
         "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode != 0
    assert "belongs to a run with another seed" in completed.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_0000001", "step_0000002"]


def test_a_truncated_shard_falls_back_to_the_checkpoint_before(trained):
    run_dir, (older, newest) = trained
    shard = next(newest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    resumed = _train(run_dir, "--resume", "--steps", "3")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{newest.name} is damaged ({shard.name} does not match its checksum)" in resumed.stdout
    assert f"resuming from {older.name}" in resumed.stdout
    assert "steps 1–2" in resumed.stdout  # resumed after step 1, from the older checkpoint
    assert (run_dir / "checkpoints" / f"{newest.name}.damaged").is_dir()  # set aside, not deleted


def test_another_runs_checkpoint_is_refused_unless_asked(trained):
    run_dir, _ = trained
    refused = _train(run_dir, "--resume", "--steps", "3", "--seed", "7")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "another seed" in refused.stderr and "--resume-changed" in refused.stderr
    accepted = _train(run_dir, "--resume", "--steps", "3", "--seed", "7", "--resume-changed")
    assert accepted.returncode == 0, accepted.stderr[-2000:]


def test_a_finished_run_asks_for_more_steps(trained):
    run_dir, _ = trained
    refused = _train(run_dir, "--resume")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "has already taken 2 steps; pass a larger --steps than 2" in refused.stderr


def _no_file_over_300_kib() -> None:
    """What a full disk does to a writer, for this process and its children: a write past it fails."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (300 * 1024, 300 * 1024))


@pytest.mark.parametrize("ranks", ["1", "2"])
def test_a_checkpoint_that_cannot_be_written_stops_in_one_line(tmp_path, ranks):
    """In this process (one rank), or under torchrun, whose report goes to the run folder: plait's line is
    the last on the terminal."""
    run_dir = tmp_path / "run"
    completed = subprocess.run([sys.executable, "-m", "plait", "train", "--dp", ranks, "--steps", "3", "--global-batch",
                                "4", "--checkpoint-every", "1", "--run-dir", str(run_dir)],
                               capture_output=True, text=True, timeout=300, preexec_fn=_no_file_over_300_kib)
    assert completed.returncode == 1
    assert "Traceback" not in completed.stderr and "Root Cause" not in completed.stderr, completed.stderr[-2000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("plait:")]
    assert len(errors) == 1 and "the checkpoint of step 1 could not be written" in errors[0], completed.stderr[-2000:]
    assert completed.stderr.splitlines()[-1] == errors[0]
    assert "then pass --resume" in errors[0]
    # one rank writes a plain file, which the OS refuses; torch.distributed.checkpoint's writer says it its own way
    assert "File too large" in errors[0] if ranks == "1" else "(rank 0: " in errors[0], errors[0]
    assert not list((run_dir / "checkpoints").iterdir())  # the unfinished folder is gone, nothing else was there
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0]


def test_turning_held_out_evaluation_on_or_off_is_another_run(tmp_path):
    """--eval-every keeps the data's tail from training, so a checkpoint of a run without it is
    another run's for a run with it (and the other way round); the same setting is the same run."""
    from dataclasses import replace

    from plait.train.checkpoint_record import changes, run_identity
    from tests.cases import run_config

    plain = run_config("tiny")
    evaluated = replace(plain, train=replace(plain.train, eval_every=5))
    for written, resumed, expected in ((plain, evaluated, ["held_out"]), (evaluated, plain, ["held_out"]),
                                       (evaluated, evaluated, [])):
        (tmp_path / RUN_FILE).write_text(json.dumps(run_identity(written)))
        assert changes(tmp_path, resumed) == expected


def test_what_stands_where_a_checkpoint_goes_is_set_aside_and_a_checkpoints_file_is_refused(tmp_path):
    """A folder without its step file at the step a run saves (or a file of that name) is not a checkpoint:
    resume passes over it, the save moves it aside as damaged and completes; a file where the checkpoints
    folder goes is refused before the run starts. Only folders named for their step are checkpoints."""
    run_dir = tmp_path / "run"
    stray = run_dir / "checkpoints" / "step_0000002"
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("mine")
    (run_dir / "checkpoints" / "step_0000001x").mkdir()
    (run_dir / "checkpoints" / "step_0000001x" / "step.json").write_text('{"step": 1}')
    resumed = _train(run_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "holds no complete checkpoint; the run starts from step 0" in resumed.stdout
    assert "step_0000002 stood where this checkpoint goes" in resumed.stdout
    assert (run_dir / "checkpoints" / "step_0000002.damaged" / "notes.txt").read_text() == "mine"
    assert json.loads((run_dir / "checkpoints" / "step_0000002" / "step.json").read_text())["step"] == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / "checkpoints").write_text("not a folder")
    refused = _train(other)
    assert refused.returncode == 2 and "is a file where the run keeps its checkpoints" in refused.stderr


@pytest.mark.parametrize("damage", [b"not json\n", b"\xff\xfe\n"], ids=["a line that is not JSON", "bytes not text"])
def test_a_damaged_metrics_log_is_refused_before_a_resume_starts(trained, damage):
    run_dir, _ = trained
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(damage + metrics.read_bytes())
    saved = metrics.read_bytes()
    refused = _train(run_dir, "--resume", "--steps", "3")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-2000:]
    assert "metrics.jsonl is damaged" in refused.stderr and "move it away" in refused.stderr
    assert metrics.read_bytes() == saved
