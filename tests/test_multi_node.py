"""Multi-node launch: two torchrun agents (--nnodes 2 --nproc-per-node 2) rendezvous over c10d on
localhost, as two nodes would, and train the single-node 4-rank run's losses; under them, as under
plait's own launcher, a second job into the used run folder and a bad --init-from are refused by
every rank, in one plait line, before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plait.train.launch import free_port
from tests.cases import run_config, train_losses
from tests.test_data_parallel_parity import assert_same_losses

ROOT = Path(__file__).resolve().parents[1]
STEPS, SEQ_LEN, BATCH = 3, 64, 8
# run_config's settings as flags: tiny, fp32, warm-up 2, no final checkpoint.
TRAIN = ["--model", "tiny", "--seq-len", str(SEQ_LEN), "--global-batch", str(BATCH), "--steps", str(STEPS),
         "--warmup-steps", "2", "--precision", "fp32", "--no-final-checkpoint", "--dp", "2", "--tp", "2"]


def two_agents(tmp_path: Path, flags: list[str]) -> tuple[list[int], str]:
    """``plait train flags`` under two torchrun agents; their exit statuses and their output together."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "plait-test",
             "-m", "plait", "train", *flags]
    agents = [subprocess.Popen(agent, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=300)[0] for process in agents]
    return [process.returncode for process in agents], "".join(outputs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    """A run folder the two agents trained, and their output."""
    root = tmp_path_factory.mktemp("multi_node")
    statuses, output = two_agents(root, [*TRAIN, "--run-dir", str(root / "run")])
    assert statuses == [0, 0], output[-4000:]
    return root / "run", output


def test_two_agents_on_localhost_train_the_single_node_losses(pool, trained):
    rows = [json.loads(line) for line in (trained[0] / "metrics.jsonl").read_text().splitlines()]
    single_node = pool.run(train_losses, 4, run_config("tiny", steps=STEPS, global_batch=BATCH, seq_len=SEQ_LEN,
                                                       dp=2, tp=2))[0]
    assert_same_losses(single_node, [row["loss"] for row in rows])


def plait_errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("plait: error:")]


def test_a_second_job_into_the_used_run_folder_is_refused_in_one_line(trained):
    """What a Slurm requeue without --resume did: rewrite metrics.jsonl and config.toml and save beside
    the first job's checkpoints."""
    run_dir = trained[0]
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    statuses, output = two_agents(run_dir.parent, [*TRAIN, "--run-dir", str(run_dir)])
    assert all(status != 0 for status in statuses)
    errors = plait_errors(output)
    assert len(errors) == 1 and "already holds a run; pass --resume" in errors[0], output[-4000:]
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before


def test_a_bad_init_from_is_one_line_from_rank_zero_not_a_traceback_per_rank(tmp_path):
    folder = tmp_path / "not_a_model"
    folder.mkdir()
    statuses, output = two_agents(tmp_path, [*TRAIN, "--init-from", str(folder), "--run-dir", str(tmp_path / "run")])
    assert all(status != 0 for status in statuses)
    errors = plait_errors(output)
    assert len(errors) == 1 and str(folder) in errors[0], output[-4000:]
    assert "plait/" not in "".join(line for line in output.splitlines() if line.lstrip().startswith("File ")), output
