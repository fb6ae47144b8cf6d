"""Hugging Face's file layout: ``config.json`` and ``model.safetensors``, read and written as data.

``plait export`` writes a run's weights as the ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` of the
same shape; ``plait train --init-from DIR`` starts from such a folder. Both files are data: JSON
and safetensors (a header and raw tensors), nothing in them is ever executed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from plait.errors import ConfigError
from plait.interop.hf_names import Tensors, from_hf, to_hf
from plait.models.spec import ModelSpec

CONFIG_JSON = "config.json"
WEIGHTS_FILE = "model.safetensors"
GPT2_END_OF_TEXT = 50256
GPT2_VOCABS = (50257, 50304)  # GPT-2's own vocabulary, and nanoGPT's padding of it to a multiple of 64


def hf_config(spec: ModelSpec) -> dict:
    """The ``config.json`` of the Hugging Face model that computes what ``spec`` computes."""
    if spec.parallel_block:
        raise ConfigError("Hugging Face's GPT-2 and Llama run attention and MLP one after the other, and this model runs "
                          "them side by side (--parallel-block); it cannot be exported to them")
    if spec.family == "gpt2":
        if spec.kv_heads != spec.heads:
            raise ConfigError(f"Hugging Face's GPT-2 has no grouped-query attention, and this model has {spec.kv_heads} "
                              f"kv-heads for {spec.heads} heads; export a model with kv-heads = heads")
        return {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": spec.vocab,
            "n_positions": spec.seq_len, "n_embd": spec.hidden, "n_layer": spec.layers, "n_head": spec.heads,
            "n_inner": spec.ffn_hidden, "activation_function": "gelu_new", "layer_norm_epsilon": spec.norm_eps,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": spec.tie_embeddings,
            # GPT-2's end-of-text id where the vocabulary is GPT-2's; plait knows no special tokens otherwise.
            **{key: GPT2_END_OF_TEXT if spec.vocab in GPT2_VOCABS else None for key in ("bos_token_id", "eos_token_id")},
            "torch_dtype": "float32",
        }
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": spec.vocab,
        "hidden_size": spec.hidden, "intermediate_size": spec.ffn_hidden, "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.head_dim,
        "hidden_act": "silu", "max_position_embeddings": spec.seq_len, "rms_norm_eps": spec.norm_eps,
        # transformers 5 reads rope_parameters, earlier releases rope_theta: both say the same.
        "rope_theta": spec.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": spec.tie_embeddings,
        "bos_token_id": None, "eos_token_id": None, "torch_dtype": "float32",
    }


def _refuse(path: Path, what: str) -> ConfigError:
    return ConfigError(f"{path} {what}, which plait's transformer does not compute; use weights of a plain "
                       "GPT-2 or Llama architecture")


def spec_from_hf_config(path: Path) -> ModelSpec:
    """The plait model a Hugging Face ``config.json`` describes; ConfigError for what plait cannot run."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"{path} is not a readable JSON file ({error}); pass a folder written by plait export "
                          "or a Hugging Face model folder") from None
    kind = config.get("model_type") if isinstance(config, dict) else None
    try:
        if kind == "gpt2":
            if config.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
                raise _refuse(path, f"uses the activation {config['activation_function']!r} (plait: tanh GELU)")
            hidden = config["n_embd"]
            return ModelSpec("gpt2", config["n_layer"], hidden, config["n_head"], config["n_head"],
                             config.get("n_inner") or 4 * hidden, config["vocab_size"], config["n_positions"],
                             tie_embeddings=config.get("tie_word_embeddings", True),
                             norm_eps=config.get("layer_norm_epsilon", 1e-5))
        if kind == "llama":
            rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                raise _refuse(path, f"scales its rotary positions ({rope.get('rope_type', rope.get('type'))!r})")
            if config.get("hidden_act", "silu") != "silu" or config.get("attention_bias") or config.get("mlp_bias"):
                raise _refuse(path, "has biases or a gate other than SiLU")
            heads = config["num_attention_heads"]
            if (config.get("head_dim") or config["hidden_size"] // heads) * heads != config["hidden_size"]:
                raise _refuse(path, "has a head dimension other than hidden size / heads")
            return ModelSpec("llama", config["num_hidden_layers"], config["hidden_size"], heads,
                             config.get("num_key_value_heads") or heads, config["intermediate_size"],
                             config["vocab_size"], config["max_position_embeddings"],
                             tie_embeddings=config.get("tie_word_embeddings", False),
                             rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
                             norm_eps=config.get("rms_norm_eps", 1e-6))
    except KeyError as error:
        raise ConfigError(f"{path} lacks the field {error.args[0]!r} of a {kind} config") from None
    raise ConfigError(f"{path} describes a {kind!r} model; plait reads the model types 'gpt2' and 'llama'")


def write_hf(spec: ModelSpec, state: Tensors, folder: Path) -> None:
    """Write ``state`` (plait's full fp32 state dict) into ``folder`` as config.json and model.safetensors;
    each file goes in whole (written aside, then renamed)."""
    from safetensors.torch import save_file

    config = hf_config(spec)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / (WEIGHTS_FILE + ".partial")
    save_file({name: value.float() for name, value in to_hf(spec, state).items()}, str(weights),
              metadata={"format": "pt"})
    os.replace(weights, folder / WEIGHTS_FILE)
    text = folder / (CONFIG_JSON + ".partial")
    text.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(text, folder / CONFIG_JSON)


def expected_hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor the Hugging Face file of ``spec`` holds, with its shape (built on the meta device)."""
    from plait.models.transformer import Transformer

    with torch.device("meta"):
        state = Transformer(spec).state_dict()
    return {name: tuple(value.shape) for name, value in to_hf(spec, state).items()}


def _with_gpt2_prefix(spec: ModelSpec, tensors: dict) -> dict:
    """The Hub's stock GPT-2 files name their tensors without ``transformer.`` (``wte.weight``, ``h.0.…``);
    give them the prefix plait's export writes, so either spelling reads the same (``lm_head.…`` has none)."""
    if spec.family != "gpt2" or "transformer.wte.weight" in tensors or "wte.weight" not in tensors:
        return tensors
    return {name if name.startswith("lm_head.") else f"transformer.{name}": value for name, value in tensors.items()}


def check_hf_folder(folder: Path, spec: ModelSpec) -> None:
    """Refuse, in one sentence, a folder whose config or tensors do not describe ``spec``; reads only the
    safetensors header, so it is quick for any size."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    if not (folder / CONFIG_JSON).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise ConfigError(f"--init-from {folder} holds no {CONFIG_JSON} and {WEIGHTS_FILE}; pass a folder written by "
                          "`plait export RUN --to DIR` or a Hugging Face GPT-2 or Llama folder")
    theirs = spec_from_hf_config(folder / CONFIG_JSON)
    differ = [f"{name} {getattr(theirs, name)} (run: {getattr(spec, name)})"
              for name in ("family", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len",
                           "tie_embeddings", "rope_theta", "norm_eps") if getattr(theirs, name) != getattr(spec, name)]
    if differ:
        raise ConfigError(f"{folder / CONFIG_JSON} describes another model: {', '.join(differ)}; train the model it "
                          "describes (--model or --family/--layers/--hidden/... flags matching it)")
    try:
        with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as weights:
            held = _with_gpt2_prefix(spec, {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()})
    except (SafetensorError, OSError) as error:
        raise ConfigError(f"{folder / WEIGHTS_FILE} is not a readable safetensors file ({error})") from None
    for name, shape in expected_hf_shapes(spec).items():
        if held.get(name) != shape:
            found = "missing" if name not in held else f"of shape {list(held[name])}"
            raise ConfigError(f"{folder / WEIGHTS_FILE}: tensor {name} is {found}, expected shape {list(shape)}; "
                              "the weights do not match their config.json")


def check_init_from(config) -> None:
    """``check_hf_folder`` for the run's --init-from (a ``RunConfig``), if it has one, before any worker starts."""
    if config.train.init_from:
        check_hf_folder(Path(config.train.init_from), config.model)


def read_hf_state(folder: Path, spec: ModelSpec) -> Tensors:
    """plait's full fp32 state dict from a folder ``check_hf_folder`` accepted."""
    from safetensors.torch import load_file

    tensors = _with_gpt2_prefix(spec, load_file(str(Path(folder) / WEIGHTS_FILE)))
    return {name: value.float() for name, value in from_hf(spec, tensors).items()}
