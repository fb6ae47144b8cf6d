"""The divergence postmortem: a gradient spike injected at a known step into a known block is named by
``plait explain`` (step and block), ``--skip-spikes`` skips exactly that update on every rank under
ZeRO-3 and under tp·pp, and a non-finite gradient stops the run with the groups it arose in named."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from plait.cli import main
from plait.explain.divergence import postmortem
from plait.observe.spikes import SpikeGuard
from tests.cases import layout_world_size, run_config, train_losses
from tests.divergence_cases import train_with_a_spike

STEP, BLOCK = 11, 1
# The injected spike reads several hundred times the running median; tiny's own noisiest steps at its
# learning rate read up to about 40 times (on a step of its own, which explain names too).
SKIP_ABOVE = 100.0
LAYOUTS = {
    "zero3": {"dp": 2, "zero": 3},
    "tp2·pp2": {"tp": 2, "pp": 2, "microbatches": 2},
}


def _config(layout: dict, skip_spikes: float = 0.0):
    config = run_config("tiny", steps=STEP + 3, **layout)
    return replace(config, train=replace(config.train, skip_spikes=skip_spikes, log_every=5))


@pytest.mark.parametrize("name", LAYOUTS)
def test_skip_spikes_skips_exactly_the_spiked_update_on_every_rank_and_explain_names_it(pool, tmp_path, name):
    layout = LAYOUTS[name]
    skipped = pool.run(train_with_a_spike, layout_world_size(layout), _config(layout, skip_spikes=SKIP_ABOVE), str(tmp_path),
                       STEP, BLOCK)
    assert skipped == [[STEP]] * layout_world_size(layout)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if row.get("skipped")] == [STEP]
    spiked = rows[STEP]
    assert math.sqrt(sum(norm**2 for norm in spiked["grad_norm_by_group"].values())) == pytest.approx(
        spiked["grad_norm"], rel=1e-4)
    findings = postmortem(tmp_path)
    assert any(f.startswith(f"gradient norm spike at step {STEP}:") and f"in block {BLOCK} " in f
               and "its update was skipped" in f for f in findings), findings
    assert f"updates skipped by --skip-spikes: step(s) {STEP}" in findings


def test_without_skip_spikes_the_update_is_taken_and_explain_still_names_step_and_block(pool, tmp_path, capsys):
    skipped = pool.run(train_with_a_spike, 2, _config({"dp": 2}), str(tmp_path), STEP, BLOCK)
    assert skipped == [[], []]
    assert main(["explain", str(tmp_path), "--gpu", "a100-80gb"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("divergence: ")]
    named = [line for line in lines if f"gradient norm spike at step {STEP}:" in line]
    assert len(named) == 1 and f"in block {BLOCK} " in named[0] and "skipped" not in named[0], lines


def test_a_non_finite_gradient_stops_the_run_naming_its_block_and_explain_reads_it(pool, tmp_path, capsys):
    stopped = pool.run(train_with_a_spike, 2, _config({"tp": 2}), str(tmp_path), STEP, BLOCK, math.inf)
    assert all(f"step {STEP}: the gradient norm is inf (non-finite gradients in block {BLOCK})" in s for s in stopped)
    record = json.loads((tmp_path / "non_finite.json").read_text())
    assert record["step"] == STEP and record["grad_norm_by_group"][f"block {BLOCK}"] == "inf"
    assert math.isfinite(record["grad_norm_by_group"]["embeddings"])
    # the run left no summary: explain gives what it can, the postmortem
    assert main(["explain", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"the gradient norm was not finite at step {STEP}" in out and f"the gradients of block {BLOCK};" in out


def test_a_resumed_guard_holds_the_norms_an_uninterrupted_one_held():
    rows = [{"step": i, "grad_norm": float(i + 1), **({"skipped": True} if i == 3 else {})} for i in range(10)]
    guard = SpikeGuard(5.0)
    for row in rows:
        guard.record(row["grad_norm"], bool(row.get("skipped")))
    assert SpikeGuard.resumed(5.0, rows).norms == guard.norms
    assert 4.0 not in guard.norms and guard.is_spike(5 * 6.0 + 1) and not guard.is_spike(5 * 6.0)


GROUPED_LAYOUTS = {
    "dp2": {"dp": 2},
    "cp2": {"cp": 2},
    "tp2 sp": {"tp": 2, "sp": True},
    "dp2 zero2": {"dp": 2, "zero": 2},
    "dp2·tp2 zero1": {"dp": 2, "tp": 2, "zero": 1},
    "dp4 hybrid zero3": {"dp": 4, "dp_replicate": 2, "zero": 3},
}


@pytest.mark.parametrize("name", GROUPED_LAYOUTS)
def test_the_groups_norms_add_up_to_the_global_norm_under_every_sharding(pool, tmp_path, name):
    """Each copy of a gradient is counted once, whether whole on every rank, split over tp, sequence-
    split, sharded by ZeRO or replicated across hybrid shards: the groups' squares sum to the norm's."""
    layout = GROUPED_LAYOUTS[name]
    config = run_config("tiny", steps=3, **layout)
    pool.run(train_losses, layout_world_size(layout), replace(config, train=replace(config.train, log_every=1)),
             str(tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        groups = row["grad_norm_by_group"]
        assert list(groups) == ["embeddings", "block 0", "block 1", "block 2", "block 3", "head"]
        assert all(norm > 0 for name, norm in groups.items() if name != "head")
        assert math.sqrt(sum(norm**2 for norm in groups.values())) == pytest.approx(row["grad_norm"], rel=1e-4)


def test_where_a_non_finite_norm_arose_is_said_even_when_every_group_is_finite():
    from plait.explain.divergence import non_finite_sentence
    from plait.observe.spikes import non_finite_groups

    assert non_finite_groups({"block 0": 1.0, "block 1": math.inf}) == "non-finite gradients in block 1"
    assert "overflow float32 together" in non_finite_groups({"block 0": 1e30, "block 1": 3e30})
    record = {"step": 3, "lr": 0.1, "grad_norm_by_group": {"block 0": 1.0, "block 1": "nan"}}
    assert "the gradients of block 1;" in non_finite_sentence(record)
    record["grad_norm_by_group"]["block 1"] = 2.0
    assert "overflowing float32 together" in non_finite_sentence(record)


def test_z_loss_trains_as_one_process_under_tp_pp_and_changes_the_loss(pool):
    """``--z-loss`` reaches the loss on every layout: the pipeline's last stage, over vocabulary shards,
    gives the single process's z-lossed losses, which differ from the plain cross entropy's."""
    from tests.test_data_parallel_parity import assert_same_losses

    layout = LAYOUTS["tp2·pp2"]

    def with_z(config, z_loss: float):
        return replace(config, train=replace(config.train, z_loss=z_loss))

    plain = pool.run(train_losses, 1, run_config("tiny", steps=4))[0]
    z_lossed = pool.run(train_losses, 1, with_z(run_config("tiny", steps=4), 1e-2))[0]
    assert all(z > p + 1e-3 for z, p in zip(z_lossed, plain)), (z_lossed, plain)  # lse ≈ log(vocab) ≈ 5.5
    for losses in pool.run(train_losses, layout_world_size(layout), with_z(run_config("tiny", steps=4, **layout), 1e-2)):
        assert_same_losses(z_lossed, losses)


def test_a_run_of_loss_spikes_is_one_divergence_said_once_with_whether_the_loss_came_back(tmp_path):
    from plait.explain.divergence import postmortem

    def write(losses: list[float]) -> list[str]:
        rows = [{"step": step, "loss": loss, "lr": 0.01 * step, "grad_norm": 1.0} for step, loss in enumerate(losses)]
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return postmortem(tmp_path)

    flat = [3.0] * 10
    diverged = write(flat + [6.0, 9.0, 3.5, 12.0, 20.0, 15.0])  # one step back under 1.5×: still one divergence
    assert diverged == ["the loss diverged from step 10 (lr 0.1): 5 of steps 10–15 read 1.5× or more their running "
                        "median, at most 20 at step 14 (6.67×, lr 0.14); the loss never came back: 15 at the last "
                        "step, step 15, 5× the median before it"]
    recovered = write(flat + [6.0, 7.0, 8.0] + [3.2] * 3 + [9.0])  # and a lone spike after it
    assert len(recovered) == 2
    assert recovered[0].startswith("the loss diverged from step 10 (lr 0.1): 3 of steps 10–12 ")
    assert recovered[0].endswith("; the loss came back, to 3.2 at step 13")
    assert recovered[1] == "loss spike at step 16: 9 against a running median of 3 (3×); lr 0.16"
