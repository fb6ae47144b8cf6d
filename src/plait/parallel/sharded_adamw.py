"""ZeRO stage 1: AdamW whose moments each rank keeps for its own slice of every parameter only.

Gradients arrive whole (DDP all-reduces them); each rank updates the rows of every parameter it
owns, then one all-gather per step hands the updated rows to the other ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.optim.adamw import adamw

MOMENTS = ("exp_avg", "exp_avg_sq")


# Not torch.distributed.optim.ZeroRedundancyOptimizer: it assigns whole parameters to ranks, so a
# rank may hold far more than 1/Nd of the state, and its state dict must be consolidated on one
# rank, which torch.distributed.checkpoint cannot reshard. Here every parameter is split by rows
# like DTensor's Shard(0) and the moments are DTensors, so any layout can load the checkpoint.
class ShardedAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, PyTorch's fused kernel, as ``build_optimizer``) with state sharded over ``mesh``."""

    def __init__(self, params, mesh: DeviceMesh, lr: float, betas: tuple[float, float],
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.mesh = mesh
        self._pieces: list[list[tuple[torch.Tensor, slice]]] | None = None

    def _rows(self, param: torch.Tensor, rank: int) -> slice:
        """The rows of ``param`` that ``rank`` owns: torch.chunk's split, as DTensor's Shard(0)."""
        rows = param.shape[0]
        chunk = -(-rows // self.mesh.size())
        start = min(rank * chunk, rows)
        return slice(start, min(start + chunk, rows))

    def _moment(self, param: torch.Tensor) -> DTensor:
        local = torch.zeros_like(param[self._rows(param, self.mesh.get_local_rank())])
        return DTensor.from_local(local, self.mesh, [Shard(0)], shape=param.shape, stride=param.stride())

    def _state(self, param: torch.Tensor) -> dict:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state.update({name: self._moment(param) for name in MOMENTS})
        return state

    @torch.no_grad()
    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError("ShardedAdamW.step takes no closure")
        rank = self.mesh.get_local_rank()
        for group in self.param_groups:
            params = [param for param in group["params"] if param.grad is not None]
            rows = [self._rows(param, rank) for param in params]
            states = [self._state(param) for param in params]
            beta1, beta2 = group["betas"]
            adamw(
                [param.detach()[mine] for param, mine in zip(params, rows)],
                [param.grad[mine] for param, mine in zip(params, rows)],
                [state["exp_avg"].to_local() for state in states], [state["exp_avg_sq"].to_local() for state in states],
                [], [state["step"] for state in states],
                fused=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
            )
        self._share_updated_rows()

    def _share_updated_rows(self) -> None:
        """All-gather every rank's updated rows (one flat buffer per rank, padded to equal length)."""
        if self._pieces is None:
            params = [param for group in self.param_groups for param in group["params"]]
            self._pieces = [[(param, self._rows(param, rank)) for param in params] for rank in range(self.mesh.size())]
        width = max(sum(param[rows].numel() for param, rows in pieces) for pieces in self._pieces)
        mine = torch.cat([param.detach()[rows].reshape(-1) for param, rows in self._pieces[self.mesh.get_local_rank()]])
        local = torch.nn.functional.pad(mine, (0, width - mine.numel()))
        gathered = torch.empty(width * self.mesh.size(), dtype=local.dtype, device=local.device)
        dist.all_gather_into_tensor(gathered, local, group=self.mesh.get_group())
        for rank, pieces in enumerate(self._pieces):
            offset = rank * width
            for param, rows in pieces:
                target = param.detach()[rows]
                target.copy_(gathered[offset:offset + target.numel()].view_as(target))
                offset += target.numel()
