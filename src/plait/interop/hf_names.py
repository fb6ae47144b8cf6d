"""plait's parameter names and shapes ↔ Hugging Face's ``GPT2LMHeadModel`` and ``LlamaForCausalLM``.

Two conventions differ beyond the names:

- GPT-2's ``Conv1D`` stores its weight as (in, out), the transpose of ``nn.Linear``, and holds q, k
  and v in one ``c_attn`` (columns q | k | v).
- plait rotates interleaved pairs of each head's dimensions (2j, 2j+1), Meta's original
  convention; Hugging Face's Llama rotates halves (j, j + head_dim/2). The rows of q and k are
  permuted per head between the two (the permutation of ``convert_llama_weights_to_hf.py``), so
  both compute the same attention.

Pure tensor reshuffles, each the exact inverse of the other: no arithmetic touches a value.
"""

from __future__ import annotations

import torch

from plait.models.spec import ModelSpec

Tensors = dict[str, torch.Tensor]


def interleaved_to_halves(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q or k projection, per head, from interleaved rotary pairs to rotated halves."""
    rows, columns = weight.shape[0], weight.shape[1:]
    return weight.reshape(heads, rows // heads // 2, 2, *columns).transpose(1, 2).reshape(rows, *columns)


def halves_to_interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    rows, columns = weight.shape[0], weight.shape[1:]
    return weight.reshape(heads, 2, rows // heads // 2, *columns).transpose(1, 2).reshape(rows, *columns)


def _gpt2_to_hf(spec: ModelSpec, state: Tensors) -> Tensors:
    out = {"transformer.wte.weight": state["tok_embeddings.weight"],
           "transformer.wpe.weight": state["pos_embeddings.weight"],
           "transformer.ln_f.weight": state["norm.weight"], "transformer.ln_f.bias": state["norm.bias"]}
    for i in range(spec.layers):
        ours, theirs = f"layers.{i}.", f"transformer.h.{i}."
        for part in ("weight", "bias"):
            out[f"{theirs}ln_1.{part}"] = state[f"{ours}attention_norm.{part}"]
            out[f"{theirs}ln_2.{part}"] = state[f"{ours}mlp_norm.{part}"]
        qkv = [state[f"{ours}attention.{w}.weight"] for w in ("wq", "wk", "wv")]
        out[f"{theirs}attn.c_attn.weight"] = torch.cat(qkv).t()
        out[f"{theirs}attn.c_attn.bias"] = torch.cat([state[f"{ours}attention.{w}.bias"] for w in ("wq", "wk", "wv")])
        for plait_name, hf_name in (("attention.wo", "attn.c_proj"), ("mlp.w1", "mlp.c_fc"), ("mlp.w2", "mlp.c_proj")):
            out[f"{theirs}{hf_name}.weight"] = state[f"{ours}{plait_name}.weight"].t()
            out[f"{theirs}{hf_name}.bias"] = state[f"{ours}{plait_name}.bias"]
    if not spec.tie_embeddings:
        out["lm_head.weight"] = state["output.weight"]
    return out


def _gpt2_from_hf(spec: ModelSpec, tensors: Tensors) -> Tensors:
    state = {"tok_embeddings.weight": tensors["transformer.wte.weight"],
             "pos_embeddings.weight": tensors["transformer.wpe.weight"],
             "norm.weight": tensors["transformer.ln_f.weight"], "norm.bias": tensors["transformer.ln_f.bias"]}
    for i in range(spec.layers):
        ours, theirs = f"layers.{i}.", f"transformer.h.{i}."
        for part in ("weight", "bias"):
            state[f"{ours}attention_norm.{part}"] = tensors[f"{theirs}ln_1.{part}"]
            state[f"{ours}mlp_norm.{part}"] = tensors[f"{theirs}ln_2.{part}"]
        q, k, v = tensors[f"{theirs}attn.c_attn.weight"].t().split([spec.hidden, spec.kv_dim, spec.kv_dim])
        qb, kb, vb = tensors[f"{theirs}attn.c_attn.bias"].split([spec.hidden, spec.kv_dim, spec.kv_dim])
        for name, weight, bias in (("wq", q, qb), ("wk", k, kb), ("wv", v, vb)):
            state[f"{ours}attention.{name}.weight"], state[f"{ours}attention.{name}.bias"] = weight, bias
        for plait_name, hf_name in (("attention.wo", "attn.c_proj"), ("mlp.w1", "mlp.c_fc"), ("mlp.w2", "mlp.c_proj")):
            state[f"{ours}{plait_name}.weight"] = tensors[f"{theirs}{hf_name}.weight"].t()
            state[f"{ours}{plait_name}.bias"] = tensors[f"{theirs}{hf_name}.bias"]
    if not spec.tie_embeddings:
        state["output.weight"] = tensors["lm_head.weight"]
    return state


# plait's name inside a Llama block → Hugging Face's, both after "layers.{i}."
LLAMA_BLOCK = {
    "attention_norm.weight": "input_layernorm.weight", "mlp_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight", "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight", "attention.wo.weight": "self_attn.o_proj.weight",
    "mlp.w1.weight": "mlp.gate_proj.weight", "mlp.w3.weight": "mlp.up_proj.weight",
    "mlp.w2.weight": "mlp.down_proj.weight",
}


def _rotary_rows(spec: ModelSpec, name: str, weight: torch.Tensor, permute) -> torch.Tensor:
    if name.endswith("wq.weight"):
        return permute(weight, spec.heads)
    if name.endswith("wk.weight"):
        return permute(weight, spec.kv_heads)
    return weight


def _llama_to_hf(spec: ModelSpec, state: Tensors) -> Tensors:
    out = {"model.embed_tokens.weight": state["tok_embeddings.weight"], "model.norm.weight": state["norm.weight"]}
    for i in range(spec.layers):
        for ours, theirs in LLAMA_BLOCK.items():
            weight = state[f"layers.{i}.{ours}"]
            out[f"model.layers.{i}.{theirs}"] = _rotary_rows(spec, ours, weight, interleaved_to_halves)
    if not spec.tie_embeddings:
        out["lm_head.weight"] = state["output.weight"]
    return out


def _llama_from_hf(spec: ModelSpec, tensors: Tensors) -> Tensors:
    state = {"tok_embeddings.weight": tensors["model.embed_tokens.weight"], "norm.weight": tensors["model.norm.weight"]}
    for i in range(spec.layers):
        for ours, theirs in LLAMA_BLOCK.items():
            weight = tensors[f"model.layers.{i}.{theirs}"]
            state[f"layers.{i}.{ours}"] = _rotary_rows(spec, ours, weight, halves_to_interleaved)
    if not spec.tie_embeddings:
        state["output.weight"] = tensors["lm_head.weight"]
    return state


def to_hf(spec: ModelSpec, state: Tensors) -> Tensors:
    """plait's full state dict → Hugging Face's tensors (contiguous, ready for safetensors)."""
    convert = _gpt2_to_hf if spec.family == "gpt2" else _llama_to_hf
    return {name: value.contiguous() for name, value in convert(spec, state).items()}


def from_hf(spec: ModelSpec, tensors: Tensors) -> Tensors:
    """Hugging Face's tensors → plait's full state dict; KeyError names a tensor the file lacks."""
    convert = _gpt2_from_hf if spec.family == "gpt2" else _llama_from_hf
    return {name: value.contiguous() for name, value in convert(spec, tensors).items()}
