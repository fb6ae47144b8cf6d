"""Predicted against measured step time for layouts trained on this machine, after calibration.

Calibrates a profile of one core per device (what each of two local ranks gets from `plait
train`), trains each two-rank layout (data, ZeRO, tensor, sequence, context, pipeline parallel) for a few steps, takes the median step time after the first
three, and sets it beside `plait simulate` with that profile. Rerun on the same OUT_DIR to predict
the runs already measured there again (after a model change) without measuring anything. Single-rank layouts are left out:
`plait train` gives a lone rank both cores, and on a shared 2-core machine that thread pair is
descheduled so unevenly that its step time says more about the neighbours than the model.

    PYTHONPATH=src python benchmarks/local_validation.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from plait.calibrate.machine import calibrate
from plait.facts.stack import STACKS
from plait.layout import Layout
from plait.models.spec import model_spec
from plait.hardware import load_profile
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload

MODELS = {
    "tiny": {},
    "tiny-llama": {},
    "gpt-small": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 256, "seq_len": 128},
}
RUNS = [  # model, layout on two ranks, global batch
    ("tiny", Layout(dp=2), 8), ("tiny", Layout(dp=2, microbatches=2), 16), ("tiny", Layout(dp=2), 32),
    ("gpt-small", Layout(tp=2), 16), ("gpt-small", Layout(tp=2, sp=True), 16), ("gpt-small", Layout(cp=2), 16),
    ("gpt-small", Layout(cp=2, cp_algorithm="ring"), 16), ("gpt-small", Layout(cp=2, cp_algorithm="all-gather"), 16),
    ("gpt-small", Layout(dp=2, zero=2), 16), ("tiny", Layout(dp=2, microbatches=4), 32),
    ("tiny-llama", Layout(dp=2), 8), ("tiny-llama", Layout(dp=2, microbatches=2), 16),
    ("gpt-small", Layout(dp=2), 8), ("gpt-small", Layout(dp=2, microbatches=2), 16),
    ("gpt-small", Layout(dp=2, microbatches=4), 32),
    ("tiny", Layout(pp=2, microbatches=4), 16), ("gpt-small", Layout(pp=2, microbatches=4), 16),
]
STEPS = 15


def spec_of(name: str):
    return model_spec(name) if not MODELS[name] else model_spec(None, family="gpt2", **MODELS[name])


def model_flags(name: str) -> list[str]:
    if not MODELS[name]:
        return ["--model", name]
    return [f"--{k.replace('_', '-')}={v}" for k, v in MODELS[name].items()]


def layout_flags(layout: Layout) -> list[str]:
    """The layout as plait flags: every size, plus the choices that differ from the defaults."""
    flags = [f"--{k}={getattr(layout, k)}" for k in ("dp", "tp", "cp", "pp", "microbatches")]
    if layout.sp:
        flags.append("--sp")
    if layout.cp > 1 and layout.cp_algorithm != Layout.cp_algorithm:
        flags.append(f"--cp-algorithm={layout.cp_algorithm}")
    return flags + ([f"--zero={layout.zero}"] if layout.zero else [])


def measure(out: Path, name: str, layout: Layout, batch: int) -> float:
    extras = "".join(f"-{k}{getattr(layout, k)}" for k in ("tp", "cp", "pp", "zero") if getattr(layout, k) > (0 if k == "zero" else 1))
    algorithm = f"-{layout.cp_algorithm}" if layout.cp > 1 and layout.cp_algorithm != Layout.cp_algorithm else ""
    run_dir = out / f"{name}-dp{layout.dp}-m{layout.microbatches}-b{batch}{extras}{algorithm}{'-sp' if layout.sp else ''}"
    if not (run_dir / "metrics.jsonl").exists():  # measured before: predict again without re-running
        command = [sys.executable, "-m", "plait", "train", *model_flags(name), *layout_flags(layout),
                   "--global-batch", str(batch), "--steps", str(STEPS), "--run-dir", str(run_dir)]
        finished = subprocess.run(command, capture_output=True, text=True, env={**os.environ})
        if finished.returncode:
            raise SystemExit(f"{' '.join(command)} failed:\n{finished.stderr[-3000:]}")
    times = [json.loads(line)["step_time_s"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(times[3:])


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    path = out / "profile-1core.json"
    if not path.exists():
        calibrate(path, "cpu-1core", "fp32", 1)
    hw = load_profile(path)
    print("| model | layout | global batch | measured step (s) | predicted (s) | error | command |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    errors = []
    for name, layout, batch in RUNS:
        measured = measure(out, name, layout, batch)
        workload = Workload(spec_of(name), batch, "fp32", STACKS["plait"])
        predicted = evaluate(workload, hw, layout.world_size, layout).step_time_s
        error = predicted / measured - 1
        errors.append(abs(error))
        flags = " ".join(model_flags(name) + layout_flags(layout))
        print(f"| {name} | {layout.describe()} | {batch} | {measured:.4f} | {predicted:.4f} | {error:+.1%} | "
              f"`plait simulate {flags} --gpus {layout.world_size} --global-batch {batch} "
              f"--precision fp32 --hardware-profile {path.name}` |", flush=True)
    print(f"\nmedian |error| {statistics.median(errors):.1%} over {len(errors)} layouts; worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
