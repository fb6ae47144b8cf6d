"""The pipeline's runtime: run any checked action list on torch.distributed, recording when each
action ran.

Our own runtime rather than ``torch.distributed.pipelining``'s: that one runs its own schedule
classes over ``PipelineStage`` objects and records no per-action times, while here the action list
itself is the program and every action's span is the measurement. The split backward of
zero-bubble schedules reuses PyTorch's ``stage_backward_input`` / ``stage_backward_weight``. It
lives beside the pipeline split rather than with the lists in ``plait.schedules``, which stay
torch-free data the planner shares.

Blocking rules (the ones ``plait.schedules.simulate`` plays): a send is an ``isend`` the rank does
not wait for (its handle is kept and waited at the end of the step); a receive blocks at its place
in the list until the message is there. Activations and gradients travel with different tags, so
each (sender, receiver, activation|grad) pair is one ordered channel. The ``irecv`` behind a
receive is posted a few receives ahead (``PREFETCHED_RECEIVES``), in list order so channels stay matched:
gloo moves a message only once its receive is posted, and a receive posted at the last moment would
add a round trip to the peer's communication thread to every transfer.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from plait.progress import Progress
from plait.schedules.actions import Action, Kind, Schedule
from plait.schedules.simulate import Span

TAGS = {Kind.SEND_ACTIVATION: 0, Kind.RECV_ACTIVATION: 0, Kind.SEND_GRAD: 1, Kind.RECV_GRAD: 1}
PREFETCHED_RECEIVES = 4
LossFn = Callable[[torch.Tensor, int], torch.Tensor]
GRADIENT_KINDS = (Kind.BACKWARD, Kind.BACKWARD_WEIGHT)  # the actions that accumulate weight gradients
# Each action in words, as the stall watchdog reports it (a transfer names its peer after these).
OPERATIONS = {Kind.FORWARD: "forward", Kind.BACKWARD: "backward", Kind.BACKWARD_INPUT: "input backward",
              Kind.BACKWARD_WEIGHT: "weight backward", Kind.SEND_ACTIVATION: "send activation to",
              Kind.RECV_ACTIVATION: "recv activation from", Kind.SEND_GRAD: "send gradient to",
              Kind.RECV_GRAD: "recv gradient from"}


class ChunkReduction(Protocol):
    """A chunk's data-parallel gradient reduction (plait.parallel.data_parallel.gradient_buckets): ``arm`` before
    the chunk's last backward action of the step, ``close`` after it; neither waits."""

    def arm(self, chunk: int) -> None: ...

    def close(self, chunk: int) -> None: ...


def last_gradient_actions(actions: list[Action]) -> dict[int, int]:
    """Index of each chunk's last action that accumulates its weight gradients (B, or W when split)."""
    return {action.chunk: index for index, action in enumerate(actions) if action.kind in GRADIENT_KINDS}


@dataclass
class _MicroState:
    """What one (chunk, micro-batch) keeps between its forward and its backward."""

    input: torch.Tensor | None = None
    output: torch.Tensor | None = None
    output_grad: torch.Tensor | None = None
    param_groups: list | None = None


@dataclass(frozen=True)
class BoundaryTransfers:
    """How the hidden states that cross between chunks, and their gradients, travel: over ``group``
    (None in one process) to and from ``device``, each micro-batch's ``recv_shape(mb)``, in ``dtype``."""

    group: dist.ProcessGroup | None
    device: torch.device
    recv_shape: Callable[[int], tuple[int, ...]]
    dtype: torch.dtype = torch.float32


@dataclass
class StepRecord:
    """One rank's step: the summed micro-batch loss (last stage only) and every action's span."""

    loss: torch.Tensor | None
    spans: list[Span] = field(default_factory=list)
    peak_in_flight: int = 0  # most (chunk, micro-batch) activations held at once, from F to B or W


class Executor:
    """Runs one rank's list of ``schedule`` over its stage chunks.

    ``chunks`` maps each chunk this rank holds to a module taking the chunk's input (token ids on
    chunk 0, hidden states after) to its output (logits on the last chunk). ``loss_fn(logits, mb)``
    gives the last chunk's loss, already scaled for accumulation. ``transfers`` says how what crosses
    between chunks travels, and the device the rank computes on. ``reduction`` starts
    each chunk's data-parallel gradient reduction right after its last backward action, so it
    overlaps what is left of the schedule. ``progress`` records each action as it starts, for the
    stall watchdog.
    """

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        chunks: Mapping[int, nn.Module],
        loss_fn: LossFn,
        transfers: BoundaryTransfers,
        reduction: ChunkReduction | None = None,
        progress: Progress | None = None,
    ):
        self.schedule, self.rank, self.chunks = schedule, rank, chunks
        self.loss_fn, self.recv_shape, self.group = loss_fn, transfers.recv_shape, transfers.group
        self.device, self.dtype = transfers.device, transfers.dtype
        self.last_chunk = schedule.num_chunks - 1
        self.reduction = reduction
        self.progress = progress or Progress()
        # Global ranks of the pp group's members: the watchdog names a transfer's peer as the job knows it.
        self.global_ranks = (dist.get_process_group_ranks(self.group) if self.group is not None
                             else list(range(schedule.pp)))
        self.final = {index: chunk for chunk, index in last_gradient_actions(schedule.actions[rank]).items()}

    def run(self, inputs: list[torch.Tensor]) -> StepRecord:
        """Execute the rank's list for micro-batch inputs ``inputs`` (token ids, one per micro-batch)."""
        states: dict[tuple[int, int], _MicroState] = {}
        sends: list[dist.Work] = []
        loss = torch.zeros((), device=self.device) if self.last_chunk in self.chunks else None
        record = StepRecord(loss)
        synchronize = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        held = 0
        actions = self.schedule.actions[self.rank]
        upcoming = deque(i for i, action in enumerate(actions) if action.kind.is_recv)
        posted: dict[int, tuple[dist.Work, torch.Tensor]] = {}
        for index, action in enumerate(actions):
            while upcoming and len(posted) < PREFETCHED_RECEIVES:
                ahead = upcoming.popleft()
                posted[ahead] = self._post_receive(actions[ahead])
            state = states.setdefault((action.chunk, action.microbatch), _MicroState())
            final = self.reduction is not None and index in self.final
            if final:
                self.reduction.arm(action.chunk)  # its hooks send buckets as this backward fills them
            waits_for = self.global_ranks[action.peer] if action.kind.is_recv else None
            self.progress.operation(self._operation(action), waits_for)
            start = time.perf_counter()
            if action.kind is Kind.FORWARD:
                self._forward(action, state, states, inputs, record)
                held += 1
                record.peak_in_flight = max(record.peak_in_flight, held)
            elif action.kind is Kind.BACKWARD:
                self._backward_full(action, state, states)
                held -= 1
            elif action.kind is Kind.BACKWARD_INPUT:
                self._backward_input(action, state, states)
            elif action.kind is Kind.BACKWARD_WEIGHT:
                self._backward_weight(action, state)
                held -= 1
            elif action.kind is Kind.SEND_ACTIVATION:
                sends.append(self._send(action, state.output))
            elif action.kind is Kind.SEND_GRAD:
                sends.append(self._send(action, state.input.grad))
                state.input = None
            else:
                buffer = self._receive(action, *posted.pop(index))
                if action.kind is Kind.RECV_ACTIVATION:
                    state.input = buffer.requires_grad_()
                else:
                    state.output_grad = buffer
            if final:
                self.reduction.close(action.chunk)  # within the action's span: the rank's work, not idle
            synchronize()
            record.spans.append(Span(action, start, time.perf_counter()))
        self.progress.operation("pp wait for the step's sends")
        for work in sends:
            work.wait()
        return record

    def _operation(self, action: Action) -> str:
        """The action in words: 'pp recv activation from rank 1 (chunk 1, micro-batch 0)'."""
        peer = "" if action.peer is None else f" rank {self.global_ranks[action.peer]}"
        return f"pp {OPERATIONS[action.kind]}{peer} (chunk {action.chunk}, micro-batch {action.microbatch})"

    def _send(self, action: Action, tensor: torch.Tensor) -> dist.Work:
        payload = tensor.detach().to(self.dtype).contiguous()
        return dist.isend(payload, group=self.group, group_dst=action.peer, tag=TAGS[action.kind])

    def _post_receive(self, action: Action) -> tuple[dist.Work, torch.Tensor]:
        buffer = torch.empty(self.recv_shape(action.microbatch), dtype=self.dtype, device=self.device)
        return dist.irecv(buffer, group=self.group, group_src=action.peer, tag=TAGS[action.kind]), buffer

    def _receive(self, action: Action, work: dist.Work, buffer: torch.Tensor) -> torch.Tensor:
        """Wait for a posted receive; a stalled peer ends in an error naming this rank and action."""
        try:
            work.wait()
        except RuntimeError as error:
            raise RuntimeError(f"pipeline rank {self.rank} failed at {action} of schedule "
                               f"{self.schedule.name!r}: {error}") from error
        return buffer

    def _forward(self, action: Action, state: _MicroState, states: dict, inputs: list, record: StepRecord) -> None:
        c, mb = action.chunk, action.microbatch
        if c == 0:
            state.input = inputs[mb].to(self.device)
        elif state.input is None:  # the previous chunk is on this rank: hand over locally
            state.input = states[(c - 1, mb)].output.detach().requires_grad_()
        output = self.chunks[c](state.input)
        if c == self.last_chunk:
            output = self.loss_fn(output, mb)
            record.loss += output.detach()
        state.output = output

    def _output_grads(self, action: Action, state: _MicroState, states: dict) -> list[torch.Tensor] | None:
        """The gradient arriving at this chunk's output (None on the last chunk: it holds the loss)."""
        c, mb = action.chunk, action.microbatch
        if c == self.last_chunk:
            return None
        if state.output_grad is None:  # the next chunk is on this rank
            following = states[(c + 1, mb)]
            state.output_grad, following.input = following.input.grad, None
        return [state.output_grad]

    @staticmethod
    def _finish_backward(action: Action, state: _MicroState) -> None:
        """Release the activations; the input (and its grad) stays until it is sent or handed over."""
        state.output = state.output_grad = state.param_groups = None
        if action.chunk == 0:
            state.input = None

    def _backward_full(self, action: Action, state: _MicroState, states: dict) -> None:
        grads = self._output_grads(action, state, states)
        torch.autograd.backward(state.output, grad_tensors=grads)
        self._finish_backward(action, state)

    def _backward_input(self, action: Action, state: _MicroState, states: dict) -> None:
        grads = self._output_grads(action, state, states)
        if action.chunk == 0:
            return  # token ids have no gradient: W runs chunk 0's whole backward, as PyTorch does
        params = self.chunks[action.chunk].parameters()
        _, state.param_groups = stage_backward_input([state.output], grads, [state.input], params)

    def _backward_weight(self, action: Action, state: _MicroState) -> None:
        if action.chunk == 0:
            grads = None if action.chunk == self.last_chunk else [state.output_grad]
            torch.autograd.backward(state.output, grad_tensors=grads)
        else:
            stage_backward_weight(self.chunks[action.chunk].parameters(), state.param_groups)
        self._finish_backward(action, state)
