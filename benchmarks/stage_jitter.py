"""How steady this machine runs the pipeline bubble benchmark's stage: one process, one thread.

Times the forward and the backward of one equal-cost stage (``pipeline_common.equal_chunks``: four
Linear(1024) + GELU, 512 rows) over and over and prints their spread against the median. At
pp = 2, 1F1B's steady state has no slack, so every action slower than its median idles the other
rank: this spread, not plait's executor, is what keeps the measured bubble above theory here.

    PYTHONPATH=src python benchmarks/stage_jitter.py [--iterations 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_common import batch, equal_chunks, time_stage  # noqa: E402

QUANTILES = (0.1, 0.25, 0.75, 0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--rows", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    stage = equal_chunks(1, args.width, args.depth)[0]
    inputs, _ = batch(1, args.rows, args.width)
    inputs.requires_grad_()
    forward, backward = time_stage(stage, inputs, args.iterations)
    for name, times in (("forward", forward), ("backward", backward)):
        median = statistics.median(times)
        cuts = statistics.quantiles(times, n=20)  # 5% steps
        spread = {q: cuts[round(q * 20) - 1] / median for q in QUANTILES}
        print(f"{name:8s} median {median * 1e3:7.2f} ms   " + "   ".join(f"p{round(q * 100)} {v:.3f}×" for q, v in spread.items())
              + f"   max {max(times) / median:.3f}×")


if __name__ == "__main__":
    main()
