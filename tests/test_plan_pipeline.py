"""The planner's schedule play against the closed-form bubbles, and its shortcut against full play."""

import random

import pytest

from plait.layout import Layout
from plait.plan.costs import Boundaries, ChunkCost
from plait.plan.pipeline import StageWork, estimate_step, play, play_list
from plait.schedules import generate, schedule_spec
from plait.schedules.registry import Fill
from tests.schedule_cases import EVERY_SCHEDULE


def _equal(chunks: int, f=1.0, i=1.0, w=1.0) -> list[ChunkCost]:
    return [ChunkCost(f, i, w, 0.0)] * chunks


def _layout(name: str, p: int, v: int, m: int) -> Layout:
    return Layout(pp=p, schedule=name, virtual_stages=v, microbatches=m)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 9), (8, 32), (4, 40)])
def test_gpipe_and_1f1b_bubble(name, p, m):
    """Huang et al. 2019 / Narayanan et al. 2021: bubble (p − 1)/(m + p − 1) with equal stages."""
    played = play(_layout(name, p, 1, m), _equal(p), Boundaries.uniform(p, 0.0), [0.0] * p)
    assert played.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (4, 40, 2), (8, 16, 3)])
def test_interleaved_bubble(p, m, v):
    """Narayanan et al. 2021 §2.2: the bubble shrinks by v: (p − 1)/(v·m + p − 1)."""
    played = play(_layout("interleaved-1f1b", p, v, m), _equal(p * v), Boundaries.uniform(p, 0.0), [0.0] * (p * v))
    assert played.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 40)])
def test_zero_bubble_h1(p, m):
    """Qi et al. 2023: with T_F = T_I = T_W the bubble is (p − 1)(F + I − W) = (p − 1)F of m·3F per rank."""
    played = play(_layout("zb-h1", p, 1, m), _equal(p), Boundaries.uniform(p, 0.0), [0.0] * p)
    assert played.bubble_fraction == pytest.approx((p - 1) / (3 * m + p - 1))


def test_naive_runs_one_stage_at_a_time():
    p, m = 4, 6
    played = play(_layout("naive", p, 1, m), _equal(p), Boundaries.uniform(p, 0.0), [0.0] * p)
    assert played.bubble_fraction == pytest.approx((p - 1) / p)


def _full_and_shortcut(name, p, v, m, chunks, flight, sizes):
    boundaries = Boundaries.uniform(p, flight)
    full = play_list(generate(name, p, m, v), chunks, boundaries, sizes)
    return full, play(_layout(name, p, v, m), chunks, boundaries, sizes)


@pytest.mark.parametrize("name,v", EVERY_SCHEDULE)
def test_extending_two_short_plays_is_exact_for_equal_stages(name, v):
    p, m = 4, 28
    chunks = [ChunkCost(1.0, 1.7, 0.6, 0.0)] * (p * v)
    full, shortcut = _full_and_shortcut(name, p, v, m, chunks, 0.3, [2.0] * (p * v))
    assert shortcut.step_time == pytest.approx(full.step_time)
    assert shortcut.busy == pytest.approx(full.busy)
    assert shortcut.peak_activations == pytest.approx(full.peak_activations)


@pytest.mark.parametrize("name,v", EVERY_SCHEDULE)
def test_extending_two_short_plays_is_close_for_uneven_stages(name, v):
    """Uneven stages make the steady state periodic over several micro-batches: within 0.5%."""
    rng = random.Random(7)
    p, m = 4, 28
    chunks = [ChunkCost(rng.uniform(1, 2), rng.uniform(1, 3), rng.uniform(0.5, 1), 0.0) for _ in range(p * v)]
    sizes = [rng.uniform(1, 5) for _ in range(p * v)]
    full, shortcut = _full_and_shortcut(name, p, v, m, chunks, 0.3, sizes)
    assert shortcut.step_time == pytest.approx(full.step_time, rel=5e-3)
    assert shortcut.peak_activations == pytest.approx(full.peak_activations)


@pytest.mark.parametrize("name,v", EVERY_SCHEDULE)
def test_closed_form_estimate_equals_play_for_equal_stages(name, v):
    p, m, f, i, w, flight = 4, 8, 1.0, 1.5, 0.5, 0.0
    played = play(_layout(name, p, v, m), _equal(p * v, f / v, i / v, w / v), Boundaries.uniform(p, flight), [0.0] * (p * v))
    work = f + i + w
    fill = f + i - w if schedule_spec(name).fill is Fill.DEFERRED_WEIGHTS else work / v
    assert estimate_step(name, p, v, m, StageWork(work, work, fill, flight)) == pytest.approx(played.step_time)


def test_a_blocking_send_keeps_its_sender_busy_for_the_transfer():
    """Megatron-LM waits on each batched send before its next compute: played with blocking sends
    of s seconds and no flight, each rank spends s on each of its sends (2m, m at either end) and the
    step grows by at least what the busiest rank sends; posting the same transfer as a flight
    costs less (only the fill and drain wait on it)."""
    p, m, s = 4, 12, 0.1
    chunks = _equal(p)
    free = play(_layout("1f1b", p, 1, m), chunks, Boundaries.uniform(p, 0.0), [0.0] * p)
    posted = play(_layout("1f1b", p, 1, m), chunks, Boundaries.uniform(p, s), [0.0] * p)
    blocking = play(_layout("1f1b", p, 1, m), chunks, Boundaries((0.0,) * p, (s,) * p), [0.0] * p)
    assert blocking.sending == pytest.approx((m * s, 2 * m * s, 2 * m * s, m * s))
    assert blocking.busy == pytest.approx(free.busy)
    assert blocking.step_time >= free.step_time + 2 * m * s > posted.step_time


@pytest.mark.parametrize("name,p,v", [("1f1b", 4, 1), ("interleaved-1f1b", 4, 2), ("interleaved-1f1b", 2, 3), ("zb-h1", 3, 1)])
def test_each_message_crosses_the_boundary_between_its_two_ranks(name, p, v):
    """Boundary r joins ranks r and r + 1 (mod p), the wrap from the last rank to the first included."""
    from plait.schedules.simulate import compile_schedule

    compiled = compile_schedule(generate(name, p, 2 * p, v))
    ends: dict[int, set[int]] = {}
    for rank, codes in enumerate(compiled.messages):
        for code in codes:
            if code != -1:
                ends.setdefault(code if code >= 0 else -2 - code, set()).add(rank)
    assert ends and all(ranks == {int(compiled.boundaries[n]), (int(compiled.boundaries[n]) + 1) % p}
                        for n, ranks in ends.items())


def test_one_slow_boundary_slows_the_step_only_by_its_own_transfers():
    """A send across nodes on one boundary of four: slower than all on NVLink, faster than all across."""
    p, m = 4, 16
    chunks = _equal(p)
    fast, slow = 0.01, 0.5
    one = play(_layout("1f1b", p, 1, m), chunks, Boundaries((fast, slow, fast, fast), (0.0,) * p), [0.0] * p)
    every = play(_layout("1f1b", p, 1, m), chunks, Boundaries.uniform(p, slow), [0.0] * p)
    none = play(_layout("1f1b", p, 1, m), chunks, Boundaries.uniform(p, fast), [0.0] * p)
    assert none.step_time < one.step_time < every.step_time


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_the_closed_form_estimate_bounds_the_play_of_blocking_sends(name, v):
    """The search's estimate charges each rank 2v waited sends a micro-batch (the middle ranks'
    count, the ends send half as many) and the fill and drain each transfer: not below the play,
    and within 5% of it."""
    p, m, f, i, w, send = 4, 16, 1.0, 1.5, 0.5, 0.05
    played = play(_layout(name, p, v, m), _equal(p * v, f / v, i / v, w / v), Boundaries((0.0,) * p, (send,) * p), [0.0] * (p * v))
    work = f + i + w + 2 * v * send
    estimate = estimate_step(name, p, v, m, StageWork(work, work, (f + i + w) / v, send))
    assert played.step_time <= estimate <= 1.05 * played.step_time
