"""Hugging Face interop: a run saved under a 3-D layout is exported, ``transformers`` (built from the
exported config.json alone, local files only) computes the same logits, ``--init-from`` the export under
another layout starts at the exporting model's loss, and ``plait sample`` decodes greedily what the
exported model's argmax gives.

The reference weights come from torch's own ``dcp_to_torch_save``, not from plait's loader."""

from __future__ import annotations

import dataclasses
import shutil
import zlib

import pytest
import torch
import torch.nn.functional as F

from plait.cli import main
from plait.errors import ConfigError
from plait.models.transformer import Transformer
from plait.sample import encode_bytes
from plait.train.checkpoint import latest_checkpoint
from tests.cases import assert_refused_in_one_line, layout_world_size, run_config, train_losses

pytest.importorskip("transformers")

STEPS = 2
# Each family's exporting layout (3-D, eight ranks) and the other layout that starts from its export.
LAYOUTS = {
    "tiny": ({"dp": 2, "tp": 2, "pp": 2, "microbatches": 2},
             {"dp": 2, "pp": 2, "zero": 3, "schedule": "1f1b", "microbatches": 2}),
    "tiny-llama": ({"dp": 2, "tp": 2, "pp": 2, "microbatches": 2}, {"dp": 2, "tp": 2, "zero": 1}),
}


def with_train(config, **changes):
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **changes))


@pytest.fixture(scope="module")
def exported(pool, tmp_path_factory):
    """Per family: the run directory, its export folder and the checkpoint's full weights (torch's converter)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    runs = {}
    for model, (layout, _) in LAYOUTS.items():
        root = tmp_path_factory.mktemp(model)
        config = with_train(run_config(model, steps=STEPS, **layout), checkpoint_every=STEPS)
        pool.run(train_losses, layout_world_size(layout), config, str(root / "run"))
        assert main(["export", str(root / "run"), "--to", str(root / "hf")]) == 0
        dcp_to_torch_save(latest_checkpoint(root / "run"), root / "full.pt")
        reference = Transformer(config.model)
        reference.load_state_dict(torch.load(root / "full.pt", weights_only=True)["model"])
        runs[model] = (root / "run", root / "hf", reference.eval(), config)
    return runs


@pytest.mark.parametrize("model", LAYOUTS)
def test_transformers_loads_the_export_and_computes_the_same_logits(exported, model):
    from transformers import AutoModelForCausalLM

    _, folder, reference, _ = exported[model]
    hf, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, local_files_only=True)
    assert type(hf).__name__ == {"tiny": "GPT2LMHeadModel", "tiny-llama": "LlamaForCausalLM"}[model]
    assert not any(info.values()), info  # no tensor missing, unexpected or of another shape
    ids = torch.randint(0, reference.spec.vocab, (2, reference.spec.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = reference(ids), hf.eval()(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-5


@pytest.mark.parametrize("model", LAYOUTS)
def test_init_from_the_export_under_another_layout_starts_at_its_loss(pool, exported, model):
    from plait.train.data import BatchSource, training_tokens

    _, folder, reference, config = exported[model]
    spec, train = config.model, config.train
    source = BatchSource(training_tokens(train.data, spec.vocab, spec.seq_len), spec.seq_len, train.global_batch, train.seed)
    inputs, targets = source.local_batch(0, 0, 1)
    with torch.no_grad():
        expected = F.cross_entropy(reference(inputs).flatten(0, 1), targets.flatten()).item()
    other = LAYOUTS[model][1]
    started = with_train(run_config(model, steps=1, **other), init_from=str(folder))
    first_loss = pool.run(train_losses, layout_world_size(other), started)[0][0]
    assert first_loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("vocab, end_of_text", [(50257, 50256), (50304, 50256), (256, None), (60000, None)])
def test_gpt2_export_names_the_end_of_text_token_only_for_gpt2s_own_vocabulary(vocab, end_of_text):
    from plait.interop.hf import hf_config
    from plait.models.spec import model_spec

    config = hf_config(model_spec(None, family="gpt2", layers=1, hidden=32, heads=2, vocab=vocab, seq_len=16))
    assert config["bos_token_id"] == config["eos_token_id"] == end_of_text


def test_a_llama_config_whose_head_dim_is_null_reads_as_without_one(tmp_path):
    import json

    from plait.interop.hf import hf_config, spec_from_hf_config
    from plait.models.spec import model_spec

    spec = model_spec(None, family="llama", layers=1, hidden=32, heads=2, kv_heads=1, vocab=64, seq_len=16)
    (tmp_path / "config.json").write_text(json.dumps({**hf_config(spec), "head_dim": None}))
    assert spec_from_hf_config(tmp_path / "config.json") == spec


def test_init_from_reads_a_stock_gpt2_folder_whose_names_lack_the_transformer_prefix(tmp_path):
    """The Hub's GPT-2 files say ``wte.weight``, ``h.0.…``; --init-from's check and read accept them as plait's own."""
    from safetensors.torch import load_file, save_file

    from plait.interop.hf import WEIGHTS_FILE, check_hf_folder, read_hf_state, write_hf
    from plait.models.spec import model_spec

    spec = model_spec(None, family="gpt2", layers=1, hidden=32, heads=2, vocab=64, seq_len=16, tie_embeddings=False)
    state = Transformer(spec).state_dict()
    write_hf(spec, state, tmp_path)
    weights = tmp_path / WEIGHTS_FILE
    save_file({name.removeprefix("transformer."): value for name, value in load_file(str(weights)).items()},
              str(weights), metadata={"format": "pt"})
    check_hf_folder(tmp_path, spec)
    back = read_hf_state(tmp_path, spec)
    assert back.keys() == state.keys() and all(torch.equal(back[name], value) for name, value in state.items())


@pytest.mark.parametrize("family, tied, kv_heads", [("gpt2", True, 4), ("gpt2", False, 4), ("llama", True, 1),
                                                   ("llama", False, 2)])
def test_tied_and_untied_embeddings_of_both_families_round_trip(tmp_path, family, tied, kv_heads):
    """Weights written and read back are plait's bit for bit, and transformers computes their logits."""
    from transformers import AutoModelForCausalLM

    from plait.interop.hf import read_hf_state, write_hf
    from plait.models.spec import model_spec

    spec = model_spec(None, family=family, layers=2, hidden=64, heads=4, kv_heads=kv_heads, vocab=256, seq_len=128,
                      tie_embeddings=tied)
    model = Transformer(spec)
    with torch.no_grad():  # every weight its own random values, so no misplaced tensor goes unseen
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode()))) / 8)
    write_hf(spec, model.state_dict(), tmp_path)
    back = read_hf_state(tmp_path, spec)
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[name], value) for name, value in model.state_dict().items())
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    ids = torch.randint(0, 256, (1, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max().item() <= 1e-5


def test_greedy_sampling_is_the_exported_models_argmax(exported, capsys):
    from transformers import AutoModelForCausalLM

    run, folder, _, _ = exported["tiny"]
    hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    prompt, new = "def ", 12
    ids = list(prompt.encode())
    with torch.no_grad():
        for _ in range(new):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", prompt, "--max-tokens", str(new), "--temperature", "0"]) == 0
    assert capsys.readouterr().out == bytes(ids).decode("utf-8", errors="replace") + "\n"


def test_top_1_sampling_at_any_temperature_is_greedy(exported):
    from plait.sample import generate
    from plait.train.full_model import load_run_model

    model, _ = load_run_model(exported["tiny-llama"][0])
    prompt = list(b"import ")
    assert generate(model, prompt, 8, temperature=1.5, top_k=1, seed=3) == generate(model, prompt, 8, temperature=0)


def test_bad_interop_input_is_refused_in_one_line(exported, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run, folder, _, _ = exported["tiny-llama"]
    assert_refused_in_one_line(["export", str(tmp_path), "--to", str(tmp_path / "out")],
                               "holds no complete checkpoint", capsys, tmp_path)
    assert_refused_in_one_line(["export", str(run), "--to", str(folder)], "already holds config.json", capsys, tmp_path)
    assert_refused_in_one_line(["train", "--model", "tiny", "--dp", "1", "--init-from", str(folder), "--dry-run"],
                               "describes another model: family llama (run: gpt2)", capsys, tmp_path)
    assert_refused_in_one_line(["train", "--model", "tiny-llama", "--dp", "1", "--init-from", str(tmp_path),
                                "--dry-run"], "holds no config.json and model.safetensors", capsys, tmp_path)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    shutil.copy(folder / "config.json", damaged)
    (damaged / "model.safetensors").write_bytes(b"not a safetensors file")
    assert_refused_in_one_line(["train", "--model", "tiny-llama", "--seq-len", "64", "--dp", "1", "--init-from",
                                str(damaged), "--dry-run"], "is not a readable safetensors file", capsys, tmp_path)
    assert_refused_in_one_line(["sample", str(run), "--prompt", "", "--temperature", "0"], "--prompt is empty",
                               capsys, tmp_path)
    with pytest.raises(ConfigError, match="holds byte 195 but the model's vocabulary has only 128 tokens"):
        encode_bytes("é", vocab=128)
