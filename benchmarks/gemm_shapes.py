"""bf16 matmul times on a GPU over GPT-style block shapes, beside the planner's matmul model.

Each shape is one linear layer of a GPT-style block (full multi-head QKV, the attention output, a
4h MLP's two) or its output head, at a hidden size, a tensor-parallel degree and a number of tokens per micro-batch, in each of
its three passes: forward (tokens × out, over in), the input gradient (tokens × in, over out) and
the weight gradient (out × in, over the tokens), each timed as a plain row-major product (F.linear's
transposed operands may meet other kernels). The planner charges a matmul its FLOPs at the
large-matmul efficiency times the share of its 128-wide output tiles that hold real rows and
columns, plus a launch (plait.plan.compute.gemm_seconds).

    python benchmarks/gemm_shapes.py [--json FILE]      # measure here (needs a GPU), then report
    python benchmarks/gemm_shapes.py --from benchmarks/measured/gemm_shapes_h100.json

The report fits that model's efficiency and a constant per kernel (relative least squares) to the
kernels of at least 100 µs, where a launch or the timing's own edges weigh little, then tests two
terms the model leaves out, each with its own refit: a fixed cost per output tile in steps of the
inner dimension (a matmul of depth k at k/(k + c) of the rate; c from 0 to 512, the least median
error kept), and 128 × 128 tiles rounded up to whole waves over the streaming multiprocessors.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

from plait.errors import ConfigError
from plait.plan.compute import Gemm, gemm_seconds
from plait.hardware import Hardware, catalog_name_of, hardware
from plait.plan.least_squares import relative_least_squares

HIDDEN_SIZES = (1536, 2048, 4096, 5120, 6144, 8192, 12288)
TENSOR_PARALLEL = (1, 2, 4, 8)
TOKENS = (1024, 2048, 4096, 8192)
# (name, out features, in features) per unit of hidden size and the side tensor parallelism splits:
# query-key-value and the MLP's first linear split their outputs, the attention output projection
# and the MLP's second linear their inputs.
LINEARS = (("qkv", 3, 1, "out"), ("proj", 1, 1, "in"), ("fc1", 4, 1, "out"), ("fc2", 1, 4, "in"))
# The output head's vocabularies (GPT-2's padded, Llama 3's), split over tp by rows.
VOCABULARIES = (50304, 128256)
COLUMNS = ("hidden", "tp", "linear", "tokens", "pass", "m", "n", "k", "seconds")
FIT_FROM_S = 100e-6


def shapes() -> list[dict]:
    cases = []
    for hidden in HIDDEN_SIZES:
        for tp in TENSOR_PARALLEL:
            for name, out_units, in_units, split in LINEARS:
                out, inner = out_units * hidden, in_units * hidden
                if split == "out":
                    out //= tp
                else:
                    inner //= tp
                cases += three_passes({"hidden": hidden, "tp": tp, "linear": name}, out, inner)
            for vocabulary in VOCABULARIES:
                cases += three_passes({"hidden": hidden, "tp": tp, "linear": f"head {vocabulary}"}, vocabulary // tp, hidden)
    return cases


def three_passes(common: dict, out: int, inner: int) -> list[dict]:
    """The linear's forward, input-gradient and weight-gradient products at each token count."""
    cases = []
    for tokens in TOKENS:
        row = {**common, "tokens": tokens}
        cases += [{**row, "pass": "forward", "m": tokens, "n": out, "k": inner},
                  {**row, "pass": "input gradient", "m": tokens, "n": inner, "k": out},
                  {**row, "pass": "weight gradient", "m": out, "n": inner, "k": tokens}]
    return cases


def time_matmul(m: int, n: int, k: int, repeats: int, filler: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Seconds of one (m×k)·(k×n) bf16 product: the median over three rounds of ``repeats`` products
    queued back to back between two CUDA events, as a training step queues its kernels. A large
    product queued first keeps the GPU busy while the host queues the round, so no launch from
    Python (about 20 µs each on the machine measured) falls inside it."""
    a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        torch.matmul(a, b)
    rounds = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.matmul(*filler)
        start.record()
        for _ in range(repeats):
            torch.matmul(a, b)
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) / 1e3 / repeats)
    return statistics.median(rounds)


def measure(repeats: int) -> dict:
    filler = tuple(torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    cases = [{**case, "seconds": time_matmul(case["m"], case["n"], case["k"], repeats, filler)} for case in shapes()]
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "sms": torch.cuda.get_device_properties(0).multi_processor_count,
            "method": f"{repeats} products between two CUDA events behind an 8192-cubed one, median of three rounds",
            "columns": list(COLUMNS), "rows": [[case[column] for column in COLUMNS] for case in cases]}


def dump(measured: dict) -> str:
    """The measurement as JSON, one row a line."""
    head = json.dumps({key: value for key, value in measured.items() if key != "rows"})
    return head[:-1] + ', "rows": [\n' + ",\n".join(json.dumps(row) for row in measured["rows"]) + "]}\n"


def measured_cases(measured: dict) -> list[dict]:
    """Each measured case as a dict of ``COLUMNS``."""
    return [dict(zip(measured["columns"], row)) for row in measured["rows"]]


def long_kernels(measured: dict) -> list[dict]:
    """The measured cases of at least ``FIT_FROM_S``."""
    return [c for c in measured_cases(measured) if c["seconds"] >= FIT_FROM_S]


def predicted(hw: Hardware, case: dict, setup: int = 0, sms: int = 0) -> float:
    """``hw``'s time of one case, with the tested terms: ``setup`` steps of the inner dimension per
    tile, and (``sms`` > 0) the tiles' waves rounded up to whole ones. (The terms scale the whole of
    ``gemm_seconds`` but its launch, its memory-bound floor too, which binds none of the kernels of
    at least ``FIT_FROM_S``.)"""
    m, n, k = case["m"], case["n"], case["k"]
    seconds = gemm_seconds(hw, "bf16", Gemm(m, n, k)) - hw.kernel_overhead_s
    if sms:
        tiles = math.ceil(m / hw.matmul_tile) * math.ceil(n / hw.matmul_tile)
        seconds *= math.ceil(tiles / sms) / (tiles / sms)
    return seconds * (k + setup) / k + hw.kernel_overhead_s


def errors(hw: Hardware, cases: list[dict], setup: int = 0, sms: int = 0) -> list[float]:
    """|predicted / measured − 1| of each case."""
    return [abs(predicted(hw, c, setup, sms) / c["seconds"] - 1) for c in cases]


def fit(base: Hardware, cases: list[dict], setup: int = 0, sms: int = 0) -> tuple[Hardware, list[float]]:
    """``base`` with the efficiency and the constant per kernel (in ``kernel_overhead_s``) that fit
    ``cases`` by relative least squares, with the tested terms as given, and its errors; a negative
    constant is kept at 0, its errors those of the model so held. Without the terms it is
    ``plait calibrate``'s fit (plait.calibrate.gpu.fit_matmul_efficiency), which gives the same
    figures on the shipped sweep; the terms need the time of each product, which that fit does not
    take."""
    at_peak = replace(base, matmul_efficiency=1.0, kernel_overhead_s=0.0)
    inverse, launch = relative_least_squares([(predicted(at_peak, c, setup, sms), 1.0) for c in cases],
                                             [c["seconds"] for c in cases])
    fitted = replace(base, matmul_efficiency=1 / inverse, kernel_overhead_s=max(launch, 0.0))
    return fitted, errors(fitted, cases, setup, sms)


def best_setup(base: Hardware, cases: list[dict]) -> tuple[int, Hardware, list[float]]:
    """The per-tile set-up cost, 0 to 512 steps in 8s, whose fit reads ``cases`` at the least median
    error, with that fit and its errors."""
    return min(((c, *fit(base, cases, setup=c)) for c in range(0, 513, 8)),
               key=lambda found: statistics.median(found[2]))


def report(measured: dict, hw: Hardware) -> None:
    cases = measured_cases(measured)
    long = long_kernels(measured)
    print(f"{measured['device']}, torch {measured['torch']}, {measured['sms']} SMs: {len(cases)} matmuls, "
          f"{len(long)} of at least {FIT_FROM_S * 1e6:.0f} µs")
    print("| hidden | tp | tokens | measured TFLOP/s: forward, input and weight gradient of qkv, proj, fc1, fc2, heads "
          f"| {hw.name}'s time / measured |")
    print("| ---: | ---: | ---: | --- | ---: |")
    groups: dict[tuple, list[dict]] = {}
    for case in cases:
        groups.setdefault((case["hidden"], case["tp"], case["tokens"]), []).append(case)
    for (hidden, tp, tokens), row in groups.items():
        rates = " ".join(f"{2 * c['m'] * c['n'] * c['k'] / c['seconds'] / 1e12:.0f}" for c in row)
        planner = sum(predicted(hw, c) for c in row)
        print(f"| {hidden} | {tp} | {tokens} | {rates} | {planner / sum(c['seconds'] for c in row):.3f} |")
    print()
    print(f"{hw.name} as catalogued (efficiency {hw.matmul_efficiency}, launch {hw.kernel_overhead_s * 1e6:.0f} µs): "
          f"{summary(errors(hw, long))}")
    fitted, misses = fit(hw, long)
    print(f"fitted: efficiency {fitted.matmul_efficiency:.3f}, {fitted.kernel_overhead_s * 1e6:.1f} µs a kernel: "
          f"{summary(misses)}")
    partial = [c for c in long if c["m"] % hw.matmul_tile or c["n"] % hw.matmul_tile]
    for label, model in (("with tile fill", fitted), ("with a flat rate", fit(replace(hw, matmul_tile=1), long)[0])):
        print(f"{label}, on the {len(partial)} with partial tiles: {summary(errors(model, partial))}")
    setup, with_setup, misses = best_setup(hw, long)
    print(f"with a set-up cost per tile of {setup} steps of the inner dimension: efficiency "
          f"{with_setup.matmul_efficiency:.3f}: {summary(misses)}")
    with_waves, misses = fit(hw, long, sms=measured["sms"])
    print(f"with whole waves over {measured['sms']} SMs: efficiency {with_waves.matmul_efficiency:.3f}: {summary(misses)}")


def summary(misses: list[float]) -> str:
    return f"median |error| {statistics.median(misses):.1%}, worst {max(misses):.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", help="the catalog entry to set beside the measurement (default: the measured device's)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--from", dest="source", type=Path, help="report a saved measurement instead of measuring")
    source.add_argument("--json", type=Path, help="write the measurement here")
    parser.add_argument("--repeats", type=int, default=5, help="products queued between two events")
    args = parser.parse_args()
    if args.source:
        measured = json.loads(args.source.read_text())
    elif not torch.cuda.is_available():
        print("gemm_shapes: no CUDA device here; run it on a machine with a GPU, or pass --from FILE", file=sys.stderr)
        return 1
    else:
        measured = measure(args.repeats)
        if args.json:
            args.json.write_text(dump(measured))
    name = args.gpu or catalog_name_of(measured["device"])
    if name is None:
        print(f"gemm_shapes: no catalog entry for {measured['device']}; pass --gpu NAME", file=sys.stderr)
        return 1
    try:
        hw = hardware(name)
    except ConfigError as error:
        print(f"gemm_shapes: {error}", file=sys.stderr)
        return 1
    report(measured, hw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
