"""The scan's stages one at a time (plait.plan.scan), each held to what the play
(plait.plan.simulate.evaluate) predicts for the same layout."""

from __future__ import annotations

import pytest

from plait.layout import Layout
from plait.models.spec import model_spec
from plait.hardware import hardware, stack_hardware
from plait.plan.scan import (
    Candidate, Scan, ScanSetup, candidate_layouts, memory_floor, mesh_of, microbatch_splits, scan_setup,
    score_schedules, time_floors,
)
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload
from plait.plan.space import SCANNED, meshes

# Tensor parallelism with full recomputation on 8 GPUs, without stages: one kind of rank, one schedule.
LAYOUT = Layout(dp=2, tp=4, sp=True, zero=1, microbatches=8, recompute="full")
WORKLOAD = Workload(model_spec("llama-8b"), 64)


def _candidate(memory_bytes: float) -> tuple[ScanSetup, Candidate]:
    """The one layout a scan pinned to LAYOUT weighs, on an H100 holding ``memory_bytes`` (no headroom)."""
    hw = stack_hardware(hardware("h100-sxm", memory_bytes=memory_bytes, memory_headroom=0.0), WORKLOAD.kernels)
    fixed = {name: getattr(LAYOUT, name) for name in SCANNED}
    setup = scan_setup(WORKLOAD, hw, LAYOUT.world_size, fixed, keep=1, bound=True)
    mesh = mesh_of(setup, *next(meshes(WORKLOAD, LAYOUT.world_size, fixed)))
    [(m, mbs, schedules)] = microbatch_splits(setup, mesh, None)
    [layout] = candidate_layouts(setup, mesh, m, schedules)
    assert layout == Layout(**{name: getattr(LAYOUT, name) for name in SCANNED if name != "recompute"})
    return setup, Candidate(layout, mesh, mbs, schedules)


@pytest.fixture(scope="module")
def played():
    return evaluate(WORKLOAD, stack_hardware(hardware("h100-sxm"), WORKLOAD.kernels), LAYOUT.world_size, LAYOUT)


def test_the_memory_floor_keeps_a_layout_that_fits(played):
    setup, candidate = _candidate(played.peak_memory_bytes)
    found = Scan()
    memory, _ = memory_floor(setup, found, candidate)
    assert memory is not None and found.oversized == 0
    # The floor lies between the bytes besides the activations and the played peak.
    besides = sum(played.memory_breakdown[part] for part in ("params", "grads", "optimizer", "other"))
    assert besides <= min(memory.least_peaks) <= played.peak_memory_bytes


def test_the_memory_floor_refuses_a_layout_whose_states_alone_do_not_fit(played):
    states = sum(played.memory_breakdown[part] for part in ("params", "grads", "optimizer"))
    setup, candidate = _candidate(0.9 * states)
    found = Scan()
    memory, larger_may_fit = memory_floor(setup, found, candidate)
    assert memory is None and not larger_may_fit
    assert found.oversized == len(candidate.schedules) == 1 and found.scored == 0
    # The smallest peak it notes, for the error to name, is the played one.
    assert found.smallest[0] == pytest.approx(played.peak_memory_bytes, rel=1e-3)


def test_the_time_floors_pass_what_could_be_kept_and_count_what_could_not(played):
    setup, candidate = _candidate(10**15)
    found = Scan()
    memory, _ = memory_floor(setup, found, candidate)
    terms = time_floors(setup, found, candidate, memory)
    assert terms is not None and (found.bounded, found.oversized) == (0, 0)
    faster = Scan(best=[(-played.step_time_s / 2, ())], simplest={terms.level: (played.step_time_s / 2, ())})
    assert time_floors(setup, faster, candidate, memory) is None
    assert (faster.bounded, faster.oversized, faster.scored) == (1, 0, 0)


def test_the_scored_step_and_peak_are_the_plays(played):
    setup, candidate = _candidate(10**15)
    found = Scan()
    memory, _ = memory_floor(setup, found, candidate)
    score_schedules(setup, found, candidate, memory, time_floors(setup, found, candidate, memory))
    step, fields, peak = found.fastest
    assert found.scored == 1 and fields[SCANNED.index("recompute")] == "full"
    assert peak == pytest.approx(played.peak_memory_bytes, rel=1e-3)
    assert step == pytest.approx(played.step_time_s, rel=0.03)
