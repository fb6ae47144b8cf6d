"""The shared validation in two parts: a layout is valid exactly when its mesh (``mesh_problems``) and
its pipeline schedule and stage split (``pipeline_problems``) are, whatever schedule the mesh is
checked under when it has stages: the plan search checks each mesh once and each schedule once."""

from __future__ import annotations

import random
from dataclasses import replace

from plait.facts.validity import layout_problems, mesh_problems, pipeline_problems
from plait.layout import CP_ALGORITHMS, Layout
from plait.models.spec import model_spec
from plait.schedules import SCHEDULES


def test_a_layout_is_valid_exactly_when_its_mesh_and_its_schedule_are():
    rng = random.Random(0)
    spec = model_spec("gpt2", layers=6)
    checked = valid = 0
    for _ in range(3000):
        layout = Layout(
            dp=rng.choice((1, 2, 3, 4)), tp=rng.choice((1, 2, 4, 5)), cp=rng.choice((1, 2)), pp=rng.choice((1, 2, 3, 4)),
            sp=rng.random() < 0.3, zero=rng.choice((0, 1, 2, 3)), schedule=rng.choice(tuple(SCHEDULES)),
            virtual_stages=rng.choice((1, 2, 3)), microbatches=rng.choice((1, 2, 4, 6, 8)),
            cp_algorithm=rng.choice(CP_ALGORITHMS),
            stage_layers=rng.choice((None, (3, 3), (1, 2, 3), (1,) * 6)),
        )
        world, batch = rng.choice((8, 16, 24)), rng.choice((8, 24, 48))
        whole = not layout_problems(spec, layout, world, batch)
        parts = not mesh_problems(spec, layout, world, batch) and not pipeline_problems(spec, layout)
        assert whole == parts, layout
        if layout.pp > 1:  # the search checks the mesh under 1f1b, v=1 and the schedule on its own
            searched = (not mesh_problems(spec, replace(layout, schedule="1f1b", virtual_stages=1), world, batch)
                        and not pipeline_problems(spec, layout))
            assert whole == searched, layout
        checked += 1
        valid += whole
    assert 0 < valid < checked  # the draw covers both outcomes
