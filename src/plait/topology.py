"""Layout → DeviceMesh: the process groups of every parallel dimension, taken by name."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from plait.layout import MESH_DIMS, Layout


@dataclass
class Topology:
    """The layout plus the mesh built from it, and this rank's place in it.

    Under hybrid sharding ``hybrid_mesh`` holds the dp ranks as (dp_replicate, dp_shard), whose
    dimensions ``size``, ``coordinate`` and ``group`` also take by name. ``tp_dp_mesh``: the same
    ranks as a (tp, ZeRO's dp dimension) mesh, which places ZeRO-1/2's rows of a tp shard
    (plait.parallel.zero_rows). Each is built only for a layout that uses it."""

    layout: Layout
    mesh: DeviceMesh
    device: torch.device
    tp_dp_mesh: DeviceMesh | None = None
    hybrid_mesh: DeviceMesh | None = None

    def _mesh_of(self, dim: str) -> DeviceMesh:
        return self.mesh if dim in MESH_DIMS else self.hybrid_mesh

    def size(self, dim: str) -> int:
        if dim == "dp_replicate":
            return self.layout.dp_replicate
        return self.layout.dp_shard if dim == "dp_shard" else self.mesh.size(MESH_DIMS.index(dim))

    def coordinate(self, dim: str) -> int:
        return self._mesh_of(dim).get_local_rank(dim)

    def group(self, dim: str) -> dist.ProcessGroup:
        return self._mesh_of(dim).get_group(dim)

    @property
    def zero_dim(self) -> str:
        """The mesh dimension ZeRO shards over: dp, or dp_shard under hybrid sharding."""
        return "dp_shard" if self.hybrid_mesh is not None else "dp"

    @property
    def zero_mesh(self) -> DeviceMesh:
        """ZeRO's 1-D sharding mesh (the dp ranks, or one replica group's)."""
        return self._mesh_of(self.zero_dim)[self.zero_dim]

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """FSDP2's mesh: the dp ranks, or (dp_replicate, dp_shard), on which FSDP2 runs HSDP."""
        return self.hybrid_mesh if self.hybrid_mesh is not None else self.mesh["dp"]

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def is_logging_rank(self) -> bool:
        """Global rank 0 reports progress and writes the run directory."""
        return dist.get_rank() == 0


def build_topology(layout: Layout, device: torch.device) -> Topology:
    """Build the ``(pp, dp, cp, tp)`` mesh over the already-initialised default process group."""
    world = dist.get_world_size()
    if world != layout.world_size:
        raise RuntimeError(
            f"the layout {layout.describe()} needs {layout.world_size} ranks but the job has {world}; "
            "launch as many processes as dp·cp·tp·pp"
        )
    mesh = init_device_mesh(device.type, layout.mesh_shape, mesh_dim_names=MESH_DIMS)
    hybrid, tp_rows = layout.dp_replicate > 1, layout.zero in (1, 2) and layout.tp > 1 and layout.dp > 1
    hybrid_mesh = tp_dp_mesh = None
    if hybrid or tp_rows:
        # One more DeviceMesh over the same ranks, ZeRO's dimension last so that (tp, ZeRO) slices
        # in order. It makes a group for each of its dimensions; those it repeats (pp, cp, tp) carry
        # no collective (NCCL opens a communicator on a group's first collective).
        ranks, names = mesh.mesh, MESH_DIMS
        if hybrid:  # replicate × shard, shard inner: a replica group is neighbouring ranks
            at = MESH_DIMS.index("dp")
            ranks = ranks.reshape(*ranks.shape[:at], layout.dp_replicate, layout.dp_shard, *ranks.shape[at + 1:])
            names = names[:at] + ("dp_replicate", "dp_shard") + names[at + 1:]
        zero_dim = "dp_shard" if hybrid else "dp"
        order = tuple(dim for dim in names if dim != zero_dim) + (zero_dim,)
        extra = DeviceMesh(device.type, ranks.permute(*(names.index(dim) for dim in order)), mesh_dim_names=order)
        hybrid_mesh = extra["dp_replicate", "dp_shard"] if hybrid else None
        tp_dp_mesh = extra["tp", zero_dim] if tp_rows else None
    return Topology(layout, mesh, device, tp_dp_mesh, hybrid_mesh)
