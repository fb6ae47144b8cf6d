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

    ``tp_dp_mesh``: the same ranks as a (tp, dp) mesh, which places ZeRO-1/2's rows of a tp shard
    (plait.parallel.zero_rows); built only for such a layout."""

    layout: Layout
    mesh: DeviceMesh
    device: torch.device
    tp_dp_mesh: DeviceMesh | None = None

    def size(self, dim: str) -> int:
        return self.mesh.size(MESH_DIMS.index(dim))

    def coordinate(self, dim: str) -> int:
        return self.mesh.get_local_rank(dim)

    def group(self, dim: str) -> dist.ProcessGroup:
        return self.mesh.get_group(dim)

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
    tp_dp_mesh = None
    if layout.zero in (1, 2) and layout.tp > 1 and layout.dp > 1:
        order = tuple(dim for dim in MESH_DIMS if dim != "dp") + ("dp",)
        ranks = mesh.mesh.permute(*(MESH_DIMS.index(dim) for dim in order))
        tp_dp_mesh = DeviceMesh(device.type, ranks, mesh_dim_names=order)["tp", "dp"]
    return Topology(layout, mesh, device, tp_dp_mesh)
