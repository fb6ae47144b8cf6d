"""--grad-compression: bf16 loses only bf16 rounding, PowerSGD learns as well and moves fewer bytes,
and the bytes each moves are the facts the planner times.

**The bf16 tolerance.** bf16 keeps fp32's exponent and 8 significant bits, so each rounding to it
is off by at most u = 2⁻⁸ of the value. A compressed gradient element is rounded twice (cast to
bf16, then the sum of the two ranks' halves rounded back into bf16; dividing by 2 is exact), so
it is within 2u = 2⁻⁷ of the exact average. AdamW's update m/(√v + ε) then moves by at most twice
that relative (once through m, once through √v; clipping scales every gradient alike and Adam
undoes it), 2⁻⁶ of each step. To first order, the loss a step removes, g·Δw, moves by that same
fraction, so after k steps the loss is within 2⁻⁶ of what the reference has removed so far:

    |loss_k − reference_k| ≤ 2⁻⁶ · (reference_0 − min_{j≤k} reference_j) + 1e-5 · reference_k

the last term being the fp32 parity tolerance every uncompressed layout meets
(tests/test_data_parallel_parity.py). An off-by-one-step bug or a gradient not averaged at all
would move the loss by a whole step's decrease, 64 times the bound.
"""

from __future__ import annotations

import pytest

from plait.facts.model_state import (
    POWERSGD_START_STEP, communicated_bytes, powersgd_elements, rank_tensor_shapes, reduced_gradient_elements,
)
from plait.facts.stack import STACKS
from plait.facts.validity import run_problems
from plait.layout import Layout
from plait.models.flops import parameter_count
from plait.models.spec import model_spec
from tests.cases import layout_world_size, run_config, train_losses
from tests.grad_compression_cases import gradient_bytes_per_step

BF16_STEP = 2.0 ** -6  # of the loss removed so far: see the module docstring
FP32_RELATIVE = 1e-5
POWERSGD_STEPS = 200
POWERSGD_LOSS_GAP = 0.02  # relative to the uncompressed run's final loss
SPEC = model_spec("tiny", seq_len=64)


def _losses(pool, steps: int = 10, **layout) -> list[float]:
    config = run_config("tiny", steps=steps, **layout)
    return pool.run(train_losses, layout_world_size(layout), config)[0]


@pytest.fixture(scope="module")
def reference(pool) -> list[float]:
    """The uncompressed single process, 10 steps."""
    losses = _losses(pool)
    assert losses[-1] < losses[0] - 0.5, "the reference should learn"
    return losses


@pytest.mark.parametrize("layout", [dict(dp=2), dict(dp=2, zero=1), dict(dp=2, zero=2), dict(dp=2, zero=3),
                                    dict(dp=2, tp=2), dict(dp=2, pp=2, microbatches=2)],
                         ids=["dp2", "dp2-zero1", "dp2-zero2", "dp2-zero3", "tp2-dp2", "pp2-dp2"])
def test_bf16_loses_no_more_than_bf16_rounding(pool, reference, layout):
    losses = _losses(pool, **layout, grad_compression="bf16")
    for step, (expected, actual) in enumerate(zip(reference, losses, strict=True)):
        removed = reference[0] - min(reference[:step + 1])
        bound = BF16_STEP * removed + FP32_RELATIVE * expected
        assert abs(actual - expected) <= bound, f"step {step}: {actual} vs {expected} (bound {bound:.3g})"


def test_bf16_compression_is_not_a_no_op(pool, reference):
    """The comparison above would pass if compression were off: the losses must differ from fp32's."""
    losses = _losses(pool, dp=2, grad_compression="bf16")
    assert max(abs(a - b) for a, b in zip(reference, losses)) > FP32_RELATIVE * reference[-1]


def test_powersgd_learns_as_well_and_moves_fewer_bytes(pool):
    plain = _losses(pool, steps=POWERSGD_STEPS, dp=2)
    compressed = _losses(pool, steps=POWERSGD_STEPS, dp=2, grad_compression="powersgd")
    assert compressed[-1] <= plain[-1] * (1 + POWERSGD_LOSS_GAP), (compressed[-1], plain[-1])
    # Lossy from its start step on: the losses leave the uncompressed run's (error feedback keeps them close).
    assert compressed[:POWERSGD_START_STEP] == pytest.approx(plain[:POWERSGD_START_STEP], rel=FP32_RELATIVE)
    assert compressed[POWERSGD_START_STEP + 5:] != pytest.approx(plain[POWERSGD_START_STEP + 5:], rel=FP32_RELATIVE)


@pytest.mark.parametrize("zero, compression", [(0, "none"), (0, "bf16"), (0, "powersgd"), (1, "powersgd"),
                                               (2, "bf16"), (3, "bf16"), (3, "none")])
def test_measured_gradient_bytes_are_the_facts(pool, zero, compression):
    """Each step's gradient reduction hands its collectives exactly the bytes the planner times:
    Ψ × the facts' bytes per element, and under PowerSGD (from its start step) the whole tensors
    plus the P and Q factors; before that step PowerSGD all-reduces every gradient whole."""
    layout = Layout(dp=2, zero=zero, grad_compression=compression)
    config = run_config("tiny", steps=POWERSGD_START_STEP + 2, dp=2, zero=zero, grad_compression=compression)
    measured = pool.run(gradient_bytes_per_step, 2, config)
    element_bytes = communicated_bytes(layout, "fp32", STACKS["plait"])[0]
    expected = reduced_gradient_elements(SPEC, layout, parameter_count(SPEC)) * element_bytes
    for rank in measured:
        assert rank[-1] == expected
        if compression == "powersgd":
            assert rank[POWERSGD_START_STEP - 1] == parameter_count(SPEC) * element_bytes
            assert rank[-1] < parameter_count(SPEC) * element_bytes / 4


def test_powersgd_compresses_matrices_and_sends_vectors_whole():
    whole, p, q = powersgd_elements(rank_tensor_shapes(SPEC, SPEC.layers, True, True, 1, 1))
    assert whole == sum(rows for rows, cols in rank_tensor_shapes(SPEC, SPEC.layers, True, True, 1, 1) if cols == 1)
    assert p + q + whole < parameter_count(SPEC) / 4


@pytest.mark.parametrize("layout, words", [
    (Layout(dp=1, grad_compression="bf16"), "no effect with --dp 1"),
    (Layout(dp=2, zero=2, grad_compression="powersgd"), "pass --zero 0 or 1"),
    (Layout(dp=2, zero=3, grad_compression="powersgd"), "pass --zero 0 or 1"),
    (Layout(dp=2, tp=2, grad_compression="powersgd"), "drop --tp and --pp"),
    (Layout(dp=2, pp=2, microbatches=2, grad_compression="powersgd"), "drop --tp and --pp"),
    (Layout(dp=2, grad_compression="fp8"), "unknown gradient compression"),
])
def test_meaningless_combinations_are_refused_in_one_sentence(layout, words):
    problems = run_problems(SPEC, layout)
    assert len(problems) == 1 and words in problems[0] and "\n" not in problems[0], problems


def test_the_planner_times_the_bytes_each_compression_moves():
    """bf16 halves an fp32 all-reduce's bandwidth term; PowerSGD moves its factors in three
    all-reduces and holds a whole-gradient error buffer; plan explores none unless pinned."""
    from plait.hardware import hardware
    from plait.plan.search import search
    from plait.plan.simulate import evaluate, flush_costs
    from plait.plan.workload import Workload

    gpt2, hw = model_spec("gpt2"), hardware("a100-80gb", gpus_per_node=8)
    workload = Workload(gpt2, 256, "fp32")
    params = parameter_count(gpt2)
    reduce = {c: flush_costs(workload, hw, Layout(dp=16, grad_compression=c), params, 1, 0).reduce
              for c in ("none", "bf16", "powersgd")}
    assert reduce["powersgd"] < reduce["bf16"] < 0.55 * reduce["none"]
    predicted = {c: evaluate(workload, hw, 16, Layout(dp=16, microbatches=2, grad_compression=c))
                 for c in ("none", "powersgd")}
    extra = predicted["powersgd"].memory_breakdown["other"] - predicted["none"].memory_breakdown["other"]
    assert extra == pytest.approx(params * 4, rel=1e-6)
    assert {p.layout.grad_compression for p in search(workload, hw, 16, top=5).ranked} == {"none"}
    pinned = search(workload, hw, 16, {"grad_compression": "bf16"}, top=5).ranked
    assert pinned and {p.layout.grad_compression for p in pinned} == {"bf16"}
