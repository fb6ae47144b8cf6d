"""Every group a layout names is a process group of its own, which ``Topology.group_names`` gives the
trace by role: at dp 1 the replicas' reduction (dp_cp) and cp's attention hold the same ranks in two
groups, and a group of every rank is the default one for one role only. Built in one process on
torch's fake backend, once for each rank of each layout."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from plait.layout import Layout
from plait.topology import build_topology

LAYOUTS = [
    Layout(cp=2), Layout(cp=2, zero=3), Layout(dp=2), Layout(cp=2, tp=2, zero=1), Layout(dp=2, cp=2, tp=2, zero=3),
    Layout(dp=2, dp_replicate=2, zero=3), Layout(dp=2, dp_replicate=2, cp=2, zero=3),
    Layout(dp=4, dp_replicate=2, cp=2, zero=3), Layout(dp=4, dp_replicate=2, tp=2, zero=2),
    Layout(dp=2, cp=2, pp=2, zero=2, microbatches=2),
]


def roles(layout: Layout) -> set[str]:
    """The groups the engine runs collectives on, by name."""
    named = {"dp", "cp", "tp", "pp", layout.replica_dim, layout.zero_dim}
    return named | ({"dp_replicate"} if layout.dp_replicate > 1 else set())


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.describe())
def test_each_role_is_a_process_group_of_its_own_on_every_rank(layout):
    for rank in range(layout.world_size):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
        try:
            topology = build_topology(layout, torch.device("cpu"))
            names = topology.group_names()
            split = {role for role in roles(layout) if layout.group_size(role) > 1}
            named = {role: names.get(topology.group(role).group_name) for role in split}
            assert named == {role: role for role in split}
            for role in split:
                assert len(dist.get_process_group_ranks(topology.group(role))) == layout.group_size(role)
            if layout.cp > 1:  # the replicas' group holds cp's ranks and more, never cp's group itself
                assert set(dist.get_process_group_ranks(topology.group("cp"))) <= \
                    set(dist.get_process_group_ranks(topology.group(layout.replica_dim)))
            if layout.dp_replicate > 1 and layout.zero == 3:  # FSDP2's HSDP mesh: its groups named too
                for dim in topology.fsdp_mesh.mesh_dim_names:
                    if layout.group_size(dim) > 1:
                        assert names[topology.fsdp_mesh[dim].get_group().group_name] == dim
        finally:
            dist.destroy_process_group()
