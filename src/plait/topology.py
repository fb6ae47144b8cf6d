"""Layout → DeviceMesh: the process groups of every parallel dimension, taken by name."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from plait.layout import Layout


@dataclass
class Topology:
    """The layout plus the mesh built from it, and this rank's place in it.

    ``mesh`` is the root: (pp, dp, cp, tp), or (pp, dp_replicate, dp_shard, cp, tp) under hybrid
    sharding. ``dims`` holds the 1-D mesh of every group the layout names, which ``coordinate``,
    ``group`` and ``mesh_of`` take by name: the root's dimensions and those flattened from several
    of them (``dp`` under hybrid sharding, and ``Layout.replica_dim`` and ``Layout.zero_dim`` where
    they join dp and cp, each its own process group even where dp is 1), all of one root, so FSDP2
    can pair ZeRO's group with tp's. ``hybrid_mesh``: (dp_replicate, ZeRO's group), on which FSDP2
    runs HSDP at ZeRO-3. ``tp_dp_mesh``: the same ranks as a (tp, ZeRO's group) mesh, which places
    ZeRO-1/2's rows of a tp shard (plait.parallel.data_parallel.zero_rows). Each is built only for a layout that
    uses it."""

    layout: Layout
    mesh: DeviceMesh
    device: torch.device
    dims: dict[str, DeviceMesh]
    tp_dp_mesh: DeviceMesh | None = None
    hybrid_mesh: DeviceMesh | None = None

    def size(self, dim: str) -> int:
        return self.layout.group_size(dim)

    def coordinate(self, dim: str) -> int:
        return self.dims[dim].get_local_rank()

    def group(self, dim: str) -> dist.ProcessGroup:
        return self.dims[dim].get_group()

    def mesh_of(self, dim: str) -> DeviceMesh:
        """The 1-D mesh of the group ``dim``."""
        return self.dims[dim]

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

    def group_names(self) -> dict[str, str]:
        """Each process group the layout's collectives run on, by torch's name for it
        (``ProcessGroup.group_name``), to the group's name in the layout. Groups over the same ranks
        in different roles (cp's own and the replicas' at dp 1) are different process groups, so a
        trace names each by its role. Groups of one rank are left out."""
        meshes = list(self.dims.items())
        for extra in (self.hybrid_mesh, self.tp_dp_mesh):
            if extra is not None:
                meshes += [(name, extra[name]) for name in extra.mesh_dim_names]
        return {mesh.get_group().group_name: name for name, mesh in meshes if self.size(name) > 1}

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
    ``merged`` (the last of them innermost), the others before it in their order. It makes a group
    for each of its dimensions beside the root's over the same ranks."""
    rest = tuple(dim for dim in names if dim not in merged)
    order = rest + merged
    ranks = ranks.permute(*(names.index(dim) for dim in order))
    return DeviceMesh(device_type, ranks.reshape(*ranks.shape[:len(rest)], -1), mesh_dim_names=(*rest, name))


def _hybrid_mesh(layout: Layout, mesh: DeviceMesh, dims: dict[str, DeviceMesh]) -> DeviceMesh:
    """(dp_replicate, ZeRO's group) for FSDP2's HSDP. Where ZeRO's group joins dp_shard and cp, the
    replicas' group (dp_replicate outermost) is unflattened into the two, as torchtitan builds its
    meshes: torch deprecates slicing a flattened dimension from the root. That makes two groups
    beside the root's over the same ranks."""
    if layout.zero_dim in mesh.mesh_dim_names:
        return mesh["dp_replicate", layout.zero_dim]
    return dims[layout.replica_dim]._unflatten(0, (layout.dp_replicate, layout.group_size(layout.zero_dim)),
                                               ("dp_replicate", layout.zero_dim))


def build_topology(layout: Layout, device: torch.device) -> Topology:
    """Build the root mesh over the already-initialised default process group, and the groups
    joining several of its dimensions that the layout uses."""
    world = dist.get_world_size()
    if world != layout.world_size:
        raise RuntimeError(
            f"the layout {layout.describe()} needs {layout.world_size} ranks but the job has {world}; "
            "launch as many processes as dp·cp·tp·pp"
        )
    hybrid = layout.dp_replicate > 1
    data = ("dp_replicate", "dp_shard") if hybrid else ("dp",)  # replicate × shard, shard inner
    names = ("pp", *data, "cp", "tp")
    mesh = init_device_mesh(device.type, tuple(layout.group_size(name) for name in names), mesh_dim_names=names)
    dims = {name: mesh[name] for name in names}
    # Groups over several dimensions flattened from the root (DeviceMesh._flatten, which torch keeps
    # private and torchtitan builds its dp_shard_cp with), so that every mesh shares one root.
    joined = {"dp": data, "dp_cp": (*data, "cp"), "dp_shard_cp": ("dp_shard", "cp")}
    for name in ("dp", layout.replica_dim, layout.zero_dim):  # in one order on every rank: each makes a group
        if name not in dims:
            # A group of every rank would be the default one, which another role's group of every
            # rank (cp's alone, dp_replicate's) is too; naming its backend makes it a group of its own.
            own = dist.get_backend() if layout.group_size(name) == world else None
            dims[name] = mesh[joined[name]]._flatten(name, own)
    hybrid_mesh = _hybrid_mesh(layout, mesh, dims) if hybrid and layout.zero == 3 else None
    tp_dp_mesh = None
    if layout.zero in (1, 2) and layout.tp > 1 and layout.dp * layout.cp > 1:
        # ZeRO's group last, so that (tp, ZeRO's group) slices in order.
        extra = _merged_mesh(device.type, mesh.mesh, names, joined.get(layout.zero_dim, (layout.zero_dim,)),
                             layout.zero_dim)
        tp_dp_mesh = extra["tp", layout.zero_dim]
    return Topology(layout, mesh, device, dims, tp_dp_mesh, hybrid_mesh)
