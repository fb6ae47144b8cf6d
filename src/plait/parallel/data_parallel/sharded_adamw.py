"""ZeRO stages 1 and 2: AdamW whose state each rank keeps for its own rows of every parameter only.

Stage 1: gradients arrive whole (averaged by ``GradientAllReduce``'s buckets, or by DDP under
PowerSGD). Stage 2: ``GradientReduceScatter`` leaves
each rank only the averaged gradient of its own rows. Either way each rank updates the rows it
owns, and one all-gather per step hands the updated rows to the other ranks. Under tensor
parallelism the rows are those of the rank's tp shard (plait.parallel.data_parallel.zero_rows).

Mixed precision, as the ZeRO paper accounts it: parameters in bf16 (2 bytes, replicated), stage 1's
gradients in bf16 too (stage 2 sums its reduce-scattered rows in fp32), and for the rows a rank
owns an fp32 master copy that Adam updates (12 bytes with the two moments, sharded); the bf16
parameters are the master rounded after every step.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.adamw import adamw

from plait.parallel.data_parallel.gradient_buckets import default_bucket_bytes
from plait.parallel.data_parallel.gradient_shards import GradientReduceScatter, GradientSharding, all_gather_single
from plait.parallel.data_parallel.zero_rows import RowSplit, local_tensor

MOMENTS = ("exp_avg", "exp_avg_sq")


# Not torch.distributed.optim.ZeroRedundancyOptimizer: it assigns whole parameters to ranks, so a
# rank may hold far more than 1/Nd of the state, and its state dict must be consolidated on one
# rank, which torch.distributed.checkpoint cannot reshard. Here every parameter is split by rows
# like DTensor's Shard(0) and the moments are DTensors, so any layout can load the checkpoint.
class ShardedAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, PyTorch's fused kernel, as ``build_optimizer``) with state sharded by ``split``.

    ``split`` splits rows over ZeRO's group (the dp ranks, with the cp ranks beside them:
    ``Layout.zero_dim``), and under tensor parallelism the rows of each tp shard. With
    ``gradient_sharding`` the gradients are reduce-scattered too (ZeRO-2). Parameters held in a lower
    precision than fp32 get an fp32 master copy of the owned rows (``masters``)."""

    def __init__(self, params, split: RowSplit, lr: float, betas: tuple[float, float], eps: float = 1e-8,
                 weight_decay: float = 1e-2, gradient_sharding: GradientSharding | None = None):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.split = split
        optimized = self._optimized()
        self.masters = {param: self.split.as_dtensor(self._rows_of(param).to(torch.float32, copy=True), param)
                        for param in optimized if param.dtype != torch.float32}
        self.gradient_shards = None
        if gradient_sharding is not None:
            stepped = set(optimized)
            chunks = {chunk: [p for p in params if p in stepped] for chunk, params in gradient_sharding.chunks.items()}
            limit = gradient_sharding.bucket_bytes or default_bucket_bytes([p for params in chunks.values() for p in params])
            self.gradient_shards = GradientReduceScatter(chunks, self.split, limit, gradient_sharding.per_chunk)
        self._buckets: list[list[list[tuple[torch.Tensor, slice]]]] | None = None  # per bucket, per rank

    def _optimized(self) -> list[torch.Tensor]:
        return [param for group in self.param_groups for param in group["params"]]

    def _rows_of(self, param: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``param``'s own tensor (a view: writing it writes the parameter)."""
        return self.split.owned(param.detach(), param)

    def _state(self, param: torch.Tensor) -> dict:
        state = self.state[param]
        if not state:
            shape = self.split.shape(param)
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state.update({name: self.split.as_dtensor(torch.zeros(shape, dtype=torch.float32, device=param.device), param)
                          for name in MOMENTS})
        return state

    def _owned_gradient(self, param: torch.Tensor) -> torch.Tensor | None:
        """This rank's rows of ``param``'s gradient: its reduce-scattered shard, or rows of the whole one."""
        if self.gradient_shards is not None and param in self.gradient_shards.shards:
            return self.gradient_shards.shards[param].to_local()
        return None if param.grad is None else self.split.owned(param.grad, param)

    def gradients(self) -> dict[torch.Tensor, torch.Tensor]:
        """The gradients the next step uses, by parameter: DTensor shards under ZeRO-2, else the
        parameters' whole ones."""
        optimized = self._optimized()
        if self.gradient_shards is not None and self.gradient_shards.shards:
            return {param: self.gradient_shards.shards[param] for param in optimized if param in self.gradient_shards.shards}
        return {param: param.grad for param in optimized if param.grad is not None}

    def init_state(self) -> None:
        """Every owned row's moments, as the first step makes them: before a checkpoint loads into
        them, so that torch's state-dict helper does not make them itself with a step over a whole
        zero gradient for every parameter (a transient that ZeRO-2's saving was for)."""
        for param in self._optimized():
            self._state(param)

    def load_state_dict(self, state_dict: dict) -> None:
        """Optimizer's, keeping the loaded moments fp32: it would cast them to a bf16 parameter's dtype."""
        super().load_state_dict(state_dict)
        saved_ids = [index for group in state_dict["param_groups"] for index in group["params"]]
        for index, param in zip(saved_ids, self._optimized()):
            saved = state_dict["state"].get(index, {})
            self.state[param].update({name: saved[name] for name in MOMENTS if name in saved})

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        if self.gradient_shards is not None:
            self.gradient_shards.clear()

    @torch.no_grad()
    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError("ShardedAdamW.step takes no closure")
        for group in self.param_groups:
            owned = {param: grad for param in group["params"] if (grad := self._owned_gradient(param)) is not None}
            params = list(owned)
            targets = [self.masters[param].to_local() if param in self.masters else self._rows_of(param) for param in params]
            # The fused kernel wants gradients in the dtype of what it updates: bf16 → fp32 for a master.
            grads = [owned[param].to(target.dtype) for param, target in zip(params, targets)]
            states = [self._state(param) for param in params]
            beta1, beta2 = group["betas"]
            adamw(
                targets, grads,
                [state["exp_avg"].to_local() for state in states], [state["exp_avg_sq"].to_local() for state in states],
                [], [state["step"] for state in states],
                fused=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
            )
            for param, target in zip(params, targets):
                if param in self.masters:
                    self._rows_of(param).copy_(target)
        self._share_updated_rows()

    @torch.no_grad()
    def parameters_from_masters(self) -> None:
        """Round every master into its parameter rows and share them (after a checkpoint loads the masters)."""
        for param, master in self.masters.items():
            self._rows_of(param).copy_(master.to_local())
        self._share_updated_rows()

    def _share_updated_rows(self) -> None:
        """All-gather every dp rank's updated rows, a bucket of parameters at a time (plait.facts.buckets'
        size, as the gradients' reduction): one flat buffer per rank and bucket, padded to equal length, so
        the rank holds a bucket's gathered rows beside its weights, never a second copy of them all."""
        if self._buckets is None:
            self._buckets = [[[(param, self.split.rows(param, rank)) for param in bucket]
                              for rank in range(self.split.ranks)] for bucket in self._gather_buckets()]
        for pieces in self._buckets:
            self._share_bucket(pieces)

    def _gather_buckets(self) -> list[list[torch.Tensor]]:
        """The optimized parameters in order, cut into buckets of about ``default_bucket_bytes`` each."""
        optimized = self._optimized()
        limit, buckets, size = default_bucket_bytes(optimized), [[]], 0
        for param in optimized:
            if buckets[-1] and size >= limit:
                buckets.append([])
                size = 0
            buckets[-1].append(param)
            size += local_tensor(param.detach()).numel() * param.element_size()
        return buckets

    def _share_bucket(self, pieces: list[list[tuple[torch.Tensor, slice]]]) -> None:
        width = max(sum(local_tensor(param.detach())[rows].numel() for param, rows in mine) for mine in pieces)
        mine = torch.cat([local_tensor(param.detach())[rows].reshape(-1) for param, rows in pieces[self.split.rank]])
        padded = torch.nn.functional.pad(mine, (0, width - mine.numel()))
        gathered = torch.empty(width * self.split.ranks, dtype=padded.dtype, device=padded.device)
        all_gather_single(gathered, padded, group=self.split.group)
        for rank, owned in enumerate(pieces):
            offset = rank * width
            for param, rows in owned:
                target = local_tensor(param.detach())[rows]
                target.copy_(gathered[offset:offset + target.numel()].view_as(target))
                offset += target.numel()


def gradients_by_parameter(optimizer: torch.optim.Optimizer) -> dict[torch.Tensor, torch.Tensor]:
    """The gradients ``optimizer`` steps with, by parameter: ZeRO-2's owned shards, else each ``.grad``."""
    if isinstance(optimizer, ShardedAdamW):
        return optimizer.gradients()
    return {param: param.grad for group in optimizer.param_groups for param in group["params"] if param.grad is not None}


def gradients_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients ``optimizer`` steps with (``gradients_by_parameter``'s values)."""
    return list(gradients_by_parameter(optimizer).values())


def fp32_masters(optimizer: torch.optim.Optimizer) -> Collection[DTensor]:
    """The fp32 master copies ``optimizer`` keeps (a live view: loading a checkpoint fills them in place)."""
    return optimizer.masters.values() if isinstance(optimizer, ShardedAdamW) else ()


def master_weights(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, DTensor]:
    """The fp32 masters of ``model``'s lower-precision parameters, by the parameter's state-dict name."""
    if not isinstance(optimizer, ShardedAdamW) or not optimizer.masters:
        return {}
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return {name: optimizer.masters[param] for name, param in inner.named_parameters() if param in optimizer.masters}
