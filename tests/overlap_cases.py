"""What the pool runs on every rank to see when plait's data-parallel buckets go out (module level,
so it pickles by name)."""

from __future__ import annotations

import contextlib
import time

import torch

from plait.config import RunConfig
from plait.topology import build_topology


def first_reduction(config: RunConfig, in_backward: bool = True) -> dict:
    """One training step of ``config`` with its dp buckets watched: how many there are, the share of
    the gradients backward had accumulated when the first went out, and when it went out beside the
    last chunk's backward action (armed before it begins, closed as it ends)."""
    from plait.parallel.context import context_shard
    from plait.train.data import BatchSource, training_tokens
    from plait.train.loop import parallelize_run, train_step

    cpu = torch.device("cpu")
    topology = build_topology(config.layout, cpu)
    parallel = parallelize_run(config, topology)
    buckets = parallel.gradient_buckets
    buckets.in_backward = in_backward
    params = [param for bucket in buckets.buckets for param in bucket]
    accumulated, sends, arms, closes = [0], [], [], []
    for param in params:  # registered after the buckets' own hooks: counts a gradient once they saw it
        param.register_post_accumulate_grad_hook(lambda _: accumulated.__setitem__(0, accumulated[0] + 1))

    def watch(method, times: list, share: bool = False):
        def watched(*args):
            times.append((time.perf_counter(), accumulated[0] / len(params)) if share else time.perf_counter())
            return method(*args)
        return watched

    buckets._send = watch(buckets._send, sends, share=True)
    buckets.arm, buckets.close = watch(buckets.arm, arms), watch(buckets.close, closes)
    source = BatchSource(training_tokens(config.train.data, config.model.vocab, config.model.seq_len),
                         config.model.seq_len, config.train.global_batch, config.train.seed)
    inputs, targets = source.local_batch(0, topology.coordinate("dp"), topology.size("dp"))
    inputs, targets, positions = context_shard(inputs, targets, topology)
    count = config.layout.microbatches
    train_step(parallel, list(zip(inputs.chunk(count), targets.chunk(count))), config.train.grad_clip,
               contextlib.nullcontext, positions)
    first_send, share = sends[0]
    return {
        "buckets": len(buckets.buckets), "sends": len(sends), "accumulated_at_first_send": share,
        "before_last_arm": bool(arms) and first_send < max(arms),
        "before_last_close": bool(closes) and first_send < max(closes),
    }


def reducers_left_after_training(config: RunConfig) -> int:
    """Train ``config``, let the result go and collect: how many optimizers and bucketed gradient
    reductions are still alive (hooks on the parameters must not keep the model from being freed)."""
    import gc

    from plait.parallel.data_parallel.gradient_buckets import GradientBuckets
    from plait.train.loop import train

    train(config, build_topology(config.layout, torch.device("cpu")))
    gc.collect()
    return sum(isinstance(obj, (GradientBuckets, torch.optim.Optimizer)) for obj in gc.get_objects())
