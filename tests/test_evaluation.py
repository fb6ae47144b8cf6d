"""``--eval-every``: the held-out loss is logged and drawn, training never reads the held-out tokens,
the forward-only evaluation gives the same number under a pipeline as under tp·cp, and with
``--eval-data`` a validation file is scored while training reads all of its data."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.cases import assert_refused_in_one_line, layout_world_size, run_config, train_losses

STEPS, EVAL_EVERY = 4, 2
PIPELINE = {"dp": 2, "pp": 2, "microbatches": 2}
TENSOR_CONTEXT = {"tp": 2, "cp": 2}
ORANGE = np.array([1.0, 0x7F / 255, 0x0E / 255])  # matplotlib's tab:orange, the held-out curve


def corpus(path, seed: int, tail_seed: int, size: int = 40_000):
    """Random bytes whose last tenth (the held-out part) comes from ``tail_seed``."""
    head = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    tail = np.random.default_rng(tail_seed).integers(0, 256, size // 10, dtype=np.uint8)
    path.write_bytes(np.concatenate([head[:-(size // 10)], tail]).tobytes())
    return str(path)


def evaluated_run(pool, tmp_path, name: str, data: str, layout: dict) -> list[dict]:
    config = run_config("tiny", steps=STEPS, **layout)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, data=data, eval_every=EVAL_EVERY))
    run_dir = tmp_path / name
    pool.run(train_losses, layout_world_size(layout), config, str(run_dir))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def held_out(rows: list[dict]) -> list[float]:
    return [row["eval_loss"] for row in rows if "eval_loss" in row]


def orange_pixels(path) -> int:
    import matplotlib.image

    image = matplotlib.image.imread(path)[..., :3]
    return int((np.abs(image - ORANGE).max(axis=-1) < 0.05).sum())


def test_training_never_reads_the_held_out_tokens_and_every_layout_evaluates_alike(pool, tmp_path):
    original = corpus(tmp_path / "a.txt", seed=0, tail_seed=1)
    other_tail = corpus(tmp_path / "b.txt", seed=0, tail_seed=2)
    piped = evaluated_run(pool, tmp_path, "piped", original, PIPELINE)
    changed = evaluated_run(pool, tmp_path, "changed", other_tail, PIPELINE)
    sharded = evaluated_run(pool, tmp_path, "sharded", original, TENSOR_CONTEXT)

    assert [row["step"] for row in piped if "eval_loss" in row] == [1, 3]
    # Another held-out part changes nothing training sees, bit for bit, and every held-out loss.
    assert [row["loss"] for row in changed] == [row["loss"] for row in piped]
    assert all(a != b for a, b in zip(held_out(piped), held_out(changed)))
    # The pipeline's forward-only schedule and the tp·cp forward score the same tokens alike.
    assert held_out(sharded) == pytest.approx(held_out(piped), rel=1e-5)
    assert orange_pixels(tmp_path / "piped" / "loss.png") > 0


def test_eval_data_is_scored_at_its_steps_and_training_reads_all_of_the_data(pool, tmp_path):
    data = corpus(tmp_path / "data.txt", seed=0, tail_seed=1)
    first, second = corpus(tmp_path / "e1.txt", seed=3, tail_seed=3, size=2_000), corpus(tmp_path / "e2.txt", 4, 4, 2_000)
    config = run_config("tiny", steps=STEPS, dp=1)

    def run(name: str, **train) -> list[dict]:
        pool.run(train_losses, 1, dataclasses.replace(config, train=dataclasses.replace(config.train, data=data, **train)),
                 str(tmp_path / name))
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    plain, scored, rescored = run("plain"), run("scored", eval_every=2, eval_data=first), run("rescored", eval_every=2,
                                                                                              eval_data=second)
    assert [row["step"] for row in scored if "eval_loss" in row] == [1, 3]
    # Nothing held out of training: the same losses as the run without evaluation, bit for bit.
    assert [row["loss"] for row in scored] == [row["loss"] for row in rescored] == [row["loss"] for row in plain]
    assert all(a != b for a, b in zip(held_out(scored), held_out(rescored)))  # each file's own loss


@pytest.mark.parametrize("flags, words", [
    (["--eval-data", "missing.u16", "--eval-every", "2"], "eval data file missing.u16 does not exist; pass --eval-data"),
    (["--eval-data", "short.txt", "--eval-every", "2"], "short.txt holds 50 tokens, fewer than one sequence of 64"),
    (["--eval-data", "short.txt"], "--eval-data is scored every --eval-every K steps; pass --eval-every K"),
], ids=["missing", "too short", "without eval-every"])
def test_bad_eval_data_is_refused_in_one_line_before_start(tmp_path, capsys, monkeypatch, flags, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "short.txt").write_bytes(bytes(range(50)))
    argv = ["train", "--model", "tiny", "--seq-len", "64", "--dp", "1", "--dry-run", *flags]
    assert_refused_in_one_line(argv, words, capsys, tmp_path)


def test_loss_png_draws_no_held_out_curve_without_evaluation(pool, tmp_path):
    config = run_config("tiny", steps=2)
    pool.run(train_losses, 1, config, str(tmp_path / "run"))
    assert orange_pixels(tmp_path / "run" / "loss.png") == 0


def test_data_too_short_to_hold_out_is_refused_before_start(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "short.txt").write_bytes(bytes(range(120)))
    argv = ["train", "--model", "tiny", "--seq-len", "64", "--dp", "1", "--data", str(tmp_path / "short.txt"), "--dry-run"]
    assert_refused_in_one_line(argv + ["--eval-every", "5"], "too few to hold out 65 for --eval-every", capsys, tmp_path)


def test_the_forward_only_schedule_of_every_schedule_runs_without_deadlock():
    from plait.schedules.actions import Kind
    from plait.schedules.forward_only import forward_only
    from plait.schedules.registry import generate
    from plait.schedules.simulate import simulate
    from tests.schedule_cases import EVERY_SCHEDULE

    for name, virtual in EVERY_SCHEDULE:
        schedule = forward_only(generate(name, 4, 8, virtual))
        forwards = [a for actions in schedule.actions for a in actions if a.kind is Kind.FORWARD]
        assert len(forwards) == 4 * virtual * 8  # every chunk's forward of every micro-batch, once
        simulate(schedule)  # raises ScheduleError on a receive that never meets its send
