"""plait's parameters ↔ the tensors of Hugging Face's ``GPT2LMHeadModel`` and ``LlamaForCausalLM``.

Two conventions differ beyond the names:

- GPT-2's ``Conv1D`` stores its weight as (in, out), the transpose of ``nn.Linear``, and holds q, k
  and v in one ``c_attn`` (columns q | k | v).
- plait rotates interleaved pairs of each head's dimensions (2j, 2j+1), Meta's original
  convention; Hugging Face's Llama rotates halves (j, j + head_dim/2). The rows of q and k are
  permuted per head between the two (the permutation of ``convert_llama_weights_to_hf.py``), so
  both compute the same attention.

``placements`` is the one table of both: where each plait parameter lies in a Hugging Face tensor.
The export builds a Hugging Face tensor a block of rows at a time from the parameters placed in it
(``hf_rows``); ``--init-from`` reads any region of a parameter from just the slice of its Hugging
Face tensor that holds it (``region_from_hf``). Pure reshuffles, each the exact inverse of the
other: no arithmetic touches a value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from plait.models.init import Region
from plait.models.spec import ModelSpec
from plait.models.transformer import Transformer


@dataclass(frozen=True)
class Placement:
    """Where one plait parameter lies in a Hugging Face tensor."""

    hf_name: str
    first_row: int = 0  # its first row among the tensor's rows in plait's orientation (c_attn: q | k | v)
    transposed: bool = False  # GPT-2's Conv1D stores (in, out): plait's rows are the file's columns
    rotary_head_dim: int = 0  # Llama's q and k: rows permuted within each head of this many rows (0: none)


def interleaved_to_halves(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of a q or k projection, per head of ``head_dim`` rows, from interleaved rotary pairs to rotated halves."""
    rows, columns = weight.shape[0], weight.shape[1:]
    return weight.reshape(rows // head_dim, head_dim // 2, 2, *columns).transpose(1, 2).reshape(rows, *columns)


def halves_to_interleaved(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    rows, columns = weight.shape[0], weight.shape[1:]
    return weight.reshape(rows // head_dim, 2, head_dim // 2, *columns).transpose(1, 2).reshape(rows, *columns)


# plait's name inside a GPT-2 block → Hugging Face's Conv1D, both after the block's prefix
GPT2_CONV1D = {"attention.wo": "attn.c_proj", "mlp.w1": "mlp.c_fc", "mlp.w2": "mlp.c_proj"}
# plait's name inside a Llama block → Hugging Face's, both after "layers.{i}."
LLAMA_BLOCK = {
    "attention_norm.weight": "input_layernorm.weight", "mlp_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight", "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight", "attention.wo.weight": "self_attn.o_proj.weight",
    "mlp.w1.weight": "mlp.gate_proj.weight", "mlp.w3.weight": "mlp.up_proj.weight",
    "mlp.w2.weight": "mlp.down_proj.weight",
}


def _gpt2_block(spec: ModelSpec, ours: str, theirs: str) -> dict[str, Placement]:
    placed = {}
    for part in ("weight", "bias"):
        placed[f"{ours}attention_norm.{part}"] = Placement(f"{theirs}ln_1.{part}")
        placed[f"{ours}mlp_norm.{part}"] = Placement(f"{theirs}ln_2.{part}")
    for name, first_row in (("wq", 0), ("wk", spec.hidden), ("wv", spec.hidden + spec.kv_dim)):
        placed[f"{ours}attention.{name}.weight"] = Placement(f"{theirs}attn.c_attn.weight", first_row, transposed=True)
        placed[f"{ours}attention.{name}.bias"] = Placement(f"{theirs}attn.c_attn.bias", first_row)
    for plait_name, hf_name in GPT2_CONV1D.items():
        placed[f"{ours}{plait_name}.weight"] = Placement(f"{theirs}{hf_name}.weight", transposed=True)
        placed[f"{ours}{plait_name}.bias"] = Placement(f"{theirs}{hf_name}.bias")
    return placed


def _gpt2_placements(spec: ModelSpec) -> dict[str, Placement]:
    placed = {"tok_embeddings.weight": Placement("transformer.wte.weight"),
              "pos_embeddings.weight": Placement("transformer.wpe.weight")}
    for i in range(spec.layers):
        placed.update(_gpt2_block(spec, f"layers.{i}.", f"transformer.h.{i}."))
    placed |= {"norm.weight": Placement("transformer.ln_f.weight"), "norm.bias": Placement("transformer.ln_f.bias")}
    return placed


def _llama_placements(spec: ModelSpec) -> dict[str, Placement]:
    rotary = {"attention.wq.weight", "attention.wk.weight"}
    placed = {"tok_embeddings.weight": Placement("model.embed_tokens.weight")}
    for i in range(spec.layers):
        for ours, theirs in LLAMA_BLOCK.items():
            head_dim = spec.head_dim if ours in rotary else 0
            placed[f"layers.{i}.{ours}"] = Placement(f"model.layers.{i}.{theirs}", rotary_head_dim=head_dim)
    placed["norm.weight"] = Placement("model.norm.weight")
    return placed


def placements(spec: ModelSpec) -> dict[str, Placement]:
    """Every parameter of plait's single-device model of ``spec`` → where it lies in Hugging Face's tensors."""
    placed = _gpt2_placements(spec) if spec.hf_model_type == "gpt2" else _llama_placements(spec)
    if not spec.tie_embeddings:
        placed["output.weight"] = Placement("lm_head.weight")
    return placed


def parameter_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """plait's parameters of ``spec`` with their single-device shapes (built on the meta device)."""
    with torch.device("meta"):
        return {name: tuple(param.shape) for name, param in Transformer(spec).named_parameters()}


@dataclass(frozen=True)
class HFTensor:
    """One Hugging Face tensor: its name, its shape, and the plait parameters placed in it (first rows first)."""

    name: str
    shape: tuple[int, ...]
    parts: tuple[tuple[str, Placement], ...]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def rows_per_block_multiple(self) -> int:
        """Row blocks written at a time hold whole heads where rows are permuted per head."""
        return max(1, *(placement.rotary_head_dim for _, placement in self.parts))


def hf_tensors(spec: ModelSpec) -> list[HFTensor]:
    """The Hugging Face tensors of ``spec``'s model, in the order of the plait parameters placed in them."""
    shapes = parameter_shapes(spec)
    grouped: dict[str, list[tuple[str, Placement]]] = {}
    for name, placement in placements(spec).items():
        grouped.setdefault(placement.hf_name, []).append((name, placement))
    tensors = []
    for hf_name, parts in grouped.items():
        parts.sort(key=lambda part: part[1].first_row)
        rows = sum(shapes[name][0] for name, _ in parts)
        columns = shapes[parts[0][0]][1:]
        shape = (*columns, rows) if parts[0][1].transposed else (rows, *columns)
        tensors.append(HFTensor(hf_name, shape, tuple(parts)))
    return tensors


def hf_rows(tensor: HFTensor, values: list[torch.Tensor], rows: tuple[int, int]) -> torch.Tensor:
    """Rows ``rows`` of the Hugging Face ``tensor``, from the full values of the plait parameters placed in it
    (in ``tensor.parts``' order); a rotary tensor's rows must start and stop at whole heads."""
    start, stop = rows
    if tensor.parts[0][1].transposed:  # the file's rows are plait's columns, of every part side by side
        return torch.cat([value[:, start:stop] for value in values]).t()
    pieces = []
    for (_, placement), value in zip(tensor.parts, values):
        first, last = max(start - placement.first_row, 0), min(stop - placement.first_row, value.shape[0])
        if first < last:
            piece = value[first:last]
            if placement.rotary_head_dim:
                piece = interleaved_to_halves(piece, placement.rotary_head_dim)
            pieces.append(piece)
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]


def region_from_hf(placement: Placement, region: Region,
                   read: Callable[[tuple[slice, ...]], torch.Tensor]) -> torch.Tensor:
    """``region`` of a plait parameter from ``read(index)``, a slice of the Hugging Face tensor it lies in.
    Only the region is read, but for q and k under Llama's permutation: the rows of the whole heads it touches."""
    (start, stop), *columns = region
    column_slices = tuple(slice(first, last) for first, last in columns)
    offset = placement.first_row
    if placement.transposed:
        return read((*column_slices, slice(offset + start, offset + stop))).t()
    head_dim = placement.rotary_head_dim
    if not head_dim:
        return read((slice(offset + start, offset + stop), *column_slices))
    first_row, last_row = start // head_dim * head_dim, -(-stop // head_dim) * head_dim
    heads = read((slice(offset + first_row, offset + last_row), *column_slices))
    return halves_to_interleaved(heads, head_dim)[start - first_row:stop - first_row]
