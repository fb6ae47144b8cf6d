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
start equal, their gradients are summed across the two ranks after each step, so they stay equal.
Data and context parallelism over pipeline stages average gradients explicitly after the step
rather than through DDP, whose per-backward hooks cannot follow a backward split into input and
weight halves.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections import deque
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from plait.config import RunConfig
from plait.observe.run_files import write_json_atomically
from plait.observe.timeline import TIMELINE_PICTURE, draw_timeline
from plait.observe.trace import TRACE_FILE, timeline_events
from plait.parallel.grad_norm import scale_to_norm, total_norm
from plait.parallel.replicas import average_gradients
from plait.parallel.tensor import finish_tensor_gradients, vocab_parallel_loss
from plait.schedules.actions import Schedule
from plait.schedules.executor import Executor, StepRecord
from plait.schedules.generators import generate
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
            # Tied head on a stage without the embedding: project with the embedding's weight.
            head = nn.Linear(model.tok_embeddings.embedding_dim, model.tok_embeddings.num_embeddings,
                             bias=False, device="meta")
            head.weight = model.tok_embeddings.weight
            replace["output"] = head
        views[c] = _view(model, **replace)
    return views


class Pipeline:
    """One pipeline rank: its pruned model, its chunks and the executor that runs the schedule."""

    def __init__(self, model: nn.Module, schedule: Schedule, split: tuple[range, ...], topology: Topology):
        self.schedule, self.topology, self.device = schedule, topology, topology.device
        self.pp_group, self.pp_rank = topology.group("pp"), topology.coordinate("pp")
        self.model = prune_to_rank(model, schedule, self.pp_rank, split)
        self.chunks = chunk_views(self.model, schedule, self.pp_rank, split)
        self.holds_first = 0 in self.chunks
        self.holds_last = schedule.num_chunks - 1 in self.chunks
        self.tied = model.spec.tie_embeddings and schedule.pp > 1
        self.hidden = model.spec.hidden
        # Hidden states cross stages as sequence shards under sp (cp shards the token ids already).
        self.sequence_split = topology.size("tp") if topology.layout.sp else 1
        self.replica_dims = [dim for dim in ("dp", "cp") if topology.size(dim) > 1]
        self.spans: deque[list[Span]] = deque(maxlen=KEPT_STEPS)  # this rank's spans, one list per step
        self.steps_run = 0

    def step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], autocast,
             positions: torch.Tensor | None = None) -> StepRecord:
        """Forward and backward every micro-batch by the schedule; gradients end synchronised.

        ``positions`` are those of the sequence slice this rank holds (None: all of them). Returns
        this rank's record with ``loss`` (the mean loss of its tokens, on every pp rank).
        """
        count = len(micro_batches)
        targets = [t.to(self.device) for _, t in micro_batches]

        def loss_fn(logits: torch.Tensor, mb: int) -> torch.Tensor:
            return F.cross_entropy(logits.flatten(0, 1).float(), targets[mb].flatten()) / count

        def recv_shape(mb: int) -> tuple[int, ...]:
            batch, tokens = micro_batches[mb][0].shape
            return batch, tokens // self.sequence_split, self.hidden

        if positions is None:  # stages after the first see hidden states, not how long the sequence is
            positions = torch.arange(micro_batches[0][0].shape[1], device=self.device)
        chunks = {c: _Chunk(view, autocast, positions.to(self.device)) for c, view in self.chunks.items()}
        executor = Executor(self.schedule, self.pp_rank, chunks, loss_fn, recv_shape, self.pp_group, self.device)
        dist.barrier(group=self.pp_group)  # a common start, so every rank's spans share one clock origin
        with vocab_parallel_loss(self.topology):  # the last chunk's loss and its backward
            record = executor.run([inputs for inputs, _ in micro_batches])
        self._sync_gradients()
        loss = record.loss if record.loss is not None else torch.zeros((), device=self.device)
        last = dist.get_global_rank(self.pp_group, self.schedule.pp - 1)
        dist.broadcast(loss, src=last, group=self.pp_group)
        record.loss = loss
        origin = min((span.start for span in record.spans), default=0.0)
        self.spans.append([Span(s.action, s.start - origin, s.end - origin) for s in record.spans])
        self.steps_run += 1
        return record

    def train_step(self, optimizer: torch.optim.Optimizer, micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                   grad_clip: float, autocast, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over the pipeline; returns (this rank's mean loss, global grad norm)."""
        record = self.step(micro_batches, autocast, positions)
        norm = self.clip_gradients(grad_clip if grad_clip > 0 else math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return record.loss, norm

    def timelines(self) -> list[Timeline]:
        """Collective over the pp group: every step's measured timeline, all ranks together."""
        gathered: list[list[list[Span]] | None] = [None] * self.schedule.pp
        dist.all_gather_object(gathered, list(self.spans), group=self.pp_group)
        return [Timeline(tuple(tuple(rank[step]) for rank in gathered)) for step in range(len(self.spans))]

    def report(self, run_dir: Path | None) -> dict[str, float]:
        """Collective: measured (median over the kept steps, the first step left out as warm-up) and
        theoretical bubble fractions.

        With ``run_dir``, pp rank 0 draws the last step's timeline there and writes it as trace.json.
        """
        timelines = self.timelines()
        warmup_kept = self.steps_run == len(timelines) and len(timelines) > 1
        steady = timelines[1:] if warmup_kept else timelines
        measured = statistics.median(t.bubble_fraction for t in steady)
        if run_dir is not None and self.pp_rank == 0 and timelines:
            title = f"{self.schedule.name}, pp={self.schedule.pp}, m={self.schedule.microbatches}"
            if self.schedule.virtual_stages > 1:
                title += f", v={self.schedule.virtual_stages}"
            draw_timeline(timelines[-1], Path(run_dir) / TIMELINE_PICTURE, f"{title}: measured bubble {measured:.1%}")
            trace = {"traceEvents": timeline_events(timelines[-1]), "displayTimeUnit": "ms",
                     "otherData": {"measured": True, "step": self.steps_run - 1}}
            write_json_atomically(Path(run_dir) / TRACE_FILE, trace)
        return {"bubble_fraction": measured, "bubble_fraction_theory": theoretical_bubble(self.schedule)}

    @torch.no_grad()
    def _sync_gradients(self) -> None:
        finish_tensor_gradients(self.model)  # laid out as the parameters are, so the tied copies match
        if self.tied and (self.holds_first or self.holds_last):
            grad = _local(self.model.tok_embeddings.weight.grad)
            peer = self.schedule.pp - 1 if self.holds_first else 0
            other = torch.empty_like(grad)
            send = dist.isend(grad.contiguous(), group=self.pp_group, group_dst=peer)
            dist.recv(other, group=self.pp_group, group_src=peer)
            send.wait()
            grad += other
        average_gradients(self.model, self.topology, self.replica_dims)

    def clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm over every stage's gradients (a tied weight counted once); return the norm."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        counted = params
        if self.tied and self.holds_last and not self.holds_first:
            counted = [p for p in params if p is not self.model.tok_embeddings.weight]
        squares = total_norm([p.grad for p in counted]).square()
        dist.all_reduce(squares, group=self.pp_group)
        norm = squares.sqrt()
        scale_to_norm([p.grad for p in params], max_norm, norm)
        return norm


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class _Chunk(nn.Module):
    """Runs a chunk at the rank's sequence positions, inside the run's precision context."""

    def __init__(self, chunk: nn.Module, autocast, positions: torch.Tensor):
        super().__init__()
        self.chunk, self.autocast, self.positions = chunk, autocast, positions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.chunk(x, self.positions)


def apply_pipeline(model: nn.Module, config: RunConfig, topology: Topology) -> Pipeline:
    """Split the seeded ``model`` (tensor and context parallelism already applied) for this rank's
    place on the mesh's pp dimension."""
    layout = config.layout
    schedule = generate(layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages)
    split = split_layers(config.model, layout.pp, layout.virtual_stages, layout.stage_layers)
    return Pipeline(model, schedule, split, topology)
