"""A Hugging Face folder's ``config.json``, both ways, and the run's model taken from it (no torch).

``plait export`` writes the ``config.json`` of the ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` that
computes what a run's model computes. ``plait train --init-from DIR`` reads DIR's ``config.json``
into the run's model: the flags and the config file need not restate it, and may not contradict
it. A shorter ``--seq-len`` than the folder's position count is allowed (GPT-2 then reads the
first rows of its learned positions). This runs before torch is imported, as every check of
``plait train`` does.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from plait.errors import ConfigError
from plait.models.spec import ModelSpec

CONFIG_JSON = "config.json"
WEIGHTS_FILE = "model.safetensors"  # the weights in one file
WEIGHTS_INDEX = "model.safetensors.index.json"  # or sharded: which shard holds each tensor
GPT2_END_OF_TEXT = 50256
GPT2_VOCABS = (50257, 50304)  # GPT-2's own vocabulary, and nanoGPT's padding of it to a multiple of 64
HF_MODEL_TYPES = ("gpt2", "llama")  # the Hugging Face models whose files plait lays out (plait.interop.hf_names)


def hf_config(spec: ModelSpec) -> dict:
    """The ``config.json`` of the Hugging Face model that computes what ``spec`` computes."""
    if spec.hf_model_type not in HF_MODEL_TYPES:
        raise ConfigError(f"the {spec.family} block is Hugging Face's {spec.hf_model_type!r}, whose files plait does "
                          f"not lay out (only {' and '.join(HF_MODEL_TYPES)}'s); it cannot be exported")
    if spec.parallel_block:
        raise ConfigError("Hugging Face's GPT-2 and Llama run attention and MLP one after the other, and this model runs "
                          "them side by side (--parallel-block); it cannot be exported to them")
    if spec.hf_model_type == "gpt2":
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


def _rope(path: Path, config: dict) -> dict:
    """A Llama config's rotary settings (``rope_parameters``, or ``rope_scaling`` before transformers 5)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"{path} gives rope_parameters (or rope_scaling) {rope!r}, which is not a JSON object "
                          'such as {"rope_type": "default", "rope_theta": 10000.0}; correct its config.json')
    return rope


def spec_from_hf_config(path: Path) -> ModelSpec:
    """The plait model a Hugging Face ``config.json`` describes; ConfigError for what plait cannot run."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:  # nested past Python's depth
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
            rope = _rope(path, config)
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                raise _refuse(path, f"scales its rotary positions ({rope.get('rope_type', rope.get('type'))!r})")
            if config.get("hidden_act", "silu") != "silu" or config.get("attention_bias") or config.get("mlp_bias"):
                raise _refuse(path, "has biases or a gate other than SiLU")
            heads = config["num_attention_heads"]
            if not isinstance(heads, int) or heads <= 0:
                raise ConfigError(f"{path} gives num_attention_heads {heads!r}; a Llama model needs a positive "
                                  "whole number of heads, so correct its config.json")
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


def require_hf_folder(folder: Path) -> None:
    """Refuse a folder without a ``config.json`` and weights (one file, or shards with their index)."""
    folder = Path(folder)
    if not (folder / CONFIG_JSON).is_file() or not any((folder / name).is_file() for name in (WEIGHTS_FILE,
                                                                                              WEIGHTS_INDEX)):
        raise ConfigError(f"--init-from {folder} holds no {CONFIG_JSON} and {WEIGHTS_FILE} (or {WEIGHTS_INDEX} "
                          "with its shards); pass a folder written by `plait export RUN --to DIR` or a Hugging Face "
                          "GPT-2 or Llama folder")


def disagreements(folder_model: ModelSpec, stated: dict) -> list[str]:
    """Each value of ``stated`` (model fields the run asks for) that the folder's model contradicts, naming both.
    A sequence length up to the folder's is no contradiction: the run then uses the first positions."""
    found = []
    for name, value in stated.items():
        theirs = getattr(folder_model, name)
        if value == theirs or (name == "seq_len" and isinstance(value, int) and 0 < value < theirs):
            continue
        found.append(f"{name} {'at most ' if name == 'seq_len' else ''}{theirs} (run: {value})")
    return found


def check_model_fits(folder: Path, folder_model: ModelSpec, stated: dict) -> None:
    differ = disagreements(folder_model, stated)
    if differ:
        raise ConfigError(f"{Path(folder) / CONFIG_JSON} describes another model: {', '.join(differ)}; leave those "
                          "model settings out (--init-from takes the model from its config.json) or make them agree")


def init_from_model(folder: Path, stated: dict) -> ModelSpec:
    """The run's model for ``--init-from folder``: the folder's ``config.json``, with the run's sequence
    length where ``stated`` (the model fields the flags, the config file or a preset give) shortens it;
    ConfigError naming both values where ``stated`` contradicts the folder."""
    require_hf_folder(folder)
    folder_model = spec_from_hf_config(Path(folder) / CONFIG_JSON)
    folder_model.validate()
    check_model_fits(folder, folder_model, stated)
    return replace(folder_model, seq_len=stated.get("seq_len", folder_model.seq_len))
