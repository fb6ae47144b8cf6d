"""``plait explain RUN_A RUN_B``: two finished runs side by side, and what made the difference.

Each run is explained as on its own (``plait.explain.run``: the planner's prediction of the same
model, batch and layout). Its step is split into the same parts on both sides: compute, exposed
data-parallel communication, exposed tensor- and context-parallel communication, the pipeline
bubble, waiting for data, and host overhead with what else the step holds. The measured parts are
those of the run's median traced step (one whole step, ``time_split``'s ``median_step``), scaled to
its median plain step so that they add up to the run's step time; the predicted parts add up to the predicted step. The part whose measured seconds
changed most between the runs is named in one sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from plait.errors import ConfigError
from plait.explain.run import Explanation, explain
from plait.layout import DATA_GROUPS
from plait.hardware import Hardware

PARTS = ("compute", "exposed dp communication", "exposed tp and cp communication", "bubble", "waiting for data",
         "host and other")


def measured_parts(explanation: Explanation) -> dict[str, float]:
    """The run's median traced step in ``PARTS``, in seconds of its median plain step."""
    summary = explanation.summary
    step = (summary.get("time_split") or {}).get("median_step")
    if step is None:
        raise ConfigError(f"{explanation.run_dir} has no traced step to split (it ran a single step, or was trained "
                          "before plait compared runs); train it again for at least two steps")
    exposed = step["exposed_comm_by_group_s"]
    data = sum(exposed.get(group, 0.0) for group in DATA_GROUPS)
    tensor = exposed.get("tp", 0.0) + exposed.get("cp", 0.0)
    parts = {"compute": step["compute_s"], "exposed dp communication": data,
             "exposed tp and cp communication": tensor, "bubble": step["bubble_s"], "waiting for data": step["data_s"],
             "host and other": step["host_s"] + step["exposed_comm_s"] - data - tensor}  # groups beyond the mesh's
    scale = summary["step_time_s"] / step["step_s"]
    return {part: seconds * scale for part, seconds in parts.items()}


def predicted_parts(explanation: Explanation) -> dict[str, float]:
    """The planner's step of the same run in ``PARTS``; host and other is what its step holds beyond the rest."""
    times = explanation.prediction.time_breakdown
    parts = {"compute": times["compute_s"] + times["optimizer_s"],
             "exposed dp communication": times["exposed_dp_comm_s"],
             "exposed tp and cp communication": times["critical_path_comm_s"], "bubble": times["bubble_s"],
             "waiting for data": 0.0}  # the planner takes the data as ready
    return {**parts, "host and other": max(0.0, explanation.prediction.step_time_s - sum(parts.values()))}


@dataclass
class Comparison:
    """Two explained runs and their steps in ``PARTS``, measured and predicted (first, second)."""

    first: Explanation
    second: Explanation
    measured: tuple[dict[str, float], dict[str, float]]
    predicted: tuple[dict[str, float], dict[str, float]]

    def changed_most(self) -> str:
        """The part whose measured seconds differ most between the runs."""
        first, second = self.measured
        return max(PARTS, key=lambda part: abs(second[part] - first[part]))

    def scaling_efficiency(self) -> float:
        """The second run's throughput over the first's, per rank: 1 is linear scaling."""
        first, second = self.first.summary, self.second.summary
        return (second["tokens_per_s"] / first["tokens_per_s"]) / (second["world_size"] / first["world_size"])

    def nodes_clause(self) -> str:
        """Where the runs span different numbers of nodes of the hardware they are predicted on: how
        many each (its links between nodes are what the predicted parts cross); else nothing."""
        nodes = [math.ceil(run.summary["world_size"] / run.hardware.gpus_per_node) for run in (self.first, self.second)]
        if nodes[0] == nodes[1]:
            return ""
        spans = [f"{run.layout.describe()} spans {count} node(s) of {run.hardware.gpus_per_node} on {run.hardware.name}"
                 for run, count in zip((self.first, self.second), nodes)]
        return f"{spans[1]}, against {spans[0]}: "

    def sentence(self) -> str:
        """What made the difference, in one sentence."""
        part = self.changed_most()
        (first, second), (predicted_first, predicted_second) = self.measured, self.predicted
        a, b = self.first.summary, self.second.summary
        change = second[part] - first[part]
        return (f"{self.nodes_clause()}{part} changed most ({change:+.3g} s): {second[part]:.3g} s, {second[part] / b['step_time_s']:.0%} of "
                f"{self.second.layout.describe()}'s step, against {first[part]:.3g} s, "
                f"{first[part] / a['step_time_s']:.0%} of {self.first.layout.describe()}'s (predicted "
                f"{predicted_second[part]:.3g} s against {predicted_first[part]:.3g} s)")

    def to_dict(self) -> dict:
        runs = [_run_dict(self.first), _run_dict(self.second)]
        (first, second), (predicted_first, predicted_second) = self.measured, self.predicted
        return {
            "runs": runs, "scaling_efficiency": self.scaling_efficiency(),
            "parts": [{"part": part, "measured_s": [first[part], second[part]],
                       "predicted_s": [predicted_first[part], predicted_second[part]]} for part in PARTS],
            "changed_most": self.changed_most(), "sentence": self.sentence(),
            "suggestions": [self.first.suggestion(), self.second.suggestion()],
        }

    def report(self) -> str:
        a, b = self.first, self.second
        (first, second), (predicted_first, predicted_second) = self.measured, self.predicted
        lines = [
            f"A: {a.run_dir}: {a.layout.describe()}, {a.summary['world_size']} ranks on {a.summary['device_name']}",
            f"B: {b.run_dir}: {b.layout.describe()}, {b.summary['world_size']} ranks on {b.summary['device_name']}",
            f"predicted for {a.hardware.name}" + ("" if a.hardware.name == b.hardware.name else f" and {b.hardware.name}"),
            "",
            "| | A measured | B measured | change | A predicted | B predicted |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            _row("step time (s)", a.summary["step_time_s"], b.summary["step_time_s"], a.prediction.step_time_s,
                 b.prediction.step_time_s),
            f"| tokens per second | {a.summary['tokens_per_s']:,.0f} | {b.summary['tokens_per_s']:,.0f} | "
            f"{b.summary['tokens_per_s'] / a.summary['tokens_per_s'] - 1:+.1%} | | |",
        ]
        lines += [_row(f"{part} (s)", first[part], second[part], predicted_first[part], predicted_second[part])
                  for part in PARTS]
        lines += ["", f"scaling efficiency of B against A: {self.scaling_efficiency():.0%} of linear "
                      f"({b.summary['world_size']} ranks against {a.summary['world_size']})",
                  f"what changed: {self.sentence()}"]
        lines += [f"{name}, {explanation.planner_choice()}" for name, explanation in (("A", a), ("B", b))
                  if explanation.suggestion() is not None]
        return "\n".join(lines)


def _row(name: str, first: float, second: float, predicted_first: float, predicted_second: float) -> str:
    return f"| {name} | {first:.4g} | {second:.4g} | {second - first:+.3g} | {predicted_first:.4g} | {predicted_second:.4g} |"


def _run_dict(explanation: Explanation) -> dict:
    summary = explanation.summary
    return {"run_dir": str(explanation.run_dir), "layout": explanation.layout.to_dict(),
            "world_size": summary["world_size"], "device_name": summary["device_name"],
            "hardware": explanation.hardware.name, "step_time_s": summary["step_time_s"],
            "tokens_per_s": summary["tokens_per_s"], "predicted_step_time_s": explanation.prediction.step_time_s}


def compare(first: Path, second: Path, gpu: str | None = None, profile: Hardware | None = None) -> Comparison:
    """Explain both runs and split their steps (a run without a traced step is refused)."""
    runs = explain(first, gpu, profile), explain(second, gpu, profile)
    return Comparison(*runs, measured=(measured_parts(runs[0]), measured_parts(runs[1])),
                      predicted=(predicted_parts(runs[0]), predicted_parts(runs[1])))
