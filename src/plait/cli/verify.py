"""``plait verify``: train a layout and the single process from one seed and compare them
(``plait.train.verify``); exit status 1 when a loss or a weight is out of tolerance."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from plait.cli.flags import add_layout_arguments, add_model_arguments
from plait.config import config_from_args
from plait.errors import ConfigError

DEFAULT_STEPS = 5


def add_verify_command(subparsers) -> None:
    verify = subparsers.add_parser(
        "verify", help="check a layout against the single process: losses and final weights",
        description="Train the layout and one process from the same seed on the same data for K steps in fp32, "
                    "print the largest per-step loss difference and the largest final weight difference against "
                    "the test suite's tolerance (1e-5 relative), and exit 1 if either is out of it. Without layout "
                    "flags the default layout dp2·tp2·pp2 is checked.")
    add_model_arguments(verify)
    add_layout_arguments(verify)
    group = verify.add_argument_group("run")
    group.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"steps of each run (default {DEFAULT_STEPS})")
    group.add_argument("--global-batch", type=int, help="sequences per step (default: plait train's, 32)")
    group.add_argument("--seed", type=int, help="seeds the weights and the data order of both runs (default 0)")
    group.add_argument("--data", help="plait train's --data (default: the Python standard library's source)")
    group.add_argument("--run-dir", metavar="DIR",
                       help="keep both runs in DIR/layout and DIR/single (default: a temporary folder, removed)")
    verify.set_defaults(handler=run_verify, config=None)


def run_verify(args: argparse.Namespace, argv: list[str]) -> int:
    run_dir = args.run_dir
    args.run_dir = None  # each run gets its own folder below it
    config = config_from_args(args)
    if config.layout.world_size == 1:
        raise ConfigError("the layout is a single process already; pass --dp, --tp, --cp or --pp to verify a layout")
    if run_dir is not None and Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise ConfigError(f"--run-dir {run_dir} is a file, not a directory; name a new folder for the two runs")
    if run_dir is not None and Path(run_dir).exists() and any(Path(run_dir).iterdir()):
        raise ConfigError(f"--run-dir {run_dir} is not empty; name a new folder for the two runs")
    from plait.train.verify import compare_runs, report, run_both, verification_configs

    verification_configs(config)  # the single-process run is valid too, before anything starts
    with tempfile.TemporaryDirectory(prefix="plait-verify-") as scratch:
        layout_dir, single_dir = run_both(config, Path(run_dir or scratch))
        loss, weights, floor = compare_runs(layout_dir, single_dir, config.train.lr)
    print(report(config, loss, weights, floor), flush=True)
    return 0 if loss.passed and weights.passed else 1
