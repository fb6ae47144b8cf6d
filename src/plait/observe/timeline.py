"""timeline.png: ranks against time, one bar per action, idle time left blank.

Forward, full backward, input-gradient and weight-gradient work have distinct colours; transfers
are thin grey bars (a receive's bar is the time spent waiting for it). Everything but the coloured
blocks is idle time: the bubble.
"""

from __future__ import annotations

import os
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
    draw_timelines([(timeline, title)], path)


def draw_timelines(panels: list[tuple[Timeline, str]], path: Path) -> None:
    """Draw steps one above the other (``plait explain``: measured, simulated), on one time axis
    unless one step is over three times another, when each gets its own so neither is a sliver.
    Written to a temporary file, then renamed: a reader never sees half a picture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    heights = [0.6 * len(timeline.spans) + 0.8 for timeline, _ in panels]
    steps = [timeline.step_time * 1e3 for timeline, _ in panels]
    shared = max(steps) <= 3 * min(steps)
    figure, axes_list = plt.subplots(len(panels), 1, figsize=(12, sum(heights) + 0.8), squeeze=False, sharex=shared,
                                     gridspec_kw={"height_ratios": heights})
    used: set[Kind] = set()
    for (timeline, title), (axes,), step in zip(panels, axes_list, steps):
        length = max(steps) if shared else step
        _draw_ranks(axes, timeline, length)
        axes.set_xlim(0, length)
        used |= {s.action.kind for spans in timeline.spans for s in spans if s.action.kind.is_compute}
        axes.set_title(title, fontsize=10)
    handles = [Patch(color=COLOURS[k], label=LABELS[k]) for k in sorted(used, key=list(COLOURS).index)]
    handles.append(Patch(color="#999999", label="send / receive (idle)"))
    last = axes_list[-1][0]
    last.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(handles), fontsize=8)
    last.set_xlabel("time in step (ms); outside the coloured blocks a rank is idle")
    figure.tight_layout()
    temporary = path.with_name(path.name + ".partial")
    figure.savefig(temporary, dpi=120, format="png")
    plt.close(figure)
    os.replace(temporary, path)


def _draw_ranks(axes, timeline: Timeline, longest_ms: float) -> None:
    """Each rank's bars, one ``broken_barh`` per rank and kind (one call per span re-fits the axes every
    time: minutes for a pipeline of 64 stages), and each wide enough block labelled with its micro-batch."""
    ranks = len(timeline.spans)
    for rank, spans in enumerate(timeline.spans):
        bars: dict[Kind, list[tuple[float, float]]] = {}
        for span in spans:
            start, width = span.start * 1e3, (span.end - span.start) * 1e3
            bars.setdefault(span.action.kind, []).append((start, width))
            if span.action.kind.is_compute and width > longest_ms / 60:
                axes.text(start + width / 2, rank, f"{span.action.microbatch}", ha="center", va="center",
                          fontsize=6, color="white")
        for kind, xranges in bars.items():
            if kind.is_compute:
                axes.broken_barh(xranges, (rank - 0.4, 0.8), facecolors=COLOURS[kind], edgecolor="white",
                                 linewidth=0.3)
            else:
                axes.broken_barh(xranges, (rank - 0.08, 0.16), facecolors="#999999")
    axes.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    axes.invert_yaxis()
