"""A stall for the watchdog to find, loaded only by the interpreters of a test that puts this folder
first on PYTHONPATH (Python imports ``sitecustomize`` at start-up): rank 1 of a distributed run
hangs in its fifth optimizer step, alive (its other threads run on), as a rank stuck in a kernel or
a lock would. Nothing in plait can switch it on."""

import os
import time

from torch.optim.optimizer import register_optimizer_step_pre_hook

steps = []


def hang_in_the_fifth_step_on_rank_1(optimizer, args, kwargs) -> None:
    if os.environ.get("RANK") != "1" or os.environ.get("WORLD_SIZE", "1") == "1":
        return
    steps.append(None)
    while len(steps) == 5:  # sleeping releases the interpreter: the rank's watchdog thread keeps publishing
        time.sleep(1)


register_optimizer_step_pre_hook(hang_in_the_fifth_step_on_rank_1)
