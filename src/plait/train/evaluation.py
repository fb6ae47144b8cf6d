"""``--eval-every K``: the loss on held-out tokens that training never reads.

The tokens are ``--eval-data``'s, a validation file of the training data's formats, checked as it
is; without one, the split (``plait.train.data.held_out_split``): the last tenth of the token stream
(at least one sequence and its target) is held out, and training draws its sequences from the rest
only. Every evaluation scores the same ``EVAL_BATCHES`` global batches of held-out sequences (drawn
from the held-out stream by the run's seed, as training draws its own), forward only, under the
run's layout: a pipeline runs the schedule's forwards alone. The number is the mean token loss, the
same under every layout, as the training loss is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from plait.parallel.context import average_over_context, context_shard
from plait.parallel.parallelize import Parallelized
from plait.parallel.cross_entropy import cross_entropy
from plait.train.data import BatchSource, held_out_split, training_tokens

EVAL_BATCHES = 4


class Evaluator:
    """Scores the model on the held-out batches: ``evaluate(parallel, autocast)`` → mean loss, on every rank."""

    def __init__(self, held_out: np.ndarray, seq_len: int, global_batch: int, seed: int, microbatches: int):
        self.source = BatchSource(held_out, seq_len, global_batch, seed)
        self.microbatches = microbatches

    @torch.no_grad()
    def evaluate(self, parallel: Parallelized, autocast: Callable[[], contextlib.AbstractContextManager]) -> float:
        topology = parallel.topology
        dp_rank, dp_size = topology.coordinate("dp"), topology.size("dp")
        total = torch.zeros((), device=topology.device)
        for batch in range(EVAL_BATCHES):
            inputs, targets = self.source.local_batch(batch, dp_rank, dp_size)
            inputs, targets, positions = context_shard(inputs, targets, topology)
            micro = list(zip(inputs.chunk(self.microbatches), targets.chunk(self.microbatches)))
            if parallel.pipeline is not None:
                total += parallel.pipeline.evaluate(micro, autocast, positions)
            else:
                total += forward_loss(parallel, micro, autocast, positions)
        dist.all_reduce(total, op=dist.ReduceOp.AVG, group=topology.group("dp"))
        average_over_context(total, topology)
        return total.item() / EVAL_BATCHES


def forward_loss(parallel: Parallelized, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                 autocast: Callable[[], contextlib.AbstractContextManager], positions: torch.Tensor | None) -> torch.Tensor:
    """This rank's mean loss over the micro-batches, forward only."""
    device, loss = parallel.topology.device, torch.zeros((), device=parallel.topology.device)
    for inputs, targets in micro_batches:
        with autocast():
            loss += cross_entropy(parallel.model(inputs.to(device), positions), targets)
    return loss / len(micro_batches)


def split_for_evaluation(tokens: np.ndarray, config) -> tuple[np.ndarray, Evaluator | None]:
    """The tokens training may read and, with --eval-every, the evaluator of --eval-data or of the rest
    (a ``RunConfig``)."""
    train, seq_len = config.train, config.model.seq_len
    if not train.eval_every:
        return tokens, None
    if train.eval_data:
        scored = training_tokens(train.eval_data, config.model.vocab, seq_len, "--eval-data")
    else:
        tokens, scored = held_out_split(tokens, seq_len, train.data or "the default corpus")
    return tokens, Evaluator(scored, seq_len, train.global_batch, train.seed, config.layout.microbatches)
