"""The ``plait`` command: train, plan, simulate, calibrate, explain, export, sample, prepare-data, verify,
schedule."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from plait.cli.interop import add_interop_commands
from plait.cli.planning import add_plan_commands
from plait.cli.schedule import add_schedule_command
from plait.cli.train_help import document_train_defaults
from plait.cli.training import add_prediction_arguments, run_train
from plait.cli.verify import add_verify_command
from plait.cli.flags import add_layout_arguments, add_model_arguments, add_train_arguments
from plait.errors import ConfigError
from plait.train.start import inside_torchrun
from plait.version import plait_version


class OneLineParser(argparse.ArgumentParser):
    """Report a bad flag in one line, like every other input error, and exit with status 2. Flags are
    never abbreviated: ``--auto``'s rewriting of the workers' command line must see them whole."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="plait", description="Train transformer language models under any parallel layout "
                           "(data, ZeRO, tensor, sequence, context, pipeline), and plan, predict and explain the "
                           "layout; export the weights to Hugging Face and sample from them.")
    parser.add_argument("--version", action="version", version=f"plait {plait_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train", help="train a model under a parallel layout",
        description="Train under a layout; outside torchrun this starts one local process per rank.",
    )
    add_model_arguments(train)
    add_layout_arguments(train)
    add_train_arguments(train)
    add_prediction_arguments(train)
    document_train_defaults(train)
    train.set_defaults(handler=run_train)
    add_plan_commands(commands)
    add_interop_commands(commands)
    add_verify_command(commands)
    add_schedule_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args, argv[1:])
    except ConfigError as error:
        # Every torchrun worker parses the same flags and meets rank 0's verdicts: rank 0 says it once.
        if not inside_torchrun() or os.environ.get("RANK", "0") == "0":
            print(f"plait: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C in a command running in this process (a one-rank run, a plan)
        print("plait: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:  # the reader left (`plait plan | head`): stop quietly, as Python's docs advise
        if args.handler is run_train:  # (a run's broken pipe is a failure to see, not a reader gone)
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
