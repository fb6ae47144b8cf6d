"""The planner's predictions of a published run (its step, its pinned layout's peak, its order against
another run), and the fits of the stacks' figures on published runs
(``benchmarks/validate_published.py --fit`` prints them; the values live in plait.facts.stack)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import replace

from benchmarks.megatron_runs import TABLE_4_LAYOUTS, table_4_layer_ms
from benchmarks.published_case import Case
from benchmarks.zero_bubble_runs import CHUNK_PASS_FITTED_ON, marginal_microbatch_seconds, unpredicted_per_extra_chunk
from plait.errors import ConfigError
from plait.layout import Layout
from plait.hardware import hardware
from plait.plan.search import best_layout
from plait.plan.simulate import evaluate
from plait.plan.workload import Workload


def predict(case: Case, hw) -> tuple[float, str]:
    workload = Workload(case.spec, case.batch, "bf16", case.kernels)
    p = best_layout(workload, hw, case.gpus, case.fixed, case.micro_batch)
    return p.step_time_s, f"{p.layout.describe()}, mbs {p.micro_batch_size}"


def refused_or_predicted(case: Case) -> float:
    """The predicted step, or infinity for a layout the planner refuses as not fitting: a pair holding
    one is out of order (the planner would not rank it), whichever side it is on."""
    try:
        return predict(case, case.hardware())[0]
    except ConfigError:
        return math.inf


def ordered(predicted: list[float], i: int, j: int) -> bool:
    """Whether the planner puts layout i ahead of layout j: never when it refuses either."""
    return math.isfinite(predicted[i] + predicted[j]) and predicted[i] < predicted[j]


def predicted_peak(case: Case) -> float:
    """The planner's peak bytes for the case's pinned layout at its micro-batch, fitting or not."""
    layout = Layout(**case.fixed, microbatches=case.batch // (case.fixed["dp"] * case.micro_batch))
    workload = Workload(case.spec, case.batch, "bf16", case.kernels)
    return evaluate(workload, case.hardware(), case.gpus, layout).peak_memory_bytes


def fit_catalog_efficiency() -> float:
    """The catalog's A100 matmul efficiency minimising the median |error| over table 4's five layer timings."""
    published = [ms for _, _, ms in TABLE_4_LAYOUTS]

    def cost(value: float) -> float:
        hw = replace(hardware("a100-80gb"), matmul_efficiency=value)
        return statistics.median(abs(ms / p - 1) for ms, p in zip(table_4_layer_ms(hw), published))

    return golden_section(cost, 0.4, 1.0)


def fit_efficiency(cases: list[Case]) -> float:
    """The matmul efficiency of the cases' GPU under their stack minimising the median |error| over them."""
    gpu = cases[0].gpu
    return fit_stack_figure(cases, lambda kernels, e: replace(kernels, matmul_efficiency=((gpu, e),)), 0.4, 1.0)


def fit_tp_layer_pass(cases: list[Case]) -> float:
    """The seconds per layer forward and backward under tensor parallelism of the cases' stack minimising the
    median |error| over them."""
    return fit_stack_figure(cases, lambda kernels, s: replace(kernels, tp_layer_pass_s=s), 0.0, 0.05)


def fit_zero3_efficiency(cases: list[Case]) -> float:
    """The fraction of the ring's bus bandwidth the cases' ZeRO-3 collectives reach, minimising the median |error|."""
    return fit_stack_figure(cases, lambda kernels, e: replace(kernels, zero3_collective_efficiency=e), 0.02, 1.0)


def fit_chunk_pass() -> float:
    """The zero-bubble fork's cost of a pass through a chunk (Kernels.chunk_pass_s) at which what one
    more micro-batch costs the fitted model's interleaved 1F1B over its 1F1B is predicted as published."""
    def unpredicted(seconds: float) -> float:
        (_, chunks, costs), = marginal_microbatch_seconds(predicting_chunk_pass(seconds), (CHUNK_PASS_FITTED_ON,))
        return abs(unpredicted_per_extra_chunk(chunks, costs))

    return golden_section(unpredicted, 0.0, 0.005, "unpredicted per extra chunk at {value:.4g} s a pass: {cost:.2e} s")


def predicting_chunk_pass(seconds: float) -> Callable[[Case], float]:
    """The predicted step of a run with its stack's cost per chunk pass set to ``seconds``."""
    def predicted(case: Case) -> float:
        case = replace(case, kernels=replace(case.kernels, chunk_pass_s=seconds))
        return predict(case, case.hardware())[0]
    return predicted


def fit_stack_figure(cases: list[Case], setting, lo: float, hi: float) -> float:
    """The value of one stack figure (``setting(kernels, value)``) in [lo, hi] minimising the median
    |error| over ``cases``: layouts chosen once at the current value, then replayed (golden-section search)."""
    layouts = []
    for case in cases:
        workload = Workload(case.spec, case.batch, "bf16", case.kernels)
        layouts.append((workload, best_layout(workload, case.hardware(), case.gpus, case.fixed, case.micro_batch).layout))

    def cost(value: float) -> float:
        fitted = [(replace(w, kernels=setting(w.kernels, value)), layout) for w, layout in layouts]
        return statistics.median(abs(evaluate(w, c.hardware(), c.gpus, l).step_time_s / c.measured_step_s - 1)
                                 for c, (w, l) in zip(cases, fitted))

    return golden_section(cost, lo, hi)


def golden_section(cost, lo: float, hi: float,
                   report: str = "median |error| on the fitted rows at {value:.4g}: {cost:.1%}") -> float:
    """The value in [lo, hi] minimising ``cost`` (golden-section search), its cost printed by ``report``."""
    ratio = (5**0.5 - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    cost_a, cost_b = cost(a), cost(b)
    for _ in range(14):
        if cost_a < cost_b:
            hi, b, cost_b = b, a, cost_a
            a = hi - ratio * (hi - lo)
            cost_a = cost(a)
        else:
            lo, a, cost_a = a, b, cost_b
            b = lo + ratio * (hi - lo)
            cost_b = cost(b)
    best = (lo + hi) / 2
    print(report.format(value=best, cost=cost(best)))
    return best
