"""Compressed data-parallel gradient communication: ``--grad-compression {none,bf16,powersgd}``.

Gradient compression is the classic answer to the data-parallel all-reduce's cost: fewer bytes on
the wire for the same step. plait puts it into each mechanism that reduces data-parallel gradients
(``plait.parallel.gradients`` says which runs where), with PyTorch's own pieces, never a transport
of its own:

=====================================================  ==============================================
where the dp gradients are reduced                     ``bf16``
=====================================================  ==============================================
FSDP2 (ZeRO-3)                                         ``MixedPrecisionPolicy(reduce_dtype=bfloat16)``
``GradientReduceScatter`` (ZeRO-2)                     buckets packed in bf16, reduce-scattered, widened
``GradientAllReduce`` (ZeRO 0–1)                       buckets packed in bf16, all-reduced, widened
=====================================================  ==============================================

bf16 keeps fp32's exponent range, so only the mantissa is cut (8 bits: a relative rounding of at
most 2⁻⁹ per element, once before and once after the sum). ``powersgd`` (Vogels et al. 2019) is
DDP's ``powerSGD_hook``: each gradient matrix travels as two rank-``POWERSGD_RANK`` factors, with
error feedback (what compression lost on a rank is added to its next gradient) and a warm start
(last step's Q seeds this one's power iteration); it is lossy, and it needs whole gradients on every
rank, so ``plait.facts.validity`` refuses it wherever DDP does not reduce (ZeRO 2–3, tp, pp). The
bytes each moves per step are ``plait.facts.model_state.communicated_bytes`` and
``reduced_gradient_elements``, which the planner times.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.nn.parallel import DistributedDataParallel

from plait.facts.model_state import POWERSGD_MIN_COMPRESSION_RATE, POWERSGD_RANK, POWERSGD_START_STEP
from plait.parallel.data_parallel.gradient_buckets import GradientBuckets
from plait.topology import Topology


def powersgd_state(group: dist.ProcessGroup) -> PowerSGDState:
    """PowerSGD's state for one DDP model: rank-8 factors, error feedback, warm start, uncompressed
    for the first ``POWERSGD_START_STEP`` steps (the same seed on every rank, so their random Q agree)."""
    return PowerSGDState(
        process_group=group, matrix_approximation_rank=POWERSGD_RANK, start_powerSGD_iter=POWERSGD_START_STEP,
        min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE, use_error_feedback=True, warm_start=True, random_seed=0,
    )


def powersgd_hook(state, bucket):  # no hints: DDP checks them as objects, and this module's are strings
    """torch's ``powerSGD_hook``; on gloo, waited for before the backward pass goes on. Its P and Q
    all-reduces are issued from the future's callbacks, which gloo runs on its own threads, so the
    next bucket's all-reduce, issued meanwhile by backward, could reach the ranks in another order
    (NCCL runs the callbacks as the work is queued, in order)."""
    future = powerSGD_hook(state, bucket)
    if dist.get_backend(state.process_group) == "gloo":
        future.wait()
    return future


def compress_gradients(model: nn.Module, optimizer: torch.optim.Optimizer, topology: Topology,
                       buckets: GradientBuckets | None = None) -> None:
    """Put the layout's gradient compression into the reduction that runs during backward: PowerSGD as
    DDP's comm hook, or the bf16 wire of plait's own ``buckets`` (ZeRO-2's reduce-scatter, or ZeRO
    0/1's all-reduce; default ZeRO-2's, from the optimizer). (FSDP2 takes it as it wraps the model:
    ``compressed_policy``.)"""
    compression = topology.layout.grad_compression
    if compression == "none" or topology.size(topology.replica_dim) == 1:
        return
    if isinstance(model, DistributedDataParallel):
        model.register_comm_hook(powersgd_state(topology.group(topology.replica_dim)), powersgd_hook)
    elif compression == "bf16" and (buckets := buckets or getattr(optimizer, "gradient_shards", None)) is not None:
        buckets.wire_dtype = torch.bfloat16


def compressed_policy(policy: MixedPrecisionPolicy, compression: str) -> MixedPrecisionPolicy:
    """FSDP2's mixed-precision policy with its gradient reduce-scatter in bf16 under bf16 compression."""
    return replace(policy, reduce_dtype=torch.bfloat16) if compression == "bf16" else policy
