"""The run directory: config.toml (the resolved run), metrics.jsonl (a line per step), summary.json,
loss.png, and for a pipeline run the last step's timeline.png and trace.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

from plait.observe.timeline import TIMELINE_PICTURE, draw_timeline
from plait.observe.trace import TRACE_FILE, timeline_events
from plait.schedules.actions import Schedule
from plait.schedules.simulate import Timeline

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.toml"
SUMMARY_FILE = "summary.json"
LOSS_PICTURE = "loss.png"


def write_json_atomically(path: Path, value: object) -> None:
    """Write to a temporary file and rename, so a reader never sees half a file."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(temporary, path)


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    try:
        rows += [json.loads(line) for line in lines[-1:]]
    except ValueError:  # a run killed mid-line: the step it was writing is not kept, and is run again
        pass
    return rows


class MetricsLog:
    """Appends one JSON object per step; on resume it first drops steps the checkpoint did not keep."""

    def __init__(self, run_dir: Path, first_step: int):
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(run_dir) / METRICS_FILE
        kept = [row for row in read_metrics(run_dir) if row["step"] < first_step]
        self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))

    def append(self, row: dict) -> None:
        with self.path.open("a") as file:
            file.write(json.dumps(row, allow_nan=False) + "\n")  # strict JSON: the loop stops on NaN first


def draw_loss(run_dir: Path) -> Path:
    """Plot loss against step from metrics.jsonl into loss.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=120)
    axes.plot([r["step"] for r in rows], [r["loss"] for r in rows], color="tab:blue", linewidth=1.2)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (nats/token)")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    path = Path(run_dir) / LOSS_PICTURE
    figure.savefig(path)
    plt.close(figure)
    return path


def write_pipeline_step(run_dir: Path, timeline: Timeline, schedule: Schedule, step: int, bubble: float) -> None:
    """Draw a measured pipeline step into timeline.png and write it as trace.json."""
    title = f"{schedule.name}, pp={schedule.pp}, m={schedule.microbatches}"
    if schedule.virtual_stages > 1:
        title += f", v={schedule.virtual_stages}"
    draw_timeline(timeline, Path(run_dir) / TIMELINE_PICTURE, f"{title}: measured bubble {bubble:.1%}")
    trace = {"traceEvents": timeline_events(timeline), "displayTimeUnit": "ms",
             "otherData": {"measured": True, "step": step}}
    write_json_atomically(Path(run_dir) / TRACE_FILE, trace)
