"""The planner's matmul model against 2,016 bf16 matmuls measured on one H100
(benchmarks/measured/gemm_shapes_h100.json, benchmarks/gemm_shapes.py): the share of filled
128-wide output tiles, at one fitted efficiency and launch cost, describes the linear layers' shapes
of the published runs, and the terms it leaves out do not earn their place."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.gemm_shapes import FIT_FROM_S, fit
from plait.plan.hardware import hardware

MEASURED = Path(__file__).parent.parent / "benchmarks" / "measured" / "gemm_shapes_h100.json"


@pytest.fixture(scope="module")
def long_kernels() -> tuple[list[dict], int]:
    measured = json.loads(MEASURED.read_text())
    cases = [dict(zip(measured["columns"], row)) for row in measured["rows"]]
    return [c for c in cases if c["seconds"] >= FIT_FROM_S], measured["sms"]


def test_tile_fill_describes_measured_shapes(long_kernels):
    cases, _ = long_kernels
    fitted, off = fit(hardware("h100-sxm"), cases)
    assert statistics.median(off) < 0.035
    # a flat rate (no tile fill) misses the thin shards: tp 8 of small layers, short micro-batches
    flat, flat_off = fit(hardware("h100-sxm", matmul_tile=1), cases)
    assert statistics.median(flat_off) > statistics.median(off)
    # cuBLAS reaches about 0.7 of the H100's dense bf16 peak on large shapes
    assert 0.66 < fitted.matmul_efficiency < 0.75


def test_whole_waves_fit_worse(long_kernels):
    """Hopper's cuBLAS kernels do not pay for a last partial wave of tiles as a wave-per-launch
    kernel would: rounding the waves up reads the shapes further off."""
    cases, sms = long_kernels
    _, off = fit(hardware("h100-sxm"), cases)
    _, waves_off = fit(hardware("h100-sxm"), cases, sms=sms)
    assert statistics.median(waves_off) > statistics.median(off)
    assert max(waves_off) > max(off)
