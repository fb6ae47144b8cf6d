"""summary.json: the run's headline figures, gathered from every rank by rank 0.

``model_spec``, ``global_batch`` and ``device_name`` let ``plait explain`` predict the same run.
``mfu`` is the model FLOP/s per rank over the device's peak from the hardware catalog
(``plait.hardware``), null on a device the catalog does not hold (any CPU). ``time_split`` is
where the traced steps' time went (``plait.observe.time_split``): compute, exposed communication
(per group), overlapped communication, bubble and other, medians over the traced steps with their
min and max, and per rank; ``comm_fraction`` is its exposed communication over the traced step's
time (median), null when no step was traced. ``step_time_s`` is the median plain step: neither the first
nor traced nor profiled while others ran; ``trace_slowdown`` is the median traced step over it (the
tracer calls into Python on every operator: 1.1–1.3× on a CPU, 1.8× for a host-heavy model on a
GPU), null without both. Without pipeline parallelism there is no bubble, so
``bubble_fraction`` is 0. ``model_state_bytes_per_rank``
is what each rank measured it holds of parameters, gradients and optimizer state
(``plait.observe.model_state``); ``model_state_bytes_formula`` is what the shared fact
(``plait.facts.model_state.rank_model_states``, which the planner also uses) says it holds: one
split when every rank holds the same, else one per rank, in rank order (pipeline stages differ).
"""

from __future__ import annotations

import resource
import statistics
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from plait.config import RunConfig
from plait.facts.model_state import pipeline_share, rank_model_states
from plait.models.flops import flops_per_sequence, parameter_count
from plait.observe.run_files import SUMMARY_FILE, write_json_atomically
from plait.observe.time_split import run_time_split
from plait.hardware import catalog_name_of, hardware
from plait.topology import Topology


def peak_memory_bytes(device: torch.device) -> int:
    """Peak bytes allocated on the GPU, or on a CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def catalog_peak_tflops(device: torch.device, precision: str) -> float | None:
    """The catalog's dense peak TFLOP/s of ``device`` in ``precision``, or None if it is not a catalog GPU."""
    if device.type != "cuda":
        return None
    name = catalog_name_of(torch.cuda.get_device_name(device))
    return None if name is None else hardware(name).peak_tflops(precision)


def plain_step_times(step_times: list[float], observed: list[bool]) -> list[float]:
    """The steps after the first (warm-up) that were neither traced nor profiled (``observed``: their
    observers slow them)."""
    return [time for time, seen in list(zip(step_times, observed))[1:] if not seen]


def steady_step_time(step_times: list[float], observed: list[bool]) -> float:
    """Median time of the plain steps; without one, of every step after the first (or the only one)."""
    return statistics.median(plain_step_times(step_times, observed) or step_times[1:] or step_times)


def trace_slowdown(split: dict | None, step_times: list[float], observed: list[bool]) -> float | None:
    """The median traced step over the median plain step: what the tracer's Python call on every
    operator costs this run (None without a traced step or a plain one to compare)."""
    plain = plain_step_times(step_times, observed)
    return None if split is None or not plain else split["step_s"]["median"] / statistics.median(plain)


def model_state_formula(config: RunConfig, topology: Topology) -> dict[str, int]:
    """What the shared fact says this rank holds of parameters, gradients and optimizer state."""
    share = pipeline_share(config.model, config.layout, topology.coordinate("pp"))
    states = rank_model_states(config.model, config.layout, config.train.precision, share,
                               dp_rank=topology.coordinate("dp"), cp_rank=topology.coordinate("cp"))
    return {"parameters": round(states.params), "gradients": round(states.grads), "optimizer": round(states.optimizer)}


def write_summary(run_dir: Path, config: RunConfig, topology: Topology, result) -> dict | None:
    """Collective: every rank contributes its peak memory; rank 0 writes and returns the summary."""
    per_rank: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, peak_memory_bytes(topology.device))
    model_state: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(model_state, result.model_state_bytes)
    formulas: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(formulas, model_state_formula(config, topology))
    if not topology.is_logging_rank or not result.losses:
        return None
    layout, train = config.layout, config.train
    step_time = steady_step_time(result.step_times, result.observed)
    sequences_per_s = train.global_batch / step_time
    model_flops = flops_per_sequence(config.model, recompute=layout.recompute).model
    model_tflops = model_flops * sequences_per_s / layout.world_size / 1e12
    peak = catalog_peak_tflops(topology.device, train.precision)
    split = run_time_split(result.traces) if result.traces else None
    summary = {
        "layout": {**layout.to_dict(), "name": layout.describe()},
        "world_size": layout.world_size,
        "model": config.model_name,
        "model_spec": asdict(config.model),
        "global_batch": train.global_batch,
        "parameters": parameter_count(config.model),
        "precision": train.precision,
        "device": topology.device.type,
        "device_name": torch.cuda.get_device_name(topology.device) if topology.device.type == "cuda" else "cpu",
        "steps": train.steps,
        "first_step": result.first_step,
        "initial_loss": result.losses[0],
        "final_loss": result.losses[-1],
        "step_time_s": step_time,
        "tokens_per_s": sequences_per_s * config.model.seq_len,
        "model_tflops_per_rank": model_tflops,
        "bubble_fraction": result.pipeline.get("bubble_fraction", 0.0 if layout.pp == 1 else None),
        "bubble_fraction_theory": result.pipeline.get("bubble_fraction_theory", 0.0 if layout.pp == 1 else None),
        "comm_fraction": None if split is None else split["comm_fraction"]["median"],
        "compute_to_sync_ratio": None if split is None else split["compute_to_sync_ratio"],
        "time_split": split,
        "trace_slowdown": trace_slowdown(split, result.step_times, result.observed),
        "mfu": None if peak is None else model_tflops / peak,
        "peak_memory_bytes": max(per_rank),
        "peak_memory_bytes_per_rank": per_rank,
        "model_state_bytes_per_rank": model_state,
    }
    summary["model_state_bytes_formula"] = formulas[0] if all(f == formulas[0] for f in formulas) else formulas
    write_json_atomically(Path(run_dir) / SUMMARY_FILE, summary)
    return summary
