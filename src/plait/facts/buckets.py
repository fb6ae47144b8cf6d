"""How large a bucket of gradients plait's data-parallel reduction sends at once.

The reduction overlaps backward one bucket at a time: a bucket goes out as soon as backward has
produced all of its gradients, so only the last one waits for the end of backward. DDP's default
(25 MiB) puts any model under 25 MiB in one bucket, which then overlaps nothing; a bucket of a
quarter of what the rank reduces keeps three quarters of it under backward. The floor keeps a very
small model from paying a collective's latency for a few kilobytes; the cap is DDP's default, which
large models keep. DDP's ``bucket_cap_mb``, plait's own all-reduce and ZeRO-2 reduce-scatter hooks
(plait.parallel.data_parallel.gradient_buckets) and the planner (plait.plan.simulate) all take it from here.
"""

from __future__ import annotations

BUCKET_CAP_BYTES = 25 * 2**20  # DDP's default bucket
BUCKET_FLOOR_BYTES = 256 * 2**10
BUCKETS_PER_REDUCTION = 4


def bucket_bytes(gradient_bytes: float) -> int:
    """The bucket size for a rank reducing ``gradient_bytes`` of gradients over dp (those of its tp
    shard and pipeline stage, in the dtype they are computed in)."""
    return int(min(BUCKET_CAP_BYTES, max(BUCKET_FLOOR_BYTES, gradient_bytes / BUCKETS_PER_REDUCTION)))
