"""Tensor parallelism (Megatron-style) and sequence parallelism, through DTensor plans.

Attention is split by heads (wq, wk, wv column-parallel; wo row-parallel), the MLP column- then
row-parallel, the embedding and output projection by vocabulary, and the loss is computed on the
vocabulary shards (``plait.parallel.cross_entropy``): full logits never exist on one rank.

Without sequence parallelism the residual stream is replicated over tp and each row-parallel
output is all-reduced. With it (``--sp``) the residual stream, the norms and the residual adds
work on sequence shards: each all-reduce becomes a reduce-scatter (after wo, w2) plus an
all-gather (before the column-parallel linears).

Grouped-query attention with fewer kv-heads than tp ranks keeps wk/wv whole on every rank; each
rank uses the rows of the one kv-head its query heads read (``ReplicatedKVHeads``).

The vocabulary is padded with zero rows until each rank's share is a multiple of ``ALIGNED_ROWS``,
as Megatron pads it (``plait.facts.model_state.padded_vocab``); the padded logits are set to -inf
so they take no probability and the loss is unchanged.
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, RowwiseParallel, SequenceParallel,
    parallelize_module,
)

from plait.facts.model_state import padded_vocab
from plait.models.flops import kv_heads_whole
from plait.models.spec import ModelSpec
from plait.models.transformer import Transformer
from plait.parallel.tensor_communications import slice_replicated_rows
from plait.topology import Topology


class ReplicatedKVHeads(nn.Module):
    """wk or wv when kv-heads < tp: the full weight on every rank, used only in its kv-head's rows.

    DTensor has no placement for "rows chosen per rank, overlapping", so this is our own; the rows'
    gradient is summed over tp in backward, keeping every rank's copy identical.
    """

    def __init__(self, linear: nn.Linear, head: int, head_dim: int, mesh: DeviceMesh):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.rows = (head * head_dim, (head + 1) * head_dim)
        self.group = mesh.get_group()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Each rank's input gradient is one part of the total: mark it Partial so DTensor sums it.
        local = x.to_local(grad_placements=[Partial()]) if isinstance(x, DTensor) else x
        weight = slice_replicated_rows(self.weight, *self.rows, self.group)
        bias = None if self.bias is None else slice_replicated_rows(self.bias, *self.rows, self.group)
        return F.linear(local, weight, bias)


def block_plan(spec: ModelSpec, tp: int, sp: bool) -> dict:
    """The DTensor plan of one transformer block."""
    stream = Shard(1) if sp else Replicate()
    plan = {
        # One input conversion per sub-block: the backward reduction of x's gradient then happens
        # once for wq, wk, wv together (and for w1, w3), as in Megatron, not once per linear.
        "attention": PrepareModuleInput(input_layouts=(stream, None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=stream),
        "mlp": PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),)),
        "mlp.w1": ColwiseParallel(),
        "mlp.w2": RowwiseParallel(output_layouts=stream),
    }
    if spec.kv_heads % tp == 0:
        plan["attention.wk"] = ColwiseParallel()
        plan["attention.wv"] = ColwiseParallel()
    if spec.gated_mlp:
        plan["mlp.w3"] = ColwiseParallel()
    if sp:
        plan["attention_norm"] = SequenceParallel()
        if not spec.parallel_block:
            plan["mlp_norm"] = SequenceParallel()
    return plan


def _pad_rows(module: nn.Module, rows: int) -> None:
    """Append zero rows to ``module.weight`` (embedding or output projection) up to ``rows``."""
    weight = module.weight
    extra = weight.new_zeros(rows - weight.shape[0], weight.shape[1])
    module.weight = nn.Parameter(torch.cat([weight.detach(), extra]))


def _replicated_output(mesh: DeviceMesh, module: nn.Module, inputs, output: torch.Tensor) -> DTensor:
    """The final norm's output, whole on every tp rank, as the output projection's DTensor input."""
    if isinstance(output, DTensor):
        return output.redistribute(placements=[Replicate()])
    return DTensor.from_local(output, mesh, [Replicate()])


def _mask_padded_vocabulary(model: nn.Module, inputs, logits: DTensor) -> DTensor:
    if model.norm is None:  # a pipeline chunk that ends before the head: hidden states, not logits
        return logits
    return logits + model.vocab_mask


def apply_tensor_parallel(model: Transformer, topology: Topology) -> Transformer:
    """Shard ``model`` (full seeded weights, the same on every rank) over the tp mesh dimension."""
    tp, sp = topology.size("tp"), topology.layout.sp
    if tp == 1:
        return model
    spec, mesh = model.spec, topology.mesh["tp"]
    vocab = padded_vocab(spec.vocab, tp)
    if vocab != spec.vocab:
        if topology.is_logging_rank:
            print(f"plait: vocabulary {spec.vocab} padded to {vocab} for --tp {tp} (Megatron-style); "
                  "the padded logits are masked out of the loss", file=sys.stderr)
        _pad_rows(model.tok_embeddings, vocab)
        if model.output is not None:
            _pad_rows(model.output, vocab)
    stream = Shard(1) if sp else Replicate()
    rank, heads_per_rank = topology.coordinate("tp"), spec.heads // tp
    for block in model.layers.values():
        parallelize_module(block, mesh, block_plan(spec, tp, sp))
        if kv_heads_whole(spec, tp):
            head = rank * heads_per_rank // (spec.heads // spec.kv_heads)
            attention = block.attention
            attention.wk = ReplicatedKVHeads(attention.wk, head, spec.head_dim, mesh)
            attention.wv = ReplicatedKVHeads(attention.wv, head, spec.head_dim, mesh)

    top: dict = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)}
    if sp:
        top["norm"] = SequenceParallel()
        if model.pos_embeddings is not None:
            # Positions' embeddings are looked up whole; keep this rank's slice of them (no traffic).
            top["pos_embeddings"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, mesh, top)
    model.norm.register_forward_hook(functools.partial(_replicated_output, mesh))
    if vocab != spec.vocab:
        mask = torch.zeros(vocab, device=topology.device)
        mask[spec.vocab:] = -torch.inf
        model.register_buffer("vocab_mask", distribute_tensor(mask, mesh, [Shard(0)]), persistent=False)
        model.register_forward_hook(_mask_padded_vocabulary)
    return model


@torch.no_grad()
def finish_tensor_gradients(model: nn.Module) -> None:
    """After the step's backward: lay every gradient out as its parameter is, once, rather than
    letting every optimizer operation on it redistribute again. Sequence parallelism leaves partial
    sums on the norms' replicated weights (each rank saw only its sequence shard); the embedding's
    backward leaves its vocabulary-sharded weight a replicated gradient."""
    for param in model.parameters():
        if param.grad is not None:
            param.grad = laid_out_gradient(param)


def laid_out_gradient(param: torch.Tensor) -> torch.Tensor:
    """``param``'s gradient with the placements of ``param`` (a collective over tp if they differ)."""
    grad = param.grad
    if isinstance(grad, DTensor) and grad.placements != param.placements:
        return grad.redistribute(placements=param.placements)
    return grad

