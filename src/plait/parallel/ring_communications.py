"""The context-parallel group as a ring: each rank sends to the next and receives from the previous.

Ring attention (``plait.parallel.ring_attention``) passes K/V blocks forward round it, and in backward
their gradients too. A transfer is started before the block it hides under and waited on after it,
so the send overlaps the attention arithmetic. Point-to-point through ``dist.batch_isend_irecv``,
which gloo and NCCL both run (one batch, so NCCL pairs the send and receive without deadlock).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Transfer:
    """A started exchange: ``wait()`` returns what the previous rank sent."""

    received: torch.Tensor
    works: list

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        return self.received


class Ring:
    """Ranks of ``group`` in a ring: rank r sends to r + 1 and receives from r - 1 (mod the size)."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.previous = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def pass_on(self, tensor: torch.Tensor) -> Transfer:
        """Start sending ``tensor`` to the next rank and receiving its like from the previous one."""
        received = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, tensor.contiguous(), self.next, self.group),
            dist.P2POp(dist.irecv, received, self.previous, self.group),
        ])
        return Transfer(received, works)
