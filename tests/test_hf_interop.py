"""Hugging Face interop: a run saved under a 3-D layout is exported in shards, ``transformers`` (built from
the exported config.json alone, local files only) computes the same logits, ``--init-from`` the export under
another layout starts at the exporting model's loss, any region of a parameter reads only its slice of the
files, the run takes its model from the folder's config.json, and ``plait sample`` decodes greedily what
the exported model's argmax gives.

The reference weights come from torch's own ``dcp_to_torch_save``, not from plait's loader."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import zlib
from pathlib import Path

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
SHARD = "1MB"  # a tiny model's 3.3 MB of fp32 weights in four shards
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
        assert main(["export", str(root / "run"), "--to", str(root / "hf"), "--max-shard-size", SHARD]) == 0
        dcp_to_torch_save(latest_checkpoint(root / "run"), root / "full.pt")
        reference = Transformer(config.model)
        reference.load_state_dict(torch.load(root / "full.pt", weights_only=True)["model"])
        runs[model] = (root / "run", root / "hf", reference.eval(), config)
    return runs


@pytest.mark.parametrize("model", LAYOUTS)
def test_transformers_loads_the_export_and_computes_the_same_logits(exported, model):
    from transformers import AutoModelForCausalLM

    _, folder, reference, _ = exported[model]
    shards = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values()
    assert len(set(shards)) >= 2 and not (folder / "model.safetensors").exists()
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
    from plait.interop.hf_config import hf_config
    from plait.models.spec import model_spec

    config = hf_config(model_spec(None, family="gpt2", layers=1, hidden=32, heads=2, vocab=vocab, seq_len=16))
    assert config["bos_token_id"] == config["eos_token_id"] == end_of_text


def test_a_llama_config_whose_head_dim_is_null_reads_as_without_one(tmp_path):
    from plait.interop.hf_config import hf_config, spec_from_hf_config
    from plait.models.spec import model_spec

    spec = model_spec(None, family="llama", layers=1, hidden=32, heads=2, kv_heads=1, vocab=64, seq_len=16)
    (tmp_path / "config.json").write_text(json.dumps({**hf_config(spec), "head_dim": None}))
    assert spec_from_hf_config(tmp_path / "config.json") == spec


def random_state(spec) -> dict[str, torch.Tensor]:
    """Every parameter its own random values, so no misplaced tensor or row goes unseen."""
    return {name: torch.randn(param.shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode()))) / 8
            for name, param in Transformer(spec).named_parameters()}


def write_folder(spec, state: dict, folder: Path, max_shard_bytes: int = 10**9) -> list[str]:
    from plait.interop.hf_export import write_hf

    return write_hf(spec, lambda name, shape: state[name], folder, max_shard_bytes)


def read_whole(folder: Path, spec) -> dict[str, torch.Tensor]:
    from plait.interop.hf import hf_weight_source
    from plait.models.init import whole

    source = hf_weight_source(folder, spec)
    return {name: source(name, tuple(param.shape), whole(tuple(param.shape)))
            for name, param in Transformer(spec).named_parameters()}


class CountingSafeOpen:
    """safetensors' ``safe_open``, counting the values every ``get_slice(name)[index]`` returns."""

    def __init__(self, safe_open):
        self.safe_open, self.values = safe_open, 0

    def __call__(self, *args, **kwargs):
        counter, opened = self, self.safe_open(*args, **kwargs)

        class Counted:
            def __enter__(self):
                self.file = opened.__enter__()
                return self

            def __exit__(self, *exc):
                return opened.__exit__(*exc)

            def keys(self):
                return self.file.keys()

            def get_slice(self, name):
                stored = self.file.get_slice(name)

                class Slice:
                    def __getitem__(self, index):
                        values = stored[index]
                        counter.values += values.numel()
                        return values

                    def get_shape(self):
                        return stored.get_shape()

                    def get_dtype(self):
                        return stored.get_dtype()

                return Slice()

        return Counted()


def random_region(shape: tuple[int, ...], rng: random.Random) -> tuple[tuple[int, int], ...]:
    region = []
    for size in shape:
        start = rng.randrange(size)
        region.append((start, rng.randrange(start + 1, size + 1)))
    return tuple(region)


def values_read(spec, name: str, region) -> int:
    """What a region costs to read: itself, or for Llama's q and k the rows of the whole heads it touches."""
    (start, stop), *columns = region
    if spec.family == "llama" and name.endswith(("wq.weight", "wk.weight")):
        start, stop = start // spec.head_dim * spec.head_dim, -(-stop // spec.head_dim) * spec.head_dim
    return (stop - start) * math.prod(last - first for first, last in columns)


@pytest.mark.parametrize("family, kv_heads", [("gpt2", 4), ("llama", 2)])
@pytest.mark.parametrize("max_shard_bytes", [10**9, 30_000], ids=["one file", "shards"])
def test_any_region_of_a_parameter_is_its_slice_of_the_whole_and_reads_only_that(
        tmp_path, monkeypatch, family, kv_heads, max_shard_bytes):
    import safetensors

    from plait.interop.hf import check_hf_folder, hf_weight_source
    from plait.models.spec import model_spec

    spec = model_spec(None, family=family, layers=2, hidden=64, heads=4, kv_heads=kv_heads, vocab=96, seq_len=32,
                      tie_embeddings=False)
    state = random_state(spec)
    files = write_folder(spec, state, tmp_path, max_shard_bytes)
    assert (len(files) > 2) == (max_shard_bytes < 10**9)
    check_hf_folder(tmp_path, spec)
    counting = CountingSafeOpen(safetensors.safe_open)
    monkeypatch.setattr(safetensors, "safe_open", counting)
    source, rng = hf_weight_source(tmp_path, spec), random.Random(f"{family}{max_shard_bytes}")
    for name, value in state.items():
        for _ in range(8):
            region = random_region(tuple(value.shape), rng)
            counting.values = 0
            read = source(name, tuple(value.shape), region)
            assert read.dtype == torch.float32 and read.is_contiguous()
            assert torch.equal(read, value[tuple(slice(start, stop) for start, stop in region)]), (name, region)
            assert counting.values == values_read(spec, name, region), (name, region)


def test_init_from_reads_a_stock_gpt2_folder_whose_names_lack_the_transformer_prefix(tmp_path):
    """The Hub's GPT-2 files say ``wte.weight``, ``h.0.…``; --init-from's check and read accept them as plait's own."""
    from safetensors.torch import load_file, save_file

    from plait.interop.hf import check_hf_folder
    from plait.models.spec import model_spec

    spec = model_spec(None, family="gpt2", layers=1, hidden=32, heads=2, vocab=64, seq_len=16, tie_embeddings=False)
    state = random_state(spec)
    write_folder(spec, state, tmp_path)
    weights = tmp_path / "model.safetensors"
    save_file({name.removeprefix("transformer."): value for name, value in load_file(str(weights)).items()},
              str(weights), metadata={"format": "pt"})
    check_hf_folder(tmp_path, spec)
    back = read_whole(tmp_path, spec)
    assert back.keys() == state.keys() and all(torch.equal(back[name], value) for name, value in state.items())


@pytest.mark.parametrize("family, tied, kv_heads", [("gpt2", True, 4), ("gpt2", False, 4), ("llama", True, 1),
                                                   ("llama", False, 2)])
def test_tied_and_untied_embeddings_of_both_families_round_trip(tmp_path, family, tied, kv_heads):
    """Weights written and read back are plait's bit for bit, and transformers computes their logits."""
    from transformers import AutoModelForCausalLM

    from plait.models.spec import model_spec

    spec = model_spec(None, family=family, layers=2, hidden=64, heads=4, kv_heads=kv_heads, vocab=256, seq_len=128,
                      tie_embeddings=tied)
    model = Transformer(spec)
    model.load_state_dict(random_state(spec))
    write_folder(spec, model.state_dict(), tmp_path)
    back = read_whole(tmp_path, spec)
    assert back.keys() == model.state_dict().keys()
    assert all(torch.equal(back[name], value) for name, value in model.state_dict().items())
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    ids = torch.randint(0, 256, (1, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max().item() <= 1e-5


def resolved(*argv: str):
    from plait.cli import build_parser
    from plait.config import config_from_args

    return config_from_args(build_parser().parse_args(["train", *argv]), on_gpu=False)


def test_the_run_takes_its_model_from_the_init_from_folder_and_may_shorten_its_sequence(exported):
    """Nothing restated: the folder's config.json is the model. A shorter --seq-len reads GPT-2's first positions."""
    from plait.interop.hf import check_init_from, hf_weight_source
    from plait.models.init import whole

    for model, (_, folder, reference, _) in exported.items():
        config = resolved("--init-from", str(folder), "--dp", "1", "--global-batch", "2")
        assert config.model == reference.spec
        agreeing = resolved("--init-from", str(folder), "--model", model, "--seq-len", "64", "--dp", "1")
        assert agreeing.model == reference.spec
    _, folder, reference, _ = exported["tiny"]
    config = resolved("--init-from", str(folder), "--seq-len", "16", "--dp", "1", "--global-batch", "2")
    assert config.model == dataclasses.replace(reference.spec, seq_len=16)
    check_init_from(config)
    positions = hf_weight_source(folder, config.model)("pos_embeddings.weight", (16, 128), whole((16, 128)))
    assert torch.equal(positions, reference.pos_embeddings.weight[:16])


def test_the_export_in_bf16_holds_the_weights_rounded_and_a_bytes_run_says_it_has_no_tokenizer(
        exported, tmp_path, capsys):
    from safetensors.torch import load_file

    run, _, reference, _ = exported["tiny-llama"]
    capsys.readouterr()
    assert main(["export", str(run), "--to", str(tmp_path / "bf16"), "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "bf16" in out and "the run read raw bytes" in out and "holds no tokenizer" in out
    assert sorted(path.name for path in (tmp_path / "bf16").iterdir()) == ["config.json", "model.safetensors"]
    written = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert all(value.dtype == torch.bfloat16 for value in written.values())
    assert torch.equal(written["model.embed_tokens.weight"], reference.tok_embeddings.weight.bfloat16())
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("text, size", [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30), ("123", 123),
                                        ("64 kb", 64_000)])
def test_shard_sizes_read_as_save_pretrained_reads_them(text, size):
    from plait.interop.hf_export import parse_size

    assert parse_size(text) == size


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


def test_model_settings_that_contradict_the_init_from_folder_are_refused_naming_both(exported, tmp_path, capsys,
                                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = str(exported["tiny-llama"][1])
    (tmp_path / "shallow.toml").write_text("[model]\nlayers = 2\n")
    for argv, expected in ((["--hidden", "64"], "describes another model: hidden 128 (run: 64)"),
                           (["--config", "shallow.toml"], "describes another model: layers 4 (run: 2)"),
                           (["--seq-len", "128"], "describes another model: seq_len at most 64 (run: 128)"),
                           (["--tie-embeddings"], "tie_embeddings False (run: True)")):
        assert_refused_in_one_line(["train", "--init-from", folder, "--dp", "1", *argv], expected, capsys, tmp_path)


def _without_a_shard(folder: Path) -> None:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    (folder / max(index["weight_map"].values())).unlink()


def _with_a_tensor_out_of_its_shard(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = folder / index["weight_map"]["model.norm.weight"]
    save_file({name: value for name, value in load_file(str(shard)).items() if name != "model.norm.weight"},
              str(shard), metadata={"format": "pt"})


def _with_a_tensor_out_of_the_index(folder: Path) -> None:
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    del index["weight_map"]["model.norm.weight"]
    index_file.write_text(json.dumps(index))


DAMAGED_SHARDS = {
    "index not JSON": (lambda folder: (folder / "model.safetensors.index.json").write_text("{weight_map"),
                       "model.safetensors.index.json is not a readable JSON file"),
    "index without a weight map": (lambda folder: (folder / "model.safetensors.index.json").write_text("[]"),
                                   "has no weight_map of tensor names to shard files"),
    "a shard missing": (_without_a_shard, "names the shard 'model-00004-of-00004.safetensors', which is not a file"),
    "a tensor missing from its shard": (_with_a_tensor_out_of_its_shard,
                                        ("places the tensor model.norm.weight in model-00004-of-00004.safetensors, "
                                         "which does not hold it")),
    "a tensor missing from the index": (_with_a_tensor_out_of_the_index, "tensor model.norm.weight is missing"),
}


@pytest.mark.parametrize("case", list(DAMAGED_SHARDS))
def test_a_damaged_sharded_folder_is_refused_in_one_line(exported, tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    damage, expected = DAMAGED_SHARDS[case]
    folder = tmp_path / "hf"
    shutil.copytree(exported["tiny-llama"][1], folder)
    damage(folder)
    assert_refused_in_one_line(["train", "--init-from", str(folder), "--dp", "1", "--dry-run"], expected, capsys,
                               tmp_path)
