"""A run's divergence postmortem, from its metrics.jsonl and non_finite.json: loss and gradient-norm
spikes (each against the running median of the steps before it), the block behind a gradient spike,
the updates ``--skip-spikes`` skipped, and the first non-finite value with where it arose.

A gradient-norm spike is a norm more than ``NOTABLE_FACTOR`` times the running median, the level at
which training records every parameter group's norm (``plait.train.spikes``); its block is the group
whose norm grew most against its own last recorded one. A loss spike is a loss ``LOSS_SPIKE`` times
its running median: a loss moves far less than a gradient norm. Loss spikes that follow one another
(``EPISODE_SPIKES`` or more, each within ``EPISODE_GAP`` steps of the last) are one divergence, said
once: where it began, its worst step, the learning rate over it, and whether the loss came back. Pure
Python.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from plait.errors import ConfigError
from plait.observe.run_files import NON_FINITE_FILE, read_metrics
from plait.observe.spikes import NOTABLE_FACTOR, SPIKE_HISTORY, SPIKE_WINDOW

LOSS_SPIKE = 1.5
EPISODE_SPIKES = 3
EPISODE_GAP = 3


@dataclass(frozen=True)
class Spike:
    """A step whose ``quantity`` was ``value``, ``ratio`` times the running median before it."""

    quantity: str
    step: int
    value: float
    median: float
    lr: float
    block: str | None = None  # for a gradient spike: the group whose norm grew most
    block_growth: float | None = None
    skipped: bool = False

    @property
    def ratio(self) -> float:
        return self.value / self.median

    def sentence(self) -> str:
        where = "" if self.block is None else f", in {self.block} (its norm {self.block_growth:.3g}× its last recorded)"
        return (f"{self.quantity} spike at step {self.step}: {self.value:.4g} against a running median of "
                f"{self.median:.4g} ({self.ratio:.3g}×){where}; lr {self.lr:.3g}"
                + ("; its update was skipped (--skip-spikes)" if self.skipped else ""))


def spikes(rows: list[dict], key: str, factor: float) -> list[Spike]:
    """The rows whose ``key`` exceeds ``factor`` times the median of the (up to ``SPIKE_WINDOW``)
    earlier values, once ``SPIKE_HISTORY`` of them exist."""
    found = []
    for index, row in enumerate(rows):
        earlier = [r[key] for r in rows[max(0, index - SPIKE_WINDOW):index]]
        if len(earlier) >= SPIKE_HISTORY and row[key] > factor * (median := statistics.median(earlier)) > 0:
            found.append(Spike("loss" if key == "loss" else "gradient norm", row["step"], row[key], median, row["lr"],
                               skipped=bool(row.get("skipped"))))
    return found


def _with_block(spike: Spike, rows: list[dict]) -> Spike:
    """``spike`` with the group whose gradient norm grew most against its last recorded one."""
    at = next((r.get("grad_norm_by_group") for r in rows if r["step"] == spike.step), None)
    before = next((r["grad_norm_by_group"] for r in reversed(rows)
                   if r["step"] < spike.step and r.get("grad_norm_by_group")), None)
    if not at or not before:
        return spike
    growth = {name: norm / before[name] for name, norm in at.items() if before.get(name)}
    block = max(growth, key=growth.get)
    return Spike(**{**spike.__dict__, "block": block, "block_growth": growth[block]})


def read_non_finite(run_dir: Path) -> dict | None:
    """non_finite.json, or None where the run stopped on no non-finite value."""
    path = Path(run_dir) / NON_FINITE_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        int(record["step"])
        float(record["lr"])
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path} is damaged ({type(error).__name__}: {error}); move it away to explain the run "
                          "without it") from None
    return record


def non_finite_sentence(record: dict) -> str:
    """Where the first non-finite value arose, in one sentence."""
    norms = record.get("grad_norm_by_group")
    if not norms:
        return f"the loss was not finite at step {record['step']} (lr {record['lr']:.3g}); the run stopped there"
    bad = [name for name, norm in norms.items() if not math.isfinite(float(norm))]
    where = ("every group's norm finite, their squares overflowing float32 together" if not bad
             else "every parameter group's gradient" if len(bad) == len(norms)
             else "the gradients of " + ", ".join(bad))
    return (f"the gradient norm was not finite at step {record['step']} (lr {record['lr']:.3g}): {where}; "
            "the run stopped there")


def episodes(found: list[Spike]) -> list[list[Spike]]:
    """``found`` (in step order) as runs of spikes each within ``EPISODE_GAP`` steps of the last."""
    runs: list[list[Spike]] = []
    for spike in found:
        if runs and spike.step - runs[-1][-1].step <= EPISODE_GAP:
            runs[-1].append(spike)
        else:
            runs.append([spike])
    return runs


def divergence_sentence(episode: list[Spike], rows: list[dict]) -> str:
    """One sentence for a run of loss spikes: where it began, its worst, the learning rate over it, and
    whether the loss came back under ``LOSS_SPIKE`` times the median before it after the run of spikes."""
    first, last = episode[0], episode[-1]
    worst = max(episode, key=lambda spike: spike.ratio)
    back = next((row for row in rows if row["step"] > last.step and row["loss"] <= LOSS_SPIKE * first.median), None)
    final = rows[-1]
    came_back = (f"the loss came back, to {back['loss']:.4g} at step {back['step']}" if back is not None
                 else f"the loss never came back: {final['loss']:.4g} at the last step, step {final['step']}, "
                      f"{final['loss'] / first.median:.3g}× the median before it")
    return (f"the loss diverged from step {first.step} (lr {first.lr:.3g}): {len(episode)} of steps "
            f"{first.step}–{last.step} read {LOSS_SPIKE}× or more their running median, at most {worst.value:.4g} at "
            f"step {worst.step} ({worst.ratio:.3g}×, lr {worst.lr:.3g}); {came_back}")


def postmortem(run_dir: Path) -> list[str]:
    """The run's divergences (runs of loss spikes), single spikes and skipped updates, then its first
    non-finite value, a sentence each (none for a run that trained smoothly)."""
    rows = sorted(read_metrics(run_dir), key=lambda row: row["step"])
    found: list[tuple[int, str]] = []
    for episode in episodes(spikes(rows, "loss", LOSS_SPIKE)):
        if len(episode) >= EPISODE_SPIKES:
            found.append((episode[0].step, divergence_sentence(episode, rows)))
        else:
            found += [(spike.step, spike.sentence()) for spike in episode]
    found += [(spike.step, _with_block(spike, rows).sentence()) for spike in spikes(rows, "grad_norm", NOTABLE_FACTOR)]
    lines = [sentence for _, sentence in sorted(found, key=lambda pair: pair[0])]
    skipped = [row["step"] for row in rows if row.get("skipped")]
    if skipped:
        lines.append(f"updates skipped by --skip-spikes: step(s) {', '.join(map(str, skipped))}")
    if (record := read_non_finite(run_dir)) is not None:
        lines.append(non_finite_sentence(record))
    return lines
