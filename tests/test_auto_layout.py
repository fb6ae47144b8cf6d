"""plait train --auto: the planner's pick for N ranks on this machine is what trains, to the end."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from plait.hardware import Hardware, save_profile

# A CPU profile with round figures of the order `plait calibrate` measures on a 2-core machine
# (the pick only has to be one the planner prints; how fast it runs is not under test).
CPU_PROFILE = Hardware("test-cpu", bf16_tflops=0.05, fp32_tflops=0.05, memory_bytes=8e9, memory_gbps=10,
                       intra_node_gbps=2, inter_node_gbps=2, gpus_per_node=8, reserved_bytes=2e8,
                       host_runs_ahead=False, comm_overlap=0.5)


@pytest.mark.parametrize("ranks", [4, 8])
def test_auto_trains_the_layout_the_planner_printed(tmp_path, ranks):
    profile = tmp_path / "cpu.json"
    save_profile(CPU_PROFILE, profile)
    run_dir = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, "-m", "plait", "train", "--auto", "--ranks", str(ranks), "--hardware-profile", str(profile),
         "--model", "tiny", "--steps", "2", "--global-batch", "16", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    picked = re.search(rf"--auto picked (.+) for {ranks} rank\(s\) on test-cpu: ", completed.stdout)
    assert picked, completed.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["layout"]["name"] == picked.group(1)
    assert summary["world_size"] == ranks
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]


def test_auto_on_a_cpu_without_a_profile_says_how_to_get_one(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "plait", "train", "--auto", "--ranks", "2", "--steps", "1"],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert completed.returncode == 2
    assert completed.stderr.count("\n") == 1 and "plait calibrate" in completed.stderr
    assert not (tmp_path / "runs").exists()
