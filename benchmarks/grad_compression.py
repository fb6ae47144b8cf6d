"""Loss curves, bytes moved and step time of tiny at dp 2 under --grad-compression none, bf16 and powersgd.

    python -m benchmarks.grad_compression [--steps 200] [--rounds 2] [--out runs/bench/grad_compression] 2>/dev/null

Every run trains the same seed and data on local gloo ranks, one thread each, the three
compressions interleaved in every round so that load from other processes falls on all alike. The
bytes are those each rank hands its gradient all-reduces in one step after PowerSGD's start, counted
by the tests' probe (tests/grad_compression_cases.py) in a separate short run, so that its counting
does not slow the timed ones. Prints final losses (the last step, and the mean of the last 20),
bytes per step and step-time ratios; draws the loss curves to OUT/loss_curves.png.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from plait.config import RunConfig, TrainSpec, validate_run
from plait.facts.model_state import POWERSGD_START_STEP
from plait.layout import GRAD_COMPRESSIONS, Layout
from plait.models.spec import model_spec
from plait.topology import build_topology
from plait.train.loop import train


def config(compression: str, steps: int, global_batch: int, seq_len: int) -> RunConfig:
    run = RunConfig(model=model_spec("tiny", seq_len=seq_len), layout=Layout(dp=2, grad_compression=compression),
                    train=TrainSpec(steps=steps, global_batch=global_batch), model_name="tiny")
    validate_run(run)
    return run


def _rank(rank: int, run: RunConfig, port: int, measure_bytes: bool, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(minutes=5))
    if measure_bytes:
        from tests.grad_compression_cases import gradient_bytes_per_step

        outcome = gradient_bytes_per_step(run)
    else:
        result = train(run, build_topology(run.layout, torch.device("cpu")))
        outcome = {"losses": result.losses, "step_times": result.step_times}
    if rank == 0:
        results.put(outcome)
    dist.destroy_process_group()


def on_two_ranks(run: RunConfig, measure_bytes: bool = False):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.get_context("spawn").Queue()
    mp.start_processes(_rank, args=(run, port, measure_bytes, results), nprocs=2, start_method="spawn")
    return results.get()


def draw(curves: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5))
    for name, losses in curves.items():
        smooth = [statistics.fmean(losses[max(0, i - 9):i + 1]) for i in range(len(losses))]
        axis.plot(losses, alpha=0.25, linewidth=0.8)
        axis.plot(smooth, label=f"{name} (mean of 10 steps)", color=axis.lines[-1].get_color())
    axis.axvline(POWERSGD_START_STEP, color="grey", linestyle=":", label="PowerSGD starts compressing")
    axis.set(xlabel="step", ylabel="training loss", title=title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="runs/bench/grad_compression")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {name: config(name, args.steps, args.global_batch, args.seq_len) for name in GRAD_COMPRESSIONS}
    losses: dict[str, list[float]] = {}
    step_s: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, run in runs.items():
            outcome = on_two_ranks(run)
            losses[name] = outcome["losses"]  # the same every round: same seed, same data
            # Steady state: the steps after PowerSGD's start, for every compression alike.
            median = statistics.median(outcome["step_times"][POWERSGD_START_STEP + 1:])
            step_s[name] = min(step_s.get(name, float("inf")), median)
    short = {name: config(name, POWERSGD_START_STEP + 2, args.global_batch, args.seq_len) for name in GRAD_COMPRESSIONS}
    moved = {name: on_two_ranks(run, measure_bytes=True)[-1] for name, run in short.items()}

    print(f"tiny, dp 2 (gloo, one thread per rank), global batch {args.global_batch} × {args.seq_len}, {args.steps} "
          f"steps, best of {args.rounds} rounds; PowerSGD compresses from step {POWERSGD_START_STEP}")
    print(f"{'compression':12s} {'final loss':>10s} {'last 20':>8s} {'vs none':>8s} {'bytes/step':>12s} "
          f"{'vs none':>8s} {'step ms':>8s} {'vs none':>8s}")
    rows = {}
    for name in GRAD_COMPRESSIONS:
        tail = statistics.fmean(losses[name][-20:])
        rows[name] = {"final_loss": losses[name][-1], "mean_last_20": tail, "bytes_per_step": moved[name],
                      "step_time_s": step_s[name]}
        print(f"{name:12s} {losses[name][-1]:10.4f} {tail:8.4f} {tail / statistics.fmean(losses['none'][-20:]):8.4f} "
              f"{moved[name]:12,d} {moved[name] / moved['none']:8.3f} {step_s[name] * 1000:8.1f} "
              f"{step_s[name] / step_s['none']:8.3f}")
    draw(losses, out / "loss_curves.png", f"tiny, dp 2, global batch {args.global_batch} × {args.seq_len}")
    (out / "results.json").write_text(json.dumps({"rows": rows, "losses": losses}, indent=1))
    print(f"loss curves drawn in {out / 'loss_curves.png'}")


if __name__ == "__main__":
    main()
