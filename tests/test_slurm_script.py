"""docs/slurm_train.sbatch run by bash under a fake Slurm: `scontrol` names the hosts, `srun` records the
command it was given and starts nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "slurm_train.sbatch"
HOSTS = ["gpu-017", "gpu-018"]
JOB = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": ",".join(HOSTS), "SLURM_NNODES": "2"}


def fake_slurm(folder: Path) -> Path:
    """A folder of fake `scontrol` (its `show hostnames` splits a comma list) and `srun` (writes its
    arguments to srun.argv, one a line)."""
    folder.mkdir()
    fakes = {
        "scontrol": '[ "$1 $2" = "show hostnames" ] || exit 1\necho "$3" | tr , "\\n"\n',
        "srun": f'printf "%s\\n" "$@" > {folder / "srun.argv"}\n',
    }
    for name, body in fakes.items():
        (folder / name).write_text("#!/bin/sh\n" + body)
        (folder / name).chmod(0o755)
    return folder


def submit(tmp_path: Path, run_dir: Path, **gpus: str) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    """Run the script as Slurm would on the first node; its result and srun's arguments (None if never run)."""
    fakes = fake_slurm(tmp_path / "slurm")
    env = {"PATH": f"{fakes}{os.pathsep}{os.environ['PATH']}", "PLAIT_RUN_DIR": str(run_dir), **JOB, **gpus}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    argv = fakes / "srun.argv"
    return result, argv.read_text().splitlines() if argv.exists() else None


def after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("gpus, per_node", [
    ({"SLURM_GPUS_ON_NODE": "8"}, "8"),  # --gres=gpu:8 sets no SLURM_GPUS_PER_NODE
    ({"SLURM_GPUS_PER_NODE": "h100:8"}, "8"),
    ({"SLURM_GPUS_PER_NODE": "gpu:h100:8"}, "8"),
    ({"SLURM_GPUS_PER_NODE": "4"}, "4"),
    ({"SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_NODE": "h100:8"}, "2"),  # the node's own count first
    ({"SLURM_JOB_GPUS": "0,1,2"}, "3"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "2"),
])
def test_one_rank_per_gpu_of_the_node(tmp_path, gpus, per_node):
    result, argv = submit(tmp_path, tmp_path / "run", **gpus)
    assert result.returncode == 0, result.stderr
    assert argv[:2] == ["--kill-on-bad-exit=1", "torchrun"]
    assert after(argv, "--nproc-per-node") == per_node
    assert after(argv, "--nnodes") == "2"
    assert after(argv, "--rdzv-endpoint") == f"{HOSTS[0]}:29500"
    assert after(argv, "--rdzv-id") == JOB["SLURM_JOB_ID"]
    assert after(argv, "--run-dir") == str(tmp_path / "run")


@pytest.mark.parametrize("gpus", [{}, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, {"SLURM_GPUS_PER_NODE": "h100:0"}])
def test_a_job_without_gpus_stops_before_srun_saying_how_to_ask(tmp_path, gpus):
    result, argv = submit(tmp_path, tmp_path / "run", **gpus)
    assert result.returncode == 2
    assert argv is None
    assert len(result.stderr.splitlines()) == 1
    assert "--gpus-per-node=N" in result.stderr and "--gres=gpu:N" in result.stderr


@pytest.mark.parametrize("earlier_attempt, resumes", [
    ({}, False),  # a new run
    ({"checkpoints/step_0000500/step.json": '{"step": 500}\n', "metrics.jsonl": '{"step": 0}\n'}, True),
    ({"metrics.jsonl": '{"step": 0}\n'}, True),  # requeued before its first checkpoint: step 0 again, with --resume
    ({"checkpoints/step_0000500.partial/step.json": '{"step": 500}\n'}, True),
])
def test_a_requeued_job_resumes_its_run(tmp_path, earlier_attempt, resumes):
    run_dir = tmp_path / "run"
    for name, text in earlier_attempt.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)
    result, argv = submit(tmp_path, run_dir, SLURM_GPUS_ON_NODE="8")
    assert result.returncode == 0, result.stderr
    assert argv.count("--resume") == int(resumes)
