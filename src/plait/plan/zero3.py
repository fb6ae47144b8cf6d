"""ZeRO-3 without pipeline stages: each layer's parameters gathered before use and its gradients
reduce-scattered after, one layer or one linear ahead of the compute they hide under.

Stacks shape this differently. PyTorch's FSDP (FSDP2 in plait and torchtitan, FSDP1 in
llm-foundry) gathers a whole block in one all-gather, prefetched a block ahead, so a block's
transfer hides under the block before it; in backward only where the prefetch is issued before the
block's gradients are computed (``Kernels.zero3_backward_prefetch``): FSDP1 under Composer's default
issues it after them, so each backward gather stands alone on the critical path. DeepSpeed's
ZeRO-3 (``stage3.py``: ``fetch_sub_module`` and ``prefetch_next_sub_modules``) fetches module by
module and prefetches the next one, so each linear's gather hides only under the linear before it:
a small projection in front of a large MLP weight leaves most of that weight's transfer exposed
even when the block's compute exceeds its transfers. With full recomputation it gathers a module
again for the recomputed forward, having released it after the forward, and again for backward
unless the module is used right after (the block's last linear; ``stage3_max_reuse_distance``).
"""

from __future__ import annotations

from dataclasses import replace

from plait.facts.model_state import communicated_bytes, rank_layer_parameters, zero_group
from plait.facts.stack import Kernels
from plait.layout import Layout
from plait.models.flops import linear_shares
from plait.models.spec import ModelSpec
from plait.plan.comm import all_gather_seconds, all_reduce_seconds, exposed_under, reduce_scatter_seconds, strided_link
from plait.plan.compute import LayerTimes
from plait.hardware import Hardware


def zero3_layer_seconds(spec: ModelSpec, hw: Hardware, layout: Layout, precision: str,
                        kernels: Kernels) -> tuple[float, float]:
    """(all-gather of one layer's parameters, reduce-scatter of its gradients); under hybrid
    sharding the reduce-scatter is followed by the all-reduce of the shard across replica groups,
    in the same backward hook (FSDP2, plait.facts.model_state). Only the bandwidth term is the
    stack's (``Kernels.zero3_collective_efficiency``); the ring's latency is NCCL's."""
    shards, stride = zero_group(layout)
    link = strided_link(hw, shards, stride, layout.world_size)
    link = replace(link, bandwidth=link.bandwidth * kernels.zero3_collective_efficiency)
    grad_bytes, param_bytes = communicated_bytes(layout, precision, kernels)
    parameters = rank_layer_parameters(spec, layout.tp)
    gather = all_gather_seconds(parameters * param_bytes, shards, link)
    scatter = reduce_scatter_seconds(parameters * grad_bytes, shards, link)
    replicas = layout.dp * layout.cp // shards
    if replicas > 1:
        scatter += all_reduce_seconds(parameters * grad_bytes / shards, replicas,
                                      strided_link(hw, replicas, shards * stride, layout.world_size))
    return gather, scatter


def zero3_exposed(spec: ModelSpec, times: LayerTimes, gather: float, scatter: float, recompute: str,
                  kernels: Kernels, overlap: float) -> tuple[float, float]:
    """Seconds of one layer's ZeRO-3 transfers left exposed in its forward and in its backward
    (with its recomputation), given the whole layer's ``gather`` and ``scatter``."""
    regathers = kernels.zero3_regathers_for_recompute and recompute == "full"
    if kernels.zero3_gather_unit == "layer":
        forward = exposed_under(gather, times.forward, overlap)
        backward_gathers = (2 if regathers else 1) * gather
        if kernels.zero3_backward_prefetch == "post":  # issued once the block's gradients are done
            return forward, backward_gathers + exposed_under(scatter, times.backward + times.recompute, overlap)
        return forward, exposed_under(backward_gathers + scatter, times.backward + times.recompute, overlap)
    shares = linear_shares(spec)
    last = len(shares) - 1

    # (compute, gather needed before it starts, reduce-scatter issued after it), in the order run;
    # the attention core runs between the first two linears forward and between the second and
    # first backward.
    def forward_uses(seconds: float) -> list[tuple[float, float, float]]:
        return [(share * (seconds - times.attention) + (times.attention if k == 0 else 0.0), share * gather, 0.0)
                for k, share in enumerate(shares)]

    forward = forward_uses(times.forward)
    # A recomputation inside the block (selective, op) runs within its backward.
    backward_matmuls = times.backward - times.attention_backward + (0.0 if recompute == "full" else times.recompute)
    backward = [(shares[k] * backward_matmuls + (times.attention_backward if k == 1 else 0.0),
                 0.0 if recompute == "full" and (k == last or not regathers) else shares[k] * gather,
                 shares[k] * scatter) for k in reversed(range(len(shares)))]
    if recompute == "full":  # the recomputed forward, as the forward
        backward = forward_uses(times.recompute) + backward
    return sequence_exposed(forward, overlap), sequence_exposed(backward, overlap)


def first_gather(spec: ModelSpec, gather: float, kernels: Kernels) -> float:
    """What of the first layer's gather nothing hides: the whole layer's, or its first linear's."""
    return gather * (linear_shares(spec)[0] if kernels.zero3_gather_unit == "linear" else 1.0)


def sequence_exposed(uses: list[tuple[float, float, float]], overlap: float) -> float:
    """Exposed transfer seconds of a repeating sequence of module uses, each ``(compute, gather
    before it, scatter after it)``: while one runs, the next one's gather (the sequence repeats
    layer after layer) and the previous one's reduce-scatter are in flight."""
    return sum(exposed_under(uses[(i + 1) % len(uses)][1] + uses[i - 1][2], compute, overlap)
               for i, (compute, _, _) in enumerate(uses))
