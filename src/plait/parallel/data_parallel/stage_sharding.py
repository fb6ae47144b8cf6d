"""ZeRO-3 on pipeline stages: FSDP2 over ZeRO's group (the dp·cp ranks) on a pipeline rank's pruned
model (its blocks, then the root holding its ends), as torchtitan composes FSDP2 with pipelining.

A pipeline schedule runs many forward and backward passes per step, so the units gather their
parameters once, in the step's first forward, and keep them until the step's last backward
(``reshard_after_forward=False`` and no reshard after backward): gathering again for every
micro-batch would multiply the all-gathers by the micro-batches, and a stage's parameters are
small beside the activations of the micro-batches it keeps in flight. Gradients accumulate
unsharded over the micro-batches and are reduce-scattered once, after the schedule (``reduce``),
as PyTorch's own pipelining does (``torch.distributed.pipelining.stage._PipelineStageBase
.perform_reduce_grad``): FSDP2's autograd hooks fire when a module's input gradient is computed,
which zero-bubble schedules do before the weight gradients. Between steps a rank holds 1/(dp·cp) of
its stage; during a step it holds the gathered stage and its shards, more than ZeRO-2 on the same
stage holds, so ZeRO-3 on a stage pays only when the optimizer state is what does not fit.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from plait.models.transformer import Transformer
from plait.parallel.data_parallel.data import fully_shard_model


class ShardedStage:
    """A pipeline rank's pruned ``model`` under FSDP2 over ``mesh`` (ZeRO's group).

    The chunk views (plait.parallel.pipeline) share the model's hooks, so each runs the root's."""

    def __init__(self, model: Transformer, mesh: DeviceMesh, grad_compression: str = "none"):
        # fp32 gathered parameters under bf16 autocast, as on a ZeRO-0 stage: with bf16
        # parameters FSDP2 would accumulate a gradient in bf16 or fp32 depending on whether its hook
        # ran before the weight half of a split backward, so memory and rounding would follow the
        # schedule. (--grad-compression bf16 makes its reduce dtype, and so its accumulation, bf16.)
        self.root: FSDPModule = fully_shard_model(model, mesh, "fp32", grad_compression, reshard_after_forward=False)
        self._accumulate()

    def _accumulate(self) -> None:
        """Until ``reduce``: keep the parameters gathered and the gradients unsharded and unreduced."""
        self.root.set_is_last_backward(False)
        self.root.set_reshard_after_backward(False)
        self.root.set_requires_gradient_sync(False)

    def unreduced_gradients(self) -> list[torch.Tensor]:
        """What holds the gradients accumulated over the schedule before ``reduce``: the gathered
        parameters' own (and any copy FSDP2 accumulates them into)."""
        return [grad for group in self._param_groups() for param in group.fsdp_params
                for grad in (param._unsharded_param.grad, param.unsharded_accumulated_grad) if grad is not None]

    def _param_groups(self) -> list:
        """FSDP2's parameter groups of every unit (one per unit before torch grouped by mesh)."""
        groups = []
        for unit in fully_shard.state(self.root)._state_ctx.all_states:
            groups += getattr(unit, "_fsdp_param_groups", None) or [g for g in [unit._fsdp_param_group] if g]
        return groups

    @torch.no_grad()
    def reduce(self) -> None:
        """After the schedule: reduce-scatter every unit's accumulated gradients over dp and free
        the gathered parameters."""
        self.root.set_is_last_backward(True)
        self.root.set_reshard_after_backward(True)
        self.root.set_requires_gradient_sync(True)
        for group in self._param_groups():
            group.post_backward()
        fully_shard.state(self.root)._root_post_backward_final_callback()
        self._accumulate()
