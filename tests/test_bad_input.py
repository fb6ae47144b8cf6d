"""Every kind of bad input: one line on stderr, exit status 2, no worker started, nothing written."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import warnings
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
    (tmp_path / "stall_text.toml").write_text('[train]\nstall_timeout = "soon"\n')
    (tmp_path / "train_value.toml").write_text("train = 5\n")
    (tmp_path / "dp_fraction.toml").write_text("[layout]\ndp = 2.5\n")
    (tmp_path / "seed_bool.toml").write_text("[train]\nseed = true\n")
    (tmp_path / "negative_theta.toml").write_text('[model]\nname = "tiny-llama"\nrope_theta = -1.0\n')
    (tmp_path / "nan_eps.toml").write_text('[model]\nname = "tiny-llama"\nnorm_eps = nan\n')
    (tmp_path / "latin1.toml").write_bytes(b"[train]\nseed = 1 # \xe9\n")
    (tmp_path / "incomplete.json").write_text('{"name": "x"}')
    (tmp_path / "unsorted_blocks.json").write_text(
        '{"name": "x", "bf16_tflops": 1, "fp32_tflops": 1, "memory_bytes": 1e10, "memory_gbps": 1, "intra_node_gbps": 1, '
        '"inter_node_gbps": 1, "block_attention_points": [[1e6, 1.2, 0.9], [1e5, 1.1, 0.8]]}')
    (tmp_path / "not_json.json").write_text("bf16_tflops: 1")
    measured = '{"name": "x", "bf16_tflops": 1, "fp32_tflops": 1, "memory_bytes": 1e10, "memory_gbps": 1, ' \
               '"intra_node_gbps": 1, "inter_node_gbps": 1, '
    (tmp_path / "text_scale.json").write_text(measured + '"all_gather_scale": {"latency": "x", "bandwidth": 1}}')
    (tmp_path / "negative_overhead.json").write_text(measured + '"host_overhead": {"gpt2": {"layer_forward": -1}}}')
    (tmp_path / "all_headroom.json").write_text(measured + '"memory_headroom": 2}')
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "piped_run").mkdir()
    os.mkfifo(tmp_path / "piped_run" / "summary.json")
    damaged_run = tmp_path / "damaged_run"
    damaged_run.mkdir()
    (damaged_run / "summary.json").write_text('{"model_spec": ')
    finished = tmp_path / "finished_run"
    finished.mkdir()
    (finished / "metrics.jsonl").write_text('{"step": 0, "loss": 5.0}\n')
    _hf_folders(tmp_path)
    _word_tokenizer(tmp_path / "tokenizer.json")
    _checkpoint_of_negative_step(tmp_path / "negative_step_run" / "checkpoints" / "step_0000005")
    return {path.stem: str(path) for path in tmp_path.iterdir()}


def _word_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models

    # an end-of-document token, which prepare-data puts after each document
    Tokenizer(models.WordLevel({"[UNK]": 0, "<|endoftext|>": 1}, unk_token="[UNK]")).save(str(path))


def _checkpoint_of_negative_step(folder: Path) -> None:
    """A checkpoint that reads as data, whose step file says -5 (and no run record to contradict it)."""
    import torch
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"x": torch.zeros(1)}, checkpoint_id=str(folder), no_dist=True)
    (folder / "step.json").write_text('{"step": -5}\n')


def _hf_folders(root: Path) -> None:
    """Hugging Face folders for --init-from, each wrong in one way (the weights are read only where they
    are good enough for the config to be accepted)."""
    from safetensors.numpy import save_file

    from plait.interop.hf_config import hf_config
    from plait.interop.hf_names import hf_tensors
    from plait.models.spec import model_spec

    spec = model_spec(None, family="llama", layers=1, hidden=32, heads=2, kv_heads=1, vocab=256, seq_len=16)
    llama = {key: value for key, value in hf_config(spec).items() if key != "head_dim"}
    configs = {"hf_nested": "[" * 100_000 + "]" * 100_000, "hf_no_heads": {**llama, "num_attention_heads": 0},
               "hf_rope_text": {**llama, "rope_parameters": "linear"},
               "hf_rope_scaling_text": {**llama, "rope_parameters": None, "rope_scaling": "dynamic"},
               "hf_int8": llama}
    for name, config in configs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        save_file({tensor.name: np.ones(tensor.shape, dtype=np.int8) for tensor in hf_tensors(spec)},
                  str(root / name / "model.safetensors"))


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
    "a profile past the last step": (["--profile-steps", "7:9"], "reaches past the run's last step, 1"),
    "a negative rotary base": (["--config", "{negative_theta}"], "rope_theta must be a positive finite number"),
    "a norm epsilon that is not a number": (["--config", "{nan_eps}"], "norm_eps must be a positive finite number"),
    "dry run into a started run": (["--dry-run", "--run-dir", "{finished_run}"], "already holds a run; pass --resume"),
    "dry run into a file": (["--dry-run", "--run-dir", "{short}"], "is a file, not a directory"),
    "device figure without a prediction": (["--memory-gb", "40"], "only changes the device a prediction is for"),
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
    "recompute layers without full recomputation": (["--recompute-layers", "2"], "pass --recompute full with it"),
    "recompute layers of zero": (["--recompute", "full", "--recompute-layers", "0"], "recompute-layers must be a positive"),
    "per-operation recomputation under zb-h1": (["--pp", "2", "--schedule", "zb-h1", "--microbatches", "4", "--recompute",
                                                 "op"], "zb-h1's split backward replays it twice"),
    "activation offload with recomputation": (["--offload-activations", "--recompute", "full"], "drop one of them"),
    "activation offload under zb-h1": (["--pp", "2", "--schedule", "zb-h1", "--microbatches", "4", "--offload-activations"],
                                       "zb-h1's split backward reads them in each half"),
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
    "profiling steps that are not numbers": (["--profile-steps", "soon"], "profile-steps must be two step numbers"),
    "negative stall timeout": (["--stall-timeout", "-1"], "stall-timeout must be 0 (no watchdog) or a number"),
    "stall timeout shorter than a second": (["--stall-timeout", "0.2"], "of at least 1, got 0.2"),
    "stall timeout that is not a number": (["--stall-timeout", "soon"], "invalid float value: 'soon'"),
    "stall timeout of the wrong type": (["--config", "{stall_text}"], "stall-timeout must be of type float"),
    "a TOML table given as a value": (["--config", "{train_value}"], "[train] must be a table"),
    "a fraction where a count goes": (["--config", "{dp_fraction}"], "dp must be of type int, got 2.5"),
    "a boolean where a count goes": (["--config", "{seed_bool}"], "seed must be of type int, got True"),
    "a TOML file that is not UTF-8": (["--config", "{latin1}"], "is not valid TOML"),
    "negative warm-up": (["--warmup-steps", "-1"], "warmup-steps must be a non-negative integer"),
    "negative seed": (["--seed", "-1"], "seed must be a non-negative integer"),
    "empty global batch": (["--global-batch", "0"], "global-batch must be a positive integer"),
    "negative checkpoint interval": (["--checkpoint-every", "-1"], "checkpoint-every must be a non-negative"),
    "negative evaluation interval": (["--eval-every", "-2"], "eval-every must be a non-negative integer"),
    "no log lines": (["--log-every", "0"], "log-every must be a positive integer"),
    "tp that does not divide the heads": (["--tp", "3"], "cannot be split over --tp 3"),
    "cp that does not divide the sequence": (["--cp", "3"], "not divisible by --cp 3"),
    "ring cp on a sequence of odd chunks": (["--cp", "2", "--cp-algorithm", "ring", "--seq-len", "6"],
                                            "not divisible by 2 × --cp 2"),
    "a model of no layers": (["--layers", "0"], "layers must be a positive integer"),
    "no micro-batches": (["--microbatches", "0"], "microbatches must be a positive integer"),
    "unknown pipeline schedule": (["--schedule", "zigzag"], "invalid choice: 'zigzag'"),
    "weights from a folder without them": (["--init-from", "{folder}"], "holds no config.json and model.safetensors"),
    "a Hugging Face config nested past Python's depth": (["--init-from", "{hf_nested}"], "is not a readable JSON file"),
    "a Hugging Face model of no heads": (["--init-from", "{hf_no_heads}"], "gives num_attention_heads 0"),
    "Hugging Face rotary settings as text": (["--init-from", "{hf_rope_text}"], "gives rope_parameters (or rope_scal"),
    "Hugging Face rotary scaling as text": (["--init-from", "{hf_rope_scaling_text}"], "'dynamic', which is not a JSON"),
    "quantized Hugging Face weights": (["--dp", "1", "--init-from", "{hf_int8}"], "is stored as I8, and plait reads"),
    "resuming a checkpoint of step -5": (["--dp", "1", "--resume", "--run-dir", "{negative_step_run}"],
                                         "step.json does not give the step its folder is named for (-5)"),
    "an empty run dir": (["--dp", "1", "--run-dir", ""], "--run-dir is empty; name the folder"),
    "resume-changed without resume": (["--dp", "1", "--resume-changed"], "--resume-changed only changes how --resume"),
    "data from a device": (["--dp", "1", "--data", "/dev/zero"], "data file /dev/zero is not a regular file"),
    "config file that is a folder": (["--config", "{folder}"], "is a folder; pass --config with a TOML file"),
    "a model of 10^9 layers": (["--layers", str(10**9)], "model layers 1,000,000,000 is more than plait builds"),
    "a model no rank here can hold": (["--dp", "1", "--hidden", "65536", "--heads", "4", "--layers", "64"],
                                      "optimizer state need 49,202.9 GiB on its fullest rank under single"),
    "a dry run of a model no rank here can hold": (["--dry-run", "--dp", "1", "--hidden", "65536", "--heads", "4",
                                                    "--layers", "64"], "optimizer state need 49,202.9 GiB"),
    "data path that is a folder": (["--data", "{folder}"], "is a folder"),
    "resuming a run dir that is a file": (["--resume", "--run-dir", "{empty}"], "is a file, not a directory"),
    "a catalog GPU and a profile at once": (["--dry-run", "--gpu", "h100-sxm", "--hardware-profile", "{incomplete}"],
                                            "not allowed with argument --gpu"),
    "incomplete hardware profile": (["--auto", "--ranks", "2", "--hardware-profile", "{incomplete}"], "is incomplete"),
    "hardware profile that is not JSON": (["--auto", "--ranks", "2", "--hardware-profile", "{not_json}"],
                                          "cannot read hardware profile"),
}


# Commands other than train: their whole argv.
BAD_COMMANDS = {
    "token file in a missing folder": (["prepare-data", "{short}", "--tokenizer", "/no/tokenizer.json", "--out",
                                        "missing_dir/t.u16"], "the folder missing_dir does not exist"),
    "token file into a folder no one may write": (["prepare-data", "{short}", "--tokenizer", "{tokenizer}", "--out",
                                                   "/sys/t.u16"], "; name a folder you can write to"),
    "token file from a folder of text": (["prepare-data", "{folder}", "--tokenizer", "{tokenizer}", "--out", "t.u16"],
                                         "is a folder; pass UTF-8 text files"),
    "export under a file": (["export", "{finished_run}", "--to", "{short}/hf"], "short.txt is a file"),
    "export of a run with no checkpoint": (["export", "{finished_run}", "--to", "hf"], "holds no complete checkpoint"),
    "export in shards of no size": (["export", "{finished_run}", "--to", "hf", "--max-shard-size", "5 parsecs"],
                                    "--max-shard-size '5 parsecs' is not a size"),
    "plan of an unknown preset": (["plan", "--model", "gpt5"], "unknown model preset 'gpt5'"),
    "plan on no GPUs": (["plan", "--model", "tiny", "--gpus", "0"], "--gpus must be a positive integer"),
    "plan of recompute layers under selective recomputation": (
        ["plan", "--model", "tiny", "--recompute", "selective", "--recompute-layers", "2"], "pass --recompute full with it"),
    "simulate of a schedule Megatron-LM does not run": (
        ["simulate", "--model", "tiny", "--stack", "megatron", "--pp", "2", "--schedule", "zb-h1", "--microbatches", "4"],
        "has no zb-h1 schedule"),
    "simulate of per-operation recomputation on Megatron-LM": (
        ["simulate", "--model", "tiny", "--stack", "megatron", "--recompute", "op"], "no per-operation checkpointing"),
    "simulate of activation offload on Megatron-LM": (
        ["simulate", "--model", "tiny", "--stack", "megatron", "--offload-activations"], "cannot offload activations"),
    "plan on an unknown GPU": (["plan", "--model", "tiny", "--gpu", "h900"], "unknown GPU 'h900'"),
    "plan with a missing profile": (["plan", "--model", "tiny", "--hardware-profile", "/no/profile.json"],
                                    "hardware profile /no/profile.json does not exist"),
    "plan with an incomplete profile": (["plan", "--model", "tiny", "--hardware-profile", "{incomplete}"],
                                        "is incomplete"),
    "plan with blockwise scales out of order": (["plan", "--model", "tiny", "--hardware-profile", "{unsorted_blocks}"],
                                                "fewest scores first"),
    "plan keeping all memory free": (["plan", "--model", "tiny", "--memory-headroom", "1.5"], "in [0, 1)"),
    "plan listing no layouts": (["plan", "--model", "tiny", "--top", "0"], "--top must be a positive integer"),
    "plan with negative bandwidth": (["plan", "--model", "tiny", "--intra-node-gbps", "-1"],
                                     "intra_node_gbps must be positive"),
    "plan with not-a-number peak": (["plan", "--model", "tiny", "--peak-tflops", "nan"], "must be a finite number"),
    "plan with a negative memory bandwidth": (["plan", "--model", "tiny", "--memory-bandwidth", "-3"],
                                              "memory_gbps must be positive"),
    "plan with a zero ring bandwidth cap": (["plan", "--model", "tiny", "--inter-node-ring-gbps", "0"],
                                            "inter_node_ring_gbps must be positive"),
    "plan of dropout on plait's stack": (["plan", "--model", "tiny", "--dropout"], "add --stack megatron"),
    "plan of a dp that does not divide the GPUs": (["plan", "--model", "tiny", "--dp", "3"],
                                                   "does not divide --gpus 8"),
    "simulate ZeRO stage 5": (["simulate", "--model", "tiny", "--dp", "8", "--zero", "5"],
                              "ZeRO stage 5 does not exist"),
    "simulate a batch dp cannot split": (["simulate", "--model", "tiny", "--dp", "8", "--global-batch", "3"],
                                         "not divisible by dp"),
    "simulate a trace into a missing folder": (["simulate", "--model", "tiny", "--dp", "8", "--trace", "no_dir/t.json"],
                                               "the folder no_dir does not exist"),
    "simulate a timeline into a missing folder": (["simulate", "--model", "tiny", "--dp", "8", "--timeline",
                                                   "no_dir/t.png"], "the folder no_dir does not exist"),
    "simulate a trace into a named pipe": (["simulate", "--model", "tiny", "--dp", "8", "--trace", "{pipe}"],
                                           "is not a regular file (a device, a pipe or a socket)"),
    "simulate a trace onto a full device": (["simulate", "--model", "tiny", "--dp", "8", "--trace", "/dev/full"],
                                            "--trace /dev/full is not a regular file"),
    "schedule drawn onto an endless device": (["schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--out",
                                               "/dev/zero"], "--out /dev/zero is not a regular file"),
    "simulate a trace under a file": (["simulate", "--model", "tiny", "--dp", "8", "--trace", "{short}/t.json"],
                                      "is a file, not a folder"),
    "simulate a trace onto a folder": (["simulate", "--model", "tiny", "--dp", "8", "--trace", "{folder}"],
                                       "is a folder; name a file"),
    "schedule drawn into a text file's name": (["schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--out",
                                                "x.txt"], "--out x.txt must end in .png: plait writes a PNG drawing"),
    "simulate a trace under a picture's name": (["simulate", "--model", "tiny", "--dp", "8", "--trace", "t.png"],
                                                "--trace t.png must end in .json"),
    "plan over a cluster of partial nodes": (["plan", "--model", "tiny", "--gpus", "8", "--gpus-per-node", "3"],
                                             "--gpus 8 is not a whole number of nodes of 3 GPUs"),
    "sample at an infinite temperature": (["sample", "{finished_run}", "--prompt", "a", "--temperature", "inf"],
                                          "--temperature must be 0 (greedy) or a positive finite number, got inf"),
    "sample at a temperature that is not a number": (["sample", "{finished_run}", "--prompt", "a", "--temperature",
                                                      "nan"], "a positive finite number, got nan"),
    "sample at a negative temperature": (["sample", "{finished_run}", "--prompt", "a", "--temperature", "-1"],
                                         "a positive finite number, got -1.0"),
    "sample without end": (["sample", "{finished_run}", "--prompt", "a", "--max-tokens", str(10**12)],
                           "--max-tokens must be a positive integer of at most 100,000"),
    "schedule too deep to draw in seconds": (["schedule", "1f1b", "--pp", "128", "--microbatches", "128"],
                                             "plait schedule draws at most 64 ranks and 8,192 chunk forwards"),
    "plan with a profile that is a device": (["plan", "--model", "tiny", "--hardware-profile", "/dev/zero"],
                                             "hardware profile /dev/zero is not a regular file"),
    "explain a run whose summary is a pipe": (["explain", "{piped_run}"], "summary.json is not a regular file"),
    "explain a run with no summary": (["explain", "{finished_run}"], "holds no summary.json"),
    "explain a damaged summary": (["explain", "{damaged_run}"], "is not a readable summary"),
    "explain with a profile that is not JSON": (["explain", "{damaged_run}", "--hardware-profile", "{not_json}"],
                                                "cannot read hardware profile"),
    "calibrate on no cores": (["calibrate", "--threads", "0"], "--threads must be a positive number of cores"),
    "calibrate on more cores than the machine has": (["calibrate", "--threads", str(TOO_MANY), "--out", "p.json"],
                                                     "at most this machine's"),
    "verify into a file": (["verify", "--dp", "2", "--run-dir", "{short}"], "is a file, not a directory; name a new folder"),
    "calibrate into a missing folder": (["calibrate", "--out", "no_dir/profile.json"], "the folder no_dir does not"),
    "calibrate over a file that is not a profile": (["calibrate", "--out", "{short}"],
                                                   "exists and is not a hardware profile plait would replace"),
    "schedule drawn over a file that is not a drawing": (["schedule", "1f1b", "--pp", "2", "--microbatches", "4",
                                                          "--out", "{short}"], "exists and is not a PNG drawing"),
    "simulate a trace over a file that is not a trace": (["simulate", "--model", "tiny", "--dp", "8", "--trace",
                                                          "{short}"], "exists and is not a Chrome trace"),
    "simulate with a measured scale that is not a number": (["simulate", "--model", "tiny", "--hardware-profile",
                                                             "{text_scale}"], "all_gather_scale.latency must be a finite"),
    "plan with a negative measured overhead": (["plan", "--model", "tiny", "--hardware-profile", "{negative_overhead}"],
                                               "host_overhead.gpt2.layer_forward must be a finite number, 0 or more"),
    "plan with a profile keeping all memory free": (["plan", "--model", "tiny", "--hardware-profile", "{all_headroom}"],
                                                    "memory_headroom is a fraction of device memory in [0, 1)"),
    "schedule of an unknown name": (["schedule", "zigzag", "--pp", "2", "--microbatches", "4"], "invalid choice"),
    "verify with no data parallelism": (["verify", "--dp", "0"], "dp must be a positive integer"),
}


@pytest.mark.parametrize("case", list(BAD_COMMANDS))
def test_bad_command_input_is_one_clear_line(case, files, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    argv, expected = BAD_COMMANDS[case]
    saved = _contents(tmp_path)
    assert_refused_in_one_line([arg.format(**files) for arg in argv], expected, capsys, tmp_path)
    assert _contents(tmp_path) == saved  # nothing already there was changed, and nothing was added


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
                                             (["--dry-run", "--lr", "inf"], "lr must be a finite number"),
                                             (["--dp", "2", "--stall-timeout", "-1"], "stall-timeout must be 0"),
                                             (["--run-dir", ""], "--run-dir is empty"),
                                             (["--resume-changed"], "--resume-changed only changes how --resume"),
                                             (["--layers", str(10**9)], "is more than plait builds")])
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
