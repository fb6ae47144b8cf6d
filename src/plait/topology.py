"""Layout → DeviceMesh: the process groups of every parallel dimension, taken by name."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from plait.layout import MESH_DIMS, Layout


@dataclass
class Topology:
    """The layout plus the mesh built from it, and this rank's place in it.

    Beside the mesh's own dimensions (pp, dp, cp, tp), ``merged`` holds the 1-D meshes of the groups
    that join several (``Layout.replica_dim`` and ``Layout.zero_dim`` where they are not dp, and
    ``dp_replicate`` under hybrid sharding), which ``size``, ``coordinate`` and ``group`` also take
    by name.
    ``hybrid_mesh``: (dp_replicate, ZeRO's group), on which FSDP2 runs HSDP. ``tp_dp_mesh``: the same
    ranks as a (tp, ZeRO's group) mesh, which places ZeRO-1/2's rows of a tp shard
    (plait.parallel.zero_rows). Each is built only for a layout that uses it."""

    layout: Layout
    mesh: DeviceMesh
    device: torch.device
    tp_dp_mesh: DeviceMesh | None = None
    hybrid_mesh: DeviceMesh | None = None
    merged: dict[str, DeviceMesh] = field(default_factory=dict)

    def size(self, dim: str) -> int:
        return self.layout.group_size(dim)

    def coordinate(self, dim: str) -> int:
        return self.mesh.get_local_rank(dim) if dim in MESH_DIMS else self.merged[dim].get_local_rank()

    def group(self, dim: str) -> dist.ProcessGroup:
        return self.mesh.get_group(dim) if dim in MESH_DIMS else self.merged[dim].get_group()

    def mesh_of(self, dim: str) -> DeviceMesh:
        """The 1-D mesh of ``dim``, one of the mesh's own or a merged one."""
        return self.mesh[dim] if dim in MESH_DIMS else self.merged[dim]

    @property
    def replica_dim(self) -> str:
        return self.layout.replica_dim

    @property
    def zero_dim(self) -> str:
        return self.layout.zero_dim

    @property
    def zero_mesh(self) -> DeviceMesh:
        """ZeRO's 1-D sharding mesh (``Layout.zero_dim``)."""
        return self.mesh_of(self.zero_dim)

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """FSDP2's mesh: ZeRO's group, or (dp_replicate, ZeRO's group), on which FSDP2 runs HSDP."""
        return self.hybrid_mesh if self.hybrid_mesh is not None else self.zero_mesh

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def is_logging_rank(self) -> bool:
        """Global rank 0 reports progress and writes the run directory."""
        return dist.get_rank() == 0


def _merged_mesh(device_type: str, ranks: torch.Tensor, names: tuple[str, ...], merged: tuple[str, ...],
                 name: str) -> DeviceMesh:
    """A DeviceMesh over the same ranks whose last dimension ``name`` runs over the dimensions
    ``merged`` (the last of them innermost), the others before it in their order. It makes a group for
    each of its dimensions; those it repeats carry no collective (NCCL opens a communicator on a
    group's first collective)."""
    rest = tuple(dim for dim in names if dim not in merged)
    order = rest + merged
    ranks = ranks.permute(*(names.index(dim) for dim in order))
    return DeviceMesh(device_type, ranks.reshape(*ranks.shape[:len(rest)], -1), mesh_dim_names=(*rest, name))


def build_topology(layout: Layout, device: torch.device) -> Topology:
    """Build the ``(pp, dp, cp, tp)`` mesh over the already-initialised default process group, and
    the merged groups the layout uses."""
    world = dist.get_world_size()
    if world != layout.world_size:
        raise RuntimeError(
            f"the layout {layout.describe()} needs {layout.world_size} ranks but the job has {world}; "
            "launch as many processes as dp·cp·tp·pp"
        )
    mesh = init_device_mesh(device.type, layout.mesh_shape, mesh_dim_names=MESH_DIMS)
    ranks, names = mesh.mesh, MESH_DIMS
    hybrid = layout.dp_replicate > 1
    tp_rows = layout.zero in (1, 2) and layout.tp > 1 and layout.dp * layout.cp > 1
    merged: dict[str, DeviceMesh] = {}
    if layout.replica_dim not in MESH_DIMS:
        merged["dp_cp"] = _merged_mesh(device.type, ranks, names, ("dp", "cp"), "dp_cp")["dp_cp"]
    if not (hybrid or tp_rows):
        return Topology(layout, mesh, device, merged=merged)
    if hybrid:  # replicate × shard, shard inner: a replica group is neighbouring ranks
        at = MESH_DIMS.index("dp")
        ranks = ranks.reshape(*ranks.shape[:at], layout.dp_replicate, layout.dp_shard, *ranks.shape[at + 1:])
        names = names[:at] + ("dp_replicate", "dp_shard") + names[at + 1:]
    # ZeRO's group last, so that (dp_replicate, ZeRO's group) and (tp, ZeRO's group) slice in order.
    zero_dim = layout.zero_dim
    extra = _merged_mesh(device.type, ranks, names, ("dp_shard" if hybrid else "dp",) + ("cp",) * (layout.cp > 1),
                         zero_dim)
    if zero_dim not in MESH_DIMS:
        merged.setdefault(zero_dim, extra[zero_dim])
    hybrid_mesh = extra["dp_replicate", zero_dim] if hybrid else None
    if hybrid:
        merged["dp_replicate"] = extra["dp_replicate"]
    return Topology(layout, mesh, device, extra["tp", zero_dim] if tp_rows else None, hybrid_mesh, merged)
