"""A CPU rank's freed tensors go back to the operating system, so its resident memory follows what it holds.

glibc's malloc serves blocks from 128 KiB up with their own mappings, but raises that threshold to
the largest such block freed so far (up to 32 MiB): after the first step a rank's layer-sized
tensors (a gathered layer, a reduce-scatter's input, a bucket) come from the heap, which keeps what
they free in pieces too scattered to give back. A rank's resident peak then grows with every
transient buffer the run held rather than with what it holds at once: eight more layers grew it by
1.31× (``--dp 8 --zero 3``) and 1.27× (``--tp 2 --pp 2 --dp 2 --zero 1``) what the planner gives
the rank, and by 0.91× and 0.97× with the thresholds fixed (``benchmarks/rank_memory_growth.py``).
Fixing them turns the rule off. The heap keeps up to 32 MiB free at its top instead of glibc's
fixed 128 KiB, which would trim it at nearly every free: that cost the default run 15% of its step.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc's malloc.h)
MAPPED_FROM_BYTES = 1 << 20  # a block of 1 MiB or more has its own mapping, returned when freed
KEPT_AT_TOP_BYTES = 32 << 20  # free bytes at the heap's top kept for the next allocations


def return_freed_tensors_to_the_os() -> bool:
    """Fix glibc's mmap and trim thresholds; False where the C library has no mallopt (musl, macOS:
    their allocators return large blocks by themselves)."""
    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    return bool(mallopt is not None and mallopt(M_MMAP_THRESHOLD, MAPPED_FROM_BYTES)
                and mallopt(M_TRIM_THRESHOLD, KEPT_AT_TOP_BYTES))
