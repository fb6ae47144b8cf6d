"""timeline.png for every run: the last traced step of every rank (past 16 ranks, one rank per
distinct role: the first data- and context-parallel replica of each tensor and pipeline place).

Compute spans in one colour per kind (forward, backward, gradient sync, optimizer; the pipeline's
forward, backward and its input and weight halves, each labelled with its micro-batch, and its
chunk when a rank holds several); the time the rank waited for communication in one colour per
group; the pipeline's send and receive spans (the bubble) grey; idle white. Under each row a thin
line per collective in flight, in its group's colour.
"""

from __future__ import annotations

import os
from pathlib import Path

from plait.observe.timeline import COLOURS as ACTION_COLOURS
from plait.schedules.actions import Kind

MAX_ROWS = 16
SPAN_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "gradient sync": "#8172b3", "optimizer": "#937860"}
GROUP_COLOURS = {"dp": "#c44e52", "dp_shard": "#c44e52", "dp_cp": "#c44e52", "dp_shard_cp": "#c44e52",
                 "dp_replicate": "#a6761d", "tp": "#bcbd22", "cp": "#e7298a", "pp": "#64b5cd"}
BUBBLE, OTHER_GROUP = "#bbbbbb", "#444444"


def shown_ranks(ranks: list[dict]) -> tuple[list[dict], bool]:
    """The ranks drawn, and whether they are one per role rather than all of them."""
    if len(ranks) <= MAX_ROWS:
        return ranks, False
    roles = [r for r in ranks if r["coordinates"]["dp"] == 0 and r["coordinates"]["cp"] == 0]
    if len(roles) > MAX_ROWS:
        roles = [r for r in roles if r["coordinates"]["tp"] == 0]
    return roles, True


def _span_colour(span: dict) -> str:
    kind = span["args"].get("kind")
    if kind is not None:
        return ACTION_COLOURS.get(Kind(kind), BUBBLE)
    return SPAN_COLOURS.get(span["name"], OTHER_GROUP)


def _label(span: dict, chunked: bool) -> str:
    args = span["args"]
    if "microbatch" not in args or args["microbatch"] is None:
        return ""
    return f"c{args['chunk']}·{args['microbatch']}" if chunked and "chunk" in args else f"{args['microbatch']}"


def draw_rank_timeline(ranks: list[dict], path: Path, title: str, chunked: bool = False) -> None:
    """Draw the last traced step of ``ranks`` (gathered ``StepTracer`` records) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    shown, by_role = shown_ranks(ranks)
    step = max(r["step"] for rank in shown for r in rank["steps"])
    records = [next(r for r in rank["steps"] if r["step"] == step) for rank in shown]
    length = max(r["duration"] for r in records) * 1e3
    height = 0.55 * len(shown) + 2.0
    figure, axes = plt.subplots(figsize=(12, height))
    groups: set[str] = set()
    kinds: dict[str, str] = {}
    pipelined = False
    for row, record in enumerate(records):
        for span in record["spans"]:
            start, width = span["start"] * 1e3, (span["end"] - span["start"]) * 1e3
            colour = _span_colour(span)
            if span["args"].get("compute", True):
                kinds[span["name"] if "kind" not in span["args"] else Kind(span["args"]["kind"]).name.lower()] = colour
            else:
                colour, pipelined = BUBBLE, True
            axes.broken_barh([(start, width)], (row - 0.35, 0.7), facecolors=colour, edgecolor="white", linewidth=0.3)
            if width > length / 50 and (text := _label(span, chunked)):
                axes.text(start + width / 2, row, text, ha="center", va="center", fontsize=6, color="white")
        for start, end, index in record["waits"]:
            group = record["transfers"][index]["group"]
            groups.add(group)
            axes.broken_barh([(start * 1e3, (end - start) * 1e3)], (row - 0.35, 0.7),
                             facecolors=GROUP_COLOURS.get(group, OTHER_GROUP))
        for transfer in record["transfers"]:
            if transfer["completed"] is not None:
                groups.add(transfer["group"])
                axes.plot([transfer["issued"] * 1e3, transfer["completed"] * 1e3], [row + 0.42] * 2, linewidth=1.2,
                          color=GROUP_COLOURS.get(transfer["group"], OTHER_GROUP), solid_capstyle="butt")
    axes.set_yticks(range(len(shown)), [f"{r['name']} (rank {r['rank']})" for r in shown], fontsize=8)
    axes.invert_yaxis()
    axes.set_xlim(0, length)
    axes.set_title(title + (f"; {len(shown)} of {len(ranks)} ranks, one per role" if by_role else ""), fontsize=10)
    handles = [Patch(color=c, label=k.replace("_", " ")) for k, c in kinds.items()]
    handles += [Patch(color=GROUP_COLOURS.get(g, OTHER_GROUP), label=f"waiting: {g}") for g in sorted(groups)]
    if pipelined:
        handles.append(Patch(color=BUBBLE, label="pipeline send/receive (bubble)"))
    axes.set_xlabel(f"time in step {step} (ms); thin lines: collectives in flight; white: idle")
    legend_inches = 0.3 * -(-len(handles) // 6) + 0.2
    figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8)
    figure.tight_layout(rect=(0, legend_inches / height, 1, 1))
    temporary = path.with_name(path.name + ".partial")
    figure.savefig(temporary, dpi=120, format="png")
    plt.close(figure)
    os.replace(temporary, path)
