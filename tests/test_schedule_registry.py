"""A schedule is one registered entry: the toy below (GPipe with its backwards run from the last
micro-batch to the first) is registered for each test that needs it and taken by the layout, the
checker, the simulator, the planner, ``plait schedule`` and the executor; unregistered, its name is
refused everywhere again."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest

from plait.cli import main
from plait.errors import ConfigError
from plait.facts.in_flight import in_flight_chunks
from plait.facts.stack import STACKS, Kernels
from plait.facts.validity import run_problems
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.hardware import hardware
from plait.plan.pipeline import StageWork, estimate_step
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload
from plait.plan.space import schedule_choices
from plait.schedules import (
    SCHEDULES, Action, Kind, ScheduleSpec, check, generate, peak_in_flight, register, simulate, unregister,
)
from tests.test_schedule_command import printed_lists

NAME = "gpipe-reversed"


def gpipe_reversed(p: int, m: int, v: int, rank: int) -> list[Action]:
    """Every forward, then every backward from the last micro-batch to the first."""
    return [Action(Kind.FORWARD, rank, mb) for mb in range(m)] + [Action(Kind.BACKWARD, rank, mb)
                                                                  for mb in reversed(range(m))]


TOY = ScheduleSpec(NAME, gpipe_reversed, lambda p, m, v, rank: m)


@contextlib.contextmanager
def registered(schedule: ScheduleSpec) -> Iterator[ScheduleSpec]:
    register(schedule)
    try:
        yield schedule
    finally:
        unregister(schedule.name)


@pytest.fixture
def toy() -> Iterator[ScheduleSpec]:
    with registered(TOY):
        yield TOY


def test_an_unregistered_name_is_refused_everywhere(tmp_path, capsys):
    assert NAME not in SCHEDULES
    for refused in (lambda: generate(NAME, 2, 4), lambda: Layout(pp=2, schedule=NAME).validate(),
                    lambda: in_flight_chunks(NAME, 2, 1, 4, 0),
                    lambda: estimate_step(NAME, 2, 1, 4, StageWork(1.0, 1.0, 1.0, 0.0))):
        with pytest.raises(ConfigError, match=f"unknown pipeline schedule '{NAME}'; use one of naive, gpipe"):
            refused()
    with pytest.raises(ValueError, match=f"Kernels names pipeline schedule '{NAME}'"):
        Kernels(schedules=("1f1b", NAME))
    with pytest.raises(SystemExit):
        main(["schedule", NAME, "--pp", "2", "--microbatches", "4", "--out", str(tmp_path / "s.png")])
    assert "invalid choice" in capsys.readouterr().err


def test_registering_adds_the_name_and_unregistering_takes_it_away():
    with registered(TOY):
        assert list(SCHEDULES)[-1] == NAME
        with pytest.raises(ValueError, match="registered already"):
            register(TOY)
    assert NAME not in SCHEDULES


@pytest.mark.parametrize("p", [1, 2, 4])
def test_the_checker_and_the_simulator_take_it(toy, p):
    """GPipe's bubble and peak: reversing the backwards renames micro-batches, it moves no work."""
    for m in (p, 2 * p, 3 * p + 1):
        schedule = generate(NAME, p, m)
        assert check(schedule) == (m,) * p == peak_in_flight(schedule)
        assert [in_flight_chunks(NAME, p, 1, m, rank) for rank in range(p)] == [m] * p
        assert simulate(schedule, p2p_cost=0.1).step_time == pytest.approx(
            simulate(generate("gpipe", p, m), p2p_cost=0.1).step_time)


def test_the_layout_takes_it_and_refuses_chunks_it_does_not_run(toy):
    spec = model_spec("tiny")
    layout = Layout(pp=2, microbatches=4, schedule=NAME)
    layout.validate()
    assert run_problems(spec, layout, 2, 8) == []
    with pytest.raises(ConfigError, match="only applies to the interleaved-1f1b schedule"):
        Layout(pp=2, microbatches=4, schedule=NAME, virtual_stages=2).validate()
    assert run_problems(spec, layout, 2, 8, STACKS["megatron"]) == [
        f"this software stack has no {NAME} schedule; pass --schedule 1f1b or interleaved-1f1b"]


def test_the_planner_searches_and_evaluates_it(toy, capsys):
    assert (NAME, 1) in schedule_choices(2, 4, 8, {})
    workload, hw = Workload(model_spec("gpt2", layers=4), global_batch=8), hardware("a100-80gb")
    predicted = evaluate(workload, hw, 2, Layout(pp=2, microbatches=4, schedule=NAME))
    gpipe = evaluate(workload, hw, 2, Layout(pp=2, microbatches=4, schedule="gpipe"))
    assert predicted.step_time_s == pytest.approx(gpipe.step_time_s)
    assert predicted.peak_memory_bytes == gpipe.peak_memory_bytes
    common = ["--model", "gpt2", "--layers", "4", "--gpus", "2", "--gpu", "a100-80gb", "--global-batch", "8",
              "--pp", "2", "--schedule", NAME, "--json"]
    assert main(["simulate", *common, "--dp", "1", "--tp", "1", "--cp", "1", "--microbatches", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == pytest.approx(predicted.step_time_s)
    assert main(["plan", *common]) == 0
    assert {ranked["layout"]["schedule"] for ranked in json.loads(capsys.readouterr().out)} == {NAME}


def test_plait_schedule_prints_and_draws_it(toy, tmp_path, capsys):
    picture = tmp_path / "schedule.png"
    assert main(["schedule", NAME, "--pp", "2", "--microbatches", "3", "--out", str(picture)]) == 0
    expected = generate(NAME, 2, 3).actions
    assert printed_lists(capsys.readouterr().out) == [[str(action) for action in rank] for rank in expected]
    assert picture.read_bytes().startswith(b"\x89PNG")


def toy_schedule_on_this_rank(m: int) -> dict:
    """The executor's run of the toy on this worker (a process of its own: registered here too)."""
    from tests.pipeline_cases import run_toy_schedule

    with registered(TOY):
        return run_toy_schedule(NAME, m, 1)


def test_the_executor_runs_it_with_exact_gradients(pool, toy):
    import torch

    from tests.pipeline_cases import toy_gradients

    pp, m = 2, 4
    reference = toy_gradients(pp, m, 1)
    for rank, result in enumerate(pool.run(toy_schedule_on_this_rank, pp, m)):
        assert result["executed"] == list(generate(NAME, pp, m).actions[rank])
        assert result["peak"] == m
        for chunk, grads in result["grads"].items():
            for got, want in zip(grads, reference[chunk]):
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def training_losses_on_this_rank(configs: list) -> list:
    from tests.pipeline_cases import pipeline_losses

    with registered(TOY):
        return pipeline_losses(configs)


def test_a_model_trains_under_it_as_under_gpipe(pool, toy):
    """A tiny model on two pipeline ranks: the same losses step for step."""
    from tests.test_pipeline_parity import small_config

    configs = [small_config("tiny", 4, pp=2, schedule=name, microbatches=4) for name in ("gpipe", NAME)]
    for (gpipe, _), (reversed_, _) in pool.run(training_losses_on_this_rank, 2, configs):
        assert reversed_ == pytest.approx(gpipe, rel=1e-6)
