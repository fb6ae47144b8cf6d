"""The planner's matmul model against 2,016 bf16 matmuls measured on one H100
(benchmarks/measured/gemm_shapes_h100.json, benchmarks/gemm_shapes.py): FLOPs at one fitted
efficiency times the share of filled 128-wide tiles, plus a constant per kernel, describes the
GPT-style linear layers' shapes; a fixed cost per tile would earn little and whole waves read worse,
so the planner charges neither."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.gemm_shapes import best_setup, dump, errors, fit, long_kernels
from plait.calibrate.gpu import GPU_SIZES
from plait.calibrate.host import layer_kernel_scales
from plait.hardware import hardware, load_profile

MEASURED = Path(__file__).parent.parent / "benchmarks" / "measured"
H100 = hardware("h100-sxm")


@pytest.fixture(scope="module")
def measured() -> dict:
    return json.loads((MEASURED / "gemm_shapes_h100.json").read_text())


def test_the_planners_form_describes_measured_shapes(measured):
    cases = long_kernels(measured)
    fitted, misses = fit(H100, cases)
    assert statistics.median(misses) < 0.035
    # cuBLAS reaches about 0.7 of the H100's dense bf16 peak on large shapes
    assert 0.66 < fitted.matmul_efficiency < 0.75
    # on the shapes with ragged tiles, the tile fill reads them no worse than a flat rate
    partial = [c for c in cases if c["m"] % H100.matmul_tile or c["n"] % H100.matmul_tile]
    flat, _ = fit(replace(H100, matmul_tile=1), cases)
    assert statistics.median(errors(fitted, partial)) <= statistics.median(errors(flat, partial))


def test_left_out_terms_do_not_earn_their_place(measured):
    cases = long_kernels(measured)
    median = statistics.median(fit(H100, cases)[1])
    _, _, with_setup = best_setup(H100, cases)
    assert median - statistics.median(with_setup) < 0.005
    waves = fit(H100, cases, sms=measured["sms"])[1]
    assert statistics.median(waves) > median
    assert max(waves) > max(fit(H100, cases)[1])


def test_calibration_agrees_with_the_shape_sweep(measured):
    """plait calibrate's few F.linear probes on an H100 (its profile shipped beside the sweep) and
    the sweep's 1,496 kernels, fitted apart, read the same matmul rate within 5%."""
    profile = load_profile(MEASURED / "calibrate_h100.json")
    swept, _ = fit(H100, long_kernels(measured))
    assert profile.matmul_efficiency == pytest.approx(swept.matmul_efficiency, rel=0.05)


def test_shipped_file_is_what_the_script_writes(measured):
    """A new measurement is written as the shipped one is (one row a line), so --from reads both."""
    assert dump(measured) == (MEASURED / "gemm_shapes_h100.json").read_text()


def test_shipped_profile_belongs_to_this_kernel_model():
    """A profile's layer scale is fitted against the planner's model of a layer (README,
    `plait calibrate`); the shipped one must be what its own stored working-layer times fit under
    this release's model: after a change to that model, refit its ``layer_kernel_scale`` with
    ``layer_kernel_scales`` as below, or measure it again."""
    path = MEASURED / "calibrate_h100.json"
    profile = load_profile(path)
    working = json.loads(path.read_text())["calibration"]["working_layers"]
    refitted = layer_kernel_scales(working, profile, "bf16", GPU_SIZES)
    for family, scale in refitted.items():
        assert profile.layer_kernel_scale[family].forward == pytest.approx(scale.forward, rel=1e-9)
        assert profile.layer_kernel_scale[family].backward == pytest.approx(scale.backward, rel=1e-9)
