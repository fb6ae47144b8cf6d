"""What a local run's terminal shows of torchrun: plait's own lines, and a failure as one plait line, last.

torchrun's agent writes its warnings, every worker's traceback and, when the job fails, a table of
the failed ranks to stderr: 40 to 70 lines, whose "root cause" is whichever rank ended first, which
after plait's watchdog has named a stalled rank is a healthy one. The launcher reads torchrun's
stderr instead (the workers share it): every line goes to ``torchrun.log`` in the run folder, and
only plait's own lines (``plait: ...``) on to the terminal. A rank's error line is held back until the
group restarts (then it says why) or the job ends: the last line on the terminal of a failed run is
one plait line, the first error a rank printed or, where none did, one made from torchrun's root
cause (the rank and its coordinates, how it ended, the exception's last line), saying too whether
every ``--max-restarts`` restart was used and where torchrun's report is. The workers' standard
output (progress, the summary) goes to the terminal untouched.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from plait.layout import Layout

TORCHRUN_LOG = "torchrun.log"
PLAIT_ERROR = "plait: error: "
RESTART_LINE = "plait: restart "  # a restarted group's rank 0 says so (plait.train.launch.train_rank)


@dataclass
class RootCause:
    """torchrun's first observed failure: the global rank, its exit code (−N: killed by signal N) and
    the last line of its traceback (the exception, where the worker recorded one)."""

    rank: int
    exitcode: int
    last_line: str = ""


@dataclass
class TorchrunReport:
    """Reads torchrun's stderr (``follow``, on a thread of its own), keeping the whole of it in the
    log and what the failure line needs."""

    log_path: Path
    terminal: IO[str]
    layout: Layout
    max_restarts: int
    held: list[str] = field(default_factory=list)  # this attempt's error lines, without the prefix
    root_cause: RootCause | None = None

    def follow(self, stream: IO[str]) -> threading.Thread:
        thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        thread.start()
        return thread

    def _read(self, stream: IO[str]) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)  # never through a link
        with open(os.open(self.log_path, flags, 0o644), "a", encoding="utf-8") as log:
            block: list[str] | None = None
            for line in stream:
                log.write(line)
                log.flush()
                if line.startswith(PLAIT_ERROR):
                    self.held.append(line[len(PLAIT_ERROR):].strip())
                elif line.startswith("plait:"):
                    if line.startswith(RESTART_LINE):  # the errors held explain this restart
                        self._show([PLAIT_ERROR + error + "\n" for error in self.held])
                        self.held.clear()
                    self._show([line])
                if "Root Cause (first observed failure)" in line:
                    block = []
                elif block is not None:
                    if line.startswith("====="):
                        self.root_cause, block = parse_root_cause(block) or self.root_cause, None
                    else:
                        block.append(line.rstrip("\n"))

    def _show(self, lines: list[str]) -> None:
        self.terminal.writelines(lines)
        self.terminal.flush()

    def failure_line(self, status: int) -> str:
        """The line that ends a failed run: the cause, whether restarts were used up, where the log is."""
        cause = self.held[0] if self.held else describe(self.root_cause, self.layout, status)
        restarts = f"; all {self.max_restarts} restarts (--max-restarts) are used" if self.max_restarts else ""
        return f"{PLAIT_ERROR}{cause}{restarts}; torchrun's report is in {self.log_path}"


def parse_root_cause(block: list[str]) -> RootCause | None:
    """The rank, exit code and last traceback line of torchrun's root-cause entry (``key : value``
    lines, a traceback running on below its key)."""
    fields, key = {}, None
    for line in block:
        match = re.match(r"\s*(\w+)\s*:\s?(.*)$", line)
        if match and match.group(1) in ("time", "host", "rank", "exitcode", "error_file", "traceback"):
            key = match.group(1)
            fields[key] = [match.group(2)]
        elif key is not None:
            fields[key].append(line)
    rank = re.match(r"(\d+)", fields.get("rank", [""])[0])
    code = re.match(r"(-?\d+)", fields.get("exitcode", [""])[0])
    if rank is None or code is None:
        return None
    lines = [line.strip() for line in fields.get("traceback", []) if line.strip()]
    return RootCause(int(rank.group(1)), int(code.group(1)), lines[-1] if lines else "")


def describe(cause: RootCause | None, layout: Layout, status: int) -> str:
    """One clause saying which rank failed and how, from torchrun's root cause."""
    if cause is None:
        return f"torchrun exited with status {status} before any rank failed (its report says why)"
    who = f"rank {cause.rank} ({layout.rank_name(cause.rank)})"
    if cause.exitcode < 0:
        how = f"was ended by {signal.Signals(-cause.exitcode).name}" if -cause.exitcode in signal.valid_signals() \
            else f"was ended by signal {-cause.exitcode}"
        if cause.exitcode == -signal.SIGKILL:
            how += " (killed, or out of memory)"
        return f"{who} {how}"
    told = cause.last_line if cause.last_line and not cause.last_line.startswith("To enable traceback") else ""
    return f"{who} exited with code {cause.exitcode}" + (f": {told}" if told else "")
