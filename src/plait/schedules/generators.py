"""Schedule generators: each writes every rank's compute order; transfers are placed by one rule.

A generator decides only the order of forwards and backwards on each rank; it is registered under
its schedule's name with what else plait reads of the schedule (``plait.schedules.registry``).
``with_transfers`` then puts each receive immediately before the compute that consumes it and each
send immediately after the compute that produces it. Under the executor's rules (sends never block,
receives do; see ``plait.schedules.simulate``) a receive then waits only on a true data dependency,
so a compute order that respects dependencies yields a deadlock-free list; ``check`` proves it anyway.
For the planner's model of Megatron-LM's interleaved schedule without overlapped sends, a forward's
send can wait for the backward after it (``sends_after_backward``).

Schedules (``p`` ranks, ``m`` micro-batches, ``v`` chunks per rank):

* ``naive``: layer-wise model parallelism. Each micro-batch goes forward through every stage and
  back before the next one starts (plain gradient accumulation on a model split over devices), so
  only one device works at a time: bubble (p−1)/p whatever m is. With ``m = 1`` it is exactly the
  textbook "whole batch passes stage after stage".
* ``gpipe``: all forwards, then all backwards (Huang et al. 2019); holds m micro-batches.
* ``1f1b``: p−r−1 warm-up forwards on rank r, then one forward one backward (PipeDream-Flush,
  Narayanan et al. 2021); holds at most p − r micro-batches.
* ``interleaved-1f1b``: v chunks per rank, Megatron's order (Narayanan et al. 2021, §2.2).
* ``zb-h1``: 1F1B with the backward split into input gradient I and weight gradient W (Qi et al.
  2023, "Zero Bubble Pipeline Parallelism", §3.1); W is deferred into what would be the cool-down
  bubble, keeping at most p micro-batches in flight like 1F1B's first rank. Its bubble time is
  (p−1)(T_F + T_I − T_W) against 1F1B's (p−1)(T_F + T_I + T_W).
"""

from __future__ import annotations

from plait.schedules.actions import Action, Kind

F, B, I, W = Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT
RECV_F, SEND_F, RECV_B, SEND_B = Kind.RECV_ACTIVATION, Kind.SEND_ACTIVATION, Kind.RECV_GRAD, Kind.SEND_GRAD
# Actions are built as tuples of Action's fields: a planner's search generates millions, and
# NamedTuple's own constructor is a Python function call that doubles the cost.
_new = tuple.__new__


def naive(p: int, m: int, v: int, rank: int) -> list[Action]:
    return [Action(kind, rank, mb) for mb in range(m) for kind in (F, B)]


def gpipe(p: int, m: int, v: int, rank: int) -> list[Action]:
    return [Action(F, rank, mb) for mb in range(m)] + [Action(B, rank, mb) for mb in range(m)]


def one_f_one_b(p: int, m: int, v: int, rank: int) -> list[Action]:
    warmup = min(p - rank - 1, m)
    order = [_new(Action, (F, rank, mb, None)) for mb in range(warmup)]
    for mb in range(m - warmup):
        order += [_new(Action, (F, rank, warmup + mb, None)), _new(Action, (B, rank, mb, None))]
    return order + [_new(Action, (B, rank, mb, None)) for mb in range(m - warmup, m)]


def interleaved_warmup(p: int, m: int, v: int, rank: int) -> int:
    """Forwards rank ``rank`` runs before its first backward in Megatron's interleaved order: every
    one where m = p, else 2(p − r − 1) + (v − 1)p (Narayanan et al. 2021, §2.2)."""
    total = m * v
    return total if m == p else min(2 * (p - rank - 1) + (v - 1) * p, total)


def interleaved_one_f_one_b(p: int, m: int, v: int, rank: int) -> list[Action]:
    """Megatron-LM's interleaved 1F1B (``forward_backward_pipelining_with_interleaving``).

    Rank r runs m·v chunk-forwards; the k-th is local chunk (k // p) % v on micro-batch
    (k // pv)·p + k % p, so groups of p micro-batches sweep through the rank's chunks in turn.
    """
    total = m * v
    # The k-th forward's (chunk, micro-batch), and the k-th backward's (chunks in reverse).
    forwards, backwards = [], []
    for k in range(total):
        group, within = divmod(k, p * v)
        local, mb = within // p, group * p + within % p
        forwards.append(_new(Action, (F, local * p + rank, mb, None)))
        backwards.append(_new(Action, (B, (v - 1 - local) * p + rank, mb, None)))
    warmup = interleaved_warmup(p, m, v, rank)
    order = forwards[:warmup]
    for k in range(total - warmup):
        order += [forwards[warmup + k], backwards[k]]
    return order + backwards[total - warmup:]


def zb_h1(p: int, m: int, v: int, rank: int) -> list[Action]:
    """1F1B with B split in I and W; rank r runs each W r micro-batches after its I.

    Deferring W on the later ranks lets their I — the only part of the backward the previous rank
    waits for — reach rank 0 sooner, and the deferred Ws fill the cool-down. Rank r holds
    (p − r − 1) warm-up + 1 + r deferred = p micro-batches, 1F1B's peak on rank 0
    (Qi et al. 2023, figure 3). With equal F, I, W the bubble is (p−1)/(3m+p−1).
    """
    warmup = min(p - rank - 1, m)
    order = [_new(Action, (F, rank, mb, None)) for mb in range(warmup)]
    pending: list[int] = []
    for mb in range(m):
        if warmup + mb < m:
            order.append(_new(Action, (F, rank, warmup + mb, None)))
        order.append(_new(Action, (I, rank, mb, None)))
        pending.append(mb)
        if len(pending) > rank:
            order.append(_new(Action, (W, rank, pending.pop(0), None)))
    return order + [_new(Action, (W, rank, mb, None)) for mb in pending]


def with_transfers(compute: list[Action], rank: int, pp: int, num_chunks: int,
                   sends_after_backward: bool = False) -> tuple[Action, ...]:
    """Insert each receive just before its consumer and each send just after its producer; with
    ``sends_after_backward`` a forward followed by a backward sends its output after that backward's
    own send, as Megatron-LM's interleaved schedule does without --overlap-p2p-communication: each step of
    its steady state runs a forward and a backward, then exchanges both outputs in one batch
    (send_forward_backward_recv_forward_backward)."""
    out: list[Action] = []
    add, last, new = out.append, num_chunks - 1, _new
    held = None  # a forward's send waiting for the backward after it
    for position, action in enumerate(compute):
        kind, c, mb, _ = action
        if kind is F:
            if c > 0 and (c - 1) % pp != rank:
                add(new(Action, (RECV_F, c, mb, (c - 1) % pp)))
            add(action)
            if c < last and (c + 1) % pp != rank:
                send = new(Action, (SEND_F, c, mb, (c + 1) % pp))
                following = compute[position + 1][0] if position + 1 < len(compute) else None
                if sends_after_backward and following is B:
                    held = send
                else:
                    add(send)
        elif kind is B or kind is I:
            if c < last and (c + 1) % pp != rank:
                add(new(Action, (RECV_B, c, mb, (c + 1) % pp)))
            add(action)
            if c > 0 and (c - 1) % pp != rank:
                add(new(Action, (SEND_B, c, mb, (c - 1) % pp)))
            if held is not None:
                add(held)
                held = None
        else:
            add(action)
    return tuple(out)
