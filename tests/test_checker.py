"""The checker rejects broken lists with the rank and the action at fault."""

from dataclasses import replace

import pytest

from plait.schedules import Action, Kind, Schedule, ScheduleError, check, generate


def edited(schedule: Schedule, rank: int, actions: list[Action]) -> Schedule:
    lists = list(schedule.actions)
    lists[rank] = tuple(actions)
    return replace(schedule, actions=tuple(lists))


def test_missing_backward_is_rejected_naming_rank_and_action():
    schedule = generate("1f1b", 2, 4)
    broken = [a for a in schedule.actions[0] if str(a) != "0B2"]
    with pytest.raises(ScheduleError, match=r"rank 0: needs exactly one of 0B2"):
        check(edited(schedule, 0, broken))


def test_missing_receive_is_rejected():
    schedule = generate("gpipe", 2, 2)
    broken = [a for a in schedule.actions[1] if str(a) != "1RECV_F1@r0"]
    with pytest.raises(ScheduleError, match=r"rank 1 action 1F1: comes before 1RECV_F1"):
        check(edited(schedule, 1, broken))


def test_crossed_sends_deadlock_is_rejected():
    """Rank 1 waits for mb 1's activation before sending mb 0's gradient; rank 0 holds mb 1 until it
    has that gradient: each rank's send sits behind a receive only the other can satisfy."""
    schedule = generate("1f1b", 2, 2)
    rank0 = [Action(Kind.FORWARD, 0, 0), Action(Kind.SEND_ACTIVATION, 0, 0, 1),
             Action(Kind.RECV_GRAD, 0, 0, 1), Action(Kind.BACKWARD, 0, 0),
             Action(Kind.FORWARD, 0, 1), Action(Kind.SEND_ACTIVATION, 0, 1, 1),
             Action(Kind.RECV_GRAD, 0, 1, 1), Action(Kind.BACKWARD, 0, 1)]
    rank1 = [Action(Kind.RECV_ACTIVATION, 1, 0, 0), Action(Kind.FORWARD, 1, 0),
             Action(Kind.RECV_ACTIVATION, 1, 1, 0), Action(Kind.FORWARD, 1, 1),
             Action(Kind.BACKWARD, 1, 0), Action(Kind.SEND_GRAD, 1, 0, 0),
             Action(Kind.BACKWARD, 1, 1), Action(Kind.SEND_GRAD, 1, 1, 0)]
    broken = replace(schedule, actions=(tuple(rank0), tuple(rank1)))
    with pytest.raises(ScheduleError, match=r"deadlocks: rank 0 at 0RECV_B0@r1, rank 1 at 1RECV_F1@r0"):
        check(broken)


def test_receives_in_a_different_order_than_sends_are_rejected():
    schedule = generate("gpipe", 2, 2)
    rank1 = list(schedule.actions[1])
    rank1[0:2], rank1[2:4] = rank1[2:4], rank1[0:2]  # forward mb 1 before mb 0; rank 0 sends mb 0 first
    with pytest.raises(ScheduleError, match=r"rank 1 action 1RECV_F1@r0 .* sends and receives are in different orders"):
        check(edited(schedule, 1, rank1))


def test_action_on_the_wrong_rank_is_rejected():
    schedule = generate("gpipe", 2, 1)
    with pytest.raises(ScheduleError, match=r"rank 0 action 1F0: chunk 1 lives on rank 1"):
        check(edited(schedule, 0, [Action(Kind.FORWARD, 1, 0), *schedule.actions[0]]))


def test_weight_gradient_before_input_gradient_is_rejected():
    schedule = generate("zb-h1", 2, 2)
    rank1 = list(schedule.actions[1])
    i = next(k for k, a in enumerate(rank1) if str(a) == "1I0")
    w = next(k for k, a in enumerate(rank1) if str(a) == "1W0")
    rank1[i], rank1[w] = rank1[w], rank1[i]
    with pytest.raises(ScheduleError, match=r"rank 1 action 1W0: comes before 1I0"):
        check(edited(schedule, 1, rank1))


def test_unreceived_send_is_rejected():
    schedule = generate("gpipe", 2, 1)
    rank1 = [a for a in schedule.actions[1] if not a.kind.is_recv]
    rank1 = [a for a in rank1 if a.kind is not Kind.FORWARD]
    with pytest.raises(ScheduleError):
        check(edited(schedule, 1, rank1))
