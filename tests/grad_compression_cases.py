"""What the gradient-compression tests run on every rank of the pool (module level, so they pickle)."""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from plait.config import RunConfig
from plait.topology import build_topology

REDUCING = ("allreduce", "all_reduce", "reduce_scatter")


class GradientBytes(TorchDispatchMode):
    """Bytes handed to all-reduces and reduce-scatters of more than one element while the region runs,
    by op, whichever thread issues them: the dispatch mode sees those issued on this thread (DDP's
    reducer, torch's hooks, FSDP2, functional collectives); ``torch.distributed.all_reduce`` is
    wrapped for those a comm hook's callbacks issue on the backend's threads (PowerSGD's P and Q)."""

    def __init__(self):
        super().__init__()
        self.bytes: Counter[str] = Counter()

    def _count(self, name: str, tensors) -> None:
        tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.numel() > 1:
                self.bytes[name] += tensor.numel() * tensor.element_size()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func._overloadpacket)
        if any(word in name for word in REDUCING):
            # c10d's reduce-scatter takes (output, input): the input is what the rank hands it.
            self._count(name, args[1] if name.endswith("_reduce_scatter_base_") else args[0])
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._all_reduce = original = dist.all_reduce

        def counted(tensor, *args, **kwargs):
            self._count("dist.all_reduce", tensor)
            with _disable_current_modes():  # counted here, not again by the mode on this thread
                return original(tensor, *args, **kwargs)

        dist.all_reduce = counted
        return super().__enter__()

    def __exit__(self, *exc):
        dist.all_reduce = self._all_reduce
        return super().__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def gradient_bytes_per_step(config: RunConfig) -> list[int]:
    """Train ``config`` (no cp) with the engine's own train_step; the bytes each step's gradient
    reduction handed its collectives (the loss's all-reduce, outside train_step, not counted)."""
    from plait.train.data import BatchSource, training_tokens
    from plait.train.loop import parallelize_run, train_step

    topology = build_topology(config.layout, torch.device("cpu"))
    parallel = parallelize_run(config, topology)
    source = BatchSource(training_tokens(config.train.data, config.model.vocab, config.model.seq_len),
                         config.model.seq_len, config.train.global_batch, config.train.seed)
    per_step = []
    for step in range(config.train.steps):
        inputs, targets = source.local_batch(step, topology.coordinate("dp"), topology.size("dp"))
        micro = list(zip(inputs.chunk(config.layout.microbatches), targets.chunk(config.layout.microbatches)))
        with GradientBytes() as counted:
            train_step(parallel, micro, config.train.grad_clip, contextlib.nullcontext)
        per_step.append(counted.total)
    return per_step
