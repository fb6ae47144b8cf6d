"""timeline.png: ranks against time, one bar per action, idle time left blank.

Forward, full backward, input-gradient and weight-gradient work have distinct colours; transfers
are thin grey bars (a receive's bar is the time spent waiting for it). Everything but the coloured
blocks is idle time: the bubble.
"""

from __future__ import annotations

from pathlib import Path

from plait.schedules.actions import Kind
from plait.schedules.simulate import Timeline

TIMELINE_PICTURE = "timeline.png"
COLOURS = {
    Kind.FORWARD: "#4c72b0",
    Kind.BACKWARD: "#dd8452",
    Kind.BACKWARD_INPUT: "#c44e52",
    Kind.BACKWARD_WEIGHT: "#55a868",
}
LABELS = {Kind.FORWARD: "forward", Kind.BACKWARD: "backward", Kind.BACKWARD_INPUT: "backward (input)",
          Kind.BACKWARD_WEIGHT: "backward (weight)"}


def draw_timeline(timeline: Timeline, path: Path, title: str) -> None:
    """Draw one pipeline step: a row per rank, time in milliseconds from the step's start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = len(timeline.spans)
    figure, axes = plt.subplots(figsize=(12, 0.6 * ranks + 1.6))
    for rank, spans in enumerate(timeline.spans):
        for span in spans:
            kind = span.action.kind
            start, width = span.start * 1e3, (span.end - span.start) * 1e3
            if kind.is_compute:
                axes.broken_barh([(start, width)], (rank - 0.4, 0.8), facecolors=COLOURS[kind], edgecolor="white",
                                 linewidth=0.3)
                if width > timeline.step_time * 1e3 / 60:
                    axes.text(start + width / 2, rank, f"{span.action.microbatch}", ha="center", va="center",
                              fontsize=6, color="white")
            else:
                axes.broken_barh([(start, width)], (rank - 0.08, 0.16), facecolors="#999999")
    used = sorted({s.action.kind for spans in timeline.spans for s in spans if s.action.kind.is_compute},
                  key=list(COLOURS).index)
    handles = [Patch(color=COLOURS[k], label=LABELS[k]) for k in used] + [Patch(color="#999999", label="send / receive (idle)")]
    axes.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(handles), fontsize=8)
    axes.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    axes.invert_yaxis()
    axes.set_xlim(0, timeline.step_time * 1e3)
    axes.set_xlabel("time in step (ms); outside the coloured blocks a rank is idle")
    axes.set_title(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
