"""Generators against the closed-form bubbles and the memory each schedule promises (pure Python)."""

import pytest

from plait.errors import ConfigError
from plait.schedules import Kind, check, generate, peak_in_flight, simulate, theoretical_bubble
from tests.schedule_cases import EVERY_SCHEDULE

CASES = [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 4 * p, 4 * p + 1)]


@pytest.mark.parametrize("p,m", CASES)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_closed_form(name, p, m):
    assert theoretical_bubble(generate(name, p, m)) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p,m", CASES)
def test_1f1b_bubble_holds_for_any_forward_backward_ratio(p, m):
    timeline = simulate(generate("1f1b", p, m), {Kind.FORWARD: 1.0, Kind.BACKWARD: 3.5})
    assert timeline.step_time == pytest.approx((m + p - 1) * 4.5)


@pytest.mark.parametrize("p,m", [(p, m) for p, m in CASES if m % p == 0])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_bubble_is_closed_form(p, m, v):
    """Narayanan et al. 2021 §2.2: bubble time (p−1)/v of a micro-batch, so (p−1)/(v·m+p−1) of the step."""
    assert theoretical_bubble(generate("interleaved-1f1b", p, m, v)) == pytest.approx((p - 1) / (v * m + p - 1))


@pytest.mark.parametrize("p,m", CASES)
def test_zb_h1_bubble_is_closed_form(p, m):
    """Qi et al. 2023 §3.1: bubble time (p−1)(T_F + T_I − T_W); equal costs give (p−1)/(3m+p−1)."""
    assert theoretical_bubble(generate("zb-h1", p, m)) == pytest.approx((p - 1) / (3 * m + p - 1))
    f, i, w = 1.0, 1.3, 0.7
    timeline = simulate(generate("zb-h1", p, m), {Kind.FORWARD: f, Kind.BACKWARD_INPUT: i, Kind.BACKWARD_WEIGHT: w})
    assert timeline.step_time == pytest.approx(m * (f + i + w) + (p - 1) * (f + i - w))


@pytest.mark.parametrize("m", [1, 2, 5])
def test_naive_keeps_one_device_busy(m):
    assert theoretical_bubble(generate("naive", 4, m)) == pytest.approx(3 / 4)


def test_peak_in_flight_gpipe_grows_with_m_1f1b_bounded_by_pp():
    for m in (4, 8, 16):
        assert peak_in_flight(generate("gpipe", 4, m)) == (m,) * 4
        assert check(generate("1f1b", 4, m)) == (4, 3, 2, 1)
        assert check(generate("zb-h1", 4, m)) == (4, 4, 4, 4)


@pytest.mark.parametrize("name,v", EVERY_SCHEDULE)
@pytest.mark.parametrize("p", [1, 2, 4])
def test_every_generated_schedule_passes_the_checker(name, v, p):
    for m in (p, 2 * p, 4 * p):
        check(generate(name, p, m, v))


@pytest.mark.parametrize("p,m", [(p, m) for p, m in CASES if m % p == 0])
@pytest.mark.parametrize("v", [2, 3])
def test_megatrons_interleaved_exchange_sends_a_forward_after_the_backward_paired_with_it(p, m, v):
    """Megatron-LM's interleaved schedule without overlapped sends exchanges once a step: each
    steady-state forward's output leaves right after the next backward and its gradient's send
    (with m = p every forward comes first: nothing to pair). The compute order is unchanged, the
    lists still pass the checker, and with messages in flight the play is longer."""
    plain, paired = generate("interleaved-1f1b", p, m, v), generate("interleaved-1f1b", p, m, v, sends_after_backward=True)
    check(paired)
    for before, after in zip(plain.actions, paired.actions):
        assert [a for a in before if a.kind.is_compute] == [a for a in after if a.kind.is_compute]
        assert sorted(map(str, before)) == sorted(map(str, after))
        computes = [a for a in before if a.kind.is_compute]
        for i, action in enumerate(after):
            if action.kind is Kind.SEND_ACTIVATION:
                made = next(k for k, c in enumerate(computes) if c.kind is Kind.FORWARD and (c.chunk, c.microbatch)
                            == (action.chunk, action.microbatch))
                following = computes[made + 1] if made + 1 < len(computes) else None
                previous = next(a for a in reversed(after[:i]) if a.kind.is_compute)
                paired_with = following if m != p and following is not None and following.kind is Kind.BACKWARD else None
                assert previous == (paired_with or computes[made])
    # With a message's flight on top, the output that leaves a backward later arrives later.
    paired_time, plain_time = (simulate(s, p2p_cost=0.5).step_time for s in (paired, plain))
    assert paired_time > plain_time if m != p else paired_time == plain_time


def test_p2p_cost_delays_only_the_receiver():
    free = simulate(generate("1f1b", 2, 2)).step_time
    assert simulate(generate("1f1b", 2, 2), p2p_cost=0.5).step_time == pytest.approx(free + 2 * 0.5)


def test_action_short_form():
    schedule = generate("1f1b", 2, 2)
    assert schedule.describe(1).split()[:3] == ["1RECV_F0@r0", "1F0", "1B0"]


@pytest.mark.parametrize(
    "args,fragment",
    [
        (("interleaved-1f1b", 4, 6, 2), "multiples of pp=4"),
        (("interleaved-1f1b", 2, 4, 1), "--virtual-stages 2 or more"),
        (("1f1b", 2, 4, 2), "only applies to the interleaved-1f1b"),
        (("zb-h1", 4, 3, 1), "at least pp=4 micro-batches"),
        (("pipedream", 2, 2, 1), "unknown pipeline schedule"),
        (("gpipe", 0, 2, 1), "--pp must be a positive integer"),
    ],
)
def test_bad_input_is_one_clear_config_error(args, fragment):
    with pytest.raises(ConfigError, match=fragment):
        generate(*args)
