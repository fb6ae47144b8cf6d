"""Multi-node launch: two torchrun agents (--nnodes 2 --nproc-per-node 2) rendezvous over c10d on
localhost, as two nodes would, and train the single-node 4-rank run's losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from plait.train.launch import free_port
from tests.cases import run_config, train_losses
from tests.test_data_parallel_parity import assert_same_losses

ROOT = Path(__file__).resolve().parents[1]
STEPS, SEQ_LEN, BATCH = 3, 64, 8
# run_config's settings as flags: tiny, fp32, warm-up 2, no final checkpoint.
TRAIN = ["--model", "tiny", "--seq-len", str(SEQ_LEN), "--global-batch", str(BATCH), "--steps", str(STEPS),
         "--warmup-steps", "2", "--precision", "fp32", "--no-final-checkpoint", "--dp", "2", "--tp", "2"]


def test_two_agents_on_localhost_train_the_single_node_losses(pool, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "plait-test",
             "-m", "plait", "train", *TRAIN, "--run-dir", str(tmp_path / "run")]
    agents = [subprocess.Popen(agent, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=300)[0] for process in agents]
    assert [process.returncode for process in agents] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    single_node = pool.run(train_losses, 4, run_config("tiny", steps=STEPS, global_batch=BATCH, seq_len=SEQ_LEN,
                                                       dp=2, tp=2))[0]
    assert_same_losses(single_node, [row["loss"] for row in rows])
