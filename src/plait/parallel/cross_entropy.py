"""The loss: mean cross entropy over tokens, in fp32, without an fp32 copy of the whole logits.

``F.cross_entropy(logits.float(), ...)`` (and DTensor's ``loss_parallel``) keeps an fp32
log-softmax as wide as the vocabulary for its backward, beside the bf16 logits and a transient fp32
copy: at a 128k vocabulary and 8k tokens, 4 GB a micro-batch. Here the logits are read a block of
rows at a time in fp32, and the gradient, softmax minus the target's one-hot, is made in the
forward, a block at a time, in the logits' dtype: what the loss holds until its backward is that
gradient alone, as wide as the logits and no wider (Liger's and torchtune's fused losses do the
same). The values are the fp32 cross entropy's (the same max-shifted log-sum-exp).

Under tensor parallelism the logits are split by vocabulary (a DTensor sharded on its last
dimension): each rank reads its columns, and two all-reduces over the tp group of one value per
token make the log-sum-exp and the target's logit whole (Megatron's vocab-parallel cross entropy).
Our own rather than ``loss_parallel`` for its memory, as above.

``z_loss`` adds PaLM's auxiliary term, the coefficient times the squared log-sum-exp of each token's
logits, which keeps the softmax's normaliser near 1 and the logits from drifting up in bf16. Its
gradient is the softmax times ``2 · z_loss · lse``, made in the same pass as the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor

# fp32 values of one block of logits' rows read at a time: 64 MiB.
BLOCK_ELEMENTS = 1 << 24


def _blocks(rows: int, columns: int) -> list[slice]:
    step = max(1, BLOCK_ELEMENTS // max(columns, 1))
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def _reduce(values: torch.Tensor, op: str, group) -> torch.Tensor:
    """``values`` reduced over ``group`` (functional, as plait's other collectives: the trace sees it)."""
    return values if group is None else funcol.all_reduce(values, op, group).wait()


class _VocabularyCrossEntropy(torch.autograd.Function):
    """Sum over rows of cross entropy plus ``z_loss`` times the squared log-sum-exp, times ``scale``,
    of (rows, columns) logits whose columns are vocabulary ids ``first_id`` onwards of a vocabulary
    split over ``group`` (None: whole)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, group, first_id: int, scale: float,
                z_loss: float) -> torch.Tensor:
        rows, columns = logits.shape
        local = targets - first_id
        owned = (local >= 0) & (local < columns)
        picked = torch.zeros(rows, dtype=torch.float32, device=logits.device)
        owned_rows = owned.nonzero().squeeze(1)
        picked[owned_rows] = logits[owned_rows, local[owned_rows]].float()
        maxima = torch.empty(rows, dtype=torch.float32, device=logits.device)
        sums = torch.empty(rows, dtype=torch.float32, device=logits.device)
        for block in _blocks(rows, columns):  # each rank's log-sum-exp about its own maxima
            values = logits[block].float()
            maxima[block] = values.amax(dim=1)
            sums[block] = (values - maxima[block, None]).exp().sum(dim=1)
        local_maxima, maxima = maxima, _reduce(maxima, "max", group)
        # About the common maxima (a rank whose columns are all masked padding adds nothing).
        sums = torch.where(torch.isfinite(local_maxima), sums * (local_maxima - maxima).exp(), 0.0)
        sums, picked = _reduce(torch.stack((sums, picked)), "sum", group)
        log_sum_exp = sums.log() + maxima
        loss = ((log_sum_exp - picked).sum() + z_loss * log_sum_exp.square().sum()) * scale
        if ctx.needs_input_grad[0]:  # the gradient is made only for a backward to come
            gradient = torch.empty(rows, columns, dtype=logits.dtype, device=logits.device)
            # d/dlogit of lse is the softmax; of z·lse², the softmax times 2·z·lse
            row_scale = (1 + 2 * z_loss * log_sum_exp) * scale
            for block in _blocks(rows, columns):
                values = logits[block].float()
                gradient[block] = (values - maxima[block, None]).exp() / sums[block, None] * row_scale[block, None]
            gradient[owned_rows, local[owned_rows]] -= scale
            ctx.save_for_backward(gradient)
        return loss

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (gradient,) = ctx.saved_tensors
        return gradient * grad_output.to(gradient.dtype), None, None, None, None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, divisor: int = 1, z_loss: float = 0.0) -> torch.Tensor:
    """Mean cross entropy of (batch, seq, vocab) ``logits`` against (batch, seq) ``targets``, plus
    ``z_loss`` times the mean squared log-sum-exp, divided by ``divisor`` (the micro-batches a step
    averages over); logits split by vocabulary over tensor parallelism as a DTensor sharded on their
    last dimension. A plain fp32 scalar tensor."""
    group, first_id = None, 0
    if isinstance(logits, DTensor):
        mesh = logits.device_mesh
        group, first_id = mesh.get_group(), mesh.get_local_rank() * logits.to_local().shape[-1]
        logits = logits.to_local()
    flat_logits, flat_targets = logits.flatten(0, 1), targets.flatten().to(logits.device)
    scale = 1.0 / (flat_targets.numel() * divisor)
    return _VocabularyCrossEntropy.apply(flat_logits, flat_targets, group, first_id, scale, z_loss)


@dataclass(frozen=True)
class TrainingLoss:
    """What training minimises: the cross entropy, plus ``z_loss`` times the mean squared log-sum-exp
    of the logits (``--z-loss``; 0: none). Evaluation scores the cross entropy alone."""

    z_loss: float = 0.0

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, divisor: int = 1) -> torch.Tensor:
        return cross_entropy(logits, targets, divisor, self.z_loss)


CROSS_ENTROPY_ONLY = TrainingLoss()
