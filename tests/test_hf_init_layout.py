"""A Llama folder as transformers saves it (sharded, grouped-query attention, rms_norm_eps 1e-6)
trains under tp2·pp2 from ``--init-from`` alone: step 0's loss is transformers' own on the same
batch, and every rank reads from the files only the slices of the weights it holds."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from tests.test_hf_interop import CountingSafeOpen

transformers = pytest.importorskip("transformers")

SHAPE = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
         "intermediate_size": 176, "vocab_size": 256, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
         "rope_theta": 500000.0, "tie_word_embeddings": False}
FLAGS = ["--tp", "2", "--pp", "2", "--microbatches", "2", "--seq-len", "64", "--global-batch", "4", "--steps", "1"]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE, attention_bias=False, mlp_bias=False))
    model.save_pretrained(folder, max_shard_size="60KB", safe_serialization=True)
    return folder, model.eval()


def run_config_from_flags(folder):
    from plait.cli import build_parser
    from plait.config import config_from_args

    return config_from_args(build_parser().parse_args(["train", "--init-from", str(folder), *FLAGS]))


def first_loss_and_reads(config) -> dict:
    """Step 0's loss, the values this rank read from the folder's files and the values of the
    weights it holds (tensor-parallel vocabulary padding left out)."""
    import safetensors

    from plait.parallel.materialize import held_region, single_device_shape
    from plait.topology import build_topology
    from plait.train.loop import train

    counting = CountingSafeOpen(safetensors.safe_open)
    opened, safetensors.safe_open = safetensors.safe_open, counting
    try:
        result = train(config, build_topology(config.layout, torch.device("cpu")))
    finally:
        safetensors.safe_open = opened
    held = 0
    for name, param in result.model.named_parameters():
        (start, stop), *rest = held_region(param)
        rows = max(0, min(stop, single_device_shape(config.model, name, tuple(param.shape))[0]) - start)
        held += rows * math.prod(last - first for first, last in rest)
    return {"loss": result.losses[0], "read": counting.values, "held": held}


def test_a_sharded_transformers_llama_trains_under_tp_pp_from_its_folder_alone(pool, llama_folder):
    from plait.train.data import BatchSource, training_tokens

    folder, reference = llama_folder
    assert len(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]) > 0
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 2
    config = run_config_from_flags(folder)
    assert (config.model.kv_heads, config.model.norm_eps, config.model.rope_theta) == (2, 1e-6, 500000.0)
    tokens = training_tokens(config.train.data, config.model.vocab, config.model.seq_len)
    inputs, targets = BatchSource(tokens, config.model.seq_len, config.train.global_batch, config.train.seed).local_batch(
        0, 0, 1)
    with torch.no_grad():
        expected = F.cross_entropy(reference(inputs).logits.flatten(0, 1), targets.flatten()).item()
    ranks = pool.run(first_loss_and_reads, 4, config)
    for rank in ranks:
        assert rank["loss"] == pytest.approx(expected, rel=1e-5)
        assert rank["read"] == rank["held"]
    whole = sum(p.numel() for p in reference.parameters())
    assert max(rank["read"] for rank in ranks) < whole / 2
