"""The pipeline schedule IR: for each rank, an ordered tuple of actions.

A pipeline of ``pp`` ranks holds ``pp * v`` stage chunks (``v`` virtual stages per rank). Chunk
``c`` lives on rank ``c % pp``, as in Megatron's interleaved schedule, so with ``v = 1`` chunk and
rank coincide. Every action names a chunk and a micro-batch; transfers also name the peer rank.

Transfers follow torchtitan's convention: ``SEND_F`` on chunk ``c`` sends c's output to chunk
``c + 1``; ``RECV_F`` on chunk ``c`` receives c's input from chunk ``c - 1``; ``SEND_B`` on chunk
``c`` sends the gradient of c's input to chunk ``c - 1``; ``RECV_B`` on chunk ``c`` receives the
gradient of c's output from chunk ``c + 1``. Consecutive chunks on the same rank (only when
``pp = 1``) hand over locally and need no transfer.

Pure Python: the planner imports this to simulate layouts far too large to build.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple


class Kind(Enum):
    """What an action does; the value is its short name in ``str(action)``."""

    FORWARD = "F"
    BACKWARD = "B"  # full backward: input and weight gradients together
    BACKWARD_INPUT = "I"  # gradient of the chunk's input only (zero-bubble schedules)
    BACKWARD_WEIGHT = "W"  # gradient of the chunk's weights, deferrable
    SEND_ACTIVATION = "SEND_F"
    RECV_ACTIVATION = "RECV_F"
    SEND_GRAD = "SEND_B"
    RECV_GRAD = "RECV_B"

    # Members are singletons: hash by identity in C rather than by Enum's Python-level name hash
    # (the planner looks kinds up in sets and tables millions of times a search).
    __hash__ = object.__hash__

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE_KINDS

    @property
    def is_send(self) -> bool:
        return self in SEND_KINDS

    @property
    def is_recv(self) -> bool:
        return self in RECV_KINDS


def crossed_boundary(chunk, gradient, pp: int):
    """The stage boundary a message from ``chunk`` crosses, boundary r lying between pp ranks r and
    r + 1 (mod pp): an activation goes on to chunk + 1 (boundary chunk mod pp), a gradient back to
    chunk − 1 (boundary chunk − 1). Works on numbers and on numpy arrays alike."""
    return (chunk - gradient) % pp


COMPUTE_KINDS = frozenset({Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT})
SEND_KINDS = frozenset({Kind.SEND_ACTIVATION, Kind.SEND_GRAD})
RECV_KINDS = frozenset({Kind.RECV_ACTIVATION, Kind.RECV_GRAD})


class Action(NamedTuple):
    """One step of one rank: ``kind`` on stage ``chunk`` for ``microbatch`` (peer for transfers).
    A tuple: a search generates hundreds of thousands a schedule."""

    kind: Kind
    chunk: int
    microbatch: int
    peer: int | None = None

    def __str__(self) -> str:
        """torchtitan's short form: ``2F0`` is the forward of chunk 2 on micro-batch 0."""
        text = f"{self.chunk}{self.kind.value}{self.microbatch}"
        return text if self.peer is None else f"{text}@r{self.peer}"


@dataclass(frozen=True)
class Schedule:
    """A complete pipeline step: ``actions[r]`` is what rank ``r`` does, in order."""

    name: str
    pp: int
    virtual_stages: int
    microbatches: int
    actions: tuple[tuple[Action, ...], ...]

    @property
    def num_chunks(self) -> int:
        return self.pp * self.virtual_stages

    def rank_of(self, chunk: int) -> int:
        """The rank that holds stage chunk ``chunk`` (round-robin, as Megatron interleaves)."""
        return chunk % self.pp

    def chunks_of(self, rank: int) -> tuple[int, ...]:
        """The chunks rank ``rank`` holds, first to last."""
        return tuple(range(rank, self.num_chunks, self.pp))

    def compute_actions(self, rank: int) -> tuple[Action, ...]:
        return tuple(a for a in self.actions[rank] if a.kind.is_compute)

    def describe(self, rank: int) -> str:
        """The rank's list as one line of short forms, for error messages and debugging."""
        return " ".join(str(a) for a in self.actions[rank])
