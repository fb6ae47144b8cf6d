"""The run directory: config.toml (the resolved run), metrics.jsonl (a line per step), summary.json,
loss.png (training loss, and held-out loss with --eval-every), and every rank's traced steps:
trace.json and the last one's timeline.png."""

from __future__ import annotations

import json
import os
from pathlib import Path

from plait.errors import ConfigError
from plait.layout import Layout
from plait.observe.rank_timeline import draw_rank_timeline
from plait.observe.rank_trace import rank_events
from plait.observe.timeline import TIMELINE_PICTURE
from plait.observe.trace import TRACE_FILE

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.toml"
SUMMARY_FILE = "summary.json"
# Written by rank 0 when a step's gradient norm or loss is not finite: the step, its learning rate and
# each parameter group's gradient norm (``plait explain`` reads it).
NON_FINITE_FILE = "non_finite.json"
LOSS_PICTURE = "loss.png"
PROFILE_DIR = "profile"  # --profile-steps: torch.profiler's traces, rank{R}_step{K}.json
TRACE_STEPS = 8  # trace.json keeps this many traced steps: eight ranks' step is about 0.5 MB of events


def write_json_atomically(path: Path, value: object) -> None:
    """Write to a temporary file and rename, so a reader never sees half a file."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(temporary, path)


def read_metrics(run_dir: Path) -> list[dict]:
    """The steps metrics.jsonl records; ConfigError, saying how to go on, where it is not the file a run
    writes (a line that is not a step's JSON, bytes that are not text, a folder)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        rows = [json.loads(line) for line in lines[:-1]]
        try:
            rows += [json.loads(line) for line in lines[-1:]]
        except ValueError:  # a run killed mid-line: the step it was writing is not kept, and is run again
            pass
    except (OSError, ValueError) as error:  # (UnicodeDecodeError and JSON's errors are ValueErrors)
        raise ConfigError(f"{path} is damaged ({type(error).__name__}: {error}); move it away (resuming then keeps "
                          "no earlier step's line) or choose another --run-dir") from None
    if not all(isinstance(row, dict) and isinstance(row.get("step"), int) for row in rows):
        raise ConfigError(f"{path} holds a line that is not a step's record; move it away (resuming then keeps no "
                          "earlier step's line) or choose another --run-dir")
    return rows


class MetricsLog:
    """Appends one JSON object per step; on resume it first drops steps the checkpoint did not keep."""

    def __init__(self, run_dir: Path, first_step: int):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(run_dir) / METRICS_FILE
        self.kept_rows = [row for row in read_metrics(run_dir) if row["step"] < first_step]
        self.path.write_text("".join(json.dumps(row) + "\n" for row in self.kept_rows))

    def append(self, row: dict) -> None:
        with self.path.open("a") as file:
            file.write(json.dumps(row, allow_nan=False) + "\n")  # strict JSON: the loop stops on NaN first


def draw_loss(run_dir: Path) -> Path:
    """Plot loss against step from metrics.jsonl into loss.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = read_metrics(run_dir)
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=120)
    axes.plot([r["step"] for r in rows], [r["loss"] for r in rows], color="tab:blue", linewidth=1.2, label="training")
    evaluated = [r for r in rows if "eval_loss" in r]
    if evaluated:
        axes.plot([r["step"] for r in evaluated], [r["eval_loss"] for r in evaluated], color="tab:orange",
                  marker="o", markersize=3, linewidth=1.2, label="held-out (eval)")
        axes.legend()
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats/token)")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    axes.set_title(f"{Path(run_dir).name}: loss per step")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    path = Path(run_dir) / LOSS_PICTURE
    figure.savefig(path)
    plt.close(figure)
    return path


def write_run_trace(run_dir: Path, ranks: list[dict], layout: Layout, bubble: float | None) -> None:
    """Every rank's last ``TRACE_STEPS`` traced steps into trace.json and the last one drawn into
    timeline.png (summary.json's figures use them all)."""
    if not any(rank["steps"] for rank in ranks):
        return
    ranks = [{**rank, "steps": rank["steps"][-TRACE_STEPS:]} for rank in ranks]
    trace = {"traceEvents": rank_events(ranks), "displayTimeUnit": "ms",
             "otherData": {"measured": True, "layout": layout.describe()}}
    write_json_atomically(Path(run_dir) / TRACE_FILE, trace)
    title = layout.describe() + ("" if bubble is None else f": measured bubble {bubble:.1%}")
    draw_rank_timeline(ranks, Path(run_dir) / TIMELINE_PICTURE, title, chunked=layout.virtual_stages > 1)
