"""``plait explain RUN``: the planner's prediction for a finished run, beside what the run measured.

Pure Python, like the planner it calls: it reads the run directory's summary.json (and trace.json
for pipeline runs), predicts the same model, batch and layout with ``plait.plan.simulate.evaluate``
on the run's hardware, and reports each figure both ways, for every layout: step time, where it
went (compute, exposed communication per group, bubble), memory; then the bottleneck in one
sentence (``plait.observe.bottleneck``) and the planner's fastest layout for as many ranks.
Pipeline runs also get ``explain.png``: the measured step above the simulated one, drawn alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path

from plait.errors import ConfigError
from plait.facts.stack import STACKS
from plait.facts.step_volumes import step_volumes
from plait.layout import DATA_GROUPS, Layout
from plait.models.spec import ModelSpec
from plait.explain.divergence import postmortem
from plait.observe.bottleneck import bottleneck
from plait.observe.run_files import CONFIG_FILE, SUMMARY_FILE
from plait.plan.simulated_step import simulated_timeline
from plait.observe.timeline import draw_timelines
from plait.observe.trace import TRACE_FILE, timeline_from_trace, traced_step_volumes
from plait.paths import MISSING, not_a_file, require_input_file
from plait.hardware import CATALOG, Hardware, catalog_name_of, hardware
from plait.plan.ranking import PLANNER_ERROR
from plait.plan.scan import Candidate
from plait.plan.search import search
from plait.plan.simulate import Prediction, evaluate
from plait.plan.workload import Workload
from plait.schedules import Timeline

EXPLAIN_PICTURE = "explain.png"
STATE_KINDS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer"}
# Each rank's parts of its median traced step (plait.observe.time_split), as explain names them.
RANK_PARTS = {"compute": "compute_s", "exposed communication": "exposed_comm_s", "bubble": "bubble_s",
              "waiting for data": "data_s", "host overhead": "host_s"}


@dataclass
class Explanation:
    """A run's measured figures and the planner's prediction of the same run."""

    run_dir: Path
    summary: dict
    workload: Workload
    layout: Layout
    hardware: Hardware
    prediction: Prediction
    trace: dict | None  # trace.json (``read_trace``)

    def rows(self) -> list[tuple[str, float | None, float | None, str]]:
        """(quantity, predicted, measured, unit) for every figure both sides have."""
        p, s = self.prediction, self.summary
        held = s.get("model_state_bytes_per_rank") or []
        rows = [
            ("step time", p.step_time_s, s["step_time_s"], "s"),
            ("tokens per second", self.workload.global_batch * self.workload.spec.seq_len / p.step_time_s,
             s["tokens_per_s"], "tokens/s"),
            ("pipeline bubble", p.bubble_fraction, s.get("bubble_fraction"), "fraction"),
        ]
        for predicted_kind, measured_kind in STATE_KINDS.items():
            measured = max((rank[measured_kind] for rank in held if rank), default=None)
            rows.append((f"{measured_kind} per rank (most)", p.memory_breakdown[predicted_kind], measured, "bytes"))
        rows += self.time_rows()
        rows += self.volume_rows()
        measured_peak = s.get("peak_memory_bytes") if s.get("device") == "cuda" else None  # a CPU's RSS is not it
        rows.append(("peak memory per rank", p.peak_memory_bytes, measured_peak, "bytes"))
        rows.append(("MFU", p.mfu if self.measured_mfu is not None else None, self.measured_mfu, "fraction"))
        return rows

    @property
    def measured_mfu(self) -> float | None:
        """The run's model FLOPs over its device's peak: on a GPU the catalog's (the summary's ``mfu``),
        on a CPU the matmul rate of the measured profile explain predicts with (None when it predicts
        on a catalog GPU instead, which did not run it)."""
        if self.summary.get("device") == "cuda":
            return self.summary.get("mfu")
        if self.hardware.name in CATALOG:
            return None
        return self.summary["model_tflops_per_rank"] / self.hardware.peak_tflops(self.workload.precision)

    def rank_shares(self) -> list[dict]:
        """The utilization postmortem: where each rank's median traced step went (its seconds, and
        each part's share of it); none when untraced."""
        split = self.summary.get("time_split") or {}
        return [{"rank": rank["rank"], "name": rank["name"], "traced_step_s": rank["step_s"],
                 **{part: rank[key] / rank["step_s"] for part, key in RANK_PARTS.items()}}
                for rank in split.get("per_rank", [])]

    def rank_lines(self) -> list[str]:
        """``rank_shares`` as a table."""
        if not (ranks := self.rank_shares()):
            return []
        lines = ["", "| rank | traced step | " + " | ".join(RANK_PARTS) + " |", "| --- | ---: |" + " ---: |" * len(RANK_PARTS)]
        for rank in ranks:
            shares = " | ".join(f"{rank[part]:.0%}" for part in RANK_PARTS)
            label = rank["name"] if rank["name"] == f"rank {rank['rank']}" else f"{rank['rank']} ({rank['name']})"
            lines.append(f"| {label} | {rank['traced_step_s']:.4g} s | {shares} |")
        return lines

    def bottleneck_line(self) -> str | None:
        """The bottleneck sentence, with the run's MFU where it is measured."""
        if not self.summary.get("time_split"):
            return None
        sentence = bottleneck(self.summary["time_split"])
        if self.measured_mfu is None:
            return sentence
        return f"{sentence} (MFU {self.measured_mfu:.1%} of {self.hardware.name}'s peak)"

    @property
    def trace_scale(self) -> float:
        """What a traced second is of a plain step's: the tracer's call into Python on every operator
        slows the steps it traces (``trace_slowdown``), so their parts are set to the plain step's time
        in proportion (1 for a run whose summary has no plain step to compare)."""
        return 1 / (self.summary.get("trace_slowdown") or 1.0)

    def time_rows(self) -> list[tuple[str, float | None, float | None, str]]:
        """Where the step's time went, predicted and measured (the median traced step's parts, scaled
        to the median plain step: ``trace_scale``), when traced."""
        split, predicted, scale = self.summary.get("time_split"), self.prediction.time_breakdown, self.trace_scale
        if not split:
            return []
        exposed = split["exposed_comm_by_group_s"]

        def measured(*groups: str) -> float:
            return scale * sum(exposed.get(group, 0.0) for group in groups)

        return [
            ("compute", predicted["compute_s"] + predicted["optimizer_s"], scale * split["compute_s"]["median"], "s"),
            ("exposed dp communication", predicted["exposed_dp_comm_s"], measured(*DATA_GROUPS), "s"),
            ("exposed tp and cp communication", predicted["critical_path_comm_s"], measured("tp", "cp"), "s"),
            ("exposed pp communication", None, measured("pp"), "s"),
            ("bubble", predicted["bubble_s"], scale * split["bubble_s"]["median"], "s"),
            ("waiting for data", None, scale * split.get("data_s", {}).get("median", 0.0), "s"),
            ("host overhead", None, scale * split["host_s"]["median"], "s"),
            ("exposed communication share", (predicted["exposed_dp_comm_s"] + predicted["critical_path_comm_s"])
             / self.prediction.step_time_s, self.summary["comm_fraction"], "fraction"),
        ]

    @cached_property
    def _traced_volumes(self) -> dict[tuple[str, str], int] | None:
        """Rank 0's bytes per group and op in its last traced step, or None without trace.json."""
        return None if self.trace is None else traced_step_volumes(self.trace, rank=0)

    def volume_rows(self) -> list[tuple[str, float | None, float | None, str]]:
        """Bytes rank 0 handed each group's collectives and transfers in its last traced step, beside
        the shared facts the planner times (plait.facts.step_volumes); none without trace.json."""
        measured = self._traced_volumes
        if measured is None:
            return []
        predicted = step_volumes(self.workload.spec, self.layout, self.workload.global_batch, self.workload.precision)
        keys = sorted({(g, op) for g, ops in predicted.items() for op in ops} | set(measured))
        return [(f"{group} {op} bytes per step (rank 0)", predicted.get(group, {}).get(op, 0),
                 measured.get((group, op), 0), "bytes") for group, op in keys]

    @cached_property
    def fastest(self) -> Candidate | None:
        """The planner's fastest layout for as many ranks of the same hardware (None: none fits)."""
        try:
            return search(self.workload, self.hardware, self.summary["world_size"], top=1).ranked[0]
        except ConfigError:
            return None

    def suggestion(self) -> dict | None:
        """What to change: the planner's fastest layout, its predicted gain over this one (this
        layout's predicted step over its, less 1) and the ``plait train`` command that runs it, where
        the gain is beyond the planner's own error (``PLANNER_ERROR``); else None."""
        best = self.fastest
        if best is None or best.layout == self.layout:
            return None
        gain = self.prediction.step_time_s / best.step_time_s - 1
        if gain <= PLANNER_ERROR:
            return None
        command = ["plait", "train", "--config", str(self.run_dir / CONFIG_FILE), *best.layout.flags(),
                   "--run-dir", f"{self.run_dir}-{best.layout.describe().split()[0]}"]
        return {"layout": best.layout.to_dict(), "name": best.layout.describe(), "predicted_step_time_s": best.step_time_s,
                "gain": gain, "error": PLANNER_ERROR, "train_command": command}

    def planner_choice(self) -> str | None:
        """What the planner would run on as many ranks of the same hardware, beside this layout, and
        whether that is a change worth making."""
        best, suggestion = self.fastest, self.suggestion()
        if best is None:
            return None
        if best.layout == self.layout:
            return f"the planner predicts {self.layout.describe()} is already the fastest layout for these ranks"
        if suggestion is None:
            return (f"the planner's fastest layout for {self.summary['world_size']} rank(s) on {self.hardware.name}, "
                    f"{best.layout.describe()}, is predicted within its own error (±{PLANNER_ERROR:.1%}) of this one: "
                    "no change suggested")
        return (f"what to change: {suggestion['name']} is predicted {suggestion['gain']:.0%} faster on "
                f"{self.hardware.name} ({best.step_time_s:.4g} s per step against {self.prediction.step_time_s:.4g} s; "
                f"the planner's own error ±{PLANNER_ERROR:.1%}); train it: {' '.join(suggestion['train_command'])}")

    def to_dict(self) -> dict:
        return {
            "run_dir": str(self.run_dir), "hardware": self.hardware.name, "layout": self.layout.to_dict(),
            "predicted": self.prediction.to_dict(),
            "rows": [{"quantity": q, "predicted": p, "measured": m, "unit": u} for q, p, m, u in self.rows()],
            "bottleneck": self.bottleneck_line(),
            "ranks": self.rank_shares(),
            "planner": self.planner_choice(),
            "suggestion": self.suggestion(),
            "divergence": postmortem(self.run_dir),
        }

    def report(self) -> str:
        s = self.summary
        lines = [
            f"{self.run_dir}: {self.layout.describe()}, model {s.get('model') or 'custom'}, {s['world_size']} ranks "
            f"on {s['device_name']}; predicted for {self.hardware.name}",
            "",
            "| quantity | predicted | measured | error |",
            "| --- | ---: | ---: | ---: |",
        ]
        for quantity, predicted, measured, unit in self.rows():
            if predicted is None or not measured:
                error = "—"
            elif unit == "fraction":  # a share of the step: its difference, in points
                error = f"{(predicted - measured) * 100:+.1f} points"
            else:
                error = f"{predicted / measured - 1:+.1%}"
            lines.append(f"| {quantity} | {_format(predicted, unit)} | {_format(measured, unit)} | {error} |")
        lines += self.rank_lines()
        if s.get("bubble_fraction_theory"):
            lines.append(f"\nthe schedule's bubble with equal stage costs: {s['bubble_fraction_theory']:.1%}")
        if s.get("time_split"):
            if s.get("trace_slowdown"):
                lines.append(f"traced steps ran {s['trace_slowdown']:.2f}× a plain step (the tracer's Python call on "
                             "every operator); their parts above are scaled to the plain step")
            lines.append(f"bottleneck: {self.bottleneck_line()}")
        if (choice := self.planner_choice()) is not None:
            lines.append(choice)
        lines += [f"divergence: {finding}" for finding in postmortem(self.run_dir)]
        lines.append("predicted time per step: " + ", ".join(
            f"{name.removesuffix('_s').replace('_', ' ')} {seconds:.4g} s"
            for name, seconds in self.prediction.time_breakdown.items()))
        return "\n".join(lines)

    def pictured(self) -> list[tuple[Timeline, str]]:
        """explain.png's steps and titles: the last traced step, titled with the run's bubble (the
        summary's and the table's: the median step's), above the simulated step; none without a
        pipeline or trace.json."""
        if self.layout.pp == 1 or self.trace is None:
            return []
        simulated = simulated_timeline(self.workload, self.hardware, self.layout.world_size, self.layout)
        return [
            (timeline_from_trace(self.trace), f"measured: {self.layout.describe()}, last traced step; the run's bubble "
                                              f"{self.summary['bubble_fraction']:.1%} (median step)"),
            (simulated, f"simulated on {self.hardware.name}: bubble {simulated.bubble_fraction:.1%}"),
        ]

    def draw(self) -> Path | None:
        """explain.png: the measured pipeline step above the simulated one; None without trace.json."""
        if not (pictured := self.pictured()):
            return None
        path = self.run_dir / EXPLAIN_PICTURE
        draw_timelines(pictured, path)
        return path


def _format(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "fraction":
        return f"{value:.1%}"
    if unit in ("bytes", "tokens/s"):
        return f"{value:,.0f}"
    return f"{value:.4g}"


def read_summary(run_dir: Path) -> dict:
    path = Path(run_dir) / SUMMARY_FILE
    if not_a_file(path) == MISSING:
        raise ConfigError(f"{run_dir} holds no {SUMMARY_FILE}; explain reads the directory of a finished "
                          "`plait train --run-dir DIR` run")
    require_input_file("the run's summary", path, "explain reads the summary.json plait train writes")
    try:
        summary = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ConfigError(f"{path} is not a readable summary ({error}); it is damaged: train the run again") from None
    if not isinstance(summary, dict) or "model_spec" not in summary or "device_name" not in summary:
        raise ConfigError(f"{path} has no model_spec: it was written before plait explain existed; train the run again")
    return summary


def read_trace(run_dir: Path, layout: Layout) -> dict | None:
    """trace.json, checked whole (its traced volumes and, with stages, its timeline), or None without one."""
    path = Path(run_dir) / TRACE_FILE
    if not path.exists():
        return None
    try:
        trace = json.loads(path.read_text())
        traced_step_volumes(trace, rank=0)
        if layout.pp > 1:
            timeline_from_trace(trace)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
        raise ConfigError(f"{path} is not a readable trace ({type(error).__name__}: {error}); it is damaged: "
                          "move it away to explain the run without it, or train the run again") from None
    return trace


def run_hardware(summary: dict, gpu: str | None, profile: Hardware | None) -> Hardware:
    """The hardware to predict on: a given profile or GPU, else the catalog entry of the run's GPU."""
    if profile is not None:
        return profile
    if gpu is not None:
        return hardware(gpu)
    name = summary["device_name"]
    entry = None if name == "cpu" else catalog_name_of(name)
    if entry is None:
        raise ConfigError(
            f"the run was on {name}, which the hardware catalog does not hold; measure this machine with "
            "`plait calibrate --out FILE` and pass --hardware-profile FILE (or name a catalog GPU with --gpu)"
        )
    return hardware(entry)


def explain(run_dir: Path, gpu: str | None = None, profile: Hardware | None = None) -> Explanation:
    """Predict the run in ``run_dir`` and pair each prediction with its measurement."""
    summary = read_summary(run_dir)
    hw = run_hardware(summary, gpu, profile)
    # A field of another type or value than a run writes fails somewhere below; said here, before
    # anything is printed (the layout's own refusals are ConfigErrors already, and pass).
    try:
        layout_fields = {f.name for f in fields(Layout)}
        values = {k: v for k, v in summary["layout"].items() if k in layout_fields}
        if values.get("stage_layers") is not None:
            values["stage_layers"] = tuple(values["stage_layers"])
        layout = Layout(**values)
        workload = Workload(ModelSpec(**summary["model_spec"]), summary["global_batch"], summary["precision"],
                            STACKS["plait"])
        prediction = evaluate(workload, hw, summary["world_size"], layout)
        explanation = Explanation(Path(run_dir), summary, workload, layout, hw, prediction, read_trace(run_dir, layout))
        explanation.report()
    except ConfigError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise ConfigError(f"{Path(run_dir) / SUMMARY_FILE} is damaged ({type(error).__name__}: {error}); train the run "
                          "again") from None
    return explanation
