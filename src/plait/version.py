"""plait's installed version, as run directories and checkpoints record it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def plait_version() -> str:
    try:
        return version("plait")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
