"""Every kind of bad input: one line on stderr, exit status 2, no worker started, nothing written."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cases import assert_refused_in_one_line


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "broken.toml").write_text("[train\nsteps = 3\n")
    (tmp_path / "unknown_key.toml").write_text("[train]\nstepz = 3\n")
    (tmp_path / "unknown_table.toml").write_text("[optimizer]\nlr = 0.1\n")
    (tmp_path / "wrong_type.toml").write_text('[train]\nlr = "fast"\n')
    np.array([1, 2, 300, 4] * 100, dtype=np.uint16).tofile(tmp_path / "wide.u16")
    (tmp_path / "short.txt").write_text("just a few bytes")
    (tmp_path / "odd.u32").write_bytes(b"\x01\x02\x03")
    (tmp_path / "data_number.toml").write_text("[train]\ndata = 5\n")
    (tmp_path / "run_dir_number.toml").write_text("[train]\nrun_dir = 5\n")
    (tmp_path / "stage_layers_text.toml").write_text('[layout]\npp = 2\nstage_layers = [2, "a"]\n')
    np.save(tmp_path / "negative.npy", np.array([-1, 2, 3] * 100, dtype=np.int32))
    (tmp_path / "damaged.npy").write_bytes(b"\x93NUMPY not an array")
    (tmp_path / "profile.json").write_text('{"name": "x", "bf16_tflops": 1, "fp32_tflops": 1, "memory_bytes": -5, '
                                           '"memory_gbps": 1, "intra_node_gbps": 1, "inter_node_gbps": 1}')
    finished = tmp_path / "finished_run"
    finished.mkdir()
    (finished / "metrics.jsonl").write_text('{"step": 0, "loss": 5.0}\n')
    return {path.stem: str(path) for path in tmp_path.iterdir()}


TOO_MANY = 64 * (os.cpu_count() or 1)  # beyond the local cap of 8 CPU ranks a core, and any node's GPUs

BAD_INPUTS = {
    "unknown preset": (["--model", "gpt5"], "unknown model preset"),
    "zero data parallel": (["--dp", "0"], "dp must be a positive integer"),
    "zero steps": (["--steps", "0"], "steps must be a positive integer"),
    "negative learning rate": (["--lr", "-1"], "learning rate must be a positive"),
    "infinite learning rate": (["--lr", "inf"], "lr must be a finite number"),
    "ranks without --auto": (["--ranks", "4"], "add --auto"),
    "more local ranks than the machine runs": (["--dp", str(TOO_MANY), "--global-batch", str(TOO_MANY)],
                                                "the layout needs"),
    "batch not divisible": (["--dp", "2", "--global-batch", "7"], "not divisible by dp"),
    "batch not divisible under ZeRO": (["--dp", "4", "--zero", "3", "--global-batch", "6"], "not divisible by dp"),
    "ZeRO stage outside 0-3": (["--dp", "2", "--zero", "4"], "use 0, 1, 2 or 3"),
    "ZeRO without data parallelism": (["--dp", "1", "--zero", "2"], "no effect with --dp 1"),
    "missing data file": (["--data", "/no/such/file.txt"], "does not exist"),
    "empty data file": (["--data", "{empty}"], "is empty"),
    "data shorter than a sequence": (["--data", "{short}"], "fewer than one sequence"),
    "token outside vocabulary": (["--data", "{wide}"], "vocabulary is 256"),
    "token file of partial tokens": (["--data", "{odd}"], "not a whole number"),
    "malformed TOML": (["--config", "{broken}"], "not valid TOML"),
    "unknown key": (["--config", "{unknown_key}"], "unknown key 'stepz'"),
    "unknown table": (["--config", "{unknown_table}"], "unknown table [optimizer]"),
    "wrong value type": (["--config", "{wrong_type}"], "lr must be of type float"),
    "missing config file": (["--config", "/no/such.toml"], "does not exist"),
    "heads do not divide hidden": (["--heads", "3"], "not divisible by 3 heads"),
    "kv-heads do not divide heads": (["--model", "tiny-llama", "--kv-heads", "3"], "kv-heads must divide"),
    "sequence parallel without tp": (["--sp"], "needs --tp 2"),
    "virtual stages without interleaving": (["--virtual-stages", "2"], "only applies to the interleaved"),
    "unknown flag": (["--dpp", "2"], "unrecognized arguments"),
    "unknown precision": (["--precision", "fp8"], "invalid choice"),
    "overwriting a finished run": (["--run-dir", "{finished_run}"], "already holds a run"),
    "run dir that is a file": (["--dp", "1", "--run-dir", "{empty}"], "is a file, not a directory"),
    "run dir inside a file": (["--dp", "1", "--run-dir", "{empty}/run"], "cannot be created (Not a directory)"),
    "absurd global batch": (["--global-batch", str(2**40)], "more than plait draws per step"),
    "not-a-number learning rate": (["--lr", "nan"], "lr must be a finite number"),
    "dry run with a bad flag": (["--dry-run", "--lr", "inf"], "lr must be a finite number"),
    "resume without run dir": (["--resume"], "--resume needs --run-dir"),
    "batch the default layout cannot split": (["--global-batch", "2"], "with the default layout dp2·tp2·pp2"),
    "PowerSGD over ZeRO-2's reduce-scatter": (["--dp", "2", "--zero", "2", "--grad-compression", "powersgd"],
                                              "pass --zero 0 or 1"),
    "data path of the wrong type": (["--config", "{data_number}"], "data must be of type str"),
    "run dir of the wrong type": (["--config", "{run_dir_number}"], "run-dir must be of type str"),
    "stage sizes that are not numbers": (["--config", "{stage_layers_text}"], "stage-layers must be whole numbers"),
    "negative token ids": (["--dp", "1", "--data", "{negative}"], "negative token id -1"),
    "hybrid sharding flags that disagree": (["--dp-replicate", "2", "--dp-shard", "2", "--dp", "8"],
                                            "disagrees with --dp-replicate 2"),
    "hybrid sharding without ZeRO": (["--dp-replicate", "2", "--dp-shard", "2"], "ZeRO stage 0 shards nothing"),
    "damaged .npy file": (["--dp", "1", "--data", "{damaged}"], "is not a readable .npy array"),
    "damaged hardware profile": (["--auto", "--ranks", "2", "--hardware-profile", "{profile}"],
                                 "memory_bytes must be positive"),
    "tokenizer with byte data": (["--tokenizer", "/no/tokenizer.json"], "--tokenizer needs --data of token ids"),
    "tokenizer with a text file": (["--data", "{short}", "--tokenizer", "/no/tokenizer.json"],
                                   "--tokenizer needs --data of token ids"),
    "tracing no step": (["--trace-every", "0"], "trace-every must be a positive integer, got 0"),
    "profiling steps backwards": (["--profile-steps", "3:1"], "profile-steps must be two step numbers A:B"),
}


# Commands other than train: their whole argv.
BAD_COMMANDS = {
    "token file in a missing folder": (["prepare-data", "{short}", "--tokenizer", "/no/tokenizer.json", "--out",
                                        "missing_dir/t.u16"], "the folder missing_dir does not exist"),
    "export under a file": (["export", "{finished_run}", "--to", "{short}/hf"], "short.txt is a file"),
}


@pytest.mark.parametrize("case", list(BAD_COMMANDS))
def test_bad_command_input_is_one_clear_line(case, files, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    argv, expected = BAD_COMMANDS[case]
    assert_refused_in_one_line([arg.format(**files) for arg in argv], expected, capsys, tmp_path)
    assert not (tmp_path / "missing_dir").exists()


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_clear_line(case, files, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a default run dir would appear here if anything started
    flags, expected = BAD_INPUTS[case]
    argv = ["train", "--steps", "2", *[flag.format(**files) for flag in flags]]
    saved = _contents(tmp_path)
    assert_refused_in_one_line(argv, expected, capsys, tmp_path)
    assert _contents(tmp_path) == saved  # nothing already there was changed, and nothing was added


def _contents(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder)."""
    return {str(path): path.read_bytes() if path.is_file() else None for path in sorted(root.rglob("*"))}


@pytest.mark.parametrize("flags, expected", [(["--dp", "2", "--global-batch", "5"], "not divisible"),
                                             (["--dry-run", "--lr", "inf"], "lr must be a finite number")])
def test_command_line_reports_bad_input_without_starting_workers(tmp_path, flags, expected):
    """Refused before torch is imported: well under a second of CPU time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    completed = subprocess.run([sys.executable, "-m", "plait", "train", *flags],
                               cwd=tmp_path, capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert completed.returncode == 2
    assert completed.stderr.strip().count("\n") == 0 and expected in completed.stderr
    assert "torch.distributed.run" not in completed.stderr and not (tmp_path / "runs").exists()
    cpu_seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu_seconds <= 1.0, f"{cpu_seconds:.2f} s of CPU to refuse a bad flag"
