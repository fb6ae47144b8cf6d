"""Bytes each collective of tensor, sequence and context parallelism moves per layer, on paper.

One home for the engine's tests and the planner. ``batch`` sequences of ``seq`` tokens go through one
layer on each rank; tensors are fp32 (4 bytes). Tests measure the same quantities in a real step
(``plait.observe.collectives``) and require equality.
"""

from __future__ import annotations

from plait.models.flops import layer_parameter_count, norm_parameter_count
from plait.models.spec import ModelSpec

FP32 = 4


def collective_bytes_per_layer(spec: ModelSpec, batch: int, seq: int, tp: int = 1, sp: bool = False,
                               cp: int = 1, recompute: str = "none") -> dict[str, int]:
    """Bytes each rank hands each collective per layer and step (forward, backward, gradient sync).

    An all-gather is handed a shard, an all-reduce or reduce-scatter the whole tensor.
    Recomputation issues the recomputed forward's collectives again in backward, up to the last
    tensor backward needs (PyTorch's checkpoint stops there): under ``full`` every one but the
    MLP's closing all-reduce or reduce-scatter; under ``selective`` context parallelism's exchange
    of q, k and v (the output's comes after the attention kernel's last saved tensor).
    """
    stream = batch * (seq // cp) * spec.hidden * FP32  # the residual stream this rank holds, whole over tp
    volumes: dict[str, int] = {}

    def add(name: str, count: int) -> None:
        if count:
            volumes[name] = volumes.get(name, 0) + count

    full = recompute == "full"
    if tp > 1 and sp:
        # forward: all-gather before attention and MLP, reduce-scatter after wo and w2; backward: mirrored
        add("all_gather", (4 + 2 * full) * stream // tp)
        add("reduce_scatter", (4 + full) * stream)
        # the norms' replicated weights (and biases) saw only a sequence shard: their gradients are summed
        add("all_reduce", 2 * norm_parameter_count(spec) * FP32)
    elif tp > 1:
        # forward: all-reduce after wo and w2; backward: all-reduce of the input gradient of attention and MLP
        add("all_reduce", (4 + full) * stream)
    if tp > 1 and spec.kv_heads % tp:
        # kv-heads replicated over tp: the whole wk and wv gradients (and biases) are summed over tp
        add("all_reduce", 2 * spec.kv_dim * (spec.hidden + (1 if spec.has_bias else 0)) * FP32)
    if cp > 1:
        # q, k, v (grouped-query k, v expanded to the query heads) and the output, forward and backward
        again = {"none": 0, "selective": 3, "full": 4}[recompute]
        add("all_to_all", (8 + again) * stream // tp)
        # gradients averaged over cp: this rank's share of the layer's parameters
        add("all_reduce", _local_layer_parameters(spec, tp) * FP32)
    return volumes


def _local_layer_parameters(spec: ModelSpec, tp: int) -> int:
    """Parameters of one block that a tp rank holds: sharded matrices, replicated norms and row biases."""
    if tp == 1:
        return layer_parameter_count(spec)
    h, f = spec.hidden, spec.ffn_hidden
    kv_local = spec.kv_dim // tp if spec.kv_heads % tp == 0 else spec.kv_dim
    bias = spec.has_bias
    attention = 2 * h * h // tp + 2 * h * kv_local + (h // tp + 2 * kv_local + h if bias else 0)
    mlp = (3 if spec.gated_mlp else 2) * h * f // tp + (f // tp + h if bias else 0)
    return attention + mlp + 2 * norm_parameter_count(spec)
