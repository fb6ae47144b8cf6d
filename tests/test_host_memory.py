"""A CPU rank's freed layer-sized tensors go back to the operating system (plait.train.host_memory)."""

from __future__ import annotations

import subprocess
import sys

# Frees a 16 MiB tensor twice, the second time after glibc has raised its threshold past it, and
# prints how much resident memory is left over from the second.
LEFT_AFTER_FREEING = """
import sys, torch
from plait.train.host_memory import return_freed_tensors_to_the_os
if sys.argv[1] == "fixed":
    assert return_freed_tensors_to_the_os()
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
for _ in range(2):
    before = resident()
    block = torch.ones(4 << 20)
    keep = torch.ones(16)  # a small allocation after it on the heap
    del block
print(resident() - before)
"""


def left_after_freeing(setting: str) -> int:
    completed = subprocess.run([sys.executable, "-c", LEFT_AFTER_FREEING, setting], capture_output=True, text=True,
                               check=True)
    return int(completed.stdout)


def test_a_freed_layer_sized_tensor_is_returned_with_the_threshold_fixed_and_kept_without():
    assert left_after_freeing("glibc's default") >= 8 << 20
    assert left_after_freeing("fixed") < 1 << 20
