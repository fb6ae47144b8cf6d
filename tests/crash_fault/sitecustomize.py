"""A crash for the launcher to report, loaded only by the interpreters of a test that puts this
folder first on PYTHONPATH (Python imports ``sitecustomize`` at start-up): rank 1 of a distributed
run raises in its third optimizer step, in every attempt of the group, as a bug on one rank would.
Nothing in plait can switch it on."""

import os

from torch.optim.optimizer import register_optimizer_step_pre_hook

steps = []


def raise_in_the_third_step_on_rank_1(optimizer, args, kwargs) -> None:
    if os.environ.get("RANK") != "1" or os.environ.get("WORLD_SIZE", "1") == "1":
        return
    steps.append(None)
    if len(steps) == 3:
        raise RuntimeError("injected crash on rank 1")


register_optimizer_step_pre_hook(raise_in_the_third_step_on_rank_1)
