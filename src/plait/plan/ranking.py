"""How the planner orders layouts it cannot tell apart: its own error, and the complexity that puts
a layout with fewer parallel dimensions first when the faster one wins by less than that error."""

from __future__ import annotations

from plait.facts.model_state import zero_group
from plait.layout import Layout
from plait.plan.comm import group_spread
from plait.plan.simulate import Prediction


# The planner's own step-time error: its median |error| on the published runs held out of every
# fit (docs/VALIDATION.md). Layouts predicted closer than this cannot be told apart by it.
PLANNER_ERROR = 0.033

# The shortest sequence a published run splits by context parallelism: NeMo's long-context recipes
# (Llama 3 8B and 70B, Mixtral 8×7B, Nemotron: 16k to 128k tokens on cp 2 to 8) and Llama 3 405B's
# 128k stage (cp 16). Below it the planner's costs for the ring have nothing published to be
# checked against, so there context parallelism counts as one more dimension.
CONTEXT_PARALLEL_PRECEDENT_TOKENS = 16384
# The widest ZeRO-3 group without pipeline stages (a gather per layer and micro-batch) among the
# published FSDP runs: llm-foundry's and torchtitan's on 128 GPUs (docs/VALIDATION.md). The only
# wider ones, DeepSpeed's of 2021 on 384-2,240 GPUs, moved their parameters at a ninth of NCCL's
# ring bandwidth; where FSDP's own gathers would show, it kept at least a fifth of it.
FULL_SHARD_PRECEDENT_RANKS = 128


def complexity(dp: int, tp: int, cp: int, pp: int, gpus_per_node: int, seq_len: int, zero3_shards: int = 0) -> int:
    """How many of dp, tp, cp and pp a layout spreads over, one more when tensor parallelism leaves
    the node's NVLink (a group wider than a node, or one straddling two: plait.plan.comm.group_spread),
    one more for context parallelism on a sequence shorter than any published run split, and one
    more for a ZeRO-3 group without pipeline stages (``zero3_shards`` ranks) wider than any
    published FSDP run: each is harder to run and debug, and each is a cost the planner can get
    wrong."""
    return ((dp > 1) + (tp > 1) + (cp > 1) + (pp > 1) + (group_spread(tp, 1, gpus_per_node, dp * tp * cp * pp)[1] > 1)
            + (cp > 1 and seq_len < CONTEXT_PARALLEL_PRECEDENT_TOKENS) + (zero3_shards > FULL_SHARD_PRECEDENT_RANKS))


def full_shard_ranks(layout: Layout) -> int:
    """The ranks a ZeRO-3 group gathers each layer over, micro-batch by micro-batch (0 when it does not)."""
    return zero_group(layout)[0] if layout.zero == 3 and layout.pp == 1 else 0


def layout_complexity(layout: Layout, gpus_per_node: int, seq_len: int) -> int:
    return complexity(layout.dp, layout.tp, layout.cp, layout.pp, gpus_per_node, seq_len,
                      full_shard_ranks(layout))


def rank(predictions: list[Prediction], gpus_per_node: int, seq_len: int,
         tie_break: str = "simplicity") -> list[Prediction]:
    """Fastest first; with ``simplicity``, the layouts predicted within the planner's own error of the
    fastest count as tied and come first by complexity (``complexity``), then by time: a layout
    spread over more dimensions must win by more than the planner's error to be recommended."""
    by_time = sorted(predictions, key=lambda p: p.step_time_s)
    if tie_break != "simplicity":
        return by_time
    limit = by_time[0].step_time_s * (1 + PLANNER_ERROR)
    tied = [p for p in by_time if p.step_time_s <= limit]
    by_complexity = sorted(tied, key=lambda p: (layout_complexity(p.layout, gpus_per_node, seq_len), p.step_time_s))
    return by_complexity + by_time[len(tied):]
