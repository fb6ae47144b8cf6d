"""``--skip-spikes K``: an update whose gradient norm is more than K times the running median of the
recent steps' norms is skipped, as OLMo 2 and others guard against loss spikes.

The global gradient norm is the same on every rank (it is reduced over every mesh dimension), so
every rank decides alike and skips the same updates; the learning-rate schedule goes on. The
median is over the last ``SPIKE_WINDOW`` updates taken, and no update is skipped before
``SPIKE_HISTORY`` of them; on resume the window is read back from the run's metrics, so a resumed
run skips what an uninterrupted one would.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from plait.observe.run_files import NON_FINITE_FILE, write_json_atomically

SPIKE_WINDOW = 100
SPIKE_HISTORY = 8
# A norm this many times the running median is worth a record of each group's norm even when the
# update is not skipped: ``plait explain`` names the block behind it.
NOTABLE_FACTOR = 5.0


@dataclass
class SpikeGuard:
    """The recent updates' gradient norms, and the factor above their median that skips one (0: off)."""

    factor: float
    norms: deque[float] = field(default_factory=lambda: deque(maxlen=SPIKE_WINDOW))

    @classmethod
    def resumed(cls, factor: float, rows: list[dict]) -> SpikeGuard:
        """The guard as it stood after the logged ``rows`` (metrics.jsonl's, in step order)."""
        guard = cls(factor)
        guard.norms.extend(row["grad_norm"] for row in rows if not row.get("skipped"))
        return guard

    def exceeds(self, norm: float, factor: float) -> bool:
        """Whether ``norm`` is more than ``factor`` times the running median (never before the history)."""
        return len(self.norms) >= SPIKE_HISTORY and norm > factor * statistics.median(self.norms)

    def is_spike(self, norm: float) -> bool:
        """Whether the update of gradient norm ``norm`` is to be skipped."""
        return self.factor > 0 and self.exceeds(norm, self.factor)

    def record(self, norm: float, skipped: bool) -> None:
        if not skipped:
            self.norms.append(norm)


def non_finite_groups(norms: dict[str, float]) -> str:
    """Which parameter groups' gradients are not finite, in the model's order, in a few words."""
    bad = [name for name, norm in norms.items() if not math.isfinite(norm)]
    if not bad:
        return "every group's norm is finite: their squares overflow float32 together"
    if len(bad) == len(norms):
        return "every parameter group's gradient is non-finite"
    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    return f"non-finite gradients in {shown}"


def write_non_finite(run_dir: Path, step: int, lr: float, group_norms: dict[str, float] | None) -> None:
    """RUN/non_finite.json: the step that stopped the run, its learning rate and each group's norm
    (non-finite values as their names, JSON having none)."""
    norms = None if group_norms is None else {
        name: norm if math.isfinite(norm) else str(norm) for name, norm in group_norms.items()}
    write_json_atomically(run_dir / NON_FINITE_FILE, {"step": step, "lr": lr, "grad_norm_by_group": norms})
