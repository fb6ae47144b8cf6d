"""The linter, as pyproject.toml's [tool.ruff] configures it, reports nothing in the code, tests and benchmarks.

ruff is a test dependency (pyproject.toml's ``test`` extra): missing, this test fails rather than skips.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def test_ruff_reports_nothing():
    checked = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "benchmarks"],
                             cwd=REPOSITORY, capture_output=True, text=True)
    assert checked.returncode == 0, f"ruff check src tests benchmarks:\n{checked.stdout}{checked.stderr}"
