"""Pipeline parallelism applied from outside: cut the single-device model into stage chunks.

Each pipeline rank keeps one pruned ``Transformer`` holding only its chunks' blocks (plus the
embedding on the first stage and the final norm and head on the last), so every parameter keeps
its single-device name and checkpoints map one to one. Each chunk runs through a *view*: a shallow
copy of that model whose ``layers`` holds only the chunk's blocks and whose embedding or head is
``None`` where the chunk does not own it, so ``Transformer.forward`` runs unchanged.

Tensor, sequence and context parallelism are applied to the whole model before it is cut, so a
stage is a slice of the tensor-parallel model: hidden states cross stages as each rank's local
tensor (a sequence shard under sp or cp), and the last stage takes the loss on vocabulary shards.

Tied embeddings (GPT-2) live on the first and last stages at once, as in Megatron-LM: both copies
start equal and ``plait.parallel.gradients`` sums their gradients after each step, so they stay
equal (the executor starts each chunk's dp·cp reduction during the schedule). The pipeline returns
data — the loss, the measured timelines and the bubble figures — and draws nothing: the training
loop hands them to ``plait.observe``.
"""

from __future__ import annotations

import copy
import statistics
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from plait.models.vocabulary import vocabulary_logits
from plait.progress import Progress
from plait.parallel.pipeline_executor import BoundaryTransfers, ChunkReduction, Executor, StepRecord
from plait.parallel.cross_entropy import CROSS_ENTROPY_ONLY, TrainingLoss
from plait.schedules.actions import Schedule
from plait.schedules.forward_only import forward_only
from plait.schedules.registry import generate
from plait.schedules.simulate import Span, Timeline, theoretical_bubble
from plait.schedules.split import split_layers
from plait.topology import Topology

KEPT_STEPS = 50  # the bubble is measured over (at most) the last this many steps


def _view(model: nn.Module, **modules: nn.Module | None) -> nn.Module:
    """A shallow copy of ``model`` sharing its parameters, with some submodules replaced."""
    view = copy.copy(model)
    view._modules = dict(model._modules)
    for name, module in modules.items():
        view.__dict__.pop(name, None)  # a submodule absent at construction is a plain None attribute
        view._modules[name] = module
    return view


def prune_to_rank(model: nn.Module, schedule: Schedule, rank: int, split: tuple[range, ...]) -> nn.Module:
    """Drop, in place, every block and end piece that pipeline rank ``rank`` does not hold."""
    chunks = schedule.chunks_of(rank)
    owned = {str(i) for c in chunks for i in split[c]}
    first, last = 0 in chunks, schedule.num_chunks - 1 in chunks
    model.layers = nn.ModuleDict({k: v for k, v in model.layers.items() if k in owned})
    tied = model.spec.tie_embeddings
    if not first:
        model.pos_embeddings = None
        if not (last and tied):
            model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model


class TiedHead(nn.Module):
    """The tied head of a stage without the embedding: it projects with the embedding's weight,
    read when called, so a wrapper that replaces the weight (FSDP2) is followed."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return vocabulary_logits(hidden, self.embedding.weight)


def chunk_views(model: nn.Module, schedule: Schedule, rank: int, split: tuple[range, ...]) -> dict[int, nn.Module]:
    """One runnable module per chunk of ``rank`` over the pruned ``model``'s parameters."""
    views = {}
    last_chunk = schedule.num_chunks - 1
    for c in schedule.chunks_of(rank):
        layers = nn.ModuleDict({str(i): model.layers[str(i)] for i in split[c]})
        replace: dict[str, nn.Module | None] = {"layers": layers}
        if c != 0:
            replace.update(tok_embeddings=None, pos_embeddings=None)
        if c != last_chunk:
            replace.update(norm=None, output=None)
        elif model.spec.tie_embeddings and c != 0:
            replace["output"] = TiedHead(model.tok_embeddings)
        views[c] = _view(model, **replace)
    return views


@dataclass
class PipelineMeasurement:
    """The kept steps' measured timelines (every pp rank) and the bubble figures."""

    timelines: list[Timeline]
    bubble_fraction: float
    bubble_fraction_theory: float

    @property
    def figures(self) -> dict[str, float]:
        return {"bubble_fraction": self.bubble_fraction, "bubble_fraction_theory": self.bubble_fraction_theory}


class Pipeline:
    """One pipeline rank: its pruned model, its chunks and the executor that runs the schedule."""

    def __init__(self, model: nn.Module, schedule: Schedule, split: tuple[range, ...], topology: Topology):
        self.schedule, self.topology, self.device = schedule, topology, topology.device
        self.pp_group, self.pp_rank = topology.group("pp"), topology.coordinate("pp")
        self.model = prune_to_rank(model, schedule, self.pp_rank, split)
        self.chunks = chunk_views(self.model, schedule, self.pp_rank, split)
        holds_first, holds_last = 0 in self.chunks, schedule.num_chunks - 1 in self.chunks
        tied = model.spec.tie_embeddings and schedule.pp > 1
        # The pp rank with the other copy of the tied embedding, if this rank holds one.
        self.tied_peer = (schedule.pp - 1 if holds_first else 0) if tied and (holds_first or holds_last) else None
        self.hidden = model.spec.hidden
        # Hidden states cross stages as sequence shards under sp (cp shards the token ids already).
        self.sequence_split = topology.size("tp") if topology.layout.sp else 1
        self.spans: deque[list[Span]] = deque(maxlen=KEPT_STEPS)  # this rank's spans, one list per step
        self.last_step_spans: list[Span] = []  # the last step's, in time.perf_counter seconds
        self.steps_run = 0
        # plait's hooks reducing each chunk's gradients over dp once final (set by parallelize; None: none).
        self.gradient_buckets: ChunkReduction | None = None

    def forward_backward(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], autocast,
                         positions: torch.Tensor | None = None, progress: Progress | None = None,
                         loss: TrainingLoss = CROSS_ENTROPY_ONLY) -> torch.Tensor:
        """Forward and backward every micro-batch by the schedule, each chunk's data-parallel
        reduction started once its gradients are final (``gradient_buckets``) and left in flight.

        ``positions`` are those of the sequence slice this rank holds (None: all of them). Returns
        the mean loss of this rank's tokens, on every pp rank. ``progress`` records each action, for
        the stall watchdog; ``loss`` is what the last stage minimises.
        """
        mean, record = self._execute(self.schedule, micro_batches, autocast, positions, progress or Progress(), loss)
        self.last_step_spans = record.spans
        origin = min((span.start for span in record.spans), default=0.0)
        self.spans.append([Span(s.action, s.start - origin, s.end - origin) for s in record.spans])
        self.steps_run += 1
        return mean

    @torch.no_grad()
    def evaluate(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], autocast,
                 positions: torch.Tensor | None = None) -> torch.Tensor:
        """The mean loss of this rank's tokens by the schedule's forwards alone (no gradients, no timeline)."""
        return self._execute(forward_only(self.schedule), micro_batches, autocast, positions, Progress(),
                             CROSS_ENTROPY_ONLY)[0]

    def _execute(self, schedule: Schedule, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], autocast,
                 positions: torch.Tensor | None, progress: Progress,
                 loss: TrainingLoss) -> tuple[torch.Tensor, StepRecord]:
        count = len(micro_batches)
        targets = [t.to(self.device) for _, t in micro_batches]

        def loss_fn(logits: torch.Tensor, mb: int) -> torch.Tensor:
            return loss(logits, targets[mb], count)

        def recv_shape(mb: int) -> tuple[int, ...]:
            batch, tokens = micro_batches[mb][0].shape
            return batch, tokens // self.sequence_split, self.hidden

        if positions is None:  # stages after the first see hidden states, not how long the sequence is
            positions = torch.arange(micro_batches[0][0].shape[1], device=self.device)
        chunks = {c: _Chunk(view, autocast, positions.to(self.device)) for c, view in self.chunks.items()}
        # Evaluation's forward-only schedule computes no gradients: nothing to reduce.
        reduction = self.gradient_buckets if schedule is self.schedule else None
        # Hidden states and their gradients cross stages in the residual stream's dtype, the weights'.
        dtype = next(self.model.parameters()).dtype
        executor = Executor(schedule, self.pp_rank, chunks, loss_fn,
                            BoundaryTransfers(self.pp_group, self.device, recv_shape, dtype), reduction, progress)
        progress.operation("pp barrier before the schedule")
        dist.barrier(group=self.pp_group)  # a common start, so every rank's spans share one clock origin
        record = executor.run([inputs for inputs, _ in micro_batches])
        loss = record.loss if record.loss is not None else torch.zeros((), device=self.device)
        last = dist.get_global_rank(self.pp_group, self.schedule.pp - 1)
        progress.operation(f"pp loss broadcast from rank {last}")
        dist.broadcast(loss, src=last, group=self.pp_group)
        return loss, record

    def timelines(self) -> list[Timeline]:
        """Collective over the pp group: every step's measured timeline, all ranks together."""
        gathered: list[list[list[Span]] | None] = [None] * self.schedule.pp
        dist.all_gather_object(gathered, list(self.spans), group=self.pp_group)
        return [Timeline(tuple(tuple(rank[step]) for rank in gathered)) for step in range(len(self.spans))]

    def measure(self) -> PipelineMeasurement:
        """Collective: the kept timelines, the measured bubble fraction (median over them, the first
        step left out as warm-up) and the schedule's theoretical one."""
        timelines = self.timelines()
        warmup_kept = self.steps_run == len(timelines) and len(timelines) > 1
        steady = timelines[1:] if warmup_kept else timelines
        measured = statistics.median(t.bubble_fraction for t in steady)
        return PipelineMeasurement(timelines, measured, theoretical_bubble(self.schedule))


class _Chunk(nn.Module):
    """Runs a chunk at the rank's sequence positions, inside the run's precision context."""

    def __init__(self, chunk: nn.Module, autocast, positions: torch.Tensor):
        super().__init__()
        self.chunk, self.autocast, self.positions = chunk, autocast, positions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.chunk(x, self.positions)


def build_pipeline(model: nn.Module, topology: Topology) -> Pipeline:
    """Split the seeded ``model`` (tensor and context parallelism already applied) for this rank's
    place on the mesh's pp dimension, by the schedule and stage split of ``topology``'s layout."""
    layout = topology.layout
    schedule = generate(layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages)
    split = split_layers(model.spec, layout.pp, layout.virtual_stages, layout.stage_layers)
    return Pipeline(model, schedule, split, topology)
