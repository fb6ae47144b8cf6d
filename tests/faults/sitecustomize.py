"""A fault for ``plait verify`` to find, loaded only by the interpreters of a test that puts this
folder first on PYTHONPATH (Python imports ``sitecustomize`` at start-up): rank 1 of a distributed
run flips the sign of its first parameter's gradient before every optimizer step, as a reduction
with a wrong sign on one rank would. Nothing in plait can switch it on."""

import os

from torch.optim.optimizer import register_optimizer_step_pre_hook


def flip_first_gradient_on_rank_1(optimizer, args, kwargs) -> None:
    if os.environ.get("RANK") != "1" or os.environ.get("WORLD_SIZE", "1") == "1":
        return
    first = next(p for group in optimizer.param_groups for p in group["params"] if p.grad is not None)
    first.grad.neg_()


register_optimizer_step_pre_hook(flip_first_gradient_on_rank_1)
