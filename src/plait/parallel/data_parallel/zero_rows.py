"""Which rows of every parameter a ZeRO-1/2 rank owns, and how those rows stand as a DTensor of the
whole parameter, so any layout can load what another saved.

A parameter's rows are split over ZeRO's group (the dp ranks, with the cp ranks beside them;
called dp below) as ``torch.chunk`` splits dim 0 (DTensor's
``Shard(0)``). Under tensor parallelism a rank holds a tp shard (a DTensor); its dp ranks split
that local shard's rows further, as Megatron's distributed optimizer splits each tp rank's
parameters. Described on the (tp, dp) mesh, with tp the outer dimension, that is DTensor's plain
nested sharding: ``[tp placement, Shard(0)]``. On the topology's own (dp, tp) order it would need
a strided shard, which torch.distributed.checkpoint and the sharding rules support less well.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from plait.facts.model_state import owned_slice


def row_shape(tensor: torch.Tensor, rows: slice) -> tuple[int, ...]:
    return (rows.stop - rows.start, *tensor.shape[1:])


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``tensor``: a DTensor's local shard, a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class RowSplit:
    """The dp split of every parameter's rows. ``dp_mesh`` splits plain parameters; ``tp_dp_mesh``
    (the same ranks as a (tp, dp) mesh; needed only under tensor parallelism) splits the local
    shards of DTensor parameters."""

    def __init__(self, dp_mesh: DeviceMesh, tp_dp_mesh: DeviceMesh | None = None):
        self.dp_mesh, self.tp_dp_mesh = dp_mesh, tp_dp_mesh
        self.group = dp_mesh.get_group()
        self.rank, self.ranks = dp_mesh.get_local_rank(), dp_mesh.size()

    def rows(self, param: torch.Tensor, rank: int | None = None) -> slice:
        """The rows of ``param``'s local tensor that dp rank ``rank`` (default: this one) owns."""
        return owned_slice(local_tensor(param).shape[0], self.rank if rank is None else rank, self.ranks)

    def shape(self, param: torch.Tensor, rank: int | None = None) -> tuple[int, ...]:
        return row_shape(local_tensor(param), self.rows(param, rank))

    def owned(self, tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``tensor`` (``param`` itself, or a tensor laid out as it is), a view."""
        return local_tensor(tensor)[self.rows(param)]

    def as_dtensor(self, rows: torch.Tensor, param: torch.Tensor) -> DTensor:
        """``rows``, this rank's rows of a tensor laid out as ``param``, as a DTensor of the whole."""
        if isinstance(param, DTensor):
            if self.tp_dp_mesh is None:
                raise ValueError("a tensor-parallel parameter needs the (tp, dp) mesh to split its rows over dp")
            return DTensor.from_local(rows, self.tp_dp_mesh, [*param.placements, Shard(0)],
                                      shape=param.shape, stride=param.stride())
        return DTensor.from_local(rows, self.dp_mesh, [Shard(0)], shape=param.shape, stride=param.stride())
