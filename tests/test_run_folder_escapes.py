"""A run folder is plait's alone: no file name read from a checkpoint's .metadata or run.json leads out
of the checkpoint, no symbolic link in a run folder is written, moved or deleted through, and a run
whose every checkpoint is damaged stops rather than silently training again from step 0. Each is
refused in one line before anything outside the run folder is read or written."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
import subprocess
import sys

import pytest

from plait.cli import main
from plait.train.checkpoint import RUN_FILE, checkpoint_metadata, complete_checkpoints, crc32_of

TRAIN = ["train", "--dp", "1", "--global-batch", "4", "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory):
    """A run of two steps with a checkpoint after each, trained once for the module."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    completed = subprocess.run([sys.executable, "-m", "plait", *TRAIN, "--steps", "2", "--run-dir", str(run_dir)],
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return run_dir


@pytest.fixture
def run_dir(trained_once, tmp_path):
    """This test's own copy of the trained run, with a folder ``outside`` beside it."""
    (tmp_path / "outside").mkdir()
    return shutil.copytree(trained_once, tmp_path / "run", symlinks=True)


def _refused(argv: list[str], expected: str, capsys) -> str:
    """``plait argv`` exits with status 2 and one line containing ``expected``; that line."""
    code = main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("plait: error:") and expected in lines[0], lines[0]
    return lines[0]


def _resume(run_dir, *extra: str) -> list[str]:
    return [*TRAIN, "--steps", "3", "--resume", "--run-dir", str(run_dir), *extra]


def _untouched(path) -> tuple[bytes, int]:
    """What shows a file was not written: its content and modification time."""
    return path.read_bytes(), path.stat().st_mtime_ns


def _agree(checkpoint) -> None:
    """Make run.json's CRC-32s agree with the files, as a careful attacker would."""
    record = json.loads((checkpoint / RUN_FILE).read_text())
    record["files"] = {name: crc32_of(checkpoint / name) for name in record["files"]}
    (checkpoint / RUN_FILE).write_text(json.dumps(record))


def _point_shards_at(checkpoint, name_of) -> None:
    """Rewrite .metadata so that every shard is read from ``name_of(relative_path)``."""
    metadata = checkpoint_metadata(checkpoint)
    metadata.storage_data = {index: dataclasses.replace(stored, relative_path=name_of(stored.relative_path))
                             for index, stored in metadata.storage_data.items()}
    metadata.storage_meta = None
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))
    _agree(checkpoint)


@pytest.mark.parametrize("absolute", [False, True], ids=["../ path", "absolute path"])
def test_a_shard_path_outside_the_checkpoint_is_refused_by_resume_and_export(run_dir, absolute, capsys):
    newest = complete_checkpoints(run_dir)[-1]
    outside = run_dir.parent / "outside"
    for shard in newest.glob("*.distcp"):  # a copy that would be read, and accepted, if the path were followed
        shutil.copy(shard, outside / shard.name)
    _point_shards_at(newest, lambda name: str(outside / name) if absolute else f"../../../outside/{name}")
    _refused(_resume(run_dir), "names", capsys)
    line = _refused(["export", str(run_dir), "--to", str(run_dir.parent / "exported")], "a file outside the checkpoint",
                    capsys)
    assert f"rename it to {newest.name}.damaged" in line
    assert newest.is_dir() and not (run_dir.parent / "exported").exists()


def test_a_file_run_json_names_outside_the_checkpoint_is_refused(run_dir, capsys):
    newest = complete_checkpoints(run_dir)[-1]
    secret = run_dir.parent / "outside" / "secret"
    secret.write_text("not plait's")
    record = json.loads((newest / RUN_FILE).read_text())
    record["files"]["../../../outside/secret"] = crc32_of(secret)  # the right checksum: it would pass if read
    (newest / RUN_FILE).write_text(json.dumps(record))
    _refused(_resume(run_dir), f"{RUN_FILE} names ../../../outside/secret, a file outside the checkpoint", capsys)
    _refused(["export", str(run_dir), "--to", str(run_dir.parent / "exported")], "a file outside", capsys)
    assert newest.is_dir()


@pytest.mark.parametrize("name", ["config.toml", "loss.png", "metrics.jsonl"])
def test_a_run_file_that_is_a_link_is_refused_and_its_target_kept(run_dir, name, capsys):
    target = run_dir.parent / "outside" / name
    target.write_text("someone else's")
    before = _untouched(target)
    (run_dir / name).unlink()
    (run_dir / name).symlink_to(target)
    _refused(_resume(run_dir), f"{run_dir / name} is a symbolic link", capsys)
    assert _untouched(target) == before


def test_a_partial_checkpoint_that_is_a_link_is_refused_and_its_target_kept(run_dir, capsys):
    target = run_dir.parent / "outside" / "elsewhere"
    target.mkdir()
    (target / "sentinel").write_text("someone else's")
    before = _untouched(target / "sentinel"), target.stat().st_mtime_ns
    partial = run_dir / "checkpoints" / "step_0000003.partial"
    partial.symlink_to(target, target_is_directory=True)
    _refused(_resume(run_dir), f"{partial} is a symbolic link", capsys)
    assert (_untouched(target / "sentinel"), target.stat().st_mtime_ns) == before
    assert sorted(path.name for path in target.iterdir()) == ["sentinel"]


def test_a_checkpoint_that_is_a_link_is_refused_and_never_pruned(run_dir, capsys):
    """Refused before the run starts; and one linked in while it runs is no checkpoint of the run's, so
    --keep-checkpoints never deletes it (nor through it)."""
    oldest = run_dir / "checkpoints" / "step_0000001"
    target = shutil.move(oldest, run_dir.parent / "outside" / oldest.name)
    oldest.symlink_to(target, target_is_directory=True)
    _refused(_resume(run_dir, "--keep-checkpoints", "1"), f"{oldest} is a symbolic link", capsys)
    assert [path.name for path in complete_checkpoints(run_dir)] == ["step_0000002"]
    assert (target / "step.json").is_file()


def test_a_damaged_newest_checkpoint_with_none_intact_before_stops_the_run(run_dir, capsys):
    checkpoints = complete_checkpoints(run_dir)
    for checkpoint in checkpoints:
        shard = next(checkpoint.glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])
    line = _refused(_resume(run_dir), "no intact checkpoint precedes it", capsys)
    assert "does not match its checksum" in line and "--restart-from-scratch" in line
    assert complete_checkpoints(run_dir) == checkpoints  # nothing set aside: the next --resume refuses again
    _refused(_resume(run_dir), "no intact checkpoint precedes it", capsys)
